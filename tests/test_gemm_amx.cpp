// The AMX path of deuteron_gemm.h (tdpbf16ps tiles on CPUs with AMX-BF16), with the tile
// instructions emulated (DT_GEMM_EMULATE_AMX) so its blocking is checked on every machine: 32 x
// 32 blocks of C with ragged edges, A read in place or copied from every layout, K chunks whose
// last 16 pairs are uneven, against exact integer-valued references. On a CPU with AMX the
// generated kernels run the real instructions (the bf16 catalogue tests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#define DT_GEMM_EMULATE_BF16 1
#define DT_GEMM_EMULATE_AMX 1
#include "backends/cpu/runtime/deuteron_gemm.h"

namespace {

using namespace dt::gemm;

static_assert(DT_GEMM_AMX, "the emulated tile path is compiled in");

#include "gemm_pairs_products.inc"

TEST(GemmAmx, ProductsFromEveryLayout) {
  std::mt19937 rng(5);
  products_from_every_layout(80, rng);
}

}  // namespace
