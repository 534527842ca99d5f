#include "ir/ops.h"

namespace deuteron::ir {

DType apply(DTypeRule rule, DType promoted) {
  switch (rule) {
    case DTypeRule::Promoted: return promoted;
    case DTypeRule::Floating: return is_floating(promoted) ? promoted : DType::f32;
    case DTypeRule::Boolean: return DType::boolean;
  }
  return promoted;
}

#define DEUTERON_NAME_CASE(e, n, ...) \
  case Fn::e: return n;
#define DEUTERON_OPERAND_CASE(e, n, operands, result) \
  case Fn::e: return apply(DTypeRule::operands, promoted);
#define DEUTERON_RESULT_CASE(e, n, operands, result) \
  case Fn::e: return apply(DTypeRule::result, promoted);

const char* name(UnaryFn f) {
  using Fn = UnaryFn;
  switch (f) { DEUTERON_UNARY_FNS(DEUTERON_NAME_CASE) }
  return "?";
}
const char* name(BinaryFn f) {
  using Fn = BinaryFn;
  switch (f) { DEUTERON_BINARY_FNS(DEUTERON_NAME_CASE) }
  return "?";
}
const char* name(ReduceFn f) {
  using Fn = ReduceFn;
  switch (f) { DEUTERON_REDUCE_FNS(DEUTERON_NAME_CASE) }
  return "?";
}

DType operand_dtype(UnaryFn f, DType promoted) {
  using Fn = UnaryFn;
  switch (f) { DEUTERON_UNARY_FNS(DEUTERON_OPERAND_CASE) }
  return promoted;
}
DType result_dtype(UnaryFn f, DType promoted) {
  using Fn = UnaryFn;
  switch (f) { DEUTERON_UNARY_FNS(DEUTERON_RESULT_CASE) }
  return promoted;
}
DType operand_dtype(BinaryFn f, DType promoted) {
  using Fn = BinaryFn;
  switch (f) { DEUTERON_BINARY_FNS(DEUTERON_OPERAND_CASE) }
  return promoted;
}
DType result_dtype(BinaryFn f, DType promoted) {
  using Fn = BinaryFn;
  switch (f) { DEUTERON_BINARY_FNS(DEUTERON_RESULT_CASE) }
  return promoted;
}

#undef DEUTERON_NAME_CASE
#undef DEUTERON_OPERAND_CASE
#undef DEUTERON_RESULT_CASE

DType result_dtype(ReduceFn f, DType input) {
  return f == ReduceFn::Sum && !is_floating(input) ? DType::i64 : input;
}

bool is_comparison(BinaryFn f) {
  return result_dtype(f, DType::f32) == DType::boolean && operand_dtype(f, DType::f32) != DType::boolean;
}

}  // namespace deuteron::ir
