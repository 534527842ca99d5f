// cumsum: torch.cumsum(x, dim=-1) of x[M, N], a scan along each whole row (hl::cumsum). The
// cpu target runs it as SIMD prefix sums in double per row (dt::cumsum_f32_in_double, from x
// straight into out), pallas as jax.lax.cumsum, triton as tl.cumsum.
#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

static const auto cumsum = deuteron::kernel("cumsum", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  for (auto tm : hl::tile(x.size(0), {.name = "rows"})) out[{tm, hl::all}] = hl::cumsum(x[{tm, hl::all}], 1);
  return out;
}, {.arg_names = {"x"}});

static Registrar registered{Entry{
    .name = "cumsum",
    .summary = "x[M, N] -> cumsum over N (inclusive, as torch.cumsum)",
    .kernel = &cumsum,
    .bench_shape = {8192, 2560},
    .small_shape = {130, 1000},
    .shape_names = {"M", "N"},
    .dtypes = {DType::f32, DType::bf16},
    // Non-negative values: every prefix sum is as large as its terms, so the f32 rounding of
    // N additions stays relative to the result.
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      return {Tensor::rand(s, dt, seed, 0.0, 1.0)};
    },
    .reference = [](const std::vector<Arg>& a) {
      const Tensor& x = tensor_arg(a, 0);
      std::vector<double> v = to_doubles(x);
      int64_t n = x.size(-1);
      for (int64_t r = 0; r < x.numel() / n; ++r)
        for (int64_t j = 1; j < n; ++j) v[size_t(r * n + j)] += v[size_t(r * n + j - 1)];
      return std::vector<Tensor>{from_doubles(v, x.sizes(), x.dtype())};
    },
    .bytes = [](const std::vector<int64_t>& s, DType dt) { return 2.0 * double(s[0] * s[1]) * dtype_size(dt); },
    .flops = [](const std::vector<int64_t>& s) { return double(s[0] * s[1]); },
}};

}  // namespace deuteron::examples
