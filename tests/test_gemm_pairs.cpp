// The bf16-pair path of deuteron_gemm.h (vdpbf16ps on CPUs with AVX512_BF16), with the
// instruction emulated (DT_GEMM_EMULATE_BF16) so it is checked on every machine: pair packing
// from row-major and transposed bf16 operands at odd K and ragged M, N, A read in place as
// pairs (aligned and not), and block products against exact integer-valued references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
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

// A computed value's f32 storage is rounded to bf16 as the cast rounds it (dt::f32_to_bf16: to
// nearest even, NaN kept), on the vector paths (6 rows, whole vectors of K) and the scalar ones.
TEST(GemmPairs, F32OperandsRoundAsTheCast) {
  std::mt19937 rng(5);
  for (int64_t m : {6, 7, 13})
    for (int64_t k : {int64_t(4 * kVec), int64_t(37)})
      for (int64_t n : {int64_t(NR), int64_t(NR + 5)}) {
        // Any bits: ties, NaNs, infinities, subnormals, values that round up to inf.
        std::vector<float> x(size_t(std::max(m, n) * k));
        for (size_t i = 0; i < x.size(); ++i) {
          uint32_t bits = uint32_t(rng());
          if (i % 7 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // a tie
          x[i] = __builtin_bit_cast(float, bits);
        }
        std::vector<uint16_t> h(x.size());
        std::transform(x.begin(), x.end(), h.begin(), dt::f32_to_bf16);
        std::vector<float> want(size_t(packed_a_size(m, k) + packed_b_size(k, n)), -7.0f), got = want;
        pack_a_pairs<BF16>(h.data(), k, 1, m, k, k, want.data());
        pack_a_pairs<F32>(x.data(), k, 1, m, k, k, got.data());
        pack_b_pairs<BF16>(h.data(), n, 1, k, n, k, want.data() + packed_a_size(m, k));
        pack_b_pairs<F32>(x.data(), n, 1, k, n, k, got.data() + packed_a_size(m, k));
        ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0) << m << " x " << k << " x " << n;
      }
}

}  // namespace
