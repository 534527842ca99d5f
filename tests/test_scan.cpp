// Scans (hl::cumsum, hl::cumprod, hl::associative_scan) on every target (cpu; pallas under TPU
// interpret mode; triton under Triton's interpreter), at ragged lengths (not a power of two, so
// triton's blocks are padded) and at length 1, against references written here as plain loops
// in double precision (int64 for integers).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "backends/cpu/refine.h"
#include "deuteron/deuteron.h"
#include "driver/driver.h"
#include "test_support.h"

namespace deuteron {
namespace {

namespace hl = deuteron::hl;
using testing_support::ScopedEnv;

// The tests check values, not speed: every kernel runs its default config (no tuning).
const KernelOptions kUntuned{.effort = "none"};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Shapes [rows, cols]: ragged and size one. Interpret modes are slow per launch, not per element,
// so these stay small.
const std::vector<std::vector<int64_t>> kShapes = {{5, 37}, {1, 1}, {3, 1}, {1, 130}};

// The reference: an inclusive scan along each row in double, `f` folding the accumulated value
// with the next element (from the row's end when reversed).
template <typename F>
std::vector<double> scan_rows(const Tensor& x, bool reverse, F f) {
  int64_t rows = x.size(0), cols = x.size(1);
  std::vector<double> out(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (int64_t j = 0; j < cols; ++j) {
      int64_t c = reverse ? cols - 1 - j : j;
      double v = x.get(r * cols + c);
      acc = j == 0 ? v : f(acc, v);
      out[size_t(r * cols + c)] = acc;
    }
  }
  return out;
}

// Whether got equals want within `tol` (NaN only where NaN is wanted).
void expect_near_all(const Tensor& got, const std::vector<double>& want, const std::vector<double>& tol,
                     const std::string& what) {
  ASSERT_EQ(got.numel(), int64_t(want.size())) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = got.get(i), w = want[size_t(i)];
    bool ok = std::isnan(w) ? std::isnan(g) : g == w || std::abs(g - w) <= tol[size_t(i)];
    if (!ok && ++bad <= 5) ADD_FAILURE() << what << ": element " << i << " is " << g << ", want " << w;
  }
  EXPECT_EQ(bad, 0) << what;
}

// f32 sums: the tree scans (pallas, triton) round differently from the sequential one, each
// within a few ulps of the prefix's absolute sum.
std::vector<double> sum_tolerance(const Tensor& x, bool reverse) {
  Tensor a = Tensor::empty_like(x);
  for (int64_t i = 0; i < x.numel(); ++i) a.set(i, std::abs(x.get(i)));
  std::vector<double> t = scan_rows(a, reverse, [](double p, double q) { return p + q; });
  for (double& v : t) v = 4e-7 * v * 8 + 1e-30;
  return t;
}

class Scans : public testing::TestWithParam<std::string> {
 protected:
  ScopedEnv triton_device_{"DEUTERON_TRITON_DEVICE", "interpret"};
  std::string target() const { return GetParam(); }
  Outputs run(const KernelBase& k, const std::vector<Arg>& args) const { return api::run(k, args, target()).outputs; }
};

const auto cumsum_rows = deuteron::kernel("scan_cumsum_rows", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  auto back = hl::empty_like(x);
  for (auto tm : hl::tile(x.size(0))) {
    auto row = x[{tm, hl::all}];
    out[{tm, hl::all}] = hl::cumsum(row, 1);
    back[{tm, hl::all}] = hl::cumsum(row, -1, /*reverse=*/true);
  }
  return std::tuple{out, back};
}, kUntuned);

// The cpu's f32 cumsum: the double prefix sum rounded once to f32. Its SIMD prefix sums add in
// another order than a sequential loop (a tree within each vector, then the carry), which moves
// a double sum by at most n * 2^-52 times the prefix's absolute sum: so within half an f32 ulp
// of the sequential double sum plus that.
std::vector<double> rounded_once_tolerance(const Tensor& x, bool reverse) {
  Tensor a = Tensor::empty_like(x);
  for (int64_t i = 0; i < x.numel(); ++i) a.set(i, std::abs(x.get(i)));
  std::vector<double> mag = scan_rows(a, reverse, [](double p, double q) { return p + q; });
  std::vector<double> want = scan_rows(x, reverse, [](double p, double q) { return p + q; }), t(mag.size());
  for (size_t i = 0; i < t.size(); ++i) {
    double slack = double(x.size(1)) * 0x1p-52 * mag[i];
    int e = 0;
    std::frexp(std::abs(want[i]) + slack, &e);
    t[i] = 0.5 * std::ldexp(1.0, std::max(e, -125) - 24) + slack;  // half the f32 ulp there, plus the slack
  }
  return t;
}

