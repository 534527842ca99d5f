// Step 4: fusion groups. Consecutive ops over the same block dims run as one loop nest; a dot
// or a scan is a group of its own, and an op that reads a reduction made in the current group
// starts a new one.
#include <algorithm>

#include "plan/steps.h"

namespace deuteron::plan {

namespace {

// The block dims of a tensor access, in tensor-dim order.
std::vector<int> access_dims(const ir::Kernel& k, const ir::Op& op) {
  std::vector<int> dims;
  for (const ir::Index& e : op.index) {
    if (e.kind == ir::Index::Kind::Axis) dims.push_back(e.axis);
    else if (e.kind == ir::Index::Kind::Gather)
      for (int d : non_one(k.value(e.value).dims)) dims.push_back(d);
  }
  return dims;
}

// The axes an op iterates over.
std::vector<int> domain_of(const ir::Kernel& k, const ir::Op& op) {
  switch (op.kind) {
    case ir::OpKind::Store: return access_dims(k, op);
    case ir::OpKind::Reduce: return non_one(k.value(op.inputs[0]).dims);
    default: return non_one(k.value(op.result).dims);
  }
}

bool same_axes(std::vector<int> a, std::vector<int> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

std::vector<Item> group_body(const ir::Kernel& k, const std::vector<ir::Stmt>& body,
                             const std::set<int>& absorbed, const std::vector<bool>& index_arithmetic) {
  std::vector<Item> items;
  Group* cur = nullptr;
  std::set<ir::ValueId> reduced_here;
  for (const ir::Stmt& s : body) {
    if (s.kind == ir::Stmt::Kind::Loop) {
      Item it;
      it.is_loop = true;
      it.loop = s.id;
      items.push_back(it);
      cur = nullptr;
      continue;
    }
    const ir::Op& op = k.ops[size_t(s.id)];
    if (is_cheap(op.kind) || absorbed.count(s.id) || (op.result >= 0 && index_arithmetic[size_t(op.result)]))
      continue;  // computed where used
    // A block product is a group of its own, and so is a scan (a sequential loop on the cpu).
    if (op.kind == ir::OpKind::Dot || op.kind == ir::OpKind::Scan) {
      Item it;
      it.group.ops = {s.id};
      it.group.domain = domain_of(k, op);
      items.push_back(it);
      cur = nullptr;
      continue;
    }
    std::vector<int> dom = domain_of(k, op);
    bool joins = cur && same_axes(cur->domain, dom);
    if (joins)
      for (ir::ValueId in : op.inputs)
        if (reduced_here.count(ir::strip_views(k, in))) joins = false;
    if (!joins) {
      items.push_back(Item{});
      cur = &items.back().group;
      cur->domain = dom;
      reduced_here.clear();
    }
    cur->ops.push_back(s.id);
    if (op.kind == ir::OpKind::Reduce) reduced_here.insert(op.result);
  }
  return items;
}

}  // namespace

void group_bodies(Lowering& l) {
  l.p.bodies.resize(l.k.loops.size());
  for (size_t i = 0; i < l.k.loops.size(); ++i)
    l.p.bodies[i] = group_body(l.k, l.k.loops[i].body, l.absorbed, l.index_arithmetic);
}

}  // namespace deuteron::plan
