// Accuracy and special values of the CPU runtime header's math and conversions, against <cmath>
// in double precision. The header is what generated kernels include; it is compiled here with
// the test build's flags, and the evaluation loops carry `#pragma omp simd` so the vectorised
// form is what gets checked.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/runtime/deuteron_cpu.h"

namespace {

float f_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t u_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The float ulp at |r|: 2^-149 below the normal range.
double ulp_at(double r) {
  r = std::fabs(r);
  if (r < FLT_MIN) return std::ldexp(1.0, -149);
  int e;
  std::frexp(r, &e);  // r = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 24);
}

// Inputs: every float bit pattern with a prime stride (both signs, zeros, subnormals, inf, NaN
// all represented), plus a dense uniform sweep of [-20, 20] where the activations bend.
std::vector<float> sweep_inputs() {
  std::vector<float> xs;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 2039) xs.push_back(f_of(uint32_t(b)));
  for (int i = -20 * 2048; i <= 20 * 2048; ++i) xs.push_back(float(i) / 2048.0f);
  const float specials[] = {0.0f,     -0.0f,    1.0f,      -1.0f,        FLT_MIN,    -FLT_MIN,
                            FLT_MAX,  -FLT_MAX, dt::kInf,  dt::neg_inf(), dt::nan(), f_of(1),
                            f_of(0x80000001u)};
  for (float s : specials) xs.push_back(s);
  return xs;
}

const std::vector<float>& inputs() {
  static const std::vector<float> xs = sweep_inputs();
  return xs;
}

// Evaluates f over the inputs in a vectorisable loop.
template <class F>
std::vector<float> eval(F f) {
  const std::vector<float>& xs = inputs();
  std::vector<float> ys(xs.size());
  const float* px = xs.data();
  float* py = ys.data();
  const size_t n = xs.size();
#pragma omp simd
  for (size_t i = 0; i < n; ++i) py[i] = f(px[i]);
  return ys;
}

struct Worst {
  double err = 0;
  float at = 0;
  void add(double e, float x) {
    if (e > err) err = e, at = x;
  }
};

// Checks y = f(x) against the double reference for every input. The allowed error at x is
// tol(x, ref) (absolute); NaN must match NaN; an infinite reference must be met exactly; past
// FLT_MAX, results and references count as 2^128 so that values next to the overflow threshold
// are judged by their error. Prints the worst error in float ulps and relative (the latter
// for normal results).
template <class R, class T>
void check_values(const char* name, const std::vector<float>& ys, R ref, T tol) {
  const std::vector<float>& xs = inputs();
  Worst ulps, rel;
  int failures = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    const double r = ref(double(x));
    const float y = ys[i];
    auto where = [&] {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s(%.9g) [bits 0x%08x] = %.9g, reference %.17g", name, x,
                    u_of(x), y, r);
      return std::string(buf);
    };
    if (std::isnan(r) || std::isnan(y)) {
      if (std::isnan(r) != std::isnan(y) && failures++ < 10) ADD_FAILURE() << where();
      continue;
    }
    if (std::isinf(r)) {
      if (double(y) != r && failures++ < 10) ADD_FAILURE() << where();
      continue;
    }
    // Past FLT_MAX both sides count as 2^128, where float rounding turns into inf.
    const double top = std::ldexp(1.0, 128);
    const double yd = std::isinf(y) ? std::copysign(top, double(y)) : double(y);
    const double rd = std::fabs(r) > top ? std::copysign(top, r) : r;
    const double err = std::fabs(yd - rd);
    if (!(y == 0.0f && std::fabs(r) < 1e-35)) {  // the statistics leave out flushed results
      ulps.add(err / ulp_at(rd), x);
      if (std::fabs(r) >= FLT_MIN) rel.add(err / std::fabs(r), x);
    }
    if (!(err <= tol(double(x), r)) && failures++ < 10)
      ADD_FAILURE() << where() << ", error " << err << " > " << tol(double(x), r);
  }
  EXPECT_EQ(failures, 0) << name;
  std::printf("[   INFO   ] %-10s worst %.2f ulp at x=%.9g, worst relative %.3g at x=%.9g\n", name,
              ulps.err, ulps.at, rel.err, rel.at);
}
template <class F, class R, class T>
void check(const char* name, F f, R ref, T tol) {
  check_values(name, eval(f), ref, tol);
}

// k float ulps of the reference.
auto ulps(double k) {
  return [k](double, double r) { return k * ulp_at(r); };
}

constexpr double kDenorm = 0x1p-149;
constexpr double kPi = 3.14159265358979323846;
// The activations flush results below about 1e-36 to 0 (no subnormal arithmetic): allowed
// below 1e-35.
double flushable(double r) { return std::fabs(r) < 1e-35 ? std::fabs(r) : 0.0; }

// 2 ulp and 5e-7 relative; one subnormal step for subnormal results.
double exp_tolerance(double, double r) {
  return std::fmin(2.0 * ulp_at(r), std::fmax(5e-7 * std::fabs(r), kDenorm));
}

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_ref_tail(double x) {  // same function, without the cancellation for x << 0
  double v = 2.0 * std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-v));
}
double gelu_erf_ref(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
// silu and the gelus at -inf: the limit -0 (the formulas give inf * 0 = NaN).
template <class R>
auto at_neg_inf_zero(R ref) {
  return [ref](double x) { return x == -INFINITY ? -0.0 : ref(x); };
}

}  // namespace

