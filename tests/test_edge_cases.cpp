// The catalogue on the inputs where numerics go wrong: -inf, inf and NaN, values near the f32
// limit (+-3e38), denormals, constant rows and masked (all -inf) leading blocks. Expected
// values are float64 loops or literals written here, and PyTorch's semantics where f32 cannot
// give the float64 answer (noted where so).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "backends/pallas/backend.h"
#include "backends/python/runner.h"
#include "backends/triton/backend.h"
#include "catalogue.h"
#include "config_fit.h"
#include "driver/driver.h"
#include "test_support.h"

namespace deuteron {
namespace {

namespace hl = deuteron::hl;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor tensor_of(const std::vector<double>& v, std::vector<int64_t> shape, DType dt = DType::f32) {
  Tensor t = Tensor::empty(std::move(shape), dt);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v[size_t(i)]);
  return t;
}

using testing_support::fit;

Outputs run(const std::string& kernel, const std::vector<Arg>& args, const std::map<std::string, int64_t>& blocks = {},
            const std::string& target = "cpu") {
  const examples::Entry& e = examples::find(kernel);
  return api::run(*e.kernel, args, target, fit(*e.kernel, args, blocks)).outputs;
}

// Element-wise: NaN where NaN is expected, else within `tol` relative (and absolute).
void expect_values(const Tensor& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.numel(), int64_t(want.size())) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = got.get(i), w = want[size_t(i)];
    bool ok = std::isnan(w) ? std::isnan(g) : std::isinf(w) ? g == w : std::abs(g - w) <= tol * (1 + std::abs(w));
    if (!ok && bad++ < 4) ADD_FAILURE() << what << " [" << i << "]: got " << g << ", want " << w;
  }
  EXPECT_EQ(bad, 0) << what << ": elements off";
}

// ---- the reproducers of issue 14 ------------------------------------------------------------

// A first block of -inf (left padding, a masked prefix) made the online softmax NaN:
// exp(-inf - -inf).
TEST(EdgeCases, OnlineSoftmaxSkipsAMaskedLeadingBlock) {
  Tensor x = tensor_of({-kInf, -kInf, -kInf, -kInf, 0, 0, 0, 0}, {1, 8});
  for (int64_t b : {4, 2, 8}) {
    Outputs r = run("softmax_two_pass", {x}, {{"block_n", b}, {"block_n_out", b}});
    expect_values(r[0], {0, 0, 0, 0, .25, .25, .25, .25}, 1e-7, fmt::format("column blocks of {}", b));
  }
}

// The same in flash attention: the first key block's scores are all -inf (keys of -inf).
TEST(EdgeCases, FlashAttentionSkipsAMaskedLeadingKeyBlock) {
  int64_t s = 8, d = 4;
  Tensor q = Tensor::empty({1, 1, s, d}, DType::f32), k = Tensor::empty({1, 1, s, d}, DType::f32),
         v = Tensor::empty({1, 1, s, d}, DType::f32);
  for (int64_t i = 0; i < s * d; ++i) {
    q.set(i, 1.0);
    k.set(i, i / d < 4 && i % d == 0 ? -kInf : 0.0);  // keys 0-3 score -inf, keys 4-7 score 0
    v.set(i, double(i));
  }
  for (const char* kernel : {"attention", "attention_causal"}) {
    Outputs r = run(kernel, {q, k, v}, {{"block_kv", 4}, {"block_q", 4}});
    std::vector<double> want(size_t(s * d));
    for (int64_t i = 0; i < s; ++i)
      for (int64_t c = 0; c < d; ++c) {
        // Uniform weights over the keys 4..last the query may see (causal: up to itself).
        int64_t last = std::string(kernel) == "attention" ? s - 1 : i;
        double sum = 0;
        for (int64_t j = 4; j <= last; ++j) sum += double(j * d + c);
        want[size_t(i * d + c)] = last < 4 ? kNaN : sum / double(last - 3);  // all masked: NaN, as torch
      }
    expect_values(r[0], want, 1e-6, kernel);
  }
}

