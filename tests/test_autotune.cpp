// The autotuner: search strategies on synthetic objectives, pruning, isolation of crashing,
// hanging, wrong and memory-hungry candidates, the accuracy check, the cache (round trip,
// corrupt entries, concurrent writers, a new process that neither tunes nor compiles), warm
// starts.
//
// Real tuning runs use a small kernel and a handful of candidates, and share one cache
// directory for the whole test program so that the runner, the precompiled header and the
// candidates' shared objects are built once.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "autotune/autotune.h"
#include "autotune/by_model.h"
#include "autotune/cache.h"
#include "autotune/process.h"
#include "autotune/search.h"
#include "backends/cpu/compiler.h"
#include "backends/cpu/hardware.h"
#include "backends/pallas/backend.h"
#include "deuteron/deuteron.h"
#include "driver/driver.h"
#include "model/model.h"
#include "runtime/disk_cache.h"
#include "runtime/process.h"
#include "test_kernels.h"
#include "test_support.h"

extern char** environ;

namespace fs = std::filesystem;
namespace hl = deuteron::hl;

namespace deuteron {
namespace {

using autotune::Candidate;
using config::Config;

// Elementwise: its space has two block sizes, the grid order and the thread count.
const auto tune_add = deuteron::kernel("autotune_test_add", [](hl::Tensor x, hl::Tensor y) {
  auto out = hl::empty_like(x);
  for (auto tile : hl::tile(out.sizes())) out[tile] = x[tile] * 2.0 + y[tile];
  return out;
});

// Row softmax: block rows, a reduction block (persistent or looped), threads; configs with
// many long rows per block do not fit any core's fast memory.
const auto tune_softmax = deuteron::kernel("autotune_test_softmax", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  for (auto tm : hl::tile(x.size(0))) {
    auto row = x[{tm, hl::all}];
    auto e = hl::exp(row - row.amax(1, true));
    out[{tm, hl::all}] = e / e.sum(1, true);
  }
  return out;
});

std::vector<Tensor> add_reference(const std::vector<Arg>& args) {
  const Tensor& x = std::get<Tensor>(args[0]);
  const Tensor& y = std::get<Tensor>(args[1]);
  Tensor out = Tensor::empty(x.sizes(), x.dtype());
  for (int64_t i = 0; i < x.numel(); ++i) out.set(i, 2.0 * x.get(i) + y.get(i));
  return {out};
}

std::vector<Tensor> softmax_reference(const std::vector<Arg>& args) {
  const Tensor& x = std::get<Tensor>(args[0]);
  Tensor out = Tensor::empty(x.sizes(), x.dtype());
  int64_t n = x.size(1);
  for (int64_t r = 0; r < x.size(0); ++r) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x.get(r * n + j));
    for (int64_t j = 0; j < n; ++j) sum += std::exp(x.get(r * n + j) - mx);
    for (int64_t j = 0; j < n; ++j) out.set(r * n + j, std::exp(x.get(r * n + j) - mx) / sum);
  }
  return {out};
}

driver::Specialized specialize(const KernelBase& k, const std::vector<Arg>& args) {
  return driver::specialize(k, frontend::describe_args(k, args), "cpu");
}

// One cache directory for the whole program (see the top of the file), removed at exit.
const std::string& shared_cache_dir() {
  struct Dir {
    std::string path;
    Dir() {
      std::string tmpl = (fs::temp_directory_path() / "deuteron-autotune-test-XXXXXX").string();
      if (!mkdtemp(tmpl.data())) std::abort();
      path = tmpl;
    }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

class Autotune : public testing::Test {
 protected:
  void SetUp() override {
    const char* v = std::getenv("DEUTERON_CACHE_DIR");
    saved_ = v ? std::optional<std::string>(v) : std::nullopt;
    setenv("DEUTERON_CACHE_DIR", shared_cache_dir().c_str(), 1);
    autotune::clear_memory_cache();
  }
  void TearDown() override {
    if (saved_) setenv("DEUTERON_CACHE_DIR", saved_->c_str(), 1);
    else unsetenv("DEUTERON_CACHE_DIR");
    autotune::clear_memory_cache();
  }
  // Removes the tuned entries of one kernel (compiled kernels stay: they make tests fast).
  static void forget(const std::string& kernel) { fs::remove_all(cache_root() / "autotune" / kernel); }

  // --search model over at most `candidates` configs, checked against `reference`, not cached.
  static autotune::TuneOptions model_search_options(const std::vector<Arg>& args,
                                                    decltype(autotune::TuneOptions::reference) reference,
                                                    int64_t candidates) {
    autotune::TuneOptions o = small_options();
    o.args = args;
    o.reference = std::move(reference);
    o.search = "model";
    o.max_candidates = candidates;
    o.write_cache = false;
    return o;
  }
  static autotune::TuneOptions small_options() {
    autotune::TuneOptions o;
    o.progress = "quiet";
    o.max_candidates = 4;
    // Tests bound their work by max_candidates; the budget only guards against a hang. CI runs
    // two ctests at once beside the triton catalogue, and 60 s once stopped a 3-candidate model
    // search after its first compile (ModelSearchTimesTheDefaultAndTheTopRanked, 69 s).
    o.time_budget_s = 600;
    o.warm_start = false;
    o.search = "random";
    o.run_timeout_s = 20;
    o.sample_s = 0.01;
    o.retime_s = 0.02;
    return o;
  }

  std::optional<std::string> saved_;
};

// ---- search strategies on synthetic objectives ---------------------------------------------

// A space with four tunables (two block sizes with 9 and 10 values, grid order, threads).
config::ConfigSpace test_space() {
  auto args = std::vector<Arg>{Tensor::zeros({256, 512}, DType::f32), Tensor::zeros({256, 512}, DType::f32)};
  return specialize(tune_add, args).space;
}

// Separable bowl around `target` (positions), with a forbidden region (+inf, as pruned or
// failed configs are) and small ripples so that ties do not decide.
struct Bowl {
  const config::ConfigSpace& space;
  std::vector<int> target;
  double operator()(const Config& c) const {
    std::vector<int> p = space.encode(c);
    if (p[0] + p[1] >= 15) return autotune::kFailed;  // "does not fit"
    double v = 1.0;
    for (size_t i = 0; i < p.size(); ++i) v += (1.0 + 0.1 * double(i)) * std::pow(p[i] - target[i], 2);
    return v;
  }
};

std::vector<int> optimum_of(const config::ConfigSpace& space, const Bowl& f) {
  double best = autotune::kFailed;
  std::vector<int> at;
  for (const Config& c : autotune::enumerate(space, 100000))
    if (double v = f(c); v < best) {
      best = v;
      at = space.encode(c);
    }
  return at;
}

TEST(AutotuneSearch, SpaceIsWhatTheTestsExpect) {
  auto space = test_space();
  ASSERT_GE(space.tunables().size(), 3u);
  EXPECT_GE(space.size(), 100);
  EXPECT_LE(space.size(), 5000);
  EXPECT_EQ(autotune::enumerate(space, 100000).size(), size_t(space.size()));
  EXPECT_TRUE(autotune::enumerate(space, 10).empty());
}

TEST(AutotuneSearch, EveryStrategyFindsTheOptimumOfABowl) {
  auto space = test_space();
  std::vector<int> target(space.tunables().size(), 0);
  target[0] = 6;  // away from the default and from the edges
  target[1] = 3;
  Bowl f{space, target};
  std::vector<int> want = optimum_of(space, f);
  ASSERT_EQ(want, target);
  for (std::string name : {"exhaustive", "random", "pattern", "de"}) {
    for (uint64_t seed : {1, 2, 3}) {
      autotune::StrategyOptions so;
      so.seeds = {space.default_config()};
      so.seed = seed;
      // Random search is only sure to find it when it can see everything.
      int budget = name == "random" || name == "exhaustive" ? int(space.size()) : 80;
      so.budget = budget;
      auto strategy = autotune::make_strategy(name, space, so);
      auto r = autotune::run_search(*strategy, f, budget);
      EXPECT_EQ(space.encode(r.best), want) << name << " seed " << seed << " after " << r.evaluations;
      EXPECT_LE(r.evaluations, budget);
      // The seeds come first.
      ASSERT_FALSE(r.history.empty());
      EXPECT_EQ(r.history.front().first, space.default_config()) << name;
    }
  }
}

TEST(AutotuneSearch, PatternSearchRestartsOutOfALocalMinimum) {
  auto space = test_space();
  // Two basins; the default lies in the shallow one.
  std::vector<int> deep(space.tunables().size(), 0), shallow = space.encode(space.default_config());
  deep[0] = 0;
  deep[1] = 9;
  auto f = [&](const Config& c) {
    std::vector<int> p = space.encode(c);
    double a = 0, b = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      a += std::pow(p[i] - shallow[i], 2);
      b += std::pow(p[i] - deep[i], 2);
    }
    return std::min(10.0 + a, 1.0 + 3 * b);
  };
  int found = 0;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    autotune::StrategyOptions so;
    so.seeds = {space.default_config()};
    so.seed = seed;
    so.budget = 120;
    auto strategy = autotune::make_strategy("pattern", space, so);
    auto r = autotune::run_search(*strategy, f, 120);
    found += space.encode(r.best) == deep;
  }
  EXPECT_GE(found, 3) << "pattern search should leave the shallow basin by restarting";
}

