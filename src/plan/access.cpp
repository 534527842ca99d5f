// Steps 5 and 6: each inner loop's strategy, and a block spec for every tensor access: its
// block shape, its index map as data, where the block lives and how many buffers it takes.
#include <algorithm>

#include <fmt/format.h>

#include "config/keys.h"
#include "deuteron/error.h"
#include "plan/steps.h"

namespace deuteron::plan {

namespace {

Placement placement_named(const std::string& s) {
  namespace keys = config::keys;
  if (s == keys::kStream) return Placement::Staged;
  if (s == keys::kResident) return Placement::Resident;
  return Placement::InPlace;
}

IndexTerm term(const Lowering& l, const ir::Index& e) {
  const ir::Kernel& k = l.k;
  IndexTerm t;
  switch (e.kind) {
    case ir::Index::Kind::Axis: {
      const ir::Axis& ax = k.axis(e.axis);
      t.axis = e.axis;
      t.offset = e.offset;
      if (ax.kind == ir::AxisKind::Tile) {
        const ir::Loop& loop = k.loop(ax.loop);
        size_t i = size_t(std::find(loop.axes.begin(), loop.axes.end(), e.axis) - loop.axes.begin());
        t.kind = IndexTerm::Kind::Block;
        t.loop = ax.loop;
        t.grid = loop.grid;
        t.begin = loop.begin[i].value >= 0 ? 0 : loop.begin[i].constant;
      } else if (ax.kind == ir::AxisKind::Reduction && !l.p.persistent[size_t(e.axis)]) {
        t.kind = IndexTerm::Kind::Looped;
      } else {
        t.kind = IndexTerm::Kind::Whole;
      }
      return t;
    }
    case ir::Index::Kind::Scalar:
      if (e.value < 0) {
        t.kind = IndexTerm::Kind::Constant;
        t.constant = e.constant;
        return t;
      }
      t.kind = IndexTerm::Kind::Scalar;
      t.value = e.value;
      if (const ir::Op* def = k.def(ir::strip_views(k, e.value));
          def && (def->kind == ir::OpKind::TileBegin || def->kind == ir::OpKind::TileIndex) &&
          k.value(e.value).dims.empty() && k.axis(def->axis).loop == k.grid_loop_id())
        t.grid_axis = def->axis;
      return t;
    case ir::Index::Kind::Gather:
      t.kind = IndexTerm::Kind::Gather;
      t.value = e.value;
      return t;
  }
  return t;
}

}  // namespace

void choose_inner_loops(Lowering& l) {
  namespace keys = config::keys;
  const ir::Kernel& k = l.k;
  const config::Config& c = l.p.config;
  for (size_t i = 0; i < k.loops.size(); ++i) {
    const ir::Loop& loop = k.loops[i];
    if (loop.grid) continue;
    const std::string& axis = k.axis(loop.axes.front()).name;
    InnerLoop il;
    il.loop = int(i);
    if (c.has(keys::inner_loop(axis))) {
      il.placement = placement_named(c.text(keys::inner_loop(axis)));
      il.buffers = c.has(keys::buffers(axis)) ? int(c.integer(keys::buffers(axis))) : 1;
    }
    l.p.inner_loops.push_back(il);
  }
}

void build_block_specs(Lowering& l) {
  namespace keys = config::keys;
  const ir::Kernel& k = l.k;
  const config::Config& c = l.p.config;
  Plan& p = l.p;
  for (size_t o = 0; o < k.ops.size(); ++o) {
    const ir::Op& op = k.ops[o];
    if ((op.kind != ir::OpKind::Load && op.kind != ir::OpKind::Store) || l.loop_of[o] < 0) continue;
    BlockSpec s;
    s.op = int(o);
    s.tensor = op.tensor;
    s.store = op.kind == ir::OpKind::Store;
    s.loop = l.loop_of[o];
    bool gathers = false;
    for (const ir::Index& e : op.index) {
      s.index_map.push_back(term(l, e));
      s.block_shape.push_back(e.kind == ir::Index::Kind::Axis ? p.block[size_t(e.axis)] : 1);
      gathers = gathers || e.kind == ir::Index::Kind::Gather;
    }
    if (!s.store && !gathers && !k.loop(s.loop).grid) {
      for (const InnerLoop& il : p.inner_loops) {
        if (il.loop != s.loop) continue;
        s.placement = il.placement;
        // A dot operand may take its own strategy.
        bool feeds_dot = std::any_of(p.dots.begin(), p.dots.end(),
                                     [&](const Dot& d) { return d.a.load_op == int(o) || d.b.load_op == int(o); });
        std::string own = keys::operand(k.axis(k.loop(s.loop).axes.front()).name, k.tensors[size_t(op.tensor)].name);
        if (feeds_dot && c.has(own) && c.text(own) != keys::kFollowLoop) s.placement = placement_named(c.text(own));
        s.buffers = s.placement == Placement::Staged ? il.buffers : 1;
      }
    }
    if (s.placement != Placement::InPlace) {
      s.elements = p.block_elements(op.result);
      if (s.placement == Placement::Resident) {
        // The whole extent of the loop's axes instead of one block.
        for (int a : k.loop(s.loop).axes)
          for (int d : k.value(op.result).dims)
            if (d == a) s.elements = s.elements / p.block[size_t(a)] * k.axis(a).extent;
      }
    }
    s.first = int(p.operands.size());
    for (const BlockSpec& other : p.operands)
      if (other.tensor == s.tensor && other.store == s.store && other.loop == s.loop &&
          other.block_shape == s.block_shape && other.index_map == s.index_map) {
        s.first = other.first;
        break;
      }
    p.operands.push_back(s);
  }
}

}  // namespace deuteron::plan