TEST_P(Scans, CumsumF32ForwardAndReverse) {
  std::vector<std::vector<int64_t>> shapes = kShapes;
  if (target() == "cpu") shapes.push_back({3, 4099});  // long rows: f32 accumulation would be ulps off
  for (const auto& shape : shapes) {
    Tensor x = Tensor::rand(shape, DType::f32, 11, -2.0, 2.0);
    Outputs out = run(cumsum_rows, {x});
    auto add = [](double a, double b) { return a + b; };
    std::string at = fmt::format("{} at {}", target(), x.describe());
    expect_near_all(out[0], scan_rows(x, false, add), sum_tolerance(x, false), "cumsum " + at);
    expect_near_all(out[1], scan_rows(x, true, add), sum_tolerance(x, true), "reverse cumsum " + at);
    if (target() != "cpu") continue;
    // The cpu accumulates in double, as torch's CPU cumsum: the double prefix sum rounded once.
    for (int reverse = 0; reverse < 2; ++reverse)
      expect_near_all(out[size_t(reverse)], scan_rows(x, reverse, add), rounded_once_tolerance(x, reverse),
                      "cpu cumsum in double " + at);
  }
}

TEST_P(Scans, CumsumPropagatesNaNAndInf) {
  Tensor x = Tensor::rand({2, 9}, DType::f32, 3);
  x.set(3, kNaN);  // row 0 from column 3 on (reversed: up to column 3)
  x.set(9 + 5, std::numeric_limits<double>::infinity());
  Outputs out = run(cumsum_rows, {x});
  auto add = [](double a, double b) { return a + b; };
  expect_near_all(out[0], scan_rows(x, false, add), sum_tolerance(x, false), "cumsum with NaN on " + target());
  expect_near_all(out[1], scan_rows(x, true, add), sum_tolerance(x, true), "reverse cumsum with NaN on " + target());
}

// Integers accumulate in int64, as torch.cumsum; the inputs are bounded (& 1023) so that the
// TPU's 32-bit integers provably hold every prefix sum and pallas runs it too.
const auto cumsum_int = deuteron::kernel("scan_cumsum_int", [](hl::Tensor x) {
  auto out = hl::empty_like(x, DType::i32);
  auto dtype_is_i64 = hl::empty_like(x, DType::i32);
  for (auto tm : hl::tile(x.size(0))) {
    auto c = hl::cumsum(x[{tm, hl::all}] & 1023, 1);
    out[{tm, hl::all}] = c.to(DType::i32);
    dtype_is_i64[{tm, hl::all}] = hl::full({tm, x.size(1)}, c.dtype() == DType::i64 ? 1 : 0, DType::i32);
  }
  return std::tuple{out, dtype_is_i64};
}, kUntuned);

TEST_P(Scans, CumsumOfIntegersIsInt64AndExact) {
  for (const auto& shape : kShapes) {
    Tensor x = Tensor::rand(shape, DType::i32, 5, -100000.0, 100000.0);
    Tensor masked = Tensor::empty_like(x);
    for (int64_t i = 0; i < x.numel(); ++i) masked.set(i, double(int64_t(x.get(i)) & 1023));
    Outputs out = run(cumsum_int, {x});
    std::vector<double> want = scan_rows(masked, false, [](double a, double b) { return a + b; });
    expect_near_all(out[0], want, std::vector<double>(want.size(), 0.0), "int cumsum on " + target());
    for (int64_t i = 0; i < out[1].numel(); ++i) ASSERT_EQ(out[1].get(i), 1.0) << "hl::cumsum of int32 is not int64";
  }
}

// Beyond int32: exact int64 sums on the cpu and triton; pallas (32-bit integers) refuses it,
// naming the scan.
const auto cumsum_i64 = deuteron::kernel("scan_cumsum_i64", [](hl::Tensor x) {
  auto out = hl::empty_like(x, DType::i64);
  for (auto tm : hl::tile(x.size(0))) out[{tm, hl::all}] = hl::cumsum(x[{tm, hl::all}], 1);
  return out;
}, kUntuned);

