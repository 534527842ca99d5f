// Ranking a kernel's configs by the target's performance model (autotune.h: rank_by_model):
// lowering and predicting a config takes microseconds where compiling and timing it takes
// seconds, so the model-guided search compiles only the top of this list.
#include <algorithm>
#include <random>
#include <set>

#include <fmt/format.h>

#include "autotune/autotune.h"
#include "autotune/search.h"
#include "deuteron/error.h"
#include "model/model.h"

namespace deuteron::autotune {

ModelRanking rank_by_model(const driver::Specialized& s, int64_t limit, uint64_t seed) {
  ModelRanking out;
  // The points to rank: the whole space when it is small enough, else a fixed-seed sample.
  std::vector<config::Config> points = enumerate(s.space, limit);
  if (points.empty()) {
    out.sampled = true;
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 0x30DE1);
    std::set<std::string> seen;
    for (int64_t tries = 0; int64_t(points.size()) < limit && tries < 4 * limit; ++tries) {
      config::Config c = s.space.random(rng);
      if (seen.insert(c.dump()).second) points.push_back(c);
    }
  }
  for (const config::Config& c : points) {
    ++out.considered;
    plan::Plan p;
    try {
      p = driver::lower(s, c);
    } catch (const ConfigError&) {
      ++out.pruned;
      continue;
    }
    std::optional<model::Hardware> hw = s.backend->model_hardware(p);
    if (!hw) {
      out.why_not = fmt::format("the {} target has no performance model (Backend::model_hardware)", s.backend->name());
      out.configs.clear();
      return out;
    }
    out.configs.push_back({c, model::predict(p, *hw).seconds});
  }
  out.available = true;
  // Fastest predicted first; ties keep the space's order, so the ranking is reproducible.
  std::stable_sort(out.configs.begin(), out.configs.end(),
                   [](const RankedConfig& a, const RankedConfig& b) { return a.predicted_s < b.predicted_s; });
  return out;
}

}  // namespace deuteron::autotune
