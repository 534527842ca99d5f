// Small kernels more than one test file uses.
#pragma once

#include "deuteron/deuteron.h"

namespace deuteron::test_kernels {

namespace hl = deuteron::hl;

// out = x @ y, tiled over M and N, accumulating over blocks of K: the shape of most products.
inline auto tiled_matmul(const char* name) {
  return deuteron::kernel(name, [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty({x.size(0), y.size(1)});
    for (auto [tm, tn] : hl::tile({x.size(0), y.size(1)})) {
      auto acc = hl::zeros({tm, tn});
      for (auto tk : hl::tile(x.size(1))) acc = hl::dot(x[{tm, tk}], y[{tk, tn}], acc);
      out[{tm, tn}] = acc;
    }
    return out;
  });
}

}  // namespace deuteron::test_kernels
