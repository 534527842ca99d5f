// The language's math, integer and random functions on every target (cpu; pallas under TPU
// interpret mode; triton under Triton's interpreter), at a ragged length and at length 1,
// against references written here: C's functions in double precision, integer semantics in
// plain int64 arithmetic, and an independent Philox4x32-10 (philox_reference.h) that is itself
// checked against Random123's known-answer vectors. Dropout is the test of it all.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "api/api.h"
#include "backends/python/runner.h"
#include "deuteron/deuteron.h"
#include "philox_reference.h"
#include "test_support.h"

namespace deuteron {
namespace {

namespace hl = deuteron::hl;
using testing_support::ScopedEnv;

// The tests check values, not speed: every kernel runs its default config (no tuning).
const KernelOptions kUntuned{.effort = "none"};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Random123 1.14, examples/kat_vectors (github.com/DEShawResearch/random123), the three
// "philox4x32 10" lines: counter (4 words), key (2 words), the expected output (4 words).
TEST(Philox, ReferenceMatchesRandom123) {
  struct Kat {
    testing_support::Words ctr;
    std::array<uint32_t, 2> key;
    testing_support::Words want;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}, {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) EXPECT_EQ(testing_support::philox4x32_10(k.ctr, k.key), k.want);
}

// Every target, named: cpu runs natively, pallas and triton in their interpreters.
class LangOps : public testing::TestWithParam<std::string> {
 protected:
  ScopedEnv triton_device_{"DEUTERON_TRITON_DEVICE", "interpret"};
  std::string target() const { return GetParam(); }
  Outputs run(const KernelBase& k, const std::vector<Arg>& args) const { return api::run(k, args, target()).outputs; }
};

std::string show(double x) { return fmt::format("{:.9g}", x); }

// Whether got equals want (NaN equal to NaN; signed zeros compare by value) within `ulps` units in
// the last place of `dtype` at want (0: exactly).
bool near(double got, double want, double ulps, DType dtype) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  int mantissa = dtype == DType::bf16 ? 8 : 24;
  double ulp = std::ldexp(1.0, std::max(std::ilogb(want == 0 ? 1e-38 : want), -126) - (mantissa - 1));
  return std::abs(got - want) <= ulps * ulp;
}

// C's (and torch's) functions, evaluated in double and rounded to the output's dtype.
double round_to(double x, DType t) { return t == DType::bf16 ? bf16_to_f32(f32_to_bf16(float(x))) : double(float(x)); }

// ---- random numbers ---------------------------------------------------------------------------

const auto random_kernel = deuteron::kernel("lang_random", [](hl::Tensor x, hl::Scalar seed) {
  auto u = hl::empty_like(x, DType::f32);
  auto z = hl::empty_like(x, DType::f32);
  auto bits = hl::empty_like(x, DType::i32);
  for (auto t : hl::tile(x.size(0))) {
    auto offset = t.index() + 1000;
    u[t] = hl::rand(seed, offset);
    z[t] = hl::randn(seed, offset);
    bits[t] = hl::randint(seed, offset);
  }
  return std::tuple{u, z, bits};
}, kUntuned);

TEST_P(LangOps, RandomNumbersMatchPhiloxReferenceBitForBit) {
  for (int64_t n : {int64_t(37), int64_t(1)}) {
    for (int64_t seed : {int64_t(123456789), int64_t(-7)}) {  // -7: the key's high word is all ones
      Outputs out = run(random_kernel, {Tensor::zeros({n}, DType::f32), seed});
      for (int64_t i = 0; i < n; ++i) {
        int64_t offset = i + 1000;
        SCOPED_TRACE(fmt::format("n={} seed={} offset={}", n, seed, offset));
        EXPECT_EQ(out[0].get(i), testing_support::rand_reference(seed, offset));
        EXPECT_EQ(int64_t(out[2].get(i)), testing_support::randint_reference(seed, offset));
        // Box-Muller through each target's f32 log, sqrt and cos: a few ulps of its ~5 range.
        EXPECT_NEAR(out[1].get(i), testing_support::randn_reference(seed, offset), 1e-5);
      }
    }
  }
}

// For offsets below 2^32 the key and counter layout is Triton's, so hl::randint is tl.randint
// word for word (hl::rand is not tl.rand, which scales 31 bits). Runs tl.randint itself under
// Triton's interpreter in the project's venv.
TEST(TritonLangOps, RandintIsTlRandint) {
  ScopedEnv interpret("TRITON_INTERPRET", "1");
  const std::string script =
      "import torch, triton, triton.language as tl\n"
      "@triton.jit\n"
      "def k(out, seed):\n"
      "    o = 1000 + tl.arange(0, 64)\n"
      "    tl.store(out + tl.arange(0, 64), tl.randint(seed, o))\n"
      "a = torch.zeros(64, dtype=torch.int32)\n"
      "k[(1,)](a, 123456789)\n"
      "print(' '.join(str(v) for v in a.tolist()))\n";
  std::string path = testing::TempDir() + "tl_randint.py";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(script.c_str(), f);
    std::fclose(f);
  }
  std::string command = python::python_path().string() + " " + path;
  std::FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::vector<int64_t> got;
  long long v;
  while (std::fscanf(pipe, "%lld", &v) == 1) got.push_back(v);
  ASSERT_EQ(pclose(pipe), 0) << command;
  ASSERT_EQ(got.size(), 64u) << command;
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(got[size_t(i)], testing_support::randint_reference(123456789, 1000 + i)) << i;
}

