// Results that must be exact, not merely close: each kernel a factory makes runs its own code,
// integer arithmetic wraps as in PyTorch, integer constants keep every bit, and adds at
// gathered indices (scatter-add) land where the indices say.
#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "catalogue.h"
#include "deuteron/deuteron.h"
#include "driver/driver.h"

namespace deuteron {
namespace {

namespace hl = deuteron::hl;

// Kernels for the tests below never tune: the default config is enough, and fast.
KernelOptions untuned() {
  KernelOptions o;
  o.effort = "none";
  return o;
}

// ---- kernels made by a factory --------------------------------------------------------------

// Every kernel this makes is defined on the same source line, with the same name.
auto make_scale(double s) {
  return deuteron::kernel("scale_by", [s](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto t : hl::tile(x.sizes())) out[t] = x[t] * s;
    return out;
  }, untuned());
}

TEST(Exact, KernelsFromOneFactoryLineRunTheirOwnCode) {
  auto twice = make_scale(2.0);
  auto thrice = make_scale(3.0);
  for (std::vector<int64_t> shape : {std::vector<int64_t>{37}, {1}}) {
    Tensor x = Tensor::rand(shape, DType::f32, 1);
    Tensor a = twice(x), b = thrice(x), c = twice(x);
    for (int64_t i = 0; i < x.numel(); ++i) {
      EXPECT_EQ(a.get(i), float(x.get(i) * 2.0)) << i;
      EXPECT_EQ(b.get(i), float(x.get(i) * 3.0)) << i;
      EXPECT_EQ(c.get(i), float(x.get(i) * 2.0)) << i;
    }
    // Through the driver (what the CLI and the tuner use) as well.
    auto r = api::run(thrice, {x}, "cpu", config::Config());
    EXPECT_EQ(r.outputs[0].get(0), float(x.get(0) * 3.0));
  }
}

// Kernels that differ only in where a constant slice starts: their IR must differ too (it
// printed both as `:`), or they would share one compiled kernel.
auto make_window(int64_t start) {
  return deuteron::kernel("window", [start](hl::Tensor x) {
    auto out = hl::empty({x.size(0), 3});
    for (auto t : hl::tile(x.size(0))) out[{t, hl::all}] = x[{t, hl::slice(start, start + 3)}];
    return out;
  }, untuned());
}

TEST(Exact, KernelsDifferingInASliceOffsetRunTheirOwnCode) {
  auto first = make_window(0), second = make_window(2);
  Tensor x = Tensor::rand({5, 6}, DType::f32, 2);
  Tensor a = first(x), b = second(x);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(a.get(i * 3 + j), x.get(i * 6 + j)) << i << ", " << j;
      EXPECT_EQ(b.get(i * 3 + j), x.get(i * 6 + j + 2)) << i << ", " << j;
    }
  auto s = driver::specialize(second, frontend::describe_args(second, {x}), "cpu");
  EXPECT_NE(ir::print(s.ir).find("load arg0[t0, 2:5]"), std::string::npos) << ir::print(s.ir);
  std::string plan = plan::print(driver::lower(s, s.space.default_config()));
  EXPECT_NE(plan.find("index map (t0, 2:5)"), std::string::npos) << plan;
}

// ---- integers -------------------------------------------------------------------------------

// The elements of an integer tensor, exactly (Tensor::get goes through a double).
template <typename T>
std::vector<T> elements(const Tensor& t) {
  std::vector<T> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data(), v.size() * sizeof(T));
  return v;
}

// (i + 1) * c and its friends, wrapping modulo 2^64 as PyTorch's int64 arithmetic does.
int64_t wrap_mul(int64_t a, int64_t b) { return int64_t(uint64_t(a) * uint64_t(b)); }
int64_t wrap_add(int64_t a, int64_t b) { return int64_t(uint64_t(a) + uint64_t(b)); }
int32_t wrap_mul32(int32_t a, int32_t b) { return int32_t(uint32_t(a) * uint32_t(b)); }

