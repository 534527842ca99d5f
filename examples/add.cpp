// add: out = x + y, elementwise over any shape.
#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

// The kernel, as a user writes it: one tile loop over every dim of the output.
static const auto add = deuteron::kernel("add", [](hl::Tensor x, hl::Tensor y) {
  hl::expect(x.sizes() == y.sizes(), "x and y must have the same shape");
  auto out = hl::empty_like(x);
  for (auto tile : hl::tile(out.sizes())) out[tile] = x[tile] + y[tile];
  return out;
}, {.arg_names = {"x", "y"}});

static std::vector<Tensor> add_reference(const std::vector<Arg>& args) {
  const Tensor& x = tensor_arg(args, 0);
  auto a = to_doubles(x), b = to_doubles(tensor_arg(args, 1));
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return {from_doubles(a, x.sizes(), x.dtype())};
}

static Registrar registered{Entry{
    .name = "add",
    .summary = "x[M, N], y[M, N] -> x + y",
    .kernel = &add,
    .bench_shape = {4096, 4096},
    .small_shape = {130, 1000},
    .shape_names = {"M", "N"},
    .dtypes = {DType::f32, DType::bf16},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      return {Tensor::rand(s, dt, seed), Tensor::rand(s, dt, seed + 1)};
    },
    .reference = add_reference,
    .bytes = [](const std::vector<int64_t>& s, DType dt) { return 3.0 * double(s[0] * s[1]) * dtype_size(dt); },
    .flops = [](const std::vector<int64_t>& s) { return double(s[0] * s[1]); },
}};

}  // namespace deuteron::examples
