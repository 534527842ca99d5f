// The pallas target: add and softmax generated from the same lowered plan as the cpu target,
// run by src/backends/pallas/runtime/deuteron_pallas_runner.py under JAX's TPU interpret mode, against the
// catalogue's references at ragged shapes; and the target's checks and errors.
//
// The runs need the project's Python environment (scripts/setup_python.sh). Without it they
// FAIL, never skip: CI installs it.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "backends/pallas/backend.h"
#include "backends/pallas/codegen.h"
#include "backends/registry.h"
#include "catalogue.h"
#include "catalogue_case.h"
#include "config_fit.h"
#include "driver/driver.h"
#include "runtime/disk_cache.h"
#include "test_support.h"

namespace hl = deuteron::hl;

namespace deuteron {
namespace {

namespace fs = std::filesystem;

using testing_support::ScopedEnv;

using testing_support::fit;

driver::Specialized specialize(const KernelBase& k, const std::vector<Arg>& args) {
  return driver::specialize(k, frontend::describe_args(k, args), "pallas");
}

void expect_matches(const std::vector<Tensor>& want, const Outputs& got, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << what;
    ASSERT_EQ(got[i].dtype(), want[i].dtype()) << what;
    Tolerance tol = default_tolerance(got[i].dtype());
    CloseResult r = allclose(got[i], want[i], tol.rtol, tol.atol);
    EXPECT_TRUE(r.close) << what << ": output " << i << " max abs error " << r.max_abs_err
                         << " at flat index " << r.worst_index << ", " << r.num_bad << " elements off";
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- runs against the references ------------------------------------------------------------

using testing_support::Case;
using testing_support::case_name;

std::vector<Case> cases() {
  std::vector<Case> out;
  for (std::string k : {"add", "softmax"})
    for (DType dt : {DType::f32, DType::bf16})
      for (std::vector<int64_t> shape : {std::vector<int64_t>{130, 300}, {17, 1000}, {1, 1}})
        out.push_back({k, dt, shape});
  return out;
}

// Legal TPU blocks (multiples of 8 x 128, or the whole dim), grids of at most 27 steps: the
// interpreter costs about 20 ms a step.
const std::map<std::string, std::map<std::string, int64_t>> kBlocks = {
    {"add", {{"block_t0", 16}, {"block_t1", 128}}},
    {"softmax", {{"block_rows", 8}}},  // the whole row in one block (reduce_r0 persistent by default)
};

class PallasRun : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string problem = pallas::environment_problem();
    ASSERT_TRUE(problem.empty()) << problem;
  }
};

TEST_P(PallasRun, MatchesReference) {
  const Case& c = GetParam();
  const examples::Entry& e = examples::find(c.kernel);
  std::vector<Arg> args = e.inputs(c.shape, c.dtype, 5);
  driver::Specialized s = specialize(*e.kernel, args);
  config::Config cfg = fit(s, kBlocks.at(c.kernel));
  api::RunResult r = api::run(*e.kernel, args, "pallas", cfg);
  EXPECT_EQ(r.origin, "given");
  expect_matches(e.reference(args), r.outputs, "config " + r.config.dump());
  ASSERT_TRUE(r.exe);
  auto module = read_file(r.exe->source_path);
  ASSERT_TRUE(module.has_value()) << r.exe->source_path;
  EXPECT_TRUE(contains(*module, "pl.pallas_call(")) << *module;
}

INSTANTIATE_TEST_SUITE_P(Catalogue, PallasRun, testing::ValuesIn(cases()), case_name);

class PallasTarget : public testing::Test {
 protected:
  static void require_python() {
    std::string problem = pallas::environment_problem();
    ASSERT_TRUE(problem.empty()) << problem;
  }
};

// The grid order is a config choice: the index maps follow it.
TEST_F(PallasTarget, AddWithSwappedGridOrder) {
  require_python();
  if (HasFatalFailure()) return;
  const examples::Entry& e = examples::find("add");
  std::vector<Arg> args = e.inputs({130, 300}, DType::f32, 9);
  driver::Specialized s = specialize(*e.kernel, args);
  config::Config cfg = fit(s, kBlocks.at("add"));
  cfg.set("grid_order", config::Json::array({1, 0}));
  std::string module = s.backend->emit(driver::lower(s, cfg));
  EXPECT_TRUE(contains(module, "grid=(3, 9),")) << module;
  EXPECT_TRUE(contains(module, "lambda t1, t0: (t0, t1)")) << module;
  api::RunResult r = api::run(*e.kernel, args, "pallas", cfg);
  expect_matches(e.reference(args), r.outputs, "config " + r.config.dump());
}

// A reduction over a tiled axis whose last block is partial must mask the out-of-range
// elements (NaN in interpret mode): each element minus the max of its row within its block.
const auto block_max = deuteron::kernel("block_max", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  for (auto t : hl::tile(out.sizes())) {
    auto v = x[t];
    out[t] = v - v.amax(1, true);
  }
  return out;
});

