// A program that uses kernels built ahead of time (`deuteron aot`), with nothing of Deuteron
// but the header and the library that build wrote. It runs softmax, matmul, the norms (and the
// rms norm's backward), cross_entropy, cumsum, attention (causal too) and matmul_layernorm at
// the shapes the build tuned and at others (the general variants), checks every output against
// plain loops in double precision, and checks that bad calls fail with a code and a message.
//
//   deuteron aot softmax,matmul,cross_entropy,layer_norm,rms_norm,rms_norm_bwd,cumsum,attention,attention_causal,matmul_layernorm \
//       --shapes shapes.txt --out kernels
//   cmake -S examples/aot -B build-aot -DAOT_DIR=$PWD/kernels && cmake --build build-aot
//   build-aot/aot_consumer
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "deuteron_kernels.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

void expect_error(int rc, int want, const char* says, const std::string& what) {
  std::string message = deuteron_kernels_last_error();
  check(rc == want && message.find(says) != std::string::npos,
        what + ": rc " + std::to_string(rc) + ", message '" + message + "'");
}

// The variant a call runs: its name says whether it was tuned for the shape or is general.
std::string kind_of(const char* variant) {
  if (!variant) return "none";
  return std::strstr(variant, "_general") ? "general" : "tuned";
}

void softmax_case(int64_t m, int64_t n, const std::string& want_kind) {
  std::vector<float> x = random_values(size_t(m * n), 1), out(size_t(m * n), NAN);
  std::string kind = kind_of(deuteron_kernels_softmax_variant(m, n));
  int rc = deuteron_kernels_softmax(x.data(), out.data(), m, n);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < n; ++j) mx = std::fmax(mx, double(x[size_t(i * n + j)]));
    for (int64_t j = 0; j < n; ++j) sum += std::exp(double(x[size_t(i * n + j)]) - mx);
    for (int64_t j = 0; j < n; ++j) {
      double want = std::exp(double(x[size_t(i * n + j)]) - mx) / sum;
      double err = std::fabs(double(out[size_t(i * n + j)]) - want);
      worst = std::isnan(err) ? INFINITY : std::fmax(worst, err / (1e-6 + 1e-5 * std::fabs(want)));
    }
  }
  check(rc == DEUTERON_KERNELS_OK && kind == want_kind && worst <= 1,
        "softmax " + std::to_string(m) + "x" + std::to_string(n) + " (" + kind + " variant, wanted " + want_kind +
            "): rc " + std::to_string(rc) + ", worst error " + std::to_string(worst) + " of the tolerance " +
            deuteron_kernels_last_error());
}

void matmul_case(int64_t m, int64_t k, int64_t n, const std::string& want_kind) {
  std::vector<float> x = random_values(size_t(m * k), 2), y = random_values(size_t(k * n), 3), out(size_t(m * n), NAN);
  std::string kind = kind_of(deuteron_kernels_matmul_variant(m, k, n));
  int rc = deuteron_kernels_matmul(x.data(), y.data(), out.data(), m, k, n);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t p = 0; p < k; ++p) want += double(x[size_t(i * k + p)]) * double(y[size_t(p * n + j)]);
      // f32 sums of k products: rounding grows like sqrt(k).
      double tol = 1e-5 * (1 + std::sqrt(double(k))) * (1 + std::fabs(want));
      double err = std::fabs(double(out[size_t(i * n + j)]) - want);
      worst = std::isnan(err) ? INFINITY : std::fmax(worst, err / tol);
    }
  check(rc == DEUTERON_KERNELS_OK && kind == want_kind && worst <= 1,
        "matmul " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) + " (" + kind +
            " variant, wanted " + want_kind + "): rc " + std::to_string(rc) + ", worst error " + std::to_string(worst) +
            " of the tolerance " + deuteron_kernels_last_error());
}

// Worst error of `got` against `want`, in units of abs + rel * |want| (NaN: infinite).
double worst_error(const std::vector<float>& got, const std::vector<double>& want, double abs, double rel) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double err = std::fabs(double(got[i]) - want[i]);
    worst = std::isnan(err) ? INFINITY : std::fmax(worst, err / (abs + rel * std::fabs(want[i])));
  }
  return worst;
}