// A constant row goes to the bias (the mean must be exactly the constant, and no sum may
// overflow on the way): torch gives 0 for weight 1, bias 0.
TEST(EdgeCases, LayerNormSendsAConstantRowToTheBias) {
  for (const char* kernel : {"layer_norm", "welford"})
    for (double c : {10000.3, 3.3, 3e38, -3e38, 1e-40})
      for (int64_t n : {1000, 1, 4096}) {
        Tensor x = Tensor::empty({2, n}, DType::f32), w = Tensor::empty({n}, DType::f32),
               b = Tensor::empty({n}, DType::f32);
        for (int64_t i = 0; i < 2 * n; ++i) x.set(i, c);
        for (int64_t j = 0; j < n; ++j) {
          w.set(j, 1.0 + double(j % 7));
          b.set(j, double(j % 5) - 2.0);
        }
        std::vector<Arg> args = std::string(kernel) == "welford" ? std::vector<Arg>{w, b, x}
                                                                   : std::vector<Arg>{x, w, b, 1e-5};
        Outputs r = run(kernel, args, std::string(kernel) == "welford" ? std::map<std::string, int64_t>{{"block_n", 128}, {"block_n_out", 128}}
                                                                     : std::map<std::string, int64_t>{});
        std::vector<double> want;
        for (int64_t i = 0; i < 2 * n; ++i) want.push_back(b.get(i % n));
        expect_values(r[0], want, 0, fmt::format("{}: rows of {} x {}", kernel, n, c));
      }
}

// log(sum) + max - picked cancels for large logits; log(sum) - (picked - max) does not.
TEST(EdgeCases, CrossEntropyKeepsPrecisionForLargeLogits) {
  for (double c : {1e4, -1e4, 3e38}) {
    Tensor logits = Tensor::empty({3, 1003}, DType::f32), labels = Tensor::empty({3}, DType::i64);
    for (int64_t i = 0; i < logits.numel(); ++i) logits.set(i, c);
    for (int64_t i = 0; i < 3; ++i) labels.set(i, double(i * 500));
    Outputs r = run("cross_entropy", {logits, labels, int64_t(-100)});
    EXPECT_NEAR(r[0].get(0), std::log(1003.0), 2e-6) << c;
  }
}

// Rows whose label is ignore_index (torch's default -100) count neither in the sum nor in the
// mean's denominator; with every row ignored the mean is 0 / 0, NaN, as in torch.
TEST(EdgeCases, CrossEntropyIgnoresRowsLabelledIgnoreIndex) {
  int64_t n = 37, v = 11;
  Tensor logits = Tensor::rand({n, v}, DType::f32, 5, -3, 3);
  for (int64_t ignore : {-100, 4}) {
    Tensor labels = Tensor::rand({n}, DType::i64, 6, 0, double(v));
    for (int64_t i = 0; i < n; i += 3) labels.set(i, double(ignore));
    double total = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t label = int64_t(labels.get(i));
      if (label == ignore) continue;
      double mx = -kInf, sum = 0;
      for (int64_t j = 0; j < v; ++j) mx = std::max(mx, logits.get(i * v + j));
      for (int64_t j = 0; j < v; ++j) sum += std::exp(logits.get(i * v + j) - mx);
      total += std::log(sum) + mx - logits.get(i * v + label);
      ++count;
    }
    Outputs r = run("cross_entropy", {logits, labels, ignore}, {{"block_rows", 8}});
    EXPECT_NEAR(r[0].get(0), total / double(count), 1e-5) << "ignore_index " << ignore;
    // Any other label outside the classes still fails, as a gather does.
    labels.set(1, ignore == 4 ? -100 : -1);
    EXPECT_THROW(run("cross_entropy", {logits, labels, ignore}), RuntimeError) << "ignore_index " << ignore;
  }
  Tensor all_ignored = Tensor::empty({n}, DType::i64);
  for (int64_t i = 0; i < n; ++i) all_ignored.set(i, -100);
  EXPECT_TRUE(std::isnan(run("cross_entropy", {logits, all_ignored, int64_t(-100)})[0].get(0)));
}

// torch.amax / amin propagate NaN, as hl::maximum does.
const auto row_extremes = deuteron::kernel("row_extremes", [](hl::Tensor x) {
  auto mx = hl::empty({x.size(0)}), mn = hl::empty({x.size(0)});
  for (auto tm : hl::tile(x.size(0))) {
    auto row = x[{tm, hl::all}];
    mx[{tm}] = row.amax(1);
    mn[{tm}] = hl::amin(row, 1);
  }
  return std::make_tuple(mx, mn);
});
const auto column_extremes = deuteron::kernel("column_extremes", [](hl::Tensor x) {
  auto mx = hl::empty({x.size(1)});
  for (auto tn : hl::tile(x.size(1))) mx[{tn}] = x[{hl::all, tn}].amax(0);  // a reduction over a non-inner dim
  return mx;
});

