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

uint16_t to_bf16(float f) { return uint16_t(__builtin_bit_cast(uint32_t, f) >> 16); }

static_assert(DT_GEMM_BF16_PAIRS, "the emulated pair path is compiled in");

// Packs [m, k] @ [k, n] (bf16, from row-major or transposed storage), multiplies, checks
// every element of C, and that nothing outside it was written.
void check_product(int64_t m, int64_t n, int64_t k, bool a_t, bool b_t, bool accumulate, std::mt19937& rng) {
  std::vector<float> a(size_t(m * k)), b(size_t(k * n));
  for (auto& x : a) x = float(int(rng() % 9) - 4);
  for (auto& x : b) x = float(int(rng() % 7) - 3);
  // bf16 storage, row-major or transposed; a row stride of k (or m, n) rounded up to even
  // keeps the fast pair paths reachable, and odd strides exercise the general one.
  const int64_t lda = a_t ? m + (m & 1) : k + (k & 1), ldb = b_t ? k + (k & 1) : n + 1;
  std::vector<uint16_t> ah(size_t((a_t ? k : m) * lda)), bh(size_t((b_t ? n : k) * ldb));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) ah[size_t(a_t ? p * lda + i : i * lda + p)] = to_bf16(a[size_t(i * k + p)]);
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) bh[size_t(b_t ? j * ldb + p : p * ldb + j)] = to_bf16(b[size_t(p * n + j)]);
  // Pair panels take (K + 1) / 2 words per row; packed_*_size's K-sized panels hold them.
  std::vector<float> ap(size_t(packed_a_size(m, k)), -7.0f), bp(size_t(packed_b_size(k, n)), -7.0f);
  if (a_t) pack_a_pairs<BF16>(ah.data(), 1, lda, m, k, k, ap.data());
  else pack_a_pairs<BF16>(ah.data(), lda, 1, m, k, k, ap.data());
  if (b_t) pack_b_pairs<BF16>(bh.data(), 1, ldb, k, n, k, bp.data());
  else pack_b_pairs<BF16>(bh.data(), ldb, 1, k, n, k, bp.data());
  // A read in place as pairs too: from its storage, and from a copy one element further on (a
  // start that is not 4-byte aligned, which the runtime packs panel by panel).
  std::vector<uint16_t> ah_odd(ah.size() + 1, 0);
  std::copy(ah.begin(), ah.end(), ah_odd.begin() + 1);
  const AView as[3] = {a_packed_pairs(ap.data(), k), a_t ? a_in_place_bf16(ah.data(), 1, lda) : a_in_place_bf16(ah.data(), lda, 1),
                       a_t ? a_in_place_bf16(ah_odd.data() + 1, 1, lda) : a_in_place_bf16(ah_odd.data() + 1, lda, 1)};
  for (int va = 0; va < 3; ++va) {
    const int64_t ldc = n + 3;
    std::vector<float> c(size_t(m * ldc), 5.0f);
    gemm(m, n, k, as[va], b_packed_pairs(bp.data(), k), c.data(), ldc, accumulate);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double want = accumulate ? 5.0 : 0.0;
        for (int64_t p = 0; p < k; ++p) want += double(a[size_t(i * k + p)]) * b[size_t(p * n + j)];
        ASSERT_EQ(c[size_t(i * ldc + j)], float(want)) << m << "x" << n << "x" << k << " a_t " << a_t << " b_t "
                                                        << b_t << " a view " << va << " at " << i << ", " << j;
      }
      for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(c[size_t(i * ldc + j)], 5.0f) << "wrote past N";
    }
  }
}

TEST(GemmPairs, ProductsFromEveryLayout) {
  std::mt19937 rng(4);
  for (int t = 0; t < 40; ++t) {
    int64_t m = 1 + rng() % 20, n = 1 + rng() % 140, k = 1 + rng() % (t < 30 ? 70 : 1100);
    if (t == 0) m = n = k = 1;
    if (t == 1) m = 6, n = NR, k = 2 * kVec;  // only the vectorised packing paths
    for (bool a_t : {false, true})
      for (bool b_t : {false, true})
        for (bool accumulate : {false, true}) check_product(m, n, k, a_t, b_t, accumulate, rng);
  }
}

}  // namespace
