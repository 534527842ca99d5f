// hl::dot: its errors, its semantics (addmm form, transposed and batched operands, broadcasting,
// mixed dtypes, computed operands) against plain double-precision loops at ragged shapes and size
// one, under every way its operands can reach the micro-kernel (in place, packed by the dot,
// packed by a streamed or resident copy), and the plan decisions behind those.
#include <cmath>
#include <functional>
#include <optional>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "backends/backend.h"
#include "backends/cpu/hardware.h"
#include "backends/cpu/packing.h"
#include "backends/cpu/refine.h"
#include "backends/registry.h"
#include "catalogue.h"
#include "deuteron/deuteron.h"
#include "driver/driver.h"
#include "plan/plan.h"
#include "test_kernels.h"

namespace deuteron {
namespace {

namespace hl = deuteron::hl;

int mistake_line = 0;
#define THE_MISTAKE_IS_ON_THE_NEXT_LINE() (mistake_line = __LINE__ + 1)

std::vector<double> doubles(const Tensor& t) {
  std::vector<double> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.get(i);
  return v;
}

// Row-major [batch, m, k] @ [batch, k, n] in double (a_t: a stored [k, m]; b_t: b stored
// [n, k]); an operand with a single batch broadcasts.
std::vector<double> product(const std::vector<double>& a, const std::vector<double>& b, int64_t batch, int64_t m,
                            int64_t k, int64_t n, bool a_t = false, bool b_t = false) {
  std::vector<double> c(size_t(batch * m * n), 0.0);
  int64_t ab = int64_t(a.size()) == m * k ? 0 : m * k, bb = int64_t(b.size()) == k * n ? 0 : k * n;
  for (int64_t g = 0; g < batch; ++g)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += a[size_t(g * ab + (a_t ? p * m + i : i * k + p))] * b[size_t(g * bb + (b_t ? j * k + p : p * n + j))];
        c[size_t((g * m + i) * n + j)] = s;
      }
  return c;
}
std::vector<double> product(const Tensor& a, const Tensor& b, int64_t batch, int64_t m, int64_t k, int64_t n,
                            bool a_t = false, bool b_t = false) {
  return product(doubles(a), doubles(b), batch, m, k, n, a_t, b_t);
}

void expect_close(const Tensor& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.numel(), int64_t(want.size())) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = got.get(i), w = want[size_t(i)];
    if (std::abs(g - w) > tol + tol * std::abs(w) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " is " << g << ", want " << w;
  }
}

// The configs every semantic test runs under: the default, each operand strategy, and small
// blocks (ragged edges in every dim, remainders of every row count).
std::vector<std::optional<config::Config>> configs_for(const KernelBase& k, const std::vector<Arg>& args) {
  auto s = driver::specialize(k, frontend::describe_args(k, args), "cpu");
  std::vector<std::optional<config::Config>> out = {config::Config()};
  auto has = [&](const std::string& name) {
    for (const auto& t : s.space.tunables())
      if (t.name == name) return true;
    return false;
  };
  // every loop streamed; every loop resident; each dot operand its own way
  config::Config stream, resident, mixed;
  int nth = 0;
  for (const auto& t : s.space.tunables()) {
    if (t.name.rfind("inner_", 0) != 0) continue;
    bool own = std::find(t.values.begin(), t.values.end(), config::Json("loop")) != t.values.end();
    if (!own) {
      stream.set(t.name, "stream");
      resident.set(t.name, "resident");
    } else {
      mixed.set(t.name, (nth++ % 3 == 0) ? "resident" : nth % 3 == 2 ? "stream" : "in_place");
    }
  }
  for (const auto* c : {&stream, &resident, &mixed})
    if (!c->values().empty()) out.push_back(*c);
  config::Config small;
  for (const auto& t : s.space.tunables())
    if (t.kind == config::Tunable::Kind::BlockSize) small.set(t.name, t.values.size() > 3 ? t.values[3] : t.values.back());
  if (has("grid_group")) small.set("grid_group", 2);
  out.push_back(small);
  std::vector<std::optional<config::Config>> fit;
  for (auto& c : out) {
    try {
      driver::lower(s, s.space.complete(*c));
      fit.push_back(c);
    } catch (const ConfigError&) {
    }
  }
  return fit;
}

void check_all_configs(const KernelBase& k, const std::vector<Arg>& args, const std::vector<double>& want,
                       double tol, size_t which = 0) {
  for (const auto& c : configs_for(k, args)) {
    auto r = api::run(k, args, "cpu", c);
    expect_close(r.outputs.at(which), want, tol, fmt::format("{} config {}", k.name(), r.config.dump()));
  }
}

using test_kernels::tiled_matmul;

const std::vector<std::vector<int64_t>> kMKN = {{37, 29, 70}, {1, 1, 1}, {64, 64, 64}, {130, 67, 100}, {5, 200, 3}};

// ---- semantics ----------------------------------------------------------------------------------

TEST(Dot, WholeOperandsWithoutLoop) {
  static const auto k = deuteron::kernel("dot_whole", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({x.size(0), y.size(1)});
    for (auto [tm, tn] : hl::tile({x.size(0), y.size(1)})) out[{tm, tn}] = hl::dot(x[{tm, hl::all}], y[{hl::all, tn}]);
    return out;
  });
  for (auto s : kMKN) {
    Tensor x = Tensor::rand({s[0], s[1]}, DType::f32, 1), y = Tensor::rand({s[1], s[2]}, DType::f32, 2);
    check_all_configs(k, {x, y}, product(x, y, 1, s[0], s[1], s[2]), 1e-5);
  }
}

TEST(Dot, AccumulatePlusEqualsIsFusedIntoTheProduct) {
  static const auto k = deuteron::kernel("dot_plus_equals", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({x.size(0), y.size(1)});
    for (auto [tm, tn] : hl::tile({x.size(0), y.size(1)})) {
      auto acc = hl::zeros({tm, tn});
      for (auto tk : hl::tile(x.size(1))) acc += hl::dot(x[{tm, tk}], y[{tk, tn}]);
      out[{tm, tn}] = acc;
    }
    return out;
  });
  for (auto s : kMKN) {
    Tensor x = Tensor::rand({s[0], s[1]}, DType::f32, 3), y = Tensor::rand({s[1], s[2]}, DType::f32, 4);
    check_all_configs(k, {x, y}, product(x, y, 1, s[0], s[1], s[2]), 1e-5);
  }
  // acc + dot became one dot with an accumulator, accumulating in place.
  Tensor x = Tensor::rand({37, 29}, DType::f32, 3), y = Tensor::rand({29, 70}, DType::f32, 4);
  auto sp = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu");
  int dots = 0;
  for (const auto& loop : sp.ir.loops)
    for (const auto& st : loop.body)
      if (st.kind == ir::Stmt::Kind::Op) {
        const ir::Op& op = sp.ir.ops[size_t(st.id)];
        EXPECT_FALSE(op.kind == ir::OpKind::Binary && op.binary == ir::BinaryFn::Add);
        if (op.kind == ir::OpKind::Dot) {
          ++dots;
          EXPECT_EQ(op.inputs.size(), 3u);
        }
      }
  EXPECT_EQ(dots, 1);
  plan::Plan p = driver::lower(sp, sp.space.default_config());
  ASSERT_EQ(p.dots.size(), 1u);
  EXPECT_GE(p.dots[0].acc_phi, 0);
}

TEST(Dot, TransposedOperands) {
  // out = xtᵀ @ ytᵀ with xt [K, M] and yt [N, K] stored transposed.
  static const auto k = deuteron::kernel("dot_transposed", [](hl::Tensor xt, hl::Tensor yt) {
    int64_t m = xt.size(1), kk = xt.size(0), n = yt.size(0);
    auto out = hl::empty({m, n});
    for (auto [tm, tn] : hl::tile({m, n})) {
      auto acc = hl::zeros({tm, tn});
      for (auto tk : hl::tile(kk)) acc = hl::dot(xt[{tk, tm}].transpose(0, 1), yt[{tn, tk}].transpose(1, 0), acc);
      out[{tm, tn}] = acc;
    }
    return out;
  });
  for (auto s : kMKN) {
    Tensor xt = Tensor::rand({s[1], s[0]}, DType::f32, 5), yt = Tensor::rand({s[2], s[1]}, DType::f32, 6);
    check_all_configs(k, {xt, yt}, product(xt, yt, 1, s[0], s[1], s[2], true, true), 1e-5);
  }
}