void check_extremes(const std::string& target) {
  int64_t m = 5, n = 37;
  Tensor x = Tensor::rand({m, n}, DType::f32, 9);
  x.set(0 * n + 3, kNaN);       // row 0: a NaN among finite values
  x.set(1 * n + n - 1, kNaN);   // row 1: NaN last
  x.set(2 * n + 0, kNaN);       // row 2: NaN first
  x.set(3 * n + 5, kInf);       // row 3: inf, no NaN
  std::vector<double> mx, mn, cmx(size_t(n), -kInf);
  for (int64_t i = 0; i < m; ++i) {
    double a = -kInf, b = kInf;
    bool nan = false;
    for (int64_t j = 0; j < n; ++j) {
      double v = x.get(i * n + j);
      nan |= std::isnan(v);
      a = std::max(a, v);
      b = std::min(b, v);
      cmx[size_t(j)] = std::isnan(v) || std::isnan(cmx[size_t(j)]) ? kNaN : std::max(cmx[size_t(j)], v);
    }
    mx.push_back(nan ? kNaN : a);
    mn.push_back(nan ? kNaN : b);
  }
  const std::map<std::string, int64_t> blocks = {{"block_t0", 8}};
  auto r = api::run(row_extremes, {x}, target, fit(row_extremes, {x}, blocks));
  expect_values(r.outputs[0], mx, 0, target + " amax");
  expect_values(r.outputs[1], mn, 0, target + " amin");
  if (target == "cpu") {
    auto c = api::run(column_extremes, {x}, target, fit(column_extremes, {x}, {{"block_t0", 8}}));
    expect_values(c.outputs[0], cmx, 0, target + " column amax");
  }
}

// A division by a value the row loop holds fixed (a row's sum) multiplies by its reciprocal
// where that is a normal float, and divides where it is not: a sum of 0, inf or NaN, a tiny
// one whose reciprocal overflows, a huge one whose reciprocal is subnormal. Every quotient is
// within 1.5 ulp of the correctly rounded one, and the special ones are IEEE's.
TEST(EdgeCases, DivisionByARowsSumIsIeeesForEverySum) {
  static const auto normalize = deuteron::kernel("row_normalize", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto tm : hl::tile(x.size(0))) {
      auto row = x[{tm, hl::all}];
      out[{tm, hl::all}] = row / row.sum(1, true);
    }
    return out;
  });
  const int64_t n = 67;  // a row loop long enough for two versions, and ragged
  std::vector<std::vector<double>> rows;
  auto row_of = [&](std::map<int64_t, double> at) {
    std::vector<double> r(size_t(n), 0.0);
    for (auto [i, v] : at) r[size_t(i)] = v;
    rows.push_back(r);
  };
  std::vector<double> small(static_cast<size_t>(n));  // small integers: the f32 sum is exact
  for (int64_t i = 0; i < n; ++i) small[size_t(i)] = double(1 + (i * 7) % 9);
  rows.push_back(small);
  for (double& v : small) v = -v;
  rows.push_back(small);
  row_of({});                                  // 0 / 0
  row_of({{3, 1.0}, {60, -1.0}});              // a sum of +0: +-inf and NaN
  row_of({{5, std::ldexp(1.0, -133)}});        // subnormal sum: 1 / sum overflows
  row_of({{5, std::ldexp(1.0, -127)}});        // subnormal sum with a normal reciprocal
  row_of({{5, 3e38}, {66, 1.0}});              // 1 / sum is subnormal
  row_of({{0, kInf}, {1, 2.0}});               // inf / inf and 2 / inf
  row_of({{2, kNaN}, {3, 1.0}});
  const int64_t m = int64_t(rows.size());
  std::vector<double> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  Tensor x = tensor_of(flat, {m, n});
  auto s = driver::specialize(normalize, frontend::describe_args(normalize, {x}), "cpu");
  config::Config c = s.space.default_config();
  c.set("stores", "cached");  // no machine's L3 size may stage the rows for streaming instead
  ASSERT_NE(s.backend->emit(driver::lower(s, c)).find("dt::is_normal("), std::string::npos)
      << "the multiplying version is not generated: this test would not cover it";
  Tensor got = api::run(normalize, {x}, "cpu", c).outputs[0];
  for (int64_t r = 0; r < m; ++r) {
    double sum = 0;
    for (double v : rows[size_t(r)]) sum += v;  // exact for these rows
    for (int64_t i = 0; i < n; ++i) {
      double q = rows[size_t(r)][size_t(i)] / sum;
      float want = float(q), g = float(got.get(r * n + i));
      std::string at = fmt::format("row {} (sum {}), element {}", r, sum, i);
      if (std::isnan(want) || std::isinf(want) || want == 0.0f) {
        EXPECT_TRUE(std::isnan(want) ? std::isnan(g) : g == want && std::signbit(g) == std::signbit(want))
            << at << ": got " << g << ", want " << want;
      } else {
        float ulp = std::nextafter(std::abs(want), std::numeric_limits<float>::infinity()) - std::abs(want);
        EXPECT_LE(std::abs(double(g) - q), 1.5 * ulp) << at << ": got " << g << ", want " << want;
      }
    }
  }
}