TEST(AutotuneSearch, SameSeedSameSequence) {
  auto space = test_space();
  Bowl f{space, std::vector<int>(space.tunables().size(), 1)};
  for (std::string name : {"random", "pattern", "de"}) {
    autotune::StrategyOptions so;
    so.seed = 42;
    auto a = autotune::make_strategy(name, space, so);
    auto b = autotune::make_strategy(name, space, so);
    auto ra = autotune::run_search(*a, f, 30), rb = autotune::run_search(*b, f, 30);
    ASSERT_EQ(ra.history.size(), rb.history.size()) << name;
    for (size_t i = 0; i < ra.history.size(); ++i) EXPECT_EQ(ra.history[i].first, rb.history[i].first) << name;
  }
}

TEST(AutotuneSearch, ExhaustiveVisitsEachPointOnceAndUnknownNamesAreErrors) {
  auto space = test_space();
  auto s = autotune::make_strategy("exhaustive", space, {});
  std::set<std::string> seen;
  auto r = autotune::run_search(*s, [&](const Config& c) {
    EXPECT_TRUE(seen.insert(c.dump()).second);
    return 1.0;
  }, 1 << 20);
  EXPECT_EQ(int64_t(seen.size()), space.size());
  EXPECT_THROW(autotune::make_strategy("simulated-annealing", space, {}), ArgumentError);
}

