// Host runtime basics: errors, dtypes, half-precision conversion, tensors, allclose, DLPack.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <source_location>

#include "deuteron/dtype.h"
#include "deuteron/error.h"
#include "deuteron/tensor.h"

namespace deuteron {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr DType kAllDTypes[] = {DType::f32, DType::bf16, DType::f16,
                                DType::i32, DType::i64,  DType::boolean};

float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- Errors

TEST(Error, WhatIsMultiLineAndOmitsEmptyParts) {
  Error full("bad block size", "kernel.cpp:12", "use a power of two");
  EXPECT_STREQ(full.what(), "error: bad block size\n  at kernel.cpp:12\n  hint: use a power of two");
  EXPECT_EQ(full.message(), "bad block size");
  EXPECT_EQ(full.where(), "kernel.cpp:12");
  EXPECT_EQ(full.hint(), "use a power of two");
  EXPECT_STREQ(Error("only message").what(), "error: only message");
  EXPECT_STREQ(Error("no where", "", "a hint").what(), "error: no where\n  hint: a hint");
  EXPECT_STREQ(Error("no hint", "a.cpp:1").what(), "error: no hint\n  at a.cpp:1");
}

TEST(Error, SubclassesAreCatchableAsError) {
  EXPECT_THROW(throw ArgumentError("x"), Error);
  EXPECT_THROW(throw KernelError("x"), Error);
  EXPECT_THROW(throw ConfigError("x"), Error);
  EXPECT_THROW(throw CompileError("x"), Error);
  EXPECT_THROW(throw RuntimeError("x"), std::runtime_error);
}

TEST(Error, FormatLocationStripsDirectories) {
  const auto loc = std::source_location::current();
  const std::string s = format_location(loc);
  EXPECT_EQ(s, "test_tensor.cpp:" + std::to_string(loc.line()));
}

// ---- DTypes

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_name(DType::f32), "float32");
  EXPECT_EQ(dtype_name(DType::bf16), "bfloat16");
  EXPECT_EQ(dtype_name(DType::f16), "float16");
  EXPECT_EQ(dtype_name(DType::i32), "int32");
  EXPECT_EQ(dtype_name(DType::i64), "int64");
  EXPECT_EQ(dtype_name(DType::boolean), "bool");
  EXPECT_EQ(dtype_size(DType::f32), 4);
  EXPECT_EQ(dtype_size(DType::bf16), 2);
  EXPECT_EQ(dtype_size(DType::f16), 2);
  EXPECT_EQ(dtype_size(DType::i32), 4);
  EXPECT_EQ(dtype_size(DType::i64), 8);
  EXPECT_EQ(dtype_size(DType::boolean), 1);
  for (DType t : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
}

TEST(DType, ParseAliases) {
  EXPECT_EQ(parse_dtype("f32"), DType::f32);
  EXPECT_EQ(parse_dtype("float"), DType::f32);
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("f16"), DType::f16);
  EXPECT_EQ(parse_dtype("half"), DType::f16);
  EXPECT_EQ(parse_dtype("i32"), DType::i32);
  EXPECT_EQ(parse_dtype("i64"), DType::i64);
}

TEST(DType, ParseErrorListsValidNames) {
  try {
    parse_dtype("float64");
    FAIL() << "expected ArgumentError";
  } catch (const ArgumentError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'float64'"), std::string::npos) << what;
    for (const char* name : {"float32", "bfloat16", "float16", "int32", "int64", "bool", "half"})
      EXPECT_NE(what.find(name), std::string::npos) << name << " missing from: " << what;
  }
  EXPECT_THROW(parse_dtype(""), ArgumentError);
  EXPECT_THROW(parse_dtype("Float32"), ArgumentError);  // names are case-sensitive
}