// Signed overflow was undefined behaviour in the generated C++ (g++ -O3 assumed it away and
// left 968 of 1000 outputs unwritten); it wraps, on int64 and int32 alike.
TEST(Exact, IntegerArithmeticWraps) {
  static const auto k = deuteron::kernel("wrapping", [](hl::Tensor x, hl::Tensor y) {
    auto prod = hl::empty({x.size(0)}, DType::i64), neg = hl::empty({x.size(0)}, DType::i64),
         small = hl::empty({x.size(0)}, DType::i32), total = hl::empty({1}, DType::i64);
    for (auto t : hl::tile(x.size(0))) {
      prod[t] = (t.index() + 1) * 4611686018427387904LL;
      neg[t] = -(x[t] - 1) + hl::abs(x[t]);  // INT64_MIN - 1, and -INT64_MIN, wrap
      small[t] = y[t] * y[t] + 2147483647;
    }
    return std::make_tuple(prod, neg, small);
  }, untuned());
  static const auto sum = deuteron::kernel("wrapping_sum", [](hl::Tensor x) {
    auto total = hl::empty({1}, DType::i64);
    for (auto g : hl::grid(1)) total[{g}] = x[{hl::all}].sum(0);  // wraps past INT64_MAX
    return total;
  }, untuned());
  for (int64_t n : {1000, 1, 37}) {
    Tensor x = Tensor::empty({n}, DType::i64), y = Tensor::empty({n}, DType::i32);
    for (int64_t i = 0; i < n; ++i) {
      x.data_as<int64_t>()[i] = i % 2 ? INT64_MIN : INT64_MAX - i;
      y.data_as<int32_t>()[i] = int32_t(i * 46341);
    }
    Outputs r = k(x, y);
    auto prod = elements<int64_t>(r[0]), neg = elements<int64_t>(r[1]), total = elements<int64_t>(sum(x));
    auto small = elements<int32_t>(r[2]);
    auto xs = elements<int64_t>(x);
    auto ys = elements<int32_t>(y);
    int64_t want_total = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = xs[size_t(i)];
      EXPECT_EQ(prod[size_t(i)], wrap_mul(i + 1, int64_t(1) << 62)) << i;
      int64_t abs_v = v < 0 ? int64_t(0 - uint64_t(v)) : v;
      EXPECT_EQ(neg[size_t(i)], wrap_add(int64_t(0 - uint64_t(wrap_add(v, -1))), abs_v)) << i;
      int32_t w = ys[size_t(i)];
      EXPECT_EQ(small[size_t(i)], int32_t(uint32_t(wrap_mul32(w, w)) + 2147483647u)) << i;
      want_total = wrap_add(want_total, v);
    }
    EXPECT_EQ(total[0], want_total);
  }
}

// Integer constants are exact: 6364136223846793005 as a double is ...216.
TEST(Exact, IntegerConstantsKeepEveryBit) {
  static const auto k = deuteron::kernel("lcg", [](hl::Tensor x) {
    auto out = hl::empty({x.size(0)}, DType::i64), filled = hl::full({2}, 9007199254740993LL, DType::i64);
    for (auto t : hl::tile(x.size(0))) {
      out[t] = (t.index() + 1) * 6364136223846793005LL + 1442695040888963407LL +
               hl::where(x[t] > 0, INT64_MIN, 9007199254740993LL);
      hl::atomic_add(filled, {0}, hl::full({t}, 0, DType::i64).sum(0));
    }
    return std::make_tuple(out, filled);
  }, untuned());
  for (int64_t n : {1, 130}) {
    Tensor x = Tensor::rand({n}, DType::f32, 3);
    Outputs r = k(x);
    auto out = elements<int64_t>(r[0]);
    for (int64_t i = 0; i < n; ++i) {
      int64_t pick = x.get(i) > 0 ? INT64_MIN : 9007199254740993LL;
      EXPECT_EQ(out[size_t(i)], wrap_add(wrap_add(wrap_mul(i + 1, 6364136223846793005LL), 1442695040888963407LL), pick))
          << i;
    }
    EXPECT_EQ(elements<int64_t>(r[1]), (std::vector<int64_t>{9007199254740993LL, 9007199254740993LL}));
  }
}