TEST(Dot, BatchedWithBroadcastOperands) {
  // [B, M, K] @ [K, N] and [M, K] @ [B, K, N], as torch.matmul broadcasts them.
  static const auto k = deuteron::kernel("dot_broadcast", [](hl::Tensor x, hl::Tensor w, hl::Tensor x2, hl::Tensor w2) {
    int64_t b = x.size(0), m = x.size(1), kk = x.size(2), n = w.size(1);
    auto out = hl::empty({b, m, n}), out2 = hl::empty({b, m, n});
    for (auto [tb, tm, tn] : hl::tile({b, m, n})) {
      auto acc = hl::zeros({tb, tm, tn});
      auto acc2 = hl::zeros({tb, tm, tn});
      for (auto tk : hl::tile(kk)) {
        acc = hl::dot(x[{tb, tm, tk}], w[{tk, tn}], acc);
        acc2 = hl::dot(x2[{tm, tk}], w2[{tb, tk, tn}], acc2);
      }
      out[{tb, tm, tn}] = acc;
      out2[{tb, tm, tn}] = acc2;
    }
    return std::make_tuple(out, out2);
  });
  for (auto s : std::vector<std::vector<int64_t>>{{3, 37, 29, 70}, {1, 1, 1, 1}, {2, 64, 64, 64}}) {
    Tensor x = Tensor::rand({s[0], s[1], s[2]}, DType::f32, 7), w = Tensor::rand({s[2], s[3]}, DType::f32, 8);
    Tensor x2 = Tensor::rand({s[1], s[2]}, DType::f32, 9), w2 = Tensor::rand({s[0], s[2], s[3]}, DType::f32, 10);
    std::vector<Arg> args = {x, w, x2, w2};
    check_all_configs(k, args, product(x, w, s[0], s[1], s[2], s[3]), 1e-5, 0);
    check_all_configs(k, args, product(x2, w2, s[0], s[1], s[2], s[3]), 1e-5, 1);
  }
}

TEST(Dot, AccumulatorExpressionAndBroadcastAccumulator) {
  // acc = dot(x, y, acc * 0.5) halves the running sum each step; out2 = bias[n] + x @ y.
  static const auto k = deuteron::kernel("dot_acc_expr", [](hl::Tensor x, hl::Tensor y, hl::Tensor bias) {
    int64_t m = x.size(0), kk = x.size(1), n = y.size(1);
    auto out = hl::empty({m, n}), out2 = hl::empty({m, n});
    for (auto [tm, tn] : hl::tile({m, n})) {
      auto acc = hl::zeros({tm, tn});
      for (auto tk : hl::tile(kk, {.block_size = 16})) acc = hl::dot(x[{tm, tk}], y[{tk, tn}], acc * 0.5);
      out[{tm, tn}] = acc;
      out2[{tm, tn}] = hl::addmm(bias[tn], x[{tm, hl::all}], y[{hl::all, tn}]);
    }
    return std::make_tuple(out, out2);
  });
  for (auto s : kMKN) {
    Tensor x = Tensor::rand({s[0], s[1]}, DType::f32, 11), y = Tensor::rand({s[1], s[2]}, DType::f32, 12);
    Tensor bias = Tensor::rand({s[2]}, DType::f32, 13);
    std::vector<double> want(size_t(s[0] * s[2]), 0.0);
    for (int64_t k0 = 0; k0 < s[1]; k0 += 16) {
      for (double& v : want) v *= 0.5;
      for (int64_t i = 0; i < s[0]; ++i)
        for (int64_t j = 0; j < s[2]; ++j)
          for (int64_t p = k0; p < std::min(k0 + 16, s[1]); ++p)
            want[size_t(i * s[2] + j)] += x.get(i * s[1] + p) * y.get(p * s[2] + j);
    }
    std::vector<Arg> args = {x, y, bias};
    check_all_configs(k, args, want, 1e-5, 0);
    auto want2 = product(x, y, 1, s[0], s[1], s[2]);
    for (int64_t i = 0; i < s[0]; ++i)
      for (int64_t j = 0; j < s[2]; ++j) want2[size_t(i * s[2] + j)] += bias.get(j);
    check_all_configs(k, args, want2, 1e-5, 1);
  }
}

TEST(Dot, ComputedOperandsAndProductUsedElementwise) {
  // p = exp(x) (a value in fast memory) as A, and as a transposed B; the product feeds more ops.
  static const auto k = deuteron::kernel("dot_computed", [](hl::Tensor x, hl::Tensor y) {
    int64_t m = x.size(0), n = y.size(1);
    auto out = hl::empty({m, n}), out2 = hl::empty({m, m});
    for (auto tm : hl::tile(m)) {
      auto p = hl::exp(x[{tm, hl::all}]);  // [tm, K]
      for (auto tn : hl::tile(n)) out[{tm, tn}] = hl::dot(p, y[{hl::all, tn}]) * 2.0 + 1.0;
      out2[{tm, hl::all}] = hl::dot(p, hl::exp(x[{hl::all, hl::all}]).transpose(0, 1));  // p @ exp(x)ᵀ
    }
    return std::make_tuple(out, out2);
  });
  // (M != K: both whole dims of x must be distinct axes)
  for (auto s : std::vector<std::vector<int64_t>>{{37, 29, 70}, {64, 48, 64}, {1, 3, 1}}) {
    Tensor x = Tensor::rand({s[0], s[1]}, DType::f32, 14, -1, 1), y = Tensor::rand({s[1], s[2]}, DType::f32, 15);
    std::vector<double> ex = doubles(x);
    for (double& v : ex) v = std::exp(v);
    auto want = product(ex, doubles(y), 1, s[0], s[1], s[2]);
    for (double& v : want) v = v * 2 + 1;
    check_all_configs(k, {x, y}, want, 2e-5, 0);
    check_all_configs(k, {x, y}, product(ex, ex, 1, s[0], s[1], s[0], false, true), 2e-5, 1);
  }
}

TEST(Dot, LowPrecisionAndMixedInputs) {
  static const auto k = deuteron::kernel("dot_mixed", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({x.size(0), y.size(1)});
    for (auto [tm, tn] : hl::tile({x.size(0), y.size(1)})) {
      auto acc = hl::zeros({tm, tn});
      for (auto tk : hl::tile(x.size(1))) acc = hl::dot(x[{tm, tk}], y[{tk, tn}].to(DType::f32), acc);
      out[{tm, tn}] = acc;
    }
    return out;
  });
  for (DType a : {DType::bf16, DType::f16, DType::f32})
    for (DType b : {DType::bf16, DType::f16, DType::f32})
      for (auto s : std::vector<std::vector<int64_t>>{{37, 29, 70}, {1, 1, 1}}) {
        Tensor x = Tensor::rand({s[0], s[1]}, a, 16), y = Tensor::rand({s[1], s[2]}, b, 17);
        // inputs are exact in their dtype; products and sums are f32
        check_all_configs(k, {x, y}, product(x, y, 1, s[0], s[1], s[2]), 1e-5);
      }
}

TEST(Dot, GridGroupsVisitEveryBlockOnce) {
  static const auto k = tiled_matmul("dot_grouped");
  Tensor x = Tensor::rand({83, 40}, DType::f32, 18), y = Tensor::rand({40, 45}, DType::f32, 19);
  auto want = product(x, y, 1, 83, 40, 45);
  for (int g : {1, 2, 4, 8})
    for (auto order : {std::vector<int>{0, 1}, std::vector<int>{1, 0}})
      for (int threads : {1, 2}) {
        config::Config c;
        c.set("block_t0", 8);
        c.set("block_t1", 8);
        c.set("grid_group", g);
        c.set("grid_order", order);
        c.set("num_threads", threads);
        c.set("inner_t2", "resident");
        auto r = api::run(k, {x, y}, "cpu", c);
        expect_close(r.outputs[0], want, 1e-5, c.dump());
      }
}

// ---- plan decisions -----------------------------------------------------------------------------

// The decisions below depend on the fast-memory budget: they are checked at the budget each
// assumes, whatever the machine's L2 (DEUTERON_L2_BYTES does not change them).
config::TargetLimits cpu_limits(int64_t l2_bytes) { return {.cores = 2, .fast_memory_bytes = l2_bytes}; }

