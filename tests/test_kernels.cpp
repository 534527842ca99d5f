// Every catalogue kernel against its independent reference: each dtype, ragged and aligned
// shapes, size one, and a few configs besides the default.
#include <random>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "backends/cpu/hardware.h"
#include "backends/cpu/refine.h"
#include "catalogue.h"
#include "catalogue_case.h"
#include "driver/driver.h"

namespace deuteron {
namespace {

using testing_support::Case;
using testing_support::case_name;

// Shapes: the small ragged one, an aligned one, and one with size-one dims.
std::vector<std::vector<int64_t>> shapes_for(const examples::Entry& e) {
  std::vector<std::vector<int64_t>> shapes = {e.small_shape};
  std::vector<int64_t> aligned, ones;
  for (int64_t d : e.small_shape) {
    aligned.push_back(d >= 64 ? 64 : 16);
    ones.push_back(1);
  }
  shapes.push_back(aligned);
  shapes.push_back(ones);
  return shapes;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& e : examples::catalogue())
    for (DType dt : e.dtypes)
      for (const auto& s : shapes_for(e)) cases.push_back({e.name, dt, s});
  return cases;
}

void expect_matches(const examples::Entry& e, const std::vector<Arg>& args, const Outputs& got,
                    const std::string& what) {
  std::vector<Tensor> want = e.reference(args);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << what;
    Tolerance tol = examples::tolerance_for(e, got[i].dtype());
    CloseResult r = allclose(got[i], want[i], tol.rtol, tol.atol);
    EXPECT_TRUE(r.close) << what << ": output " << i << " max abs error " << r.max_abs_err
                         << " at flat index " << r.worst_index;
  }
}

class KernelTest : public testing::TestWithParam<Case> {};

TEST_P(KernelTest, DefaultConfigMatchesReference) {
  const Case& c = GetParam();
  const auto& e = examples::find(c.kernel);
  auto args = e.inputs(c.shape, c.dtype, 7);
  auto r = api::run(
      *e.kernel, args, "cpu",
      e.kernel->options().config.empty() ? std::optional<config::Config>(config::Config()) : std::nullopt);
  expect_matches(e, args, r.outputs, "default config " + r.config.dump());
}

TEST_P(KernelTest, RandomConfigsMatchReference) {
  const Case& c = GetParam();
  const auto& e = examples::find(c.kernel);
  auto args = e.inputs(c.shape, c.dtype, 11);
  auto s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "cpu");
  std::mt19937_64 rng(std::hash<std::string>{}(c.kernel));
  int tried = 0;
  for (int attempt = 0; attempt < 20 && tried < 2; ++attempt) {
    config::Config cfg = s.space.random(rng);
    try {
      driver::lower(s, cfg);
    } catch (const ConfigError&) {
      continue;  // does not fit: the tuner would prune it too
    }
    ++tried;
    auto r = api::run(*e.kernel, args, "cpu", cfg);
    expect_matches(e, args, r.outputs, "config " + cfg.dump());
  }
  EXPECT_GT(tried, 0) << "no random config fitted";
}

INSTANTIATE_TEST_SUITE_P(Catalogue, KernelTest, testing::ValuesIn(all_cases()), case_name);

