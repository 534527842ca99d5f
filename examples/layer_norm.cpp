// layer_norm: out = (x - mean) / sqrt(var + eps) * weight + bias over the last dim of x[M, N],
// with the biased variance (as torch.nn.functional.layer_norm). One block owns whole rows.
#include <cmath>

#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

static const auto layer_norm = deuteron::kernel(
    "layer_norm", [](hl::Tensor x, hl::Tensor weight, hl::Tensor bias, hl::Scalar eps) {
      auto out = hl::empty_like(x);
      for (auto tm : hl::tile(x.size(0), {.name = "rows"})) {
        auto row = x[{tm, hl::all}];
        // The biased variance around a sound mean (exact for a constant row, which then goes
        // to the bias), centred before squaring.
        auto [var, mean] = hl::var_mean(row, 1, true, 0);
        out[{tm, hl::all}] = (row - mean) * hl::rsqrt(var + eps) * weight[hl::all] + bias[hl::all];
      }
      return out;
    },
    {.arg_names = {"x", "weight", "bias", "eps"}});

// Layer norm of each row of x[M, N] in double precision (shared with welford.cpp's entry).
std::vector<Tensor> layer_norm_rows(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    double eps) {
  auto v = to_doubles(x), w = to_doubles(weight), b = to_doubles(bias);
  int64_t m = x.size(0), n = x.size(1);
  for (int64_t i = 0; i < m; ++i) {
    double* row = v.data() + i * n;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < n; ++j) mean += row[j];
    mean /= double(n);
    for (int64_t j = 0; j < n; ++j) var += (row[j] - mean) * (row[j] - mean);
    var /= double(n);
    double rstd = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < n; ++j) row[j] = (row[j] - mean) * rstd * w[size_t(j)] + b[size_t(j)];
  }
  return {from_doubles(v, x.sizes(), x.dtype())};
}

static Registrar registered{Entry{
    .name = "layer_norm",
    .summary = "x[M, N], weight[N], bias[N], eps -> layer norm over N",
    .kernel = &layer_norm,
    .bench_shape = {8192, 4096},
    .small_shape = {130, 1000},
    .shape_names = {"M", "N"},
    .dtypes = {DType::f32, DType::bf16},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      // An offset mean checks that the variance is taken around the mean.
      return {Tensor::rand(s, dt, seed, -1.0, 3.0), Tensor::rand({s[1]}, dt, seed + 1, 0.5, 1.5),
              Tensor::rand({s[1]}, dt, seed + 2), 1e-5};
    },
    .reference = [](const std::vector<Arg>& a) {
      return layer_norm_rows(tensor_arg(a, 0), tensor_arg(a, 1), tensor_arg(a, 2), scalar_arg(a, 3));
    },
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return (2.0 * double(s[0] * s[1]) + 2.0 * double(s[1])) * dtype_size(dt);
    },
    .flops = [](const std::vector<int64_t>& s) { return 8.0 * double(s[0] * s[1]); },
}};

}  // namespace deuteron::examples
