#include "api/api.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>

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
  r.exe->run(r.bound.tensors, r.bound.scalars);
  r.outputs = r.bound.outputs;
  return r;
}

}  // namespace deuteron::api

namespace deuteron {

Outputs KernelBase::run(const std::vector<Arg>& args) const {
  auto specs = frontend::describe_args(*this, args);
  // Traces are cheap but not free: keep the specialisations this kernel has seen.
  static std::mutex m;
  static std::map<std::string, std::shared_ptr<driver::Specialized>> seen;
  std::string key = fmt::format("{}@{}:{}|{}", name(), location().file_name(), location().line(),
                                frontend::specialization_key(specs));
  std::shared_ptr<driver::Specialized> s;
  std::shared_ptr<driver::Choice> choice;
  static std::map<std::string, std::shared_ptr<driver::Choice>> choices;
  {
    std::lock_guard<std::mutex> lock(m);
    if (seen.count(key)) {
      s = seen[key];
      choice = choices[key];
    }
  }
  if (!s) {
    s = std::make_shared<driver::Specialized>(driver::specialize(*this, specs, backends::default_target()));
    choice = std::make_shared<driver::Choice>(api::choose_config(*s));
    std::lock_guard<std::mutex> lock(m);
    seen[key] = s;
    choices[key] = choice;
  }
  auto exe = driver::executable(*s, choice->config);
  driver::Bound b = driver::bind_args(*s, args);
  exe->run(b.tensors, b.scalars);
  return b.outputs;
}

}  // namespace deuteron