TEST(DType, FloatingAndComputeTypes) {
  EXPECT_TRUE(is_floating(DType::f32));
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_TRUE(is_floating(DType::f16));
  EXPECT_FALSE(is_floating(DType::i32));
  EXPECT_FALSE(is_floating(DType::i64));
  EXPECT_FALSE(is_floating(DType::boolean));
  EXPECT_EQ(compute_dtype(DType::bf16), DType::f32);
  EXPECT_EQ(compute_dtype(DType::f16), DType::f32);
  EXPECT_EQ(compute_dtype(DType::f32), DType::f32);
  EXPECT_EQ(compute_dtype(DType::i32), DType::i32);
  EXPECT_EQ(compute_dtype(DType::i64), DType::i64);
  EXPECT_EQ(compute_dtype(DType::boolean), DType::boolean);
}

TEST(DType, PromotionFollowsPyTorch) {
  using enum DType;
  for (DType t : kAllDTypes) EXPECT_EQ(promote(t, t), t);
  struct Case {
    DType a, b, want;
  };
  const Case cases[] = {
      {boolean, i32, i32}, {boolean, i64, i64}, {i32, i64, i64},     {boolean, f16, f16},
      {i32, bf16, bf16},   {i64, f16, f16},     {i64, f32, f32},     {bf16, f16, f32},
      {bf16, f32, f32},    {f16, f32, f32},     {boolean, f32, f32},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(promote(c.a, c.b), c.want) << dtype_name(c.a) << " + " << dtype_name(c.b);
    EXPECT_EQ(promote(c.b, c.a), c.want) << dtype_name(c.b) << " + " << dtype_name(c.a);
  }
}

// ---- bfloat16 / float16 conversion

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  // bf16 keeps 7 mantissa bits: the ulp at 1 is 2^-7.
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);          // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);      // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // just above the tie
  EXPECT_EQ(f32_to_bf16(kInf), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-kInf), 0xff80);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds to inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(kNaN))));
  // A signalling NaN whose payload sits only in the low bits must not become infinity.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_to_f32(0x7f800001)))));
}

TEST(Bf16, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      ASSERT_EQ(f32_to_bf16(f), h) << std::hex << h;
    }
  }
}

TEST(F16, KnownValues) {
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);  // largest finite half
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
}

TEST(F16, RoundsToNearestEven) {
  // Half keeps 10 mantissa bits: the ulp at 1 is 2^-10.
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);             // tie -> even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);         // tie -> even (up)
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);  // just above the tie
  // Mantissa carry into the exponent: 2 - 2^-12 rounds up to 2.
  EXPECT_EQ(f32_to_f16(2.0f - 0x1p-12f), 0x4000);
  // Overflow: 65519 stays finite, 65520 is the tie to even that rounds to infinity.
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e6f), 0xfc00);
}

TEST(F16, Subnormals) {
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);             // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);             // tie -> even (zero)
  EXPECT_EQ(f32_to_f16(0x1p-25f * 1.0001f), 0x0001);   // just above the tie
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);         // tie -> even (up)
  EXPECT_EQ(f32_to_f16(-0x1p-24f), 0x8001);
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);               // underflow to zero
  EXPECT_EQ(f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(f32_to_f16(1023 * 0x1p-24f), 0x03ff);      // largest subnormal
}

TEST(F16, InfAndNaN) {
  EXPECT_EQ(f32_to_f16(kInf), 0x7c00);
  EXPECT_EQ(f32_to_f16(-kInf), 0xfc00);
  EXPECT_EQ(f16_to_f32(0x7c00), kInf);
  EXPECT_EQ(f16_to_f32(0xfc00), -kInf);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(kNaN))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(-kNaN))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(bits_to_f32(0x7f800001)))));  // low payload
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7c01)));
}

TEST(F16, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
    } else {
      ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
    }
  }
}

#ifdef __FLT16_MAX__
// The compiler's own _Float16 conversion is a correctly rounded reference.
TEST(F16, MatchesCompilerConversion) {
  uint64_t state = 12345;
  for (int i = 0; i < 2000000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    // Bias exponents toward the half range so subnormals, overflow and ties all get hit.
    uint32_t u = uint32_t(state >> 32);
    if (i % 2) u = (u & 0x80ffffffu) | (uint32_t(96 + (state >> 20) % 48) << 23);
    const float f = bits_to_f32(u);
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &ref, 2);
    ASSERT_EQ(f32_to_f16(f), want) << std::hex << "input bits 0x" << u;
  }
}
#endif

// ---- Construction