TEST(AutotuneSearch, ModelSearchTriesTheSeedsThenTheRankingInOrder) {
  auto space = test_space();
  std::vector<Config> all = autotune::enumerate(space, 100000);
  ASSERT_GE(all.size(), 10u);
  autotune::StrategyOptions so;
  so.seeds = {space.default_config()};
  // A ranking that repeats a point and holds the default: each is evaluated once, in order.
  so.ranked = {all[7], all[3], all[7], space.default_config(), all[9]};
  auto s = autotune::make_strategy("model", space, so);
  EXPECT_EQ(s->name(), "model");
  auto r = autotune::run_search(*s, [](const Config&) { return 1.0; }, 1000);
  std::vector<Config> want = {space.default_config(), all[7], all[3], all[9]};
  ASSERT_GE(r.history.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(r.history[i].first, want[i]) << i;
  // Then the best point's neighbours (every cost ties: the first, the default): each config
  // one step from it along one tunable, once, and nothing else.
  std::set<std::string> neighbours;
  std::vector<int> d = space.encode(space.default_config());
  for (const Config& c : all) {
    std::vector<int> p = space.encode(c);
    int differ = 0, far = 0;
    for (size_t i = 0; i < p.size(); ++i) differ += p[i] != d[i], far += std::abs(p[i] - d[i]) > 1;
    bool in_want = std::find(want.begin(), want.end(), c) != want.end();
    if (differ == 1 && far == 0 && !in_want) neighbours.insert(c.dump());
  }
  ASSERT_GT(neighbours.size(), 0u);
  std::set<std::string> after;
  for (size_t i = want.size(); i < r.history.size(); ++i) after.insert(r.history[i].first.dump());
  EXPECT_EQ(after, neighbours);
  EXPECT_EQ(r.history.size(), want.size() + neighbours.size());
}

// After the ranking, the model search descends from the best point measured, one step along one
// tunable at a time, again from each point that beats it: on a bowl, from a ranking of one poor
// point, it reaches the bowl's optimum.
TEST(AutotuneSearch, ModelSearchDescendsFromTheBestPoint) {
  auto space = test_space();
  std::vector<int> target = space.encode(space.default_config());
  for (size_t i = 0; i < target.size(); ++i)
    if (space.tunables()[i].values.size() > 3) target[i] = int(space.tunables()[i].values.size()) / 2;
  Bowl f{space, target};
  std::vector<int> want = optimum_of(space, f);
  autotune::StrategyOptions so;
  so.seeds = {space.default_config()};
  auto s = autotune::make_strategy("model", space, so);
  auto r = autotune::run_search(*s, f, 100000);
  EXPECT_EQ(space.encode(r.best), want);
  EXPECT_LT(r.evaluations, int(autotune::enumerate(space, 100000).size()));
}

// ---- pruning, cache keys, small pieces -------------------------------------------------------

TEST(AutotuneUnits, PruneReasonsAreSummarised) {
  EXPECT_EQ(autotune::prune_reason("config {\"a\": 1} needs 9000 KiB of fast memory per thread; the cpu "
                                   "target has 2048 KiB"),
            "fast memory over budget");
  EXPECT_EQ(autotune::prune_reason("block size block_t0 = 3 is not a positive power of two"),
            autotune::prune_reason("block size block_t0 = 5 is not a positive power of two"));
}

TEST(AutotuneUnits, FitIntoClampsToTheNearestValue) {
  auto space = test_space();
  const auto& t0 = space.tunables()[0];
  Config c;
  c.set(t0.name, int64_t(3) << 20);  // far beyond the largest block
  c.set("no_such_tunable", 7);
  Config fitted = autotune::fit_into(space, c);
  EXPECT_EQ(fitted.values().at(t0.name), t0.values.back());
  EXPECT_FALSE(fitted.has("no_such_tunable"));
  EXPECT_NO_THROW(space.complete(fitted));
  c.set(t0.name, 3);  // between 2 and 4: nearest by ratio
  int64_t got = autotune::fit_into(space, c).integer(t0.name);
  EXPECT_TRUE(got == 2 || got == 4);
}

TEST_F(Autotune, CacheKeyIgnoresSourceLinesButNotShapes) {
  auto a = specialize(tune_add, {Tensor::zeros({64, 64}, DType::f32), Tensor::zeros({64, 64}, DType::f32)});
  auto b = specialize(tune_add, {Tensor::zeros({64, 128}, DType::f32), Tensor::zeros({64, 128}, DType::f32)});
  auto ka = autotune::make_key(a, "hw"), ka2 = autotune::make_key(a, "hw"), kb = autotune::make_key(b, "hw");
  EXPECT_EQ(ka.id(), ka2.id());
  EXPECT_NE(ka.id(), kb.id());
  EXPECT_NE(ka.id(), autotune::make_key(a, "other hardware").id());
  std::string text = ir::print(a.ir);
  EXPECT_NE(text.find("test_autotune.cpp"), std::string::npos) << "the IR text names source lines";
  EXPECT_EQ(ir::fingerprint(a.ir).size(), 32u);
}

TEST_F(Autotune, CorruptEntriesAreDetected) {
  auto s = specialize(tune_add, {Tensor::zeros({8, 8}, DType::f32), Tensor::zeros({8, 8}, DType::f32)});
  autotune::CacheEntry e;
  e.key = autotune::make_key(s, "hw");
  e.config = s.space.default_config();
  e.time_s = 1e-3;
  std::string text = autotune::entry_text(e);
  std::string problem;
  ASSERT_TRUE(autotune::parse_entry(text, &problem)) << problem;
  EXPECT_FALSE(autotune::parse_entry(text.substr(0, text.size() / 2), &problem));
  EXPECT_NE(problem.find("JSON"), std::string::npos) << problem;
  std::string edited = text;
  edited.replace(edited.find("0.001"), 5, "0.002");
  EXPECT_FALSE(autotune::parse_entry(edited, &problem));
  EXPECT_NE(problem.find("checksum"), std::string::npos) << problem;
  EXPECT_FALSE(autotune::parse_entry("", &problem));
}

TEST_F(Autotune, ConcurrentWritersLeaveAWholeEntry) {
  auto s = specialize(tune_add, {Tensor::zeros({8, 8}, DType::f32), Tensor::zeros({8, 8}, DType::f32)});
  autotune::CacheKey key = autotune::make_key(s, "concurrency test");
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w)
    writers.emplace_back([&, w] {
      for (int i = 0; i < 100; ++i) {
        autotune::CacheEntry e;
        e.key = key;
        e.config = s.space.default_config();
        e.time_s = 1e-3 * (w * 1000 + i + 1);
        autotune::write_entry(e);
      }
    });
  int reads = 0;
  std::thread reader([&] {
    while (!stop) {
      // Entries are replaced by atomic renames and never removed here: once the file exists,
      // every read must find a whole entry. (Look before reading: the first write may land
      // between a read that found nothing and the look.)
      bool existed = fs::exists(key.path());
      std::string problem;
      auto e = autotune::read_entry(key, &problem);
      if (existed) {
        EXPECT_TRUE(e.has_value()) << problem;
        ++reads;
      }
    }
  });
  for (auto& t : writers) t.join();
  stop = true;
  reader.join();
  EXPECT_GT(reads, 0);
  forget("autotune_test_add");
}

// ---- processes -------------------------------------------------------------------------------

TEST(AutotuneProcess, TreesAreStoppedAndKilled) {
  auto f = autotune::proc::fork_child([](int) {
    // A child with a grandchild, both sleeping.
    if (fork() == 0) {
      for (;;) pause();
    }
    for (;;) pause();
  });
  for (int i = 0; i < 100 && autotune::proc::descendants(f.pid).empty(); ++i) usleep(10000);
  auto below = autotune::proc::descendants(f.pid);
  ASSERT_EQ(below.size(), 1u);
  autotune::proc::signal_tree(f.pid, SIGKILL);
  runtime::ExitStatus ex;
  ASSERT_TRUE(runtime::reap(f.pid, &ex, true));
  EXPECT_FALSE(ex.exited);
  EXPECT_EQ(ex.signal, SIGKILL);
  // Dead means gone, or a zombie waiting for a reaper (in a container, pid 1 may never reap).
  auto alive = [](pid_t p) {
    std::ifstream f(fmt::format("/proc/{}/stat", p));
    std::string text;
    if (!std::getline(f, text)) return false;
    size_t close = text.rfind(')');
    return close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z' &&
           text[close + 2] != 'X';
  };
  for (int i = 0; i < 100 && alive(below[0]); ++i) usleep(10000);
  EXPECT_FALSE(alive(below[0])) << "the grandchild survived";
  close(f.fd);
}

// ---- real tuning runs --------------------------------------------------------------------

std::vector<Arg> add_args(int64_t m, int64_t n) {
  return {Tensor::rand({m, n}, DType::f32, 1), Tensor::rand({m, n}, DType::f32, 2)};
}

const Candidate* find(const autotune::TuneResult& r, const Config& c) {
  for (const Candidate& x : r.candidates)
    if (x.config == c) return &x;
  return nullptr;
}

void expect_correct(const KernelBase& k, const std::vector<Arg>& args, const Config& c,
                    const std::function<std::vector<Tensor>(const std::vector<Arg>&)>& reference) {
  auto r = api::run(k, args, "cpu", c);
  auto want = reference(args);
  Tolerance tol = default_tolerance(DType::f32);
  EXPECT_TRUE(allclose(r.outputs[0], want[0], tol.rtol, tol.atol).close) << c.dump();
}

// The cpu target suggests Goto's loop order for a plain product (ConfigSpace::suggestions): a
// grid block of all of N, A streamed by blocks of K, B resident. The tuner times it right after
// the default, marked "target", and it is correct at a ragged shape. A product with an
// elementwise epilogue gets it too (the epilogue writes over the accumulator in the output's
// tile), with plain stores where the output would stream; a product of bf16 operands gets none.
const auto tune_matmul = test_kernels::tiled_matmul("autotune_test_matmul");
const auto tune_matmul_relu = deuteron::kernel("autotune_test_matmul_relu", [](hl::Tensor x, hl::Tensor y) {
  auto out = hl::empty({x.size(0), y.size(1)});
  for (auto [tm, tn] : hl::tile({x.size(0), y.size(1)})) {
    auto acc = hl::zeros({tm, tn});
    for (auto tk : hl::tile(x.size(1))) acc = hl::dot(x[{tm, tk}], y[{tk, tn}], acc);
    out[{tm, tn}] = hl::maximum(acc, 0.0);
  }
  return out;
});

