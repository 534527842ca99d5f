// A kernel of this project's own, run and tuned through deuteron built as a subproject: each
// row of x scaled to unit length, out = x / sqrt(sum(x^2) + eps). Exit status 0 when every
// output matches a double-precision loop.
#include <cmath>
#include <cstdio>

#include <deuteron/deuteron.h>

namespace hl = deuteron::hl;

static const auto row_normalize = deuteron::kernel(
    "row_normalize",
    [](hl::Tensor x, hl::Scalar eps) {
      auto out = hl::empty_like(x);
      for (auto tm : hl::tile(x.size(0), {.name = "rows"})) {
        auto row = x[{tm, hl::all}];
        out[{tm, hl::all}] = row * hl::rsqrt((row * row).sum(1, true) + eps);
      }
      return out;
    },
    {.effort = "quick", .tune_budget_s = 15});

static bool check(int64_t m, int64_t n) {
  using deuteron::DType;
  using deuteron::Tensor;
  Tensor x = Tensor::rand({m, n}, DType::f32, 4);
  const double eps = 1e-6;
  Tensor out = row_normalize(x, eps);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < n; ++j) ss += x.get(i * n + j) * x.get(i * n + j);
    for (int64_t j = 0; j < n; ++j) {
      double want = x.get(i * n + j) / std::sqrt(ss + eps);
      worst = std::fmax(worst, std::fabs(out.get(i * n + j) - want));
    }
  }
  bool ok = worst < 1e-5;
  std::printf("row_normalize [%lld, %lld]: %s (max error %.2g)\n", (long long)m, (long long)n,
              ok ? "correct" : "WRONG", worst);
  return ok;
}

int main() {
  try {
    bool ok = check(45, 1000);
    ok = check(1, 1) && ok;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "row_normalize: %s\n", e.what());
    return 1;
  }
}
