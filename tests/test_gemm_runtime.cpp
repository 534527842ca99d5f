// The micro-kernel library generated dot kernels include (deuteron_gemm.h), compiled here with
// the test binary's flags (the portable vector path; generated kernels get -march=native): packing
// from every layout and element type, and block products over every operand view, against
// exact integer-valued references.
// An L2 of 16 KiB: the products below sweep their N in chunks of one or two B panels
// (columns_for_l2), so that every chunk boundary, ragged N included, is checked.
#define DT_L2_BYTES 16384

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/packing.h"
#include "backends/cpu/runtime/deuteron_gemm.h"

namespace {

using namespace dt::gemm;

uint16_t to_bf16(float f) { return uint16_t(__builtin_bit_cast(uint32_t, f) >> 16); }

// The planner sizes packed copies with the micro-kernel's panel shape; the K chunk follows the L1D.
// This binary is built without -march=native (NR = 16); generated kernels get the machine's width.
TEST(GemmRuntime, TileShapeFollowsTheMachine) {
  static_assert(MR == deuteron::cpu::kDotMR);
  EXPECT_EQ(deuteron::cpu::dot_panel_columns() % NR, 0);
  EXPECT_EQ(MR * kNV + kNV + 1 <= kRegisters, true);  // C tile, a row of B and a broadcast
  EXPECT_EQ(chunk_for_l1(48 * 1024), 512);  // Zen 4/5, Ice Lake and later Xeons
  EXPECT_EQ(chunk_for_l1(32 * 1024), 256);  // Skylake-SP, Cascade Lake
  EXPECT_EQ(chunk_for_l1(16 * 1024), 128);
  EXPECT_EQ(chunk_for_l1(int64_t(1) << 20), 512);
  // The compiler's copy, which the performance model prices the product's passes by.
  for (int64_t l1d : {16 * 1024, 32 * 1024, 48 * 1024, 64 * 1024, 1 << 20})
    EXPECT_EQ(deuteron::cpu::dot_k_chunk(l1d), chunk_for_l1(l1d)) << l1d;
  // N chunks: a whole number of panels whose kc rows take at most half the L2, at least one.
  EXPECT_EQ(columns_for_l2(16), 8 * NR);
  EXPECT_EQ(columns_for_l2(64), 2 * NR);
  EXPECT_EQ(columns_for_l2(100), NR);
  EXPECT_EQ(columns_for_l2(512), NR);
}

TEST(GemmRuntime, PackALayouts) {
  std::mt19937 rng(1);
  for (int64_t m : {1, 5, 6, 7, 13, 64})
    for (int64_t k : {1, 15, 16, 17, 100}) {
      const int64_t ld = k + 3;
      std::vector<float> a(size_t(m * ld + k * (m + 3)));
      for (auto& x : a) x = float(int(rng() % 200) - 100);
      std::vector<uint16_t> h(a.size());
      for (size_t i = 0; i < a.size(); ++i) h[i] = to_bf16(a[i]);  // small integers: exact in bf16
      std::vector<float> p(size_t(packed_a_size(m, k)), -1.0f);
      // row-major (k contiguous), bf16 row-major, and transposed (m contiguous)
      for (int variant = 0; variant < 3; ++variant) {
        if (variant == 0) pack_a<F32>(a.data(), ld, 1, m, k, k, p.data());
        if (variant == 1) pack_a<BF16>(h.data(), ld, 1, m, k, k, p.data());
        if (variant == 2) pack_a<F32>(a.data(), 1, m + 3, m, k, k, p.data());
        for (int64_t i = 0; i < (m + MR - 1) / MR * MR; ++i)
          for (int64_t kk = 0; kk < k; ++kk) {
            float want = i >= m ? 0.0f : variant == 2 ? a[size_t(kk * (m + 3) + i)] : a[size_t(i * ld + kk)];
            ASSERT_EQ(p[size_t((i / MR) * MR * k + kk * MR + i % MR)], want)
                << "variant " << variant << " m " << m << " k " << k << " at " << i << ", " << kk;
          }
      }
    }
}

TEST(GemmRuntime, PackBLayouts) {
  std::mt19937 rng(2);
  for (int64_t n :
       {1, 15, 16, 17, 64, 65, 130, 300})  // 300: more than kPackGroup panels with AVX-512's 64 columns
    for (int64_t k : {1, 7, 16, 33}) {
      const int64_t ld = n + 5, ldt = k + 2;
      std::vector<float> b(size_t(std::max(k * ld, n * ldt)));
      for (auto& x : b) x = float(int(rng() % 200) - 100);
      std::vector<uint16_t> h(b.size());
      for (size_t i = 0; i < b.size(); ++i) h[i] = to_bf16(b[i]);
      std::vector<float> p(size_t(packed_b_size(k, n)), -1.0f);
      // row-major (n contiguous), bf16, transposed (k contiguous, e.g. k^T), bf16 transposed
      for (int variant = 0; variant < 4; ++variant) {
        bool t = variant >= 2;
        if (variant == 0) pack_b<F32>(b.data(), ld, 1, k, n, k, p.data());
        if (variant == 1) pack_b<BF16>(h.data(), ld, 1, k, n, k, p.data());
        if (variant == 2) pack_b<F32>(b.data(), 1, ldt, k, n, k, p.data());
        if (variant == 3) pack_b<BF16>(h.data(), 1, ldt, k, n, k, p.data());
        for (int64_t j = 0; j < (n + NR - 1) / NR * NR; ++j)
          for (int64_t kk = 0; kk < k; ++kk) {
            float want = j >= n ? 0.0f : t ? b[size_t(j * ldt + kk)] : b[size_t(kk * ld + j)];
            ASSERT_EQ(p[size_t((j / NR) * NR * k + kk * NR + j % NR)], want)
                << "variant " << variant << " n " << n << " k " << k << " at " << kk << ", " << j;
          }
      }
    }
}

// Threads that share one packed copy pack a group of column panels each (dt::SharedPack): packed
// panel by panel or group by group, in any order, the copy has the same bits as packed whole.
TEST(GemmRuntime, PackBByPanelsMatchesTheWholeCopy) {
  std::mt19937 rng(3);
  for (int64_t n : {1, 17, 64, 65, 200, 520})
    for (int64_t k : {1, 7, 33}) {
      std::vector<float> b(size_t(k * n));
      for (auto& x : b) x = float(int(rng() % 200) - 100) / 7.0f;
      const int64_t panels = panels_of(n);
      ASSERT_EQ(panels, (n + NR - 1) / NR);
      for (int pairs = 0; pairs < 2; ++pairs) {
        std::vector<float> whole(size_t(packed_b_size(k, n)), -1.0f), by_panel(whole.size(), -2.0f),
            by_group(whole.size(), -3.0f);
        const int64_t groups = pack_groups_of(n);
        ASSERT_EQ(groups, (panels + kPackGroup - 1) / kPackGroup);
        auto pack = [&](float* dst, int64_t first, int64_t end) {
          if (pairs) pack_b_pairs<F32>(b.data(), n, 1, k, n, k, dst, first, end);
          else pack_b<F32>(b.data(), n, 1, k, n, k, dst, first, end);
        };
        pack(whole.data(), 0, kAllPanels);
        for (int64_t q = panels - 1; q >= 0; --q) pack(by_panel.data(), q, q + 1);
        for (int64_t g = groups - 1; g >= 0; --g) pack(by_group.data(), g * kPackGroup, (g + 1) * kPackGroup);
        for (size_t i = 0; i < whole.size(); ++i) {
          ASSERT_EQ(std::memcmp(&whole[i], &by_panel[i], sizeof(float)), 0)
              << "pairs " << pairs << " n " << n << " k " << k << " at " << i;
          ASSERT_EQ(std::memcmp(&whole[i], &by_group[i], sizeof(float)), 0)
              << "pairs " << pairs << " n " << n << " k " << k << " at " << i;
        }
      }
    }
}

TEST(GemmRuntime, ProductsOverEveryView) {
  std::mt19937 rng(3);
  for (int t = 0; t < 60; ++t) {
    int64_t m = 1 + rng() % 20, n = 1 + rng() % 140, k = 1 + rng() % (t < 50 ? 80 : 1100);
    if (t == 0) m = n = k = 1;
    const int64_t two_row_tails[] = {8, 14, 32};  // M whose last panel has 2 rows
    if (t >= 1 && t <= 3) m = two_row_tails[t - 1];
    std::vector<float> a(size_t(m * k)), at(size_t(k * m)), b(size_t(k * n)), want(size_t(m * n));
    for (auto& x : a) x = float(int(rng() % 7) - 3);
    for (auto& x : b) x = float(int(rng() % 5) - 2);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t kk = 0; kk < k; ++kk) at[size_t(kk * m + i)] = a[size_t(i * k + kk)];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t kk = 0; kk < k; ++kk) s += double(a[size_t(i * k + kk)]) * b[size_t(kk * n + j)];
        want[size_t(i * n + j)] = float(s);
      }
    std::vector<float> ap(size_t(packed_a_size(m, k))), bp(size_t(packed_b_size(k, n)));
    pack_a<F32>(a.data(), k, 1, m, k, k, ap.data());
    pack_b<F32>(b.data(), n, 1, k, n, k, bp.data());
    // bf16 copies read in place (widened panel by panel here: the test binary has no vdpbf16ps)
    std::vector<uint16_t> ah(a.size()), ath(at.size());
    for (size_t i = 0; i < a.size(); ++i) ah[i] = to_bf16(a[i]), ath[i] = to_bf16(at[i]);
    const AView as[6] = {a_in_place(a.data(), k, 1),
                         a_in_place(at.data(), 1, m),
                         a_packed(ap.data(), k),
                         a_in_place_bf16(ah.data(), k, 1),
                         a_in_place_bf16(ath.data(), 1, m),
                         a_in_place(a.data(), k, 1, /*ahead=*/true)};
    const BView bs[2] = {b_in_place(b.data(), n), b_packed(bp.data(), k)};
    for (int va = 0; va < 6; ++va)
      for (int vb = 0; vb < 2; ++vb)
        for (bool accumulate : {false, true}) {
          const int64_t ldc = n + 3;
          std::vector<float> c(size_t(m * ldc), 5.0f);
          gemm(m, n, k, as[va], bs[vb], c.data(), ldc, accumulate);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j)
              ASSERT_EQ(c[size_t(i * ldc + j)], want[size_t(i * n + j)] + (accumulate ? 5.0f : 0.0f))
                  << m << "x" << n << "x" << k << " views " << va << vb << " at " << i << ", " << j;
            for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(c[size_t(i * ldc + j)], 5.0f) << "wrote past N";
          }
        }
  }
}