std::vector<Tensor> matmul_reference(const std::vector<Arg>& args) {
  const Tensor& x = std::get<Tensor>(args[0]);
  const Tensor& y = std::get<Tensor>(args[1]);
  const int64_t m = x.size(0), kk = x.size(1), n = y.size(1);
  Tensor out = Tensor::empty({m, n}, DType::f32);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t q = 0; q < kk; ++q) sum += x.get(i * kk + q) * y.get(q * n + j);
      out.set(i * n + j, sum);
    }
  return {out};
}

TEST_F(Autotune, TargetSuggestionIsTimedAfterTheDefault) {
  std::vector<Arg> args = {Tensor::rand({301, 96}, DType::f32, 1), Tensor::rand({96, 203}, DType::f32, 2)};
  auto s = specialize(tune_matmul, args);
  ASSERT_EQ(s.space.suggestions().size(), 1u) << s.space.describe();
  const Config& goto_order = s.space.suggestions()[0];
  EXPECT_GE(goto_order.integer("block_t1"), 203) << goto_order.dump();
  EXPECT_EQ(goto_order.text("inner_t2_arg0"), "stream") << goto_order.dump();
  EXPECT_EQ(goto_order.text("inner_t2_arg1"), "resident") << goto_order.dump();
  EXPECT_NE(s.space.describe().find("suggested by the target: " + goto_order.dump()), std::string::npos);
  auto relu = specialize(tune_matmul_relu, args);
  ASSERT_EQ(relu.space.suggestions().size(), 1u) << relu.space.describe();
  expect_correct(tune_matmul_relu, args, relu.space.suggestions()[0], [](const std::vector<Arg>& a) {
    std::vector<Tensor> out = matmul_reference(a);
    for (int64_t i = 0; i < out[0].numel(); ++i) out[0].set(i, std::max(out[0].get(i), 0.0));
    return out;
  });
  // An output past the L3 defaults to streaming stores, which would bypass the tile the product
  // accumulates in: the suggestion keeps plain stores (shapes only; nothing is allocated).
  std::vector<frontend::ArgSpec> tall = frontend::describe_args(tune_matmul, args);
  const int64_t l3 = cpu::cpu_info().l3_bytes > 0 ? cpu::cpu_info().l3_bytes : int64_t(32) << 20;
  tall[0].shape = {2 * l3 / (203 * 4), 96};
  tall[0].strides = {96, 1};
  auto past_l3 = driver::specialize(tune_matmul, tall, "cpu");
  EXPECT_EQ(past_l3.space.default_config().text("stores"), "stream");
  ASSERT_EQ(past_l3.space.suggestions().size(), 1u) << past_l3.space.describe();
  EXPECT_EQ(past_l3.space.suggestions()[0].text("stores"), "cached");
  // A bf16 B is packed as pairs, which are not shared: the order would not fit the L2.
  std::vector<Arg> bf16 = {Tensor::rand({301, 96}, DType::bf16, 1), Tensor::rand({96, 203}, DType::bf16, 2)};
  EXPECT_TRUE(specialize(tune_matmul, bf16).space.suggestions().empty());

  forget("autotune_test_matmul");
  autotune::TuneResult r = autotune::tune(s, model_search_options(args, matmul_reference, 2));
  ASSERT_GE(r.candidates.size(), 2u);
  EXPECT_EQ(r.candidates[1].config, goto_order);
  EXPECT_EQ(r.candidates[1].origin, "target");
  EXPECT_EQ(r.candidates[1].status, Candidate::Status::Ok) << r.candidates[1].reason;
  expect_correct(tune_matmul, args, goto_order, matmul_reference);
}

// Candidates that crash, hang, answer wrongly, run out of memory or crash the compiler are
// each reported and skipped; the best config is a correct one. The process has run an
// OpenMP kernel on two threads before tuning (which would make a forked runner hang).
TEST_F(Autotune, BrokenCandidatesAreIsolated) {
  auto args = add_args(64, 96);
  auto s = specialize(tune_add, args);
  {
    Config two = s.space.default_config();
    two.set("num_threads", 2);
    if (s.space.complete(two) == two) api::run(tune_add, args, "cpu", two);
  }
  // Distinct configs, told apart by block_t0 (the first key of the sorted JSON).
  auto with = [&](int64_t b0, int64_t b1) {
    Config c = s.space.default_config();
    c.set("block_t0", b0);
    c.set("block_t1", b1);
    return s.space.complete(c);
  };
  Config crash = with(1, 32), hang = with(2, 32), wrong = with(4, 32), oom = with(8, 32),
         cc = with(1, 16), good = with(16, 32);
  for (const Config& c : {crash, hang, wrong, oom, cc, good}) ASSERT_NE(c, s.space.default_config());
  forget("autotune_test_add");
  autotune::TuneOptions o = small_options();
  o.args = args;
  o.reference = add_reference;
  o.candidates = {crash, hang, wrong, oom, cc, good};
  o.max_candidates = 7;  // the default and the six given
  o.run_timeout_s = 2;
  o.memory_limit_bytes = int64_t(256) << 20;
  o.write_cache = false;
  // Each rule names one whole config, so that none matches the default.
  o.inject = fmt::format("crash:{};hang:{};wrong:{};oom:{};compile_crash:{}", crash.dump(), hang.dump(),
                         wrong.dump(), oom.dump(), cc.dump());
  autotune::TuneResult r = autotune::tune(s, o);

  auto status = [&](const Config& c) {
    const Candidate* x = find(r, c);
    return x ? x : (ADD_FAILURE() << "not evaluated: " << c.dump(), nullptr);
  };
  if (auto* x = status(crash)) {
    EXPECT_EQ(x->status, Candidate::Status::Failed);
    EXPECT_NE(x->reason.find("SIGSEGV"), std::string::npos) << x->reason;
  }
  if (auto* x = status(hang)) {
    EXPECT_EQ(x->status, Candidate::Status::Failed);
    EXPECT_NE(x->reason.find("timed out"), std::string::npos) << x->reason;
  }
  if (auto* x = status(wrong)) {
    EXPECT_EQ(x->status, Candidate::Status::Rejected);
    EXPECT_NE(x->reason.find("wrong answer"), std::string::npos) << x->reason;
  }
  if (auto* x = status(oom)) {
    EXPECT_EQ(x->status, Candidate::Status::Failed);
    EXPECT_NE(x->reason.find("out of memory"), std::string::npos) << x->reason;
  }
  if (auto* x = status(cc)) {
    EXPECT_EQ(x->status, Candidate::Status::Failed);
    EXPECT_NE(x->reason.find("compile worker killed by SIGSEGV"), std::string::npos) << x->reason;
  }
  if (auto* x = status(good)) {
    EXPECT_EQ(x->status, Candidate::Status::Ok) << x->reason;
  }
  EXPECT_EQ(r.failed, 4);
  EXPECT_EQ(r.rejected, 1);
  EXPECT_GE(r.ok, 2);  // the default and `good`
  for (const Config& bad : {crash, hang, wrong, oom, cc}) EXPECT_NE(r.best, bad);
  EXPECT_GT(r.best_s, 0);
  expect_correct(tune_add, args, r.best, add_reference);
}

