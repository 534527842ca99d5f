// Kernels of a user's own, loaded from Python by tests/python/test_library.py.
#include <deuteron/deuteron.h>
#include <deuteron/library.h>

namespace hl = deuteron::hl;

// y = x * a + b over every element, with scalars a (float) and b (int).
static const auto scale_shift = deuteron::kernel("scale_shift", [](hl::Tensor x, hl::Scalar a, hl::Scalar b) {
  auto out = hl::empty_like(x);
  for (auto t : hl::tile(x.sizes())) out[t] = x[t] * a + b;
  return out;
}, {.arg_names = {"x", "a", "b"}});

// Row sums and row maxima of x[M, N]: two outputs.
static const auto row_stats = deuteron::kernel("row_stats", [](hl::Tensor x) {
  hl::expect(x.dim() == 2, "x must be 2-D [M, N]");
  auto sums = hl::empty({x.size(0)}, x.dtype());
  auto maxes = hl::empty({x.size(0)}, x.dtype());
  for (auto tm : hl::tile(x.size(0))) {
    auto row = x[{tm, hl::all}];
    sums[{tm}] = row.sum(1);
    maxes[{tm}] = row.amax(1);
  }
  return std::make_tuple(sums, maxes);
}, {.arg_names = {"x"}});

// A mistake: a [tm, tn] block plus a [tm, N] block. Tracing it fails on the marked line.
static const auto mismatched = deuteron::kernel("mismatched", [](hl::Tensor x, hl::Tensor y) {
  auto out = hl::empty_like(x);
  for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) {
    out[{tm, tn}] = x[{tm, tn}] + y[{tm, hl::all}];  // MISMATCHED_LINE
  }
  return out;
}, {.arg_names = {"x", "y"}});

DEUTERON_KERNEL_LIBRARY(scale_shift, row_stats, mismatched)
