// What the autotuner needs from a target beyond the Backend interface: how to turn a plan into
// something a runner process can load (done in a forked compile worker), which program runs
// and times candidates, and what identifies the hardware for the cache. A target that can be
// tuned returns one from Backend::harness().
//
// The runner protocol (tensors in shared memory, commands on stdin, samples on stdout) is
// described in backends/cpu/runner_source.h; Python-based targets (backends/pallas/harness.cpp)
// run their runner script with --serve, which speaks it with the differences listed in
// backends/python/runtime/deuteron_runner.py.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.h"

namespace deuteron::backends {

struct Prepared {
  std::string kernel_line;  // the runner's "kernel ..." command for this candidate
  bool compiled = false;    // the compiler ran (false: the target's cache had it)
  double compile_seconds = 0;
};

class Harness {
 public:
  virtual ~Harness() = default;
  // In the tuning process, before any worker is forked: fill the caches (compiler identity,
  // CPU detection) that every worker would otherwise fill again.
  virtual void prepare_parent() {}
  // In a compile worker process: compiles the plan into the target's cache.
  virtual Prepared compile(const plan::Plan& p) const = 0;
  // The runner's command line (built into the cache on first use; throws CompileError).
  virtual std::vector<std::string> runner_command() = 0;
  // Cores a candidate keeps busy while it runs (the tuner pauses compiles that would share them).
  virtual int threads(const plan::Plan& p) const = 0;
  // The hardware the timings are valid for, with the limits the kernel was specialised for
  // (part of the cache key).
  virtual std::string hardware_fingerprint(const config::TargetLimits& limits) const = 0;
};

}  // namespace deuteron::backends
