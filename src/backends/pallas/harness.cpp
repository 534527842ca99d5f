// The pallas target's tuning harness: the shared Python-module harness (python::ModuleHarness)
// with this target's runner, for the device the probe found (a TPU, or interpret mode), and its
// hardware in the cache key.
#include <fmt/format.h>

#include "backends/pallas/backend.h"
#include "backends/python/runner.h"

namespace deuteron::pallas {

std::unique_ptr<backends::Harness> PallasBackend::harness() const {
  return std::make_unique<python::ModuleHarness>(
      *this, python::ModuleHarness::Hooks{
                 .prepare = [this] { (void)device(); },  // the probe runs once, not in every compile worker
                 .runner = [this] { return runner_spec(generation(), device().tpu ? "tpu" : "interpret"); },
                 .fingerprint =
                     [this](const config::TargetLimits& l) {
                       return fmt::format("pallas {} | {} | cores {} | fast memory {}", generation().name,
                                          device().kind, l.cores, l.fast_memory_bytes);
                     },
             });
}

}  // namespace deuteron::pallas