// A causal product's triangles (dt::gemm::Triangle), over every operand view, ragged sizes and
// K beyond one chunk: with C's part above a diagonal unused, every entry on or below it is the
// product, and tiles wholly above it are left as they were; with A zero above a diagonal, the
// product is exact though the zeros are not multiplied.
TEST(GemmRuntime, CausalTrianglesAreLeftOut) {
  std::mt19937 rng(5);
  for (int t = 0; t < 40; ++t) {
    int64_t m = 1 + rng() % 40, n = 1 + rng() % 90, k = 1 + rng() % (t < 30 ? 80 : 1100);
    const int64_t diag = int64_t(rng() % 21) - 8;  // j - i > diag (or k - i > diag) is the triangle
    std::vector<float> a(size_t(m * k)), at(size_t(k * m)), b(size_t(k * n)), full(size_t(m * n)),
        causal(full);
    for (auto& x : a) x = float(int(rng() % 7) - 3);
    for (auto& x : b) x = float(int(rng() % 5) - 2);
    std::vector<float> az = a;  // zero where k - i > diag
    for (int64_t i = 0; i < m; ++i)
      for (int64_t kk = 0; kk < k; ++kk) {
        if (kk - i > diag) az[size_t(i * k + kk)] = 0.0f;
        at[size_t(kk * m + i)] = az[size_t(i * k + kk)];
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, z = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          s += double(a[size_t(i * k + kk)]) * b[size_t(kk * n + j)];
          z += double(az[size_t(i * k + kk)]) * b[size_t(kk * n + j)];
        }
        full[size_t(i * n + j)] = float(s);
        causal[size_t(i * n + j)] = float(z);
      }
    std::vector<float> ap(size_t(packed_a_size(m, k))), azp(ap.size()), bp(size_t(packed_b_size(k, n)));
    pack_a<F32>(a.data(), k, 1, m, k, k, ap.data());
    pack_a<F32>(az.data(), k, 1, m, k, k, azp.data());
    pack_b<F32>(b.data(), n, 1, k, n, k, bp.data());
    const AView as[3] = {a_in_place(a.data(), k, 1), a_packed(ap.data(), k),
                         a_in_place(a.data(), k, 1, true)};
    const AView azs[3] = {a_in_place(az.data(), k, 1), a_packed(azp.data(), k), a_in_place(at.data(), 1, m)};
    const BView bs[2] = {b_in_place(b.data(), n), b_packed(bp.data(), k)};
    for (int va = 0; va < 3; ++va)
      for (int vb = 0; vb < 2; ++vb)
        for (bool accumulate : {false, true}) {
          const float before = accumulate ? 5.0f : 0.0f;
          std::vector<float> c(size_t(m * n), 5.0f);
          gemm(m, n, k, as[va], bs[vb], c.data(), n, accumulate, Triangle{diag, kNoTriangle});
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              const float got = c[size_t(i * n + j)], want = full[size_t(i * n + j)] + before;
              if (j - i <= diag) {
                ASSERT_EQ(got, want) << m << "x" << n << "x" << k << " diag " << diag << " at " << i << ", "
                                     << j;
              }
              // A tile spans MR rows and NR columns: one this far above the diagonal is wholly there.
              if (j - i > diag + MR + NR - 2) {
                ASSERT_EQ(got, 5.0f) << "computed a left-out tile at " << i << ", " << j;
              }
            }
          std::fill(c.begin(), c.end(), 5.0f);
          gemm(m, n, k, azs[va], bs[vb], c.data(), n, accumulate, Triangle{kNoTriangle, diag});
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
              ASSERT_EQ(c[size_t(i * n + j)], causal[size_t(i * n + j)] + before)
                  << m << "x" << n << "x" << k << " diag " << diag << " views " << va << vb << " at " << i
                  << ", " << j;
        }
  }
}

}  // namespace
