// Element types of tensors, host and device.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace deuteron {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, boolean };

// Bytes per element.
int dtype_size(DType t);
// "float32", "bfloat16", "float16", "int32", "int64", "bool" (PyTorch's names).
std::string_view dtype_name(DType t);
// The C type an element is stored as: float, uint16_t (bf16, f16: their bits), int32_t,
// int64_t, bool. Generated C++ and the headers of ahead-of-time builds use it.
const char* storage_ctype(DType t);
// Accepts PyTorch's names and short ones (f32, bf16, f16, i32, i64, bool); throws ArgumentError.
DType parse_dtype(std::string_view name);
bool is_floating(DType t);
// The type arithmetic is done in: bf16/f16 compute in f32 (as the issue asks).
DType compute_dtype(DType t);
// PyTorch's type promotion for two operands of a binary op.
DType promote(DType a, DType b);

// bfloat16 and float16 conversion helpers (round to nearest even).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace deuteron
