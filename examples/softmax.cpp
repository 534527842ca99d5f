// softmax over the last dim of x[M, N], three ways: single pass over a whole row, decomposed
// into max / exp / sum steps, and two passes over column blocks (online max and sum).
#include <cmath>

#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

// A whole row per block: read it, subtract its max, exponentiate, normalise.
static const auto softmax = deuteron::kernel("softmax", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  for (auto tm : hl::tile(x.size(0), {.name = "rows"})) {
    auto row = x[{tm, hl::all}];
    auto e = hl::exp(row - row.amax(1, true));
    out[{tm, hl::all}] = e / e.sum(1, true);
  }
  return out;
}, {.arg_names = {"x"}});

// The same computation spelled out step by step, as PyTorch's decomposition does.
static const auto softmax_decomposed = deuteron::kernel("softmax_decomposed", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  for (auto tm : hl::tile(x.size(0), {.name = "rows"})) {
    auto values = x[{tm, hl::all}];
    auto amax = hl::amax(values, 1, true);
    auto exp = hl::exp(values - amax);
    auto sum_exp = hl::sum(exp, 1, true);
    out[{tm, hl::all}] = exp / sum_exp;
  }
  return out;
}, {.arg_names = {"x"}});

// Two passes over blocks of a row: a running max with a rescaled running sum, then the output.
static const auto softmax_two_pass = deuteron::kernel("softmax_two_pass", [](hl::Tensor x) {
  auto out = hl::empty_like(x);
  int64_t m = x.size(0), n = x.size(1);
  for (auto tm : hl::tile(m, {.name = "rows"})) {
    auto mi = hl::full({tm}, -INFINITY);
    auto di = hl::zeros({tm});
    for (auto tn : hl::tile(n, {.name = "n"})) {
      auto values = x[{tm, tn}];
      auto local_max = hl::maximum(mi, values.amax(1));
      // While a row has seen only -inf (a masked prefix), exponents are taken against 0, not
      // against -inf: exp(-inf - -inf) would be NaN, exp(-inf - 0) is the 0 wanted.
      auto shift = hl::where(local_max == -INFINITY, 0.0f, local_max);
      di = di * hl::exp(mi - shift) + hl::exp(values - shift.unsqueeze(1)).sum(1);
      mi = local_max;
    }
    for (auto tn : hl::tile(n, {.name = "n_out"})) {
      auto values = x[{tm, tn}];
      out[{tm, tn}] = hl::exp(values - mi.unsqueeze(1)) / di.unsqueeze(1);
    }
  }
  return out;
}, {.arg_names = {"x"}});

// Row softmax of a [rows, n] view of the data, in double precision.
std::vector<Tensor> softmax_reference(const std::vector<Arg>& args) {
  const Tensor& x = tensor_arg(args, 0);
  auto v = to_doubles(x);
  int64_t n = x.size(-1), rows = x.numel() / n;
  for (int64_t r = 0; r < rows; ++r) {
    double* row = v.data() + r * n;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int64_t j = 0; j < n; ++j) row[j] /= sum;
  }
  return {from_doubles(v, x.sizes(), x.dtype())};
}

static std::vector<Arg> softmax_inputs(const std::vector<int64_t>& s, DType dt, uint64_t seed) {
  return {Tensor::rand(s, dt, seed, -4.0, 4.0)};
}
static double softmax_bytes(const std::vector<int64_t>& s, DType dt) {
  double n = 1;
  for (int64_t d : s) n *= double(d);
  return 2.0 * n * dtype_size(dt);
}
static double softmax_flops(const std::vector<int64_t>& s) {
  double n = 1;
  for (int64_t d : s) n *= double(d);
  return 4.0 * n;
}

static Registrar r1{Entry{.name = "softmax",
                          .summary = "x[M, N] -> softmax over N (one pass per whole row)",
                          .kernel = &softmax,
                          .bench_shape = {8192, 2560},
                          .small_shape = {130, 1000},
                          .shape_names = {"M", "N"},
                          .inputs = softmax_inputs,
                          .reference = softmax_reference,
                          .bytes = softmax_bytes,
                          .flops = softmax_flops}};
static Registrar r2{Entry{.name = "softmax_decomposed",
                          .summary = "x[M, N] -> softmax over N (max, exp, sum as separate steps)",
                          .kernel = &softmax_decomposed,
                          .bench_shape = {8192, 2560},
                          .small_shape = {130, 1000},
                          .shape_names = {"M", "N"},
                          .inputs = softmax_inputs,
                          .reference = softmax_reference,
                          .bytes = softmax_bytes,
                          .flops = softmax_flops}};
static Registrar r3{Entry{.name = "softmax_two_pass",
                          .summary = "x[M, N] -> softmax over N (online max and sum over column blocks)",
                          .kernel = &softmax_two_pass,
                          .bench_shape = {4096, 4096},
                          .small_shape = {130, 1000},
                          .shape_names = {"M", "N"},
                          .inputs = softmax_inputs,
                          .reference = softmax_reference,
                          .bytes = softmax_bytes,
                          .flops = softmax_flops}};

}  // namespace deuteron::examples