// An int32 max started from INT64_MIN, which int32 holds as 0: a row of negatives gave 0.
TEST(Exact, Int32ReductionsStartFromTheirOwnLimits) {
  static const auto k = deuteron::kernel("int32_extremes", [](hl::Tensor x) {
    auto mx = hl::empty({x.size(0)}, DType::i32), mn = hl::empty({x.size(0)}, DType::i32);
    for (auto t : hl::tile(x.size(0))) {
      mx[t] = x[{t, hl::all}].amax(1);
      mn[t] = x[{t, hl::all}].amin(1);
    }
    return std::make_tuple(mx, mn);
  }, untuned());
  Tensor x = Tensor::rand({3, 50}, DType::i32, 8, -1000, -1);
  x.set(1 * 50 + 7, double(INT32_MIN));
  Outputs r = k(x);
  for (int64_t i = 0; i < 3; ++i) {
    double mx = -1e300, mn = 1e300;
    for (int64_t j = 0; j < 50; ++j) {
      mx = std::max(mx, x.get(i * 50 + j));
      mn = std::min(mn, x.get(i * 50 + j));
    }
    EXPECT_EQ(r[0].get(i), mx) << i;
    EXPECT_EQ(r[1].get(i), mn) << i;
  }
}

// A float number with an integer block promotes to f32, as in torch (inf and 0.5 are no
// integers); an integral one keeps the block's dtype.
TEST(Exact, FloatNumbersWithIntegerBlocksPromote) {
  static const auto k = deuteron::kernel("int_plus_floats", [](hl::Tensor x) {
    auto a = hl::empty_like(x, DType::f32), b = hl::empty_like(x, DType::f32), c = hl::empty_like(x);
    for (auto t : hl::tile(x.size(0))) {
      auto inf = x[t] + INFINITY, half = x[t] * 0.5, two = x[t] * 2.0;
      EXPECT_EQ(inf.dtype(), DType::f32);
      EXPECT_EQ(half.dtype(), DType::f32);
      EXPECT_EQ(two.dtype(), DType::i64);
      a[t] = inf;
      b[t] = half;
      c[t] = two;
    }
    return std::make_tuple(a, b, c);
  }, untuned());
  Tensor x = Tensor::rand({5}, DType::i64, 3, -10, 10);
  Outputs r = k(x);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(r[0].get(i), INFINITY);
    EXPECT_EQ(r[1].get(i), x.get(i) * 0.5);
    EXPECT_EQ(r[2].get(i), x.get(i) * 2);
  }
}

// A constant that its dtype cannot hold is an error at the user's line, not a silent wrap.
TEST(Exact, ConstantsOutsideTheirDtypeAreErrors) {
  static const auto k = deuteron::kernel("too_big", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto t : hl::tile(x.size(0))) out[t] = x[t] + 3000000000LL;  // x is int32
    return out;
  }, untuned());
  try {
    k(Tensor::zeros({4}, DType::i32));
    ADD_FAILURE() << "no error";
  } catch (const KernelError& e) {
    EXPECT_NE(std::string(e.what()).find("the constant 3000000000 does not fit int32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test_exact.cpp"), std::string::npos) << e.what();
  }
}

// Integer scalar arguments keep every bit, beyond 2^53 too: they reach the generated code as
// 64-bit integers (dt::Scalar), never through a double. 2^53 + 1 as a double is 2^53.
TEST(Exact, IntegerScalarsKeepEveryBit) {
  static const auto k = deuteron::kernel("add_scalar", [](hl::Tensor x, hl::Scalar s) {
    auto out = hl::empty_like(x), scaled = hl::empty_like(x);
    for (auto t : hl::tile(x.size(0))) {
      out[t] = x[t] + s;
      scaled[t] = (t.index() + 1) * s;
    }
    return std::make_tuple(out, scaled);
  }, untuned());
  for (int64_t n : {1, 37}) {
    Tensor x = Tensor::rand({n}, DType::i64, 3, -1000, 1000);
    auto xs = elements<int64_t>(x);
    for (int64_t s : {(int64_t(1) << 53) + 1, int64_t(6364136223846793005LL), -(int64_t(1) << 53) - 3, int64_t(INT64_MIN)}) {
      Outputs r = k(x, s);
      auto out = elements<int64_t>(r[0]), scaled = elements<int64_t>(r[1]);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(out[size_t(i)], wrap_add(xs[size_t(i)], s)) << "s " << s << " at " << i;
        EXPECT_EQ(scaled[size_t(i)], wrap_mul(i + 1, s)) << "s " << s << " at " << i;
      }
    }
  }
}

