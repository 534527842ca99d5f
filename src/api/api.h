// The public entry point, the top layer: a kernel call from arguments to results. It picks the
// config (pinned, cached, tuned or default) and runs the driver's executable. The only layer
// that uses both the driver and the autotuner, so neither needs a hook into the other.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "deuteron/kernel.h"
#include "driver/driver.h"

namespace deuteron::api {

// How a config is chosen when the caller does not give one: the kernel's pinned config, else
// the tuner's cache, else tuning (effort from the options, DEUTERON_AUTOTUNE_EFFORT overrides),
// else the default.
driver::Choice choose_config(const driver::Specialized& s);
// The config a call would use without tuning now: pinned, else cached, else the default (what
// `deuteron emit` prints and the Python package's kernel.config() reports).
driver::Choice untuned_config(const driver::Specialized& s);

// One call with an explicit target and (optionally) config; what the CLI and tests use.
struct RunResult {
  Outputs outputs;
  config::Config config;
  std::string origin;
  bool compiled = false;
  bool tuned = false;
  std::shared_ptr<backends::Executable> exe;
  driver::Bound bound;
  double call_ms = 0;  // the call that computed `outputs` (after any compile), wall time
};
RunResult run(const KernelBase& k, const std::vector<Arg>& args, const std::string& target,
              const std::optional<config::Config>& config = std::nullopt);

}  // namespace deuteron::api