// A pass that computes what an earlier pass over the row computed reads the values that pass
// kept (cpu: KeptValue) only where the row values both take have the same bits. Here the sum's
// pass takes exp(x - lo) and the output's exp(x - hi), with hi = lo where lo >= 0 and 0 where
// lo < 0: rows with a negative shift must compute their exponentials again. Rows of 67 (ragged)
// and of 1, one and four rows per block.
TEST(EdgeCases, AKeptValueIsReadOnlyWhereItsRowValuesMatch) {
  static const auto shifted = deuteron::kernel("shifted_exps", [](hl::Tensor x, hl::Tensor shift) {
    auto out = hl::empty_like(x);
    for (auto tm : hl::tile(x.size(0))) {
      auto lo = shift[{tm}] * 2.0f;
      auto hi = hl::where(lo < 0.0f, 0.0f, lo);
      auto sum = hl::zeros({tm});
      for (auto tn : hl::tile(x.size(1))) sum = sum + hl::exp(x[{tm, tn}] - lo.unsqueeze(1)).sum(1);
      for (auto tn : hl::tile(x.size(1)))
        out[{tm, tn}] = hl::exp(x[{tm, tn}] - hi.unsqueeze(1)) + sum.unsqueeze(1);
    }
    return out;
  });
  for (int64_t n : {67, 1}) {
    const int64_t m = 6;
    std::vector<double> xs, shifts;
    for (int64_t i = 0; i < m * n; ++i) xs.push_back(double((i * 37) % 23) / 8.0 - 1.0);
    for (int64_t r = 0; r < m; ++r) shifts.push_back(r % 2 ? -0.75 - 0.25 * double(r) : 0.5 * double(r));
    std::vector<Arg> args = {tensor_of(xs, {m, n}), tensor_of(shifts, {m})};
    auto s = driver::specialize(shifted, frontend::describe_args(shifted, args), "cpu");
    for (int64_t rows : {1, 4}) {
      config::Config c = fit(s, {{"block_t0", rows}});
      std::string at = fmt::format("[{}, {}] in blocks of {} rows", m, n, rows);
      ASSERT_NE(s.backend->emit(driver::lower(s, c)).find("dt::same_bits("), std::string::npos)
          << at << ": the output pass does not read kept values: this test would not cover them";
      Tensor got = api::run(shifted, args, "cpu", c).outputs[0];
      for (int64_t r = 0; r < m; ++r) {
        double lo = float(shifts[size_t(r)] * 2.0), hi = lo < 0 ? 0.0 : lo, sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(xs[size_t(r * n + j)] - lo);
        for (int64_t j = 0; j < n; ++j) {
          double want = std::exp(xs[size_t(r * n + j)] - hi) + sum;
          EXPECT_NEAR(got.get(r * n + j), want, 4e-6 * want)
              << at << ", row " << r << " (shift " << lo << "), column " << j;
        }
      }
    }
  }
}

TEST(EdgeCases, AmaxAndAminPropagateNaN) { check_extremes("cpu"); }

TEST(EdgeCases, AmaxAndAminPropagateNaNOnPallas) {
  std::string problem = pallas::environment_problem();
  ASSERT_TRUE(problem.empty()) << problem;
  check_extremes("pallas");
}