TEST(Tensor, DefaultIsUndefined) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_THROW(t.get(0), ArgumentError);
  EXPECT_THROW(t.to(DType::f32), ArgumentError);
  EXPECT_THROW(t.to_dlpack(), ArgumentError);
}

TEST(Tensor, EmptyIsAlignedAndContiguous) {
  for (DType dt : kAllDTypes) {
    Tensor t = Tensor::empty({3, 5, 7}, dt);
    EXPECT_TRUE(t.defined());
    EXPECT_EQ(t.dtype(), dt);
    EXPECT_EQ(t.dim(), 3);
    EXPECT_EQ(t.sizes(), (std::vector<int64_t>{3, 5, 7}));
    EXPECT_EQ(t.strides(), (std::vector<int64_t>{35, 7, 1}));
    EXPECT_EQ(t.numel(), 105);
    EXPECT_EQ(t.nbytes(), 105 * dtype_size(dt));
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  }
  EXPECT_THROW(Tensor::empty({2, -1}, DType::f32), ArgumentError);
}

TEST(Tensor, ZerosAndEmptyLike) {
  Tensor z = Tensor::zeros({4, 33}, DType::bf16);
  for (int64_t i = 0; i < z.numel(); ++i) ASSERT_EQ(z.get(i), 0.0);
  Tensor e = Tensor::empty_like(z);
  EXPECT_EQ(e.sizes(), z.sizes());
  EXPECT_EQ(e.dtype(), DType::bf16);
  EXPECT_NE(e.data(), z.data());
}

TEST(Tensor, SizeAndDescribe) {
  Tensor t = Tensor::empty({8192, 2560}, DType::f32);
  EXPECT_EQ(t.describe(), "float32[8192, 2560]");
  EXPECT_EQ(t.size(0), 8192);
  EXPECT_EQ(t.size(1), 2560);
  EXPECT_EQ(t.size(-1), 2560);
  EXPECT_EQ(t.size(-2), 8192);
  EXPECT_THROW(t.size(2), ArgumentError);
  EXPECT_THROW(t.size(-3), ArgumentError);
  EXPECT_EQ(Tensor::empty({}, DType::i64).describe(), "int64[]");
}

// ---- rand

TEST(Rand, DeterministicPerSeed) {
  for (DType dt : kAllDTypes) {
    Tensor a = Tensor::rand({1000}, dt, 42), b = Tensor::rand({1000}, dt, 42);
    Tensor c = Tensor::rand({1000}, dt, 43);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), size_t(a.nbytes())), 0) << dtype_name(dt);
    EXPECT_NE(std::memcmp(a.data(), c.data(), size_t(a.nbytes())), 0) << dtype_name(dt);
  }
  // The stream depends only on (seed, index), not on the shape.
  Tensor flat = Tensor::rand({24}, DType::f32, 7), shaped = Tensor::rand({2, 3, 4}, DType::f32, 7);
  EXPECT_EQ(std::memcmp(flat.data(), shaped.data(), 24 * 4), 0);
}

TEST(Rand, FloatRangesAndMean) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    Tensor t = Tensor::rand({100000}, dt, 1, -3.0, 5.0);
    double lo = 1e9, hi = -1e9, sum = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double v = t.get(i);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      sum += v;
    }
    EXPECT_GE(lo, -3.0) << dtype_name(dt);
    EXPECT_LT(hi, 5.0) << dtype_name(dt);
    EXPECT_LT(lo, -2.9) << dtype_name(dt);
    EXPECT_GT(hi, 4.9) << dtype_name(dt);
    EXPECT_NEAR(sum / double(t.numel()), 1.0, 0.05) << dtype_name(dt);
  }
}