// A run that other processes kept busy (a fake load signal: nothing here depends on timings)
// does not decide the thread count: only configs with the default's threads are re-timed and
// may win, and the entry says so. A quiet run re-times one-thread configs too.
// A time budget shorter than one compile (a tiny --time-budget on a busy machine) still tunes
// to a working config: the budget stops everything but the default config, which is compiled,
// checked and timed.
TEST_F(Autotune, ABudgetShorterThanACompileStillRunsTheDefault) {
  auto args = add_args(37, 129);
  auto s = specialize(tune_add, args);
  forget("autotune_test_add");
  autotune::TuneOptions o = small_options();
  o.args = args;
  o.reference = add_reference;
  o.max_candidates = 8;
  o.time_budget_s = 1e-3;
  o.write_cache = false;
  autotune::TuneResult r = autotune::tune(s, o);
  EXPECT_GE(r.ok, 1);
  EXPECT_EQ(r.best, s.space.default_config());
}

TEST_F(Autotune, ABusyRunKeepsTheDefaultThreadCount) {
  auto args = add_args(520, 300);  // enough work that the default runs on every core
  auto s = specialize(tune_add, args);
  const Config def = s.space.default_config();
  if (def.integer("num_threads") < 2) GTEST_SKIP() << "one core: the space has a single thread count";
  // Four one-thread configs and the default: the finalists (the top 4 by screening time) hold
  // at least three of them.
  std::vector<Config> one_thread;
  const config::Tunable* b0 = s.space.find("block_t0");
  ASSERT_NE(b0, nullptr);
  for (const auto& v : b0->values) {
    Config c = def;
    c.set("num_threads", 1);
    c.set("block_t0", v);
    c = s.space.complete(c);
    if (c != def && std::find(one_thread.begin(), one_thread.end(), c) == one_thread.end()) one_thread.push_back(c);
    if (one_thread.size() == 4) break;
  }
  ASSERT_EQ(one_thread.size(), 4u);
  auto tune_with_load = [&](double others) {
    forget("autotune_test_add");
    autotune::clear_memory_cache();
    autotune::TuneOptions o = small_options();
    o.args = args;
    o.reference = add_reference;
    o.search = "exhaustive";
    o.candidates = one_thread;
    o.max_candidates = 5;  // the default and the four given
    o.others_cores = [others] { return others; };
    return autotune::tune(s, o);
  };
  auto retimed_threads = [](const autotune::TuneResult& r) {
    std::set<int64_t> t;
    for (const Candidate& c : r.candidates)
      if (c.retimed_s > 0) t.insert(c.config.integer("num_threads"));
    return t;
  };

  autotune::TuneResult busy = tune_with_load(1.5);
  EXPECT_TRUE(busy.threads_kept);
  EXPECT_DOUBLE_EQ(busy.others_cores, 1.5);
  EXPECT_EQ(busy.best.integer("num_threads"), def.integer("num_threads")) << busy.best.dump();
  EXPECT_EQ(retimed_threads(busy), std::set<int64_t>{def.integer("num_threads")});
  std::ifstream entry(busy.cache_path);
  std::string text((std::istreambuf_iterator<char>(entry)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"threads_kept\": true"), std::string::npos) << text;

  autotune::TuneResult quiet = tune_with_load(0.1);
  EXPECT_FALSE(quiet.threads_kept);
  EXPECT_TRUE(retimed_threads(quiet).count(1)) << "a quiet run compares every thread count";
  forget("autotune_test_add");
}

// Without a reference the default config's outputs are the baseline.
TEST_F(Autotune, WrongAnswersAreRejectedAgainstTheDefault) {
  auto args = add_args(64, 96);
  auto s = specialize(tune_add, args);
  Config c = s.space.default_config();
  c.set("block_t0", 16);
  c.set("block_t1", 32);
  c = s.space.complete(c);
  ASSERT_NE(c, s.space.default_config());
  autotune::TuneOptions o = small_options();
  o.candidates = {c};
  o.max_candidates = 2;
  o.write_cache = false;
  o.inject = "wrong:" + c.dump();
  autotune::TuneResult r = autotune::tune(s, o);  // random inputs, no reference
  const Candidate* x = find(r, c);
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->status, Candidate::Status::Rejected) << x->reason;
  EXPECT_NE(x->reason.find("default config"), std::string::npos) << x->reason;
  EXPECT_NE(x->reason.find("beyond |err| <= "), std::string::npos) << "the bound it used: " << x->reason;
  EXPECT_EQ(r.best, s.space.default_config());
}

// The pallas target's harness, end to end in TPU interpret mode: its --serve worker times
// each candidate (samples of device time), writes outputs into the tuner's arena, where a
// wrong one is rejected against the reference, and the best config is cached under the
// device it was timed on. A ragged shape, two candidates besides the default.
class PallasAutotune : public Autotune {};

TEST_F(PallasAutotune, HarnessTimesChecksAndCaches) {
  std::string problem = pallas::environment_problem();
  ASSERT_TRUE(problem.empty()) << problem;
  auto args = add_args(20, 200);
  auto s = driver::specialize(tune_add, frontend::describe_args(tune_add, args), "pallas");
  auto with = [&](int64_t b0, int64_t b1) {
    Config c = s.space.default_config();
    c.set("block_t0", b0);
    c.set("block_t1", b1);
    return s.space.complete(c);
  };
  Config good = with(16, 256), wrong = with(32, 128);
  for (const Config& c : {good, wrong}) ASSERT_NE(c, s.space.default_config()) << c.dump();
  ASSERT_NE(good, wrong);
  forget("autotune_test_add");
  autotune::TuneOptions o = small_options();
  o.args = args;
  o.reference = add_reference;
  o.candidates = {good, wrong};
  o.max_candidates = 3;
  o.run_timeout_s = 60;
  o.inject = "wrong:" + wrong.dump();
  autotune::TuneResult r = autotune::tune(s, o);
  EXPECT_FALSE(r.from_cache);
  for (const Config& c : {s.space.default_config(), good}) {
    const Candidate* x = find(r, c);
    ASSERT_NE(x, nullptr) << c.dump();
    EXPECT_EQ(x->status, Candidate::Status::Ok) << c.dump() << ": " << x->reason;
    EXPECT_GE(x->samples, 3) << c.dump();
    EXPECT_GT(x->median_s, 0) << c.dump();
  }
  const Candidate* x = find(r, wrong);
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->status, Candidate::Status::Rejected) << x->reason;
  EXPECT_NE(x->reason.find("wrong answer"), std::string::npos) << x->reason;
  EXPECT_EQ(r.ok, 2);
  EXPECT_EQ(r.rejected, 1);
  EXPECT_NE(r.best, wrong);
  EXPECT_GT(r.best_s, 0);

  ASSERT_TRUE(fs::exists(r.cache_path));
  EXPECT_NE(read_file(r.cache_path)->find("interpret mode on the CPU"), std::string::npos)
      << "the entry names the device it was timed on";
  autotune::clear_memory_cache();
  autotune::TuneResult again = autotune::tune(s, o);
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.best, r.best);
  // A kernel call in interpret mode takes the cached config and does not tune.
  driver::Choice choice = api::choose_config(s);
  EXPECT_EQ(choice.origin, "cache");
  EXPECT_EQ(choice.config, r.best);
}

