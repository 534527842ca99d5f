// Every function of the op table (ir/ops.h) on every target (cpu, and pallas under TPU
// interpret mode) against a double-precision reference written here. The switches below have
// no default: an op added to the table without a spelling here does not compile.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "deuteron/deuteron.h"
#include "api/api.h"
#include "ir/ops.h"
#include "philox_reference.h"

namespace deuteron {
namespace {

namespace hl = deuteron::hl;
using ir::BinaryFn;
using ir::ReduceFn;
using ir::UnaryFn;

constexpr int64_t kRows = 5, kCols = 37;  // ragged against every block size

hl::Tensor apply(UnaryFn f, const hl::Tensor& x) {
  switch (f) {
    case UnaryFn::Neg: return -x;
    case UnaryFn::Exp: return hl::exp(x);
    case UnaryFn::Exp2: return hl::exp2(x);
    case UnaryFn::Log: return hl::log(x);
    case UnaryFn::Sqrt: return hl::sqrt(x);
    case UnaryFn::Rsqrt: return hl::rsqrt(x);
    case UnaryFn::Tanh: return hl::tanh(x);
    case UnaryFn::Sigmoid: return hl::sigmoid(x);
    case UnaryFn::Silu: return hl::silu(x);
    case UnaryFn::GeluTanh: return hl::gelu(x, "tanh");
    case UnaryFn::GeluErf: return hl::gelu(x);
    case UnaryFn::Abs: return hl::abs(x);
    case UnaryFn::Not: return !(x > 0.0);
    case UnaryFn::Erf: return hl::erf(x);
    case UnaryFn::Sin: return hl::sin(x);
    case UnaryFn::Cos: return hl::cos(x);
    case UnaryFn::Log1p: return hl::log1p(x);
    case UnaryFn::Expm1: return hl::expm1(x);
    case UnaryFn::Floor: return hl::floor(x);
    case UnaryFn::Ceil: return hl::ceil(x);
    case UnaryFn::Round: return hl::round(x);
    case UnaryFn::BitcastI32: return hl::bitcast(x, DType::i32);
    case UnaryFn::BitcastF32: return hl::bitcast(hl::bitcast(x, DType::i32), DType::f32);  // round trip
  }
  return x;
}

// The int32 whose bits are float x.
double bits_of(double x) {
  float f = float(x);
  int32_t i;
  std::memcpy(&i, &f, 4);
  return i;
}

double reference(UnaryFn f, double x) {
  constexpr double kSqrt2OverPi = 0.7978845608028654;
  switch (f) {
    case UnaryFn::Neg: return -x;
    case UnaryFn::Exp: return std::exp(x);
    case UnaryFn::Exp2: return std::exp2(x);
    case UnaryFn::Log: return std::log(x);
    case UnaryFn::Sqrt: return std::sqrt(x);
    case UnaryFn::Rsqrt: return 1.0 / std::sqrt(x);
    case UnaryFn::Tanh: return std::tanh(x);
    case UnaryFn::Sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case UnaryFn::Silu: return x / (1.0 + std::exp(-x));
    case UnaryFn::GeluTanh: return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
    case UnaryFn::GeluErf: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case UnaryFn::Abs: return std::abs(x);
    case UnaryFn::Not: return x > 0 ? 0.0 : 1.0;
    case UnaryFn::Erf: return std::erf(x);
    case UnaryFn::Sin: return std::sin(x);
    case UnaryFn::Cos: return std::cos(x);
    case UnaryFn::Log1p: return std::log1p(x);
    case UnaryFn::Expm1: return std::expm1(x);
    case UnaryFn::Floor: return std::floor(x);
    case UnaryFn::Ceil: return std::ceil(x);
    case UnaryFn::Round: return std::nearbyint(x);  // halves to even
    case UnaryFn::BitcastI32: return bits_of(x);
    case UnaryFn::BitcastF32: return x;
  }
  return x;
}

// Functions defined only for positive inputs take them from [0.1, 3).
bool positive_only(UnaryFn f) {
  return f == UnaryFn::Log || f == UnaryFn::Sqrt || f == UnaryFn::Rsqrt || f == UnaryFn::Log1p;
}

// Functions of integers (bitwise, shifts, division) and of (seed, offset) pairs take integer
// operands: the test passes integer-valued floats and converts them in the kernel.
bool integer_operands(BinaryFn f) { return ir::operand_rule(f) == ir::DTypeRule::Integer || ir::operand_rule(f) == ir::DTypeRule::IntegerOrBool; }
bool random(BinaryFn f) { return f == BinaryFn::Rand || f == BinaryFn::Randn || f == BinaryFn::RandInt; }

// int32 arithmetic as torch defines it, in plain int64 (independent of the targets' helpers).
int64_t wrap32(int64_t x) { return int64_t(int32_t(uint32_t(uint64_t(x)))); }
int64_t floor_div_reference(int64_t a, int64_t b) {
  if (b == 0) return 0;
  return wrap32(int64_t(std::floor(double(a) / double(b))));
}

hl::Tensor apply(BinaryFn f, const hl::Tensor& a, const hl::Tensor& b) {
  switch (f) {
    case BinaryFn::Add: return a + b;
    case BinaryFn::Sub: return a - b;
    case BinaryFn::Mul: return a * b;
    case BinaryFn::Div: return a / b;
    case BinaryFn::Max: return hl::maximum(a, b);
    case BinaryFn::Min: return hl::minimum(a, b);
    case BinaryFn::Eq: return a == b;
    case BinaryFn::Ne: return a != b;
    case BinaryFn::Lt: return a < b;
    case BinaryFn::Le: return a <= b;
    case BinaryFn::Gt: return a > b;
    case BinaryFn::Ge: return a >= b;
    case BinaryFn::And: return (a > 0.0) && (b > 0.0);
    case BinaryFn::Or: return (a > 0.0) || (b > 0.0);
    case BinaryFn::Pow: return hl::pow(a, b);
    case BinaryFn::BitAnd: return a.to(DType::i32) & b.to(DType::i32);
    case BinaryFn::BitOr: return a.to(DType::i32) | b.to(DType::i32);
    case BinaryFn::BitXor: return a.to(DType::i32) ^ b.to(DType::i32);
    case BinaryFn::Shl: return a.to(DType::i32) << b.to(DType::i32);
    case BinaryFn::Shr: return a.to(DType::i32) >> b.to(DType::i32);
    case BinaryFn::Mod: return a.to(DType::i32) % b.to(DType::i32);
    case BinaryFn::FloorDiv: return hl::floor_divide(a.to(DType::i32), b.to(DType::i32));
    case BinaryFn::Rand: return hl::rand(a.to(DType::i32), b.to(DType::i32));
    case BinaryFn::Randn: return hl::randn(a.to(DType::i32), b.to(DType::i32));
    case BinaryFn::RandInt: return hl::randint(a.to(DType::i32), b.to(DType::i32));
  }
  return a;
}

double reference(BinaryFn f, double a, double b) {
  switch (f) {
    case BinaryFn::Add: return a + b;
    case BinaryFn::Sub: return a - b;
    case BinaryFn::Mul: return a * b;
    case BinaryFn::Div: return a / b;
    case BinaryFn::Max: return std::max(a, b);
    case BinaryFn::Min: return std::min(a, b);
    case BinaryFn::Eq: return a == b;
    case BinaryFn::Ne: return a != b;
    case BinaryFn::Lt: return a < b;
    case BinaryFn::Le: return a <= b;
    case BinaryFn::Gt: return a > b;
    case BinaryFn::Ge: return a >= b;
    case BinaryFn::And: return a > 0 && b > 0;
    case BinaryFn::Or: return a > 0 || b > 0;
    case BinaryFn::Pow: return std::pow(a, b);
    case BinaryFn::BitAnd: return double(int64_t(a) & int64_t(b));
    case BinaryFn::BitOr: return double(int64_t(a) | int64_t(b));
    case BinaryFn::BitXor: return double(int64_t(a) ^ int64_t(b));
    case BinaryFn::Shl: return b < 0 || b >= 32 ? 0.0 : double(wrap32(int64_t(a) * (int64_t(1) << int64_t(b))));
    case BinaryFn::Shr: return std::floor(a / std::ldexp(1.0, b < 0 || b >= 32 ? 31 : int(b)));
    case BinaryFn::Mod: return b == 0 ? a : a - b * double(floor_div_reference(int64_t(a), int64_t(b)));
    case BinaryFn::FloorDiv: return double(floor_div_reference(int64_t(a), int64_t(b)));
    case BinaryFn::Rand: return testing_support::rand_reference(int64_t(a), int64_t(b));
    case BinaryFn::Randn: return testing_support::randn_reference(int64_t(a), int64_t(b));
    case BinaryFn::RandInt: return testing_support::randint_reference(int64_t(a), int64_t(b));
  }
  return a;
}

hl::Tensor apply(ReduceFn f, const hl::Tensor& x) {
  switch (f) {
    case ReduceFn::Sum: return x.sum(1);
    case ReduceFn::Max: return x.amax(1);
    case ReduceFn::Min: return x.amin(1);
  }
  return x;
}

double reference(ReduceFn f, const std::vector<double>& row) {
  double r = f == ReduceFn::Sum ? 0.0 : row[0];
  for (double v : row) {
    switch (f) {
      case ReduceFn::Sum: r += v; break;
      case ReduceFn::Max: r = std::max(r, v); break;
      case ReduceFn::Min: r = std::min(r, v); break;
    }
  }
  return r;
}

struct OpCase {
  std::string target, kind;  // kind: unary, binary, reduce
  int fn = 0;                // index into the table's list of that kind
  std::string label() const {
    const char* name = kind == "unary"    ? ir::name(ir::kUnaryFns[size_t(fn)])
                       : kind == "binary" ? ir::name(ir::kBinaryFns[size_t(fn)])
                                          : ir::name(ir::kReduceFns[size_t(fn)]);
    return fmt::format("{}_{}", target, name);
  }
};

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.label(); }

std::vector<OpCase> all_cases() {
  std::vector<OpCase> out;
  for (const char* target : {"cpu", "pallas"}) {  // triton: tests/test_lang_ops.cpp
    for (size_t i = 0; i < ir::kUnaryFns.size(); ++i) out.push_back({target, "unary", int(i)});
    for (size_t i = 0; i < ir::kBinaryFns.size(); ++i) out.push_back({target, "binary", int(i)});
    for (size_t i = 0; i < ir::kReduceFns.size(); ++i) out.push_back({target, "reduce", int(i)});
  }
  return out;
}

// Each op's kernel, made once per op (kernels are keyed by what they trace).
const KernelBase& unary_kernel(UnaryFn f) {
  static std::map<UnaryFn, std::unique_ptr<KernelBase>> made;
  auto& k = made[f];
  if (!k) {
    auto body = [f](hl::Tensor x) {
      auto out = hl::empty({x.size(0), x.size(1)});
      for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) out[{tm, tn}] = apply(f, x[{tm, tn}]).to(DType::f32);
      return out;
    };
    k = std::make_unique<decltype(deuteron::kernel("", body))>(
        deuteron::kernel(fmt::format("op_{}", ir::name(f)), body));
  }
  return *k;
}