TEST(DotPlan, OperandsReachTheMicroKernelAsConfigured) {
  static const auto k = tiled_matmul("dot_plan");
  Tensor x = Tensor::rand({256, 2048}, DType::f32, 1), y = Tensor::rand({2048, 256}, DType::f32, 2);
  auto s = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu", cpu_limits(2 << 20));
  auto lower = [&](const std::string& json) {
    return cpu::refine(driver::lower(s, s.space.complete(config::Config::parse(json))));
  };
  // By default the f32 A operand is read in place and B is resident (packed once per grid step,
  // kept while its column of blocks repeats: the M dim is the grid's fastest).
  cpu::CpuPlan p = lower("{}");
  EXPECT_EQ(p.gemms[0].a.read, cpu::DotRead::InPlace);
  EXPECT_EQ(p.gemms[0].b.read, cpu::DotRead::Packed);
  EXPECT_EQ(p.spec_for_op(p.gemms[0].b.load_op)->placement, plan::Placement::Resident);
  EXPECT_EQ(p.grid_axes.back(), p.kernel.value(p.kernel.ops[size_t(p.gemms[0].op)].result).dims[0]);
  // f32 row-major operands can both be read in place.
  p = lower(R"({"inner_t2_arg0": "in_place", "inner_t2_arg1": "in_place"})");
  EXPECT_EQ(p.gemms[0].a.read, cpu::DotRead::InPlace);
  EXPECT_EQ(p.gemms[0].b.read, cpu::DotRead::InPlace);
  // Streamed and resident operands are packed by their copy; a resident one is kept while the
  // grid index it depends on repeats.
  p = lower(R"({"inner_t2_arg0": "stream", "inner_t2_arg1": "resident", "block_t0": 64, "block_t1": 64, "block_t2": 128})");
  EXPECT_EQ(p.gemms[0].a.read, cpu::DotRead::Packed);
  EXPECT_EQ(p.gemms[0].b.read, cpu::DotRead::Packed);
  const plan::BlockSpec* b = p.spec_for_op(p.gemms[0].b.load_op);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->placement, plan::Placement::Resident);
  EXPECT_TRUE(b->reuse);
  ASSERT_EQ(b->reuse_axes.size(), 1u);
  EXPECT_EQ(s.ir.axes[size_t(b->reuse_axes[0])].name, "t1");
  EXPECT_EQ(p.staging_of(*b).fast_bytes, 2048 * 64 * 4);  // every K block of a 64-column panel
  // A resident operand that does not fit the fast memory is refused.
  EXPECT_THROW(lower(R"({"inner_t2": "resident", "block_t0": 256, "block_t1": 256})"), ConfigError);
}

// A loop-level strategy applies to every operand the config does not set itself.
TEST(DotPlan, LoopStrategyAppliesToOperandsNotSetThemselves) {
  static const auto k = tiled_matmul("dot_plan_loop_strategy");
  Tensor x = Tensor::rand({64, 512}, DType::f32, 1), y = Tensor::rand({512, 64}, DType::f32, 2);
  auto s = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu", cpu_limits(2 << 20));
  auto placement = [&](const std::string& json, int operand) {
    plan::Plan p = driver::lower(s, s.space.complete(config::Config::parse(json)));
    const plan::Dot& d = p.dots[0];
    return p.spec_for_op(operand == 0 ? d.a.load_op : d.b.load_op)->placement;
  };
  EXPECT_EQ(placement(R"({"inner_t2": "resident"})", 0), plan::Placement::Resident);
  EXPECT_EQ(placement(R"({"inner_t2": "resident"})", 1), plan::Placement::Resident);
  EXPECT_EQ(placement(R"({"inner_t2": "stream"})", 0), plan::Placement::Staged);
  // An operand set explicitly keeps its own choice.
  EXPECT_EQ(placement(R"({"inner_t2": "stream", "inner_t2_arg1": "in_place"})", 1), plan::Placement::InPlace);
  EXPECT_EQ(placement(R"({"inner_t2": "stream", "inner_t2_arg1": "in_place"})", 0), plan::Placement::Staged);
}

// The default adapts to the budget: B resident while it fits half of it, its N block halved
// (down to the micro-kernel's packed panel: 64 columns with AVX-512, 16 with AVX2) until it
// does, else read in place at the N block it started from (128).
TEST(DotPlan, DefaultsFollowThePinnedBudget) {
  static const auto k = tiled_matmul("dot_plan_budget");
  Tensor x = Tensor::rand({256, 2048}, DType::f32, 1), y = Tensor::rand({2048, 256}, DType::f32, 2);
  const int64_t panel = cpu::dot_panel_columns();
  for (int64_t l2 : {int64_t(512) << 10, int64_t(1) << 20, int64_t(2) << 20}) {
    auto s = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu", cpu_limits(l2));
    config::Config c = s.space.default_config();
    cpu::CpuPlan p = cpu::refine(driver::lower(s, c));
    // B's panel: every K row of an N block, 2048 x 128 floats = 1 MiB, 2048 x 64 = 512 KiB, ...
    int64_t fits = 128;
    while (fits > panel && 2048 * fits * 4 > l2 / 2) fits /= 2;
    const bool resident = 2048 * fits * 4 <= l2 / 2;
    EXPECT_EQ(p.spec_for_op(p.gemms[0].b.load_op)->placement,
              resident ? plan::Placement::Resident : plan::Placement::InPlace)
        << "L2 " << l2 << ", panel " << panel;
    EXPECT_EQ(c.integer("block_t1"), resident ? fits : 128) << "L2 " << l2 << ", panel " << panel;
    EXPECT_LE(p.fast_memory_bytes, l2);
  }
}

// out[m, :] = x[m, :] @ y: every grid step reads all of y[k, :] (N whole, as matmul_layernorm).
auto whole_n_matmul(const char* name) {
  return deuteron::kernel(name, [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({x.size(0), y.size(1)});
    for (auto tm : hl::tile(x.size(0))) {
      auto acc = hl::zeros({tm, y.size(1)});
      for (auto tk : hl::tile(x.size(1))) acc = hl::dot(x[{tm, tk}], y[{tk, hl::all}], acc);
      out[{tm, hl::all}] = acc;
    }
    return out;
  });
}

// Where B cannot stay resident and its rows are 4 KiB apart, the default streams it when the
// N block takes part of each row (short runs that share cache sets), and reads it in place when
// the block is whole rows (one contiguous run, as matmul_layernorm's y): then B's K block is cut
// to a quarter of the L2, so the A panels of an M block find it there.
TEST(DotPlan, DefaultReadsWholeRowsInPlaceAndStreamsPartsOfAliasedRows) {
  static const auto whole = whole_n_matmul("dot_plan_default_whole_rows");
  static const auto parts = tiled_matmul("dot_plan_default_row_parts");
  const int64_t l2 = int64_t(2) << 20;
  auto placement_of_b = [&](const KernelBase& k, const Tensor& x, const Tensor& y, config::Config* out,
                            int64_t budget) {
    auto s = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu", cpu_limits(budget));
    *out = s.space.default_config();
    cpu::CpuPlan p = cpu::refine(driver::lower(s, *out));
    return p.spec_for_op(p.gemms[0].b.load_op)->placement;
  };
  config::Config c;
  // y [1024, 1024]: 4 MiB, too big to be resident; its rows (4 KiB) are whole in the N block.
  Tensor x = Tensor::rand({64, 1024}, DType::f32, 1), y = Tensor::rand({1024, 1024}, DType::f32, 2);
  EXPECT_EQ(placement_of_b(whole, x, y, &c, l2), plan::Placement::InPlace) << c.dump();
  EXPECT_EQ(c.integer("block_t1") * 1024 * 4, l2 / 4) << c.dump();  // K block: 128 rows, 512 KiB
  // y [8192, 1024] in N blocks, with a 512 KiB L2: not even the narrowest resident panel (16
  // columns with AVX2, 512 KiB) fits half of it.
  Tensor x2 = Tensor::rand({64, 8192}, DType::f32, 3), y2 = Tensor::rand({8192, 1024}, DType::f32, 4);
  EXPECT_EQ(placement_of_b(parts, x2, y2, &c, l2 / 4), plan::Placement::Staged) << c.dump();
  EXPECT_LT(c.integer("block_t1"), 1024) << c.dump();
}

