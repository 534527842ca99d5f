// The elementwise and reduction functions of the IR, declared once: each with its name (as the
// IR prints it and the tile language spells it) and its dtype rules. Adding one here makes
// every target's covered switch over it fail to compile (-Werror=switch) until the target
// spells it, and the op test (tests/test_ops.cpp) runs it on every target.
#pragma once

#include <array>
#include <cstddef>

#include "deuteron/dtype.h"

namespace deuteron::ir {

// How a function's operands are computed and what its result is, from the operands' promoted
// dtype (PyTorch's rules): kept, made floating (integers become f32), or made boolean.
enum class DTypeRule { Promoted, Floating, Boolean };
DType apply(DTypeRule rule, DType promoted);

//  X(enumerator, name, operand rule, result rule)
#define DEUTERON_UNARY_FNS(X)                                   \
  X(Neg, "neg", Promoted, Promoted)                             \
  X(Exp, "exp", Floating, Floating)                             \
  X(Exp2, "exp2", Floating, Floating)                           \
  X(Log, "log", Floating, Floating)                             \
  X(Sqrt, "sqrt", Floating, Floating)                           \
  X(Rsqrt, "rsqrt", Floating, Floating)                         \
  X(Tanh, "tanh", Floating, Floating)                           \
  X(Sigmoid, "sigmoid", Floating, Floating)                     \
  X(Silu, "silu", Floating, Floating)                           \
  X(GeluTanh, "gelu_tanh", Floating, Floating)                  \
  X(GeluErf, "gelu", Floating, Floating)                        \
  X(Abs, "abs", Promoted, Promoted)                             \
  X(Not, "logical_not", Boolean, Boolean)                       \
  X(Erf, "erf", Floating, Floating)

#define DEUTERON_BINARY_FNS(X)                                  \
  X(Add, "add", Promoted, Promoted)                             \
  X(Sub, "sub", Promoted, Promoted)                             \
  X(Mul, "mul", Promoted, Promoted)                             \
  X(Div, "div", Floating, Floating) /* true division */         \
  X(Max, "maximum", Promoted, Promoted)                         \
  X(Min, "minimum", Promoted, Promoted)                         \
  X(Eq, "eq", Promoted, Boolean)                                \
  X(Ne, "ne", Promoted, Boolean)                                \
  X(Lt, "lt", Promoted, Boolean)                                \
  X(Le, "le", Promoted, Boolean)                                \
  X(Gt, "gt", Promoted, Boolean)                                \
  X(Ge, "ge", Promoted, Boolean)                                \
  X(And, "logical_and", Boolean, Boolean)                       \
  X(Or, "logical_or", Boolean, Boolean)

// Reductions keep their input's dtype, except that an integer sum is int64 (as in PyTorch).
#define DEUTERON_REDUCE_FNS(X) \
  X(Sum, "sum")                \
  X(Max, "amax")               \
  X(Min, "amin")

#define DEUTERON_ENUMERATOR(e, ...) e,
enum class UnaryFn { DEUTERON_UNARY_FNS(DEUTERON_ENUMERATOR) };
enum class BinaryFn { DEUTERON_BINARY_FNS(DEUTERON_ENUMERATOR) };
enum class ReduceFn { DEUTERON_REDUCE_FNS(DEUTERON_ENUMERATOR) };
#undef DEUTERON_ENUMERATOR

#define DEUTERON_ENUMERATOR(e, ...) UnaryFn::e,
inline constexpr std::array kUnaryFns = {DEUTERON_UNARY_FNS(DEUTERON_ENUMERATOR)};
#undef DEUTERON_ENUMERATOR
#define DEUTERON_ENUMERATOR(e, ...) BinaryFn::e,
inline constexpr std::array kBinaryFns = {DEUTERON_BINARY_FNS(DEUTERON_ENUMERATOR)};
#undef DEUTERON_ENUMERATOR
#define DEUTERON_ENUMERATOR(e, ...) ReduceFn::e,
inline constexpr std::array kReduceFns = {DEUTERON_REDUCE_FNS(DEUTERON_ENUMERATOR)};
#undef DEUTERON_ENUMERATOR

const char* name(UnaryFn f);
const char* name(BinaryFn f);
const char* name(ReduceFn f);

// The dtype the function computes in, and the dtype of its result, given the operands'
// promoted dtype.
DType operand_dtype(UnaryFn f, DType promoted);
DType result_dtype(UnaryFn f, DType promoted);
DType operand_dtype(BinaryFn f, DType promoted);
DType result_dtype(BinaryFn f, DType promoted);
DType result_dtype(ReduceFn f, DType input);
bool is_comparison(BinaryFn f);

}  // namespace deuteron::ir
