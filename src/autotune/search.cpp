#include "autotune/search.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "deuteron/error.h"

namespace deuteron::autotune {

using config::Config;
using config::ConfigSpace;

namespace {

// Mixed-radix position vector of point `index` (first tunable fastest).
std::vector<int> positions_of(const ConfigSpace& space, int64_t index) {
  std::vector<int> pos;
  for (const auto& t : space.tunables()) {
    int64_t n = int64_t(t.values.size());
    pos.push_back(int(index % n));
    index /= n;
  }
  return pos;
}

// The points one tunable away from `pos`, `dist` positions along it (choices only at 1).
std::vector<Config> moves_along_one(const ConfigSpace& space, const std::vector<int>& pos, int dist) {
  std::vector<Config> out;
  for (size_t i = 0; i < pos.size(); ++i) {
    const auto& t = space.tunables()[i];
    if (dist > 1 && t.kind == config::Tunable::Kind::Choice) continue;
    for (int step : {-dist, dist}) {
      int p = pos[i] + step;
      if (p < 0 || p >= int(t.values.size())) continue;
      std::vector<int> q = pos;
      q[i] = p;
      out.push_back(space.decode(q));
    }
  }
  return out;
}

// What every strategy shares: the space, a random generator, seeds evaluated first, and
// memory of what was proposed and what it cost.
class Base : public Strategy {
 public:
  Base(const ConfigSpace& space, const StrategyOptions& o)
      : space_(space), rng_(o.seed * 0x9E3779B97F4A7C15ull + 0x5EED), budget_(o.budget) {
    for (const Config& c : o.seeds) seeds_.push_back(c);
  }

  void report(const Config& c, double cost) override {
    std::string key = c.dump();
    auto it = cost_.find(key);
    if (it == cost_.end() || cost < it->second) cost_[key] = cost;
    if (outstanding_ > 0) --outstanding_;
    if (std::isfinite(cost) && cost < best_cost_) {
      best_cost_ = cost;
      best_ = c;
    }
    on_report(c, cost);
  }

 protected:
  virtual void on_report(const Config& c, double cost) { (void)c, (void)cost; }

  bool proposed(const Config& c) const { return proposed_.count(c.dump()) > 0; }
  bool known(const Config& c, double* cost = nullptr) const {
    auto it = cost_.find(c.dump());
    if (it == cost_.end()) return false;
    if (cost) *cost = it->second;
    return true;
  }
  Proposal propose(const Config& c) {
    proposed_.insert(c.dump());
    ++outstanding_;
    return {Proposal::Kind::Evaluate, c};
  }
  // The next seed not proposed yet.
  bool next_seed(Config* out) {
    while (!seeds_.empty()) {
      Config c = seeds_.front();
      seeds_.pop_front();
      if (!proposed(c)) {
        *out = c;
        return true;
      }
    }
    return false;
  }
  // A uniformly random point not proposed yet (nullopt after many misses).
  std::optional<Config> fresh_random() {
    if (int64_t(proposed_.size()) >= space_.size()) return std::nullopt;
    for (int attempt = 0; attempt < 400; ++attempt) {
      Config c = space_.random(rng_);
      if (!proposed(c)) return c;
    }
    // Nearly exhausted: scan from a random index.
    int64_t n = space_.size();
    if (n > 1'000'000) return std::nullopt;
    int64_t start = int64_t(rng_() % uint64_t(n));
    for (int64_t i = 0; i < n; ++i) {
      Config c = space_.decode(positions_of(space_, (start + i) % n));
      if (!proposed(c)) return c;
    }
    return std::nullopt;
  }

  ConfigSpace space_;
  std::mt19937_64 rng_;
  int budget_;
  std::deque<Config> seeds_;
  std::set<std::string> proposed_;
  std::map<std::string, double> cost_;
  int outstanding_ = 0;
  Config best_;
  double best_cost_ = kFailed;
};

// Uniform random sampling without repeats; the seeds first.
class RandomSearch : public Base {
 public:
  using Base::Base;
  std::string name() const override { return "random"; }
  Proposal next() override {
    Config c;
    if (next_seed(&c)) return propose(c);
    if (auto r = fresh_random()) return propose(*r);
    return {Proposal::Kind::Done, {}};
  }
};

// Every point of the space: the seeds, then mixed-radix order.
class ExhaustiveSearch : public Base {
 public:
  ExhaustiveSearch(const ConfigSpace& space, const StrategyOptions& o) : Base(space, o) {
    if (space.size() > kLimit)
      throw ArgumentError(fmt::format("the config space has {} points: too many for exhaustive "
                                      "search (at most {})",
                                      space.size(), kLimit),
                          "", "use --search pattern, de or random");
  }
  std::string name() const override { return "exhaustive"; }
  Proposal next() override {
    Config c;
    if (next_seed(&c)) return propose(c);
    while (index_ < space_.size()) {
      c = space_.decode(positions_of(space_, index_++));
      if (!proposed(c)) return propose(c);
    }
    return {Proposal::Kind::Done, {}};
  }
  static constexpr int64_t kLimit = 1'000'000;