// A resident B that no grid index selects (every grid step reads all of y[k, :], as
// matmul_layernorm does) is packed once by the whole team, a column panel per claim, before
// the grid steps, into one copy that all threads read (Staging::shared, dt::SharedPack): only
// one packed column panel of it counts against the L2, the whole copy against half the L3
// (512 KiB here: within any x86 server L3's half). Pinned L2 of 512 KiB: the copy alone fills
// it, a panel (512 rows of 64 columns with AVX-512, 16 with AVX2) fits; at half a panel's
// bytes it does not.
TEST(DotPlan, GridInvariantResidentCopyLivesInTheLastLevelCache) {
  static const auto k = whole_n_matmul("dot_plan_whole_n");
  Tensor x = Tensor::rand({301, 512}, DType::f32, 1), y = Tensor::rand({512, 256}, DType::f32, 2);
  auto s = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu", cpu_limits(512 << 10));
  config::Config c = s.space.complete(config::Config::parse(R"({"inner_t1_arg1": "resident", "num_threads": 2})"));
  c.set("block_t1", 512);
  cpu::CpuPlan p = cpu::refine(driver::lower(s, c), cpu_limits(512 << 10));
  const plan::BlockSpec* b = p.spec_for_op(p.gemms[0].b.load_op);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->placement, plan::Placement::Resident) << c.dump();
  EXPECT_TRUE(b->reuse && b->reuse_axes.empty()) << c.dump();
  EXPECT_TRUE(p.staging_of(*b).shared) << c.dump();
  EXPECT_GE(p.fast_memory_bytes, int64_t(512) << 10);  // the scratch holds the whole copy
  const int64_t panel_bytes = 512 * cpu::dot_panel_columns() * int64_t(sizeof(float));
  EXPECT_THROW(cpu::refine(driver::lower(s, c), cpu_limits(panel_bytes / 2)), FastMemoryError);
  const std::string code = s.backend->emit(driver::lower(s, c));
  EXPECT_NE(code.find("dt::SharedPack shared"), std::string::npos) << code;
  EXPECT_NE(code.find("dt::gemm::kPackGroup * group, dt::gemm::kPackGroup * (group + 1));"),
            std::string::npos)
      << code;
  EXPECT_NE(code.find("reinterpret_cast<float*>(scratch);"), std::string::npos)
      << code;  // in thread 0's scratch
  // Correct at a ragged M (301: 10 blocks of 32 and one of 13), against a float64 loop, with
  // teams of 1 and 2 threads (256 columns: 4 panels of 64 with AVX-512, 16 of 16 with AVX2).
  std::vector<double> want(size_t(301 * 256), 0.0);
  for (int64_t i = 0; i < 301; ++i)
    for (int64_t q = 0; q < 512; ++q)
      for (int64_t j = 0; j < 256; ++j) want[size_t(i * 256 + j)] += double(x.get(i * 512 + q)) * double(y.get(q * 256 + j));
  for (int threads : {1, 2}) {
    c.set("num_threads", threads);
    auto r = api::run(k, {x, y}, "cpu", c);
    expect_close(r.outputs[0], want, 1e-5, c.dump());
  }
}

// Flash attention over [B, H, S, D] whose scores are masked where kv - q > Shift, written with
// > (kv > q + Shift, as the catalogue's causal kernel) or with < (q + Shift < kv); Fill is
// what the mask writes (-inf masks; 0 is a different kernel that skips nothing).
template <int Shift, bool Less, int Fill>
auto shifted_causal_attention(const char* name) {
  return deuteron::kernel(name, [](hl::Tensor q, hl::Tensor k, hl::Tensor v) {
    auto out = hl::empty_like(q);
    for (auto [tb, th, tq] : hl::tile({q.size(0), q.size(1), q.size(2)}, {"batch", "head", "q"})) {
      auto qb = q[{tb, th, tq, hl::all}];
      auto m_i = hl::full({tb, th, tq}, -INFINITY);
      auto l_i = hl::zeros({tb, th, tq});
      auto acc = hl::zeros({tb, th, tq, q.size(3)});
      for (auto tkv : hl::tile(k.size(2), {.name = "kv"})) {
        auto qk = hl::dot(qb, k[{tb, th, tkv, hl::all}].transpose(2, 3));
        auto kv = tkv.index().unsqueeze(0), qi = tq.index().unsqueeze(1);
        qk = hl::where(Less ? qi + Shift < kv : kv > qi + Shift, Fill == 0 ? 0.0f : -INFINITY, qk);
        auto m_new = hl::maximum(m_i, qk.amax(3));
        auto p = hl::exp(qk - m_new.unsqueeze(3));
        auto alpha = hl::exp(m_i - m_new);
        l_i = l_i * alpha + p.sum(3);
        acc = hl::dot(p, v[{tb, th, tkv, hl::all}], acc * alpha.unsqueeze(3));
        m_i = m_new;
      }
      out[{tb, th, tq, hl::all}] = acc / l_i.unsqueeze(3);
    }
    return out;
  });
}

// softmax(q kᵀ) v in double, with scores where kv - q > shift masked (to -inf) or set to 0.
std::vector<double> shifted_causal_reference(const Tensor& q, const Tensor& k, const Tensor& v, int shift,
                                             bool zero) {
  int64_t bh = q.size(0) * q.size(1), s = q.size(2), d = q.size(3);
  std::vector<double> out(size_t(bh * s * d), 0.0), p(static_cast<size_t>(s));
  for (int64_t g = 0; g < bh; ++g)
    for (int64_t i = 0; i < s; ++i) {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < s; ++j) {
        double x = 0;
        for (int64_t c = 0; c < d; ++c) x += double(q.get((g * s + i) * d + c)) * k.get((g * s + j) * d + c);
        p[size_t(j)] = j - i > shift ? (zero ? 0.0 : -INFINITY) : x;
        mx = std::max(mx, p[size_t(j)]);
      }
      for (int64_t j = 0; j < s; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
      for (int64_t j = 0; j < s; ++j)
        for (int64_t c = 0; c < d; ++c)
          out[size_t((g * s + i) * d + c)] += p[size_t(j)] / sum * v.get((g * s + j) * d + c);
    }
  return out;
}

