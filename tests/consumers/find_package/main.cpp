// A kernel of this project's own, run and tuned through the installed library: out = alpha *
// x * sigmoid(g) + b, with b broadcast over the rows. Exit status 0 when every output matches
// a double-precision loop.
#include <cmath>
#include <cstdio>

#include <deuteron/deuteron.h>

namespace hl = deuteron::hl;

static const auto gated_scale = deuteron::kernel(
    "gated_scale",
    [](hl::Tensor x, hl::Tensor g, hl::Tensor b, hl::Scalar alpha) {
      auto out = hl::empty_like(x);
      for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)}))
        out[{tm, tn}] = alpha * x[{tm, tn}] * hl::sigmoid(g[{tm, tn}]) + b[tn];
      return out;
    },
    {.effort = "quick", .tune_budget_s = 15});

static bool check(int64_t m, int64_t n) {
  using deuteron::DType;
  using deuteron::Tensor;
  Tensor x = Tensor::rand({m, n}, DType::f32, 1), g = Tensor::rand({m, n}, DType::f32, 2);
  Tensor b = Tensor::rand({n}, DType::f32, 3);
  const double alpha = 0.75;
  Tensor out = gated_scale(x, g, b, alpha);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = alpha * x.get(i * n + j) / (1 + std::exp(-g.get(i * n + j))) + b.get(j);
      worst = std::fmax(worst, std::fabs(out.get(i * n + j) - want) / (1 + std::fabs(want)));
    }
  bool ok = worst < 1e-5;
  std::printf("gated_scale [%lld, %lld]: %s (max relative error %.2g)\n", (long long)m, (long long)n,
              ok ? "correct" : "WRONG", worst);
  return ok;
}

int main() {
  try {
    bool ok = check(77, 300);
    ok = check(1, 1) && ok;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gated_scale: %s\n", e.what());
    return 1;
  }
}
