// cross_entropy: logits[N, V], labels[N] (int64) -> loss[1], the mean over rows of
// logsumexp(row) - row[label].
//
// The mean needs a sum across all rows, and grid blocks cannot combine their results, so the
// grid is a single block that loops over row blocks and carries the running sum (one thread:
// see the note in the README's benchmark section).
#include <cmath>

#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

static const auto cross_entropy = deuteron::kernel("cross_entropy", [](hl::Tensor logits, hl::Tensor labels) {
  hl::expect(logits.dim() == 2, "logits must be 2-D [N, V]");
  hl::expect(labels.dim() == 1 && labels.size(0) == logits.size(0), "labels must be 1-D [N]");
  hl::expect(labels.dtype() == DType::i64, "labels must be int64");
  int64_t n = logits.size(0);
  auto loss = hl::empty({1}, logits.dtype());
  for (auto g : hl::grid(1)) {
    auto total = hl::zeros({});
    for (auto tn : hl::tile(n)) {
      auto row = logits[{tn, hl::all}];
      auto picked = logits[{tn, labels[tn]}];  // one logit per row: the label's
      auto mx = row.amax(1, true);
      auto lse = hl::log(hl::exp(row - mx).sum(1)) + mx.squeeze(1);
      total = total + (lse - picked).sum(0);
    }
    loss[g] = total / double(n);
  }
  return loss;
});

static std::vector<Tensor> cross_entropy_reference(const std::vector<Arg>& args) {
  const Tensor& logits = tensor_arg(args, 0);
  auto x = to_doubles(logits), labels = to_doubles(tensor_arg(args, 1));
  int64_t n = logits.size(0), v = logits.size(1);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double* row = x.data() + i * v;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, row[j]);
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - mx);
    total += mx + std::log(sum) - row[int64_t(labels[size_t(i)])];
  }
  return {from_doubles({total / double(n)}, {1}, logits.dtype())};
}

static Registrar registered{Entry{
    .name = "cross_entropy",
    .summary = "logits[N, V], labels[N] (int64) -> loss[1] = mean over rows of logsumexp(row) - row[label]",
    .kernel = &cross_entropy,
    .bench_shape = {4096, 32000},
    .small_shape = {130, 1000},
    .shape_names = {"N", "V"},
    .dtypes = {DType::f32, DType::bf16},
    .inputs = [](const std::vector<int64_t>& s, DType dt, uint64_t seed) -> std::vector<Arg> {
      return {Tensor::rand(s, dt, seed, -4.0, 4.0),
              Tensor::rand({s[0]}, DType::i64, seed + 1, 0.0, double(s[1]))};
    },
    .reference = cross_entropy_reference,
    .bytes = [](const std::vector<int64_t>& s, DType dt) {
      return double(s[0] * s[1]) * dtype_size(dt) + 8.0 * double(s[0]);
    },
    .flops = [](const std::vector<int64_t>& s) { return 5.0 * double(s[0] * s[1]); },
}};

}  // namespace deuteron::examples