TEST_P(Scans, CumsumOfLargeInt64IsExactOrRefused) {
  Tensor x = Tensor::zeros({2, 37}, DType::i64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<int64_t>()[i] = (int64_t(1) << 40) + i * 7 - 100;
  if (target() == "pallas") {
    try {
      run(cumsum_i64, {x});
      ADD_FAILURE() << "pallas ran an int64 cumsum beyond int32";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("int64"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("test_scan.cpp"), std::string::npos) << e.what();
    }
    return;
  }
  Tensor out = run(cumsum_i64, {x}).at(0);
  for (int64_t r = 0; r < 2; ++r) {
    int64_t acc = 0;
    for (int64_t c = 0; c < 37; ++c) {
      acc += x.data_as<int64_t>()[r * 37 + c];
      ASSERT_EQ(out.data_as<int64_t>()[r * 37 + c], acc) << "row " << r << " col " << c;
    }
  }
}

const auto cumprod_rows = deuteron::kernel("scan_cumprod_rows", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  auto back = hl::empty_like(x);
  for (auto tm : hl::tile(x.size(0))) {
    out[{tm, hl::all}] = x[{tm, hl::all}].cumprod(1);
    back[{tm, hl::all}] = hl::cumprod(x[{tm, hl::all}], 1, true);
  }
  return std::tuple{out, back};
}, kUntuned);

TEST_P(Scans, CumprodForwardAndReverse) {
  for (const auto& shape : kShapes) {
    Tensor x = Tensor::rand(shape, DType::f32, 7, 0.5, 1.5);
    Outputs out = run(cumprod_rows, {x});
    auto mul = [](double a, double b) { return a * b; };
    for (int reverse = 0; reverse < 2; ++reverse) {
      std::vector<double> want = scan_rows(x, reverse, mul), tol(want.size());
      for (size_t i = 0; i < want.size(); ++i) tol[i] = 2e-6 * double(shape[1]) * std::abs(want[i]);
      expect_near_all(out[size_t(reverse)], want, tol, fmt::format("cumprod reverse={} on {} at {}", reverse, target(), x.describe()));
    }
  }
}

// User combines: a running max (NaN propagates, as torch.cummax's values), and forward fill
// (the last positive value so far: associative but not commutative, so the argument order
// (accumulated, next) and the direction of a reverse scan show).
const auto user_scans = deuteron::kernel("scan_user", [](hl::Tensor x) {
  auto running_max = hl::empty_like(x);
  auto filled = hl::empty_like(x);
  auto filled_back = hl::empty_like(x);
  auto first = hl::empty_like(x);
  for (auto tm : hl::tile(x.size(0))) {
    auto row = x[{tm, hl::all}];
    running_max[{tm, hl::all}] =
        hl::associative_scan([](hl::Tensor a, hl::Tensor b) { return hl::maximum(a, b); }, row, 1);
    auto fill = [](hl::Tensor a, hl::Tensor b) { return hl::where(b > 0.0, b, a); };
    filled[{tm, hl::all}] = hl::associative_scan(fill, row, 1);
    filled_back[{tm, hl::all}] = hl::associative_scan(fill, row, 1, /*reverse=*/true);
    first[{tm, hl::all}] = hl::associative_scan([](hl::Tensor a, hl::Tensor) { return a; }, row, 1, true);
  }
  return std::tuple{running_max, filled, filled_back, first};
}, kUntuned);

TEST_P(Scans, UserCombineFunctions) {
  for (const auto& shape : kShapes) {
    Tensor x = Tensor::rand(shape, DType::f32, 13, -1.0, 1.0);
    if (x.numel() > 4) x.set(4, kNaN);
    Outputs out = run(user_scans, {x});
    std::string at = fmt::format(" on {} at {}", target(), x.describe());
    std::vector<double> exact(size_t(x.numel()), 0.0);
    auto maximum = [](double a, double b) { return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b); };
    auto fill = [](double a, double b) { return b > 0 ? b : a; };
    expect_near_all(out[0], scan_rows(x, false, maximum), exact, "running max" + at);
    expect_near_all(out[1], scan_rows(x, false, fill), exact, "forward fill" + at);
    expect_near_all(out[2], scan_rows(x, true, fill), exact, "reverse fill" + at);
    expect_near_all(out[3], scan_rows(x, true, [](double a, double) { return a; }), exact, "keep the last" + at);
  }
}

