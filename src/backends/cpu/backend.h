// The CPU target: C++ source compiled by the system compiler, loaded with dlopen.
#pragma once

#include "backends/backend.h"

namespace deuteron::cpu {

class CpuBackend : public backends::Backend {
 public:
  std::string name() const override { return "cpu"; }
  // Cores, and the per-core L2 as fast memory (DEUTERON_L2_BYTES overrides).
  config::TargetLimits limits() const override;
  void extend_space(const ir::Kernel& k, const config::TargetLimits& limits,
                    config::ConfigSpace& space) const override;
  // The scratch per thread (cpu::refine) against the L2 budget.
  void refine(plan::Plan& p, const config::TargetLimits& limits) const override;
  std::string describe(const plan::Plan& p) const override;
  std::string emit(const plan::Plan& p) const override;
  // Ahead-of-time builds: the generated C++ and its runtime headers (codegen.h: a general
  // variant reads its sizes at run time).
  std::string aot_language() const override { return "c++"; }
  backends::AotVariant emit_aot(const plan::Plan& p, const std::string& entry, bool general) const override;
  std::vector<std::pair<std::string, std::string>> aot_support_files() const override;
  std::unique_ptr<backends::Executable> compile(const plan::Plan& p) const override;
  std::string build_identity() const override;
  // The same kernel with each grid step's thread and times recorded (codegen's trace).
  std::unique_ptr<backends::Executable> compile_traced(const plan::Plan& p) const override;
  // deuteron-runner (harness.cpp).
  std::unique_ptr<backends::Harness> harness() const override;
  // FMA peak and copy bandwidth (hardware.h: roofline).
  std::optional<backends::Roofline> roofline(bool remeasure) const override;
  // A pass of the roofline's copy (hardware.h: CopyProbe).
  std::function<double()> copy_probe() const override;
  // From the measured roofline (FMA peak, copy bandwidth), on the plan's threads.
  std::optional<model::Hardware> model_hardware(const plan::Plan& p) const override;
};

// The registry's entry for this target (backends/registry.h).
std::unique_ptr<backends::Backend> make_backend();

}  // namespace deuteron::cpu