TEST_F(PallasTarget, MasksReductionsOverPartialBlocks) {
  require_python();
  if (HasFatalFailure()) return;
  const int64_t m = 20, n = 300, bn = 128;
  Tensor x = Tensor::rand({m, n}, DType::f32, 3, -4.0, 4.0);
  std::vector<Arg> args = {x};
  driver::Specialized s = specialize(block_max, args);
  config::Config cfg = fit(s, {{"block_t0", 8}, {"block_t1", bn}});
  std::string module = s.backend->emit(driver::lower(s, cfg));
  EXPECT_TRUE(contains(module, "valid_t1 = ")) << module;
  api::RunResult r = api::run(block_max, args, "pallas", cfg);
  std::vector<double> want(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j0 = 0; j0 < n; j0 += bn) {
      double mx = -INFINITY;
      for (int64_t j = j0; j < std::min(n, j0 + bn); ++j) mx = std::max(mx, x.get(i * n + j));
      for (int64_t j = j0; j < std::min(n, j0 + bn); ++j) want[size_t(i * n + j)] = x.get(i * n + j) - mx;
    }
  Tensor expected = Tensor::empty({m, n}, DType::f32);
  for (int64_t i = 0; i < m * n; ++i) expected.set(i, want[size_t(i)]);
  expect_matches({expected}, r.outputs, "config " + r.config.dump());
}

// hl::atomic_add on a TPU: the grid steps adding into one block run in order ("arbitrary")
// and keep the block in VMEM, set on its first visit. rms_norm_bwd adds every row block's
// share of grad_w; the row blocks are ragged (130 rows in blocks of 128).
TEST_F(PallasTarget, AtomicAddAccumulatesInARevisitedBlock) {
  require_python();
  if (HasFatalFailure()) return;
  const examples::Entry& e = examples::find("rms_norm_bwd");
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<Arg> args = e.inputs({130, 300}, dt, 4);
    driver::Specialized s = specialize(*e.kernel, args);
    config::Config cfg = fit(s, {{"block_rows", 128}});
    std::string module = s.backend->emit(driver::lower(s, cfg));
    EXPECT_TRUE(contains(module, "out1_ref[...] += ")) << module;
    EXPECT_TRUE(contains(module, "@pl.when(pl.program_id(0) == 0)")) << module;
    EXPECT_TRUE(contains(module, "dimension_semantics=(\"arbitrary\",)")) << module;
    api::RunResult r = api::run(*e.kernel, args, "pallas", cfg);
    expect_matches(e.reference(args), r.outputs, "config " + r.config.dump());
  }
}

// Column sums over a 2-D grid: the output block moves along t1 and is revisited along t0, which
// must then run innermost (a TPU writes a block back when the grid moves on).
const auto column_sums = deuteron::kernel("column_sums", [](hl::Tensor x) {
  auto sums = hl::zeros({x.size(1)});
  for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) hl::atomic_add(sums, {tn}, x[{tm, tn}].sum(0));
  return sums;
});

TEST_F(PallasTarget, RevisitedBlocksNeedTheirAxisInnermost) {
  require_python();
  if (HasFatalFailure()) return;
  Tensor x = Tensor::rand({20, 300}, DType::f32, 6);
  std::vector<Arg> args = {x};
  driver::Specialized s = specialize(column_sums, args);
  config::Config cfg = fit(s, {{"block_t0", 8}, {"block_t1", 128}});
  cfg.set("grid_order", config::Json::array({0, 1}));  // t0 outside: refused
  try {
    s.backend->emit(driver::lower(s, cfg));
    FAIL() << "a revisit across other blocks was accepted";
  } catch (const ConfigError& err) {
    EXPECT_TRUE(contains(err.message(), "revisited along grid axis t0")) << err.what();
    EXPECT_TRUE(contains(err.hint(), "grid_order with t0 last")) << err.what();
  }
  // The target's default puts t0 last by itself.
  EXPECT_EQ(s.backend->adjust_default(s.space, s.space.default_config(), s.ir).values().at("grid_order"),
            config::Json::array({1, 0}));
  cfg.set("grid_order", config::Json::array({1, 0}));
  api::RunResult r = api::run(column_sums, args, "pallas", cfg);
  Tensor want = Tensor::empty({300}, DType::f32);
  for (int64_t j = 0; j < 300; ++j) {
    double sum = 0;
    for (int64_t i = 0; i < 20; ++i) sum += x.get(i * 300 + j);
    want.set(j, sum);
  }
  expect_matches({want}, r.outputs, "config " + r.config.dump());
}