// A kernel that runs in microseconds is tuned for seconds, not the effort's minute: the time
// budget scales with the baseline's time (10^4 calls' worth, at least 5 s).
TEST_F(Autotune, TimeBudgetScalesWithWhatTuningCanGain) {
  auto s = specialize(tune_add, add_args(64, 96));
  forget(tune_add.name());
  autotune::TuneOptions o = small_options();
  o.time_budget_s = 0;     // the effort's (quick: 50 s), scaled
  o.max_candidates = 400;  // more than 5 s of compiling
  o.write_cache = true;
  autotune::TuneResult r = autotune::tune(s, o);
  auto log = read_file(r.log_path);
  ASSERT_TRUE(log.has_value()) << r.log_path;
  EXPECT_NE(log->find("time budget of 5 s spent (scaled to the baseline's"), std::string::npos) << *log;
  forget(tune_add.name());
}

// The accuracy check's bound widens with the kernel's longest reduction: another summation
// order of a 4096-wide f32 row sum differs by more than 1e-4 without being wrong.
TEST_F(Autotune, AccuracyToleranceScalesWithTheReduction) {
  static const auto row_sums = deuteron::kernel("autotune_test_row_sums", [](hl::Tensor x) {
    auto out = hl::empty({x.size(0)});
    for (auto tm : hl::tile(x.size(0))) out[tm] = x[{tm, hl::all}].sum(1);
    return out;
  });
  Tensor x = Tensor::rand({8, 4096}, DType::f32, 3);
  auto s = specialize(row_sums, {x});
  EXPECT_EQ(autotune::longest_reduction(s.ir), 4096);
  Tensor baseline = Tensor::empty({8}, DType::f32);
  for (int64_t i = 0; i < 8; ++i) baseline.set(i, i == 3 ? 0.01 : 50.0 - double(i));
  Tolerance tol = autotune::accuracy_tolerance(s.ir, baseline);
  EXPECT_NEAR(tol.atol, 4 * 64 * 0x1p-24 * 50.0, 1e-12);
  EXPECT_EQ(tol.rtol, default_tolerance(DType::f32).rtol);
  // A row sum off by 1e-3 near 0 (cancellation): within the widened bound, not the default one.
  Tensor got = baseline.to(DType::f32);
  got.set(3, baseline.get(3) + 5e-4);
  EXPECT_FALSE(allclose(got, baseline, default_tolerance(DType::f32).rtol, default_tolerance(DType::f32).atol).close);
  EXPECT_TRUE(allclose(got, baseline, tol.rtol, tol.atol).close);
  // Elementwise kernels keep the dtype's tolerance, and integers stay exact.
  auto a = specialize(tune_add, add_args(64, 96));
  EXPECT_EQ(autotune::longest_reduction(a.ir), 1);
  EXPECT_EQ(autotune::accuracy_tolerance(a.ir, baseline).atol, default_tolerance(DType::f32).atol);
  EXPECT_EQ(autotune::accuracy_tolerance(s.ir, Tensor::zeros({8}, DType::i64)).atol, 0.0);
}

TEST_F(Autotune, ConfigsThatDoNotFitArePrunedBeforeCompiling) {
  auto x = Tensor::rand({256, 4096}, DType::f32, 3, -4, 4);
  std::vector<Arg> args = {x};
  auto s = specialize(tune_softmax, args);
  // 256 rows of 4096 floats in one block (4 MiB of input alone) fits no core's fast memory.
  Config big = s.space.default_config();
  big.set("block_t0", 256);
  for (const auto& t : s.space.tunables())
    if (t.kind == config::Tunable::Kind::BlockSize && t.name != "block_t0") big.set(t.name, t.values.back());
  big = s.space.complete(big);
  EXPECT_THROW(driver::lower(s, big), ConfigError);

  autotune::TuneOptions o = small_options();
  o.args = args;
  o.reference = softmax_reference;
  o.candidates = {big};
  o.search = "exhaustive";  // block_t0 varies fastest: the big blocks come early
  o.max_candidates = 3;
  o.write_cache = false;
  int compiles = cpu::compiler_invocations();
  autotune::TuneResult r = autotune::tune(s, o);
  EXPECT_EQ(cpu::compiler_invocations(), compiles) << "the tuning process itself compiles nothing";
  const Candidate* b = find(r, big);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->status, Candidate::Status::Pruned);
  EXPECT_EQ(b->reason, "fast memory over budget");
  EXPECT_GE(r.pruned, 1);
  EXPECT_EQ(r.pruned_reasons["fast memory over budget"], r.pruned);
  EXPECT_EQ(r.tried, 3);  // pruned configs do not count against the budget
  for (const Candidate& c : r.candidates) {
    if (c.status != Candidate::Status::Pruned) continue;
    EXPECT_THROW(driver::lower(s, c.config), ConfigError) << c.config.dump();
    EXPECT_EQ(c.compile_s, 0);
    EXPECT_FALSE(c.compiled);
  }
  expect_correct(tune_softmax, args, r.best, softmax_reference);
}

// The model's ranking: every config of a small space, the ones that do not fit left out and
// counted, fastest predicted first, each prediction the model's own; a target without a model
// says so.
TEST_F(Autotune, ModelRanksEveryValidConfig) {
  std::vector<Arg> args = {Tensor::rand({37, 1000}, DType::f32, 3, -4, 4)};
  auto s = specialize(tune_softmax, args);
  autotune::ModelRanking m = autotune::rank_by_model(s);
  ASSERT_TRUE(m.available) << m.why_not;
  EXPECT_FALSE(m.sampled);
  EXPECT_EQ(m.considered, s.space.size());
  EXPECT_EQ(int64_t(m.configs.size()) + m.pruned, m.considered);
  ASSERT_GE(m.configs.size(), 2u);
  for (size_t i = 0; i < m.configs.size(); ++i) {
    plan::Plan p = driver::lower(s, m.configs[i].config);  // throws if it does not fit
    EXPECT_DOUBLE_EQ(m.configs[i].predicted_s, model::predict(p, *s.backend->model_hardware(p)).seconds);
    if (i > 0) {
      EXPECT_LE(m.configs[i - 1].predicted_s, m.configs[i].predicted_s);
    }
  }
  EXPECT_LT(m.configs.front().predicted_s, m.configs.back().predicted_s) << "the model tells configs apart";
  // A space larger than the limit is sampled.
  autotune::ModelRanking few = autotune::rank_by_model(s, 10);
  EXPECT_TRUE(few.sampled);
  EXPECT_EQ(few.considered, 10);

  auto t = driver::specialize(tune_softmax, frontend::describe_args(tune_softmax, args), "triton");
  autotune::ModelRanking none = autotune::rank_by_model(t);
  EXPECT_FALSE(none.available);
  EXPECT_TRUE(none.configs.empty());
  EXPECT_NE(none.why_not.find("the triton target has no performance model"), std::string::npos) << none.why_not;
}

