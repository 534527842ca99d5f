// The catalogue on the inputs where numerics go wrong: -inf, inf and NaN, values near the f32
// limit (+-3e38), denormals, constant rows and masked (all -inf) leading blocks. Expected
// values are float64 loops or literals written here, and PyTorch's semantics where f32 cannot
// give the float64 answer (noted where so).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backends/pallas/backend.h"
#include "catalogue.h"
#include "config_fit.h"
#include "driver/driver.h"

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
  return driver::run(*e.kernel, args, target, fit(*e.kernel, args, blocks)).outputs;
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
    Outputs r = run("softmax_two_pass", {x}, {{"block_t1", b}, {"block_t2", b}});
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
    Outputs r = run(kernel, {q, k, v}, {{"block_t3", 4}, {"block_t2", 4}});
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
        Outputs r = run(kernel, args, {{"block_t1", 128}, {"block_t2", 128}});
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
    Outputs r = run("cross_entropy", {logits, labels, ignore}, {{"block_t0", 8}});
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
  const std::map<std::string, int64_t> blocks = {{"block_t0", 8}, {"block_t1", 128}};
  auto r = driver::run(row_extremes, {x}, target, fit(row_extremes, {x}, blocks));
  expect_values(r.outputs[0], mx, 0, target + " amax");
  expect_values(r.outputs[1], mn, 0, target + " amin");
  if (target == "cpu") {
    auto c = driver::run(column_extremes, {x}, target, fit(column_extremes, {x}, {{"block_t0", 8}}));
    expect_values(c.outputs[0], cmx, 0, target + " column amax");
  }
}

TEST(EdgeCases, AmaxAndAminPropagateNaN) { check_extremes("cpu"); }

TEST(EdgeCases, AmaxAndAminPropagateNaNOnPallas) {
  std::string problem = pallas::environment_problem();
  ASSERT_TRUE(problem.empty()) << problem;
  check_extremes("pallas");
}

// hl::mean and hl::var as building blocks: exact for constant rows, no overflow near the f32
// limit, torch's inf and NaN semantics, over whole dims and over a tiled dim whose last block
// is partial (37 columns in blocks of 16).
const auto moments = deuteron::kernel("moments", [](hl::Tensor x) {
  auto mean = hl::empty({x.size(0)}), var = hl::empty({x.size(0)}), biased = hl::empty({x.size(0)}),
       block_mean = hl::empty({x.size(0), x.size(1)});
  for (auto tm : hl::tile(x.size(0))) {
    auto row = x[{tm, hl::all}];
    mean[tm] = hl::mean(row, 1);
    var[tm] = hl::var(row, 1);
    biased[tm] = hl::var(row, 1, false, 0);
    for (auto tn : hl::tile(x.size(1), {.block_size = 16}))
      block_mean[{tm, tn}] = hl::mean(x[{tm, tn}], 1, true).expand({tm, tn});
  }
  return std::make_tuple(mean, var, biased, block_mean);
});

TEST(EdgeCases, MeanAndVarAreSound) {
  int64_t n = 37;
  std::vector<std::vector<double>> rows = {
      std::vector<double>(size_t(n), 10000.3), std::vector<double>(size_t(n), 3e38),
      std::vector<double>(size_t(n), -3e38),   std::vector<double>(size_t(n), 1e-40),
      std::vector<double>(size_t(n), 0.0),     std::vector<double>(size_t(n), 0.0),
      std::vector<double>(size_t(n), 0.0),     std::vector<double>(size_t(n), 0.0)};
  for (int64_t j = 0; j < n; ++j) rows[4][size_t(j)] = double(j) + 1e4;  // an offset ramp
  rows[5][3] = kInf;                                                      // inf among zeros: mean inf
  rows[6][3] = kInf, rows[6][9] = -kInf;                                  // both: NaN
  rows[7][30] = kNaN;
  std::vector<double> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  Tensor x = tensor_of(flat, {int64_t(rows.size()), n});
  auto r = driver::run(moments, {x}, "cpu", fit(moments, {x}, {{"block_t0", 2}}));
  std::vector<double> mean, var, biased, block_mean;
  for (const auto& row : rows) {
    double s = 0, ss = 0;
    for (double v : row) s += v;
    double mu = s / double(n);
    for (double v : row) ss += (v - mu) * (v - mu);
    // Constant rows: exactly the constant (the float64 sum of 3e38s would not overflow either).
    bool constant = std::all_of(row.begin(), row.end(), [&](double v) { return v == row[0]; });
    mean.push_back(constant ? double(float(row[0])) : mu);
    var.push_back(constant ? 0 : std::isnan(mu) || std::isinf(mu) ? kNaN : ss / double(n - 1));
    biased.push_back(constant ? 0 : std::isnan(mu) || std::isinf(mu) ? kNaN : ss / double(n));
    for (int64_t j = 0; j < n; ++j) {
      int64_t b0 = j / 16 * 16, b1 = std::min(n, b0 + 16);
      double bs = 0;
      for (int64_t q = b0; q < b1; ++q) bs += row[size_t(q)];
      block_mean.push_back(constant ? double(float(row[0])) : bs / double(b1 - b0));
    }
  }
  expect_values(r.outputs[0], mean, 1e-6, "mean");
  expect_values(r.outputs[1], var, 1e-5, "var");
  expect_values(r.outputs[2], biased, 1e-5, "biased var");
  expect_values(r.outputs[3], block_mean, 1e-6, "mean over blocks of a tiled dim");
}

}  // namespace
}  // namespace deuteron
