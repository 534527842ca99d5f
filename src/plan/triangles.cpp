// Step 3b: causal triangles. A product that a where() masks above a diagonal of its row and
// column indices (attention's scores, kv > q) need not compute the tiles wholly above it, and
// a product whose a operand is zero there (the softmax of those scores, exp(-inf - max) = 0)
// need not multiply the zeros. Found here, from the kernel; a target may skip either part.
#include <cmath>
#include <optional>

#include "plan/steps.h"

namespace deuteron::plan {

namespace {

// An index expression along one axis: the axis' global index plus an integral offset, through
// views and integer constants added or subtracted.
struct AxisOffset {
  int axis = -1;
  int64_t offset = 0;
};

std::optional<int64_t> integer_constant(const ir::Kernel& k, ir::ValueId v) {
  v = ir::strip_views(k, v);
  const ir::Op* op = k.def(v);
  if (!op || op->kind != ir::OpKind::Full || op->axis >= 0 || is_floating(k.value(v).dtype)) return std::nullopt;
  return op->number.integer;
}

std::optional<AxisOffset> axis_offset(const ir::Kernel& k, ir::ValueId v) {
  v = ir::strip_views(k, v);
  const ir::Op* op = k.def(v);
  if (!op) return std::nullopt;
  if (op->kind == ir::OpKind::TileIndex) return AxisOffset{op->axis, 0};
  if (op->kind != ir::OpKind::Binary || (op->binary != ir::BinaryFn::Add && op->binary != ir::BinaryFn::Sub))
    return std::nullopt;
  bool sub = op->binary == ir::BinaryFn::Sub;
  if (auto c = integer_constant(k, op->inputs[1]))
    if (auto x = axis_offset(k, op->inputs[0])) return AxisOffset{x->axis, sub ? x->offset - *c : x->offset + *c};
  if (auto c = integer_constant(k, op->inputs[0]); c && !sub)
    if (auto x = axis_offset(k, op->inputs[1])) return AxisOffset{x->axis, x->offset + *c};
  return std::nullopt;
}

// A condition `index(col) - index(row) > t`, as a comparison of two index expressions.
std::optional<DiagonalMask> diagonal(const ir::Kernel& k, ir::ValueId cond) {
  const ir::Op* op = k.def(ir::strip_views(k, cond));
  if (!op || op->kind != ir::OpKind::Binary) return std::nullopt;
  auto x = axis_offset(k, op->inputs[0]), y = axis_offset(k, op->inputs[1]);
  if (!x || !y) return std::nullopt;
  // x > y, x >= y, x < y, x <= y with x, y the column's and the row's index expressions (or
  // the other way around): col + cc > row + rc, that is col - row > rc - cc.
  bool greater = op->binary == ir::BinaryFn::Gt || op->binary == ir::BinaryFn::Ge;
  bool strict = op->binary == ir::BinaryFn::Gt || op->binary == ir::BinaryFn::Lt;
  if (!greater && op->binary != ir::BinaryFn::Lt && op->binary != ir::BinaryFn::Le) return std::nullopt;
  if (!greater) std::swap(x, y);  // now x > y (or >=)
  if (x->axis == y->axis) return std::nullopt;
  return DiagonalMask{op->result, y->axis, x->axis, y->offset - x->offset - (strict ? 0 : 1)};
}

// The t of a condition `index(col) - index(row) > t` on the given axes.
std::optional<int64_t> above_diagonal(const ir::Kernel& k, ir::ValueId cond, int row, int col) {
  auto d = diagonal(k, cond);
  if (!d || d->row != row || d->col != col) return std::nullopt;
  return d->t;
}

// A where(cond, -inf, value) at v, masking the part above a diagonal of (row, col): its t.
std::optional<int64_t> masked_to_minus_infinity(const ir::Kernel& k, ir::ValueId v, int row, int col,
                                                ir::ValueId* unmasked = nullptr) {
  const ir::Op* op = k.def(ir::strip_views(k, v));
  if (!op || op->kind != ir::OpKind::Where) return std::nullopt;
  const ir::Op* fill = k.def(ir::strip_views(k, op->inputs[1]));
  if (!fill || fill->kind != ir::OpKind::Full || fill->axis >= 0 || !(fill->number.real < 0 && std::isinf(fill->number.real)))
    return std::nullopt;
  if (unmasked) *unmasked = op->inputs[2];
  return above_diagonal(k, op->inputs[0], row, col);
}

bool is_tile_axis(const ir::Kernel& k, int a) { return a != ir::kOne && k.axes[size_t(a)].kind == ir::AxisKind::Tile; }

// Whether every use of v is a where() that masks it (its unmasked arm) above the diagonal t.
bool only_read_unmasked(const ir::Kernel& k, ir::ValueId v, int row, int col, int64_t t) {
  for (const ir::Loop& l : k.loops) {
    for (const ir::Carried& c : l.carried)
      if (c.init == v || c.next == v) return false;
    for (const auto* bounds : {&l.begin, &l.end})
      for (const ir::Bound& b : *bounds)
        if (b.value == v) return false;
  }
  for (const ir::Op& op : k.ops)
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      if (op.inputs[i] != v) continue;
      ir::ValueId unmasked = -1;
      if (op.kind == ir::OpKind::View) {
        if (!only_read_unmasked(k, op.result, row, col, t)) return false;
        continue;
      }
      if (i != 2 || masked_to_minus_infinity(k, op.result, row, col, &unmasked) != t) return false;
    }
  return true;
}

// The t of an a operand that is zero where index(col) - index(row) > t: a = exp(s - m) or
// exp2(s - m) (through casts), where s is -inf there and m is at least every s (ir::nonpositive)
// and the same along col (a row's max): exp(-inf - m) = 0.
std::optional<int64_t> zero_above_diagonal(const ir::Kernel& k, ir::ValueId a, int row, int col) {
  const ir::Op* e = k.def(a);
  while (e && e->kind == ir::OpKind::Cast) e = k.def(e->inputs[0]);
  if (!e || e->kind != ir::OpKind::Unary || (e->unary != ir::UnaryFn::Exp && e->unary != ir::UnaryFn::Exp2))
    return std::nullopt;
  const ir::Op* diff = k.def(ir::strip_views(k, e->inputs[0]));
  if (!diff || diff->kind != ir::OpKind::Binary || diff->binary != ir::BinaryFn::Sub || !ir::nonpositive(k, e->inputs[0]))
    return std::nullopt;
  for (int dim : k.value(diff->inputs[1]).dims)
    if (dim == col) return std::nullopt;
  return masked_to_minus_infinity(k, diff->inputs[0], row, col);
}

}  // namespace

