// The pallas target: a JAX/Pallas Python module (pl.pallas_call) per plan, run by
// python/deuteron_pallas_runner.py in the project's virtual environment. On a CPU host it runs
// under JAX's TPU interpret mode; the module compiles for a real TPU with interpret=False.
#pragma once

#include <filesystem>
#include <string>

#include "backends/backend.h"
#include "backends/pallas/hardware.h"

namespace deuteron::pallas {

class PallasBackend : public backends::Backend {
 public:
  // `generation` names a row of the TPU table (hardware.h); empty means the default, read on
  // every call: $DEUTERON_TPU_GENERATION, else v5e.
  explicit PallasBackend(std::string generation = "") : generation_(std::move(generation)) {}

  std::string name() const override { return "pallas"; }
  // One core per JAX device (two on megacore chips) and the default scoped VMEM limit.
  config::TargetLimits limits() const override;
  // The TPU block-shape rule for every operand and the VMEM footprint (ConfigError).
  // Inner loops stream their operands (emit_pipeline) unless a config says otherwise.
  void extend_space(const ir::Kernel& k, const config::TargetLimits& limits,
                    config::ConfigSpace& space) const override;
  void refine(plan::Plan& p, const config::TargetLimits& limits) const override;
  // Throw CompileError naming the construct for kernels this target cannot express yet
  // (inner tile loops, gathers, ...).
  // The constructs the generator cannot lower yet (inner tile loops, hl::dot, gathers, ...).
  void check_expressible(const plan::Plan& p) const override;
  std::string describe(const plan::Plan& p) const override;
  // Runs under JAX's TPU interpret mode here.
  bool simulated() const override { return true; }
  std::string emit(const plan::Plan& p) const override;
  // Writes the module to the on-disk cache (cache_root()/pallas) and returns an executable
  // that runs it through the runner in a subprocess. Throws CompileError when the Python
  // environment is missing.
  std::unique_ptr<backends::Executable> compile(const plan::Plan& p) const override;

  // A config near `c` that this target's hard rules allow, for the driver to apply to the
  // default config (the hook proposed for backends::Backend; not virtual there yet): raises
  // each tiled block that sets one of the last two dims of an access to the smallest legal
  // value (a multiple of 8 rows / 128 lanes, or a block covering the dim), and makes every
  // whole-dim reduction persistent. Other tunables are left as they are.
  config::Config adjust_default(const config::ConfigSpace& space, const config::Config& c,
                                const ir::Kernel& k) const override;

  const TpuGeneration& generation() const;

 private:
  std::string generation_;
};

// The registry's entry for this target (backends/registry.h).
std::unique_ptr<backends::Backend> make_backend();

// The virtual environment: $DEUTERON_VENV, else the one scripts/setup_python.sh makes in the
// source tree the library was built from (<source dir>/.venv).
std::filesystem::path venv_dir();
// <venv>/bin/python, and the library's copy of python/deuteron_pallas_runner.py written into
// the cache (runtime/disk_cache.h: resource_dir).
std::filesystem::path python_path();
std::filesystem::path runner_path();
// Empty when the Python exists, else what is missing and how to fix it (run scripts/setup_python.sh).
std::string environment_problem();

}  // namespace deuteron::pallas
