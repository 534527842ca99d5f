#include "driver/driver.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/registry.h"
#include "deuteron/error.h"
#include "passes/passes.h"

namespace deuteron::driver {

namespace {
std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

// The heuristic default may not fit the target's fast memory at every shape: step the largest
// block sizes down until the plan fits, so the default is valid for every shape.
void fit_default(Specialized& s);

void fit_default(Specialized& s) {
  config::Config c = s.backend->adjust_default(s.space, s.space.default_config(), s.ir);
  for (int attempt = 0; attempt < 64; ++attempt) {
    try {
      lower(s, c);
      s.space.set_default(c);
      return;
    } catch (const ConfigError&) {
    }
    const config::Tunable* biggest = nullptr;
    size_t pos = 0;
    for (const auto& t : s.space.tunables()) {
      if (t.kind != config::Tunable::Kind::BlockSize) continue;
      auto it = std::find(t.values.begin(), t.values.end(), c.values().at(t.name));
      size_t p = size_t(it - t.values.begin());
      if (p > 0 && (!biggest || c.values().at(t.name) > c.values().at(biggest->name))) {
        biggest = &t;
        pos = p;
      }
    }
    if (!biggest) return;  // nothing left to shrink: lower() will report why
    config::Config before = c;
    c.set(biggest->name, biggest->values[pos - 1]);
    c = s.backend->adjust_default(s.space, c, s.ir);
    if (c == before) return;  // the target undoes the shrink: nothing fits
  }
}

Specialized specialize(const KernelBase& k, const std::vector<frontend::ArgSpec>& args,
                       const std::string& target, std::optional<config::TargetLimits> limits) {
  Specialized s;
  s.kernel = &k;
  s.args = args;
  s.key = frontend::specialization_key(args);
  s.backend = &backends::get(target);
  s.limits = limits ? *limits : s.backend->limits();
  try {
    s.ir = frontend::trace(k, args);
  } catch (const KernelError& e) {
    // Name the call's arguments: a kernel traced for other shapes may fail only for these.
    std::vector<std::string> described;
    for (const auto& a : args)
      described.push_back(a.is_tensor ? fmt::format("{}[{}]", dtype_name(a.dtype), fmt::join(a.shape, ", "))
                                      : std::string(dtype_name(a.dtype)));
    throw KernelError(fmt::format("{} (kernel called with {})", e.message(), fmt::join(described, ", ")),
                      e.where(), e.hint());
  }
  s.key = frontend::specialization_key(args, frontend::sized_scalars(s.ir));
  passes::run_all(s.ir);
  s.ir_hash = ir::fingerprint(s.ir);
  s.space = config::ConfigSpace::derive(s.ir, s.limits);
  s.backend->extend_space(s.ir, s.limits, s.space);
  fit_default(s);
  return s;
}

namespace {
// Config errors name the kernel, and where the kernel was defined.
// A FastMemoryError stays one (deuteron aot shrinks blocks for it).
[[noreturn]] void rethrow_for(const Specialized& s, const ConfigError& e, const char* what) {
  std::string message = fmt::format("kernel '{}': {}{}", s.kernel->name(), what, e.message());
  std::string where = e.where().empty() ? format_location(s.kernel->location()) : e.where();
  if (dynamic_cast<const FastMemoryError*>(&e)) throw FastMemoryError(message, where, e.hint());
  throw ConfigError(message, where, e.hint());
}
}  // namespace

config::Config complete(const Specialized& s, const config::Config& c) {
  try {
    return s.space.complete(c);
  } catch (const ConfigError& e) {
    rethrow_for(s, e, "");
  }
}

std::optional<config::Config> pinned_config(const Specialized& s) {
  if (s.kernel->options().config.empty()) return std::nullopt;
  try {
    return s.space.complete(config::Config::parse(s.kernel->options().config));
  } catch (const ConfigError& e) {
    rethrow_for(s, e, "the config pinned in its definition is unusable: ");
  }
}

plan::Plan lower(const Specialized& s, const config::Config& c) {
  try {
    plan::Plan p = plan::lower(s.ir, s.space.complete(c), s.backend->name());
    s.backend->refine(p, s.limits);
    return p;
  } catch (const ConfigError& e) {
    rethrow_for(s, e, "");
  }
}

Bound bind_args(const Specialized& s, const std::vector<Arg>& args) {
  Bound b;
  for (const ir::HostTensor& t : s.ir.tensors) {
    if (t.role == ir::HostRole::Input) {
      const Tensor& a = std::get<Tensor>(args.at(size_t(t.arg_index)));
      b.tensors.push_back(a);
    } else {
      b.tensors.push_back(Tensor::empty(t.shape, t.dtype));
    }
  }
  for (const ir::ScalarParam& sp : s.ir.scalars) {
    b.scalars.push_back(backends::scalar_value(args.at(size_t(sp.arg_index)), sp.dtype));  // integers exact
  }
  for (int o : s.ir.outputs) b.outputs.push_back(b.tensors[size_t(o)]);
  return b;
}

std::shared_ptr<backends::Executable> executable(const Specialized& s, const config::Config& c) {
  static std::map<std::string, std::shared_ptr<backends::Executable>> cache;
  std::string key =
      fmt::format("{}|{}|{}|{}|{}", s.ir_hash, s.key, s.backend->name(), s.backend->build_identity(), c.dump());
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  std::shared_ptr<backends::Executable> exe = s.backend->compile(lower(s, c));
  std::lock_guard<std::mutex> lock(cache_mutex());
  cache[key] = exe;
  return exe;
}

}  // namespace deuteron::driver