void find_triangles(Lowering& l) {
  const ir::Kernel& k = l.k;
  for (const ir::Op& op : k.ops) {
    if (op.kind != ir::OpKind::Binary) continue;
    if (auto d = diagonal(k, op.result); d && is_tile_axis(k, d->row) && is_tile_axis(k, d->col))
      l.p.diagonal_masks.push_back(*d);
  }
  for (Dot& d : l.p.dots) {
    const ir::Op& op = k.ops[size_t(d.op)];
    const auto& rd = k.value(op.result).dims;
    const auto& ad = k.value(op.inputs[0]).dims;
    int row = rd[rd.size() - 2], col = rd.back(), kx = ad.back();
    if (!is_tile_axis(k, row)) continue;
    // C above the diagonal unread: every use masks it (no accumulator: that reads all of C).
    if (op.inputs.size() == 2 && is_tile_axis(k, col)) {
      for (const ir::Op& user : k.ops) {
        if (user.kind != ir::OpKind::Where || user.inputs[2] != op.result) continue;
        auto t = masked_to_minus_infinity(k, user.result, row, col);
        if (t && only_read_unmasked(k, op.result, row, col, *t)) d.c_unused_above = *t;
        break;
      }
    }
    if (is_tile_axis(k, kx))
      if (auto t = zero_above_diagonal(k, d.a.source, row, kx)) d.a_zero_above = *t;
  }
}

}  // namespace deuteron::plan
