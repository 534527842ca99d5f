// batch_softmax: softmax over the last dim of a 3-D tensor x[B, M, N]. The grid tiles both
// leading dims, so each block owns whole rows and normalises them in one pass.
#include <cmath>

#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

static const auto batch_softmax = deuteron::kernel("batch_softmax", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  for (auto [tb, tm] : hl::tile({x.size(0), x.size(1)}, {"batch", "rows"})) {
    auto row = x[{tb, tm, hl::all}];
    auto e = hl::exp(row - row.amax(2, true));  // subtracting the max keeps exp finite
    out[{tb, tm, hl::all}] = e / e.sum(2, true);
  }
  return out;
}, {.arg_names = {"x"}});

static std::vector<Tensor> batch_softmax_reference(const std::vector<Arg>& args) {
  const Tensor& x = tensor_arg(args, 0);
  auto v = to_doubles(x);
  int64_t n = x.size(2), rows = x.size(0) * x.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    double* row = v.data() + r * n;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int64_t j = 0; j < n; ++j) row[j] /= sum;
  }
  return {from_doubles(v, x.sizes(), x.dtype())};
}

static Registrar registered{Entry{
    .name = "batch_softmax",
    .summary = "x[B, M, N] -> softmax over N",
    .kernel = &batch_softmax,
    .bench_shape = {4, 1024, 4096},
    .small_shape = {3, 130, 1000},
    .shape_names = {"B", "M", "N"},
    .dtypes = {DType::f32, DType::bf16},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      return {Tensor::rand(s, dt, seed, -4.0, 4.0)};
    },
    .reference = batch_softmax_reference,
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return 2.0 * double(s[0] * s[1] * s[2]) * dtype_size(dt);
    },
    .flops = [](const std::vector<int64_t>& s) { return 4.0 * double(s[0] * s[1] * s[2]); },
}};

}  // namespace deuteron::examples