// hl::mean and hl::var as building blocks, over whole dims and over a tiled dim whose last
// block is partial (37 and 1000 columns in blocks of 16, and a single column). Pallas takes no
// block of 16 columns (a TPU block's last dim is a multiple of 128 or whole): there the second
// mean is over whole rows too.
std::tuple<hl::Tensor, hl::Tensor, hl::Tensor, hl::Tensor> moments_of(hl::Tensor x, int64_t block) {
  auto mean = hl::empty({x.size(0)}), var = hl::empty({x.size(0)}), biased = hl::empty({x.size(0)}),
       block_mean = hl::empty({x.size(0), x.size(1)});
  for (auto tm : hl::tile(x.size(0))) {
    auto row = x[{tm, hl::all}];
    mean[tm] = hl::mean(row, 1);
    var[tm] = hl::var(row, 1);
    biased[tm] = hl::var(row, 1, false, 0);
    if (block == 0) block_mean[{tm, hl::all}] = hl::mean(row, 1, true).expand({tm, x.size(1)});
    else
      for (auto tn : hl::tile(x.size(1), {.block_size = block}))
        block_mean[{tm, tn}] = hl::mean(x[{tm, tn}], 1, true).expand({tm, tn});
  }
  return std::make_tuple(mean, var, biased, block_mean);
}
const auto moments = deuteron::kernel("moments", [](hl::Tensor x) { return moments_of(x, 16); });
const auto row_moments = deuteron::kernel("row_moments", [](hl::Tensor x) { return moments_of(x, 0); });

// Row j's element i: where mean and variance go wrong in f32.
std::vector<std::vector<double>> moment_rows(int64_t n) {
  constexpr double kMax = std::numeric_limits<float>::max();
  auto row = [&](auto f) {
    std::vector<double> r(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) r[size_t(i)] = f(i);
    return r;
  };
  uint64_t state = 7;  // a small LCG: the same spread on every run
  auto uniform = [&] {
    return double((state = state * 6364136223846793005ULL + 1442695040888963407ULL) >> 11) * 0x1p-53;
  };
  return {
      row([](int64_t) { return 10000.3; }),  // constant rows: exactly the constant, variance 0
      row([](int64_t) { return 3e38; }),
      row([](int64_t) { return -3e38; }),
      row([&](int64_t) { return kMax; }),
      row([](int64_t) { return 1e-40; }),  // a denormal
      row([](int64_t) { return 0.0; }),
      row([](int64_t i) { return double(i) + 1e4; }),  // an offset ramp
      row([&](int64_t) { return 1e4 + uniform() - 0.5; }),  // mean 1e4, spread 1: errs with the spread
      row([&](int64_t) { return -3e4 + uniform(); }),
      row([](int64_t i) { return 1e-30 * double(i + 1); }),  // tiny deviations (their squares denormal)
      row([](int64_t i) { return i % 2 ? 3.2e38 : 3.0e38; }),  // near the f32 limit: variance inf
      row([](int64_t i) { return i % 3 ? 1.5 : -2e37; }),  // large deviations of both signs
      row([n](int64_t i) { return i == n / 2 ? kInf : 0.0; }),  // mean inf, variance NaN
      row([n](int64_t i) { return i == n / 2 ? -kInf : 1.0; }),  // mean -inf
      row([n](int64_t i) { return i == 0 ? kInf : i == n - 1 ? -kInf : 0.0; }),  // NaN (1 column: inf)
      row([n](int64_t i) { return i == n - 1 ? kNaN : 2.0; }),
  };
}

// The f32 answer: the float64 one rounded to f32 (beyond the f32 limit, inf), exact for a
// constant row, else within `tol`.
struct Expected {
  std::vector<double> value, tol;
  void add(double exact, bool constant, double tol_) {
    value.push_back(double(float(exact)));
    tol.push_back(constant ? 0 : tol_);
  }
};
double f32_ulp(double v) {
  float f = std::abs(float(v));
  return double(std::nextafter(f, std::numeric_limits<float>::infinity())) - double(f);
}

void expect_within(const Tensor& got, const Expected& want, const std::string& what) {
  ASSERT_EQ(got.numel(), int64_t(want.value.size())) << what;
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = got.get(i), w = want.value[size_t(i)];
    bool ok = std::isnan(w) ? std::isnan(g) : std::isinf(w) ? g == w : std::abs(g - w) <= want.tol[size_t(i)];
    if (!ok && bad++ < 4)
      ADD_FAILURE() << what << " [" << i << "]: got " << g << ", want " << w << " within "
                    << want.tol[size_t(i)];
  }
  EXPECT_EQ(bad, 0) << what << ": elements off";
}