// ---- integer operations -----------------------------------------------------------------------

const auto integer_kernel = deuteron::kernel("lang_integer", [](hl::Tensor a, hl::Tensor b) {
  std::vector<hl::Tensor> outs;
  for (int i = 0; i < 7; ++i) outs.push_back(hl::empty_like(a));
  for (auto t : hl::tile(a.size(0))) {
    auto x = a[t], y = b[t];
    outs[0][t] = x & y;
    outs[1][t] = x | y;
    outs[2][t] = x ^ y;
    outs[3][t] = x << y;
    outs[4][t] = x >> y;
    outs[5][t] = x % y;
    outs[6][t] = hl::floor_divide(x, y);
  }
  return std::tuple{outs[0], outs[1], outs[2], outs[3], outs[4], outs[5], outs[6]};
}, kUntuned);

// torch's semantics for `bits`-wide integers, in int64 / __int128 arithmetic.
int64_t wrap(__int128 x, int bits) {
  unsigned __int128 m = (unsigned __int128)1 << bits;
  unsigned __int128 u = (unsigned __int128)x % m;
  return u >= m / 2 ? int64_t(__int128(u) - __int128(m)) : int64_t(u);
}
int64_t reference_integer(int op, int64_t x, int64_t y, int bits) {
  auto floor_div = [&]() -> __int128 {
    if (y == 0) return 0;
    __int128 q = __int128(x) / y;
    if (__int128(x) % y != 0 && ((x < 0) != (y < 0))) --q;
    return q;
  };
  switch (op) {
    case 0: return x & y;
    case 1: return x | y;
    case 2: return x ^ y;
    case 3: return y < 0 || y >= bits ? 0 : wrap(__int128(x) * (__int128(1) << y), bits);
    case 4: return y < 0 || y >= bits ? (x < 0 ? -1 : 0) : wrap(x >> y, bits);
    case 5: return y == 0 ? x : wrap(__int128(x) - __int128(y) * floor_div(), bits);
    case 6: return wrap(floor_div(), bits);
  }
  return 0;
}

void check_integers(const std::string& target, DType dtype, const Outputs& out, const std::vector<int64_t>& xs,
                    const std::vector<int64_t>& ys) {
  const char* names[] = {"&", "|", "^", "<<", ">>", "%", "//"};
  int bits = 8 * dtype_size(dtype);
  for (int op = 0; op < 7; ++op)
    for (size_t i = 0; i < xs.size(); ++i) {
      int64_t g = dtype == DType::i32 ? int64_t(out[size_t(op)].data_as<int32_t>()[i]) : out[size_t(op)].data_as<int64_t>()[i];
      EXPECT_EQ(g, reference_integer(op, xs[i], ys[i], bits))
          << target << " " << dtype_name(dtype) << ": " << xs[i] << " " << names[op] << " " << ys[i];
    }
}

