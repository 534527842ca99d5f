// The driver: a kernel through the compiler's layers for one target and config, in order:
// frontend (trace) -> passes -> config (space) -> plan -> backend (compile) -> bound arguments.
// The autotuner builds on it to time candidates; choosing the config is the top layer's
// (api/api.h).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "config/config.h"
#include "deuteron/kernel.h"
#include "frontend/frontend.h"
#include "ir/ir.h"
#include "plan/plan.h"

namespace deuteron::driver {

// A kernel specialised to one set of argument shapes and dtypes, for one target.
struct Specialized {
  const KernelBase* kernel = nullptr;
  std::vector<frontend::ArgSpec> args;
  std::string key;  // specialisation key (shapes, dtypes, layout)
  ir::Kernel ir;  // after the passes
  std::string ir_hash;  // ir::fingerprint(ir): what was traced, for the caches
  config::ConfigSpace space;
  const backends::Backend* backend = nullptr;
  config::TargetLimits limits;  // the target's, unless the caller pinned them
};

// `limits` pins the target's cores and fast memory (tests that check plan decisions pin the
// budget they assume); by default the target reads them from its hardware.
Specialized specialize(const KernelBase& k, const std::vector<frontend::ArgSpec>& args,
                       const std::string& target, std::optional<config::TargetLimits> limits = std::nullopt);

// Where a config came from.
struct Choice {
  config::Config config;
  std::string origin;  // "pinned", "given", "cache", "tuned", "model" (chosen by the model), "default"
  bool tuned = false;  // this process ran the autotuner
};

// The config pinned in the kernel's definition, completed; nullopt when it pins none. A pinned
// config that does not fit the space is a ConfigError naming the kernel.
std::optional<config::Config> pinned_config(const Specialized& s);

// The space's completion of `c` (missing tunables take defaults); errors name the kernel.
config::Config complete(const Specialized& s, const config::Config& c);
plan::Plan lower(const Specialized& s, const config::Config& c);

// Allocates outputs, binds arguments to the IR's host tensors, and runs.
struct Bound {
  std::vector<Tensor> tensors;  // IR host tensors in order
  std::vector<backends::ScalarValue> scalars;
  Outputs outputs;
};
Bound bind_args(const Specialized& s, const std::vector<Arg>& args);

// The compiled kernel for a specialisation and config, cached in memory for the process by
// what was traced (the IR hash), never by the kernel's name or line: a factory's kernels share
// both but not their code.
std::shared_ptr<backends::Executable> executable(const Specialized& s, const config::Config& c);

}  // namespace deuteron::driver