TEST(Rand, HalfPrecisionStaysBelowHi) {
  // Without clamping, values just below 1 would round up to exactly 1 in bf16/f16.
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor t = Tensor::rand({200000}, dt, 3, 0.0, 1.0);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double v = t.get(i);
      ASSERT_GE(v, 0.0);
      ASSERT_LT(v, 1.0);
    }
  }
  // A range holding a single representable value yields only that value.
  Tensor one = Tensor::rand({100}, DType::bf16, 4, 1.0, 1.001);
  for (int64_t i = 0; i < one.numel(); ++i) ASSERT_EQ(one.get(i), 1.0);
  // Values are stored already rounded: converting them again changes nothing.
  Tensor b = Tensor::rand({1000}, DType::bf16, 9);
  for (int64_t i = 0; i < b.numel(); ++i) {
    const uint16_t h = b.data_as<uint16_t>()[i];
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(h)), h);
  }
}

TEST(Rand, IntegersAndBools) {
  Tensor t = Tensor::rand({10000}, DType::i32, 5, -3, 4);
  std::vector<int> counts(7, 0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int v = t.data_as<int32_t>()[i];
    ASSERT_GE(v, -3);
    ASSERT_LT(v, 4);
    ++counts[size_t(v + 3)];
  }
  for (int c : counts) EXPECT_GT(c, 1000);  // every value in [-3, 4) appears

  Tensor l = Tensor::rand({1000}, DType::i64, 5, 0, 1e12);
  for (int64_t i = 0; i < l.numel(); ++i) {
    ASSERT_GE(l.data_as<int64_t>()[i], 0);
    ASSERT_LT(l.data_as<int64_t>()[i], int64_t(1e12));
  }

  Tensor b = Tensor::rand({10000}, DType::boolean, 5);
  int64_t ones = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const uint8_t v = b.data_as<uint8_t>()[i];
    ASSERT_TRUE(v == 0 || v == 1);
    ones += v;
  }
  EXPECT_GT(ones, 4500);
  EXPECT_LT(ones, 5500);
}

TEST(Rand, RejectsBadRanges) {
  EXPECT_THROW(Tensor::rand({4}, DType::f32, 0, 1.0, 1.0), ArgumentError);
  EXPECT_THROW(Tensor::rand({4}, DType::f32, 0, 2.0, 1.0), ArgumentError);
  EXPECT_THROW(Tensor::rand({4}, DType::f32, 0, 0.0, kInf), ArgumentError);
  EXPECT_THROW(Tensor::rand({4}, DType::f32, 0, -1e39, 1e39), ArgumentError);  // beyond float
  EXPECT_THROW(Tensor::rand({4}, DType::bf16, 0, 1.001, 1.002), ArgumentError);  // no bf16 value
  EXPECT_THROW(Tensor::rand({4}, DType::i32, 0, 0.2, 0.7), ArgumentError);  // no integer
  EXPECT_THROW(Tensor::rand({4}, DType::i32, 0, 0.0, 1e10), ArgumentError);  // not int32
}

// ---- Borrowed and strided views

TEST(Borrow, SharesCallerMemory) {
  std::vector<float> buf(6);
  std::iota(buf.begin(), buf.end(), 0.0f);
  Tensor t = Tensor::borrow(buf.data(), {2, 3}, DType::f32);
  EXPECT_EQ(t.data(), buf.data());
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{3, 1}));
  EXPECT_TRUE(t.is_contiguous());
  t.set(4, 40.0);
  EXPECT_EQ(buf[4], 40.0f);
  EXPECT_THROW(Tensor::borrow(buf.data(), {2, 3}, DType::f32, {1}), ArgumentError);
  EXPECT_THROW(Tensor::borrow(nullptr, {2, 3}, DType::f32), ArgumentError);
}

TEST(Borrow, GetSetOnTransposedView) {
  // buf holds a row-major [2, 3]; the view is its transpose, [3, 2] with strides {1, 3}.
  std::vector<float> buf = {0, 1, 2, 10, 11, 12};
  Tensor t = Tensor::borrow(buf.data(), {3, 2}, DType::f32, {1, 3});
  EXPECT_FALSE(t.is_contiguous());
  const double want[] = {0, 10, 1, 11, 2, 12};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(t.get(i), want[i]) << i;
  t.set(1, -5.0);  // logical (0, 1) is buf[3]
  EXPECT_EQ(buf[3], -5.0f);
  t.set(4, 7.5);  // logical (2, 0) is buf[2]
  EXPECT_EQ(buf[2], 7.5f);
  EXPECT_THROW(t.get(6), ArgumentError);
  EXPECT_THROW(t.set(-1, 0.0), ArgumentError);
}

