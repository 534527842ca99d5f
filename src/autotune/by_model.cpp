#include "autotune/by_model.h"

#include <algorithm>
#include <random>
#include <system_error>

#include <fmt/format.h>

#include "config/keys.h"
#include "deuteron/error.h"
#include "runtime/machine_load.h"

namespace deuteron::autotune {

namespace keys = config::keys;

std::string placement_of_strategy(const std::string& strategy) {
  if (strategy == "emit_pipeline") return keys::kStream;
  if (strategy == "unroll") return keys::kResident;
  if (strategy == "fori_loop") return keys::kInPlace;
  throw ArgumentError(fmt::format("unknown --strategy '{}'", strategy), "",
                      "choose emit_pipeline (stream), unroll (resident) or fori_loop (in_place)");
}

void force_placement(const driver::Specialized& s, const std::string& placement, config::Config& c) {
  for (const ir::Loop& loop : s.ir.loops) {
    if (loop.grid) continue;
    std::string key = keys::inner_loop(s.ir.axes[size_t(loop.axes.front())].name);
    if (s.space.find(key)) c.set(key, placement);
  }
  for (const config::Tunable& t : s.space.tunables())
    if (!t.follows.empty()) c.set(t.name, keys::kFollowLoop);
}

ModelChoice predict_config(const driver::Specialized& s, const config::Config& c) {
  ModelChoice o;
  o.config = driver::complete(s, c);
  o.evaluated = 1;
  try {
    plan::Plan p = driver::lower(s, o.config);
    std::optional<model::Hardware> hw = s.backend->model_hardware(p);
    if (!hw)
      throw ArgumentError(fmt::format("the {} target has no hardware description for the performance model", s.backend->name()),
                          "", "choose a target the model knows (cpu, pallas)");
    o.prediction = model::predict(p, *hw);
    o.hardware = hw->name;
    o.fitted = 1;
  } catch (const ConfigError& e) {
    o.why = e.message();
  }
  return o;
}

ModelChoice best_by_model(const driver::Specialized& s, const config::Config& base, int candidates,
                          const std::string& placement, uint64_t seed) {
  // Without a placement, each candidate is tried under every placement the space offers, so
  // that a shape's best strategy is not left to the random draw.
  std::vector<std::string> placements = {placement};
  bool inner_loops = std::any_of(s.ir.loops.begin(), s.ir.loops.end(), [&](const ir::Loop& l) {
    return !l.grid && s.space.find(keys::inner_loop(s.ir.axes[size_t(l.axes.front())].name));
  });
  if (placement.empty() && inner_loops)
    for (const char* p : {keys::kStream, keys::kResident, keys::kInPlace}) placements.push_back(p);
  std::mt19937_64 rng(seed);
  ModelChoice best;
  int evaluated = 0, fitted = 0;
  for (int i = 0; i <= candidates; ++i) {
    config::Config drawn = i == 0 ? base : s.space.random(rng);
    for (const std::string& p : placements) {
      config::Config c = drawn;
      if (!p.empty()) force_placement(s, p, c);
      ModelChoice next = predict_config(s, c);
      evaluated += 1;
      fitted += next.fitted;
      bool better = next.prediction && (!best.prediction || next.prediction->seconds < best.prediction->seconds);
      if ((i == 0 && p == placements.front()) || better) best = next;
    }
  }
  // Then one tunable at a time around the best (a few sweeps, while they help): a random draw
  // rarely gets every choice right at once (a grid order that refetches nothing, say).
  for (int sweep = 0; sweep < 3 && best.prediction; ++sweep) {
    bool improved = false;
    for (const config::Tunable& t : s.space.tunables()) {
      if (!placement.empty() && (t.name.rfind("inner_", 0) == 0)) continue;  // the forced strategy stays
      for (const config::Json& v : t.values) {
        config::Config c = best.config;
        if (c.has(t.name) && c.values().at(t.name) == v) continue;
        c.set(t.name, v);
        ModelChoice next = predict_config(s, c);
        evaluated += 1;
        fitted += next.fitted;
        if (next.prediction && next.prediction->seconds < best.prediction->seconds * (1 - 1e-9)) {
          best = next;
          improved = true;
        }
      }
    }
    if (!improved) break;
  }
  best.evaluated = evaluated;
  best.fitted = fitted;
  return best;
}

CacheKey model_key(const driver::Specialized& s) {
  plan::Plan p = driver::lower(s, s.space.default_config());
  std::optional<model::Hardware> hw = s.backend->model_hardware(p);
  std::string name = hw ? hw->name : "none";
  return make_key(s, fmt::format("model | {} {} | cores {} | fast memory {}", s.backend->name(), name, s.limits.cores,
                                 s.limits.fast_memory_bytes));
}

std::optional<CacheEntry> model_entry(const driver::Specialized& s) {
  // Only when the kernel has a model-chosen entry for this specialisation is its key made: the
  // key asks for the model's hardware description (on the cpu, the measured roofline), which
  // a kernel call without one should not wait for.
  bool any = false;
  for (const ListedEntry& le : list_entries(s.kernel->name()))
    any = any || (le.entry && le.entry->info.value("origin", "") == "model" && le.entry->key.spec_key == s.key &&
                  le.entry->key.target == s.backend->name());
  if (!any) return std::nullopt;
  CacheKey key;
  try {
    key = model_key(s);
  } catch (const Error&) {
    return std::nullopt;  // the default config does not lower: no entry can be keyed
  }
  std::optional<CacheEntry> e = read_entry(key);
  if (!e || e->info.value("origin", "") != "model") return std::nullopt;
  try {
    e->config = s.space.complete(e->config);
    driver::lower(s, e->config);
  } catch (const Error&) {
    return std::nullopt;
  }
  return e;
}

CacheEntry tune_by_model(const driver::Specialized& s, int candidates) {
  ModelChoice best = best_by_model(s, s.space.default_config(), candidates);
  if (!best.prediction)
    throw ConfigError(fmt::format("no config of {} fits {} by the model ({} tried): {}", s.kernel->name(),
                                  s.backend->name(), best.evaluated, best.why),
                      "", "try smaller blocks or another shape");
  ModelChoice fallback = predict_config(s, s.space.default_config());
  CacheEntry e;
  e.key = model_key(s);
  e.config = best.config;
  e.time_s = best.prediction->seconds;
  e.default_time_s = fallback.prediction ? fallback.prediction->seconds : 0;
  e.info = {{"origin", "model"},
            {"effort", "model"},
            {"search", "model"},
            {"tried", best.evaluated},
            {"fitted", best.fitted},
            {"hardware_model", best.hardware},
            {"predicted_tflops", best.prediction->tflops()},
            {"bound", model::name(best.prediction->bound)},
            {"created", now_text()},
            {"created_unix", runtime::unix_now()}};
  write_entry(e);
  return e;
}

bool drop_model_entry(const driver::Specialized& s) {
  std::error_code ec;
  std::optional<CacheEntry> e = model_entry(s);
  if (!e) return false;
  std::filesystem::remove(e->key.path(), ec);
  return !ec;
}

}  // namespace deuteron::autotune