// A scan with reductions around it: the CDF of a softmax row (what sampling uses), and a
// column-wise cumsum (the scanned dim first in the block).
const auto softmax_cdf = deuteron::kernel("scan_softmax_cdf", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  for (auto tm : hl::tile(x.size(0))) {
    auto row = x[{tm, hl::all}];
    auto e = hl::exp(row - hl::amax(row, 1, true));
    out[{tm, hl::all}] = hl::cumsum(e, 1) / hl::sum(e, 1, true);
  }
  return out;
}, kUntuned);

TEST_P(Scans, ScanBetweenReductions) {
  for (const auto& shape : kShapes) {
    Tensor x = Tensor::rand(shape, DType::f32, 17, -3.0, 3.0);
    Tensor got = run(softmax_cdf, {x}).at(0);
    int64_t rows = shape[0], cols = shape[1];
    std::vector<double> want(size_t(rows * cols)), tol(want.size(), 2e-6);
    for (int64_t r = 0; r < rows; ++r) {
      double m = -INFINITY, total = 0, acc = 0;
      for (int64_t c = 0; c < cols; ++c) m = std::max(m, x.get(r * cols + c));
      for (int64_t c = 0; c < cols; ++c) total += std::exp(x.get(r * cols + c) - m);
      for (int64_t c = 0; c < cols; ++c) want[size_t(r * cols + c)] = (acc += std::exp(x.get(r * cols + c) - m)) / total;
    }
    expect_near_all(got, want, tol, fmt::format("softmax cdf on {} at {}", target(), x.describe()));
  }
}

const auto cumsum_columns = deuteron::kernel("scan_cumsum_columns", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  for (auto tn : hl::tile(x.size(1))) out[{hl::all, tn}] = hl::cumsum(x[{hl::all, tn}], 0, true);
  return out;
}, kUntuned);

TEST_P(Scans, CumsumAlongTheFirstDim) {
  for (const auto& shape : std::vector<std::vector<int64_t>>{{37, 5}, {1, 3}}) {
    Tensor x = Tensor::rand(shape, DType::f32, 19, -2.0, 2.0);
    Tensor got = run(cumsum_columns, {x}).at(0);
    int64_t rows = shape[0], cols = shape[1];
    std::vector<double> want(size_t(rows * cols)), tol(want.size());
    for (int64_t c = 0; c < cols; ++c) {
      double acc = 0, mag = 0;
      for (int64_t r = rows; r-- > 0;) {
        acc += x.get(r * cols + c);
        mag += std::abs(x.get(r * cols + c));
        want[size_t(r * cols + c)] = acc;
        tol[size_t(r * cols + c)] = 4e-6 * mag;
      }
    }
    expect_near_all(got, want, tol, fmt::format("column cumsum on {} at {}", target(), x.describe()));
  }
}

// Identical inputs give byte-identical code, which names the scan's line and its combine.
TEST_P(Scans, GeneratedCodeIsStableAndNamed) {
  Tensor x = Tensor::zeros({5, 37}, DType::f32);
  auto emit = [&] {
    auto s = driver::specialize(user_scans, frontend::describe_args(user_scans, {x}), target());
    return s.backend->emit(driver::lower(s, s.space.default_config()));
  };
  std::string a = emit(), b = emit();
  EXPECT_EQ(a, b);
  EXPECT_NE(a.find("test_scan.cpp"), std::string::npos);
  EXPECT_NE(a.find("associative_scan"), std::string::npos) << a;
  if (target() != "cpu") {
    EXPECT_NE(a.find("def _combine0("), std::string::npos) << a;
  }
  if (target() != "cpu") return;
  // An f32 cumsum along the row runs 8 rows at a time in double (a column one stays a sequential
  // loop); with a block of one row, that row alone runs as SIMD prefix sums.
  auto s = driver::specialize(cumsum_rows, frontend::describe_args(cumsum_rows, {x}), "cpu");
  std::string rows = s.backend->emit(driver::lower(s, s.space.default_config()));
  EXPECT_NE(rows.find("dt::cumsum_rows_f32_in_double("), std::string::npos) << rows;
  // Each scan writes its rows straight into its output, so neither result takes fast memory:
  // the plan counts none (x is read in place, and plain stores need no row buffer).
  config::Config cached = s.space.default_config();
  if (cached.has("stores")) cached.set("stores", "cached");
  cpu::CpuPlan plan = cpu::refine(driver::lower(s, cached));
  EXPECT_EQ(plan.scan_stores.size(), 2u);
  EXPECT_EQ(plan.fast_memory_bytes, 0) << cached.dump();
  config::Config one = s.space.default_config();
  for (const auto& [name, value] : one.values())
    if (name.rfind("block_", 0) == 0 && value.is_number_integer()) one.set(name, 1);
  std::string row = s.backend->emit(driver::lower(s, one));
  EXPECT_NE(row.find("dt::cumsum_f32_in_double("), std::string::npos) << row;
}

