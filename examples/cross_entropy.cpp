// cross_entropy: logits[N, V], labels[N] (int64), ignore_index -> loss[1] (f32), the mean over
// the rows whose label is not ignore_index of logsumexp(row) - row[label] (torch's
// cross_entropy with reduction "mean"; its default ignore_index is -100).
//
// Each block of rows adds its share of the mean into the one-element output with
// hl::atomic_add, so the row blocks are the grid and run on every core.
#include <cmath>

#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

static const auto cross_entropy = deuteron::kernel(
    "cross_entropy",
    [](hl::Tensor logits, hl::Tensor labels, hl::Scalar ignore_index) {
      hl::expect(logits.dim() == 2, "logits must be 2-D [N, V]");
      hl::expect(labels.dim() == 1 && labels.size(0) == logits.size(0), "labels must be 1-D [N]");
      hl::expect(labels.dtype() == DType::i64, "labels must be int64");
      hl::expect(ignore_index.dtype() == DType::i64, "ignore_index must be an integer");
      int64_t n = logits.size(0);
      auto loss = hl::zeros({1});  // f32 whatever the logits: atomic adds are f32
      for (auto tn : hl::tile(n, {.name = "rows"})) {
        // The mean's denominator: rows not ignored, over all rows (each block counts them all:
        // N labels, next to the N x V logits).
        auto counted = (labels[{hl::all}] != ignore_index).sum(0).to(DType::f32);
        auto label = labels[tn];
        auto used = label != ignore_index;
        auto row = logits[{tn, hl::all}];
        auto picked = logits[{tn, hl::where(used, label, 0)}];  // one logit per row: the label's
        auto mx = row.amax(1, true);
        // log(sum) + max - picked cancels for large logits; picked - max does not (both are near).
        auto loss_rows = hl::log(hl::exp(row - mx).sum(1)) - (picked - mx.squeeze(1));
        hl::atomic_add(loss, {0}, hl::where(used, loss_rows, 0.0f).sum(0) / counted);
      }
      return loss;
    },
    {.arg_names = {"logits", "labels", "ignore_index"}});

static std::vector<Tensor> cross_entropy_reference(const std::vector<Arg>& args) {
  const Tensor& logits = tensor_arg(args, 0);
  auto x = to_doubles(logits), labels = to_doubles(tensor_arg(args, 1));
  double ignore = scalar_arg(args, 2);
  int64_t n = logits.size(0), v = logits.size(1), counted = 0;
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (labels[size_t(i)] == ignore) continue;
    const double* row = x.data() + i * v;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - mx);
    total += std::log(sum) - (row[int64_t(labels[size_t(i)])] - mx);  // no cancellation, as in the kernel
    ++counted;
  }
  return {from_doubles({total / double(counted)}, {1}, DType::f32)};
}

static Registrar registered{Entry{
    .name = "cross_entropy",
    .summary = "logits[N, V], labels[N] (int64), ignore_index -> loss[1] (f32) = mean over rows not ignored of "
               "logsumexp(row) - row[label]",
    .kernel = &cross_entropy,
    .bench_shape = {4096, 32000},
    .small_shape = {130, 1000},
    .shape_names = {"N", "V"},
    .dtypes = {DType::f32, DType::bf16},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      Tensor labels = Tensor::rand({s[0]}, DType::i64, seed + 1, 0.0, double(s[1]));
      for (int64_t i = 5; i < s[0]; i += 7) labels.set(i, -100);  // padding rows, as torch ignores
      return {Tensor::rand(s, dt, seed, -4.0, 4.0), labels, int64_t(-100)};
    },
    .reference = cross_entropy_reference,
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return double(s[0] * s[1]) * dtype_size(dt) + 8.0 * double(s[0]);
    },
    .flops = [](const std::vector<int64_t>& s) { return 5.0 * double(s[0] * s[1]); },
}};

}  // namespace deuteron::examples