void check_moments(const std::string& target, DType dtype) {
  for (int64_t n : {37, 1, 1000}) {
    std::vector<std::vector<double>> rows = moment_rows(n);
    std::vector<double> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    Tensor x = tensor_of(flat, {int64_t(rows.size()), n}, dtype);
    // Blocks of rows mix the patterns (on the TPU one block of all 16 rows: a 1-d output's
    // blocks are whole or multiples of 128).
    const KernelBase& kernel = target == "pallas" ? static_cast<const KernelBase&>(row_moments) : moments;
    int64_t block = target == "pallas" ? n : 16;
    config::Config cfg = fit(kernel, {x}, {{"block_t0", target == "pallas" ? x.size(0) : 2}});
    auto r = api::run(kernel, {x}, target, cfg);
    Expected mean, var, biased, block_mean;
    for (int64_t i = 0; i < int64_t(rows.size()); ++i) {
      // From the values as the target reads them: rounded to bf16 where the input is; XLA on
      // the cpu flushes denormals to 0, and so does Triton's interpreter converting bf16 ones
      // (tl.load(x).to(tl.float32)).
      bool flushed = target == "pallas" || (target == "triton" && dtype == DType::bf16);
      auto at = [&](int64_t j) {
        double v = x.get(i * n + j);
        return flushed && std::abs(v) < std::numeric_limits<float>::min() ? 0.0 : v;
      };
      auto stats = [&](int64_t b0, int64_t b1) {
        double s = 0, ss = 0;
        for (int64_t j = b0; j < b1; ++j) s += at(j);
        double mu = s / double(b1 - b0);
        for (int64_t j = b0; j < b1; ++j) ss += (at(j) - mu) * (at(j) - mu);
        double lo = at(b0), hi = at(b0);
        for (int64_t j = b0; j < b1; ++j) lo = std::min(lo, at(j)), hi = std::max(hi, at(j));
        // A mean within an ulp of the exact one (its rounding to f32 is half of that), and an
        // error that scales with the spread, not the magnitude: n f32 roundings of it.
        double mean_tol = f32_ulp(mu) + double(b1 - b0) * 0x1p-24 * (hi - lo);
        return std::make_tuple(mu, ss, lo == hi && std::isfinite(lo), mean_tol);
      };
      auto [mu, ss, constant, mean_tol] = stats(0, n);
      mean.add(mu, constant, mean_tol);
      var.add(ss / double(n - 1), constant && n > 1, 1e-5 * ss / double(n - 1));
      biased.add(ss / double(n), constant, 1e-5 * ss / double(n));
      for (int64_t j = 0; j < n; ++j) {
        int64_t b0 = j / block * block;
        auto [bmu, bss, bconstant, bmean_tol] = stats(b0, std::min(n, b0 + block));
        block_mean.add(bmu, bconstant, bmean_tol);
      }
    }
    std::string what = fmt::format("{} {} of {} columns: ", target, dtype_name(dtype), n);
    expect_within(r.outputs[0], mean, what + "mean");
    expect_within(r.outputs[1], var, what + "var");
    expect_within(r.outputs[2], biased, what + "biased var");
    expect_within(r.outputs[3], block_mean, what + "mean over blocks of a tiled dim");
  }
}

TEST(EdgeCases, MeanAndVarAreSound) {
  check_moments("cpu", DType::f32);
  check_moments("cpu", DType::bf16);
}

TEST(EdgeCases, MeanAndVarAreSoundOnPallas) {
  std::string problem = pallas::environment_problem();
  ASSERT_TRUE(problem.empty()) << problem;
  check_moments("pallas", DType::f32);
  check_moments("pallas", DType::bf16);
}

TEST(EdgeCases, MeanAndVarAreSoundOnTriton) {
  std::string problem = python::environment_problem(triton::runner_spec("interpret"));
  ASSERT_TRUE(problem.empty()) << problem;
  testing_support::ScopedEnv device("DEUTERON_TRITON_DEVICE", "interpret");
  check_moments("triton", DType::f32);
  check_moments("triton", DType::bf16);
}

// ---- the catalogue on edge-case rows ----------------------------------------------------------

