// The bf16-pair path of deuteron_gemm.h (vdpbf16ps on CPUs with AVX512_BF16), with the
// instruction emulated (DT_GEMM_EMULATE_BF16) so it is checked on every machine: pair packing
// from row-major and transposed bf16 operands at odd K and ragged M, N, A read in place as
// pairs (aligned and not), and block products against exact integer-valued references.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#define DT_GEMM_EMULATE_BF16 1
#include "backends/cpu/runtime/deuteron_gemm.h"

namespace {

using namespace dt::gemm;

#if defined(DT_GEMM_AMX)
#error "this test checks the vdpbf16ps micro-kernel; the tile path has test_gemm_amx.cpp"
#endif

#include "gemm_pairs_products.inc"

TEST(GemmPairs, ProductsFromEveryLayout) {
  std::mt19937 rng(4);
  products_from_every_layout(20, rng);
}

}  // namespace