// ---- the generated module --------------------------------------------------------------------

TEST_F(PallasTarget, EmitsOneBlockSpecPerOperandFromThePlan) {
  const examples::Entry& e = examples::find("add");
  std::vector<Arg> args = e.inputs({130, 300}, DType::f32, 1);
  driver::Specialized s = specialize(*e.kernel, args);
  config::Config cfg = fit(s, kBlocks.at("add"));
  plan::Plan p = driver::lower(s, cfg);
  std::string module = s.backend->emit(p);
  EXPECT_TRUE(contains(module, "# Kernel 'add', generated by Deuteron for the pallas target.")) << module;
  EXPECT_TRUE(contains(module, "# config: " + p.config.dump())) << module;
  EXPECT_TRUE(contains(module, "BLOCK_T0 = 16")) << module;
  EXPECT_TRUE(contains(module, "BLOCK_T1 = 128")) << module;
  EXPECT_TRUE(contains(module, "def add_kernel(x_ref, y_ref, out0_ref):")) << module;
  EXPECT_TRUE(contains(module, "grid=(9, 3),")) << module;
  EXPECT_TRUE(contains(module, "pl.BlockSpec((BLOCK_T0, BLOCK_T1), lambda t0, t1: (t0, t1)),  # x"))
      << module;
  EXPECT_TRUE(contains(module, "pl.BlockSpec((BLOCK_T0, BLOCK_T1), lambda t0, t1: (t0, t1)),  # y"))
      << module;
  EXPECT_TRUE(contains(module, "out_specs=pl.BlockSpec((BLOCK_T0, BLOCK_T1), lambda t0, t1: (t0, t1)),"))
      << module;
  EXPECT_TRUE(contains(module, "out0_ref[...] = v2.astype(out0_ref.dtype)")) << module;
  EXPECT_TRUE(contains(module, "name=\"deuteron_add\"")) << module;
  // Stable: a second lowering gives byte-identical text.
  driver::Specialized s2 = specialize(*e.kernel, args);
  EXPECT_EQ(s2.backend->emit(driver::lower(s2, cfg)), module);
}

TEST_F(PallasTarget, SoftmaxReadsWholeRows) {
  const examples::Entry& e = examples::find("softmax");
  std::vector<Arg> args = e.inputs({130, 300}, DType::bf16, 1);
  driver::Specialized s = specialize(*e.kernel, args);
  std::string module = s.backend->emit(driver::lower(s, fit(s, kBlocks.at("softmax"))));
  EXPECT_TRUE(contains(module, "BLOCK_R0 = 300")) << module;
  EXPECT_TRUE(contains(module, "pl.BlockSpec((BLOCK_ROWS, BLOCK_R0), lambda rows: (rows, 0)),  # x")) << module;
  EXPECT_TRUE(contains(module, "x_ref[...].astype(jnp.float32)")) << module;  // bf16 computed in f32
  EXPECT_TRUE(contains(module, "jnp.max(v0, axis=1, keepdims=True)")) << module;
  EXPECT_TRUE(contains(module, "jnp.sum(")) << module;
  EXPECT_FALSE(contains(module, "valid_")) << module;  // the row is whole: nothing to mask
  EXPECT_TRUE(contains(module, "jnp.bfloat16")) << module;
}

// A block that covers a whole dim is legal whatever its size: blocks at least as large as a
// dim become that dim.
TEST_F(PallasTarget, BlocksCoveringADimBecomeTheDim) {
  const examples::Entry& e = examples::find("add");
  std::vector<Arg> args = e.inputs({17, 100}, DType::f32, 1);
  driver::Specialized s = specialize(*e.kernel, args);
  plan::Plan p = driver::lower(s, fit(s, {{"block_t0", 32}, {"block_t1", 128}}));
  std::string module = s.backend->emit(p);
  EXPECT_TRUE(contains(module, "BLOCK_T0 = 17")) << module;
  EXPECT_TRUE(contains(module, "BLOCK_T1 = 100")) << module;
  EXPECT_TRUE(contains(module, "grid=(1, 1),")) << module;
}