// A row of the kernel's input (a run of its last dim) replaced by values where f32 arithmetic
// goes wrong. The expected outputs come from the catalogue's float64 references, on the same
// inputs.
struct Pattern {
  const char* name;
  double (*value)(int64_t j, int64_t n, double random);  // element j of a row of n
};
const Pattern kInfs = {"inf", [](int64_t j, int64_t, double r) { return j == 7 ? kInf : r; }};
const Pattern kNegInfs = {"neg_inf", [](int64_t j, int64_t, double r) { return j == 7 ? -kInf : r; }};
const Pattern kNaNs = {"nan", [](int64_t j, int64_t, double r) { return j == 11 ? kNaN : r; }};
const Pattern kHuge = {"huge", [](int64_t j, int64_t, double) { return j % 2 ? -3e38 : 3e38; }};
const Pattern kHugeConstant = {"huge_constant", [](int64_t, int64_t, double) { return 3e38; }};
const Pattern kDenormal = {"denormal", [](int64_t j, int64_t, double) { return double(j % 13 + 1) * 7e-40; }};
const Pattern kConstant = {"constant", [](int64_t, int64_t, double) { return 10000.3; }};
// Every column -inf but the last three: whole leading blocks masked, at any block size.
const Pattern kMasked = {"masked", [](int64_t j, int64_t n, double r) { return j < n - 3 ? -kInf : r; }};

struct EdgeSuite {
  std::string kernel;
  int input = 0;  // the argument whose rows are patterned
  std::vector<Pattern> patterns;
  // Each output row depends on one input row: all patterns go in one run, a row each.
  bool rows_independent = true;
};

// What each kernel is checked on. Left out, as f32 cannot give the float64 answer and torch's
// f32 gives what Deuteron gives: squares and products of values near 3e38 (they overflow:
// rms_norm, the matmul family, a layer norm of mixed +-3e38 rows), and -inf in the gelu / silu
// products (their formulas evaluate -inf * 0).
const std::vector<EdgeSuite> kSuites = {
    {"add", 0, {kInfs, kNegInfs, kNaNs, kHuge, kDenormal, kConstant, kMasked}},
    {"softmax", 0, {kInfs, kNegInfs, kNaNs, kHuge, kDenormal, kConstant, kMasked}},
    {"softmax_decomposed", 0, {kInfs, kNegInfs, kNaNs, kHuge, kDenormal, kConstant, kMasked}},
    {"softmax_two_pass", 0, {kInfs, kNegInfs, kNaNs, kHuge, kDenormal, kConstant, kMasked}},
    {"batch_softmax", 0, {kInfs, kNegInfs, kNaNs, kHuge, kDenormal, kConstant, kMasked}},
    {"cross_entropy", 0, {kInfs, kNegInfs, kNaNs, kHuge, kDenormal, kConstant, kMasked}, false},
    {"swiglu", 0, {kInfs, kNaNs, kHuge, kDenormal, kConstant}},
    {"geglu", 0, {kInfs, kNaNs, kHuge, kDenormal, kConstant}},
    {"layer_norm", 0, {kInfs, kNegInfs, kNaNs, kHugeConstant, kDenormal, kConstant, kMasked}},
    {"welford", 2, {kInfs, kNegInfs, kNaNs, kHugeConstant, kDenormal, kConstant, kMasked}},
    {"rms_norm", 0, {kInfs, kNegInfs, kNaNs, kDenormal, kConstant, kMasked}},
    {"rms_norm_bwd", 1, {kInfs, kNaNs, kDenormal, kConstant}, false},
    {"matmul", 0, {kInfs, kNegInfs, kNaNs, kDenormal, kConstant}},
    {"bmm", 0, {kInfs, kNegInfs, kNaNs, kDenormal, kConstant}},
    {"broadcast_matmul", 0, {kInfs, kNegInfs, kNaNs, kDenormal, kConstant}},
    {"matmul_layernorm", 0, {kInfs, kNaNs, kDenormal, kConstant}},
    {"epilogue_subtiling", 0, {kNaNs, kDenormal, kConstant}},
    {"attention", 0, {kInfs, kNaNs, kDenormal, kConstant}},
    {"attention_causal", 0, {kInfs, kNaNs, kDenormal, kConstant}},
};

struct EdgeCase {
  const EdgeSuite* suite;
  std::vector<Pattern> patterns;  // in rows 0, 1, ... of the patterned input
  std::string target;
  std::vector<int64_t> shape;
};

void PrintTo(const EdgeCase& c, std::ostream* os) {
  std::vector<std::string> names;
  for (const Pattern& p : c.patterns) names.push_back(p.name);
  *os << fmt::format("{} on {} [{}] rows: {}", c.suite->kernel, c.target, fmt::join(c.shape, ", "), fmt::join(names, ", "));
}