 private:
  int64_t index_ = 0;
};

// The seeds, then a list ranked beforehand (by the performance model), in order; then a descent
// from the best point measured: its neighbours one step along each tunable, and again from each
// point that beats it, while the budget lasts. The model ranks the configs of a kernel it
// mispredicts all alike (welford [65536, 512] on a Zen 4: its top 8 staged whole rows and ran
// 1.5-2.6x the default's time, and the default's neighbour with half its rows ran 0.88x).
class RankedSearch : public Base {
 public:
  RankedSearch(const ConfigSpace& space, const StrategyOptions& o) : Base(space, o) {
    for (const Config& c : o.ranked) ranked_.push_back(c);
  }
  std::string name() const override { return "model"; }
  Proposal next() override {
    Config c;
    if (next_seed(&c)) return propose(c);
    while (!ranked_.empty()) {
      c = ranked_.front();
      ranked_.pop_front();
      if (!proposed(c)) return propose(c);
    }
    for (;;) {
      while (!moves_.empty()) {
        c = moves_.front();
        moves_.pop_front();
        if (!proposed(c)) return propose(c);
      }
      if (outstanding_ > 0) return {Proposal::Kind::Wait, {}};
      if (!std::isfinite(best_cost_) || !descended_from_.insert(best_.dump()).second)
        return {Proposal::Kind::Done, {}};
      for (Config& m : moves_along_one(space_, space_.encode(best_), 1)) moves_.push_back(std::move(m));
    }
  }

 private:
  std::deque<Config> ranked_;
  std::deque<Config> moves_;
  std::set<std::string> descended_from_;
};

// Pattern search: best-first neighbourhood moves with restarts.
//
// The best few points found so far (top 3) are expanded in turn: their neighbours one step
// away in each tunable, two steps away along ordered tunables (block sizes, counts), and,
// when a point improved on the point it was reached from, the "pattern move" that continues
// in the same direction (Hooke and Jeeves). When every top point has been expanded (a local
// optimum), a restart descends from a fresh random point, expanding the best point of that
// descent until it too stops improving; then the top points are checked again.
class PatternSearch : public Base {
 public:
  using Base::Base;
  std::string name() const override { return "pattern"; }

  Proposal next() override {
    Config c;
    if (next_seed(&c)) {
      run_of_[c.dump()] = 0;
      return propose(c);
    }
    for (;;) {
      while (!queue_.empty()) {
        Config q = queue_.front();
        queue_.pop_front();
        if (!proposed(q)) return propose(q);
      }
      if (auto center = pick_center()) {
        expand(*center);
        continue;
      }
      if (outstanding_ > 0) return {Proposal::Kind::Wait, {}};
      auto r = fresh_random();
      if (!r) return {Proposal::Kind::Done, {}};
      ++run_;
      run_of_[r->dump()] = run_;
      return propose(*r);
    }
  }

 protected:
  void on_report(const Config& c, double cost) override {
    if (!std::isfinite(cost)) return;
    int run = run_of_.count(c.dump()) ? run_of_[c.dump()] : 0;
    auto& best = run_best_[run];
    if (best.second == nullptr || cost < best.first) best = {cost, std::make_shared<Config>(c)};
  }

 private:
  // The best unexpanded point among the global top 3, else the current restart's best.
  std::optional<Config> pick_center() {
    std::vector<std::pair<double, std::string>> ranked;
    for (auto& [key, cost] : cost_)
      if (std::isfinite(cost)) ranked.push_back({cost, key});
    std::sort(ranked.begin(), ranked.end());
    for (size_t i = 0; i < ranked.size() && i < 3; ++i)
      if (!expanded_.count(ranked[i].second)) return Config::parse(ranked[i].second);
    auto it = run_best_.find(run_);
    if (run_ > 0 && it != run_best_.end() && it->second.second &&
        !expanded_.count(it->second.second->dump()))
      return *it->second.second;
    return std::nullopt;
  }