// ---- scatter-add ----------------------------------------------------------------------------

// Adds at gathered indices: a histogram-style sum into 4 bins, and an embedding backward (rows
// of grad added into the rows of a table that ids pick). Both fail to compile before the fix:
// the `#pragma omp atomic` came before the index load.
TEST(Exact, ScatterAddAtGatheredIndices) {
  static const auto bins = deuteron::kernel("bin_sums", [](hl::Tensor x, hl::Tensor idx) {
    auto out = hl::zeros({4});
    auto count = hl::zeros({4}, DType::i64);
    for (auto t : hl::tile(x.size(0))) {
      hl::atomic_add(out, {idx[t]}, x[t]);
      hl::atomic_add(count, {idx[t]}, hl::full({t}, 1, DType::i64));
    }
    return std::make_tuple(out, count);
  }, untuned());
  static const auto embedding_bwd = deuteron::kernel("embedding_bwd", [](hl::Tensor grad, hl::Tensor ids) {
    auto table = hl::zeros({5, grad.size(1)});
    for (auto t : hl::tile(grad.size(0))) hl::atomic_add(table, {ids[t], hl::all}, grad[{t, hl::all}]);
    return table;
  }, untuned());
  for (int64_t n : {1, 37, 1000}) {
    Tensor x = Tensor::rand({n}, DType::f32, 4), idx = Tensor::rand({n}, DType::i64, 5, 0, 4);
    for (int threads : {1, 2}) {
      config::Config cfg;
      cfg.set("num_threads", threads);
      auto r = api::run(bins, {x, idx}, "cpu", cfg);
      std::vector<double> want(4, 0.0);
      std::vector<int64_t> count(4, 0);
      for (int64_t i = 0; i < n; ++i) {
        want[size_t(idx.get(i))] += x.get(i);
        ++count[size_t(idx.get(i))];
      }
      for (size_t b = 0; b < 4; ++b) EXPECT_NEAR(r.outputs[0].get(int64_t(b)), want[b], 1e-5 * double(n)) << b;
      EXPECT_EQ(elements<int64_t>(r.outputs[1]), count);
    }
    Tensor grad = Tensor::rand({n, 3}, DType::f32, 6), ids = Tensor::rand({n}, DType::i64, 7, 0, 5);
    Tensor table = embedding_bwd(grad, ids);
    for (int64_t row = 0; row < 5; ++row)
      for (int64_t c = 0; c < 3; ++c) {
        double want = 0;
        for (int64_t i = 0; i < n; ++i)
          if (int64_t(ids.get(i)) == row) want += grad.get(i * 3 + c);
        EXPECT_NEAR(table.get(row * 3 + c), want, 1e-5 * double(n)) << row << ", " << c;
      }
  }
}

// An index outside the target fails the launch naming the value, the dim and the line, as a
// gather's does, instead of adding out of bounds.
TEST(Exact, ScatterAddChecksItsIndices) {
  static const auto k = deuteron::kernel("bin_sums_checked", [](hl::Tensor x, hl::Tensor idx) {
    auto out = hl::zeros({4});
    for (auto t : hl::tile(x.size(0))) hl::atomic_add(out, {idx[t]}, x[t]);
    return out;
  }, untuned());
  Tensor x = Tensor::rand({37}, DType::f32, 4), idx = Tensor::rand({37}, DType::i64, 5, 0, 4);
  for (int64_t bad : {4, -1}) {
    idx.set(20, double(bad));
    try {
      k(x, idx);
      ADD_FAILURE() << "no error for index " << bad;
    } catch (const RuntimeError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find(fmt::format("{}", bad)), std::string::npos) << what;
      EXPECT_NE(what.find("dim 0 of out0 (size 4)"), std::string::npos) << what;
      EXPECT_NE(what.find("test_exact.cpp"), std::string::npos) << what;
    }
  }
}

