#include "catalogue.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace deuteron::examples {

namespace {
std::vector<Entry>& entries() {
  static std::vector<Entry> e;
  return e;
}
}  // namespace

Registrar::Registrar(Entry e) { entries().push_back(std::move(e)); }

const std::vector<Entry>& catalogue() { return entries(); }

Tolerance tolerance_for(const Entry& e, DType dtype) {
  return e.tolerance ? e.tolerance(dtype) : default_tolerance(dtype);
}

const Entry& find(const std::string& name) {
  for (const Entry& e : entries())
    if (e.name == name) return e;
  std::vector<std::string> names;
  for (const Entry& e : entries()) names.push_back(e.name);
  throw ArgumentError(fmt::format("unknown kernel '{}'", name), "",
                      fmt::format("known kernels: {}", fmt::join(names, ", ")));
}

}  // namespace deuteron::examples
