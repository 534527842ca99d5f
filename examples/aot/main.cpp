// A program that uses kernels built ahead of time (`deuteron aot`), with nothing of Deuteron
// but the header and the library that build wrote. It runs softmax and matmul at the shapes the
// build tuned and at others (the general variants), and cross_entropy, checks every output
// against plain loops in double precision, and checks that bad calls fail with a code and a
// message.
//
//   deuteron aot softmax,matmul,cross_entropy --shapes shapes.txt --out kernels
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

// cross_entropy has no general variant (its float atomic adds are summed in a fixed order, in
// per-thread copies of the output): its built shape runs, another fails with NO_VARIANT, and a
// label outside the logits' row fails its index check.
void cross_entropy_cases() {
  const int64_t n = 8, v = 10;
  std::vector<float> logits = random_values(size_t(n * v), 4), loss(1, NAN);
  std::vector<int64_t> labels = {3, 0, 9, -100, 5, 5, 1, 7};  // -100: ignored
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
  check(rc == DEUTERON_KERNELS_OK && std::fabs(loss[0] - want) < 1e-5 * (1 + std::fabs(want)),
        "cross_entropy 8x10 (tuned): rc " + std::to_string(rc) + ", loss " + std::to_string(loss[0]) + ", wanted " +
            std::to_string(want));
  labels[2] = 12;
  expect_error(deuteron_kernels_cross_entropy(logits.data(), labels.data(), loss.data(), -100, n, v),
               DEUTERON_KERNELS_INDEX_OUT_OF_RANGE, "index 12 is out of range for dim 1 of logits (size 10)",
               "cross_entropy with a label past the row");
  expect_error(deuteron_kernels_cross_entropy(logits.data(), labels.data(), loss.data(), -100, n - 1, v),
               DEUTERON_KERNELS_NO_VARIANT, "no variant for 7x10", "cross_entropy at a shape not built");
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
  cross_entropy_cases();
  bad_calls();
  std::printf("%s: %d failure%s\n", failures ? "FAILED" : "passed", failures, failures == 1 ? "" : "s");
  return failures ? 1 : 0;
}
