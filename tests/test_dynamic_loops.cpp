// Tile loops whose bounds are computed on the device: read from a tensor (jagged rows over CSR
// offsets, a per-row valid length) or arithmetic on a tile's bounds (hl::minimum(t.end(), limit),
// t.begin() * 2). Each kernel is checked against plain loops in double precision at ragged shapes
// (empty segments, a segment of one row, ranges that end before they begin, bounds past the
// dim), with small and large blocks, on the cpu target; the pallas and triton targets run the
// same kernels and cases (DynamicLoopsPallas, DynamicLoopsTriton, in their own labels).
#include "dynamic_loops.h"

#include <gtest/gtest.h>

#include "backends/pallas/backend.h"
#include "backends/python/runner.h"
#include "backends/triton/backend.h"
#include "test_support.h"

namespace deuteron {
namespace {

using dynamic_loops::Case;
using testing_support::ScopedEnv;

std::string trace_error(const KernelBase& k, const std::vector<Arg>& args) {
  try {
    api::run(k, args, "cpu", config::Config());
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

class DynamicLoops : public testing::TestWithParam<Case> {};

TEST_P(DynamicLoops, MatchesReference) { dynamic_loops::check(GetParam(), "cpu"); }

INSTANTIATE_TEST_SUITE_P(Cpu, DynamicLoops, testing::ValuesIn(dynamic_loops::cases(false)),
                         [](const auto& info) { return info.param.name; });

// The pallas target under TPU interpret mode, the triton target under Triton's interpreter, at
// the small shapes.
class PallasDynamicLoops : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string problem = pallas::environment_problem();
    ASSERT_TRUE(problem.empty()) << problem;
  }
};
TEST_P(PallasDynamicLoops, MatchesReference) { dynamic_loops::check(GetParam(), "pallas"); }
INSTANTIATE_TEST_SUITE_P(Interpreted, PallasDynamicLoops, testing::ValuesIn(dynamic_loops::cases(true, true)),
                         [](const auto& info) { return info.param.name; });

class TritonDynamicLoops : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string problem = python::environment_problem(triton::runner_spec("interpret"));
    ASSERT_TRUE(problem.empty()) << problem;
  }
  ScopedEnv device_{"DEUTERON_TRITON_DEVICE", "interpret"};
};
TEST_P(TritonDynamicLoops, MatchesReference) { dynamic_loops::check(GetParam(), "triton"); }
INSTANTIATE_TEST_SUITE_P(Interpreted, TritonDynamicLoops, testing::ValuesIn(dynamic_loops::cases(true)),
                         [](const auto& info) { return info.param.name; });

// A loop starting at a device value runs on pallas as a fori_loop copying each block from HBM at
// its element offset (the default); as an emit_pipeline or an unrolled loop it is a config error
// naming the loop's line and the setting that works.
TEST(PallasDynamicLoopErrors, DeviceBeginNeedsTheForiLoop) {
  const auto& k = dynamic_loops::segment_sum();
  Tensor off = dynamic_loops::offsets_for(5);
  std::vector<Arg> args = {Tensor::rand({5, 1, 128}, DType::f32, 1), off, off.numel() - 1};
  driver::Specialized s = driver::specialize(k, frontend::describe_args(k, args), "pallas");
  EXPECT_EQ(s.space.default_config().text("inner_rows"), "in_place");
  std::string code = s.backend->emit(driver::lower(s, s.space.default_config()));
  EXPECT_NE(code.find("PrefetchScalarGridSpec("), std::string::npos) << code;
  EXPECT_NE(code.find("v4 = arg1_smem[b_g0 + 1]  # load arg1 from SMEM"), std::string::npos) << code;
  EXPECT_NE(code.find("arg0_hbm.at[pl.ds(v10 + i * BLOCK_ROWS, BLOCK_ROWS)"), std::string::npos) << code;
  for (const char* strategy : {"stream", "resident"}) {
    config::Config c = s.space.default_config();
    c.set("inner_rows", strategy);
    try {
      s.backend->emit(driver::lower(s, c));
      ADD_FAILURE() << strategy << ": no error";
    } catch (const ConfigError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("starts at a bound computed on the device"), std::string::npos) << m;
      EXPECT_NE(m.find("dynamic_loops.h"), std::string::npos) << m;
      EXPECT_NE(m.find("inner_rows to in_place"), std::string::npos) << m;
    }
  }
}

