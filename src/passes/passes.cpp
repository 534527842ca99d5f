#include "passes/passes.h"

#include <algorithm>
#include <functional>
#include <set>

#include <fmt/format.h>

#include "deuteron/error.h"

namespace deuteron::passes {

namespace {
bool remove_dead(ir::Kernel& k, std::vector<ir::Stmt>& body, const std::vector<int>& uses) {
  bool changed = false;
  for (auto it = body.begin(); it != body.end();) {
    if (it->kind == ir::Stmt::Kind::Loop) {
      ir::Loop& l = k.loops[size_t(it->id)];
      changed |= remove_dead(k, l.body, uses);
      bool has_effect = !l.carried.empty() && std::any_of(l.carried.begin(), l.carried.end(), [&](auto& c) {
                          return uses[size_t(c.result)] > 0;
                        });
      std::function<bool(const std::vector<ir::Stmt>&)> stores = [&](const std::vector<ir::Stmt>& b) {
        for (const auto& s : b) {
          if (s.kind == ir::Stmt::Kind::Loop && stores(k.loops[size_t(s.id)].body)) return true;
          if (s.kind == ir::Stmt::Kind::Op && k.ops[size_t(s.id)].kind == ir::OpKind::Store) return true;
        }
        return false;
      };
      if (!has_effect && !stores(l.body) && !l.grid) {
        l.carried.clear();
        it = body.erase(it);
        changed = true;
        continue;
      }
      ++it;
      continue;
    }
    const ir::Op& op = k.ops[size_t(it->id)];
    if (op.kind != ir::OpKind::Store && op.result >= 0 && uses[size_t(op.result)] == 0) {
      it = body.erase(it);
      changed = true;
      continue;
    }
    ++it;
  }
  return changed;
}

void collect_stores(const ir::Kernel& k, const std::vector<ir::Stmt>& body, std::set<int>& out) {
  for (const ir::Stmt& s : body) {
    if (s.kind == ir::Stmt::Kind::Loop) collect_stores(k, k.loops[size_t(s.id)].body, out);
    else if (k.ops[size_t(s.id)].kind == ir::OpKind::Store) out.insert(k.ops[size_t(s.id)].tensor);
  }
}
}  // namespace

void eliminate_dead_code(ir::Kernel& k) {
  for (bool changed = true; changed;) {
    changed = remove_dead(k, k.top, ir::use_counts(k));
  }
}

void fuse_dot_accumulate(ir::Kernel& k) {
  // `x + hl::dot(a, b)` (either order) becomes hl::dot(a, b, x) when the product is used only
  // by that add and x does not widen it: the micro-kernel then accumulates onto x (in place
  // when x is a loop-carried accumulator) instead of writing a product block and adding it.
  const std::vector<int> uses = ir::use_counts(k);
  for (ir::Op& op : k.ops) {
    if (op.kind != ir::OpKind::Binary || op.binary != ir::BinaryFn::Add || op.result < 0) continue;
    for (int side = 0; side < 2; ++side) {
      ir::ValueId d = op.inputs[size_t(side)], x = op.inputs[size_t(1 - side)];
      int def = k.value(d).def_op;
      if (def < 0 || uses[size_t(d)] != 1) continue;
      const ir::Op& dot = k.ops[size_t(def)];
      if (dot.kind != ir::OpKind::Dot || dot.inputs.size() != 2) continue;
      if (k.value(op.result).dims != k.value(d).dims || !is_floating(k.value(x).dtype)) continue;
      std::vector<ir::ValueId> inputs = {dot.inputs[0], dot.inputs[1], x};
      op.kind = ir::OpKind::Dot;
      op.inputs = inputs;
      k.values[size_t(op.result)].dtype = DType::f32;
      break;
    }
  }
}

void check_legality(ir::Kernel& k) {
  std::set<int> stored;
  collect_stores(k, k.top, stored);
  for (int o : k.outputs)
    if (k.tensors[size_t(o)].role == ir::HostRole::Output && !stored.count(o))
      throw KernelError(fmt::format("in kernel '{}': output '{}' is returned but never written",
                                    k.name, k.tensors[size_t(o)].name),
                        format_location(k.loc), "store into it inside the tile loop: out[tile] = ...");
  for (const ir::Loop& l : k.loops)
    for (const ir::Carried& c : l.carried)
      if (k.value(c.init).dtype != k.value(c.next).dtype)
        throw KernelError(
            fmt::format("in kernel '{}': a value carried around a loop changes dtype from {} to {}",
                        k.name, dtype_name(k.value(c.init).dtype), dtype_name(k.value(c.next).dtype)),
            format_location(l.loc), "cast the update back with .to(dtype), or start from that dtype");
}

void run_all(ir::Kernel& k) {
  ir::verify(k);
  eliminate_dead_code(k);
  fuse_dot_accumulate(k);
  eliminate_dead_code(k);
  check_legality(k);
  ir::verify(k);
}

}  // namespace deuteron::passes