// ---- run-to-run determinism ------------------------------------------------------------------

// The bytes of every output of `r`.
std::vector<std::string> output_bytes(const Outputs& r) {
  std::vector<std::string> out;
  for (const Tensor& t : r) out.emplace_back(static_cast<const char*>(t.data()), size_t(t.nbytes()));
  return out;
}

// Kernels summing floats with hl::atomic_add gave different low bits on every 2-thread run (9
// distinct losses in 30). By default their sums run in a fixed order: the same bits every run.
TEST(Exact, AtomicAddSumsAreTheSameOnEveryRun) {
  for (const char* name : {"cross_entropy", "rms_norm_bwd"}) {
    const examples::Entry& e = examples::find(name);
    std::vector<Arg> args = e.inputs({2048, 1000}, DType::f32, 3);
    config::Config cfg;
    cfg.set("num_threads", 2);
    cfg.set("block_rows", 8);
    auto first = api::run(*e.kernel, args, "cpu", cfg);
    std::vector<std::string> want = output_bytes(first.outputs);
    int differing = 0;
    for (int run = 0; run < 20; ++run) differing += output_bytes(api::run(*e.kernel, args, "cpu", cfg).outputs) != want;
    EXPECT_EQ(differing, 0) << name << ": runs whose outputs differ from the first";
    auto s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "cpu");
    std::string code = s.backend->emit(driver::lower(s, cfg));
    EXPECT_EQ(code.find("omp atomic"), std::string::npos) << code;
  }
}

// The choice is the kernel's (KernelOptions::atomic_add): "atomic" keeps atomic adds, "auto"
// orders them while each thread's copies stay within 1 MiB, an unknown name is an error.
TEST(Exact, AtomicAddOrderIsAnOption) {
  auto column_sums = [](std::string mode) {
    KernelOptions o = untuned();
    o.atomic_add = std::move(mode);
    return deuteron::kernel("column_sums_mode", [](hl::Tensor x) {
      auto sums = hl::zeros({x.size(1)});
      for (auto tm : hl::tile(x.size(0))) hl::atomic_add(sums, {hl::all}, x[{tm, hl::all}].sum(0));
      return sums;
    }, o);
  };
  auto scatter = [](std::string mode) {  // into a table of 1 MiB + 4 bytes
    KernelOptions o = untuned();
    o.atomic_add = std::move(mode);
    return deuteron::kernel("big_scatter_mode", [](hl::Tensor x, hl::Tensor idx) {
      auto table = hl::zeros({(1 << 18) + 1});
      for (auto t : hl::tile(x.size(0))) hl::atomic_add(table, {idx[t]}, x[t]);
      return table;
    }, o);
  };
  auto code = [](const KernelBase& k, const std::vector<Arg>& args) {
    auto s = driver::specialize(k, frontend::describe_args(k, args), "cpu");
    return s.backend->emit(driver::lower(s, s.space.default_config()));
  };
  Tensor small = Tensor::rand({8, 300}, DType::f32, 1);
  std::vector<Arg> sparse = {Tensor::zeros({16}, DType::f32), Tensor::zeros({16}, DType::i64)};
  EXPECT_NE(code(column_sums("atomic"), {small}).find("#pragma omp atomic update"), std::string::npos);
  EXPECT_EQ(code(column_sums("auto"), {small}).find("#pragma omp atomic update"), std::string::npos);
  EXPECT_EQ(code(scatter("ordered"), sparse).find("#pragma omp atomic update"), std::string::npos);
  EXPECT_NE(code(scatter("auto"), sparse).find("#pragma omp atomic update"), std::string::npos)
      << "a copy of 1 MiB + 4 bytes per thread is not cheap";
  for (const char* mode : {"atomic", "ordered"}) {
    Tensor got = column_sums(mode)(small);
    for (int64_t j = 0; j < 300; ++j) {
      double want = 0;
      for (int64_t i = 0; i < 8; ++i) want += small.get(i * 300 + j);
      EXPECT_NEAR(got.get(j), want, 1e-5) << mode << " column " << j;
    }
  }
  EXPECT_THROW(column_sums("sometimes")(small), ArgumentError);
}

}  // namespace
}  // namespace deuteron