const KernelBase& binary_kernel(BinaryFn f) {
  static std::map<BinaryFn, std::unique_ptr<KernelBase>> made;
  auto& k = made[f];
  if (!k) {
    auto body = [f](hl::Tensor a, hl::Tensor b) {
      auto out = hl::empty({a.size(0), a.size(1)});
      for (auto [tm, tn] : hl::tile({a.size(0), a.size(1)}))
        out[{tm, tn}] = apply(f, a[{tm, tn}], b[{tm, tn}]).to(DType::f32);
      return out;
    };
    k = std::make_unique<decltype(deuteron::kernel("", body))>(
        deuteron::kernel(fmt::format("op_{}", ir::name(f)), body));
  }
  return *k;
}

const KernelBase& reduce_kernel(ReduceFn f) {
  static std::map<ReduceFn, std::unique_ptr<KernelBase>> made;
  auto& k = made[f];
  if (!k) {
    auto body = [f](hl::Tensor x) {
      auto out = hl::empty({x.size(0)});
      for (auto tm : hl::tile(x.size(0))) out[tm] = apply(f, x[{tm, hl::all}]);
      return out;
    };
    k = std::make_unique<decltype(deuteron::kernel("", body))>(
        deuteron::kernel(fmt::format("op_{}", ir::name(f)), body));
  }
  return *k;
}