// Edge operands: the extremes, signs, zero divisors, shift counts below 0, at and past the width.
std::pair<std::vector<int64_t>, std::vector<int64_t>> integer_operands(DType dtype, bool wide_values) {
  int64_t lo = dtype == DType::i32 || !wide_values ? INT32_MIN : INT64_MIN;
  int64_t hi = dtype == DType::i32 || !wide_values ? INT32_MAX : INT64_MAX;
  std::vector<int64_t> xs = {lo, hi, -1, 0, 1, 7, -7, 7, -7, 12345, -12345, 1, -1, lo, 5, -5, 6, -6, lo, 100, -100};
  std::vector<int64_t> ys = {-1, 2, 0, 3, 31, 2, 2, -2, -2, 0, 0, 32, 33, -1, 63, 64, 1, 1, 1, -3, 3};
  // A ragged tail: more pairs from a fixed pattern.
  for (int i = 0; i < 16; ++i) {
    xs.push_back((i * 7919) % 4001 - 2000);
    ys.push_back(i % 5 == 0 ? 0 : (i * 13) % 41 - 20);
  }
  return {xs, ys};
}

Tensor tensor_of(const std::vector<int64_t>& v, DType dtype) {
  Tensor t = Tensor::empty({int64_t(v.size())}, dtype);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::i32) t.data_as<int32_t>()[i] = int32_t(v[i]);
    else t.data_as<int64_t>()[i] = v[i];
  }
  return t;
}

TEST_P(LangOps, IntegerOperationsFollowTorch) {
  for (DType dtype : {DType::i32, DType::i64}) {
    // The pallas target computes integers in int32: int64 shifts by a computed count cannot be
    // proven to fit and are rejected (PallasLangOps.RejectsInt64ShiftsItCannotBound).
    if (target() == "pallas" && dtype == DType::i64) continue;
    auto [xs, ys] = integer_operands(dtype, true);
    check_integers(target(), dtype, run(integer_kernel, {tensor_of(xs, dtype), tensor_of(ys, dtype)}), xs, ys);
    std::vector<int64_t> x1 = {-9}, y1 = {4};  // length 1
    check_integers(target(), dtype, run(integer_kernel, {tensor_of(x1, dtype), tensor_of(y1, dtype)}), x1, y1);
  }
}

const auto wide_shift_kernel = deuteron::kernel("lang_wide_shift", [](hl::Tensor a, hl::Tensor b) {
  auto out = hl::empty_like(a, DType::i32);  // an int32 output: only the int64 shift is in question
  for (auto t : hl::tile(a.size(0))) out[t] = (a[t] << b[t]).to(DType::i32);
  return out;
}, kUntuned);

TEST(PallasLangOps, RejectsInt64ShiftsItCannotBound) {
  auto [xs, ys] = integer_operands(DType::i64, false);
  try {
    api::run(wide_shift_kernel, {tensor_of(xs, DType::i64), tensor_of(ys, DType::i64)}, "pallas");
    FAIL() << "an int64 shift by a computed count ran on pallas";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("int32"), std::string::npos) << what;
    EXPECT_NE(what.find("left_shift"), std::string::npos) << what;
    EXPECT_NE(what.find("test_lang_ops.cpp"), std::string::npos) << what;
  }
}

// int64 arithmetic on indices, as kernels write it: on pallas each value must be provably within
// int32 (the range analysis bounds &, >>, %, // and << by a constant), everywhere it is exact.
const auto index_kernel = deuteron::kernel("lang_index_bits", [](hl::Tensor x) {
  auto out = hl::empty_like(x, DType::i32);  // (pallas has no int64 outputs)
  for (auto t : hl::tile(x.size(0))) {
    auto i = t.index() * 7919 - 5000;
    out[t] = (((i & 0xff) << 4) + (i >> 3) + i % 13 + hl::floor_divide(i, -6) + ((i & 0x3ff) ^ 0x5a)).to(DType::i32);
  }
  return out;
}, kUntuned);