// --search model end to end: the default and the model's top configs, in the model's order,
// are compiled, checked and timed, and nothing else; the best is one of them, valid and
// correct. The quick effort chooses it on its own.
TEST_F(Autotune, ModelSearchTimesTheDefaultAndTheTopRanked) {
  std::vector<Arg> args = {Tensor::rand({37, 1000}, DType::f32, 4, -4, 4)};
  auto s = specialize(tune_softmax, args);
  forget("autotune_test_softmax");
  autotune::TuneOptions o = model_search_options(args, softmax_reference, 3);
  autotune::TuneResult r = autotune::tune(s, o);
  EXPECT_EQ(r.search, "model");
  EXPECT_NE(r.search_note.find("the model ranked"), std::string::npos) << r.search_note;

  std::vector<Config> want = {s.space.default_config()};
  for (const autotune::RankedConfig& c : autotune::rank_by_model(s).configs)
    if (want.size() < 3 && c.config != want.front()) want.push_back(c.config);
  ASSERT_EQ(r.candidates.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const Candidate& c = r.candidates[i];
    EXPECT_EQ(c.config, want[i]) << i;
    EXPECT_EQ(c.origin, i == 0 ? "default" : "search");
    EXPECT_EQ(c.status, Candidate::Status::Ok) << c.config.dump() << ": " << c.reason;
    EXPECT_GE(c.samples, 1);
    EXPECT_GT(c.finished_s, 0);
  }
  const Candidate* best = find(r, r.best);
  ASSERT_NE(best, nullptr) << "the chosen config was timed";
  EXPECT_EQ(best->status, Candidate::Status::Ok);
  EXPECT_GT(r.best_s, 0);
  EXPECT_NO_THROW(driver::lower(s, r.best));
  expect_correct(tune_softmax, args, r.best, softmax_reference);

  o.search = "auto";
  o.effort = "quick";
  o.max_candidates = 2;
  autotune::TuneResult q = autotune::tune(s, o);
  EXPECT_EQ(q.search, "model");
  EXPECT_EQ(q.candidates.size(), 2u);
}

// --search model on a target without a performance model (triton, under its interpreter):
// the tuner says so and searches as `auto` would; the chosen config was timed. (Label triton:
// it needs the Python environment.)
class TritonModelSearch : public Autotune {};

TEST_F(TritonModelSearch, FallsBackWithoutAModel) {
  testing_support::ScopedEnv device("DEUTERON_TRITON_DEVICE", "interpret");
  auto args = add_args(20, 37);
  auto s = driver::specialize(tune_add, frontend::describe_args(tune_add, args), "triton");
  forget("autotune_test_add");
  autotune::TuneOptions o = small_options();
  o.args = args;
  o.reference = add_reference;
  o.search = "model";
  o.max_candidates = 2;
  o.run_timeout_s = 120;
  o.write_cache = false;
  autotune::TuneResult r = autotune::tune(s, o);
  EXPECT_NE(r.search, "model");
  EXPECT_NE(r.search_note.find("the triton target has no performance model"), std::string::npos) << r.search_note;
  EXPECT_NE(r.search_note.find("--search model falls back to " + r.search + " search"), std::string::npos)
      << r.search_note;
  const Candidate* best = find(r, r.best);
  ASSERT_NE(best, nullptr);
  EXPECT_EQ(best->status, Candidate::Status::Ok) << best->reason;
  EXPECT_GT(best->median_s, 0);
}

// The cache: written, read back (same process, then as a new process would), corrupt
// entries reported once and re-tuned; warm starts for another shape.
TEST_F(Autotune, CacheRoundTripCorruptionAndWarmStart) {
  forget("autotune_test_add");
  auto args = add_args(32, 64);
  auto s = specialize(tune_add, args);
  autotune::TuneOptions o = small_options();
  o.args = args;
  o.reference = add_reference;
  autotune::TuneResult first = autotune::tune(s, o);
  EXPECT_FALSE(first.from_cache);
  ASSERT_TRUE(fs::exists(first.cache_path));
  ASSERT_TRUE(fs::exists(first.log_path));
  {
    std::ifstream log(first.log_path);
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find(first.best.dump()), std::string::npos);
    EXPECT_NE(text.find("default"), std::string::npos);
  }

  // Same process, then a cleared memory (a new process): no tuning, no compiling.
  int compiles = cpu::compiler_invocations();
  for (int round = 0; round < 2; ++round) {
    if (round == 1) autotune::clear_memory_cache();
    autotune::TuneResult again = autotune::tune(s, o);
    EXPECT_TRUE(again.from_cache);
    EXPECT_EQ(again.best, first.best);
    EXPECT_TRUE(again.candidates.empty());
  }
  // Through the driver's hook (installed by linking the tuner).
  autotune::clear_memory_cache();
  driver::Choice choice = api::choose_config(s);
  EXPECT_EQ(choice.origin, "cache");
  EXPECT_FALSE(choice.tuned);
  EXPECT_EQ(choice.config, first.best);
  EXPECT_EQ(cpu::compiler_invocations(), compiles);

  // A truncated entry: reported once, tuned again, rewritten whole. (A process keeps what it
  // read, so start from a clear memory, as a new process would.)
  autotune::clear_memory_cache();
  std::string text = *read_file(first.cache_path);
  for (int round = 0; round < 2; ++round) {
    atomic_write(first.cache_path, text.substr(0, text.size() / 3));
    autotune::TuneOptions no_write = o;
    no_write.write_cache = false;
    testing::internal::CaptureStderr();
    autotune::TuneResult r = autotune::tune(s, no_write);
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_FALSE(r.from_cache);
    if (round == 0) EXPECT_NE(err.find("unusable"), std::string::npos) << err;
    else EXPECT_EQ(err.find("unusable"), std::string::npos) << "reported twice: " << err;
  }
  testing::internal::CaptureStderr();
  autotune::TuneResult retuned = autotune::tune(s, o);
  testing::internal::GetCapturedStderr();
  EXPECT_FALSE(retuned.from_cache);
  std::string problem;
  EXPECT_TRUE(autotune::parse_entry(*read_file(first.cache_path), &problem)) << problem;
  autotune::clear_memory_cache();
  EXPECT_TRUE(autotune::tune(s, o).from_cache);

  // --retune ignores the entry.
  autotune::TuneOptions retune = o;
  retune.read_cache = false;
  retune.write_cache = false;
  EXPECT_FALSE(autotune::tune(s, retune).from_cache);

  // Tuned while other processes kept the machine busy: trusted for an hour, then tuned again.
  for (double age : {10.0, 7200.0}) {
    std::optional<autotune::CacheEntry> e = autotune::parse_entry(*read_file(first.cache_path), &problem);
    ASSERT_TRUE(e) << problem;
    e->info["others_cores"] = 1.5;
    e->info["created_unix"] = double(std::time(nullptr)) - age;
    autotune::write_entry(*e);
    autotune::clear_memory_cache();
    autotune::TuneOptions no_write = o;
    no_write.write_cache = false;
    testing::internal::CaptureStderr();
    autotune::TuneResult r = autotune::tune(s, no_write);
    testing::internal::GetCapturedStderr();
    EXPECT_EQ(r.from_cache, age < 3600) << "entry " << age << " s old";
  }

  // Another shape starts from this shape's best config.
  auto args2 = add_args(48, 64);
  auto s2 = specialize(tune_add, args2);
  autotune::TuneOptions w = o;
  w.args = args2;
  w.warm_start = true;
  w.max_candidates = 2;
  autotune::TuneResult warm = autotune::tune(s2, w);
  Config seeded = autotune::fit_into(s2.space, retuned.best);
  const Candidate* x = find(warm, seeded);
  ASSERT_NE(x, nullptr) << "warm start " << seeded.dump() << " not evaluated";
  if (seeded != s2.space.default_config()) {
    EXPECT_EQ(x->origin, "warm start");
  }
}