// The segment count, a scalar argument, sizes the output: each count specialises the kernel
// (its own trace and code), and a repeated count reuses its code.
TEST(DynamicLoopSizes, ScalarArgumentSizesTheOutput) {
  const auto& k = dynamic_loops::segment_sum();
  Tensor x = Tensor::rand({11, 3}, DType::f32, 5), off = dynamic_loops::offsets_for(11);
  for (int64_t count : {int64_t(off.numel() - 1), int64_t(2), int64_t(0), int64_t(2)}) {
    Tensor out = k(x, off, count);
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{count, 3}));
    for (int64_t s = 0; s < count; ++s)
      for (int64_t j = 0; j < 3; ++j) {
        double want = 0;
        for (int64_t i = int64_t(off.get(s)); i < std::min<int64_t>(int64_t(off.get(s + 1)), 11); ++i) want += x.get(i * 3 + j);
        EXPECT_NEAR(out.get(s * 3 + j), want, 1e-5) << count << " " << s << " " << j;
      }
  }
  std::string e = trace_error(k, {x, off, off.numel()});
  EXPECT_NE(e.find("needs 0 <= count < offsets.size(0)"), std::string::npos) << e;
}

TEST(DynamicLoopSizes, ItemNeedsAnIntegerScalar) {
  static const auto k = deuteron::kernel("float_item", [](hl::Tensor x, hl::Scalar n) {
    auto out = hl::empty({n.item()});
    for (auto t : hl::tile(out.size(0))) out[t] = x[t];
    return out;
  });
  std::string e = trace_error(k, {Tensor::rand({4}, DType::f32, 1), 2.0});
  EXPECT_NE(e.find("item() needs an integer scalar argument"), std::string::npos) << e;
}

// KernelOptions::target: a user's own kernel reaches the other targets from C++.
const KernelBase& scaled_window(const std::string& target) {
  static const auto triton = deuteron::kernel("scaled_window", [](hl::Tensor x, hl::Scalar limit) {
    auto out = hl::empty({x.size(0)});
    for (auto r : hl::grid(x.size(0))) {
      auto acc = hl::zeros({1});
      for (auto tc : hl::tile(0, hl::minimum(r.end() * 3, limit))) acc = acc + x[{r, tc}].sum(0) * 2.0f;
      out[{r}] = acc.sum(0);
    }
    return out;
  }, {.effort = "none", .target = "triton"});
  static const auto unknown = deuteron::kernel("unknown_target", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto t : hl::tile(x.size(0))) out[t] = x[t];
    return out;
  }, {.target = "tpu"});
  if (target == "triton") return triton;
  return unknown;
}

TEST(TritonKernelOptions, TargetRunsAUserKernelThere) {
  ASSERT_TRUE(python::environment_problem(triton::runner_spec("interpret")).empty());
  ScopedEnv device("DEUTERON_TRITON_DEVICE", "interpret");
  Tensor x = Tensor::rand({6, 20}, DType::f32, 9);
  Outputs out = scaled_window("triton").run({x, int64_t(13)});
  for (int64_t r = 0; r < 6; ++r) {
    double want = 0;
    for (int64_t j = 0; j < std::min<int64_t>(3 * r + 3, 13); ++j) want += 2.0 * x.get(r * 20 + j);
    EXPECT_NEAR(out[0].get(r), want, 1e-4) << r;
  }
}