TEST(Borrow, GetSetEveryDtypeStrided) {
  for (DType dt : kAllDTypes) {
    Tensor base = Tensor::zeros({4, 6}, dt);
    // Every other column of base: [4, 3] with strides {6, 2}.
    Tensor view = Tensor::borrow(base.data(), {4, 3}, dt, {6, 2});
    for (int64_t i = 0; i < view.numel(); ++i) view.set(i, dt == DType::boolean ? 1 : double(i));
    for (int64_t i = 0; i < view.numel(); ++i)
      EXPECT_EQ(view.get(i), dt == DType::boolean ? 1 : double(i)) << dtype_name(dt);
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 1; c < 6; c += 2) EXPECT_EQ(base.get(r * 6 + c), 0.0);  // untouched
  }
}

TEST(Tensor, ContiguousCopiesOnlyWhenStrided) {
  Tensor a = Tensor::rand({3, 4}, DType::f32, 1);
  EXPECT_EQ(a.contiguous().data(), a.data());

  std::vector<int32_t> buf(12);
  std::iota(buf.begin(), buf.end(), 0);
  Tensor t = Tensor::borrow(buf.data(), {4, 3}, DType::i32, {1, 4});  // transpose of [3, 4]
  Tensor c = t.contiguous();
  EXPECT_NE(c.data(), t.data());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.sizes(), t.sizes());
  EXPECT_EQ(c.dtype(), DType::i32);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(c.get(i), t.get(i));
  EXPECT_EQ(c.data_as<int32_t>()[1], 4);
}

TEST(Tensor, ToConvertsDtypes) {
  std::vector<float> buf = {2.7f, -2.7f, 0.0f, 1.0f + 0x1p-11f, 70000.0f, kNaN};
  Tensor t = Tensor::borrow(buf.data(), {6}, DType::f32);

  Tensor i = t.to(DType::i32);  // truncates toward zero; NaN becomes 0
  EXPECT_EQ(i.dtype(), DType::i32);
  const int32_t want_i[] = {2, -2, 0, 1, 70000, 0};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(i.data_as<int32_t>()[k], want_i[k]) << k;

  Tensor b = t.to(DType::boolean);
  const uint8_t want_b[] = {1, 1, 0, 1, 1, 1};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(b.data_as<uint8_t>()[k], want_b[k]) << k;

  Tensor h = t.to(DType::f16);
  EXPECT_EQ(h.get(0), double(f16_to_f32(f32_to_f16(2.7f))));
  EXPECT_EQ(h.get(3), 1.0);                 // rounded to even
  EXPECT_TRUE(std::isinf(h.get(4)));        // beyond half's range
  EXPECT_TRUE(std::isnan(h.get(5)));

  Tensor bf = t.to(DType::bf16).to(DType::f32);
  EXPECT_EQ(bf.get(0), double(bf16_to_f32(f32_to_bf16(2.7f))));
  EXPECT_EQ(bf.get(4), 70144.0);            // nearest bfloat16 to 70000

  Tensor same = t.to(DType::f32);
  EXPECT_NE(same.data(), t.data());         // always a new tensor
  EXPECT_EQ(std::memcmp(same.data(), buf.data(), 6 * 4), 0);
}

TEST(Tensor, ToFromStridedView) {
  std::vector<int64_t> buf = {0, 1, 2, 3, 4, 5};
  Tensor t = Tensor::borrow(buf.data(), {3, 2}, DType::i64, {1, 3});
  Tensor f = t.to(DType::f32);
  EXPECT_TRUE(f.is_contiguous());
  const float want[] = {0, 3, 1, 4, 2, 5};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(f.data_as<float>()[k], want[k]);
}

// ---- allclose

TEST(AllClose, PassesWithinTolerance) {
  Tensor a = Tensor::rand({64, 64}, DType::f32, 3);
  Tensor b = a.to(DType::f32);
  b.set(100, b.get(100) + 1e-6);
  CloseResult r = allclose(a, b, 1e-4, 1e-5);
  EXPECT_TRUE(r.close);
  EXPECT_EQ(r.worst_index, 100);
  EXPECT_NEAR(r.max_abs_err, 1e-6, 1e-7);
  EXPECT_EQ(r.first_bad_index, -1);
  EXPECT_EQ(r.num_bad, 0);
}