// ---- checks and errors -------------------------------------------------------------------------

TEST_F(PallasTarget, RejectsBlocksBreakingTheTpuRule) {
  const examples::Entry& e = examples::find("add");
  std::vector<Arg> args = e.inputs({130, 300}, DType::f32, 1);
  driver::Specialized s = specialize(*e.kernel, args);
  try {
    driver::lower(s, fit(s, {{"block_t0", 4}, {"block_t1", 128}}));
    FAIL() << "block_t0 = 4 was accepted";
  } catch (const ConfigError& err) {
    EXPECT_TRUE(contains(err.message(), "input x")) << err.what();
    EXPECT_TRUE(contains(err.message(), "block_t0 = 4")) << err.what();
    EXPECT_TRUE(contains(err.message(), "multiple of 8")) << err.what();
    EXPECT_TRUE(contains(err.hint(), "\"block_t0\": 8")) << err.what();
  }
  try {
    driver::lower(s, fit(s, {{"block_t0", 8}, {"block_t1", 64}}));
    FAIL() << "block_t1 = 64 was accepted";
  } catch (const ConfigError& err) {
    EXPECT_TRUE(contains(err.message(), "multiple of 128")) << err.what();
    EXPECT_TRUE(contains(err.hint(), "\"block_t1\": 128")) << err.what();
  }
}

TEST_F(PallasTarget, RejectsPlansThatDoNotFitVmem) {
  ScopedEnv chip("DEUTERON_TPU_GENERATION", "v4");  // 16 MiB of VMEM per core
  const examples::Entry& e = examples::find("softmax");
  std::vector<Arg> args = {Tensor::zeros({64, 16384}, DType::f32)};
  driver::Specialized s = specialize(*e.kernel, args);
  try {
    driver::lower(s, fit(s, {{"block_rows", 64}}));
    FAIL() << "a 4 MiB block with its buffers and temporaries was accepted";
  } catch (const FastMemoryError& err) {  // a ConfigError the aot build can tell apart
    EXPECT_TRUE(contains(err.message(), "VMEM")) << err.what();
    EXPECT_TRUE(contains(err.message(), "more than its 16.0 MiB of VMEM per core")) << err.what();
    EXPECT_TRUE(contains(err.hint(), "block_rows")) << err.what();
  }
  // Smaller blocks fit.
  EXPECT_NO_THROW(driver::lower(s, fit(s, {{"block_rows", 8}})));
}

// A loop inside an inner loop is not expressible yet: refused by name, where it is.
const auto nested_loops = deuteron::kernel("nested_loops", [](hl::Tensor x) {
  auto out = hl::empty({x.size(0)}, x.dtype());
  for (auto tm : hl::tile(x.size(0), {.name = "m"})) {
    auto acc = hl::zeros({tm});
    for (auto ta : hl::tile(x.size(1), {.name = "a"}))
      for (auto tb : hl::tile(x.size(2), {.name = "b"})) acc = acc + x[{tm, ta, tb}].sum(2).sum(1);
    out[tm] = acc;
  }
  return out;
});

TEST_F(PallasTarget, RejectsNestedInnerLoopsByName) {
  std::vector<Arg> args = {Tensor::zeros({8, 4, 4}, DType::f32)};
  driver::Specialized s = specialize(nested_loops, args);
  plan::Plan p = driver::lower(s, driver::complete(s, {}));
  try {
    s.backend->emit(p);
    FAIL() << "a loop nested in an inner loop was accepted";
  } catch (const CompileError& err) {
    EXPECT_TRUE(contains(err.message(), "does not support loops nested inside inner loops yet")) << err.what();
    EXPECT_TRUE(contains(err.message(), "nested_loops")) << err.what();
    EXPECT_TRUE(contains(err.where(), "test_pallas.cpp")) << err.what();
  }
  EXPECT_THROW(api::run(nested_loops, args, "pallas"), CompileError);
}

// ---- integers: a TPU computes them in 32 bits ----------------------------------------------

// Emits `k` for the pallas target at `args`; the CompileError, if any.
std::optional<CompileError> pallas_emit_error(const KernelBase& k, const std::vector<Arg>& args) {
  driver::Specialized s = specialize(k, args);
  try {
    s.backend->emit(driver::lower(s, s.space.default_config()));
  } catch (const CompileError& e) {
    return e;
  }
  return std::nullopt;
}

