// The matmul family: matmul, bmm, broadcast_matmul, a matmul with a fused bias + residual +
// gelu epilogue (processed in sub-tiles along N), and a matmul fused with layer norm.
// Every product accumulates in f32 (hl::dot); bf16 inputs give bf16 outputs.
#include <cmath>

#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

// out[M, N] = x[M, K] @ y[K, N]: one output tile per grid step, the K loop accumulating into
// it.
static const auto matmul = deuteron::kernel("matmul", [](hl::Tensor x, hl::Tensor y) {
  int64_t m = x.size(0), k = x.size(1), n = y.size(1);
  hl::expect(y.size(0) == k, "x is [M, K] and y must be [K, N]: y's first dim is not x's second");
  auto out = hl::empty({m, n}, x.dtype());
  for (auto [tm, tn] : hl::tile({m, n}, {"m", "n"})) {
    auto acc = hl::zeros({tm, tn});
    for (auto tk : hl::tile(k, {.name = "k"})) acc = hl::dot(x[{tm, tk}], y[{tk, tn}], acc);
    out[{tm, tn}] = acc;
  }
  return out;
}, {.arg_names = {"x", "y"}});

// out[B, M, N] = x[B, M, K] @ y[B, K, N].
static const auto bmm = deuteron::kernel("bmm", [](hl::Tensor x, hl::Tensor y) {
  int64_t b = x.size(0), m = x.size(1), k = x.size(2), n = y.size(2);
  auto out = hl::empty({b, m, n}, x.dtype());
  for (auto [tb, tm, tn] : hl::tile({b, m, n}, {"batch", "m", "n"})) {
    auto acc = hl::zeros({tb, tm, tn});
    for (auto tk : hl::tile(k, {.name = "k"})) acc = hl::dot(x[{tb, tm, tk}], y[{tb, tk, tn}], acc);
    out[{tb, tm, tn}] = acc;
  }
  return out;
}, {.arg_names = {"x", "y"}});

// out[B, M, N] = x[B, M, K] @ w[K, N]: w broadcast over the batch, as torch.matmul does.
static const auto broadcast_matmul = deuteron::kernel("broadcast_matmul", [](hl::Tensor x, hl::Tensor w) {
  int64_t b = x.size(0), m = x.size(1), k = x.size(2), n = w.size(1);
  auto out = hl::empty({b, m, n}, x.dtype());
  for (auto [tb, tm, tn] : hl::tile({b, m, n}, {"batch", "m", "n"})) {
    auto acc = hl::zeros({tb, tm, tn});
    for (auto tk : hl::tile(k, {.name = "k"})) acc = hl::dot(x[{tb, tm, tk}], w[{tk, tn}], acc);
    out[{tb, tm, tn}] = acc;
  }
  return out;
}, {.arg_names = {"x", "w"}});

// out = gelu(x @ w + bias + residual), cast to x's dtype. The epilogue after the K loop runs
// over sub-tiles of the N block (the `epilogue_subtiles` tunable).
static const auto epilogue_subtiling = deuteron::kernel(
    "epilogue_subtiling", [](hl::Tensor x, hl::Tensor w, hl::Tensor bias, hl::Tensor residual) {
      int64_t m = x.size(0), k = x.size(1), n = w.size(1);
      auto out = hl::empty({m, n}, x.dtype());
      for (auto [tm, tn] : hl::tile({m, n}, {"m", "n"})) {
        auto acc = hl::zeros({tm, tn});
        for (auto tk : hl::tile(k, {.name = "k"})) acc = hl::dot(x[{tm, tk}], w[{tk, tn}], acc);
        auto y = acc + bias[tn] + residual[{tm, tn}];
        out[{tm, tn}] = hl::gelu(y).to(out.dtype());
      }
      return out;
    },
    {.arg_names = {"x", "w", "bias", "residual"}});

// out = layer_norm(x @ y) over N, with weight and bias: each grid step owns whole rows, so the
// normalisation runs on the accumulator without writing the product out.
static const auto matmul_layernorm = deuteron::kernel(
    "matmul_layernorm", [](hl::Tensor x, hl::Tensor y, hl::Tensor weight, hl::Tensor bias) {
      int64_t m = x.size(0), k = x.size(1), n = y.size(1);
      auto out = hl::empty({m, n}, x.dtype());
      for (auto tm : hl::tile(m, {.name = "m"})) {
        auto w = weight[hl::all];  // read first: the accumulator below spans this whole dim
        auto b = bias[hl::all];
        auto acc = hl::zeros({tm, n});
        for (auto tk : hl::tile(k, {.name = "k"})) acc = hl::dot(x[{tm, tk}], y[{tk, hl::all}], acc);
        auto [var, mean] = hl::var_mean(acc, 1, true, 0);  // biased, as layer_norm
        out[{tm, hl::all}] = ((acc - mean) * hl::rsqrt(var + 1e-5) * w + b).to(out.dtype());
      }
      return out;
    },
    {.arg_names = {"x", "y", "weight", "bias"}});