TEST(AllClose, FailsAndReportsWorst) {
  Tensor a = Tensor::zeros({10}, DType::f32), b = Tensor::zeros({10}, DType::f32);
  a.set(3, 0.5);   // outside tolerance
  a.set(7, 2.0);   // the worst
  b.set(9, 100);   // relative tolerance covers this one
  a.set(9, 100.001);
  CloseResult r = allclose(a, b, 1e-4, 1e-5);
  EXPECT_FALSE(r.close);
  EXPECT_EQ(r.worst_index, 7);
  EXPECT_DOUBLE_EQ(r.max_abs_err, 2.0);
  EXPECT_EQ(r.first_bad_index, 3);
  EXPECT_EQ(r.num_bad, 2);
}

TEST(AllClose, NaNsMatchOnlyNaNs) {
  Tensor a = Tensor::zeros({4}, DType::f32), b = Tensor::zeros({4}, DType::f32);
  a.set(1, kNaN);
  b.set(1, kNaN);
  a.set(2, kInf);
  b.set(2, kInf);
  EXPECT_TRUE(allclose(a, b, 0, 0).close);
  b.set(3, kNaN);
  CloseResult r = allclose(a, b, 1e-4, 1e-5);
  EXPECT_FALSE(r.close);
  EXPECT_EQ(r.worst_index, 3);
  EXPECT_TRUE(std::isinf(r.max_abs_err));
  b.set(3, 0);
  b.set(2, -kInf);
  EXPECT_FALSE(allclose(a, b, 1e-4, 1e-5).close);
  b.set(2, 1e30);  // a finite value is never close to infinity, however loose rtol is
  EXPECT_FALSE(allclose(a, b, 1.0, 1.0).close);
  EXPECT_FALSE(allclose(b, a, 1.0, 1.0).close);
}

TEST(AllClose, ShapeMismatchNamesBothShapes) {
  Tensor a = Tensor::zeros({2, 3}, DType::f32), b = Tensor::zeros({3, 2}, DType::bf16);
  try {
    allclose(a, b, 0, 0);
    FAIL() << "expected ArgumentError";
  } catch (const ArgumentError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("float32[2, 3]"), std::string::npos) << what;
    EXPECT_NE(what.find("bfloat16[3, 2]"), std::string::npos) << what;
  }
}

TEST(AllClose, MixedDtypesAndLayouts) {
  Tensor a = Tensor::rand({5, 7}, DType::f32, 11);
  Tensor a_bf = a.to(DType::bf16);
  const Tolerance tol = default_tolerance(DType::bf16);
  EXPECT_TRUE(allclose(a_bf, a, tol.rtol, tol.atol).close);
  EXPECT_FALSE(allclose(a_bf, a, 0, 0).close);
  // A transposed view compared against a contiguous copy of itself.
  Tensor t = Tensor::borrow(a.data(), {7, 5}, DType::f32, {1, 7});
  EXPECT_TRUE(allclose(t, t.contiguous(), 0, 0).close);
  EXPECT_FALSE(allclose(t, Tensor::borrow(a.data(), {7, 5}, DType::f32), 0, 0).close);
}

TEST(AllClose, DefaultTolerances) {
  EXPECT_EQ(default_tolerance(DType::f32).rtol, 1e-4);
  EXPECT_EQ(default_tolerance(DType::f32).atol, 1e-5);
  EXPECT_EQ(default_tolerance(DType::bf16).rtol, 2e-2);
  EXPECT_EQ(default_tolerance(DType::bf16).atol, 2e-2);
  EXPECT_EQ(default_tolerance(DType::f16).rtol, 5e-3);
  EXPECT_EQ(default_tolerance(DType::f16).atol, 5e-3);
  for (DType dt : {DType::i32, DType::i64, DType::boolean}) {
    EXPECT_EQ(default_tolerance(dt).rtol, 0.0);
    EXPECT_EQ(default_tolerance(dt).atol, 0.0);
  }
}

