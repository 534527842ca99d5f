// Configs for tests: the wanted block sizes, each clamped to what a kernel's space allows.
#pragma once

#include <map>
#include <string>

#include <gtest/gtest.h>

#include "driver/driver.h"

namespace deuteron::testing_support {

// A config for `s` with the wanted tunables set: each to the largest value its space allows
// that is not above the wish, else the smallest (at [1, 1] every block is 1).
inline config::Config fit(const driver::Specialized& s, const std::map<std::string, int64_t>& want) {
  config::Config c;
  for (const config::Tunable& t : s.space.tunables()) {
    auto it = want.find(t.name);
    if (it == want.end()) continue;
    config::Json best = t.values.front();
    for (const config::Json& v : t.values)
      if (v.is_number_integer() && v.get<int64_t>() <= it->second) best = v;
    c.set(t.name, best);
  }
  // A wish for a tunable the kernel lacks (a renamed dim) would silently test the default.
  for (const auto& [name, value] : want)
    if (!c.has(name)) ADD_FAILURE() << "kernel '" << s.kernel->name() << "' has no tunable " << name;
  return c;
}

// The same for kernel `k` called with `args` on the cpu target.
inline config::Config fit(const KernelBase& k, const std::vector<Arg>& args, const std::map<std::string, int64_t>& want) {
  return fit(driver::specialize(k, frontend::describe_args(k, args), "cpu"), want);
}

}  // namespace deuteron::testing_support