class Ops : public testing::TestWithParam<OpCase> {};

TEST_P(Ops, MatchDoubleReference) {
  const OpCase& c = GetParam();
  std::vector<double> want;
  api::RunResult r;
  if (c.kind == "unary") {
    UnaryFn f = ir::kUnaryFns[size_t(c.fn)];
    Tensor x = positive_only(f) ? Tensor::rand({kRows, kCols}, DType::f32, 1, 0.1, 3.0)
                                : Tensor::rand({kRows, kCols}, DType::f32, 1, -3.0, 3.0);
    for (int64_t i = 0; i < x.numel(); ++i) want.push_back(reference(f, x.get(i)));
    r = api::run(unary_kernel(f), {x}, c.target);
  } else if (c.kind == "binary") {
    BinaryFn f = ir::kBinaryFns[size_t(c.fn)];
    Tensor a = Tensor::rand({kRows, kCols}, DType::f32, 2, -2.0, 2.0);
    // Divisors away from zero; for comparisons, some equal pairs; powers of positive bases.
    Tensor b = f == BinaryFn::Div ? Tensor::rand({kRows, kCols}, DType::f32, 3, 0.5, 2.0)
                                  : Tensor::rand({kRows, kCols}, DType::f32, 3, -2.0, 2.0);
    if (f == BinaryFn::Pow) a = Tensor::rand({kRows, kCols}, DType::f32, 2, 0.1, 3.0);
    if (integer_operands(f)) {  // integers; divisors and shift counts from -40 to 40, zero included
      a = Tensor::rand({kRows, kCols}, DType::i32, 2, random(f) ? 0 : -100000, 100000).to(DType::f32);
      b = Tensor::rand({kRows, kCols}, DType::i32, 3, -40, 41).to(DType::f32);
      if (random(f)) b = Tensor::rand({kRows, kCols}, DType::i32, 3, -100000, 100000).to(DType::f32);
    }
    for (int64_t i = 0; i < a.numel(); i += 3) b.set(i, a.get(i));
    for (int64_t i = 0; i < a.numel(); ++i) want.push_back(reference(f, a.get(i), b.get(i)));
    r = api::run(binary_kernel(f), {a, b}, c.target);
  } else {
    ReduceFn f = ir::kReduceFns[size_t(c.fn)];
    Tensor x = Tensor::rand({kRows, kCols}, DType::f32, 4, -3.0, 3.0);
    for (int64_t i = 0; i < kRows; ++i) {
      std::vector<double> row;
      for (int64_t j = 0; j < kCols; ++j) row.push_back(x.get(i * kCols + j));
      want.push_back(reference(f, row));
    }
    r = api::run(reduce_kernel(f), {x}, c.target);
  }
  const Tensor& got = r.outputs.at(0);
  ASSERT_EQ(got.numel(), int64_t(want.size()));
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = got.get(i), w = want[size_t(i)];
    if (std::abs(g - w) > 2e-6 + 2e-5 * std::abs(w) && bad++ < 5)
      ADD_FAILURE() << c.label() << " element " << i << ": got " << g << ", want " << w;
  }
}

INSTANTIATE_TEST_SUITE_P(Table, Ops, testing::ValuesIn(all_cases()),
                         [](const testing::TestParamInfo<OpCase>& i) { return i.param.label(); });

}  // namespace
}  // namespace deuteron