  void expand(const Config& center) {
    std::string key = center.dump();
    expanded_.insert(key);
    int run = run_of_.count(key) ? run_of_[key] : 0;
    std::vector<int> pos = space_.encode(center);
    std::vector<Config> moves;
    // Pattern move: continue in the direction that led here if it improved.
    if (auto p = parent_.find(key); p != parent_.end()) {
      double here = cost_.count(key) ? cost_[key] : kFailed, there = kFailed;
      known(space_.decode(p->second), &there);
      if (here < there) {
        std::vector<int> q = pos;
        for (size_t i = 0; i < q.size(); ++i) q[i] = 2 * pos[i] - p->second[i];
        moves.push_back(space_.decode(q));
      }
    }
    for (int dist : {1, 2})
      for (Config& m : moves_along_one(space_, pos, dist)) moves.push_back(std::move(m));
    for (Config& m : moves) {
      std::string mk = m.dump();
      if (proposed(m) || mk == key) continue;
      parent_.emplace(mk, pos);
      run_of_.emplace(mk, run);
      queue_.push_back(m);
    }
  }

  std::deque<Config> queue_;
  std::set<std::string> expanded_;
  std::map<std::string, std::vector<int>> parent_;  // move -> the center it came from
  std::map<std::string, int> run_of_;  // point -> restart that proposed it (0: seeds, top points)
  std::map<int, std::pair<double, std::shared_ptr<Config>>> run_best_;
  int run_ = 0;
};

// Differential evolution over encoded positions (current-to-best/1/bin), rounded to the
// nearest value index. Repeated points cost nothing (answered from memory); generations that
// find nothing new bring in random immigrants.
class DifferentialEvolution : public Base {
 public:
  DifferentialEvolution(const ConfigSpace& space, const StrategyOptions& o) : Base(space, o) {
    dims_ = int(space.tunables().size());
    np_ = std::clamp(o.budget / 5, 6, 20);
    np_ = std::max(np_, std::min(2 * dims_, 20));
    std::vector<Config> init;
    for (const Config& c : o.seeds)
      if (int(init.size()) < np_) init.push_back(c);
    seeds_.clear();  // the seeds are the first members of the population
    for (int i = 0; int(init.size()) < np_ && i < 20 * np_; ++i) {
      Config c = space.random(rng_);
      bool dup = false;
      for (auto& x : init) dup = dup || x == c;
      if (!dup || i >= 10 * np_) init.push_back(c);
    }
    for (const Config& c : init) {
      Member m;
      for (int p : space.encode(c)) m.x.push_back(double(p));
      m.config = c;
      pop_.push_back(m);
      pending_.push_back(c);
    }
    trial_.resize(pop_.size());
  }
  std::string name() const override { return "de"; }

  Proposal next() override {
    for (int guard = 0; guard < 100; ++guard) {
      while (!pending_.empty()) {
        Config c = pending_.front();
        pending_.pop_front();
        if (!proposed(c)) return propose(c);
      }
      if (outstanding_ > 0) return {Proposal::Kind::Wait, {}};
      if (int64_t(cost_.size()) >= space_.size()) return {Proposal::Kind::Done, {}};
      if (!initialised_) {
        for (Member& m : pop_) known(m.config, &m.cost);
        initialised_ = true;
      } else {
        select();
      }
      breed();
      if (pending_.empty()) {
        if (++stale_ >= 3) immigrate();
        if (stale_ >= 50) return {Proposal::Kind::Done, {}};
      } else {
        stale_ = 0;
      }
    }
    return {Proposal::Kind::Done, {}};
  }

 private:
  struct Member {
    std::vector<double> x;
    Config config;
    double cost = kFailed;
  };

  void select() {
    for (size_t i = 0; i < pop_.size(); ++i) {
      double c = kFailed;
      known(trial_[i].config, &c);
      trial_[i].cost = c;
      if (c <= pop_[i].cost) pop_[i] = trial_[i];
    }
  }

  std::vector<int> round(const std::vector<double>& x) const {
    std::vector<int> p(x.size());
    for (size_t d = 0; d < x.size(); ++d) {
      int n = int(space_.tunables()[d].values.size());
      p[d] = std::clamp(int(std::lround(x[d])), 0, n - 1);
    }
    return p;
  }