// A causal mask is found from the kernel (plan::find_triangles): the scores' product leaves out
// the tiles above the diagonal, the product with v does not multiply the softmax's zeros there,
// whichever way the comparison is written and wherever the diagonal sits. Each is exact: at
// ragged shapes and blocks that cut the diagonal anywhere, against a float64 loop. A mask to 0
// (not -inf) leaves nothing out, and neither does attention without a mask. The mask itself is
// a plan::DiagonalMask, which the CPU target tests per block: a block below the diagonal runs
// its where() without it (both branches run at these blocks).
TEST(DotPlan, CausalProductsLeaveOutTheMaskedTriangle) {
  static const auto greater = shifted_causal_attention<0, false, -1>("dot_plan_causal_greater");
  static const auto less = shifted_causal_attention<3, true, -1>("dot_plan_causal_less_shifted");
  static const auto zero = shifted_causal_attention<0, false, 0>("dot_plan_causal_zero_fill");
  Tensor q = Tensor::rand({1, 2, 75, 24}, DType::f32, 1), k = Tensor::rand({1, 2, 75, 24}, DType::f32, 2),
         v = Tensor::rand({1, 2, 75, 24}, DType::f32, 3);
  struct Case {
    const KernelBase* kernel;
    int shift;
    bool zero;
  };
  for (const Case& cs : {Case{&greater, 0, false}, Case{&less, 3, false}, Case{&zero, 0, true}}) {
    auto s = driver::specialize(*cs.kernel, frontend::describe_args(*cs.kernel, {q, k, v}), "cpu");
    // Blocks pinned (the default's come from this machine's caches): both cut the diagonal.
    plan::Plan p =
        driver::lower(s, s.space.complete(config::Config::parse(R"({"block_q": 16, "block_kv": 32})")));
    ASSERT_EQ(p.dots.size(), 2u);
    const int64_t none = plan::Dot::kNoTriangle;
    EXPECT_EQ(p.dots[0].c_unused_above, cs.zero ? none : cs.shift) << cs.kernel->name();
    EXPECT_EQ(p.dots[0].a_zero_above, none) << cs.kernel->name();
    EXPECT_EQ(p.dots[1].c_unused_above, none) << cs.kernel->name();
    EXPECT_EQ(p.dots[1].a_zero_above, cs.zero ? none : cs.shift) << cs.kernel->name();
    ASSERT_EQ(p.diagonal_masks.size(), 1u) << cs.kernel->name();
    EXPECT_EQ(p.diagonal_masks[0].t, cs.shift) << cs.kernel->name();
    const std::string code = s.backend->emit(p);
    EXPECT_EQ(code.find("dt::gemm::Triangle{") != std::string::npos, !cs.zero) << code;
    EXPECT_NE(code.find(fmt::format("- o_q <= {}) {{  // ", cs.shift)), std::string::npos) << code;
    EXPECT_NE(code.find(fmt::format("kv - q > {} nowhere in this block", cs.shift)), std::string::npos)
        << code;
    const std::vector<double> want = shifted_causal_reference(q, k, v, cs.shift, cs.zero);
    for (const char* blocks : {R"({"block_q": 16, "block_kv": 32, "num_threads": 2})",
                               R"({"block_q": 32, "block_kv": 8, "num_threads": 1})",
                               R"({"block_q": 8, "block_kv": 64, "num_threads": 2})"}) {
      config::Config c = s.space.complete(config::Config::parse(blocks));
      auto r = api::run(*cs.kernel, {q, k, v}, "cpu", c);
      expect_close(r.outputs[0], want, 1e-5, fmt::format("{} {}", cs.kernel->name(), c.dump()));
    }
  }
  const KernelBase& unmasked = *examples::find("attention").kernel;
  auto s = driver::specialize(unmasked, frontend::describe_args(unmasked, {q, k, v}), "cpu");
  plan::Plan p = driver::lower(s, s.space.default_config());
  for (const plan::Dot& d : p.dots)
    EXPECT_TRUE(d.c_unused_above == plan::Dot::kNoTriangle && d.a_zero_above == plan::Dot::kNoTriangle);
  EXPECT_TRUE(p.diagonal_masks.empty());
}

// out[b, m, :] = x[b, m, :] @ y[b]: each grid step reads all of y[b] (attention's kᵀ per head).
auto batched_whole_n_matmul(const char* name) {
  return deuteron::kernel(name, [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({x.size(0), x.size(1), y.size(2)});
    for (auto [tb, tm] : hl::tile({x.size(0), x.size(1)})) {
      auto acc = hl::zeros({tb, tm, y.size(2)});
      for (auto tk : hl::tile(x.size(2))) acc = hl::dot(x[{tb, tm, tk}], y[{tb, tk, hl::all}], acc);
      out[{tb, tm, hl::all}] = acc;
    }
    return out;
  });
}

// A resident B that a grid index selects (y[b]: the batch's grid block) is each thread's own,
// packed again only when that index changes, and kept beyond the L2: one K block of it counts
// against the L2, the whole copy (every thread's) against half the L3. Pinned L2 of 128 KiB:
// the copy of y[b] (256 x 200: 208 KiB packed in AVX2's 16-column panels, 256 KiB in AVX-512's
// 64) does not fit it, a K block of 64 rows does; at an eighth of the copy the config does not
// fit. Any x86 server's L3 holds both threads' copies in its half (1 MiB at most).
TEST(DotPlan, ResidentCopyAGridIndexSelectsLivesInTheLastLevelCache) {
  static const auto k = batched_whole_n_matmul("dot_plan_batched_whole_n");
  Tensor x = Tensor::rand({3, 37, 256}, DType::f32, 1), y = Tensor::rand({3, 256, 200}, DType::f32, 2);
  const int64_t l2 = 128 << 10;
  auto s = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu", cpu_limits(l2));
  config::Config c =
      s.space.complete(config::Config::parse(R"({"inner_t2_arg1": "resident", "num_threads": 2})"));
  c.set("block_t0", 1);
  c.set("block_t1", 16);
  c.set("block_t2", 64);
  cpu::CpuPlan p = cpu::refine(driver::lower(s, c), cpu_limits(l2));
  const plan::BlockSpec* b = p.spec_for_op(p.gemms[0].b.load_op);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->placement, plan::Placement::Resident) << c.dump();
  EXPECT_TRUE(b->reuse && b->reuse_axes == std::vector<int>{0}) << c.dump();
  EXPECT_FALSE(p.staging_of(*b).shared) << c.dump();
  const int64_t copy_bytes = cpu::packed_b_elements(256, 200) * int64_t(sizeof(float));
  ASSERT_GE(cpu::cpu_info().l3_bytes / 2, 2 * copy_bytes) << "an L3 too small for this test's two copies";
  EXPECT_EQ(p.l3_per_thread_bytes, copy_bytes) << c.dump();
  EXPECT_GE(p.fast_memory_bytes, copy_bytes);  // the scratch holds the whole copy
  EXPECT_THROW(cpu::refine(driver::lower(s, c), cpu_limits(copy_bytes / 8)), FastMemoryError);
  const std::string code = s.backend->emit(driver::lower(s, c));
  EXPECT_NE(code.find("not already packed by this thread's previous grid step"), std::string::npos) << code;
  // Correct at a ragged M (37: blocks of 16, 16 and 5), against a float64 loop, with teams of 1
  // and 2 threads (whose runs of grid steps cross batches).
  const std::vector<double> want = product(x, y, 3, 37, 256, 200);
  for (int threads : {1, 2}) {
    c.set("num_threads", threads);
    auto r = api::run(k, {x, y}, "cpu", c);
    expect_close(r.outputs[0], want, 1e-5, c.dump());
  }
}

// A grid block as wide as the product's N (BLIS's loop order: an A block packed per block of K,
// swept against all of B) leaves no grid index that selects B: its resident copy is packed once
// by the team and shared, as a grid-invariant one is, and the pack declares the one block of N
// itself. With N in two blocks each thread keeps its own copy. Pinned L2 of 512 KiB; checked at
// a ragged M and N (not a whole number of panels) against a float64 product.
TEST(DotPlan, ResidentCopyOfAWholeNGridBlockIsShared) {
  static const auto k = tiled_matmul("dot_plan_whole_n_block");
  Tensor x = Tensor::rand({301, 96}, DType::f32, 1), y = Tensor::rand({96, 203}, DType::f32, 2);
  auto s = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu", cpu_limits(512 << 10));
  for (int64_t block_n : {256, 128}) {
    config::Config c = s.space.complete(config::Config::parse(
        R"({"block_t0": 32, "block_t2": 32, "inner_t2_arg0": "stream", "inner_t2_arg1": "resident", "num_threads": 2})"));
    c.set("block_t1", block_n);
    cpu::CpuPlan p = cpu::refine(driver::lower(s, c), cpu_limits(512 << 10));
    const plan::BlockSpec* b = p.spec_for_op(p.gemms[0].b.load_op);
    ASSERT_NE(b, nullptr);
    const bool whole = block_n >= 203;
    EXPECT_EQ(p.staging_of(*b).shared, whole) << c.dump();
    const std::string code = s.backend->emit(driver::lower(s, c));
    EXPECT_EQ(code.find("one grid block, the whole dim") != std::string::npos, whole) << code;
    for (int threads : {1, 2}) {
      c.set("num_threads", threads);
      auto r = api::run(k, {x, y}, "cpu", c);
      expect_close(r.outputs[0], product(x, y, 1, 301, 96, 203), 1e-5, c.dump());
    }
  }
}