const auto index_times = deuteron::kernel("index_times", [](hl::Tensor x) {
  auto small = hl::empty_like(x), big = hl::empty_like(x);
  for (auto t : hl::tile(x.size(0))) {
    small[t] = (t.index() * 65536 + 7).to(DType::f32) + x[t];        // fits int32 up to 32768 elements
    big[t] = (t.index() * 65536 * 65536 + 7).to(DType::f32) + x[t];  // needs int64 from the second
  }
  return std::make_tuple(small, big);
});
const auto plus_constant = deuteron::kernel("plus_constant", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  for (auto t : hl::tile(x.size(0))) out[t] = (t.index() + 3000000000LL).to(DType::f32) + x[t];
  return out;
});
const auto index_plus = deuteron::kernel("index_plus", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  for (auto t : hl::tile(x.size(0))) out[t] = (t.index() * 65536 + 7).to(DType::f32) + x[t];
  return out;
});

// Int64 values were narrowed to int32 (wrong by 7e10), and a constant beyond int32 failed
// inside JAX. Now an int64 value int32 cannot hold is a CompileError naming it and its line;
// one that provably fits (from the tile extents) runs.
TEST_F(PallasTarget, Int64ValuesThatInt32CannotHoldAreRejected) {
  std::vector<Arg> args = {Tensor::zeros({130}, DType::f32)};
  auto err = pallas_emit_error(index_times, args);
  ASSERT_TRUE(err) << "int64 values beyond int32 were emitted";
  EXPECT_TRUE(contains(err->message(), "int64 value")) << err->what();
  EXPECT_TRUE(contains(err->message(), "mul")) << err->what();
  EXPECT_TRUE(contains(err->message(), "[0, 554050781184]")) << err->what();
  EXPECT_TRUE(contains(err->where(), "test_pallas.cpp")) << err->what();
  err = pallas_emit_error(plus_constant, args);
  ASSERT_TRUE(err) << "an int64 constant beyond int32 was emitted";
  EXPECT_TRUE(contains(err->message(), "the int64 constant 3000000000")) << err->what();
  EXPECT_TRUE(contains(err->where(), "test_pallas.cpp")) << err->what();
  // One row: t.index() is 0, and 0 * 65536 * 65536 fits.
  EXPECT_FALSE(pallas_emit_error(index_times, {Tensor::zeros({1}, DType::f32)}));
}

TEST_F(PallasTarget, Int64ValuesThatFitInt32Run) {
  require_python();
  if (HasFatalFailure()) return;
  Tensor x = Tensor::rand({130}, DType::f32, 3);
  api::RunResult r = api::run(index_plus, {x}, "pallas");
  for (int64_t i = 0; i < 130; ++i) EXPECT_EQ(r.outputs[0].get(i), float(float(i * 65536 + 7) + float(x.get(i)))) << i;
}

