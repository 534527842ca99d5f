#include "deuteron/dtype.h"

#include <cmath>

#include "deuteron/error.h"

namespace deuteron {

int dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::boolean: return 1;
  }
  throw RuntimeError("invalid DType value " + std::to_string(int(t)));
}

const char* storage_ctype(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::bf16:
    case DType::f16: return "uint16_t";
    case DType::i32: return "int32_t";
    case DType::i64: return "int64_t";
    case DType::boolean: return "bool";
  }
  throw RuntimeError("invalid DType value " + std::to_string(int(t)));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::boolean: return "bool";
  }
  throw RuntimeError("invalid DType value " + std::to_string(int(t)));
}

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"float32", DType::f32},  {"f32", DType::f32},      {"float", DType::f32},
      {"bfloat16", DType::bf16}, {"bf16", DType::bf16},   {"float16", DType::f16},
      {"f16", DType::f16},      {"half", DType::f16},     {"int32", DType::i32},
      {"i32", DType::i32},      {"int64", DType::i64},    {"i64", DType::i64},
      {"bool", DType::boolean},
  };
  for (const Alias& a : kAliases)
    if (a.name == name) return a.dtype;
  throw ArgumentError("unknown dtype '" + std::string(name) + "'", "",
                      "valid names: float32 (f32, float), bfloat16 (bf16), float16 (f16, half), "
                      "int32 (i32), int64 (i64), bool");
}

bool is_floating(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

DType compute_dtype(DType t) { return (t == DType::bf16 || t == DType::f16) ? DType::f32 : t; }

DType promote(DType a, DType b) {
  if (a == b) return a;
  const bool fa = is_floating(a), fb = is_floating(b);
  // A float operand wins over any integer/bool one (PyTorch keeps the float's own width).
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  // Two different floats: f32 wins; f16 + bf16 share no common 16-bit type, so f32.
  if (fa && fb) return DType::f32;
  // Integers and bool are totally ordered: bool < int32 < int64.
  auto rank = [](DType t) { return t == DType::boolean ? 0 : t == DType::i32 ? 1 : 2; };
  return rank(a) >= rank(b) ? a : b;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  // NaN: keep it quiet and keep the top payload bits.
  if (u > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  // At or above 65520 (halfway past the largest finite half, 65504) rounds to infinity.
  if (u >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (u < 0x38800000u) {
    // Below 2^-14 the result is subnormal (or zero). Adding 0.5f aligns the value so the
    // FPU's own round-to-nearest-even drops exactly the bits half precision cannot hold.
    float magnitude;
    std::memcpy(&magnitude, &u, 4);
    float shifted = magnitude + 0.5f;
    uint32_t s;
    std::memcpy(&s, &shifted, 4);
    return uint16_t(sign | (s - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  // A carry out of the mantissa correctly bumps the exponent.
  const uint32_t mant_odd = (u >> 13) & 1u;
  u += (uint32_t(15 - 127) << 23) + 0xfffu + mant_odd;
  return uint16_t(sign | (u >> 13));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    float v = std::ldexp(float(mant), -24);
    std::memcpy(&u, &v, 4);
    u |= sign;
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);  // inf or NaN (payload kept)
  } else {
    u = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace deuteron
