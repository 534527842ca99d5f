// The catalogue against its references at random legal configs and random ragged shapes (every
// size from 1 up to the kernel's small shape, rarely a multiple of a block): a small seeded
// sample here, a larger one with DEUTERON_FUZZ_CASES=300 (and DEUTERON_FUZZ_SEED to vary it).
// Prints the count of cases run, configs that did not fit (the tuner prunes those too) and
// mismatches.
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "catalogue.h"
#include "driver/driver.h"
#include "runtime/env.h"

namespace deuteron {
namespace {

// Sizes from 1 to `limit`, a quarter of them 1 or `limit` itself (the edges of a tile loop).
int64_t random_size(std::mt19937_64& rng, int64_t limit) {
  switch (rng() % 8) {
    case 0: return 1;
    case 1: return limit;
    default: return 1 + int64_t(rng() % uint64_t(limit));
  }
}

TEST(Fuzz, RandomConfigsAtRaggedShapesMatchTheReferences) {
  const int64_t cases = runtime::env_integer("DEUTERON_FUZZ_CASES", 1, 100000).value_or(24);
  const uint64_t seed = uint64_t(runtime::env_integer("DEUTERON_FUZZ_SEED", 0, INT64_MAX).value_or(15));
  const auto& catalogue = examples::catalogue();
  std::mt19937_64 rng(seed);
  int64_t run = 0, unfit = 0, mismatches = 0;
  for (int64_t attempt = 0; run < cases && attempt < 20 * cases; ++attempt) {
    const examples::Entry& e = catalogue[size_t(rng() % catalogue.size())];
    DType dt = e.dtypes[size_t(rng() % e.dtypes.size())];
    std::vector<int64_t> shape;
    for (int64_t d : e.small_shape) shape.push_back(random_size(rng, d));
    std::vector<Arg> args = e.inputs(shape, dt, rng());
    driver::Specialized s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "cpu");
    config::Config cfg = s.space.random(rng);
    try {
      driver::lower(s, cfg);
    } catch (const ConfigError&) {
      ++unfit;
      continue;
    }
    ++run;
    std::string what = fmt::format("{} {} [{}] {}", e.name, dtype_name(dt), fmt::join(shape, ", "), cfg.dump());
    api::RunResult r = api::run(*e.kernel, args, "cpu", cfg);
    std::vector<Tensor> want = e.reference(args);
    bool ok = r.outputs.size() == want.size();
    for (size_t i = 0; ok && i < want.size(); ++i) {
      Tolerance tol = examples::tolerance_for(e, want[i].dtype());
      CloseResult c = allclose(r.outputs[i], want[i], tol.rtol, tol.atol);
      ok = c.close;
      EXPECT_TRUE(c.close) << what << ": output " << i << " max abs error " << c.max_abs_err << " at flat index "
                           << c.worst_index;
    }
    mismatches += !ok;
  }
  std::string summary =
      fmt::format("fuzz (seed {}): {} cases run, {} mismatches, {} configs did not fit", seed, run, mismatches, unfit);
  std::cout << summary << "\n";
  RecordProperty("fuzz", summary);
  EXPECT_EQ(run, cases) << summary;
  EXPECT_EQ(mismatches, 0) << summary;
}

}  // namespace
}  // namespace deuteron
