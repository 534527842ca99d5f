// Step 7: which values live in fast memory between groups, and which are recomputed where
// they are used (cheap leaves, index arithmetic, and elementwise values over a looped reduction's axis).
#include "plan/steps.h"

namespace deuteron::plan {

void place_values(Lowering& l) {
  const ir::Kernel& k = l.k;
  Plan& p = l.p;
  p.materialized.assign(k.values.size(), false);
  p.recomputed.assign(k.values.size(), false);
  for (const BlockSpec& s : p.operands)
    if (s.placement != Placement::InPlace) {
      ir::ValueId v = k.ops[size_t(s.op)].result;
      p.materialized[size_t(v)] = true;
    }
  std::vector<int> group_of_op(k.ops.size(), -1);
  int gid = 0;
  for (const auto& body : p.bodies)
    for (const Item& it : body) {
      if (it.is_loop) continue;
      for (int o : it.group.ops) group_of_op[size_t(o)] = gid;
      ++gid;
    }
  auto looped_dims = [&](ir::ValueId v) {
    for (int d : k.value(v).dims)
      if (d != ir::kOne && k.axes[size_t(d)].kind == ir::AxisKind::Reduction && !p.persistent[size_t(d)])
        return true;
    return false;
  };
  // A value is needed outside its group: recompute cheap or looped elementwise values,
  // keep the rest in fast memory.
  std::vector<ir::ValueId> work;
  auto needed_outside = [&](ir::ValueId v) {
    v = ir::strip_views(k, v);
    if (v < 0 || p.materialized[size_t(v)] || p.recomputed[size_t(v)]) return;
    int def = k.value(v).def_op;
    if (def < 0) {  // loop-defined (phi, result)
      p.materialized[size_t(v)] = true;
      return;
    }
    const ir::Op& op = k.ops[size_t(def)];
    const BlockSpec* spec = p.spec_for_op(def);
    if (op.kind == ir::OpKind::Load && spec && spec->placement != Placement::InPlace) {
      p.materialized[size_t(v)] = true;
    } else if (is_cheap(op.kind) || l.index_arithmetic[size_t(v)] ||
               (op.kind != ir::OpKind::Reduce && op.kind != ir::OpKind::Scan && looped_dims(v))) {
      p.recomputed[size_t(v)] = true;
      work.push_back(v);
    } else {
      p.materialized[size_t(v)] = true;
    }
  };
  for (ir::ValueId v : l.absorbed_values) {  // computed inside the dot group or its packing
    p.recomputed[size_t(v)] = true;
    work.push_back(v);
  }
  for (size_t o = 0; o < k.ops.size(); ++o) {
    if (group_of_op[o] < 0) continue;
    for (ir::ValueId in : k.ops[o].inputs) {
      ir::ValueId src = ir::strip_views(k, in);
      int def = src >= 0 ? k.value(src).def_op : -1;
      if (def < 0 || group_of_op[size_t(def)] != group_of_op[o]) needed_outside(in);
    }
  }
  for (size_t o = 0; o < k.ops.size(); ++o)  // reductions and scans always hand their result over
    if ((k.ops[o].kind == ir::OpKind::Reduce || k.ops[o].kind == ir::OpKind::Scan) && group_of_op[o] >= 0)
      p.materialized[size_t(k.ops[o].result)] = true;
  for (const ir::Loop& loop : k.loops) {
    for (const ir::Carried& cv : loop.carried) {
      needed_outside(cv.init);
      needed_outside(cv.next);
      p.materialized[size_t(cv.phi)] = true;
      p.materialized[size_t(cv.result)] = true;
    }
    for (const auto& b : loop.begin)
      if (b.value >= 0) needed_outside(b.value);
    for (const auto& b : loop.end)
      if (b.value >= 0) needed_outside(b.value);
  }
  while (!work.empty()) {  // recomputed values need their own inputs wherever they go
    ir::ValueId v = work.back();
    work.pop_back();
    int def = k.value(v).def_op;
    for (ir::ValueId in : k.ops[size_t(def)].inputs) needed_outside(in);
    for (const ir::Index& e : k.ops[size_t(def)].index)
      if (e.value >= 0) needed_outside(e.value);
  }
}

void mark_computed(Lowering& l) {
  const ir::Kernel& k = l.k;
  Plan& p = l.p;
  p.computed.assign(k.values.size(), false);
  std::vector<ir::ValueId> pending;
  for (const ir::Op& op : k.ops) {
    if (op.kind == ir::OpKind::Store) pending.push_back(op.inputs.back());
    for (const ir::Index& e : op.index)  // gathered indices are data; scalar indices address
      if (e.kind == ir::Index::Kind::Gather) pending.push_back(e.value);
  }
  for (const ir::Loop& loop : k.loops)
    for (const std::vector<ir::Bound>* bounds : {&loop.begin, &loop.end})
      for (const ir::Bound& b : *bounds)
        if (b.value >= 0) pending.push_back(b.value);
  while (!pending.empty()) {
    ir::ValueId v = pending.back();
    pending.pop_back();
    if (p.computed[size_t(v)]) continue;
    p.computed[size_t(v)] = true;
    if (const ir::Op* op = k.def(v)) {
      if (op->kind != ir::OpKind::Load) pending.insert(pending.end(), op->inputs.begin(), op->inputs.end());
      continue;
    }
    for (const ir::Loop& loop : k.loops)  // a phi or a loop result: its initial and next values
      for (const ir::Carried& c : loop.carried)
        if (c.phi == v || c.result == v) pending.insert(pending.end(), {c.init, c.next});
  }
}

}  // namespace deuteron::plan