std::string shape_name(int64_t m, int64_t n) { return std::to_string(m) + "x" + std::to_string(n); }

// cross_entropy: float atomic adds summed in a fixed order (per-thread copies of the loss);
// the label -100 is ignored, and a label outside the logits' row fails its index check.
void cross_entropy_case(int64_t n, int64_t v, const std::string& want_kind) {
  std::vector<float> logits = random_values(size_t(n * v), 4), loss(1, NAN);
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[size_t(i)] = i % 5 == 3 ? -100 : (i * 7 + 3) % v;
  if (n > 1) labels[0] = v - 1;
  std::string kind = kind_of(deuteron_kernels_cross_entropy_variant(n, v));
  int rc = deuteron_kernels_cross_entropy(logits.data(), labels.data(), loss.data(), -100, n, v);
  double sum = 0;
  int counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (labels[size_t(i)] == -100) continue;
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::fmax(mx, double(logits[size_t(i * v + j)]));
    for (int64_t j = 0; j < v; ++j) s += std::exp(double(logits[size_t(i * v + j)]) - mx);
    sum += std::log(s) + mx - double(logits[size_t(i * v + labels[size_t(i)])]);
    ++counted;
  }
  double want = sum / counted;
  check(rc == DEUTERON_KERNELS_OK && kind == want_kind && std::fabs(loss[0] - want) < 1e-5 * (1 + std::fabs(want)),
        "cross_entropy " + shape_name(n, v) + " (" + kind + " variant, wanted " + want_kind + "): rc " +
            std::to_string(rc) + ", loss " + std::to_string(loss[0]) + ", wanted " + std::to_string(want) + " " +
            deuteron_kernels_last_error());
}

void cross_entropy_bad_label() {
  const int64_t n = 8, v = 10;
  std::vector<float> logits = random_values(size_t(n * v), 4), loss(1, NAN);
  std::vector<int64_t> labels = {3, 0, 12, -100, 5, 5, 1, 7};  // 12: past the row
  expect_error(deuteron_kernels_cross_entropy(logits.data(), labels.data(), loss.data(), -100, n, v),
               DEUTERON_KERNELS_INDEX_OUT_OF_RANGE, "index 12 is out of range for dim 1 of logits (size 10)",
               "cross_entropy with a label past the row (tuned)");
  expect_error(deuteron_kernels_cross_entropy(logits.data(), labels.data(), loss.data(), -100, n - 1, v),
               DEUTERON_KERNELS_INDEX_OUT_OF_RANGE, "index 12 is out of range for dim 1 of logits (size 10)",
               "cross_entropy with a label past the row (general)");
}

// layer_norm over rows of x[M, N] (biased variance), with weight and bias.
void layer_norm_case(int64_t m, int64_t n, const std::string& want_kind) {
  std::vector<float> x = random_values(size_t(m * n), 5), w = random_values(size_t(n), 6), b = random_values(size_t(n), 7),
                     out(size_t(m * n), NAN);
  for (float& e : x) e = 1 + 2 * e;  // an offset mean: the variance is taken around it
  std::string kind = kind_of(deuteron_kernels_layer_norm_variant(m, n));
  int rc = deuteron_kernels_layer_norm(x.data(), w.data(), b.data(), out.data(), 1e-5, m, n);
  std::vector<double> want(size_t(m * n));
  for (int64_t i = 0; i < m; ++i) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < n; ++j) mean += x[size_t(i * n + j)];
    mean /= double(n);
    for (int64_t j = 0; j < n; ++j) var += (x[size_t(i * n + j)] - mean) * (x[size_t(i * n + j)] - mean);
    double rstd = 1 / std::sqrt(var / double(n) + 1e-5);
    for (int64_t j = 0; j < n; ++j) want[size_t(i * n + j)] = (x[size_t(i * n + j)] - mean) * rstd * w[size_t(j)] + b[size_t(j)];
  }
  // Size 1 rows: var 0, so out = bias exactly; elsewhere f32 sums of n terms.
  double worst = worst_error(out, want, 1e-5 * (1 + std::sqrt(double(n))), 1e-5);
  check(rc == DEUTERON_KERNELS_OK && kind == want_kind && worst <= 1,
        "layer_norm " + shape_name(m, n) + " (" + kind + " variant, wanted " + want_kind + "): rc " + std::to_string(rc) +
            ", worst error " + std::to_string(worst) + " of the tolerance " + deuteron_kernels_last_error());
}