// ---- references (double precision, plain loops) -----------------------------------------------

// c[bi] = a[bi or 0] @ b[bi or 0] for row-major [batch, M, K] and [batch, K, N] data.
static std::vector<double> batched_product(const std::vector<double>& a, const std::vector<double>& b, int64_t batch,
                                           int64_t m, int64_t k, int64_t n, bool a_batched, bool b_batched) {
  std::vector<double> c(size_t(batch * m * n), 0.0);
  for (int64_t bi = 0; bi < batch; ++bi) {
    const double* pa = a.data() + (a_batched ? bi * m * k : 0);
    const double* pb = b.data() + (b_batched ? bi * k * n : 0);
    double* pc = c.data() + bi * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) {
        double av = pa[i * k + p];
        for (int64_t j = 0; j < n; ++j) pc[i * n + j] += av * pb[p * n + j];
      }
  }
  return c;
}

static std::vector<Tensor> matmul_reference(const std::vector<Arg>& args) {
  const Tensor& x = tensor_arg(args, 0);
  const Tensor& y = tensor_arg(args, 1);
  int64_t m = x.size(0), k = x.size(1), n = y.size(1);
  return {from_doubles(batched_product(to_doubles(x), to_doubles(y), 1, m, k, n, false, false), {m, n}, x.dtype())};
}

static std::vector<Tensor> bmm_reference(const std::vector<Arg>& args) {
  const Tensor& x = tensor_arg(args, 0);
  const Tensor& y = tensor_arg(args, 1);
  int64_t b = x.size(0), m = x.size(1), k = x.size(2), n = y.size(-1);
  bool shared = y.dim() == 2;
  return {from_doubles(batched_product(to_doubles(x), to_doubles(y), b, m, k, n, true, !shared), {b, m, n}, x.dtype())};
}

static std::vector<Tensor> epilogue_reference(const std::vector<Arg>& args) {
  const Tensor& x = tensor_arg(args, 0);
  const Tensor& w = tensor_arg(args, 1);
  int64_t m = x.size(0), k = x.size(1), n = w.size(1);
  auto c = batched_product(to_doubles(x), to_doubles(w), 1, m, k, n, false, false);
  auto bias = to_doubles(tensor_arg(args, 2)), res = to_doubles(tensor_arg(args, 3));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double& v = c[size_t(i * n + j)];
      v = gelu_erf(v + bias[size_t(j)] + res[size_t(i * n + j)]);
    }
  return {from_doubles(c, {m, n}, x.dtype())};
}

static std::vector<Tensor> matmul_layernorm_reference(const std::vector<Arg>& args) {
  const Tensor& x = tensor_arg(args, 0);
  const Tensor& y = tensor_arg(args, 1);
  int64_t m = x.size(0), k = x.size(1), n = y.size(1);
  auto c = batched_product(to_doubles(x), to_doubles(y), 1, m, k, n, false, false);
  auto w = to_doubles(tensor_arg(args, 2)), b = to_doubles(tensor_arg(args, 3));
  for (int64_t i = 0; i < m; ++i) {
    double* row = c.data() + i * n;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < n; ++j) mean += row[j];
    mean /= double(n);
    for (int64_t j = 0; j < n; ++j) var += (row[j] - mean) * (row[j] - mean);
    var /= double(n);
    double r = 1.0 / std::sqrt(var + 1e-5);
    for (int64_t j = 0; j < n; ++j) row[j] = (row[j] - mean) * r * w[size_t(j)] + b[size_t(j)];
  }
  return {from_doubles(c, {m, n}, x.dtype())};
}

// ---- registration -------------------------------------------------------------------------------

// Shapes are {M, K, N} (matmul family) or {B, M, K, N} (batched).
// f32 sums of K products carry rounding that grows with K (about 1e-4 absolute at K = 2048 for
// these inputs): the check allows it.
static Tolerance product_tolerance(DType dt) {
  Tolerance t = default_tolerance(dt);
  if (dt == DType::f32) t.atol = 5e-4;
  return t;
}
static double product_flops(const std::vector<int64_t>& s) {
  double f = 2.0;
  for (int64_t d : s) f *= double(d);
  return f;
}

