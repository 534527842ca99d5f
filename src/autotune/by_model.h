// Choosing a config by the performance model (model/model.h) instead of timing it: for a
// target nobody can time here (`deuteron tune --by-model`, `deuteron model --strategy`). The
// choice is cached as a model-chosen entry beside the measured ones (cache.h); a measured tune
// on the real device replaces it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "autotune/cache.h"
#include "config/config.h"
#include "driver/driver.h"
#include "model/model.h"

namespace deuteron::autotune {

// --strategy's names for the inner-loop placements: emit_pipeline (stream), unroll
// (resident), fori_loop (in_place). Throws ArgumentError for another name.
std::string placement_of_strategy(const std::string& strategy);

// Every inner loop of `s` set to `placement`, its operands following the loop.
void force_placement(const driver::Specialized& s, const std::string& placement, config::Config& c);

struct ModelChoice {
  config::Config config;                 // completed
  std::optional<model::Prediction> prediction;  // nullopt: no candidate fits (then `why`)
  std::string why;                       // the target's reason the best candidate did not fit
  std::string hardware;                  // the hardware description's name
  int evaluated = 0, fitted = 0;
};

// The predicted time of one config (nullopt with `why` when it does not fit the target).
ModelChoice predict_config(const driver::Specialized& s, const config::Config& c);

// The fastest config by the model among `base` and `candidates` random points of the space
// (seeded: the same answer every time). With `placement`, every candidate takes it on every
// inner loop; without, the candidates run through every placement the space offers, so the
// choice follows the shape (resident operands where they fit, streamed where not).
ModelChoice best_by_model(const driver::Specialized& s, const config::Config& base, int candidates,
                          const std::string& placement = "", uint64_t seed = 1);

// The cache key of `s`'s model-chosen entry: its hardware is the model's description of the
// target (no device probed), so a measured entry never collides with it.
CacheKey model_key(const driver::Specialized& s);

// The model-chosen entry for `s`, if one is cached and its config still lowers.
std::optional<CacheEntry> model_entry(const driver::Specialized& s);

// Chooses by the model and caches the choice (info.origin "model"); returns the entry.
// Throws ArgumentError when the target has no hardware description, ConfigError when no
// candidate fits.
CacheEntry tune_by_model(const driver::Specialized& s, int candidates = 400);

// Removes `s`'s model-chosen entry (a measured tune replaced it); whether there was one.
bool drop_model_entry(const driver::Specialized& s);

}  // namespace deuteron::autotune
