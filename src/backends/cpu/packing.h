// Sizes of the micro-kernel's packed operand layouts (runtime/deuteron_gemm.h): A in panels of
// kDotMR rows, B in panels of dot_panel_columns() columns, zero-padded.
#pragma once

#include <cstdint>

#include "backends/cpu/hardware.h"

namespace deuteron::cpu {

// deuteron_gemm.h's MR: the register tile's rows, 6 on AVX-512 (32 registers) and AVX2 (16).
inline constexpr int64_t kDotMR = 6;
// deuteron_gemm.h's NR for the vector width the generated code is built for: 4 vectors of floats
// with AVX-512 (64 columns), 2 with AVX2 or narrower (16). Generated dot kernels assert it.
inline int64_t dot_panel_columns() { return cpu_info().simd_bytes >= 64 ? 64 : 16; }
// deuteron_gemm.h's KC (chunk_for_l1) for an L1D of `l1d_bytes` (the compiler passes this
// machine's as DT_L1D_BYTES): the longest chunk of K the micro-kernel runs before it stores its
// tile of C, 256 with a 32 KiB L1D, 512 with 48 KiB. Tests pin the two to agree.
inline int64_t dot_k_chunk(int64_t l1d_bytes = cpu_info().l1d_bytes) {
  int64_t kc = 128;
  while (kc < 512 && kDotMR * (2 * kc) * int64_t(sizeof(float)) <= l1d_bytes / 4) kc *= 2;
  return kc;
}
inline int64_t packed_a_elements(int64_t m, int64_t k) { return (m + kDotMR - 1) / kDotMR * kDotMR * k; }
inline int64_t packed_b_elements(int64_t k, int64_t n) {
  const int64_t nr = dot_panel_columns();
  return (n + nr - 1) / nr * nr * k;
}

}  // namespace deuteron::cpu