TEST_P(LangOps, Int64IndexArithmeticThatFitsInt32) {
  for (int64_t n : {int64_t(1000), int64_t(1)}) {
    Tensor out = run(index_kernel, {Tensor::zeros({n}, DType::f32)}).at(0);
    for (int64_t k = 0; k < n; ++k) {
      int64_t i = k * 7919 - 5000;
      int64_t want = ((i & 0xff) << 4) + (i >> 3) + reference_integer(5, i, 13, 64) + reference_integer(6, i, -6, 64) + ((i & 0x3ff) ^ 0x5a);
      ASSERT_EQ(int64_t(out.get(k)), want) << target() << " at i=" << i;
    }
  }
}

// ---- bitcasts ---------------------------------------------------------------------------------

const auto bitcast_kernel = deuteron::kernel("lang_bitcast", [](hl::Tensor x, hl::Tensor i) {
  auto bits = hl::empty_like(x, DType::i32);
  auto value = hl::empty_like(i, DType::f32);
  for (auto t : hl::tile(x.size(0))) {
    bits[t] = hl::bitcast(x[t], DType::i32);
    value[t] = hl::bitcast(i[t], DType::f32);
  }
  return std::tuple{bits, value};
}, kUntuned);

TEST_P(LangOps, BitcastKeepsTheBits) {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -2.5f, 1e-45f, 3.4e38f, INFINITY, -INFINITY, 0.1f};
  std::vector<int64_t> is = {0, int64_t(0x80000000u) - (int64_t(1) << 32), 0x3f800000, 1, 0x7f800000, 0x7fc00000, -1, 12345, 0x00800000};
  Tensor x = Tensor::empty({int64_t(xs.size())}, DType::f32);
  std::memcpy(x.data(), xs.data(), xs.size() * 4);
  Outputs out = run(bitcast_kernel, {x, tensor_of(is, DType::i32)});
  for (size_t k = 0; k < xs.size(); ++k) {
    int32_t want_bits;
    std::memcpy(&want_bits, &xs[k], 4);
    EXPECT_EQ(out[0].data_as<int32_t>()[k], want_bits) << target() << " bitcast(" << xs[k] << ")";
    int32_t got_bits, in = int32_t(is[k]);
    std::memcpy(&got_bits, &out[1].data_as<float>()[k], 4);
    if (in == 0x7fc00000 || in == -1) EXPECT_TRUE(std::isnan(out[1].data_as<float>()[k])) << target();
    else EXPECT_EQ(got_bits, in) << target() << " bitcast(" << in << ")";
  }
}

// ---- math --------------------------------------------------------------------------------------

constexpr int kMathFns = 11;
const char* const kMathNames[kMathFns] = {"sin", "cos", "log1p", "expm1", "floor", "ceil", "round",
                                          "pow(x, y)", "pow(x, 2)", "clamp(x, -1.5, 2)", "pow(2, y)"};

const auto math_kernel = deuteron::kernel("lang_math", [](hl::Tensor x, hl::Tensor y) {
  std::vector<hl::Tensor> outs;
  for (int i = 0; i < kMathFns; ++i) outs.push_back(hl::empty_like(x));
  for (auto t : hl::tile(x.size(0))) {
    auto a = x[t], b = y[t];
    outs[0][t] = hl::sin(a);
    outs[1][t] = hl::cos(a);
    outs[2][t] = hl::log1p(a);
    outs[3][t] = hl::expm1(a);
    outs[4][t] = hl::floor(a);
    outs[5][t] = hl::ceil(a);
    outs[6][t] = hl::round(a);
    outs[7][t] = hl::pow(a, b);
    outs[8][t] = hl::pow(a, 2.0);
    outs[9][t] = hl::clamp(a, -1.5, 2.0);
    outs[10][t] = hl::pow(2.0, b);
  }
  return std::tuple{outs[0], outs[1], outs[2], outs[3], outs[4], outs[5], outs[6], outs[7], outs[8], outs[9], outs[10]};
}, kUntuned);

