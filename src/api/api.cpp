#include "api/api.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "autotune/autotune.h"
#include "backends/registry.h"

namespace deuteron::api {

driver::Choice choose_config(const driver::Specialized& s) {
  if (std::optional<config::Config> c = driver::pinned_config(s)) return {*c, "pinned", false};
  std::string effort = s.kernel->options().effort;
  if (const char* e = std::getenv("DEUTERON_AUTOTUNE_EFFORT")) effort = e;
  if (effort == "none") return {s.space.default_config(), "default", false};
  return autotune::choose(s, effort);
}

driver::Choice untuned_config(const driver::Specialized& s) {
  if (std::optional<config::Config> c = driver::pinned_config(s)) return {*c, "pinned", false};
  if (std::optional<config::Config> c = autotune::cached(s)) return {*c, "cache", false};
  return {s.space.default_config(), "default", false};
}

RunResult run(const KernelBase& k, const std::vector<Arg>& args, const std::string& target,
              const std::optional<config::Config>& config) {
  driver::Specialized s = driver::specialize(k, frontend::describe_args(k, args), target);
  RunResult r;
  if (config) {
    r.config = driver::complete(s, *config);
    r.origin = "given";
  } else {
    driver::Choice c = choose_config(s);
    r.config = c.config;
    r.origin = c.origin;
    r.tuned = c.tuned;
  }
  r.exe = driver::executable(s, r.config);
  r.compiled = r.exe->compiled;
  r.bound = driver::bind_args(s, args);
  auto start = std::chrono::steady_clock::now();
  r.exe->run(r.bound.tensors, r.bound.scalars);
  r.call_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  r.outputs = r.bound.outputs;
  return r;
}

}  // namespace deuteron::api

namespace deuteron {

// What calls of one kernel object (and its copies) have prepared, per specialisation key. It
// lives in the object, not in a table keyed by the kernel's name and line: a factory makes
// kernels on one line whose lambdas capture different values, and each must run its own code.
// A repeated call neither traces nor hashes: it finds its executable here.
struct KernelBase::Runs {
  struct Prepared {
    std::shared_ptr<driver::Specialized> specialized;
    std::shared_ptr<backends::Executable> exe;
  };
  std::mutex mutex;
  std::map<std::string, Prepared> by_key;
  // Scalar arguments some trace read in host code (item()): keys hold their values. The set only
  // grows; each entry's key was made with a set holding its own, so no stale entry matches.
  std::set<int> sized;
};

Outputs KernelBase::run(const std::vector<Arg>& args) const {
  const std::vector<std::string> targets = backends::names();
  const std::string& target = options_.target.empty() ? backends::default_target() : options_.target;
  if (std::find(targets.begin(), targets.end(), target) == targets.end())
    throw ArgumentError(fmt::format("kernel '{}': unknown target '{}' in its options", name_, target),
                        format_location(loc_), fmt::format("this build has: {}", fmt::join(targets, ", ")));
  auto specs = frontend::describe_args(*this, args);
  std::shared_ptr<Runs> runs;
  {
    static std::mutex m;  // guards the first call's creation of runs_
    std::lock_guard<std::mutex> lock(m);
    if (!runs_) runs_ = std::make_shared<Runs>();
    runs = runs_;
  }
  Runs::Prepared p;
  {
    std::lock_guard<std::mutex> lock(runs->mutex);
    auto it = runs->by_key.find(frontend::specialization_key(specs, runs->sized));
    if (it != runs->by_key.end()) p = it->second;
  }
  if (!p.exe) {
    p.specialized = std::make_shared<driver::Specialized>(driver::specialize(*this, specs, target));
    p.exe = driver::executable(*p.specialized, api::choose_config(*p.specialized).config);
    std::lock_guard<std::mutex> lock(runs->mutex);
    for (int a : frontend::sized_scalars(p.specialized->ir)) runs->sized.insert(a);
    runs->by_key.emplace(frontend::specialization_key(specs, runs->sized), p);
  }
  driver::Bound b = driver::bind_args(*p.specialized, args);
  p.exe->run(b.tensors, b.scalars);
  return b.outputs;
}

}  // namespace deuteron
