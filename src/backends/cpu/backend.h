// The CPU target: C++ source compiled by the system compiler, loaded with dlopen.
#pragma once

#include "backends/backend.h"

namespace deuteron::cpu {

class CpuBackend : public backends::Backend {
 public:
  std::string name() const override { return "cpu"; }
  // Cores, and the per-core L2 as fast memory (DEUTERON_L2_BYTES overrides).
  config::TargetLimits limits() const override;
  std::string emit(const plan::Plan& p) const override;
  std::unique_ptr<backends::Executable> compile(const plan::Plan& p) const override;
};

}  // namespace deuteron::cpu
