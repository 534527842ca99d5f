// The targets built into the library. Each target's folder defines its make_backend(); the
// build lists them (DEUTERON_TARGETS in CMakeLists.txt generates the list this reads), so the
// registry, above every target, is the one place that reaches them all.
#pragma once

#include <string>
#include <vector>

#include "backends/backend.h"

namespace deuteron::backends {

// The target named `name` ("cpu", "pallas", ...); throws ArgumentError listing the known ones.
const Backend& get(const std::string& name);
// Their names, in the build's order.
std::vector<std::string> names();
// The target a kernel call runs on: the first one built in.
const std::string& default_target();

}  // namespace deuteron::backends