double reference_math(int fn, double x, double y) {
  switch (fn) {
    case 0: return std::sin(x);
    case 1: return std::cos(x);
    case 2: return std::log1p(x);
    case 3: return std::expm1(x);
    case 4: return std::floor(x);
    case 5: return std::ceil(x);
    case 6: return std::nearbyint(x);
    case 7: return std::pow(x, y);
    case 8: return std::pow(x, 2.0);
    case 9: return std::isnan(x) ? x : std::min(std::max(x, -1.5), 2.0);
    case 10: return std::pow(2.0, y);
  }
  return 0;
}

// Pairs (x, y) with torch's edge cases: NaN, infinities, signed zeros, halves (round), tiny
// arguments (log1p, expm1), negative bases with integer and non-integer exponents, overflow.
std::vector<std::pair<double, double>> math_operands() {
  return {{0.0, 0.0},     {-0.0, 3.0},    {-0.0, -3.0},  {0.5, kNaN},    {1.0, kNaN},     {kNaN, 0.0},
          {kNaN, 2.0},    {kInf, 0.5},    {-kInf, 3.0},  {-kInf, 0.5},   {-kInf, -2.0},   {2.5, 2.0},
          {-2.5, 3.0},    {-2.5, 0.5},    {1.5, -kInf},  {0.5, -kInf},   {-1.0, kInf},    {-0.5, 2.0},
          {3.5, 1.25},    {-3.5, -3.0},   {1e-8, 10.0},  {-1e-8, 1.5},   {-1.0, 127.0},   {-0.99, 2.0},
          {-2.0, 128.0},  {10.0, 38.5},   {88.0, 0.25},  {-88.0, -2.0},  {100.0, -100.0}, {0.49999997, 100.0},
          {7.0, 1.0 / 3}, {-6.5, 4.0},    {12.3, -0.5},  {-0.3, -1.0},   {2e-3, 3.0}};
}

TEST_P(LangOps, MathFollowsTorchAtEdgeCases) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    auto pairs = math_operands();
    for (size_t n : {pairs.size(), size_t(1)}) {
      Tensor x = Tensor::empty({int64_t(n)}, dtype), y = Tensor::empty({int64_t(n)}, dtype);
      for (size_t i = 0; i < n; ++i) {
        x.set(int64_t(i), pairs[i].first);
        y.set(int64_t(i), pairs[i].second);
      }
      Outputs out = run(math_kernel, {x, y});
      for (int fn = 0; fn < kMathFns; ++fn)
        for (size_t i = 0; i < n; ++i) {
          double xi = x.get(int64_t(i)), yi = y.get(int64_t(i));  // the values as stored
          double want = round_to(reference_math(fn, xi, yi), dtype), got = out[size_t(fn)].get(int64_t(i));
          bool exact = (fn >= 4 && fn <= 6) || fn == 9;
          // f32: a few ulps (libm's, XLA's and Triton's f32 functions); bf16: the f32 result rounded once more.
          EXPECT_TRUE(near(got, want, exact ? 0 : dtype == DType::bf16 ? 1 : 4, dtype))
              << target() << " " << dtype_name(dtype) << " " << kMathNames[fn] << " at x=" << show(xi) << " y=" << show(yi)
              << ": got " << show(got) << ", want " << show(want);
        }
    }
  }
}

// hl::clamp, hl::maximum and the amax/amin reductions propagate NaN, as torch's do (Triton's
// tl.maximum and tl.max drop it unless told).
const auto nan_kernel = deuteron::kernel("lang_nan", [](hl::Tensor x) {
  auto big = hl::empty({x.size(0)});
  auto small = hl::empty({x.size(0)});
  auto pairwise = hl::empty_like(x);
  for (auto tm : hl::tile(x.size(0))) {
    auto row = x[{tm, hl::all}];
    big[tm] = row.amax(1);
    small[tm] = row.amin(1);
    pairwise[{tm, hl::all}] = hl::maximum(row, 0.0) + hl::minimum(row, 1.0);
  }
  return std::tuple{big, small, pairwise};
}, kUntuned);