// An accumulator that starts as zeros and that only a plain store writes out lives in the
// output's tile: the micro-kernel's first block of K overwrites it, later ones add to it, and
// there is no zero fill, no fast-memory array and no copy out. Not where the store streams, the
// output is bf16, or something else reads the accumulator; and a general variant (sizes read at
// run time) writes the zeros itself where its loop over K runs no block.
TEST(DotPlan, AccumulatorLivesInTheOutputTile) {
  static const auto k = tiled_matmul("dot_plan_in_output");
  auto plan_of = [](const KernelBase& kernel, const std::vector<Arg>& args, const char* json) {
    auto s = driver::specialize(kernel, frontend::describe_args(kernel, args), "cpu");
    config::Config c = s.space.complete(config::Config::parse(json));
    return std::pair{cpu::refine(driver::lower(s, c)), s.backend->emit(driver::lower(s, c))};
  };
  Tensor x = Tensor::rand({67, 45}, DType::f32, 1), y = Tensor::rand({45, 33}, DType::f32, 2);
  const char* ragged = R"({"block_t0": 8, "block_t1": 16, "block_t2": 16, "stores": "cached"})";
  auto [p, code] = plan_of(k, {x, y}, ragged);
  ASSERT_EQ(p.gemms.size(), 1u);
  ASSERT_GE(p.gemms[0].out_store, 0);
  EXPECT_FALSE(p.materialized[size_t(p.gemms[0].acc_phi)]);
  EXPECT_NE(code.find("out0 + o_t0 * 33 + o_t1, 33, o_t2 != begin_t2);"), std::string::npos) << code;
  EXPECT_EQ(code.find("= 0.0f;"), std::string::npos) << code;  // no zero fill
  EXPECT_NE(cpu::describe(p).find("accumulates in out0's tile"), std::string::npos);
  // Ragged blocks in every dim (3 blocks of K), whole blocks, and sizes 1.
  for (const char* c : {ragged, R"({"stores": "cached"})"}) {
    auto r = api::run(k, {x, y}, "cpu", config::Config::parse(c));
    expect_close(r.outputs[0], product(x, y, 1, 67, 45, 33), 1e-5, c);
  }
  Tensor x1 = Tensor::rand({1, 1}, DType::f32, 3), y1 = Tensor::rand({1, 1}, DType::f32, 4);
  expect_close(api::run(k, {x1, y1}, "cpu").outputs[0], product(x1, y1, 1, 1, 1, 1), 1e-6, "1 x 1 x 1");

  // Streaming stores keep the accumulator in fast memory and write rows past the cache.
  EXPECT_LT(plan_of(k, {x, y}, R"({"block_t0": 8, "block_t1": 16, "block_t2": 16, "stores": "stream"})")
                .first.gemms[0]
                .out_store,
            0);
  // A bf16 output is rounded from the f32 accumulator.
  static const auto bf16_out = deuteron::kernel("dot_plan_in_output_bf16", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({x.size(0), y.size(1)}, DType::bf16);
    for (auto [tm, tn] : hl::tile({x.size(0), y.size(1)})) {
      auto acc = hl::zeros({tm, tn});
      for (auto tk : hl::tile(x.size(1))) acc = hl::dot(x[{tm, tk}], y[{tk, tn}], acc);
      out[{tm, tn}] = acc;
    }
    return out;
  });
  EXPECT_LT(plan_of(bf16_out, {x, y}, "{}").first.gemms[0].out_store, 0);
  // The accumulator is also read by a second output: it stays in fast memory, both are right.
  static const auto two_outputs =
      deuteron::kernel("dot_plan_in_output_twice", [](hl::Tensor x, hl::Tensor y) {
        auto out = hl::empty({x.size(0), y.size(1)}), doubled = hl::empty({x.size(0), y.size(1)});
        for (auto [tm, tn] : hl::tile({x.size(0), y.size(1)})) {
          auto acc = hl::zeros({tm, tn});
          for (auto tk : hl::tile(x.size(1))) acc = hl::dot(x[{tm, tk}], y[{tk, tn}], acc);
          out[{tm, tn}] = acc;
          doubled[{tm, tn}] = acc * 2.0;
        }
        return std::make_tuple(out, doubled);
      });
  EXPECT_LT(plan_of(two_outputs, {x, y}, ragged).first.gemms[0].out_store, 0);
  auto r = api::run(two_outputs, {x, y}, "cpu", config::Config::parse(ragged));
  std::vector<double> want = product(x, y, 1, 67, 45, 33), twice = want;
  for (double& v : twice) v *= 2;
  expect_close(r.outputs[0], want, 1e-5, "out");
  expect_close(r.outputs[1], twice, 1e-5, "doubled");

  // A general variant cannot know that K has a block: it writes the zeros where it has none.
  auto s = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu");
  plan::Plan general = driver::lower(
      s, s.space.complete(config::Config::parse(R"({"inner_t2": "in_place", "stores": "cached"})")));
  std::string source = s.backend->emit_aot(general, "k_general", true).source;
  EXPECT_NE(source.find("if (begin_t2 >= end_t2) {"), std::string::npos) << source;
  EXPECT_NE(source.find("dt::gemm::gemm(n_t0, n_t1, 0,"), std::string::npos) << source;
}

// An accumulator that starts as zeros and whose elementwise epilogue an f32 output stores at the
// accumulator's own tile lives in that tile when it is too large to keep in fast memory (more
// than half the L2): the epilogue reads each element there and writes its result over it. So the
// product may take a tile of whole rows of N (Goto's order) and keep its epilogue fused. A
// smaller tile stays compact in fast memory, and so does one that an op after the store reads
// again (it would find the epilogue's results). Against float64 loops at a ragged M and K, at N
// in one block, at small blocks and at size 1, on 1 and 2 threads; sizes from this machine's L2.
TEST(DotPlan, EpilogueWritesOverTheAccumulatorInTheOutputTile) {
  static const auto k =
      deuteron::kernel("dot_plan_epilogue_in_output", [](hl::Tensor x, hl::Tensor y, hl::Tensor bias) {
        auto out = hl::empty({x.size(0), y.size(1)});
        for (auto [tm, tn] : hl::tile({x.size(0), y.size(1)})) {
          auto acc = hl::zeros({tm, tn});
          for (auto tk : hl::tile(x.size(1))) acc = hl::dot(x[{tm, tk}], y[{tk, tn}], acc);
          out[{tm, tn}] = hl::maximum(acc + bias[tn], 0.0) - acc * 0.5;
        }
        return out;
      });
  auto want = [](const Tensor& x, const Tensor& y, const Tensor& bias) {
    const int64_t m = x.size(0), kk = x.size(1), n = y.size(1);
    std::vector<double> c = product(x, y, 1, m, kk, n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double& v = c[size_t(i * n + j)];
        v = std::max(v + bias.get(j), 0.0) - v * 0.5;
      }
    return c;
  };
  int64_t rows = 1;  // a tile of whole rows of 203 floats, past half the L2
  while (rows * 203 * int64_t(sizeof(float)) <= cpu::cpu_info().l2_bytes / 2) rows *= 2;
  const int64_t m = rows + 3;
  Tensor x = Tensor::rand({m, 45}, DType::f32, 1), y = Tensor::rand({45, 203}, DType::f32, 2),
         bias = Tensor::rand({203}, DType::f32, 3);
  auto s = driver::specialize(k, frontend::describe_args(k, {x, y, bias}), "cpu");
  const std::string whole_n = fmt::format(R"({{"block_t0": {}, "block_t1": 256, "block_t2": 16,
      "inner_t2_arg0": "stream", "inner_t2_arg1": "resident", "stores": "cached"}})",
                                          rows);
  const std::string small = R"({"block_t0": 8, "block_t1": 16, "block_t2": 16, "stores": "cached"})";
  for (const std::string& json : {whole_n, small}) {
    const bool in_output = json == whole_n;
    config::Config c = s.space.complete(config::Config::parse(json));
    cpu::CpuPlan p = cpu::refine(driver::lower(s, c));
    ASSERT_EQ(p.gemms.size(), 1u);
    EXPECT_EQ(p.gemms[0].out_store >= 0, in_output) << json;
    EXPECT_EQ(p.gemms[0].out_epilogue, in_output) << json;
    EXPECT_EQ(p.materialized[size_t(p.gemms[0].acc_phi)], !in_output) << json;
    EXPECT_EQ(cpu::describe(p).find("the epilogue reads it there and writes over it") != std::string::npos,
              in_output);
    const std::string code = s.backend->emit(driver::lower(s, c));
    if (in_output) {
      EXPECT_NE(code.find("out0 + o_t0 * 203 + o_t1, 203, o_t2 != begin_t2);"), std::string::npos) << code;
      EXPECT_EQ(code.find("starts as"), std::string::npos) << code;  // no zero fill
      EXPECT_NE(
          code.find(
              "= out0[((o_t0 + i_t0)) * 203 + (o_t1 + i_t1)];  // the accumulator, in the output's tile"),
          std::string::npos)
          << code;
    }
    for (int threads : {1, 2}) {
      c.set("num_threads", threads);
      expect_close(api::run(k, {x, y, bias}, "cpu", c).outputs[0], want(x, y, bias), 1e-5, c.dump());
    }
  }
  Tensor x1 = Tensor::rand({1, 1}, DType::f32, 4), y1 = Tensor::rand({1, 1}, DType::f32, 5),
         b1 = Tensor::rand({1}, DType::f32, 6);
  expect_close(api::run(k, {x1, y1, b1}, "cpu", config::Config()).outputs[0], want(x1, y1, b1), 1e-6,
               "1 x 1 x 1");

  // A row sum of the accumulator after the store (in the store's pass) reads it again: it stays
  // in fast memory, though the tile is as large.
  static const auto read_after =
      deuteron::kernel("dot_plan_epilogue_read_after", [](hl::Tensor x, hl::Tensor y) {
        auto out = hl::empty({x.size(0), y.size(1)}), sums = hl::empty({x.size(0)});
        for (auto tm : hl::tile(x.size(0))) {
          auto acc = hl::zeros({tm, y.size(1)});
          for (auto tk : hl::tile(x.size(1))) acc = hl::dot(x[{tm, tk}], y[{tk, hl::all}], acc);
          out[{tm, hl::all}] = acc * 2.0;
          sums[tm] = acc.sum(1);
        }
        return std::make_tuple(out, sums);
      });
  const config::TargetLimits roomy = cpu_limits(int64_t(16) << 20);  // room for the tile in fast memory
  auto s2 = driver::specialize(read_after, frontend::describe_args(read_after, {x, y}), "cpu", roomy);
  config::Config c2 =
      s2.space.complete(config::Config::parse(fmt::format(R"({{"block_t0": {}, "block_t1": 16}})", rows)));
  EXPECT_LT(cpu::refine(driver::lower(s2, c2), roomy).gemms[0].out_store, 0);
  c2.set("block_t0", 8);
  auto r = api::run(read_after, {x, y}, "cpu", c2);
  std::vector<double> prod = product(x, y, 1, m, 45, 203), doubled = prod, sums(size_t(m), 0.0);
  for (size_t i = 0; i < prod.size(); ++i) doubled[i] *= 2, sums[i / 203] += prod[i];
  expect_close(r.outputs[0], doubled, 1e-5, "out");
  expect_close(r.outputs[1], sums, 1e-4, "sums");
}

