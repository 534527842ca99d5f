// The pallas target: a JAX/Pallas Python module (pl.pallas_call) per plan, run by
// runtime/deuteron_pallas_runner.py in the project's virtual environment (backends/python).
// On a TPU that JAX sees it runs compiled (interpret=False); elsewhere under JAX's TPU
// interpret mode on the CPU.
#pragma once

#include <filesystem>
#include <string>

#include "backends/backend.h"
#include "backends/pallas/hardware.h"
#include "backends/python/runner.h"

namespace deuteron::pallas {

// Where modules run, and the line that says so.
struct Device {
  bool tpu = false;  // else TPU interpret mode on the CPU
  std::string kind;  // "TPU v5 lite, jax 0.10.2", "interpret mode on the CPU, jax 0.10.2"
  std::string note;
};

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
  // The constructs the generator cannot lower yet (inner tile loops, hl::dot, gathers, ...).
  void check_expressible(const plan::Plan& p) const override;
  std::string describe(const plan::Plan& p) const override;
  // From the TPU table (hardware.cpp): MXU, VPU, HBM and the cost of a grid step.
  std::optional<model::Hardware> model_hardware(const plan::Plan& p) const override;
  // Whether JAX sees no TPU (or there is no Python environment to ask).
  bool simulated() const override;
  std::string device_note() const override;
  // The TPU table's generations; $DEUTERON_TPU_GENERATION selects one.
  std::vector<std::string> chips() const override;
  std::string chip_variable() const override { return "DEUTERON_TPU_GENERATION"; }
  std::pair<std::string, std::string> interpret_setting() const override {
    return {"DEUTERON_PALLAS_DEVICE", "interpret"};
  }
  // $DEUTERON_PALLAS_DEVICE (auto, tpu, interpret) and, unless interpret, the runner's probe
  // of jax.devices() (once per process).
  Device device() const;
  std::string emit(const plan::Plan& p) const override;
  // A general variant is a module for any sizes (generate's `general`).
  backends::AotVariant emit_aot(const plan::Plan& p, const std::string& entry, bool general) const override;
  std::string aot_language() const override { return "python"; }  // its modules, for deploying
  // A whole-dim block is legal on a TPU at any size (and a looped reduction's blocks hold the
  // whole dim anyway): general modules keep whole dims whole.
  bool aot_keeps_whole_dims() const override { return true; }
  // Writes the module to the on-disk cache (cache_root()/pallas) and returns an executable
  // that runs it through the runner in a subprocess. Throws CompileError when the Python
  // environment is missing.
  std::unique_ptr<backends::Executable> compile(const plan::Plan& p) const override;
  // Candidates run in the runner's --serve worker (harness.cpp), timed on the device.
  std::unique_ptr<backends::Harness> harness() const override;

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

// How this target runs modules on `chip`: its runner script and options (--device auto, tpu
// or interpret), int64 narrowed to int32, DEUTERON_PALLAS_TIMEOUT.
python::RunnerSpec runner_spec(const TpuGeneration& chip, const std::string& device);
// Empty when the Python environment exists, else what is missing and how to fix it.
std::string environment_problem();

}  // namespace deuteron::pallas