// rms_norm: y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps) per row, also returned.
std::vector<double> rms_rstd(const std::vector<float>& x, int64_t m, int64_t n) {
  std::vector<double> r(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s += double(x[size_t(i * n + j)]) * x[size_t(i * n + j)];
    r[size_t(i)] = 1 / std::sqrt(s / double(n) + 1e-6);
  }
  return r;
}

void rms_norm_case(int64_t m, int64_t n, const std::string& want_kind) {
  std::vector<float> x = random_values(size_t(m * n), 8), w = random_values(size_t(n), 9), y(size_t(m * n), NAN),
                     rstd(size_t(m), NAN);
  std::string kind = kind_of(deuteron_kernels_rms_norm_variant(m, n));
  int rc = deuteron_kernels_rms_norm(x.data(), w.data(), y.data(), rstd.data(), 1e-6, m, n);
  std::vector<double> r = rms_rstd(x, m, n), want(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) want[size_t(i * n + j)] = x[size_t(i * n + j)] * r[size_t(i)] * w[size_t(j)];
  double worst = std::fmax(worst_error(y, want, 1e-5, 1e-5), worst_error(rstd, r, 1e-5, 1e-5));
  check(rc == DEUTERON_KERNELS_OK && kind == want_kind && worst <= 1,
        "rms_norm " + shape_name(m, n) + " (" + kind + " variant, wanted " + want_kind + "): rc " + std::to_string(rc) +
            ", worst error " + std::to_string(worst) + " of the tolerance " + deuteron_kernels_last_error());
}

