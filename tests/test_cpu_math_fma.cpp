// deuteron_cpu.h as generated kernels see it on every CPU here: compiled with -mfma (cmake sets
// it for this file only), where exp_nonpositive takes its fused path. Only the header is
// included, so no inline function of another header is emitted with FMA instructions; the
// tests call these after checking that the CPU has FMA.
#include <cstddef>

#include "backends/cpu/runtime/deuteron_cpu.h"

#ifndef __FMA__
#error "this file is compiled with -mfma (cmake/deuteron_tests.cmake)"
#endif

namespace deuteron::testing_fma {

// exp_nonpositive(a) and exp(a) of each x.
void exp_nonpositive_and_exp(const float* x, float* nonpositive, float* exp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    nonpositive[i] = dt::exp_nonpositive(x[i]);
    exp[i] = dt::exp(x[i]);
  }
}

}  // namespace deuteron::testing_fma