INSTANTIATE_TEST_SUITE_P(Cpu, Scans, testing::Values("cpu"));
INSTANTIATE_TEST_SUITE_P(Pallas, Scans, testing::Values("pallas"));
INSTANTIATE_TEST_SUITE_P(Triton, Scans, testing::Values("triton"));

// ---- errors ----------------------------------------------------------------------------------------

template <typename E = KernelError>
void expect_error(const KernelBase& k, const std::vector<Arg>& args, const std::string& part,
                  const std::optional<config::Config>& config = std::nullopt) {
  try {
    api::run(k, args, "cpu", config);
    ADD_FAILURE() << "no error; expected one saying '" << part << "'";
  } catch (const E& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(part), std::string::npos) << what;
    EXPECT_NE(what.find("test_scan.cpp"), std::string::npos) << what;
  }
}

TEST(ScanErrors, MisusedScansAreErrorsAtTheUsersLine) {
  Tensor x = Tensor::zeros({4, 6}, DType::f32);
  auto scan_kernel = [](auto fn) {
    return deuteron::kernel("scan_bad", [fn](hl::Tensor x) {
      auto out = hl::empty_like(x);
      for (auto tm : hl::tile(x.size(0))) out[{tm, hl::all}] = fn(x[{tm, hl::all}], x);
      return out;
    }, kUntuned);
  };
  // Along the tiled dim: each block holds only part of it.
  expect_error(scan_kernel([](hl::Tensor row, hl::Tensor) { return hl::cumsum(row, 0); }), {x},
               "that dim is tile t0");
  expect_error(scan_kernel([](hl::Tensor row, hl::Tensor) { return hl::cumsum(row, 2); }), {x},
               "along dim 2: the block [t0, 6] has 2 dims");
  // The combine function sees only its two arguments.
  expect_error(scan_kernel([](hl::Tensor row, hl::Tensor) {
                 return hl::associative_scan([&](hl::Tensor a, hl::Tensor b) { return a + b * row; }, row, 1);
               }),
               {x}, "uses a block value from outside it");
  expect_error(scan_kernel([](hl::Tensor row, hl::Tensor) {
                 return hl::associative_scan([](hl::Tensor a, hl::Tensor b) { return (a < b); }, row, 1);
               }),
               {x}, "returns bool, but the scan is over float32 values");
  expect_error(scan_kernel([](hl::Tensor row, hl::Tensor whole) {
                 return hl::associative_scan([&](hl::Tensor a, hl::Tensor) { return whole[{0, 0}] + a; }, row, 1);
               }),
               {x}, "a combine function computes elementwise on its two arguments");
}

// A config that splits the scanned dim into blocks (a looped reduction's) is refused, naming the
// scan's line and the block size to set; the config space never offers one.
TEST(ScanErrors, LoopedScanDimIsAConfigError) {
  Tensor x = Tensor::zeros({4, 300}, DType::f32);
  auto s = driver::specialize(cumsum_rows, frontend::describe_args(cumsum_rows, {x}), "cpu");
  for (const auto& t : s.space.tunables())
    if (t.name == "reduce_r0") {
      EXPECT_EQ(t.values.size(), 1u) << "the space offers a looped scan dim";
    }
  config::Config c = s.space.default_config();
  c.set("reduce_r0", 64);
  expect_error<ConfigError>(cumsum_rows, {x}, "illegal value 64 for 'reduce_r0' (the whole dim in one block: the scan at test_scan.cpp:", c);
}

}  // namespace
}  // namespace deuteron