// rms_norm_bwd: grad_x = r w gy - x r^3 mean(w gy x) per row, grad_w = sum over rows of gy x r
// (float atomic adds, summed in a fixed order).
void rms_norm_bwd_case(int64_t m, int64_t n, const std::string& want_kind) {
  std::vector<float> gy = random_values(size_t(m * n), 10), x = random_values(size_t(m * n), 11),
                     w = random_values(size_t(n), 12), gx(size_t(m * n), NAN), gw(size_t(n), NAN);
  std::vector<double> r = rms_rstd(x, m, n);
  std::vector<float> rstd(r.begin(), r.end());
  std::string kind = kind_of(deuteron_kernels_rms_norm_bwd_variant(m, n));
  int rc = deuteron_kernels_rms_norm_bwd(gy.data(), x.data(), w.data(), rstd.data(), gx.data(), gw.data(), m, n);
  std::vector<double> want_x(size_t(m * n)), want_w(size_t(n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    double ri = rstd[size_t(i)], c = 0;
    for (int64_t j = 0; j < n; ++j) c += double(w[size_t(j)]) * gy[size_t(i * n + j)] * x[size_t(i * n + j)];
    c /= double(n);
    for (int64_t j = 0; j < n; ++j) {
      size_t e = size_t(i * n + j);
      want_x[e] = ri * w[size_t(j)] * gy[e] - x[e] * ri * ri * ri * c;
      want_w[size_t(j)] += double(gy[e]) * x[e] * ri;
    }
  }
  double worst = std::fmax(worst_error(gx, want_x, 1e-4, 1e-4), worst_error(gw, want_w, 1e-4 * (1 + std::sqrt(double(m))), 1e-5));
  check(rc == DEUTERON_KERNELS_OK && kind == want_kind && worst <= 1,
        "rms_norm_bwd " + shape_name(m, n) + " (" + kind + " variant, wanted " + want_kind + "): rc " +
            std::to_string(rc) + ", worst error " + std::to_string(worst) + " of the tolerance " +
            deuteron_kernels_last_error());
}

// attention, causal or not, per (batch, head): softmax(q kᵀ / sqrt(D)) v, row by row.
void attention_case(bool causal, int64_t b, int64_t h, int64_t s, int64_t d, const std::string& want_kind) {
  size_t n = size_t(b * h * s * d);
  std::vector<float> q = random_values(n, 13), k = random_values(n, 14), v = random_values(n, 15), out(n, NAN);
  std::string kind = kind_of(causal ? deuteron_kernels_attention_causal_variant(b, h, s, d)
                                    : deuteron_kernels_attention_variant(b, h, s, d));
  int rc = causal ? deuteron_kernels_attention_causal(q.data(), k.data(), v.data(), out.data(), b, h, s, d)
                  : deuteron_kernels_attention(q.data(), k.data(), v.data(), out.data(), b, h, s, d);
  std::vector<double> want(n), p(static_cast<size_t>(s));
  for (int64_t g = 0; g < b * h; ++g)
    for (int64_t i = 0; i < s; ++i) {
      const float* qi = q.data() + (g * s + i) * d;
      int64_t keys = causal ? i + 1 : s;
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < keys; ++j) {
        const float* kj = k.data() + (g * s + j) * d;
        double score = 0;
        for (int64_t c = 0; c < d; ++c) score += double(qi[c]) * kj[c];
        p[size_t(j)] = score / std::sqrt(double(d));
        mx = std::fmax(mx, p[size_t(j)]);
      }
      for (int64_t j = 0; j < keys; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
      for (int64_t c = 0; c < d; ++c) {
        double o = 0;
        for (int64_t j = 0; j < keys; ++j) o += p[size_t(j)] * v[size_t((g * s + j) * d + c)];
        want[size_t((g * s + i) * d + c)] = o / sum;
      }
    }
  // f32 sums of d products (the scores) and of s terms (the outputs).
  double worst = worst_error(out, want, 1e-6 * (1 + std::sqrt(double(d + s))), 1e-6);
  check(rc == DEUTERON_KERNELS_OK && kind == want_kind && worst <= 1,
        std::string(causal ? "attention_causal " : "attention ") + std::to_string(b) + "x" + std::to_string(h) + "x" +
            std::to_string(s) + "x" + std::to_string(d) + " (" + kind + " variant, wanted " + want_kind + "): rc " +
            std::to_string(rc) + ", worst error " + std::to_string(worst) + " of the tolerance " +
            deuteron_kernels_last_error());
}

// matmul_layernorm: layer_norm(x @ y) over N (biased variance, eps 1e-5), with weight and bias.
void matmul_layernorm_case(int64_t m, int64_t k, int64_t n, const std::string& want_kind) {
  std::vector<float> x = random_values(size_t(m * k), 16), y = random_values(size_t(k * n), 17),
                     w = random_values(size_t(n), 18), b = random_values(size_t(n), 19), out(size_t(m * n), NAN);
  std::string kind = kind_of(deuteron_kernels_matmul_layernorm_variant(m, k, n));
  int rc = deuteron_kernels_matmul_layernorm(x.data(), y.data(), w.data(), b.data(), out.data(), m, k, n);
  std::vector<double> want(size_t(m * n)), row(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < n; ++j) {
      row[size_t(j)] = 0;
      for (int64_t p = 0; p < k; ++p) row[size_t(j)] += double(x[size_t(i * k + p)]) * y[size_t(p * n + j)];
      mean += row[size_t(j)];
    }
    mean /= double(n);
    for (int64_t j = 0; j < n; ++j) var += (row[size_t(j)] - mean) * (row[size_t(j)] - mean);
    double rstd = 1 / std::sqrt(var / double(n) + 1e-5);
    for (int64_t j = 0; j < n; ++j) want[size_t(i * n + j)] = (row[size_t(j)] - mean) * rstd * w[size_t(j)] + b[size_t(j)];
  }
  // f32 sums of k products, then normalised by the row's spread (N = 1: out = bias exactly).
  double worst = worst_error(out, want, 1e-5 * (1 + std::sqrt(double(k))), 1e-5);
  check(rc == DEUTERON_KERNELS_OK && kind == want_kind && worst <= 1,
        "matmul_layernorm " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n) + " (" + kind +
            " variant, wanted " + want_kind + "): rc " + std::to_string(rc) + ", worst error " + std::to_string(worst) +
            " of the tolerance " + deuteron_kernels_last_error());
}

