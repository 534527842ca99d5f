// What every Python-based target shares (pallas; a Triton target next): the project's virtual
// environment, the runner scripts the library carries, generated modules in the cache, the
// host-side narrowing of int64 tensors, and an executable that runs a module through the
// target's runner script in a subprocess, exchanging arrays as .npy files (npy.h).
//
// A target's runner script imports runtime/deuteron_runner.py (the arguments, the .npy and
// bfloat16 conventions, timing, the one-line error, the tuner's protocol) and adds how to
// pick its device and compile a module. No header of a target is included here.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "deuteron/tensor.h"

namespace deuteron::python {

// The virtual environment: $DEUTERON_VENV, else the one scripts/setup_python.sh makes in the
// source tree the library was built from (<source dir>/.venv).
std::filesystem::path venv_dir();
// <venv>/bin/python.
std::filesystem::path python_path();

// How a target runs its modules.
struct RunnerSpec {
  std::string target;             // "pallas": names the runner in messages
  std::string needs;              // what the venv must hold, for messages: "jax and jaxlib"
  std::filesystem::path script;   // the target's runner (runner_script())
  std::vector<std::string> args;  // its own options, after the common ones (--chip v5e)
  std::string timeout_variable;   // seconds a run may take (default 600): DEUTERON_PALLAS_TIMEOUT
  // int64 tensors and scalars reach the module as int32, range-checked (narrow_to_int32).
  bool narrow_int64 = false;
  // Words of the runner's one-line summary that mean the kernel failed while it ran (a
  // RuntimeError); any other failure is before it: importing, tracing, compiling (CompileError).
  std::vector<std::string> run_time_failures;
};

// Empty when the venv's Python exists, else what is missing and how to fix it (run
// scripts/setup_python.sh).
std::string environment_problem(const RunnerSpec& spec);

// A target's runner script: cache_root()/resources/<kind>-<hash>/<name> holding `script`, with
// deuteron_runner.py beside it for the script to import (runtime/disk_cache.h: resource_dir).
std::filesystem::path runner_script(std::string_view kind, std::string_view name, std::string_view script);

// The generated module in the cache, cache_root()/<target>/<kernel>-<hash of source>.py,
// written now if missing, and rewritten with a warning if it was damaged or modified; `second`
// says whether it was written.
std::pair<std::filesystem::path, bool> cache_module(std::string_view target, std::string_view kernel,
                                                    const std::string& source);

// `t` (int64) as an int32 tensor of the same shape. A value int32 cannot hold is an
// ArgumentError naming the kernel, the tensor, the first such element (flat and multi-index)
// and its value, never a wrap-around.
Tensor narrow_to_int32(const Tensor& t, std::string_view target, std::string_view kernel, std::string_view tensor);

// The runner's device report (`<runner> --probe <args>`: one JSON object), asked once per
// process for each runner and arguments. Throws CompileError when the runner fails.
const nlohmann::json& probe(const RunnerSpec& spec);

// The command line of the target's runner: the venv's Python, the script, `args`, the spec's
// options. Throws CompileError when the Python environment is missing. With {"--serve"} it is
// the tuner's worker (backends/harness.h), which speaks the protocol of
// backends/cpu/runner_source.h with the differences runtime/deuteron_runner.py lists.
std::vector<std::string> runner_command(const RunnerSpec& spec, const std::vector<std::string>& args);

// Runs a module: writes the inputs as .npy files into a private temporary folder, runs the
// target's runner on them in the venv with a time limit, reads the outputs back. A failure is
// a CompileError or RuntimeError carrying the runner's summary, its last lines and the command
// to rerun it by hand.
class ModuleExecutable : public backends::Executable {
 public:
  // `scalar_names`: the module's keyword for each scalar argument of the plan's kernel.
  ModuleExecutable(const plan::Plan& p, std::filesystem::path module, std::string source, RunnerSpec spec,
                   std::vector<std::string> scalar_names);

  void run(const std::vector<Tensor>& tensors, const std::vector<backends::ScalarValue>& scalars) override;
  // The runner's JSON line of the last run.
  const nlohmann::json& report() const { return report_; }
  // The tuner's "kernel" command for this module (runner_command with --serve): its path and the layout
  // of the tensors and scalars as JSON, each one encoded field.
  std::string worker_line() const;

 private:
  std::string kernel_;
  std::string where_;  // the kernel's definition, for argument errors
  std::filesystem::path module_;
  std::string source_;
  RunnerSpec spec_;
  std::vector<size_t> inputs_, outputs_;
  std::vector<ir::HostTensor> tensors_;
  std::vector<ir::ScalarParam> scalars_;
  std::vector<std::string> scalar_names_;
  nlohmann::json report_;
};

// The tuning harness of a Python-based target: a candidate compiles through the target's
// Backend::compile (a ModuleExecutable: the module goes into the cache) and runs in the target
// runner's --serve worker, which speaks the CPU runner's protocol (backends/cpu/runner_source.h;
// the differences are listed in runtime/deuteron_runner.py) and times calls on the device,
// waiting for their results. In a simulator the times only inform; outputs are checked all the
// same. The host only waits for the device: a candidate keeps one core busy.
class ModuleHarness : public backends::Harness {
 public:
  struct Hooks {
    std::function<void()> prepare;  // in the tuning process, once (e.g. the device probe)
    std::function<RunnerSpec()> runner;  // the target's runner, for the device it found
    std::function<std::string(const config::TargetLimits&)> fingerprint;
  };
  ModuleHarness(const backends::Backend& backend, Hooks hooks) : backend_(backend), hooks_(std::move(hooks)) {}

  void prepare_parent() override {
    if (hooks_.prepare) hooks_.prepare();
  }
  backends::Prepared compile(const plan::Plan& p) const override;
  std::vector<std::string> runner_command() override;
  int threads(const plan::Plan& p) const override {
    (void)p;
    return 1;
  }
  std::string hardware_fingerprint(const config::TargetLimits& limits) const override {
    return hooks_.fingerprint(limits);
  }

 private:
  const backends::Backend& backend_;
  Hooks hooks_;
};

}  // namespace deuteron::python