// Scatter-add on a TPU: the block of the target holds the whole gathered dim in VMEM across the
// grid ("arbitrary"), and a fori_loop adds one row at a time at its index from SMEM. A
// histogram-style sum into 4 bins (f32 and an int32 count) and an embedding backward (rows of
// grad into the rows of a 5-row table), at ragged row blocks (130 in blocks of 128), one block,
// and one row; indices outside the target add nothing (as a gather reads NaN, never another
// element), against plain double-precision sums.
TEST_F(PallasTarget, ScatterAddAtGatheredIndices) {
  require_python();
  if (HasFatalFailure()) return;
  static const auto bins = deuteron::kernel("bin_sums", [](hl::Tensor x, hl::Tensor idx) {
    auto out = hl::zeros({4});
    auto count = hl::zeros({4}, DType::i32);
    for (auto t : hl::tile(x.size(0))) {
      hl::atomic_add(out, {idx[t]}, x[t]);
      hl::atomic_add(count, {idx[t]}, hl::full({t}, 1, DType::i32));
    }
    return std::make_tuple(out, count);
  });
  static const auto embedding_bwd = deuteron::kernel("embedding_bwd", [](hl::Tensor grad, hl::Tensor ids) {
    auto table = hl::zeros({5, grad.size(1)});
    for (auto t : hl::tile(grad.size(0))) hl::atomic_add(table, {ids[t], hl::all}, grad[{t, hl::all}]);
    return table;
  });
  for (int64_t n : {130, 37, 1}) {
    for (DType index_type : {DType::i64, DType::i32}) {
      Tensor x = Tensor::rand({n}, DType::f32, 4), idx = Tensor::rand({n}, index_type, 5, 0, 4);
      if (n > 20) idx.set(20, 4), idx.set(3, -1);  // outside the bins: nothing added
      std::vector<Arg> args = {x, idx};
      driver::Specialized s = specialize(bins, args);
      config::Config cfg = fit(s, {{"block_t0", 128}});
      std::string module = s.backend->emit(driver::lower(s, cfg));
      EXPECT_TRUE(contains(module, "jax.lax.fori_loop(0, BLOCK_T0, add_s")) << module;
      EXPECT_TRUE(contains(module, n > 128 ? "dimension_semantics=(\"arbitrary\",)" : "grid=(1,)")) << module;
      api::RunResult r = api::run(bins, args, "pallas", cfg);
      std::vector<double> want(4, 0.0), count(4, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        int64_t b = int64_t(idx.get(i));
        if (b < 0 || b >= 4) continue;
        want[size_t(b)] += x.get(i);
        count[size_t(b)] += 1;
      }
      for (int64_t b = 0; b < 4; ++b) {
        EXPECT_NEAR(r.outputs[0].get(b), want[size_t(b)], 1e-5 * double(n)) << "n " << n << " bin " << b;
        EXPECT_EQ(r.outputs[1].get(b), count[size_t(b)]) << "n " << n << " bin " << b;
      }
    }
    Tensor grad = Tensor::rand({n, 3}, DType::f32, 6), ids = Tensor::rand({n}, DType::i64, 7, 0, 5);
    if (n > 20) ids.set(20, 5);
    std::vector<Arg> args = {grad, ids};
    driver::Specialized s = specialize(embedding_bwd, args);
    api::RunResult r = api::run(embedding_bwd, args, "pallas", fit(s, {{"block_t0", 128}}));
    for (int64_t row = 0; row < 5; ++row)
      for (int64_t c = 0; c < 3; ++c) {
        double want = 0;
        for (int64_t i = 0; i < n; ++i)
          if (int64_t(ids.get(i)) == row) want += grad.get(i * 3 + c);
        EXPECT_NEAR(r.outputs[0].get(row * 3 + c), want, 1e-5 * double(n)) << "n " << n << " " << row << ", " << c;
      }
  }
}

// A scatter (a plain store at gathered indices) and a scatter-add the fori_loop cannot do are
// rejected by name, at the user's line.
TEST_F(PallasTarget, RejectsScattersItCannotRun) {
  static const auto scatter = deuteron::kernel("scatter_store", [](hl::Tensor x, hl::Tensor idx) {
    auto out = hl::zeros({4});
    for (auto t : hl::tile(x.size(0))) out[{idx[t]}] = x[t];
    return out;
  });
  static const auto inner = deuteron::kernel("scatter_columns", [](hl::Tensor x, hl::Tensor idx) {
    auto out = hl::zeros({x.size(0), 4});
    for (auto t : hl::tile(x.size(0))) hl::atomic_add(out, {t, idx[t]}, x[t]);
    return out;
  });
  std::vector<Arg> args = {Tensor::zeros({130}, DType::f32), Tensor::zeros({130}, DType::i32)};
  auto err = pallas_emit_error(scatter, args);
  ASSERT_TRUE(err);
  EXPECT_TRUE(contains(err->message(), "scatters (stores at gathered indices)")) << err->what();
  EXPECT_TRUE(contains(err->where(), "test_pallas.cpp")) << err->what();
  err = pallas_emit_error(inner, args);
  ASSERT_TRUE(err);
  EXPECT_TRUE(contains(err->message(), "this scatter-add")) << err->what();
  EXPECT_TRUE(contains(err->where(), "test_pallas.cpp")) << err->what();
}

// An int64 scalar argument reaches the kernel as int32: one it cannot hold is an error.
TEST_F(PallasTarget, Int64ScalarsOutsideInt32AreRejected) {
  static const auto k = deuteron::kernel("shift_by", [](hl::Tensor x, hl::Scalar shift) {
    auto out = hl::empty_like(x);
    for (auto t : hl::tile(x.size(0))) out[t] = x[t] + shift;
    return out;
  });
  for (int64_t big : {int64_t(3000000000LL), (int64_t(1) << 53) + 1, int64_t(6364136223846793005LL)}) {
    std::vector<Arg> args = {Tensor::zeros({8}, DType::f32), big};
    try {
      api::run(k, args, "pallas");
      FAIL() << big << " was passed as an int32";
    } catch (const ArgumentError& e) {
      EXPECT_TRUE(contains(e.message(), fmt::format("= {} does not fit int32", big))) << e.what();  // every digit
      EXPECT_TRUE(contains(e.message(), "int32")) << e.what();
      EXPECT_TRUE(contains(e.where(), "test_pallas.cpp")) << e.what();
    }
  }
}