TEST(CpuMath, Exp) {
  // Max relative error <= 5e-7 (the brief), in fact about 1 ulp, subnormal results included.
  check("exp", [](float x) { return dt::exp(x); }, [](double x) { return std::exp(x); },
        exp_tolerance);
  EXPECT_EQ(dt::exp(0.0f), 1.0f);
  EXPECT_EQ(dt::exp(dt::neg_inf()), 0.0f);
  EXPECT_FALSE(std::signbit(dt::exp(dt::neg_inf())));
  EXPECT_EQ(dt::exp(dt::kInf), dt::kInf);
  EXPECT_TRUE(std::isnan(dt::exp(dt::nan())));
  EXPECT_TRUE(std::isnan(dt::exp(-dt::nan())));
  EXPECT_EQ(dt::exp(88.73f), dt::kInf);
  EXPECT_EQ(dt::exp(1000.0f), dt::kInf);
  EXPECT_LT(dt::exp(88.72f), dt::kInf);
  EXPECT_GT(dt::exp(-103.9f), 0.0f);  // subnormal
  EXPECT_EQ(dt::exp(-104.0f), 0.0f);
  EXPECT_EQ(dt::exp(-1e30f), 0.0f);
  EXPECT_EQ(dt::exp(-FLT_MAX), 0.0f);
}

TEST(CpuMath, Exp2) {
  check("exp2", [](float x) { return dt::exp2(x); }, [](double x) { return std::exp2(x); },
        exp_tolerance);
  for (int k = -149; k <= 127; ++k) EXPECT_EQ(dt::exp2(float(k)), std::ldexp(1.0f, k)) << k;
  EXPECT_EQ(dt::exp2(-150.0f), 0.0f);  // 2^-150 is a tie between 0 and 2^-149: even is 0
  EXPECT_EQ(dt::exp2(128.0f), dt::kInf);
  EXPECT_EQ(dt::exp2(dt::neg_inf()), 0.0f);
  EXPECT_EQ(dt::exp2(dt::kInf), dt::kInf);
  EXPECT_TRUE(std::isnan(dt::exp2(dt::nan())));
}