// ---- Size-1 and empty shapes

TEST(Shapes, ScalarTensor) {
  Tensor s = Tensor::zeros({}, DType::f32);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_TRUE(s.is_contiguous());
  s.set(0, 3.5);
  EXPECT_EQ(s.get(0), 3.5);
  EXPECT_EQ(s.to(DType::i32).get(0), 3.0);
  EXPECT_THROW(s.size(0), ArgumentError);
  EXPECT_THROW(s.get(1), ArgumentError);
}

TEST(Shapes, SizeOneDimsIgnoreStrides) {
  float buf[4] = {1, 2, 3, 4};
  Tensor t = Tensor::borrow(buf, {1, 4, 1}, DType::f32, {99, 1, 42});
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.contiguous().data(), static_cast<void*>(buf));
  EXPECT_EQ(t.get(3), 4.0);
  EXPECT_EQ(t.to(DType::f32).get(2), 3.0);
}

TEST(Shapes, ZeroElementTensors) {
  for (DType dt : kAllDTypes) {
    Tensor e = Tensor::zeros({0, 5}, dt);
    EXPECT_TRUE(e.defined());
    EXPECT_EQ(e.numel(), 0);
    EXPECT_EQ(e.nbytes(), 0);
    EXPECT_TRUE(e.is_contiguous());
    EXPECT_EQ(e.describe(), std::string(dtype_name(dt)) + "[0, 5]");
    EXPECT_THROW(e.get(0), ArgumentError);
    Tensor f = e.to(DType::f32);
    EXPECT_EQ(f.sizes(), e.sizes());
    CloseResult r = allclose(e, f, 0, 0);
    EXPECT_TRUE(r.close);
    EXPECT_EQ(r.worst_index, -1);
    EXPECT_EQ(Tensor::rand({5, 0}, dt, 1).numel(), 0);
  }
  Tensor b = Tensor::borrow(nullptr, {0}, DType::f32);  // null is fine when nothing is read
  EXPECT_TRUE(b.defined());
}

// ---- DLPack

TEST(DLPack, ExportImportSharesData) {
  for (DType dt : kAllDTypes) {
    Tensor a = Tensor::rand({3, 4}, dt, 5);
    DLManagedTensor* m = a.to_dlpack();
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->dl_tensor.data, a.data());
    EXPECT_EQ(m->dl_tensor.device.device_type, kDLCPU);
    EXPECT_EQ(m->dl_tensor.ndim, 2);
    EXPECT_EQ(m->dl_tensor.shape[0], 3);
    EXPECT_EQ(m->dl_tensor.shape[1], 4);
    EXPECT_EQ(m->dl_tensor.dtype.bits, dtype_size(dt) * 8);
    EXPECT_EQ(m->dl_tensor.dtype.lanes, 1);
    Tensor b = Tensor::from_dlpack(m);
    EXPECT_EQ(b.data(), a.data());
    EXPECT_EQ(b.dtype(), dt);
    EXPECT_EQ(b.sizes(), a.sizes());
    EXPECT_EQ(b.strides(), a.strides());
    EXPECT_TRUE(allclose(a, b, 0, 0).close);
  }
  DLManagedTensor* m = Tensor::empty({1}, DType::boolean).to_dlpack();
  EXPECT_EQ(m->dl_tensor.dtype.code, 6);  // kDLBool (DLPack >= 0.8)
  m->deleter(m);
}

TEST(DLPack, ExportKeepsBufferAlive) {
  Tensor b;
  {
    Tensor a = Tensor::zeros({16}, DType::f32);
    a.set(5, 9.0);
    b = Tensor::from_dlpack(a.to_dlpack());
  }  // a is gone; the managed tensor's copy still owns the buffer
  EXPECT_EQ(b.get(5), 9.0);
}