static Registrar r_matmul{Entry{
    .name = "matmul",
    .summary = "x[M, K], y[K, N] -> x @ y (f32 accumulation)",
    .kernel = &matmul,
    .bench_shape = {2048, 2048, 2048},
    .small_shape = {130, 67, 100},
    .shape_names = {"M", "K", "N"},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      return {Tensor::rand({s[0], s[1]}, dt, seed), Tensor::rand({s[1], s[2]}, dt, seed + 1)};
    },
    .reference = matmul_reference,
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return double(s[0] * s[1] + s[1] * s[2] + s[0] * s[2]) * dtype_size(dt);
    },
    .flops = product_flops,
    .compute_bound = true,
    .tolerance = product_tolerance,
}};

static Registrar r_bmm{Entry{
    .name = "bmm",
    .summary = "a[B, M, K], b[B, K, N] -> a @ b per batch (f32 accumulation)",
    .kernel = &bmm,
    .bench_shape = {8, 512, 512, 512},
    .small_shape = {3, 37, 29, 70},
    .shape_names = {"B", "M", "K", "N"},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      return {Tensor::rand({s[0], s[1], s[2]}, dt, seed), Tensor::rand({s[0], s[2], s[3]}, dt, seed + 1)};
    },
    .reference = bmm_reference,
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return double(s[0] * (s[1] * s[2] + s[2] * s[3] + s[1] * s[3])) * dtype_size(dt);
    },
    .flops = product_flops,
    .compute_bound = true,
    .tolerance = product_tolerance,
}};

static Registrar r_broadcast{Entry{
    .name = "broadcast_matmul",
    .summary = "x[B, M, K], w[K, N] -> x @ w, w shared across the batch",
    .kernel = &broadcast_matmul,
    .bench_shape = {16, 512, 768, 1024},
    .small_shape = {3, 37, 29, 70},
    .shape_names = {"B", "M", "K", "N"},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      return {Tensor::rand({s[0], s[1], s[2]}, dt, seed), Tensor::rand({s[2], s[3]}, dt, seed + 1)};
    },
    .reference = bmm_reference,
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return double(s[0] * s[1] * s[2] + s[2] * s[3] + s[0] * s[1] * s[3]) * dtype_size(dt);
    },
    .flops = product_flops,
    .compute_bound = true,
    .tolerance = product_tolerance,
}};

static Registrar r_epilogue{Entry{
    .name = "epilogue_subtiling",
    .summary = "x[M, K], w[K, N], bias[N], residual[M, N] -> gelu(x @ w + bias + residual), epilogue in sub-tiles",
    .kernel = &epilogue_subtiling,
    .bench_shape = {1024, 1024, 1024},
    .small_shape = {130, 67, 100},
    .shape_names = {"M", "K", "N"},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      return {Tensor::rand({s[0], s[1]}, dt, seed), Tensor::rand({s[1], s[2]}, dt, seed + 1),
              Tensor::rand({s[2]}, dt, seed + 2), Tensor::rand({s[0], s[2]}, dt, seed + 3)};
    },
    .reference = epilogue_reference,
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return double(s[0] * s[1] + s[1] * s[2] + s[2] + 2 * s[0] * s[2]) * dtype_size(dt);
    },
    .flops = product_flops,
    .compute_bound = true,
    .tolerance = product_tolerance,
}};

static Registrar r_layernorm{Entry{
    .name = "matmul_layernorm",
    .summary = "x[M, K], y[K, N], weight[N], bias[N] -> layer_norm(x @ y) over N, fused",
    .kernel = &matmul_layernorm,
    .bench_shape = {1024, 1024, 1024},
    .small_shape = {130, 67, 100},
    .shape_names = {"M", "K", "N"},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      return {Tensor::rand({s[0], s[1]}, dt, seed), Tensor::rand({s[1], s[2]}, dt, seed + 1),
              Tensor::rand({s[2]}, dt, seed + 2, 0.5, 1.5), Tensor::rand({s[2]}, dt, seed + 3)};
    },
    .reference = matmul_layernorm_reference,
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return double(s[0] * s[1] + s[1] * s[2] + 2 * s[2] + s[0] * s[2]) * dtype_size(dt);
    },
    .flops = product_flops,
    .compute_bound = true,
    .tolerance = product_tolerance,
}};

}  // namespace deuteron::examples