// The exponentials for arguments known not to be positive: the general function's result
// bit for bit, except that results below their flush threshold are 0.
TEST(CpuMath, ExpNonPositive) {
  check("exp_nonpositive", [](float x) { return dt::exp_nonpositive(-dt::abs(x)); },
        [](double x) { return std::exp(-std::fabs(x)); },
        [](double x, double r) { return std::fmax(exp_tolerance(x, r), r < 4.6e-38 ? r : 0.0); });
  check("exp2_nonpositive", [](float x) { return dt::exp2_nonpositive(-dt::abs(x)); },
        [](double x) { return std::exp2(-std::fabs(x)); },
        [](double x, double r) { return std::fmax(exp_tolerance(x, r), r < 4.8e-38 ? r : 0.0); });
  int differ = 0;
  for (float x : inputs()) {
    const float a = -std::fabs(x);
    if (!(a >= -86.0f)) continue;
    differ += dt::exp_nonpositive(a) != dt::exp(a);
    differ += a >= -124.0f && dt::exp2_nonpositive(a) != dt::exp2(a);
  }
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(dt::exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(dt::exp_nonpositive(-0.0f), 1.0f);
  EXPECT_EQ(dt::exp_nonpositive(dt::neg_inf()), 0.0f);
  EXPECT_EQ(dt::exp_nonpositive(-86.5f), 0.0f);
  EXPECT_GT(dt::exp_nonpositive(-85.9f), 0.0f);
  EXPECT_TRUE(std::isnan(dt::exp_nonpositive(dt::nan())));
  EXPECT_EQ(dt::exp2_nonpositive(-124.0f), std::ldexp(1.0f, -124));
  EXPECT_EQ(dt::exp2_nonpositive(-124.5f), 0.0f);
  EXPECT_EQ(dt::exp2_nonpositive(dt::neg_inf()), 0.0f);
  EXPECT_TRUE(std::isnan(dt::exp2_nonpositive(dt::nan())));
}

namespace deuteron::testing_fma {  // tests/test_cpu_math_fma.cpp, compiled with -mfma
void exp_nonpositive_and_exp(const float* x, float* nonpositive, float* exp, size_t n);
}

// With FMA (generated kernels always have it here), exp_nonpositive's scaling is one fused
// operation; it gives exp's bits wherever it does not flush to 0, as the path without FMA does.
TEST(CpuMath, ExpNonPositiveWithFmaIsExp) {
  if (!__builtin_cpu_supports("fma")) GTEST_SKIP() << "this CPU has no FMA";
  std::vector<float> a;
  for (float x : inputs())
    if (-std::fabs(x) >= -86.0f || std::isnan(x)) a.push_back(-std::fabs(x));
  std::vector<float> nonpositive(a.size()), exp(a.size());
  deuteron::testing_fma::exp_nonpositive_and_exp(a.data(), nonpositive.data(), exp.data(), a.size());
  int differ = 0;
  for (size_t i = 0; i < a.size(); ++i)
    differ += std::isnan(a[i]) ? !std::isnan(nonpositive[i]) : nonpositive[i] != exp[i];
  EXPECT_EQ(differ, 0);
  EXPECT_GT(a.size(), size_t(1) << 20);
}

TEST(CpuMath, Log) {
  check("log", [](float x) { return dt::log(x); }, [](double x) { return std::log(x); },
        [](double, double r) { return std::fmin(2.0 * ulp_at(r), 5e-7 * std::fabs(r)); });
  EXPECT_EQ(dt::log(1.0f), 0.0f);
  EXPECT_EQ(dt::log(0.0f), dt::neg_inf());
  EXPECT_EQ(dt::log(-0.0f), dt::neg_inf());
  EXPECT_EQ(dt::log(dt::kInf), dt::kInf);
  EXPECT_TRUE(std::isnan(dt::log(-1.0f)));
  EXPECT_TRUE(std::isnan(dt::log(-FLT_MIN)));
  EXPECT_TRUE(std::isnan(dt::log(f_of(0x80000001u))));
  EXPECT_TRUE(std::isnan(dt::log(dt::neg_inf())));
  EXPECT_TRUE(std::isnan(dt::log(dt::nan())));
  EXPECT_NEAR(dt::log(f_of(1)), -103.278929903431851, 1e-5);  // smallest subnormal
  EXPECT_NEAR(dt::log(FLT_MAX), 88.7228391116729996, 1e-5);
}

TEST(CpuMath, SqrtRsqrt) {
  check("sqrt", [](float x) { return dt::sqrt(x); }, [](double x) { return std::sqrt(x); },
        ulps(0.5));
  check("rsqrt", [](float x) { return dt::rsqrt(x); }, [](double x) { return 1.0 / std::sqrt(x); },
        ulps(2.0));
  EXPECT_EQ(dt::rsqrt(4.0f), 0.5f);
  EXPECT_EQ(dt::rsqrt(0.0f), dt::kInf);
  EXPECT_EQ(dt::rsqrt(dt::kInf), 0.0f);
  EXPECT_TRUE(std::isnan(dt::rsqrt(-1.0f)));
  EXPECT_TRUE(std::isnan(dt::sqrt(-1.0f)));
  EXPECT_EQ(dt::sqrt(dt::kInf), dt::kInf);
}

TEST(CpuMath, Tanh) {
  // Within a few ulp everywhere: absolute <= 2e-7, relative <= 4e-7 (brief: 2e-6 / 1e-6).
  check("tanh", [](float x) { return dt::tanh(x); }, [](double x) { return std::tanh(x); },
        ulps(3.0));
  EXPECT_EQ(dt::tanh(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(dt::tanh(-0.0f)));
  EXPECT_EQ(dt::tanh(dt::kInf), 1.0f);
  EXPECT_EQ(dt::tanh(dt::neg_inf()), -1.0f);
  EXPECT_EQ(dt::tanh(10.0f), 1.0f);
  EXPECT_EQ(dt::tanh(-10.0f), -1.0f);
  EXPECT_EQ(dt::tanh(1e30f), 1.0f);
  EXPECT_TRUE(std::isnan(dt::tanh(dt::nan())));
  EXPECT_EQ(dt::tanh(1e-30f), 1e-30f);
}

TEST(CpuMath, Sigmoid) {
  // Relative accuracy is kept for x << 0 too (e^x / (1 + e^x)), down to subnormal results.
  check("sigmoid", [](float x) { return dt::sigmoid(x); }, sigmoid_ref, ulps(4.0));
  EXPECT_EQ(dt::sigmoid(dt::neg_inf()), 0.0f);
  EXPECT_EQ(dt::sigmoid(dt::kInf), 1.0f);
  EXPECT_EQ(dt::sigmoid(0.0f), 0.5f);
  EXPECT_EQ(dt::sigmoid(-0.0f), 0.5f);
  EXPECT_EQ(dt::sigmoid(20.0f), 1.0f);
  EXPECT_EQ(dt::sigmoid(-1e30f), 0.0f);
  EXPECT_GT(dt::sigmoid(-100.0f), 0.0f);  // 3.7e-44, a subnormal
  EXPECT_TRUE(std::isnan(dt::sigmoid(dt::nan())));
}

// x * sigmoid(x): a few ulp; results below 1e-35 in magnitude may be flushed to 0.
const auto silu_ref = at_neg_inf_zero([](double x) { return x * sigmoid_ref(x); });
double silu_tolerance(double, double r) { return 4.0 * ulp_at(r) + flushable(r); }
// x * sigmoid(v), v = 2 sqrt(2/pi) (x + 0.044715 x^3), has condition number about |x v'(x)| for
// x << 0, so a few ulp times (1 + |v|) is as good as float inputs allow.
double gelu_tanh_tolerance(double x, double r) {
  double v = 2.0 * std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x);
  return 4.0 * (1.0 + std::fabs(v)) * ulp_at(r) + flushable(r);
}

TEST(CpuMath, Silu) {
  check(
      "silu", [](float x) { return dt::silu(x); }, silu_ref, silu_tolerance);
  EXPECT_EQ(dt::silu(0.0f), 0.0f);
  EXPECT_EQ(dt::silu(dt::kInf), dt::kInf);
  EXPECT_EQ(dt::silu(dt::neg_inf()), 0.0f);  // the limit (-0), not inf * 0 = NaN
  EXPECT_EQ(dt::silu(-1e30f), 0.0f);
  EXPECT_EQ(dt::silu(100.0f), 100.0f);
  EXPECT_TRUE(std::isnan(dt::silu(dt::nan())));
}

TEST(CpuMath, Erf) {
  check("erf", [](float x) { return dt::erf(x); }, [](double x) { return std::erf(x); }, ulps(4.0));
  EXPECT_EQ(dt::erf(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(dt::erf(-0.0f)));
  EXPECT_EQ(dt::erf(dt::kInf), 1.0f);
  EXPECT_EQ(dt::erf(dt::neg_inf()), -1.0f);
  EXPECT_EQ(dt::erf(4.0f), 1.0f);
  EXPECT_EQ(dt::erf(-4.0f), -1.0f);
  EXPECT_TRUE(std::isnan(dt::erf(dt::nan())));
}

TEST(CpuMath, GeluErf) {
  // Relative accuracy (erfc form) into the negative tail, down to the flush below 1e-35.
  check("gelu_erf", [](float x) { return dt::gelu_erf(x); }, at_neg_inf_zero(gelu_erf_ref),
        [](double, double r) { return 1e-6 * std::fabs(r) + flushable(r); });
  EXPECT_EQ(dt::gelu_erf(0.0f), 0.0f);
  EXPECT_EQ(dt::gelu_erf(10.0f), 10.0f);
  EXPECT_EQ(dt::gelu_erf(dt::kInf), dt::kInf);
  EXPECT_EQ(dt::gelu_erf(dt::neg_inf()), 0.0f);  // the limit (-0)
  EXPECT_EQ(dt::gelu_erf(-20.0f), 0.0f);
  EXPECT_TRUE(std::isnan(dt::gelu_erf(dt::nan())));
  EXPECT_NEAR(dt::gelu_erf(1.0f), 0.841344746068542948, 1e-7);
  EXPECT_NEAR(dt::gelu_erf(-1.0f), -0.158655253931457052, 1e-7);
}

TEST(CpuMath, GeluTanh) {
  // Absolute error <= 1e-6 against PyTorch's formula on [-20, 20].
  for (int i = -20 * 4096; i <= 20 * 4096; ++i) {
    float x = float(i) / 4096.0f;
    ASSERT_NEAR(dt::gelu_tanh(x), gelu_tanh_ref(x), 1e-6) << x;
  }
  // Relative, to the tolerance above.
  check(
      "gelu_tanh", [](float x) { return dt::gelu_tanh(x); }, at_neg_inf_zero(gelu_tanh_ref_tail),
      gelu_tanh_tolerance);
  EXPECT_EQ(dt::gelu_tanh(0.0f), 0.0f);
  EXPECT_EQ(dt::gelu_tanh(10.0f), 10.0f);
  EXPECT_EQ(dt::gelu_tanh(dt::kInf), dt::kInf);
  EXPECT_EQ(dt::gelu_tanh(dt::neg_inf()), 0.0f);  // the limit (-0)
  EXPECT_EQ(dt::gelu_tanh(-20.0f), 0.0f);
  EXPECT_TRUE(std::isnan(dt::gelu_tanh(dt::nan())));
}

TEST(CpuMath, AbsMaxMin) {
  EXPECT_EQ(dt::abs(-2.5f), 2.5f);
  EXPECT_FALSE(std::signbit(dt::abs(-0.0f)));
  EXPECT_EQ(dt::abs(dt::neg_inf()), dt::kInf);
  EXPECT_TRUE(std::isnan(dt::abs(dt::nan())));
  const float vals[] = {-dt::kInf, -3.0f, -0.0f, 0.0f, 1.5f, dt::kInf, dt::nan()};
  for (float a : vals)
    for (float b : vals) {
      float mx = dt::maximum(a, b), mn = dt::minimum(a, b);
      if (std::isnan(a) || std::isnan(b)) {  // PyTorch: NaN propagates from either side
        EXPECT_TRUE(std::isnan(mx)) << a << " " << b;
        EXPECT_TRUE(std::isnan(mn)) << a << " " << b;
      } else {
        EXPECT_EQ(mx, std::fmax(a, b)) << a << " " << b;
        EXPECT_EQ(mn, std::fmin(a, b)) << a << " " << b;
      }
    }
  static_assert(dt::kInf > FLT_MAX && dt::neg_inf() < -FLT_MAX);
}

// ---- conversions ----

namespace {

// Round-to-nearest-even of a finite float to a grid: straightforward, in double.
// bf16: 8 significant bits, normal exponents as float.
uint16_t bf16_ref(float f) {
  uint32_t u = u_of(f);
  if (std::isnan(f)) return 0x7fc0;  // only NaN-ness is compared
  uint32_t lo = u >> 16, hi = lo + 1;  // truncation and the next value away from zero
  double dlo = f_of(lo << 16);
  double dhi = (lo & 0x7fff) == 0x7f7f ? std::copysign(std::ldexp(1.0, 128), f)  // past FLT_MAX
                                       : double(f_of(hi << 16));
  double d = f;
  double elo = std::fabs(d - dlo), ehi = std::fabs(d - dhi);
  if (elo < ehi) return uint16_t(lo);
  if (ehi < elo) return uint16_t(hi);
  return uint16_t((lo & 1) ? hi : lo);
}

double f16_value(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1f) return m ? NAN : s * INFINITY;
  if (e == 0) return s * std::ldexp(double(m), -24);
  return s * std::ldexp(1.0 + m / 1024.0, e - 15);
}

uint16_t f16_ref(float f) {
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::fabs(double(f));
  if (std::isnan(f)) return 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;  // 65520 is the tie between 65504 and 2^16
  if (a == 0) return sign;
  int e;
  std::frexp(a, &e);
  e -= 1;                    // a = m 2^e, m in [1, 2)
  if (e < -14) e = -14;      // the subnormal grid continues the lowest binade's spacing
  double q = std::ldexp(a, 10 - e);  // value in units of the half ulp at this binade
  double r = std::nearbyint(q);      // ties to even (default rounding mode)
  return uint16_t(sign | (((e + 15) << 10) + int(r) - 1024));
}

}  // namespace

TEST(CpuMath, Bf16) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = dt::bf16_to_f32(uint16_t(h));
    ASSERT_EQ(u_of(f), h << 16);
    uint16_t back = dt::f32_to_bf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(dt::bf16_to_f32(back))) << h;
      ASSERT_EQ(back & 0x8000u, h & 0x8000u);
    } else {
      ASSERT_EQ(back, h) << h;
    }
    // Ties: the midpoint to the next bf16 up in magnitude rounds to even; one bit either side
    // rounds to the nearer one.
    if ((h & 0x7fff) < 0x7f80) {
      uint32_t mid = (h << 16) | 0x8000u;
      ASSERT_EQ(dt::f32_to_bf16(f_of(mid)), bf16_ref(f_of(mid))) << h;
      ASSERT_EQ(dt::f32_to_bf16(f_of(mid - 1)), bf16_ref(f_of(mid - 1))) << h;
      ASSERT_EQ(dt::f32_to_bf16(f_of(mid + 1)), bf16_ref(f_of(mid + 1))) << h;
    }
  }
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 997) {
    float f = f_of(uint32_t(b));
    uint16_t got = dt::f32_to_bf16(f);
    if (std::isnan(f))
      ASSERT_TRUE(std::isnan(dt::bf16_to_f32(got))) << b;
    else
      ASSERT_EQ(got, bf16_ref(f)) << b;
  }
  EXPECT_EQ(dt::f32_to_bf16(FLT_MAX), 0x7f80);  // rounds to inf
  EXPECT_EQ(dt::f32_to_bf16(dt::neg_inf()), 0xff80);
  EXPECT_EQ(dt::f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(dt::f32_to_bf16(f_of(0x7f800001u)) & 0x7fc0, 0x7fc0);  // signalling NaN -> quiet NaN
}

