// The triton target: a Triton Python module (@triton.jit) per plan, run by
// runtime/deuteron_triton_runner.py in the project's virtual environment (backends/python) on
// torch tensors: on a GPU that torch sees, or under Triton's interpreter on the CPU
// (TRITON_INTERPRET=1) when asked ($DEUTERON_TRITON_DEVICE=interpret, `--interpret`).
#pragma once

#include <string>
#include <utility>

#include "backends/backend.h"
#include "backends/python/runner.h"
#include "backends/triton/hardware.h"

namespace deuteron::triton {

// Where modules run, and the line that says so.
struct Device {
  bool gpu = false;        // a CUDA device torch sees
  bool interpret = false;  // Triton's interpreter on the CPU
  std::string kind;        // "NVIDIA H100 80GB HBM3, triton 3.9.0", "interpreter on the CPU, triton 3.9.0"
  std::string note;
};

class TritonBackend : public backends::Backend {
 public:
  std::string name() const override { return "triton"; }
  // The GPU's SMs and shared memory per block (hardware.h: $DEUTERON_GPU, else h100).
  config::TargetLimits limits() const override;
  // num_warps, pointers (plain or tensor descriptors), num_stages (kernels with inner loops),
  // grid_group and dot_precision (kernels with products); reductions default to persistent,
  // product dims to tl.dot's minimum. The inner-loop placement keys (inner_<axis>, buffers_<axis>, inner_<axis>_<tensor>) are
  // removed: the module does not depend on them.
  void extend_space(const ir::Kernel& k, const config::TargetLimits& limits,
                    config::ConfigSpace& space) const override;
  config::Config adjust_default(const config::ConfigSpace& space, const config::Config& c,
                                const ir::Kernel& k) const override;
  // Power-of-two blocks, tl.dot's minimum, persistent reductions, the shared-memory and
  // register estimates (codegen.h: check).
  void refine(plan::Plan& p, const config::TargetLimits& limits) const override;
  void check_expressible(const plan::Plan& p) const override;
  std::string describe(const plan::Plan& p) const override;
  bool simulated() const override { return !device().gpu; }
  std::string device_note() const override { return device().note; }
  std::vector<std::string> chips() const override;
  std::string chip_variable() const override { return "DEUTERON_GPU"; }
  std::pair<std::string, std::string> interpret_setting() const override {
    return {"DEUTERON_TRITON_DEVICE", "interpret"};
  }
  // $DEUTERON_TRITON_DEVICE (auto, gpu, interpret; TRITON_INTERPRET=1 means interpret) and,
  // unless interpret, the runner's probe of torch.cuda (once per process).
  Device device() const;
  std::string emit(const plan::Plan& p) const override;
  // A general variant is a module for any sizes (generate's `general`).
  backends::AotVariant emit_aot(const plan::Plan& p, const std::string& entry, bool general) const override;
  std::string aot_language() const override { return "python"; }  // its modules, for deploying
  // Writes the module to the on-disk cache (cache_root()/triton) and returns an executable that
  // runs it through the runner. Throws CompileError when the Python environment is missing, or
  // when no GPU is present and the interpreter was not asked for.
  std::unique_ptr<backends::Executable> compile(const plan::Plan& p) const override;
  std::unique_ptr<backends::Harness> harness() const override;
};

// The registry's entry for this target (backends/registry.h).
std::unique_ptr<backends::Backend> make_backend();

// How this target runs modules: its runner script with --device auto, gpu or interpret.
python::RunnerSpec runner_spec(const std::string& device);

}  // namespace deuteron::triton