// cumsum: inclusive prefix sums along each row. The cpu target adds in double and rounds each
// result once to f32, so it is within an f32 ulp of the double sum (f32 accumulation over a
// 5000-element row would not be).
void cumsum_case(int64_t m, int64_t n, const std::string& want_kind) {
  std::vector<float> x = random_values(size_t(m * n), 13), out(size_t(m * n), NAN);
  std::string kind = kind_of(deuteron_kernels_cumsum_variant(m, n));
  int rc = deuteron_kernels_cumsum(x.data(), out.data(), m, n);
  std::vector<double> want(size_t(m * n));
  for (int64_t i = 0; i < m; ++i) {
    double acc = 0;
    for (int64_t j = 0; j < n; ++j) want[size_t(i * n + j)] = acc += double(x[size_t(i * n + j)]);
  }
  // Half an f32 ulp (2^-24 relative), plus what another order of double additions may move a sum
  // by (n * 2^-52 times at most n).
  double worst = worst_error(out, want, double(n) * double(n) * 0x1p-52, 0x1p-24);
  check(rc == DEUTERON_KERNELS_OK && kind == want_kind && worst <= 1,
        "cumsum " + shape_name(m, n) + " (" + kind + " variant, wanted " + want_kind + "): rc " + std::to_string(rc) +
            ", worst error " + std::to_string(worst) + " of the tolerance " + deuteron_kernels_last_error());
}

void bad_calls() {
  std::vector<float> a(64, 0.5f), b(64), c(64);
  expect_error(deuteron_kernels_softmax(a.data(), b.data(), 0, 8), DEUTERON_KERNELS_BAD_ARGUMENT, "at least 1",
               "softmax with a size of 0");
  expect_error(deuteron_kernels_softmax(nullptr, b.data(), 2, 8), DEUTERON_KERNELS_BAD_ARGUMENT, "null pointer",
               "softmax of a null pointer");
  expect_error(deuteron_kernels_softmax(a.data(), b.data(), int64_t(1) << 40, int64_t(1) << 40),
               DEUTERON_KERNELS_BAD_ARGUMENT, "more elements", "softmax larger than memory");
  // Tensor views: a rank the kernel does not take, a dim that disagrees, a wrong dtype.
  int64_t s3[] = {2, 4, 8}, s2[] = {8, 8}, s_bad[] = {8, 7}, sk[] = {8, 4}, sy[] = {5, 8};
  deuteron_kernels_tensor x3{a.data(), DEUTERON_KERNELS_FLOAT32, 3, s3}, out2{b.data(), DEUTERON_KERNELS_FLOAT32, 2, s2};
  expect_error(deuteron_kernels_softmax_tensors(&x3, &out2), DEUTERON_KERNELS_BAD_ARGUMENT, "rank 3; it takes rank 2",
               "softmax of a rank-3 view");
  deuteron_kernels_tensor x2{a.data(), DEUTERON_KERNELS_FLOAT32, 2, s2}, bad{b.data(), DEUTERON_KERNELS_FLOAT32, 2, s_bad};
  expect_error(deuteron_kernels_softmax_tensors(&x2, &bad), DEUTERON_KERNELS_BAD_ARGUMENT, "dim 1 is 7",
               "softmax into an output of another shape");
  deuteron_kernels_tensor xi{a.data(), DEUTERON_KERNELS_INT32, 2, s2};
  expect_error(deuteron_kernels_softmax_tensors(&xi, &out2), DEUTERON_KERNELS_BAD_ARGUMENT, "dtype",
               "softmax of an int32 view");
  deuteron_kernels_tensor mx{a.data(), DEUTERON_KERNELS_FLOAT32, 2, sk}, my{b.data(), DEUTERON_KERNELS_FLOAT32, 2, sy},
      mo{c.data(), DEUTERON_KERNELS_FLOAT32, 2, s2};
  expect_error(deuteron_kernels_matmul_tensors(&mx, &my, &mo), DEUTERON_KERNELS_BAD_ARGUMENT, "dim 0 is 5",
               "matmul of [8, 4] by [5, 8]");
  // A good view call runs.
  check(deuteron_kernels_softmax_tensors(&x2, &out2) == DEUTERON_KERNELS_OK && std::fabs(b[0] - 0.125f) < 1e-6f,
        "softmax on views of [8, 8]: a constant row gives 1/8");
}

}  // namespace