// The space's heuristic default is CPU-minded (e.g. 4-row blocks); the target's adjust_default
// (called by the driver) raises the blocks that break the TPU rule.
TEST_F(PallasTarget, AdjustedDefaultConfigsAreLegal) {
  const auto& pallas = dynamic_cast<const pallas::PallasBackend&>(backends::get("pallas"));
  int illegal_defaults = 0;
  struct Shape {
    std::string kernel;
    std::vector<int64_t> shape;
  };
  for (const Shape& c : std::vector<Shape>{{"add", {4, 1000}},
                                           {"add", {1, 300}},
                                           {"add", {130, 300}},
                                           {"softmax", {8192, 2560}},
                                           {"softmax", {3, 70}}}) {
    const examples::Entry& e = examples::find(c.kernel);
    std::vector<Arg> args = {Tensor::zeros(c.shape, DType::f32)};
    if (c.kernel == "add") args.push_back(Tensor::zeros(c.shape, DType::f32));
    driver::Specialized s = specialize(*e.kernel, args);
    // The space's own heuristic, before the driver let the target adjust it.
    config::Config heuristic = config::ConfigSpace::derive(s.ir, pallas.limits()).default_config();
    config::Config adjusted = pallas.adjust_default(s.space, heuristic, s.ir);
    std::string what = fmt::format("{} [{}]: default {} adjusted to {}", c.kernel, fmt::join(c.shape, ", "),
                                   heuristic.dump(), adjusted.dump());
    EXPECT_EQ(s.space.default_config(), adjusted) << "the driver uses the adjusted default: " << what;
    try {
      driver::lower(s, heuristic);
    } catch (const ConfigError&) {
      ++illegal_defaults;
    }
    EXPECT_NO_THROW(driver::lower(s, adjusted)) << what;
    // Legal blocks are left alone.
    EXPECT_EQ(pallas.adjust_default(s.space, adjusted, s.ir), adjusted) << what;
  }
  EXPECT_GT(illegal_defaults, 0) << "no default broke the TPU rule: the cases no longer test the adjustment";
}

TEST_F(PallasTarget, LimitsComeFromTheTpuTable) {
  const backends::Backend& b = backends::get("pallas");
  {
    // The whole VMEM of a core: the module raises vmem_limit_bytes to what it needs.
    ScopedEnv env("DEUTERON_TPU_GENERATION", "v5e");
    EXPECT_EQ(b.limits().cores, 1);
    EXPECT_EQ(b.limits().fast_memory_bytes, int64_t(128) << 20);
  }
  {
    ScopedEnv env("DEUTERON_TPU_GENERATION", "v4");
    EXPECT_EQ(b.limits().cores, 2);
    EXPECT_EQ(b.limits().fast_memory_bytes, int64_t(16) << 20);
  }
  EXPECT_EQ(pallas::tpu_generation("7x").name, "v7x");
  EXPECT_THROW(pallas::tpu_generation("v9z"), ArgumentError);
  pallas::TpuGeneration v5e = pallas::tpu_generation("v5e");
  EXPECT_EQ(pallas::padded_vmem_bytes(v5e, {8, 300}, DType::f32), 8 * 384 * 4);
  EXPECT_EQ(pallas::padded_vmem_bytes(v5e, {8, 300}, DType::bf16), 16 * 384 * 2);
}

