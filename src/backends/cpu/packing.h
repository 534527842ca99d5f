// Sizes of the micro-kernel's packed operand layouts (runtime/deuteron_gemm.h): A in panels of
// kDotMR rows, B in panels of kDotNR columns (the micro-kernel's NR divides it), zero-padded.
#pragma once

#include <cstdint>

namespace deuteron::cpu {

// kDotMR is deuteron_gemm.h's MR (the register tile's rows: 6 on AVX-512 and AVX2 alike);
// kDotNR = 64 is a multiple of its NR on both (64 and 16).
inline constexpr int64_t kDotMR = 6, kDotNR = 64;
inline int64_t packed_a_elements(int64_t m, int64_t k) { return (m + kDotMR - 1) / kDotMR * kDotMR * k; }
inline int64_t packed_b_elements(int64_t k, int64_t n) { return (n + kDotNR - 1) / kDotNR * kDotNR * k; }

}  // namespace deuteron::cpu