int main() {
  // The shapes examples/aot/shapes.txt builds run their tuned variants...
  softmax_case(130, 1000, "tuned");
  softmax_case(1, 128, "tuned");
  softmax_case(64, 257, "tuned");
  matmul_case(130, 67, 100, "tuned");
  matmul_case(1, 1, 1, "tuned");
  matmul_case(64, 64, 64, "tuned");
  // ...and any other the general ones: ragged, size 1, larger than any built.
  softmax_case(7, 3, "general");
  softmax_case(1, 1, "general");
  softmax_case(3, 5000, "general");
  softmax_case(1000, 33, "general");
  matmul_case(1, 300, 1, "general");
  matmul_case(129, 5, 257, "general");
  matmul_case(17, 1, 33, "general");
  matmul_case(300, 200, 100, "general");
  // The kernels that gained general variants: a mean's 1/n read at run time (the norms), ordered
  // atomic adds into per-thread copies sized at run time (cross_entropy, rms_norm_bwd).
  cross_entropy_case(8, 10, "tuned");
  cross_entropy_case(1, 1, "general");
  cross_entropy_case(7, 10, "general");
  cross_entropy_case(300, 77, "general");
  cross_entropy_bad_label();
  for (const char* kernel : {"layer_norm", "rms_norm", "rms_norm_bwd"}) {
    auto run = [&](int64_t m, int64_t n, const char* want) {
      std::string k = kernel;
      if (k == "layer_norm") layer_norm_case(m, n, want);
      else if (k == "rms_norm") rms_norm_case(m, n, want);
      else rms_norm_bwd_case(m, n, want);
    };
    run(64, 257, "tuned");
    run(1, 1, "general");
    run(3, 1000, "general");
    run(129, 33, "general");
    run(1, 4099, "general");
  }
  // A scan's dim is one block: the general variant sizes its rows from the call's sizes.
  cumsum_case(64, 257, "tuned");
  cumsum_case(1, 1, "general");
  cumsum_case(7, 1, "general");
  cumsum_case(3, 5001, "general");
  cumsum_case(130, 33, "general");
  // Block products over a whole dim (attention's head dim D, matmul_layernorm's N): the general
  // variants size the micro-kernel's packed layout from the call's sizes, and attention's
  // 1/sqrt(D) is the call's D (S, D and N of 1, and sizes no block divides).
  for (bool causal : {false, true}) {
    attention_case(causal, 2, 3, 64, 32, "tuned");
    attention_case(causal, 1, 1, 1, 1, "general");
    attention_case(causal, 2, 3, 37, 40, "general");
    attention_case(causal, 1, 2, 130, 1, "general");
    attention_case(causal, 1, 1, 70, 100, "general");
  }
  matmul_layernorm_case(64, 32, 64, "tuned");
  matmul_layernorm_case(1, 1, 1, "general");
  matmul_layernorm_case(37, 5, 100, "general");
  matmul_layernorm_case(130, 67, 1, "general");
  matmul_layernorm_case(3, 200, 130, "general");
  bad_calls();
  std::printf("%s: %d failure%s\n", failures ? "FAILED" : "passed", failures, failures == 1 ? "" : "s");
  return failures ? 1 : 0;
}
