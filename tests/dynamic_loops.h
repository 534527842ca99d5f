// Kernels with tile loops bounded on the device, their inputs and double-precision references,
// shared by the cpu, pallas and triton tests (test_dynamic_loops.cpp, test_pallas_loops.cpp,
// test_triton.cpp).
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "config_fit.h"
#include "deuteron/deuteron.h"

namespace deuteron::dynamic_loops {

namespace hl = deuteron::hl;

// The pallas tests pass x as [rows, 1, cols] and get outputs with a unit dim before the last
// (`tpu`): a TPU block's last two dims must be whole or (8, 128) multiples, so one row at a grid
// index is a [1, cols] block there. The other targets take the plain [rows, cols].
inline bool tpu_layout(const hl::Tensor& x) { return x.dim() == 3; }
inline hl::Tensor row_of(const hl::Tensor& x, hl::Index r, hl::Index c) {
  return tpu_layout(x) ? x[{r, 0, c}] : x[{r, c}];
}

// Jagged rows: out[s, :] = sum of x[offsets[s]:offsets[s + 1], :] (a segment sum over CSR
// offsets) for the first `count` segments: the scalar argument sizes the output. A segment whose
// end is below its begin is empty, as a Python slice is.
inline const auto& segment_sum() {
  static const auto k = deuteron::kernel("segment_sum", [](hl::Tensor x, hl::Tensor offsets, hl::Scalar count) {
    int64_t segments = count.item(), d = x.size(x.dim() - 1);
    hl::expect(segments >= 0 && segments < offsets.size(0), "needs 0 <= count < offsets.size(0)");
    auto out = tpu_layout(x) ? hl::empty({segments, 1, d}) : hl::empty({segments, d});
    for (auto s : hl::grid(segments)) {
      auto acc = hl::zeros({d});
      for (auto tr : hl::tile(offsets[{s}], offsets[{s.index() + 1}], {.name = "rows"}))
        acc = acc + row_of(x, tr, hl::all).sum(0);
      if (tpu_layout(x))
        out[{s, 0, hl::all}] = acc;
      else
        out[{s, hl::all}] = acc;
    }
    return out;
  });
  return k;
}

// A per-row valid length: out[r] = mean of x[r, :lengths[r, 0]] (0 for an empty row); lengths
// are int32 and may exceed the row (the loop is clipped to it). Lengths are a column [rows, 1]:
// a TPU block of a 1-D vector read at a grid index breaks its block-shape rule.
inline const auto& masked_row_mean() {
  static const auto k = deuteron::kernel("masked_row_mean", [](hl::Tensor x, hl::Tensor lengths) {
    int64_t rows = x.size(0), cols = x.size(x.dim() - 1);
    auto out = tpu_layout(x) ? hl::empty({rows, 1, 1}) : hl::empty({rows});
    for (auto r : hl::grid(rows)) {
      auto acc = hl::zeros({1});
      for (auto tc : hl::tile(0, lengths[{r, 0}], {.name = "cols"})) acc = acc + row_of(x, r, tc).sum(0);
      auto n = hl::minimum(lengths[{r, 0}], cols).to(DType::f32);
      auto mean = (acc / hl::maximum(n, 1.0f)).sum(0);
      if (tpu_layout(x))
        out[{r, 0, 0}] = mean;
      else
        out[{r}] = mean;
    }
    return out;
  });
  return k;
}

// Arithmetic on a tile's bounds and a scalar argument: out[r] = sum of x[r, 2r : min(3r + 3,
// limit)], clipped to the row; rows where 2r >= the end are empty.
inline const auto& window_sum() {
  static const auto k = deuteron::kernel("window_sum", [](hl::Tensor x, hl::Scalar limit) {
    int64_t rows = x.size(0);
    auto out = tpu_layout(x) ? hl::empty({rows, 1, 1}) : hl::empty({rows});
    for (auto r : hl::grid(rows)) {
      auto acc = hl::zeros({1});
      for (auto tc : hl::tile(r.begin() * 2, hl::minimum(r.end() * 3, limit), {.name = "cols"}))
        acc = acc + row_of(x, r, tc).sum(0);
      if (tpu_layout(x))
        out[{r, 0, 0}] = acc.sum(0);
      else
        out[{r}] = acc.sum(0);
    }
    return out;
  });
  return k;
}

// Arithmetic on a row block's end: out[i] = sum of x[i, :min(3 * end, limit)] where end is one
// past the last row of i's block of `block_rows` rows (pinned by the test), clipped to the row.
inline const auto& block_prefix_sum() {
  static const auto k = deuteron::kernel("block_prefix_sum", [](hl::Tensor x, hl::Scalar limit) {
    int64_t rows = x.size(0);
    auto out = hl::empty({rows, 1});  // a column: a TPU block's last dim is 128 wide or whole
    for (auto tr : hl::tile(rows, {.name = "rows"})) {
      auto acc = hl::zeros({tr});
      for (auto tc : hl::tile(0, hl::minimum(tr.end() * 3, limit), {.name = "cols"})) acc = acc + x[{tr, tc}].sum(1);
      out[{tr, 0}] = acc;
    }
    return out;
  });
  return k;
}

struct Case {
  std::string kernel;  // segment_sum, masked_row_mean, window_sum
  std::vector<int64_t> shape;
  int64_t block = 0;  // the inner loop's block
  std::string name;
};

// small: the interpreted targets' shapes; pallas: TPU blocks (rows in 8s, lanes in 128s: a
// segment's rows in blocks of 8 or 16, columns in 128 or 256) and its layout (tpu_layout).
inline std::vector<Case> cases(bool small, bool pallas = false) {
  std::vector<Case> out;
  std::vector<std::vector<int64_t>> seg = {{1, 2}, {23, 5}, {7, 130}};
  std::vector<std::vector<int64_t>> rows = {{1, 1}, {9, 37}, {5, 300}};
  if (pallas) seg = {{1, 2}, {23, 5}}, rows = {{1, 1}, {9, 37}, {13, 300}};  // row blocks of 8, or the whole dim
  if (!small) seg.push_back({1000, 3}), rows.push_back({33, 1000});
  std::vector<int64_t> blocks = {4, 256};
  if (pallas) blocks = {128, 256};  // TPU lanes: a multiple of 128 or the whole dim
  for (int64_t block : blocks) {
    for (const auto& s : seg) {
      int64_t b = pallas ? block / 16 : block;  // segment rows: 8 or 16 on a TPU
      out.push_back({"segment_sum", s, b, fmt::format("segment_sum_{}x{}_b{}", s[0], s[1], b)});
    }
    for (const auto& s : rows) {
      out.push_back({"masked_row_mean", s, block, fmt::format("masked_row_mean_{}x{}_b{}", s[0], s[1], block)});
      out.push_back({"block_prefix_sum", s, block, fmt::format("block_prefix_sum_{}x{}_b{}", s[0], s[1], block)});
      out.push_back({"window_sum", s, block, fmt::format("window_sum_{}x{}_b{}", s[0], s[1], block)});
    }
  }
  return out;
}

// CSR offsets over `n` rows: empty segments, one segment of length 1, one that ends before it
// begins (empty), and one past the last row (clipped), around random lengths.
inline Tensor offsets_for(int64_t n) {
  std::vector<int64_t> o = {0, 0, std::min<int64_t>(1, n)};  // an empty segment, then one of length 1
  uint64_t state = 7;
  while (o.back() < n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    o.push_back(std::min<int64_t>(n, o.back() + int64_t((state >> 33) % 9)));
  }
  o.push_back(o.back());              // empty at the end
  o.push_back(std::max<int64_t>(n - 2, 0));  // ends before it begins: empty
  o.push_back(n + 5);                 // past the last row: clipped to it
  Tensor t = Tensor::empty({int64_t(o.size())}, DType::i64);
  for (size_t i = 0; i < o.size(); ++i) t.set(int64_t(i), double(o[i]));
  return t;
}

// Runs the case on `target` and checks it against plain loops in double precision.
inline void check(const Case& c, const std::string& target) {
  int64_t n = c.shape[0], d = c.shape[1];
  bool tpu = target == "pallas" && c.kernel != "block_prefix_sum";
  Tensor x = Tensor::rand(tpu ? std::vector<int64_t>{n, 1, d} : c.shape, DType::f32, 3);  // the same elements
  std::vector<Arg> args;
  const KernelBase* k = nullptr;
  std::vector<double> want;
  auto at = [&](int64_t i, int64_t j) { return x.get(i * d + j); };
  std::map<std::string, int64_t> blocks = {{"block_cols", c.block}};
  if (c.kernel == "segment_sum") {
    Tensor off = offsets_for(n);
    args = {x, off, off.numel() - 1};
    k = &segment_sum();
    blocks = {{"block_rows", c.block}};
    for (int64_t s = 0; s + 1 < off.numel(); ++s)
      for (int64_t j = 0; j < d; ++j) {
        double sum = 0;
        for (int64_t i = std::max<int64_t>(int64_t(off.get(s)), 0); i < std::min<int64_t>(int64_t(off.get(s + 1)), n); ++i)
          sum += at(i, j);
        want.push_back(sum);
      }
  } else if (c.kernel == "masked_row_mean") {
    Tensor len = Tensor::rand({n, 1}, DType::i32, 4, 0, double(d + 3));  // some past the row
    if (n > 2) len.set(1, 0), len.set(2, 1);  // an empty row and a row of one
    args = {x, len};
    k = &masked_row_mean();
    for (int64_t r = 0; r < n; ++r) {
      int64_t m = std::min<int64_t>(int64_t(len.get(r)), d);
      double sum = 0;
      for (int64_t j = 0; j < m; ++j) sum += at(r, j);
      want.push_back(sum / double(std::max<int64_t>(m, 1)));
    }
  } else if (c.kernel == "block_prefix_sum") {
    int64_t limit = d - d / 3, rows_block = 8;
    args = {x, limit};
    k = &block_prefix_sum();
    blocks["block_rows"] = rows_block;
    for (int64_t r = 0; r < n; ++r) {
      int64_t end = std::min<int64_t>((r / rows_block + 1) * rows_block, n);
      double sum = 0;
      for (int64_t j = 0; j < std::min({3 * end, limit, d}); ++j) sum += at(r, j);
      want.push_back(sum);
    }
  } else {
    int64_t limit = d - d / 3;
    args = {x, limit};
    k = &window_sum();
    for (int64_t r = 0; r < n; ++r) {
      double sum = 0;
      for (int64_t j = 2 * r; j < std::min({3 * r + 3, limit, d}); ++j) sum += at(r, j);
      want.push_back(sum);
    }
  }
  config::Config cfg = testing_support::fit(driver::specialize(*k, frontend::describe_args(*k, args), target), blocks);
  if (target == "pallas" && c.kernel != "segment_sum") cfg.set("inner_cols", "in_place");  // not unrolled
  api::RunResult r = api::run(*k, args, target, cfg);
  const Tensor& out = r.outputs.at(0);
  ASSERT_EQ(out.numel(), int64_t(want.size()));
  int bad = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    double got = out.get(i), exp = want[size_t(i)];
    if (std::abs(got - exp) > 1e-4 + 1e-4 * std::abs(exp) && bad++ < 5)
      ADD_FAILURE() << c.name << " on " << target << " config " << r.config.dump() << " at " << i << ": got " << got
                    << ", want " << exp;
  }
}

}  // namespace deuteron::dynamic_loops