// Every generation the table holds has every figure, sourced, and the five the pallas target
// plans for are all there (by their --chip names).
TEST(TpuTable, EveryGenerationIsComplete) {
  std::vector<std::string> names;
  for (const pallas::TpuGeneration& g : pallas::tpu_generations()) {
    names.push_back(g.name);
    SCOPED_TRACE(g.name);
    EXPECT_FALSE(g.runner_chip.empty());
    EXPECT_GE(g.cores_per_chip, g.cores_per_device);
    EXPECT_GE(g.cores_per_device, 1);
    EXPECT_GT(g.vmem_bytes, 0);
    EXPECT_GT(g.scoped_vmem_bytes, 0);
    EXPECT_LE(g.scoped_vmem_bytes, g.vmem_bytes);
    EXPECT_GT(g.hbm_bytes_per_s, 1e11);
    EXPECT_GT(g.bf16_flops, 1e13);
    EXPECT_GE(g.mxus_per_core, 1);
    EXPECT_TRUE(g.mxu_width == 128 || g.mxu_width == 256) << g.mxu_width;
    EXPECT_FALSE(g.mxu.empty());
    // A clock a TPU runs at, and a VPU well below the MXU.
    EXPECT_GT(g.clock_hz, 0.9e9);
    EXPECT_LT(g.clock_hz, 2.5e9);
    EXPECT_GT(g.vpu_f32_flops, 1e12);
    EXPECT_LT(g.vpu_f32_flops, g.bf16_flops / 10);
    EXPECT_TRUE(g.vpu_uncertain) << "no public source gives a VPU peak";
    EXPECT_NE(g.sources.find("[jax]"), std::string::npos) << g.sources;
    EXPECT_NE(g.sources.find("cloud.google.com/tpu/docs/"), std::string::npos) << g.sources;
    EXPECT_EQ(pallas::tpu_generation(g.name).name, g.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"v4", "v5e", "v5p", "v6e", "v7x"}));
  // The published clocks the derivation must reproduce.
  EXPECT_NEAR(pallas::tpu_generation("v4").clock_hz, 1.05e9, 0.01e9);
  EXPECT_NEAR(pallas::tpu_generation("v5e").clock_hz, 1.5e9, 0.01e9);
  EXPECT_NEAR(pallas::tpu_generation("v5p").clock_hz, 1.75e9, 0.01e9);
}

TEST_F(PallasTarget, MissingVenvIsACompileErrorNamingTheSetupScript) {
  const examples::Entry& e = examples::find("add");
  std::vector<Arg> args = e.inputs({16, 128}, DType::f32, 1);
  driver::Specialized s = specialize(*e.kernel, args);
  plan::Plan p = driver::lower(s, fit(s, kBlocks.at("add")));
  ScopedEnv env("DEUTERON_VENV", "/nonexistent/deuteron-venv");
  try {
    s.backend->compile(p);
    FAIL() << "compiled without a Python environment";
  } catch (const CompileError& err) {
    EXPECT_TRUE(contains(err.what(), "scripts/setup_python.sh")) << err.what();
    EXPECT_TRUE(contains(err.what(), "/nonexistent/deuteron-venv")) << err.what();
  }
}

// The runner's one-line error becomes the exception's message; failures inside the simulated
// TPU are RuntimeErrors, failures before it (import, tracing) CompileErrors.
TEST_F(PallasTarget, RunnerFailuresCarryItsMessage) {
  const examples::Entry& e = examples::find("add");
  std::vector<Arg> args = e.inputs({16, 128}, DType::f32, 1);
  driver::Specialized s = specialize(*e.kernel, args);
  plan::Plan p = driver::lower(s, fit(s, kBlocks.at("add")));
  fs::path venv = fs::temp_directory_path() / ("deuteron-fake-venv-" + unique_suffix());
  fs::create_directories(venv / "bin");
  auto fake = [&](const std::string& error) {
    std::ofstream f(venv / "bin" / "python", std::ios::trunc);
    f << "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
      << "echo 'deuteron_pallas_runner: error: " << error << "' >&2\nexit 2\n";
    f.close();
    fs::permissions(venv / "bin" / "python", fs::perms::owner_all);
  };
  ScopedEnv env("DEUTERON_VENV", venv.string());
  ScopedEnv device("DEUTERON_PALLAS_DEVICE", "interpret");  // no probe: the runs fail, not the probe
  driver::Bound bound = driver::bind_args(s, args);
  fake("JaxRuntimeError: INTERNAL: out-of-bounds read of arg0");
  try {
    s.backend->compile(p)->run(bound.tensors, bound.scalars);
    FAIL() << "the fake runner's failure was ignored";
  } catch (const RuntimeError& err) {
    EXPECT_TRUE(contains(err.message(), "out-of-bounds read of arg0")) << err.what();
    EXPECT_TRUE(contains(err.hint(), "rerun by hand")) << err.what();
  }
  fake("SyntaxError: invalid syntax");
  EXPECT_THROW(s.backend->compile(p)->run(bound.tensors, bound.scalars), CompileError);
  fs::remove_all(venv);
}

}  // namespace
}  // namespace deuteron