// A new process looks the tuned kernel up through the driver: neither tunes nor compiles.
// The child is this test program, run with a filter and an environment variable.
TEST_F(Autotune, NewProcessUsesTheCacheWithoutTuningOrCompiling) {
  if (std::getenv("DEUTERON_AUTOTUNE_TEST_CHILD")) GTEST_SKIP() << "parent only";
  forget("autotune_test_add");
  auto args = add_args(40, 72);
  auto s = specialize(tune_add, args);
  autotune::TuneOptions o = small_options();
  o.args = args;
  o.reference = add_reference;
  autotune::TuneResult r = autotune::tune(s, o);
  ASSERT_FALSE(r.from_cache);
  // The best config's shared object exists (a worker compiled it); so does every other one.
  driver::executable(s, r.best);

  std::vector<std::string> argv = {"/proc/self/exe", "--gtest_filter=AutotuneChild.*"};
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) envs.push_back(*e);
  envs.push_back("DEUTERON_AUTOTUNE_TEST_CHILD=" + r.best.dump());
  std::vector<char*> cenv;
  for (auto& e : envs) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargv.data(), cenv.data()), 0);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's checks failed (its output is above)";
}

// tune --by-model: a model-chosen entry, under its own key, serves kernel calls (origin
// "model") until a measured tune of the same specialisation replaces it.
TEST_F(Autotune, AModelChosenEntryServesUntilAMeasuredTuneReplacesIt) {
  forget("autotune_test_add");
  auto args = add_args(33, 130);
  auto s = specialize(tune_add, args);
  autotune::CacheEntry m = autotune::tune_by_model(s, 30);
  EXPECT_EQ(m.info.value("origin", ""), "model");
  EXPECT_GT(m.time_s, 0);
  EXPECT_TRUE(fs::exists(m.key.path()));
  ASSERT_TRUE(autotune::model_entry(s));
  EXPECT_EQ(autotune::model_entry(s)->config.dump(), m.config.dump());
  // A kernel call takes it, without tuning.
  driver::Choice c = autotune::choose(s, "quick");
  EXPECT_EQ(c.origin, "model");
  EXPECT_FALSE(c.tuned);
  EXPECT_EQ(c.config.dump(), m.config.dump());
  // A measured tune does not return the model's entry as its own: it measures, caches, and
  // removes the model's.
  autotune::TuneOptions o = small_options();
  o.args = args;
  o.reference = add_reference;
  autotune::TuneResult r = autotune::tune(s, o);
  EXPECT_FALSE(r.from_cache);
  EXPECT_TRUE(r.replaced_model);
  EXPECT_FALSE(fs::exists(m.key.path()));
  EXPECT_FALSE(autotune::model_entry(s));
  autotune::clear_memory_cache();
  driver::Choice after = autotune::choose(s, "quick");
  EXPECT_EQ(after.origin, "cache");
  EXPECT_EQ(after.config.dump(), r.best.dump());
}

// A kernel call tunes through the public entry point (no hook to install, no link option),
// within the budget its definition gives (which counts building the runner in a fresh cache:
// ample, and a small shape whose space is searched well within it).
TEST_F(Autotune, KernelCallTunesWithinItsBudget) {
  static const auto k = deuteron::kernel(
      "autotune_test_budget",
      [](hl::Tensor x, hl::Tensor y) {
        auto out = hl::empty_like(x);
        for (auto tile : hl::tile(out.sizes())) out[tile] = x[tile] * 2.0 + y[tile];
        return out;
      },
      {.effort = "quick", .tune_budget_s = 30});
  forget("autotune_test_budget");
  setenv("DEUTERON_AUTOTUNE_PROGRESS", "quiet", 1);
  auto args = add_args(5, 1);
  auto r = api::run(k, args, "cpu");
  unsetenv("DEUTERON_AUTOTUNE_PROGRESS");
  EXPECT_EQ(r.origin, "tuned");
  EXPECT_TRUE(r.tuned);
  auto ref = add_reference(args);
  EXPECT_TRUE(allclose(r.outputs[0], ref[0], 1e-6, 1e-6).close);
  std::string log;
  for (const auto& f : fs::directory_iterator(cache_root() / "autotune" / "autotune_test_budget"))
    if (f.path().extension() == ".log") log = read_file(f.path()).value_or("");
  EXPECT_NE(log.find("effort    quick (budget 30 s,"), std::string::npos) << log;
}

TEST(AutotuneChild, LooksUpWithoutTuningOrCompiling) {
  const char* want = std::getenv("DEUTERON_AUTOTUNE_TEST_CHILD");
  if (!want) GTEST_SKIP() << "run by NewProcessUsesTheCacheWithoutTuningOrCompiling";
  auto args = add_args(40, 72);
  auto r = api::run(tune_add, args, "cpu");
  EXPECT_EQ(r.origin, "cache");
  EXPECT_FALSE(r.tuned);
  EXPECT_EQ(r.config.dump(), want);
  EXPECT_FALSE(r.compiled);
  EXPECT_EQ(cpu::compiler_invocations(), 0);
  auto ref = add_reference(args);
  EXPECT_TRUE(allclose(r.outputs[0], ref[0], 1e-4, 1e-5).close);
}

}  // namespace
}  // namespace deuteron
