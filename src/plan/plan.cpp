#include "plan/plan.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "plan/steps.h"

namespace deuteron::plan {

const char* name(Placement p) {
  switch (p) {
    case Placement::InPlace: return "in_place";
    case Placement::Staged: return "staged";
    case Placement::Resident: return "resident";
  }
  return "?";
}

std::vector<int> non_one(const std::vector<int>& dims) {
  std::vector<int> out;
  for (int d : dims)
    if (d != ir::kOne) out.push_back(d);
  return out;
}

bool is_cheap(ir::OpKind k) {
  switch (k) {
    case ir::OpKind::Load:
    case ir::OpKind::Full:
    case ir::OpKind::ScalarArg:
    case ir::OpKind::TileIndex:
    case ir::OpKind::TileBegin:
    case ir::OpKind::TileEnd:
    case ir::OpKind::TileSize:
    case ir::OpKind::View: return true;
    default: return false;
  }
}

namespace {

bool is_index_arithmetic_op(const ir::Op& op) {
  if (op.kind != ir::OpKind::Load && is_cheap(op.kind)) return true;  // no data
  switch (op.kind) {
    case ir::OpKind::Where:
    case ir::OpKind::Cast: return true;
    case ir::OpKind::Unary:
      return op.unary == ir::UnaryFn::Neg || op.unary == ir::UnaryFn::Abs || op.unary == ir::UnaryFn::Not;
    case ir::OpKind::Binary:
      switch (op.binary) {
        case ir::BinaryFn::Div:
        case ir::BinaryFn::Pow:
        case ir::BinaryFn::Mod:
        case ir::BinaryFn::FloorDiv:
        case ir::BinaryFn::Rand:
        case ir::BinaryFn::Randn:
        case ir::BinaryFn::RandInt: return false;
        default: return true;
      }
    default: return false;
  }
}

}  // namespace

std::vector<bool> index_arithmetic_values(const ir::Kernel& k) {
  std::vector<bool> index(k.values.size(), false);
  for (const ir::Op& op : k.ops) {  // defined before use: one pass in op order
    if (op.result < 0 || !is_index_arithmetic_op(op)) continue;
    bool all = true;
    for (ir::ValueId in : op.inputs) all = all && in >= 0 && index[size_t(in)];
    index[size_t(op.result)] = all;
  }
  // A scalar is computed once per grid step or trip anyway (a loop bound among them): only
  // blocks gain from being recomputed where used.
  for (size_t v = 0; v < k.values.size(); ++v)
    if (index[v] && non_one(k.values[v].dims).empty()) index[v] = false;
  return index;
}

const Dot* Plan::dot_for_op(int op) const {
  for (const auto& d : dots)
    if (d.op == op) return &d;
  return nullptr;
}

int64_t Plan::grid_size() const {
  int64_t n = 1;
  for (int64_t b : grid_blocks) n *= b;
  return n;
}

int64_t Plan::storage_extent(int axis) const {
  const ir::Axis& ax = kernel.axes[size_t(axis)];
  return ax.kind == ir::AxisKind::Tile ? block[size_t(axis)] : ax.extent;
}

int64_t Plan::block_elements(ir::ValueId v) const {
  int64_t n = 1;
  for (int d : kernel.value(v).dims)
    if (d != ir::kOne) n *= storage_extent(d);
  return n;
}

const BlockSpec* Plan::spec_for_op(int op) const {
  for (const auto& s : operands)
    if (s.op == op) return &s;
  return nullptr;
}

std::string print(const Plan& p, const IndexTerm& t) {
  const ir::Kernel& k = p.kernel;
  auto plus = [](int64_t x) { return x ? fmt::format(" + {}", x) : std::string(); };
  switch (t.kind) {
    case IndexTerm::Kind::Block:
      return fmt::format("{}{}{}", k.axis(t.axis).name, t.begin ? fmt::format(" (from {})", t.begin) : "",
                         t.offset ? fmt::format(" shifted by {}", t.offset) : "");
    case IndexTerm::Kind::Whole:
      return t.offset == 0 && k.axis(t.axis).kind == ir::AxisKind::Reduction
                 ? std::string("all")
                 : fmt::format("{}:{}", t.offset, t.offset + k.axis(t.axis).extent);
    case IndexTerm::Kind::Looped:
      return fmt::format("{} looped{}", k.axis(t.axis).name, plus(t.offset));
    case IndexTerm::Kind::Constant: return fmt::format("{}", t.constant);
    case IndexTerm::Kind::Scalar:
      return t.grid_axis >= 0 ? fmt::format("{} (grid index)", k.axis(t.grid_axis).name) : fmt::format("%{}", t.value);
    case IndexTerm::Kind::Gather: return fmt::format("gather %{}", t.value);
  }
  return "?";
}

std::string print(const Plan& p) {
  const ir::Kernel& k = p.kernel;
  std::string out = fmt::format("plan {} for target {}\n  config: {}\n", k.name, p.target, p.config.dump());
  std::vector<std::string> g;
  for (size_t i = 0; i < p.grid_axes.size(); ++i)
    g.push_back(fmt::format("{}: {} blocks of {}", k.axes[size_t(p.grid_axes[i])].name, p.grid_blocks[i],
                            p.block[size_t(p.grid_axes[i])]));
  out += fmt::format("  grid ({} blocks): {}\n", p.grid_size(), fmt::join(g, ", "));
  for (size_t a = 0; a < k.axes.size(); ++a) {
    const ir::Axis& ax = k.axes[a];
    if (ax.kind == ir::AxisKind::Reduction)
      out += fmt::format("  whole dim {} (extent {}): {}\n", ax.name, ax.extent,
                         p.persistent[a] ? "persistent (one block)"
                                         : fmt::format("looped in blocks of {}", p.block[a]));
    else if (ax.kind == ir::AxisKind::Tile && k.loops[size_t(ax.loop)].grid == false)
      out += fmt::format("  inner loop axis {} (extent {}): blocks of {}\n", ax.name, ax.extent, p.block[a]);
  }
  std::vector<std::string> ragged;
  for (size_t a = 0; a < k.axes.size(); ++a)
    if (p.partial[a]) ragged.push_back(k.axes[a].name);
  if (!ragged.empty()) out += fmt::format("  partial last block (masked) along: {}\n", fmt::join(ragged, ", "));
  for (const InnerLoop& il : p.inner_loops)
    out += fmt::format("  inner loop over {}: {}{}\n", k.axes[size_t(k.loops[size_t(il.loop)].axes[0])].name,
                       name(il.placement),
                       il.placement == Placement::Staged ? fmt::format(", {} buffers", il.buffers) : "");
  out += "  block specs:\n";
  for (size_t i = 0; i < p.operands.size(); ++i) {
    const BlockSpec& s = p.operands[i];
    std::vector<std::string> reuse, terms;
    for (int a : s.reuse_axes) reuse.push_back(k.axes[size_t(a)].name);
    for (const IndexTerm& t : s.index_map) terms.push_back(print(p, t));
    out += fmt::format("    {} {}: block [{}], index map ({}), {}{}{}{}\n", s.store ? "store" : "load ",
                       k.tensors[size_t(s.tensor)].name, fmt::join(s.block_shape, ", "), fmt::join(terms, ", "),
                       name(s.placement), s.placement == Placement::Staged ? fmt::format(" x{}", s.buffers) : "",
                       s.reuse ? fmt::format(", kept while grid blocks of [{}] repeat", fmt::join(reuse, ", ")) : "",
                       s.first != int(i) ? fmt::format(", same block as spec {}", s.first) : "");
  }
  for (const Reduction& r : p.reductions)
    out += fmt::format("  reduction %{} over {}: {}\n", k.op(r.op).result, k.axis(r.axis).name,
                       r.persistent ? "persistent" : fmt::format("looped in blocks of {}", r.block));
  for (const CarriedValue& cv : p.carried)
    out += fmt::format("  carried around loop {}: %{} (init %{}, next %{}, after %{}), in fast memory{}\n", cv.loop,
                       cv.phi, cv.init, cv.next, cv.result,
                       cv.dot >= 0 ? fmt::format(", the dot %{} accumulates into it", k.op(cv.dot).result) : "");
  for (const Dot& d : p.dots) {
    const ir::Op& op = k.ops[size_t(d.op)];
    auto operand = [&](const DotOperand& x) {
      return x.load_op >= 0 ? k.tensors[size_t(k.ops[size_t(x.load_op)].tensor)].name
                            : fmt::format("%{} (fast memory)", x.source);
    };
    out += fmt::format("  dot %{} = %{} @ %{}{}: a = {}, b = {}{}\n", op.result, op.inputs[0], op.inputs[1],
                       op.inputs.size() > 2 ? fmt::format(" + %{}", op.inputs[2]) : "", operand(d.a), operand(d.b),
                       d.acc_phi >= 0 ? fmt::format(", accumulates in place into %{}", d.acc_phi) : "");
    auto last_axis = [&](ir::ValueId v, size_t from_end) {
      const auto& dims = k.value(v).dims;
      return k.axes[size_t(dims[dims.size() - from_end])].name;
    };
    if (d.c_unused_above != Dot::kNoTriangle)
      out += fmt::format("    its entries with {} - {} > {} are masked: not computed where a whole tile is\n",
                         last_axis(op.result, 1), last_axis(op.result, 2), d.c_unused_above);
    if (d.a_zero_above != Dot::kNoTriangle)
      out += fmt::format("    a is zero where {} - {} > {}: not multiplied\n", last_axis(op.inputs[0], 1),
                         last_axis(op.result, 2), d.a_zero_above);
  }
  for (const DiagonalMask& m : p.diagonal_masks)
    out += fmt::format("  diagonal mask %{}: {} - {} > {}\n", m.cond, k.axes[size_t(m.col)].name,
                       k.axes[size_t(m.row)].name, m.t);
  out += "  fusion groups:\n";
  for (size_t l = 0; l < p.bodies.size(); ++l) {
    for (const Item& it : p.bodies[l]) {
      if (it.is_loop) {
        out += fmt::format("    loop {}: nested loop {}\n", l, it.loop);
        continue;
      }
      std::vector<std::string> dom, ops;
      for (int a : it.group.domain) dom.push_back(k.axes[size_t(a)].name);
      for (int o : it.group.ops) {
        const ir::Op& op = k.ops[size_t(o)];
        ops.push_back(op.result >= 0 ? fmt::format("%{}", op.result) : std::string("store"));
      }
      out += fmt::format("    loop {}: over [{}]: {}\n", l, fmt::join(dom, ", "), fmt::join(ops, " "));
    }
  }
  std::vector<std::string> mat;
  for (size_t v = 0; v < p.materialized.size(); ++v)
    if (p.materialized[v]) mat.push_back(fmt::format("%{}", v));
  out += fmt::format("  in fast memory between groups: {}\n", mat.empty() ? "none" : fmt::format("{}", fmt::join(mat, " ")));
  if (p.fast_memory_budget)
    out += fmt::format("  fast memory: {} of {} bytes per core ({} target)\n", p.fast_memory_bytes,
                       p.fast_memory_budget, p.target);
  return out;
}

}  // namespace deuteron::plan