std::string edge_case_name(const testing::TestParamInfo<EdgeCase>& info) {
  std::string patterns = info.param.patterns.size() == 1 ? info.param.patterns[0].name : "all";
  return fmt::format("{}_{}_{}", info.param.suite->kernel, patterns, info.param.target);
}

// The pallas target runs these of them, at a small shape (interpret mode costs about 20 ms per
// grid step).
const std::map<std::string, std::vector<int64_t>> kPallasShapes = {
    {"add", {17, 300}},    {"softmax", {17, 300}},      {"softmax_decomposed", {17, 300}},
    {"batch_softmax", {2, 9, 300}}, {"swiglu", {2, 9, 300}}, {"geglu", {2, 9, 300}},
    {"layer_norm", {17, 300}}, {"rms_norm", {17, 300}}, {"rms_norm_bwd", {17, 300}}};

std::vector<EdgeCase> edge_cases() {
  std::vector<EdgeCase> out;
  for (const EdgeSuite& s : kSuites) {
    std::vector<std::string> targets = {"cpu"};
    if (kPallasShapes.count(s.kernel)) targets.push_back("pallas");
    for (const std::string& target : targets) {
      std::vector<int64_t> shape = target == "cpu" ? examples::find(s.kernel).small_shape : kPallasShapes.at(s.kernel);
      if (s.rows_independent) out.push_back({&s, s.patterns, target, shape});
      else
        for (const Pattern& p : s.patterns) out.push_back({&s, {p}, target, shape});
    }
  }
  return out;
}

class EdgeCaseSuite : public testing::TestWithParam<EdgeCase> {};

TEST_P(EdgeCaseSuite, MatchesTheFloat64Reference) {
  const EdgeCase& c = GetParam();
  if (c.target == "pallas") {
    std::string problem = pallas::environment_problem();
    ASSERT_TRUE(problem.empty()) << problem;
  }
  const examples::Entry& e = examples::find(c.suite->kernel);
  std::vector<Arg> args = e.inputs(c.shape, DType::f32, 21);
  Tensor& x = std::get<Tensor>(args.at(size_t(c.suite->input)));
  int64_t n = x.size(-1);
  // The patterned rows are spread out (every 3rd), so blocks of rows mix them with plain ones.
  for (size_t p = 0; p < c.patterns.size(); ++p) {
    int64_t row = c.patterns.size() == 1 ? 1 : int64_t(p) * 3 % (x.numel() / n);
    for (int64_t j = 0; j < n; ++j) x.set(row * n + j, c.patterns[p].value(j, n, x.get(row * n + j)));
  }
  std::vector<Tensor> want = e.reference(args);
  // The default config, and on the cpu small blocks (several blocks per row and loop).
  std::vector<config::Config> configs = {config::Config()};
  if (c.target == "cpu") {
    auto s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "cpu");
    // Tile blocks (and looped reductions, where the kernel allows them) of 16, else smaller.
    for (int64_t b = 16, reductions = 1; b >= 1 && configs.size() == 1; reductions ? reductions = 0 : (b /= 2, reductions = 1)) {
      std::map<std::string, int64_t> small;
      for (const config::Tunable& t : s.space.tunables())
        if (t.kind == config::Tunable::Kind::BlockSize && (reductions || t.name.rfind("block_", 0) == 0))
          small[t.name] = b;
      config::Config cfg = fit(s, small);
      for (const config::Tunable& t : s.space.tunables())  // small blocks of resident operands pack badly
        if (std::count(t.values.begin(), t.values.end(), config::Json("in_place"))) cfg.set(t.name, "in_place");
      try {
        driver::lower(s, cfg);
        configs.push_back(cfg);
      } catch (const ConfigError&) {
        // too much fast memory: smaller blocks
      }
    }
    ASSERT_EQ(configs.size(), 2u) << "no small-block config fits";
  }
  for (const config::Config& cfg : configs) {
    Outputs got = api::run(*e.kernel, args, c.target, cfg).outputs;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      Tolerance tol = examples::tolerance_for(e, DType::f32);
      CloseResult r = allclose(got[i], want[i], tol.rtol, tol.atol);
      EXPECT_TRUE(r.close) << "config " << cfg.dump() << ", output " << i << ": " << r.num_bad
                           << " elements off, the first at flat index " << r.first_bad_index << ": got "
                           << got[i].get(r.first_bad_index) << ", want " << want[i].get(r.first_bad_index);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, EdgeCaseSuite, testing::ValuesIn(edge_cases()), edge_case_name);

}  // namespace
}  // namespace deuteron
