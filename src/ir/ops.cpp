#include "ir/ops.h"

namespace deuteron::ir {

DType apply(DTypeRule rule, DType promoted) {
  switch (rule) {
    case DTypeRule::Promoted: return promoted;
    case DTypeRule::Floating: return is_floating(promoted) ? promoted : DType::f32;
    case DTypeRule::Boolean: return DType::boolean;
    case DTypeRule::Int32: return DType::i32;
    case DTypeRule::Integer:
    case DTypeRule::IntegerOrBool: return promoted;
  }
  return promoted;
}

namespace {

// One row per function, in enumerator order: its name and dtype rules.
struct FnInfo {
  const char* name;
  DTypeRule operands, result;
};
#define DEUTERON_INFO(e, n, operands, result) FnInfo{n, DTypeRule::operands, DTypeRule::result},
constexpr FnInfo kUnaryInfo[] = {DEUTERON_UNARY_FNS(DEUTERON_INFO)};
constexpr FnInfo kBinaryInfo[] = {DEUTERON_BINARY_FNS(DEUTERON_INFO)};
#undef DEUTERON_INFO
#define DEUTERON_NAME(e, n) n,
constexpr const char* kReduceNames[] = {DEUTERON_REDUCE_FNS(DEUTERON_NAME)};
#undef DEUTERON_NAME

const FnInfo& info(UnaryFn f) { return kUnaryInfo[size_t(f)]; }
const FnInfo& info(BinaryFn f) { return kBinaryInfo[size_t(f)]; }

}  // namespace

const char* name(UnaryFn f) { return info(f).name; }
const char* name(BinaryFn f) { return info(f).name; }
const char* name(ReduceFn f) { return kReduceNames[size_t(f)]; }
DType operand_dtype(UnaryFn f, DType promoted) { return apply(info(f).operands, promoted); }
DType result_dtype(UnaryFn f, DType promoted) { return apply(info(f).result, promoted); }
DType operand_dtype(BinaryFn f, DType promoted) { return apply(info(f).operands, promoted); }
DType result_dtype(BinaryFn f, DType promoted) { return apply(info(f).result, promoted); }

DType result_dtype(ReduceFn f, DType input) {
  return f == ReduceFn::Sum && !is_floating(input) ? DType::i64 : input;
}

DTypeRule operand_rule(UnaryFn f) { return info(f).operands; }
DTypeRule operand_rule(BinaryFn f) { return info(f).operands; }

bool accepts(DTypeRule operands, DType promoted) {
  bool integer = promoted == DType::i32 || promoted == DType::i64;
  switch (operands) {
    case DTypeRule::Integer: return integer;
    case DTypeRule::IntegerOrBool: return integer || promoted == DType::boolean;
    default: return true;
  }
}

bool is_comparison(BinaryFn f) {
  return result_dtype(f, DType::f32) == DType::boolean && operand_dtype(f, DType::f32) != DType::boolean;
}

}  // namespace deuteron::ir
