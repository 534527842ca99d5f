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
// dtype (PyTorch's rules): kept, made floating (integers become f32), made boolean, or int32.
// Integer and IntegerOrBool operands are kept too, and the tracer rejects any other operand
// dtype at the user's line (a shift of a float).
enum class DTypeRule { Promoted, Floating, Boolean, Int32, Integer, IntegerOrBool };
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
  X(Erf, "erf", Floating, Floating)                             \
  X(Sin, "sin", Floating, Floating)                             \
  X(Cos, "cos", Floating, Floating)                             \
  X(Log1p, "log1p", Floating, Floating)                         \
  X(Expm1, "expm1", Floating, Floating)                         \
  X(Floor, "floor", Floating, Floating)                         \
  X(Ceil, "ceil", Floating, Floating)                           \
  X(Round, "round", Floating, Floating) /* half to even */      \
  /* hl::bitcast between the 32-bit types (hl::bitcast checks the operand's dtype) */ \
  X(BitcastI32, "bitcast_i32", Promoted, Int32)                 \
  X(BitcastF32, "bitcast_f32", Promoted, Floating)

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
  X(Or, "logical_or", Boolean, Boolean)                         \
  X(Pow, "pow", Floating, Floating)                             \
  X(BitAnd, "bitwise_and", IntegerOrBool, Promoted)             \
  X(BitOr, "bitwise_or", IntegerOrBool, Promoted)               \
  X(BitXor, "bitwise_xor", IntegerOrBool, Promoted)             \
  /* counts outside [0, bits) give 0 (<<) and the sign (>>), as torch */ \
  X(Shl, "left_shift", Integer, Promoted)                       \
  X(Shr, "right_shift", Integer, Promoted) /* arithmetic */     \
  /* the divisor's sign, as torch.remainder; x % 0 = x */       \
  X(Mod, "remainder", Integer, Promoted)                        \
  X(FloorDiv, "floor_divide", Integer, Promoted) /* x // 0 = 0 */ \
  /* Philox4x32-10 keyed by (seed, offset): uniform [0, 1), normal, raw int32 bits */ \
  X(Rand, "rand", Integer, Floating)                            \
  X(Randn, "randn", Integer, Floating)                          \
  X(RandInt, "randint", Integer, Int32)

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
// The rules on the operands' dtype: a function whose operands must be integers (or booleans).
DTypeRule operand_rule(UnaryFn f);
DTypeRule operand_rule(BinaryFn f);
// Whether `promoted` may be the operands' dtype of a function with this operand rule.
bool accepts(DTypeRule operands, DType promoted);

}  // namespace deuteron::ir
