// Search strategies over a config space: random, pattern (neighbourhood moves from the best
// points, with restarts), differential evolution (over encoded positions), exhaustive, and
// model (a list ranked beforehand by the target's performance model, tried in order).
//
// A strategy proposes configs and is told their cost (lower is better; +inf for a config that
// was pruned, failed or gave a wrong answer). It never measures anything itself, so the same
// strategies drive the real tuner (asynchronous: several proposals in flight while configs
// compile and run) and the synthetic objectives of the tests (synchronous, `run_search`).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"

namespace deuteron::autotune {

constexpr double kFailed = std::numeric_limits<double>::infinity();

struct Proposal {
  enum class Kind {
    Evaluate,  // evaluate `config`
    Wait,      // nothing to propose until outstanding results are reported
    Done,      // the strategy has nothing more to try
  };
  Kind kind = Kind::Done;
  config::Config config;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  // The next config to evaluate (complete: every tunable set), or Wait, or Done. The caller
  // reports every proposed config exactly once, in any order.
  virtual Proposal next() = 0;
  virtual void report(const config::Config& c, double cost) = 0;
};

struct StrategyOptions {
  // Evaluated first, in order (the space's default config, then warm starts): completed into
  // the space by the caller.
  std::vector<config::Config> seeds;
  uint64_t seed = 0;
  // How many evaluations the caller means to spend (a hint: population sizes, restarts).
  int budget = 64;
  // "model": the configs to evaluate after the seeds, most promising first (rank_by_model).
  std::vector<config::Config> ranked;
};

// "random", "pattern", "de" (differential evolution), "exhaustive" or "model" (the seeds, then
// options.ranked in order); throws ArgumentError naming the known ones.
std::unique_ptr<Strategy> make_strategy(const std::string& name, const config::ConfigSpace& space,
                                        const StrategyOptions& options);
const std::vector<std::string>& strategy_names();

// Every config of the space in a fixed order (mixed radix over the tunables' positions).
// Only for spaces of at most `limit` points; returns an empty vector otherwise.
std::vector<config::Config> enumerate(const config::ConfigSpace& space, int64_t limit);

// Runs a strategy synchronously against a cost function, with at most `max_evaluations`
// distinct configs evaluated (repeated proposals are answered from memory). For tests and
// for tuning objectives that are cheap to evaluate.
struct SearchResult {
  config::Config best;
  double best_cost = kFailed;
  int evaluations = 0;  // distinct configs evaluated
  std::vector<std::pair<config::Config, double>> history;  // in evaluation order
};
SearchResult run_search(Strategy& strategy, const std::function<double(const config::Config&)>& cost,
                        int max_evaluations);

}  // namespace deuteron::autotune
