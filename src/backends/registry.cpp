// The one place that knows every target.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/backend.h"
#include "backends/cpu/backend.h"
#include "backends/pallas/backend.h"
#include "deuteron/error.h"

namespace deuteron::backends {

std::vector<std::string> names() { return {"cpu", "pallas"}; }

const Backend& get(const std::string& name) {
  static const cpu::CpuBackend cpu;
  if (name == "cpu") return cpu;
  static const pallas::PallasBackend pallas;
  if (name == "pallas") return pallas;
  throw ArgumentError(fmt::format("unknown target '{}'", name), "",
                      fmt::format("known targets: {}", fmt::join(names(), ", ")));
}

}  // namespace deuteron::backends
