// The triton target's tuning harness: the shared Python-module harness (python::ModuleHarness)
// with this target's runner, on the GPU or under the interpreter, and its hardware in the cache
// key.
#include <fmt/format.h>

#include "backends/python/runner.h"
#include "backends/triton/backend.h"

namespace deuteron::triton {

std::unique_ptr<backends::Harness> TritonBackend::harness() const {
  return std::make_unique<python::ModuleHarness>(
      *this, python::ModuleHarness::Hooks{
                 .prepare = [this] { (void)device(); },  // the probe runs once, not in every compile worker
                 .runner = [this] { return runner_spec(device().gpu ? "gpu" : "interpret"); },
                 .fingerprint =
                     [this](const config::TargetLimits& l) {
                       return fmt::format("triton {} | {} | SMs {} | shared memory {}", default_gpu().name,
                                          device().kind, l.cores, l.fast_memory_bytes);
                     },
             });
}

}  // namespace deuteron::triton