// An output whose rows are the L2's set span apart (l2_bytes / l2_ways: 64 KiB on a Zen 3, 128
// KiB on Zen 4 and on a Xeon with 2 MiB of 16-way L2) puts every row of its tile into the same
// sets. A tile of more rows than the L2 has ways would leave the L2 between the blocks of K that
// add to it: the accumulator stays in fast memory, compact, and is copied out. A row one line
// longer spreads the rows over the sets, and the dot accumulates in the output's tile again. So
// does a tile of whole rows: more rows than ways of a set span each, it is larger than the L2.
TEST(DotPlan, AccumulatorLeavesAnOutputTileWhoseRowsShareL2Sets) {
  static const auto k = tiled_matmul("dot_plan_colliding_rows");
  const cpu::CpuInfo& info = cpu::cpu_info();
  const int64_t span = info.l2_bytes / info.l2_ways;
  int64_t block = 1;
  while (block <= info.l2_ways) block *= 2;  // more rows than ways
  const int64_t m = block + 3;               // a ragged last block
  for (auto [n, block_n] :
       {std::pair{span / 4, int64_t(64)}, {span / 4 + 16, int64_t(64)}, {span / 4, span / 4}}) {
    Tensor x = Tensor::rand({m, 5}, DType::f32, 1), y = Tensor::rand({5, n}, DType::f32, 2);
    auto s = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu");
    const std::string json = fmt::format(
        R"({{"block_t0": {}, "block_t1": {}, "block_t2": 2, "inner_t2": "in_place", "stores": "cached"}})",
        block, block_n);
    config::Config c = s.space.complete(config::Config::parse(json));
    cpu::CpuPlan p = cpu::refine(driver::lower(s, c));
    ASSERT_EQ(p.gemms.size(), 1u);
    const bool collides = n == span / 4 && block_n == 64;
    EXPECT_EQ(p.gemms[0].out_store < 0, collides) << n;
    EXPECT_EQ(p.gemms[0].out_store_collides >= 0, collides) << n;
    EXPECT_EQ(cpu::describe(p).find("fall into too few L2 sets") != std::string::npos, collides)
        << cpu::describe(p);
    auto r = api::run(k, {x, y}, "cpu", c);
    expect_close(r.outputs[0], product(x, y, 1, m, 5, n), 1e-5, json);
  }
}

TEST(DotPlan, BFloat16OperandsArePacked) {
  static const auto k = deuteron::kernel("dot_plan_bf16", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({x.size(0), y.size(1)});
    for (auto tm : hl::tile(x.size(0))) {
      auto q = x[{tm, hl::all}];  // read once per grid step, used in the inner loop
      for (auto tn : hl::tile(y.size(1))) out[{tm, tn}] = hl::dot(q, y[{hl::all, tn}]);
    }
    return out;
  });
  Tensor x = Tensor::rand({70, 33}, DType::bf16, 1), y = Tensor::rand({33, 90}, DType::bf16, 2);
  auto s = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu");
  cpu::CpuPlan p = cpu::refine(driver::lower(s, s.space.complete(config::Config::parse(R"({"inner_t1_arg1": "in_place"})"))));
  // q is loop-invariant for the dot: packed once per grid step; y, left in place, is packed by
  // the dot.
  EXPECT_EQ(p.gemms[0].a.read, cpu::DotRead::Packed);
  EXPECT_EQ(p.gemms[0].b.read, cpu::DotRead::PackInGroup);
  check_all_configs(k, {x, y}, product(x, y, 1, 70, 33, 90), 1e-5);
}

// Both operands packed bf16: on CPUs with AVX512_BF16 they stay bf16, as pairs of K steps for
// vdpbf16ps, or for AMX tiles where the CPU has them. Here the instructions are emulated
// (DEUTERON_CXXFLAGS reaches the generated code), so the generated pair packing and products
// run on every machine, through both micro-kernels; and widened to f32, as where vdpbf16ps is
// slower than the f32 FMA (DT_GEMM_WIDEN_BF16: on a CPU without AVX512_BF16 the build is the
// same as without it).
class DotPairs : public ::testing::TestWithParam<const char*> {};

// x @ y from kernel k (m x k @ k x n, tiles t0, t1 and t2 over m, n and k) under config c, and
// under c with blocks of 8, 16 and 16: ragged edges in every dim.
void expect_product_in_whole_and_ragged_blocks(const KernelBase& k, const Tensor& x, const Tensor& y,
                                               const config::Config& c) {
  const int64_t m = x.size(0), kk = x.size(1), n = y.size(1);
  for (bool small : {false, true}) {
    config::Config ci = c;
    if (small && m > 1) {
      ci.set("block_t0", 8);
      ci.set("block_t1", 16);
      ci.set("block_t2", 16);
    }
    auto r = api::run(k, {x, y}, "cpu", ci);
    expect_close(r.outputs[0], product(x, y, 1, m, kk, n), 1e-5, r.config.dump());
  }
}
INSTANTIATE_TEST_SUITE_P(Emulated, DotPairs,
                         ::testing::Values("-DDT_GEMM_EMULATE_BF16", "-DDT_GEMM_EMULATE_BF16 -DDT_GEMM_EMULATE_AMX",
                                           "-DDT_GEMM_WIDEN_BF16"),
                         [](const auto& info) {
                           return std::string(info.index == 0 ? "vdpbf16ps" : info.index == 1 ? "amx" : "widened");
                         });
