// Step 3: the block products: the casts their operands absorb (the packing widens), the
// elementwise accumulator expressions each dot computes itself, and accumulation in place
// into a loop-carried accumulator.
#include <map>

#include <fmt/format.h>

#include "deuteron/error.h"
#include "plan/steps.h"

namespace deuteron::plan {

namespace {

bool is_elementwise(ir::OpKind kind) {
  return kind == ir::OpKind::Unary || kind == ir::OpKind::Binary || kind == ir::OpKind::Where ||
         kind == ir::OpKind::Cast;
}

// Whether v is computed from `target` (through defining ops); `stop` counts as a leaf.
bool depends_on(const ir::Kernel& k, ir::ValueId v, ir::ValueId target, ir::ValueId stop,
                std::map<ir::ValueId, bool>& memo) {
  if (v == target) return true;
  if (v == stop || v < 0) return false;
  auto it = memo.find(v);
  if (it != memo.end()) return it->second;
  memo[v] = false;
  bool dep = false;
  int def = k.value(v).def_op;
  if (def >= 0) {
    const ir::Op& op = k.ops[size_t(def)];
    for (ir::ValueId in : op.inputs) dep = dep || depends_on(k, in, target, stop, memo);
  }
  return memo[v] = dep;
}

// Whether any op from `from` on (program order, nested loops included) reads something
// computed from `target`.
bool read_after(const ir::Kernel& k, const std::vector<ir::Stmt>& body, int from_op, bool& passed,
                ir::ValueId target, ir::ValueId stop, std::map<ir::ValueId, bool>& memo) {
  for (const ir::Stmt& st : body) {
    if (st.kind == ir::Stmt::Kind::Loop) {
      const ir::Loop& l = k.loops[size_t(st.id)];
      if (passed) {
        for (const auto* bounds : {&l.begin, &l.end})
          for (const auto& b : *bounds)
            if (b.value >= 0 && depends_on(k, b.value, target, stop, memo)) return true;
        for (const auto& cv : l.carried)
          if (depends_on(k, cv.init, target, stop, memo)) return true;
      }
      if (read_after(k, l.body, from_op, passed, target, stop, memo)) return true;
      continue;
    }
    if (st.id == from_op) {
      passed = true;
      continue;
    }
    if (!passed) continue;
    for (ir::ValueId in : k.ops[size_t(st.id)].inputs)
      if (depends_on(k, in, target, stop, memo)) return true;
  }
  return false;
}

}  // namespace

void find_dots(Lowering& l) {
  const ir::Kernel& k = l.k;
  const config::Config& c = l.p.config;
  Plan& p = l.p;
  for (size_t i = 0; i < k.loops.size(); ++i)
    for (const ir::Carried& cv : k.loops[i].carried) p.carried.push_back({int(i), cv.init, cv.phi, cv.next, cv.result, -1});
  for (size_t o = 0; o < k.ops.size(); ++o) {
    const ir::Op& op = k.ops[o];
    if (op.kind != ir::OpKind::Dot || l.loop_of[o] < 0) continue;
    Dot d;
    d.op = int(o);
    d.loop = l.loop_of[o];
    for (int r = 0; r < 2; ++r) {
      DotOperand& x = r == 0 ? d.a : d.b;
      std::vector<ir::ValueId> path;
      x.value = op.inputs[size_t(r)];
      x.source = ir::dot_operand_source(k, x.value, &path);
      for (size_t i = 0; i + 1 < path.size(); ++i) {
        int def = k.value(path[i]).def_op;
        if (k.ops[size_t(def)].kind == ir::OpKind::Cast && l.uses[size_t(path[i])] == 1) {
          l.absorbed.insert(def);
          l.absorbed_values.push_back(path[i]);
        }
      }
      int def = k.value(x.source).def_op;
      if (def >= 0 && k.ops[size_t(def)].kind == ir::OpKind::Load) {
        bool gathers = false;
        for (const ir::Index& e : k.ops[size_t(def)].index) gathers = gathers || e.kind == ir::Index::Kind::Gather;
        if (!gathers) x.load_op = def;
      }
    }
    ir::ValueId result = op.result;
    if (op.inputs.size() == 3) {
      // acc * alpha and the like: computed into the product's storage before accumulating.
      std::vector<ir::ValueId> pending = {op.inputs[2]};
      while (!pending.empty()) {
        ir::ValueId v = pending.back();
        pending.pop_back();
        int def = k.value(v).def_op;
        if (def < 0 || l.uses[size_t(v)] != 1 || !is_elementwise(k.ops[size_t(def)].kind) || l.absorbed.count(def)) continue;
        l.absorbed.insert(def);
        l.absorbed_values.push_back(v);
        if (v == op.inputs[2]) d.acc_inline = true;
        for (ir::ValueId in : k.ops[size_t(def)].inputs) pending.push_back(in);
      }
    }
    const ir::Loop& home = k.loops[size_t(d.loop)];
    for (const ir::Carried& cv : home.carried) {
      if (cv.next != result) continue;
      bool ok = d.a.source != cv.phi && d.b.source != cv.phi;
      if (op.inputs.size() == 3 && op.inputs[2] != cv.phi) {
        // The accumulator expression may read the old accumulator only elementwise (directly).
        if (!d.acc_inline) ok = ok && ir::strip_views(k, op.inputs[2]) != cv.phi;
        std::vector<ir::ValueId> pending = {op.inputs[2]};
        while (ok && !pending.empty()) {
          ir::ValueId v = pending.back();
          pending.pop_back();
          int def = k.value(v).def_op;
          if (def < 0 || !l.absorbed.count(def)) continue;
          for (ir::ValueId in : k.ops[size_t(def)].inputs) {
            if (in != cv.phi && ir::strip_views(k, in) == cv.phi) ok = false;
            pending.push_back(in);
          }
        }
      }
      std::map<ir::ValueId, bool> memo;
      bool passed = false;
      if (ok && read_after(k, home.body, d.op, passed, cv.phi, result, memo)) ok = false;
      for (const ir::Carried& other : home.carried)
        if (ok && other.phi != cv.phi && depends_on(k, other.next, cv.phi, result, memo)) ok = false;
      if (ok) d.acc_phi = cv.phi;
    }
    for (ir::ValueId v : {op.inputs[0], op.inputs[1], result})
      for (int dim : k.value(v).dims)
        if (dim != ir::kOne && k.axes[size_t(dim)].kind == ir::AxisKind::Reduction && !p.persistent[size_t(dim)])
          throw ConfigError(fmt::format("config {} loops over the whole dim {} of a dot in blocks of {}; a dot "
                                        "needs it in one block",
                                        c.dump(), k.axes[size_t(dim)].name, p.block[size_t(dim)]),
                            format_location(op.loc), "use the dim's full extent for its reduce_ block size");
    p.dots.push_back(d);
    if (d.acc_phi >= 0)
      for (CarriedValue& cv : p.carried)
        if (cv.phi == d.acc_phi) cv.dot = d.op;
  }

}

}  // namespace deuteron::plan
