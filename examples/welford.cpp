// welford: layer norm over the last dim of x[M, N] (weight, bias, no eps argument), whose
// mean and variance come from Welford's streaming algorithm: one pass over column blocks
// merges each block's (count, mean, M2), from hl::var_mean, into the running ones with the
// parallel update of Chan et al., so a row never has to fit in one block; a second pass writes
// the output.
#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

std::vector<Tensor> layer_norm_rows(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    double eps);  // layer_norm.cpp

static constexpr double kEps = 1e-5;

static const auto welford = deuteron::kernel(
    "welford", [](hl::Tensor weight, hl::Tensor bias, hl::Tensor x) {
      int64_t m = x.size(0), n = x.size(1);
      auto out = hl::empty_like(x);
      for (auto tm : hl::tile(m, {.name = "rows"})) {
        auto count = hl::zeros({tm});
        auto mean = hl::zeros({tm});
        auto m2 = hl::zeros({tm});
        for (auto tn : hl::tile(n, {.name = "n"})) {
          auto chunk = x[{tm, tn}];
          auto chunk_count = (tn.end() - tn.begin()).to(DType::f32);  // ragged last block
          auto [chunk_var, chunk_mean] = hl::var_mean(chunk, 1, false, 0);  // biased: M2 / count
          auto chunk_m2 = chunk_var * chunk_count;
          auto new_count = count + chunk_count;
          auto delta = chunk_mean - mean;
          mean = mean + delta * (chunk_count / new_count);
          // delta * (delta * w), not delta * delta * w: the first block has w = 0 and a delta
          // near the f32 limit, whose square alone would be inf (and inf * 0 NaN).
          m2 = m2 + chunk_m2 + delta * (delta * (count * chunk_count / new_count));
          count = new_count;
        }
        auto rstd = hl::rsqrt(m2 / count + kEps).unsqueeze(1);
        auto mu = mean.unsqueeze(1);
        for (auto tn : hl::tile(n, {.name = "n_out"})) out[{tm, tn}] = (x[{tm, tn}] - mu) * rstd * weight[tn] + bias[tn];
      }
      return out;
    },
    {.arg_names = {"weight", "bias", "x"}});

static Registrar registered{Entry{
    .name = "welford",
    .summary = "weight[N], bias[N], x[M, N] -> layer norm over N (Welford mean/var over column blocks)",
    .kernel = &welford,
    .bench_shape = {65536, 512},
    .small_shape = {130, 1000},
    .shape_names = {"M", "N"},
    .dtypes = {DType::f32, DType::bf16},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      // An offset mean checks that the variance is taken around it. (Not much larger: with
      // single-column blocks the running mean takes N rounding steps, each ulp(mean) / 2.)
      return {Tensor::rand({s[1]}, dt, seed + 1, 0.5, 1.5), Tensor::rand({s[1]}, dt, seed + 2),
              Tensor::rand(s, dt, seed, -1.0, 3.0)};
    },
    .reference = [](const std::vector<Arg>& a) {
      return layer_norm_rows(tensor_arg(a, 2), tensor_arg(a, 0), tensor_arg(a, 1), kEps);
    },
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return (2.0 * double(s[0] * s[1]) + 2.0 * double(s[1])) * dtype_size(dt);
    },
    .flops = [](const std::vector<int64_t>& s) { return 10.0 * double(s[0] * s[1]); },
}};

}  // namespace deuteron::examples