TEST(DynamicLoopSizes, UnknownTargetIsAnError) {
  try {
    scaled_window("unknown").run({Tensor::rand({3}, DType::f32, 1)});
    ADD_FAILURE() << "no error";
  } catch (const ArgumentError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("unknown target 'tpu'"), std::string::npos) << m;
    EXPECT_NE(m.find("this build has: cpu"), std::string::npos) << m;
  }
}

// ---- errors -----------------------------------------------------------------------------------


TEST(DynamicLoopErrors, FloatBoundIsAnError) {
  static const auto k = deuteron::kernel("float_bound", [](hl::Tensor x, hl::Tensor ends) {
    auto out = hl::zeros({x.size(0)});
    for (auto b : hl::grid(x.size(0)))
      for (auto t : hl::tile(0, ends[{b}])) out[{b}] = x[{b, t}].sum(0);
    return out;
  });
  std::string e = trace_error(k, {Tensor::rand({3, 4}, DType::f32, 1), Tensor::rand({3}, DType::f32, 2)});
  EXPECT_NE(e.find("a loop bound must be an integer scalar, not a float32 value of shape []"), std::string::npos) << e;
  EXPECT_NE(e.find("test_dynamic_loops.cpp"), std::string::npos) << e;
}

TEST(DynamicLoopErrors, BlockBoundIsAnError) {
  static const auto k = deuteron::kernel("block_bound", [](hl::Tensor x, hl::Tensor ends) {
    auto out = hl::zeros({x.size(0)});
    for (auto b : hl::grid(x.size(0)))
      for (auto t : hl::tile(0, ends[{hl::all}])) out[{b}] = x[{b, t}].sum(0);
    return out;
  });
  std::string e = trace_error(k, {Tensor::rand({3, 4}, DType::f32, 1), Tensor::rand({3}, DType::i64, 2, 0, 4)});
  EXPECT_NE(e.find("a loop bound must be an integer scalar, not a int64 value of shape [3]"), std::string::npos) << e;
}

TEST(DynamicLoopErrors, UnboundedTileIsAnError) {
  static const auto k = deuteron::kernel("unbounded_tile", [](hl::Tensor x, hl::Tensor ends) {
    auto out = hl::empty({x.size(0)});
    for (auto b : hl::grid(x.size(0))) {
      auto acc = hl::zeros({1}, DType::i64);
      for (auto t : hl::tile(0, ends[{b}])) acc = acc + t.index().sum(0);
      out[{b}] = acc.to(DType::f32).sum(0);
    }
    return out;
  });
  std::string e = trace_error(k, {Tensor::rand({3, 4}, DType::f32, 1), Tensor::rand({3}, DType::i64, 2, 0, 4)});
  EXPECT_NE(e.find("has bounds computed on the device but never indexes a tensor"), std::string::npos) << e;
}

// Two grid loops in sequence (a reduction pass, then a pass using its result) are refused,
// naming the second loop's line, the first one's, and why.
TEST(DynamicLoopErrors, SecondGridLoopSaysWhy) {
  static const auto k = deuteron::kernel("two_passes", [](hl::Tensor x) {
    auto total = hl::zeros({1});
    auto out = hl::empty_like(x);
    for (auto t : hl::tile(x.size(0))) hl::atomic_add(total, {0}, x[t].sum(0));
    for (auto t : hl::tile(x.size(0))) out[t] = x[t] / total[{0}];  // the second loop
    return std::make_tuple(total, out);
  });
  std::string e = trace_error(k, {Tensor::rand({5}, DType::f32, 1)});
  EXPECT_NE(e.find("this is a second one"), std::string::npos) << e;
  EXPECT_NE(e.find("test_dynamic_loops.cpp:" + std::to_string(__LINE__ - 5)), std::string::npos) << e;  // second
  EXPECT_NE(e.find("test_dynamic_loops.cpp:" + std::to_string(__LINE__ - 7)), std::string::npos) << e;  // first
  EXPECT_NE(e.find("split the passes into two kernels"), std::string::npos) << e;
}

}  // namespace
}  // namespace deuteron
