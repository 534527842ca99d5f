// Gated linear units on a, b [B, T, N] (the halves of a projection): swiglu = silu(a) * b and
// geglu = gelu(a) * b with gelu's tanh approximation. Elementwise: one tile loop over all dims.
#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

static const auto swiglu = deuteron::kernel("swiglu", [](hl::Tensor a, hl::Tensor b) {
  auto out = hl::empty_like(a);
  for (auto tile : hl::tile(out.sizes())) out[tile] = hl::silu(a[tile]) * b[tile];
  return out;
}, {.arg_names = {"a", "b"}});

static const auto geglu = deuteron::kernel("geglu", [](hl::Tensor a, hl::Tensor b) {
  auto out = hl::empty_like(a);
  for (auto tile : hl::tile(out.sizes())) out[tile] = hl::gelu(a[tile], "tanh") * b[tile];
  return out;
}, {.arg_names = {"a", "b"}});

// act(a) * b elementwise, in double precision.
template <double (*Act)(double)>
static std::vector<Tensor> glu_reference(const std::vector<Arg>& args) {
  const Tensor& a = tensor_arg(args, 0);
  auto x = to_doubles(a), y = to_doubles(tensor_arg(args, 1));
  for (size_t i = 0; i < x.size(); ++i) x[i] = Act(x[i]) * y[i];
  return {from_doubles(x, a.sizes(), a.dtype())};
}

static std::vector<Arg> glu_inputs(const std::vector<int64_t>& s, DType dt, uint64_t seed) {
  // Wide enough to reach both tails of the activations.
  return {Tensor::rand(s, dt, seed, -6.0, 6.0), Tensor::rand(s, dt, seed + 1)};
}
static double glu_bytes(const std::vector<int64_t>& s, DType dt) {
  return 3.0 * double(s[0] * s[1] * s[2]) * dtype_size(dt);
}

static Registrar r1{Entry{
    .name = "swiglu",
    .summary = "a[B, T, N], b[B, T, N] -> silu(a) * b",
    .kernel = &swiglu,
    .bench_shape = {2, 4096, 4096},
    .small_shape = {3, 130, 1000},
    .shape_names = {"B", "T", "N"},
    .dtypes = {DType::f32, DType::bf16},
    .inputs = glu_inputs,
    .reference = glu_reference<silu>,
    .bytes = glu_bytes,
    // silu: a negation, an exp, an add, a division; then the product.
    .flops = [](const std::vector<int64_t>& s) { return 5.0 * double(s[0] * s[1] * s[2]); },
}};

static Registrar r2{Entry{
    .name = "geglu",
    .summary = "a[B, T, N], b[B, T, N] -> gelu(a, tanh approximation) * b",
    .kernel = &geglu,
    .bench_shape = {2, 4096, 4096},
    .small_shape = {3, 130, 1000},
    .shape_names = {"B", "T", "N"},
    .dtypes = {DType::f32, DType::bf16},
    .inputs = glu_inputs,
    .reference = glu_reference<gelu_tanh>,
    .bytes = glu_bytes,
    // gelu_tanh: a cubic, a tanh and a few multiply-adds; then the product.
    .flops = [](const std::vector<int64_t>& s) { return 10.0 * double(s[0] * s[1] * s[2]); },
}};

}  // namespace deuteron::examples