TEST(CpuMath, F16) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = dt::f16_to_f32(uint16_t(h));
    double want = f16_value(uint16_t(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << h;
      uint16_t back = dt::f32_to_f16(f);
      ASSERT_TRUE((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0) << h;  // still NaN
      ASSERT_EQ(back & 0x8000u, h & 0x8000u);
      continue;
    }
    ASSERT_EQ(double(f), want) << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
    ASSERT_EQ(dt::f32_to_f16(f), h) << h;  // round trip
    // Ties between this half and the next one up in magnitude, and one float ulp either side.
    if ((h & 0x7fff) < 0x7c00) {
      double next = (h & 0x7fff) == 0x7bff ? 65536.0 : std::fabs(f16_value(uint16_t(h + 1)));
      float mid = float((std::fabs(want) + next) / 2);
      if (h & 0x8000) mid = -mid;
      for (float m : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 2 * mid)})
        ASSERT_EQ(dt::f32_to_f16(m), f16_ref(m)) << h << " " << m;
    }
  }
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 997) {
    float f = f_of(uint32_t(b));
    uint16_t got = dt::f32_to_f16(f);
    if (std::isnan(f))
      ASSERT_TRUE((got & 0x7c00) == 0x7c00 && (got & 0x3ff) != 0) << b;
    else
      ASSERT_EQ(got, f16_ref(f)) << b << " " << f;
  }
  EXPECT_EQ(dt::f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(dt::f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(dt::f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(dt::f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(dt::f32_to_f16(dt::neg_inf()), 0xfc00);
  EXPECT_EQ(dt::f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(dt::f32_to_f16(0x1p-25f), 0x0000);  // tie to even: 0
  EXPECT_EQ(dt::f32_to_f16(0x1.8p-24f), 0x0002);  // tie to even: 2
  EXPECT_EQ(dt::f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(dt::f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(dt::f16_to_f32(0x0001), 0x1p-24f);
}

// The conversions in a vectorisable loop (as kernels use them) agree with the scalar calls.
TEST(CpuMath, ConversionsVectorised) {
  std::vector<uint16_t> h(0x10000), b(0x10000), h2(0x10000), b2(0x10000);
  std::vector<float> fh(0x10000), fb(0x10000);
  for (uint32_t i = 0; i < 0x10000; ++i) h[i] = b[i] = uint16_t(i);
#pragma omp simd
  for (int i = 0; i < 0x10000; ++i) {
    fh[i] = dt::f16_to_f32(h[i]);
    fb[i] = dt::bf16_to_f32(b[i]);
  }
#pragma omp simd
  for (int i = 0; i < 0x10000; ++i) {
    h2[i] = dt::f32_to_f16(fh[i]);
    b2[i] = dt::f32_to_bf16(fb[i]);
  }
  for (uint32_t i = 0; i < 0x10000; ++i) {
    if (std::isnan(fh[i])) {
      ASSERT_TRUE(std::isnan(dt::f16_to_f32(h2[i]))) << i;
    } else {
      ASSERT_EQ(h2[i], i) << i;
    }
    if (std::isnan(fb[i])) {
      ASSERT_TRUE(std::isnan(dt::bf16_to_f32(b2[i]))) << i;
    } else {
      ASSERT_EQ(b2[i], i) << i;
    }
  }
}

// stream_store writes exactly [dst, dst + n), whatever the alignment of either end and however
// short: every start offset within a line, lengths around one and two lines, and 0.
TEST(CpuMath, StreamStoreWritesExactlyItsRange) {
  std::vector<float> src(300);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i) + 0.5f;
  alignas(64) static float dst[400];
  for (int start = 0; start < 16; ++start)
    for (int n : {0, 1, 15, 16, 17, 31, 32, 33, 47, 100, 257}) {
      for (float& d : dst) d = -1.0f;
      dt::stream_store(dst + start, src.data() + 3, n);  // a source that is not aligned either
      dt::stream_fence();
      for (int i = 0; i < 400; ++i) {
        float want = i >= start && i < start + n ? src[size_t(i - start + 3)] : -1.0f;
        ASSERT_EQ(dst[i], want) << "start " << start << " n " << n << " at " << i;
      }
    }
  // 2-byte elements (bf16 outputs): lines split at odd element counts.
  std::vector<uint16_t> s16(200), d16(260, 0xffff);
  for (size_t i = 0; i < s16.size(); ++i) s16[i] = uint16_t(i + 1);
  dt::stream_store(d16.data() + 5, s16.data(), 199);
  dt::stream_fence();
  for (int i = 0; i < 260; ++i) ASSERT_EQ(d16[size_t(i)], i >= 5 && i < 204 ? uint16_t(i - 4) : 0xffff) << i;
}

// dt::cumsum_f32_in_double (the cpu target's f32 cumsum along a row, compiled here without
// AVX-512: its 4-lane form; the kernels' tests run the 8-lane one) against a sequential sum
// in double, forward and reversed, at every length around its vector widths (the tail added
// one by one) and at long rows. Its tree-then-carry order of double additions may differ from
// the sequential one by n * 2^-52 times the row's absolute sum, so each result is the
// sequential double sum rounded once to f32 within that: half an f32 ulp plus the difference
// (an f32 accumulation is many ulps off at these lengths). NaN and inf propagate.
TEST(CpuMath, CumsumInDouble) {
  uint32_t state = 12345;
  auto next = [&] {  // values in [-2, 2): a fixed LCG, no <random> in this file
    state = state * 1664525u + 1013904223u;
    return float(state >> 8) * 0x1p-22f - 2.0f;
  };
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 70; ++n) lengths.push_back(n);
  for (int64_t n : {255, 256, 257, 2560, 5001}) lengths.push_back(n);
  for (int64_t n : lengths)
    for (bool reverse : {false, true}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = next();
      std::vector<float> got = x;  // in place at odd lengths, else into another array
      if (n % 2) dt::cumsum_f32_in_double(got.data(), got.data(), n, reverse);
      else dt::cumsum_f32_in_double(x.data(), got.data(), n, reverse);
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < n; ++k) {
        size_t j = size_t(reverse ? n - 1 - k : k);
        acc += double(x[j]);
        mag += std::fabs(double(x[j]));
        double slack = double(n) * 0x1p-52 * mag;
        ASSERT_LE(std::fabs(double(got[j]) - acc), 0.5 * ulp_at(std::fabs(acc) + slack) + slack)
            << "n " << n << (reverse ? " reversed" : "") << ", element " << j;
      }
    }
  std::vector<float> special(40, 1.0f);
  special[5] = NAN;
  special[30] = INFINITY;
  dt::cumsum_f32_in_double(special.data(), special.data(), 40, false);
  for (size_t j = 0; j < 40; ++j)
    EXPECT_TRUE(j < 5 ? special[j] == float(j + 1) : std::isnan(special[j])) << j;
  std::vector<float> inf(40, 1.0f);
  inf[30] = INFINITY;
  dt::cumsum_f32_in_double(inf.data(), inf.data(), 40, true);
  for (size_t j = 0; j < 40; ++j) EXPECT_EQ(inf[j], j <= 30 ? INFINITY : float(40 - j)) << j;
}

// The same functions as this file's build compiles them (the project's default flags: no AVX2,
// so the chunk exponentials are the lane functions).
#define DT_TEST_ISA testing_default
#include "cpu_isa.inc"
#undef DT_TEST_ISA

namespace deuteron::testing_avx2 {  // tests/test_cpu_isa_avx2.cpp, compiled with -mavx2
void cumsum_rows(const float* in, int64_t in_rs, float* out, int64_t out_rs, int64_t rows, int64_t n,
                 bool reverse, bool stream);
void exp_chunks(const float* x, float* y, int64_t n, bool base2);
void activation_chunks(const float* x, float* y, int64_t n, bool gelu_tanh);
}  // namespace deuteron::testing_avx2
namespace deuteron::testing_avx512 {  // tests/test_cpu_isa_avx512.cpp, compiled with -mavx512f
void cumsum_rows(const float* in, int64_t in_rs, float* out, int64_t out_rs, int64_t rows, int64_t n,
                 bool reverse, bool stream);
void exp_chunks(const float* x, float* y, int64_t n, bool base2);
void activation_chunks(const float* x, float* y, int64_t n, bool gelu_tanh);
}  // namespace deuteron::testing_avx512

namespace {
bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
}
}  // namespace

// dt::cumsum_rows_f32_in_double, as kernels compile it (AVX2 and AVX-512), against a sequential
// sum in double per row: rows in whole groups of 8 (transposed tiles) give exactly that sum
// rounded once; the rows after them (the row-at-a-time scan) are within CumsumInDouble's bound.
// Row counts around 8, lengths around the tiles (8) and lines (16), both directions, plain and
// streaming stores, row strides that are and are not whole lines, outputs starting off a line
// (the columns before the first whole line), in place. The floats between rows stay untouched.
TEST(CpuMath, CumsumRowsInDouble) {
  using Fn = void (*)(const float*, int64_t, float*, int64_t, int64_t, int64_t, bool, bool);
  std::vector<std::pair<const char*, Fn>> isas;
  if (has_avx2()) isas.push_back({"avx2", deuteron::testing_avx2::cumsum_rows});
  if (has_avx512()) isas.push_back({"avx512", deuteron::testing_avx512::cumsum_rows});
  if (isas.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  uint32_t state = 777;
  auto next = [&] {  // values in [-2, 2)
    state = state * 1664525u + 1013904223u;
    return float(state >> 8) * 0x1p-22f - 2.0f;
  };
  const float kGuard = -12345.0f;
  int checked = 0;
  for (auto [isa, cumsum_rows] : isas)
    for (int64_t rows : {1, 7, 8, 9, 16, 17})
      for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 257})
        for (int64_t pad :
             {int64_t(0), int64_t(3), 16 - n % 16})  // row stride n + pad: 16 - n % 16 makes whole lines
          for (int64_t shift : {0, 1, 5})            // the output's first float, past a 64-byte boundary
            for (bool reverse : {false, true})
              for (bool stream : {false, true})
                for (bool in_place : {false, true}) {
                  const int64_t rs = n + pad;
                  std::vector<float> x(size_t(rows * rs));
                  for (float& v : x) v = next();
                  // 64-byte aligned storage for the output, which starts `shift` floats in
                  std::vector<float> buf(size_t(rows * rs + shift + 32), kGuard);
                  float* out = buf.data() + 16 +
                               (16 - reinterpret_cast<uintptr_t>(buf.data() + 16) % 64 / 4) % 16 + shift;
                  if (in_place) std::copy(x.begin(), x.end(), out);
                  cumsum_rows(in_place ? out : x.data(), rs, out, rs, rows, n, reverse, stream);
                  for (int64_t r = 0; r < rows; ++r) {
                    double acc = 0, mag = 0;
                    const bool tiled = n >= 8 && r < rows / 8 * 8;
                    for (int64_t k = 0; k < n; ++k) {
                      const int64_t j = reverse ? n - 1 - k : k;
                      acc += double(x[size_t(r * rs + j)]);
                      mag += std::fabs(double(x[size_t(r * rs + j)]));
                      const float got = out[r * rs + j];
                      const double slack = double(n) * 0x1p-52 * mag;
                      if (tiled)
                        ASSERT_EQ(got, float(acc))
                            << isa << " rows " << rows << " n " << n << " stride " << rs << " shift " << shift
                            << (reverse ? " reversed" : "") << (stream ? " streamed" : "")
                            << (in_place ? " in place" : "") << ": row " << r << ", element " << j;
                      else
                        ASSERT_LE(std::fabs(double(got) - acc), 0.5 * ulp_at(std::fabs(acc) + slack) + slack)
                            << isa << " rows " << rows << " n " << n << ": row " << r << ", element " << j;
                    }
                    for (int64_t j = n; j < rs && !in_place; ++j)
                      ASSERT_EQ(out[r * rs + j], kGuard) << isa << " row " << r;
                  }
                  ASSERT_EQ(out[-1], kGuard) << isa;
                  ++checked;
                }
  EXPECT_EQ(checked, int(isas.size()) * 6 * 11 * 3 * 3 * 2 * 2 * 2);
}

// The chunk exponentials (dt::exp_nonpositive_chunk, exp2_nonpositive_chunk), as kernels compile
// them with AVX2 (an 8-entry table) and AVX-512 (16 entries), against exp in double over every
// input's -|x|: within 1.1 ulp with 16 entries and 1.5 with 8, 0 exactly below the lane
// functions' flush thresholds (-86 and -124) and normal above them, NaN for NaN. Built without
// AVX2 (this file), the chunk functions are the lane functions.
TEST(CpuMath, ExpNonPositiveChunks) {
  using Fn = void (*)(const float*, float*, int64_t, bool);
  struct Isa {
    const char* name;
    Fn exp_chunks;
    double ulps;
  };
  std::vector<Isa> isas;
  if (has_avx2()) isas.push_back({"avx2", deuteron::testing_avx2::exp_chunks, 1.5});
  if (has_avx512()) isas.push_back({"avx512", deuteron::testing_avx512::exp_chunks, 1.1});
  std::vector<float> a;
  for (float x : inputs()) a.push_back(-std::fabs(x));
  for (float s : {-86.0f, -86.5f, -85.9f, -124.0f, -124.5f, -123.9f, -0.0f}) a.push_back(s);
  a.push_back(dt::nan());
  std::vector<float> y(a.size());
  // Not a whole number of chunks (32 floats with AVX2, 64 with AVX-512): the last one is padded.
  if (a.size() % 32 == 0) a.push_back(-1.0f);
  const int64_t n = int64_t(a.size());
  for (const Isa& isa : isas)
    for (bool base2 : {false, true}) {
      isa.exp_chunks(a.data(), y.data(), n, base2);
      const char* what = base2 ? "exp2" : "exp";
      const float flush_below = base2 ? -124.0f : -86.0f;
      double worst = 0;
      int failures = 0;
      for (int64_t i = 0; i < n && failures < 10; ++i) {
        const float x = a[size_t(i)], got = y[size_t(i)];
        if (std::isnan(x)) {
          failures += !std::isnan(got);
          EXPECT_TRUE(std::isnan(got)) << isa.name << " " << what << "(NaN)";
        } else if (x < flush_below) {
          failures += got != 0.0f;
          EXPECT_EQ(got, 0.0f) << isa.name << " " << what << "(" << x << ")";
        } else {
          const double r = base2 ? std::exp2(double(x)) : std::exp(double(x));
          const double err = std::fabs(double(got) - r) / ulp_at(r);
          worst = std::max(worst, err);
          failures += !(err <= isa.ulps && got >= FLT_MIN);
          EXPECT_TRUE(err <= isa.ulps && got >= FLT_MIN)
              << isa.name << " " << what << "(" << x << ") = " << got << ", " << err << " ulp from " << r;
        }
      }
      std::printf("[   INFO   ] %s %s chunks: worst %.3f ulp\n", isa.name, what, worst);
    }
    // This file's build: without AVX2 (the project's default flags) the chunk functions are the
    // lane functions, bit for bit; built with AVX2 they are the vector code checked above.
#if !defined(__AVX2__)
  alignas(64) float chunk[dt::kReduceChunk];
  for (size_t c = 0; c + dt::kReduceChunk <= a.size(); c += 4099)
    for (bool base2 : {false, true}) {
      std::copy(a.begin() + long(c), a.begin() + long(c + dt::kReduceChunk), chunk);
      base2 ? dt::exp2_nonpositive_chunk(chunk) : dt::exp_nonpositive_chunk(chunk);
      for (int64_t j = 0; j < dt::kReduceChunk; ++j) {
        const float x = a[c + size_t(j)];
        const float lane = base2 ? dt::exp2_nonpositive(x) : dt::exp_nonpositive(x);
        ASSERT_TRUE(u_of(chunk[j]) == u_of(lane) || (std::isnan(lane) && std::isnan(chunk[j]))) << x;
      }
    }
#endif
}

// silu and gelu_tanh as generated loops compute them a chunk at a time: their exponentials by
// the chunk functions (AVX2, AVX-512 where the CPU has them; the lane functions in the default
// build), then dt::x_sigmoid_from. The lane functions' tolerances hold over every input.
TEST(CpuMath, ActivationChunks) {
  using Fn = void (*)(const float*, float*, int64_t, bool);
  std::vector<std::pair<std::string, Fn>> isas = {{"default", deuteron::testing_default::activation_chunks}};
  if (has_avx2()) isas.push_back({"avx2", deuteron::testing_avx2::activation_chunks});
  if (has_avx512()) isas.push_back({"avx512", deuteron::testing_avx512::activation_chunks});
  const std::vector<float>& xs = inputs();
  std::vector<float> ys(xs.size());
  for (const auto& [isa, fn] : isas) {
    fn(xs.data(), ys.data(), int64_t(xs.size()), false);
    check_values(("silu " + isa).c_str(), ys, silu_ref, silu_tolerance);
    EXPECT_EQ(u_of(ys[size_t(std::find(xs.begin(), xs.end(), dt::neg_inf()) - xs.begin())]), u_of(-0.0f))
        << isa;
    fn(xs.data(), ys.data(), int64_t(xs.size()), true);
    check_values(("gelu_tanh " + isa).c_str(), ys, at_neg_inf_zero(gelu_tanh_ref_tail), gelu_tanh_tolerance);
  }
}