TEST_P(LangOps, NaNPropagatesThroughMaxMinAndClamp) {
  // 301 columns: the cpu target reduces such rows in chunks of lanes, then the rest of the row;
  // a NaN in either must reach the result.
  for (const int64_t cols : {37, 301}) {
    const int64_t rows = 4;
    Tensor x = Tensor::rand({rows, cols}, DType::f32, 7, -2.0, 2.0);
    x.set(1 * cols + 20, kNaN);  // row 1 holds a NaN
    x.set(3 * cols + cols - 11, kNaN);  // and row 3, near its end
    Outputs out = run(nan_kernel, {x});
    for (int64_t i = 0; i < rows; ++i) {
      double mx = -kInf, mn = kInf;
      bool nan = false;
      for (int64_t j = 0; j < cols; ++j) {
        double v = x.get(i * cols + j);
        nan = nan || std::isnan(v);
        mx = std::max(mx, v);
        mn = std::min(mn, v);
      }
      EXPECT_TRUE(near(out[0].get(i), nan ? kNaN : mx, 0, DType::f32)) << target() << " amax of row " << i << ": " << out[0].get(i);
      EXPECT_TRUE(near(out[1].get(i), nan ? kNaN : mn, 0, DType::f32)) << target() << " amin of row " << i << ": " << out[1].get(i);
      for (int64_t j = 0; j < cols; ++j) {
        double v = x.get(i * cols + j);
        double want = std::isnan(v) ? kNaN : double(float(std::max(v, 0.0) + std::min(v, 1.0)));
        EXPECT_TRUE(near(out[2].get(i * cols + j), want, 0, DType::f32)) << target() << " at " << i << ", " << j;
      }
    }
  }
}

// ---- errors at the user's line ------------------------------------------------------------------

void expect_kernel_error(const KernelBase& k, const std::vector<Arg>& args, const std::string& part) {
  try {
    api::run(k, args, "cpu");
    ADD_FAILURE() << "no error; expected one saying '" << part << "'";
  } catch (const KernelError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(part), std::string::npos) << what;
    EXPECT_NE(what.find("test_lang_ops.cpp"), std::string::npos) << what;
  }
}

TEST(LangErrors, MisusedOperationsAreKernelErrorsAtTheUsersLine) {
  Tensor f = Tensor::zeros({5}, DType::f32), i = Tensor::zeros({5}, DType::i64);
  auto unary = [](auto fn) {
    return deuteron::kernel("lang_bad", [fn](hl::Tensor x) {
      auto out = hl::empty_like(x, DType::f32);
      for (auto t : hl::tile(x.size(0))) out[t] = fn(x[t]).to(DType::f32);
      return out;
    }, kUntuned);
  };
  expect_kernel_error(unary([](hl::Tensor x) { return hl::bitcast(x, DType::i32); }), {i}, "the widths differ");
  expect_kernel_error(unary([](hl::Tensor x) { return hl::bitcast(x, DType::i64); }), {f}, "the widths differ");
  expect_kernel_error(unary([](hl::Tensor x) { return hl::bitcast(x > 0.0, DType::i32); }), {f}, "the widths differ");
  expect_kernel_error(unary([](hl::Tensor x) { return x << 2; }), {f}, "left_shift takes integer operands, not float32");
  expect_kernel_error(unary([](hl::Tensor x) { return x & x; }), {f}, "bitwise_and takes integer or boolean operands");
  expect_kernel_error(unary([](hl::Tensor x) { return x % 3; }), {f}, "remainder takes integer operands");
  auto seeded = deuteron::kernel("lang_float_seed", [](hl::Tensor x, hl::Scalar seed) {
    auto out = hl::empty_like(x);
    for (auto t : hl::tile(x.size(0))) out[t] = hl::rand(seed, t.index());
    return out;
  }, kUntuned);
  expect_kernel_error(seeded, {f, 0.5}, "rand takes integer operands, not float32");
}