TEST(DLPack, ExportOfStridedView) {
  Tensor base = Tensor::rand({4, 6}, DType::f32, 2);
  Tensor v = Tensor::borrow(base.data(), {6, 4}, DType::f32, {1, 6});
  DLManagedTensor* m = v.to_dlpack();
  EXPECT_EQ(m->dl_tensor.strides[0], 1);
  EXPECT_EQ(m->dl_tensor.strides[1], 6);
  Tensor back = Tensor::from_dlpack(m);
  EXPECT_TRUE(allclose(back, v, 0, 0).close);
  EXPECT_FALSE(back.is_contiguous());
}

// A producer-side DLManagedTensor over a caller buffer, counting deleter calls.
struct Foreign {
  static inline int deleted = 0;
  int64_t shape[2] = {2, 3};
  DLManagedTensor m{};
  explicit Foreign(void* data, DLDataType dtype, DLDeviceType dev = kDLCPU) {
    m.dl_tensor.data = data;
    m.dl_tensor.device = {dev, 0};
    m.dl_tensor.ndim = 2;
    m.dl_tensor.dtype = dtype;
    m.dl_tensor.shape = shape;
    m.dl_tensor.strides = nullptr;  // compact row-major
    m.dl_tensor.byte_offset = 0;
    m.manager_ctx = this;
    m.deleter = [](DLManagedTensor*) { ++deleted; };
  }
};

TEST(DLPack, ImportForeignTensor) {
  Foreign::deleted = 0;
  int32_t buf[8] = {-1, 0, 1, 2, 3, 4, 5, -1};
  Foreign f(buf, {kDLInt, 32, 1});
  f.m.dl_tensor.byte_offset = 4;  // skip the first element
  {
    Tensor t = Tensor::from_dlpack(&f.m);
    EXPECT_EQ(t.data(), static_cast<void*>(buf + 1));
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.strides(), (std::vector<int64_t>{3, 1}));
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(t.get(i), double(i));
    Tensor copy = t;  // shared ownership: one deleter call for both
    EXPECT_EQ(Foreign::deleted, 0);
  }
  EXPECT_EQ(Foreign::deleted, 1);
}

TEST(DLPack, ImportBoolAsUInt8AndKDLBool) {
  uint8_t buf[6] = {1, 0, 1, 1, 0, 0};
  Foreign a(buf, {kDLUInt, 8, 1});
  EXPECT_EQ(Tensor::from_dlpack(&a.m).dtype(), DType::boolean);
  Foreign b(buf, {6, 8, 1});
  Tensor t = Tensor::from_dlpack(&b.m);
  EXPECT_EQ(t.dtype(), DType::boolean);
  EXPECT_EQ(t.get(2), 1.0);
}

TEST(DLPack, ImportRejectsUnsupportedAndStillReleases) {
  Foreign::deleted = 0;
  double dbuf[6] = {};
  Foreign f64(dbuf, {kDLFloat, 64, 1});
  EXPECT_THROW(Tensor::from_dlpack(&f64.m), ArgumentError);
  EXPECT_EQ(Foreign::deleted, 1);

  float fbuf[6] = {};
  Foreign gpu(fbuf, {kDLFloat, 32, 1}, kDLCUDA);
  EXPECT_THROW(Tensor::from_dlpack(&gpu.m), ArgumentError);
  EXPECT_EQ(Foreign::deleted, 2);

  Foreign vec(fbuf, {kDLFloat, 32, 4});  // vector lanes are not supported
  EXPECT_THROW(Tensor::from_dlpack(&vec.m), ArgumentError);
  EXPECT_EQ(Foreign::deleted, 3);

  EXPECT_THROW(Tensor::from_dlpack(nullptr), ArgumentError);
}

TEST(DLPack, ScalarAndEmptyRoundTrip) {
  Tensor s = Tensor::zeros({}, DType::i64);
  s.set(0, 42);
  Tensor s2 = Tensor::from_dlpack(s.to_dlpack());
  EXPECT_EQ(s2.dim(), 0);
  EXPECT_EQ(s2.get(0), 42.0);
  Tensor e = Tensor::empty({0, 3}, DType::f16);
  Tensor e2 = Tensor::from_dlpack(e.to_dlpack());
  EXPECT_EQ(e2.sizes(), (std::vector<int64_t>{0, 3}));
  EXPECT_TRUE(e2.defined());
}

}  // namespace
}  // namespace deuteron