TEST_P(DotPairs, BFloat16PairsWhereTheCpuMultipliesThem) {
  ::setenv("DEUTERON_CXXFLAGS", GetParam(), 1);
  static const auto k = tiled_matmul("dot_bf16_pairs");
  // An even K (rows of 32-bit words) lets the pair micro-kernel read A in place.
  for (auto s : std::vector<std::vector<int64_t>>{{37, 29, 70}, {1, 1, 1}, {130, 67, 100}, {37, 64, 70}}) {
    Tensor x = Tensor::rand({s[0], s[1]}, DType::bf16, 20), y = Tensor::rand({s[1], s[2]}, DType::bf16, 21);
    auto sp = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu");
    // A streamed (packed as pairs block by block), or in place (its words are the pairs; odd
    // rows and an odd K are packed panel by panel by the runtime).
    for (const char* a : {"stream", "in_place"}) {
      config::Config c = config::Config::parse(fmt::format(R"({{"inner_t2_arg0": "{}", "inner_t2_arg1": "resident"}})", a));
      plan::Plan p = driver::lower(sp, sp.space.complete(c));
      cpu::CpuPlan cp = cpu::refine(p);
      ASSERT_TRUE(cp.gemms[0].bf16_pairs);
      std::string code = backends::get("cpu").emit(p);
      EXPECT_NE(code.find("pack_b_pairs"), std::string::npos);
      bool in_place = std::string(a) == "in_place";
      EXPECT_EQ(cp.gemms[0].a.read, in_place ? cpu::DotRead::InPlace : cpu::DotRead::Packed);
      EXPECT_EQ(code.find("a_in_place_bf16") != std::string::npos, in_place);
      expect_product_in_whole_and_ragged_blocks(k, x, y, c);
    }
  }
  ::unsetenv("DEUTERON_CXXFLAGS");
}

// Computed bf16 operands (as attention's p.to(v.dtype())): the dot packs their f32 storage as
// pairs, rounding to bf16 (here the scalings by 2 and 1/2 are exact, so the product is x @ y).
TEST_P(DotPairs, ComputedBFloat16OperandsArePackedAsPairs) {
  ::setenv("DEUTERON_CXXFLAGS", GetParam(), 1);
  static const auto k = deuteron::kernel("dot_bf16_computed", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({x.size(0), y.size(1)});
    for (auto [tm, tn] : hl::tile({x.size(0), y.size(1)})) {
      auto acc = hl::zeros({tm, tn});
      for (auto tk : hl::tile(x.size(1))) {
        auto a = (x[{tm, tk}] * 2.0f).to(DType::bf16);
        auto b = (y[{tk, tn}] * 0.5f).to(DType::bf16);
        acc = hl::dot(a, b, acc);
      }
      out[{tm, tn}] = acc;
    }
    return out;
  });
  for (auto s : std::vector<std::vector<int64_t>>{{37, 29, 70}, {1, 1, 1}, {130, 67, 100}, {12, 64, 64}}) {
    Tensor x = Tensor::rand({s[0], s[1]}, DType::bf16, 22), y = Tensor::rand({s[1], s[2]}, DType::bf16, 23);
    auto sp = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu");
    plan::Plan p = driver::lower(sp, sp.space.default_config());
    cpu::CpuPlan cp = cpu::refine(p);
    ASSERT_TRUE(cp.gemms[0].bf16_pairs);
    EXPECT_EQ(cp.gemms[0].a.read, cpu::DotRead::PackInGroup);
    std::string code = backends::get("cpu").emit(p);
    EXPECT_NE(code.find("pack_a_pairs<dt::gemm::F32>"), std::string::npos);
    EXPECT_NE(code.find("pack_b_pairs<dt::gemm::F32>"), std::string::npos);
    expect_product_in_whole_and_ragged_blocks(k, x, y, sp.space.default_config());
  }
  ::unsetenv("DEUTERON_CXXFLAGS");
}

// A computed bf16 operand made before the dot's loop (as attention's scaled q) does not change
// in it: the dot packs it on the loop's first trip only, and every trip multiplies that copy.
TEST_P(DotPairs, ComputedOperandMadeBeforeTheLoopIsPackedOnce) {
  ::setenv("DEUTERON_CXXFLAGS", GetParam(), 1);
  static const auto k = deuteron::kernel("dot_bf16_packed_once", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({x.size(0), y.size(1)});
    for (auto tm : hl::tile(x.size(0))) {
      auto a = (x[{tm, hl::all}] * 2.0f).to(DType::bf16);
      for (auto tn : hl::tile(y.size(1))) out[{tm, tn}] = hl::dot(a, (y[{hl::all, tn}] * 0.5f).to(DType::bf16));
    }
    return out;
  });
  for (auto s : std::vector<std::vector<int64_t>>{{37, 29, 70}, {1, 1, 1}, {70, 33, 130}}) {
    Tensor x = Tensor::rand({s[0], s[1]}, DType::bf16, 24), y = Tensor::rand({s[1], s[2]}, DType::bf16, 25);
    auto sp = driver::specialize(k, frontend::describe_args(k, {x, y}), "cpu");
    for (int64_t block_n : {16, 64}) {  // several trips of the loop over N, or one
      config::Config c = sp.space.default_config();
      if (s[2] > block_n) c.set("block_t1", block_n);
      plan::Plan p = driver::lower(sp, c);
      cpu::CpuPlan cp = cpu::refine(p);
      ASSERT_TRUE(cp.gemms[0].bf16_pairs);
      EXPECT_TRUE(cp.gemms[0].a.pack_once);
      EXPECT_FALSE(cp.gemms[0].b.pack_once);  // y's block changes with the loop
      EXPECT_NE(backends::get("cpu").emit(p).find("if (o_t1 == begin_t1) dt::gemm::pack_a_pairs"), std::string::npos);
      auto r = api::run(k, {x, y}, "cpu", c);
      expect_close(r.outputs[0], product(x, y, 1, s[0], s[1], s[2]), 1e-5, r.config.dump());
    }
  }
  ::unsetenv("DEUTERON_CXXFLAGS");
}

// ---- mistakes -----------------------------------------------------------------------------------

template <typename F>
std::optional<KernelError> kernel_error(F&& f) {
  try {
    f();
  } catch (const KernelError& e) {
    return e;
  }
  return std::nullopt;
}

void expect_error_at(const std::optional<KernelError>& e, int line, const std::string& text) {
  ASSERT_TRUE(e) << "no KernelError";
  EXPECT_EQ(e->where(), fmt::format("test_dot.cpp:{}", line)) << e->what();
  EXPECT_NE(std::string(e->what()).find(text), std::string::npos) << e->what();
}

const Tensor m57 = Tensor::rand({5, 7}, DType::f32, 1);
const Tensor m79 = Tensor::rand({7, 9}, DType::f32, 2);

TEST(DotErrors, ContractionDimsDiffer) {
  auto k = deuteron::kernel("dot_mismatch", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({5, 9});
    for (auto [tm, tn] : hl::tile({5, 9})) {
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[{tm, tn}] = hl::dot(x[{tm, hl::all}], y[{tm, tn}]);  // y should be read with hl::all (K)
    }
    return out;
  });
  auto e = kernel_error([&] { k(m57, m79); });  // traced first: it records mistake_line
  expect_error_at(e, mistake_line, "contraction dims differ");
}

TEST(DotErrors, RankOneOperand) {
  auto k = deuteron::kernel("dot_rank1", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({5, 9});
    for (auto [tm, tn] : hl::tile({5, 9})) {
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[{tm, tn}] = hl::dot(x[{0, hl::all}], y[{hl::all, tn}]);
    }
    return out;
  });
  auto e = kernel_error([&] { k(m57, m79); });  // traced first: it records mistake_line
  expect_error_at(e, mistake_line, "rank 2 or more");
}

TEST(DotErrors, IntegerOperand) {
  auto k = deuteron::kernel("dot_int", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({5, 9});
    for (auto [tm, tn] : hl::tile({5, 9})) {
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[{tm, tn}] = hl::dot(x[{tm, hl::all}] > 0, y[{hl::all, tn}]);
    }
    return out;
  });
  auto e = kernel_error([&] { k(m57, m79); });  // traced first: it records mistake_line
  expect_error_at(e, mistake_line, "floating-point");
}

TEST(DotErrors, AccumulatorOfAnotherShape) {
  auto k = deuteron::kernel("dot_acc_shape", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({5, 9});
    for (auto [tm, tn] : hl::tile({5, 9})) {
      auto acc = hl::zeros({tn, tm});
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[{tm, tn}] = hl::dot(x[{tm, hl::all}], y[{hl::all, tn}], acc);
    }
    return out;
  });
  auto e = kernel_error([&] { k(m57, m79); });  // traced first: it records mistake_line
  expect_error_at(e, mistake_line, "accumulator");
}

}  // namespace
}  // namespace deuteron