// ---- dropout --------------------------------------------------------------------------------------

// torch.nn.functional.dropout in training: each element is kept with probability 1 - p, by the
// element's own random number (seed, its linear index), and scaled by 1 / (1 - p).
const auto dropout = deuteron::kernel("lang_dropout", [](hl::Tensor x, hl::Scalar seed, hl::Scalar p) {
  auto out = hl::empty_like(x);
  int64_t cols = x.size(1);
  for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) {
    auto offset = tm.index().unsqueeze(1) * cols + tn.index().unsqueeze(0);
    auto keep = hl::rand(seed, offset) >= p;
    auto scale = 1.0 / (1.0 - p);
    out[{tm, tn}] = hl::where(keep, x[{tm, tn}] * scale, 0.0);
  }
  return out;
}, kUntuned);

TEST(Dropout, KeepsSeventyPercentOfEightMillionWithOneMaskPerSeed) {
  const int64_t rows = 2048, cols = 4096;  // 8M elements
  const double p = 0.3;
  Tensor x = Tensor::rand({rows, cols}, DType::f32, 5, 0.5, 2.0);  // never zero: zero means dropped
  Tensor a = api::run(dropout, {x, int64_t(42), p}, "cpu").outputs.at(0);
  Tensor again = api::run(dropout, {x, int64_t(42), p}, "cpu").outputs.at(0);
  Tensor other = api::run(dropout, {x, int64_t(43), p}, "cpu").outputs.at(0);
  const float* xa = x.data_as<float>();
  const float* pa = a.data_as<float>();
  int64_t kept = 0, differ = 0, same_run_differs = 0, bad_scale = 0, bad_mask = 0;
  const float scale = 1.0f / (1.0f - float(p));
  for (int64_t i = 0; i < rows * cols; ++i) {
    bool k = pa[i] != 0.0f;
    kept += k;
    same_run_differs += pa[i] != again.data_as<float>()[i];
    differ += k != (other.data_as<float>()[i] != 0.0f);
    if (k && std::abs(double(pa[i]) - double(xa[i]) / (1.0 - p)) > 1e-6 * std::abs(double(xa[i]) * scale)) ++bad_scale;
    // The mask is the reference Philox's: kept exactly where its uniform is at least p.
    if (i % 97 == 0 && k != (testing_support::rand_reference(42, i) >= float(p))) ++bad_mask;
  }
  double fraction = double(kept) / double(rows * cols);
  EXPECT_NEAR(fraction, 0.7, 0.001) << "kept " << kept << " of " << rows * cols;
  EXPECT_EQ(same_run_differs, 0) << "the same seed gave another mask";
  // Independent masks at 70% keep disagree on 2 * 0.7 * 0.3 = 42% of the elements.
  EXPECT_NEAR(double(differ) / double(rows * cols), 0.42, 0.005);
  EXPECT_EQ(bad_scale, 0) << "kept values not scaled by 1 / (1 - p)";
  EXPECT_EQ(bad_mask, 0) << "the mask is not the reference Philox's";
}

TEST_P(LangOps, DropoutMatchesTheCpuBitForBit) {
  for (std::vector<int64_t> shape : {std::vector<int64_t>{3, 37}, std::vector<int64_t>{1, 1}}) {
    Tensor x = Tensor::rand(shape, DType::f32, 6, -2.0, 2.0);
    Tensor want = api::run(dropout, {x, int64_t(2024), 0.3}, "cpu").outputs.at(0);
    Tensor got = run(dropout, {x, int64_t(2024), 0.3}).at(0);
    ASSERT_EQ(got.numel(), want.numel());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), size_t(want.nbytes())), 0) << target() << " at " << want.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, LangOps, testing::Values("cpu"));
INSTANTIATE_TEST_SUITE_P(Pallas, LangOps, testing::Values("pallas"));
INSTANTIATE_TEST_SUITE_P(Triton, LangOps, testing::Values("triton"));

}  // namespace
}  // namespace deuteron