  void breed() {
    size_t best = 0;
    for (size_t i = 0; i < pop_.size(); ++i)
      if (pop_[i].cost < pop_[best].cost) best = i;
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const double F = 0.6, CR = 0.7;
    size_t n = pop_.size();
    for (size_t i = 0; i < n; ++i) {
      size_t a, b;
      do a = rng_() % n; while (a == i && n > 1);
      do b = rng_() % n; while ((b == i || b == a) && n > 2);
      Member t;
      t.x = pop_[i].x;
      size_t jrand = rng_() % size_t(dims_ ? dims_ : 1);
      for (int d = 0; d < dims_; ++d) {
        if (u(rng_) < CR || size_t(d) == jrand) {
          double v = pop_[i].x[d] + F * (pop_[best].x[d] - pop_[i].x[d]) + F * (pop_[a].x[d] - pop_[b].x[d]);
          double hi = double(space_.tunables()[size_t(d)].values.size() - 1);
          t.x[d] = std::clamp(v, 0.0, hi);
        }
      }
      std::vector<int> p = round(t.x);
      if (p == round(pop_[i].x) && dims_ > 0) {
        // Rounding undid the move: take one step in a random tunable instead.
        int d = int(rng_() % size_t(dims_));
        int sz = int(space_.tunables()[size_t(d)].values.size());
        if (sz > 1) {
          int step = (rng_() & 1) ? 1 : -1;
          if (p[size_t(d)] + step < 0 || p[size_t(d)] + step >= sz) step = -step;
          p[size_t(d)] += step;
          t.x[size_t(d)] = p[size_t(d)];
        }
      }
      t.config = space_.decode(p);
      trial_[i] = t;
      if (!known(t.config) && !proposed(t.config)) {
        bool dup = false;
        for (auto& q : pending_) dup = dup || q == t.config;
        if (!dup) pending_.push_back(t.config);
      }
    }
  }

  // Replaces the worse half of the population with fresh random points.
  void immigrate() {
    std::vector<size_t> order(pop_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return pop_[a].cost < pop_[b].cost; });
    for (size_t k = order.size() / 2; k < order.size(); ++k) {
      auto r = fresh_random();
      if (!r) break;
      Member& m = pop_[order[k]];
      m.x.clear();
      for (int p : space_.encode(*r)) m.x.push_back(double(p));
      m.config = *r;
      m.cost = kFailed;
      trial_[order[k]] = m;  // selected against itself once it is known
      pending_.push_back(*r);
    }
  }

  int dims_ = 0, np_ = 8, stale_ = 0;
  bool initialised_ = false;
  std::vector<Member> pop_, trial_;
  std::deque<Config> pending_;
};

}  // namespace

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = {"random", "pattern", "de", "exhaustive", "model"};
  return names;
}

std::unique_ptr<Strategy> make_strategy(const std::string& name, const ConfigSpace& space,
                                        const StrategyOptions& options) {
  if (name == "random") return std::make_unique<RandomSearch>(space, options);
  if (name == "pattern") return std::make_unique<PatternSearch>(space, options);
  if (name == "de") return std::make_unique<DifferentialEvolution>(space, options);
  if (name == "exhaustive") return std::make_unique<ExhaustiveSearch>(space, options);
  if (name == "model") return std::make_unique<RankedSearch>(space, options);
  throw ArgumentError(fmt::format("unknown search strategy '{}'", name), "",
                      fmt::format("known strategies: {}", fmt::join(strategy_names(), ", ")));
}

std::vector<Config> enumerate(const ConfigSpace& space, int64_t limit) {
  std::vector<Config> out;
  int64_t n = space.size();
  if (n > limit) return out;
  out.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(space.decode(positions_of(space, i)));
  return out;
}

SearchResult run_search(Strategy& strategy, const std::function<double(const Config&)>& cost,
                        int max_evaluations) {
  SearchResult r;
  std::map<std::string, double> memo;
  int repeats = 0;
  for (;;) {
    Proposal p = strategy.next();
    if (p.kind != Proposal::Kind::Evaluate) break;  // Wait cannot happen: every answer is immediate
    std::string key = p.config.dump();
    double c;
    if (auto it = memo.find(key); it != memo.end()) {
      c = it->second;
      if (++repeats > 10000) break;
    } else {
      if (r.evaluations >= max_evaluations) break;
      repeats = 0;
      c = cost(p.config);
      memo[key] = c;
      ++r.evaluations;
      r.history.push_back({p.config, c});
      if (c < r.best_cost) {
        r.best_cost = c;
        r.best = p.config;
      }
    }
    strategy.report(p.config, c);
  }
  return r;
}

}  // namespace deuteron::autotune
