// rms_norm: y = x * rsqrt(mean(x^2) + eps) * w over the last dim of x[M, N], also returning
// rstd[M] (in float32 whatever x's dtype, as PyTorch keeps norm statistics) for the backward.
// rms_norm_bwd: its gradients, grad_x[M, N] and grad_w[N], in one kernel.
#include <cmath>

#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

static const auto rms_norm = deuteron::kernel("rms_norm", [](hl::Tensor x, hl::Tensor w, hl::Scalar eps) {
  int64_t m = x.size(0);
  auto y = hl::empty_like(x);
  auto rstd = hl::empty({m}, DType::f32);
  for (auto tm : hl::tile(m, {.name = "rows"})) {
    auto row = x[{tm, hl::all}];
    // A mean of squares: nothing cancels, so the plain sum / n is as accurate as hl::mean (and
    // saves its extra pass over the row). n as hl::count, not x.size(1): a device value, which
    // an ahead-of-time build's general variant reads at run time.
    auto r = hl::rsqrt((row * row).sum(1) / hl::count(row, 1) + eps);
    y[{tm, hl::all}] = row * r.unsqueeze(1) * w[hl::all];
    rstd[tm] = r;
  }
  return std::make_tuple(y, rstd);
}, {.arg_names = {"x", "w", "eps"}});

// With r = rstd of a row and c = mean_j(w_j * gy_j * x_j) over that row:
//   grad_x = r * w * gy - x * r^3 * c,     grad_w = sum over rows of gy * x * r.
// The grid runs over blocks of whole rows (c needs the whole row; each row is read once), and
// each block adds its rows' share of grad_w into the f32 output with hl::atomic_add.
static const auto rms_norm_bwd = deuteron::kernel(
    "rms_norm_bwd", [](hl::Tensor grad_y, hl::Tensor x, hl::Tensor w, hl::Tensor rstd) {
      auto grad_x = hl::empty_like(x);
      auto grad_w = hl::zeros({w.size(0)});  // f32: atomic adds are f32
      for (auto tm : hl::tile(x.size(0), {.name = "rows"})) {
        auto gy = grad_y[{tm, hl::all}], xs = x[{tm, hl::all}];
        auto r = rstd[tm].unsqueeze(1);
        auto c = (gy * w[hl::all] * xs).sum(1, true) / hl::count(xs, 1);  // a plain mean: nothing subtracts it
        grad_x[{tm, hl::all}] = r * w[hl::all] * gy - xs * (r * r * r) * c;
        hl::atomic_add(grad_w, {hl::all}, (gy * xs * r).sum(0));
      }
      return std::make_tuple(grad_x, grad_w);
    },
    {.arg_names = {"grad_y", "x", "w", "rstd"}});

static std::vector<double> row_rstd(const std::vector<double>& x, int64_t m, int64_t n, double eps) {
  std::vector<double> r(size_t(m), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) r[size_t(i)] += x[size_t(i * n + j)] * x[size_t(i * n + j)];
    r[size_t(i)] = 1.0 / std::sqrt(r[size_t(i)] / double(n) + eps);
  }
  return r;
}

static std::vector<Tensor> rms_norm_reference(const std::vector<Arg>& args) {
  const Tensor& xt = tensor_arg(args, 0);
  auto x = to_doubles(xt), w = to_doubles(tensor_arg(args, 1));
  int64_t m = xt.size(0), n = xt.size(1);
  auto r = row_rstd(x, m, n, scalar_arg(args, 2));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) x[size_t(i * n + j)] *= r[size_t(i)] * w[size_t(j)];
  return {from_doubles(x, xt.sizes(), xt.dtype()), from_doubles(r, {m}, DType::f32)};
}

static std::vector<Tensor> rms_norm_bwd_reference(const std::vector<Arg>& args) {
  const Tensor& xt = tensor_arg(args, 1);
  const Tensor& wt = tensor_arg(args, 2);
  auto gy = to_doubles(tensor_arg(args, 0)), x = to_doubles(xt), w = to_doubles(wt);
  auto r = to_doubles(tensor_arg(args, 3));
  int64_t m = xt.size(0), n = xt.size(1);
  std::vector<double> gx(x.size()), gw(size_t(n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    double ri = r[size_t(i)], c = 0;
    for (int64_t j = 0; j < n; ++j) c += w[size_t(j)] * gy[size_t(i * n + j)] * x[size_t(i * n + j)];
    c /= double(n);
    for (int64_t j = 0; j < n; ++j) {
      size_t k = size_t(i * n + j);
      gx[k] = ri * w[size_t(j)] * gy[k] - x[k] * ri * ri * ri * c;
      gw[size_t(j)] += gy[k] * x[k] * ri;
    }
  }
  return {from_doubles(gx, xt.sizes(), xt.dtype()), from_doubles(gw, wt.sizes(), DType::f32)};
}

static constexpr double kEps = 1e-5;

static Registrar r1{Entry{
    .name = "rms_norm",
    .summary = "x[M, N], w[N], eps -> y = x * rsqrt(mean(x^2) + eps) * w, rstd[M] (float32)",
    .kernel = &rms_norm,
    .bench_shape = {8192, 4096},
    .small_shape = {130, 1000},
    .shape_names = {"M", "N"},
    .dtypes = {DType::f32, DType::bf16},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      return {Tensor::rand(s, dt, seed), Tensor::rand({s[1]}, dt, seed + 1, 0.5, 1.5), kEps};
    },
    .reference = rms_norm_reference,
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return (2.0 * double(s[0] * s[1]) + double(s[1])) * dtype_size(dt) + 4.0 * double(s[0]);
    },
    .flops = [](const std::vector<int64_t>& s) { return 4.0 * double(s[0] * s[1]); },
}};

static Registrar r2{Entry{
    .name = "rms_norm_bwd",
    .summary = "grad_y[M, N], x[M, N], w[N], rstd[M] (float32) -> grad_x[M, N], grad_w[N] (float32)",
    .kernel = &rms_norm_bwd,
    .bench_shape = {8192, 4096},
    .small_shape = {130, 1000},
    .shape_names = {"M", "N"},
    .dtypes = {DType::f32, DType::bf16},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      Tensor x = Tensor::rand(s, dt, seed);
      // rstd as the forward computed it from this x (the backward only reads it).
      auto r = row_rstd(to_doubles(x), s[0], s[1], kEps);
      return {Tensor::rand(s, dt, seed + 1), x, Tensor::rand({s[1]}, dt, seed + 2, 0.5, 1.5),
              from_doubles(r, {s[0]}, DType::f32)};
    },
    .reference = rms_norm_bwd_reference,
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return (3.0 * double(s[0] * s[1]) + 2.0 * double(s[1])) * dtype_size(dt) + 4.0 * double(s[0]);
    },
    .flops = [](const std::vector<int64_t>& s) { return 9.0 * double(s[0] * s[1]); },
    // grad_w sums M rows in f32: its rounding grows with M beyond the default tolerance.
    .tolerance = [](DType dt) { return dt == DType::f32 ? Tolerance{1e-4, 2e-4} : default_tolerance(dt); },
}};

}  // namespace deuteron::examples