// The configs the target suggests (Goto's order for products) match the references: every
// catalogue case that gets one, and the epilogue kernels at an N whose tile of 128 whole rows is
// past half this machine's L2, where the epilogue writes over the accumulator in the output's
// tile (Gemm::out_epilogue). M 130: two blocks, the second of 2 rows.
TEST(KernelTargetSuggestions, MatchReference) {
  const int64_t wide = cpu::cpu_info().l2_bytes / 2 / (128 * 4) + 37;
  std::vector<Case> cases = all_cases();
  for (const char* name : {"epilogue_subtiling", "matmul_layernorm"})
    cases.push_back({name, DType::f32, {130, 17, wide}});
  std::set<std::string> suggested;
  for (const Case& c : cases) {
    const auto& e = examples::find(c.kernel);
    auto args = e.inputs(c.shape, c.dtype, 17);
    auto s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "cpu");
    for (const config::Config& cfg : s.space.suggestions()) {
      suggested.insert(c.kernel);
      const std::string what = fmt::format("{} {} [{}], suggested {}", c.kernel, dtype_name(c.dtype),
                                           fmt::join(c.shape, ", "), cfg.dump());
      if (c.shape.back() == wide) {
        EXPECT_TRUE(cpu::refine(driver::lower(s, cfg)).gemms.at(0).out_epilogue) << what;
      }
      expect_matches(e, args, api::run(*e.kernel, args, "cpu", cfg).outputs, what);
    }
  }
  EXPECT_EQ(suggested,
            (std::set<std::string>{"broadcast_matmul", "epilogue_subtiling", "matmul", "matmul_layernorm"}));
}

// Outputs written with streaming stores (`stores: stream`, which the tuner may choose) match too: rows that start and end inside a cache line, short
// rows, size one. Every kernel whose outputs may stream (all but the atomic-add ones).
TEST(KernelStreamingStores, MatchReference) {
  std::set<std::string> streamed;
  for (const Case& c : all_cases()) {
    const auto& e = examples::find(c.kernel);
    auto args = e.inputs(c.shape, c.dtype, 13);
    auto s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "cpu");
    if (!s.space.find("stores")) continue;
    config::Config cfg = s.space.default_config();
    cfg.set("stores", "stream");
    auto r = api::run(*e.kernel, args, "cpu", cfg);
    expect_matches(e, args, r.outputs, case_name({c, 0}) + " config " + cfg.dump());
    streamed.insert(c.kernel);
  }
  for (const char* k : {"add", "softmax", "softmax_two_pass", "batch_softmax", "layer_norm", "welford", "matmul", "attention"})
    EXPECT_TRUE(streamed.count(k)) << k << " has no streamable output";
}

// Row kernels whose passes prefetch (the next block's rows, the stored rows for writing) match
// too: a last block of fewer rows than the others, one row, rows that start inside a cache line
// (1000 floats), streamed rows in a ragged last piece (300); with plain and with streaming stores.
TEST(KernelRowPrefetch, MatchReference) {
  struct Shape {
    std::string kernel;
    std::vector<int64_t> shape;
  };
  for (const Shape& c : std::vector<Shape>{{"softmax", {130, 1000}}, {"softmax", {1, 1000}}, {"softmax_decomposed", {131, 1000}},
                                           {"batch_softmax", {3, 130, 1000}}, {"layer_norm", {130, 1000}},
                                           {"layer_norm", {1, 1000}}, {"rms_norm", {130, 1000}}, {"rms_norm", {7, 300}}}) {
    const auto& e = examples::find(c.kernel);
    auto args = e.inputs(c.shape, DType::f32, 17);
    auto s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "cpu");
    for (int64_t rows : {1, 4})
      for (const char* stores : {"cached", "stream"}) {
        if (rows > c.shape[c.shape.size() - 2]) continue;  // a block of at most the rows there are
        config::Config cfg = s.space.default_config();
        cfg.set("block_rows", rows);
        if (s.space.find("block_batch")) cfg.set("block_batch", 1);
        if (s.space.find("stores")) cfg.set("stores", stores);
        std::string src = s.backend->emit(driver::lower(s, cfg));
        EXPECT_NE(src.find("__builtin_prefetch"), std::string::npos) << c.kernel << " " << cfg.dump() << " prefetches nothing";
        auto r = api::run(*e.kernel, args, "cpu", cfg);
        expect_matches(e, args, r.outputs, fmt::format("{} {} config {}", c.kernel, c.shape, cfg.dump()));
      }
  }
}

}  // namespace
}  // namespace deuteron
