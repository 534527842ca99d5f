#include "plan/reduce_loops.h"

#include <fmt/format.h>

#include "runtime/text.h"

namespace deuteron::plan {

bool looped(const Plan& p, int axis) {
  return axis != ir::kOne && p.kernel.axes[size_t(axis)].kind == ir::AxisKind::Reduction && !p.persistent[size_t(axis)];
}

int looped_dim(const Plan& p, ir::ValueId v) {
  for (int d : p.kernel.value(v).dims)
    if (looped(p, d)) return d;
  return -1;
}

ReduceLoops find_reduce_loops(const Plan& p) {
  const ir::Kernel& k = p.kernel;
  ReduceLoops out;
  auto refuse = [&](int axis, const std::string& what, const std::string& at) {
    if (out.problem) return;
    const ir::BlockParam& bp = k.block_params[size_t(k.axes[size_t(axis)].block_param)];
    out.problem = ConfigError(fmt::format("{} = {} splits the reduction dim {} into blocks, but {}; the {} target "
                                          "loops over such blocks only in the grid loop's body, outside inner "
                                          "loops and block products",
                                          bp.name, p.block[size_t(axis)], k.axes[size_t(axis)].name, what, p.target),
                              at, fmt::format("set {} to {} (persistent: the whole dim in one block)", bp.name, bp.max));
  };
  auto block_param = [&](int axis) { return k.block_params[size_t(k.axes[size_t(axis)].block_param)].name; };
  for (size_t l = 0; l < k.loops.size(); ++l)
    for (const Item& it : p.bodies[l]) {
      if (it.is_loop) continue;
      std::vector<int> axes;
      for (int d : it.group.domain)
        if (looped(p, d)) axes.push_back(d);
      if (axes.empty()) continue;
      std::string at = format_location(k.ops[size_t(it.group.ops.front())].loc);
      if (int(l) != k.grid_loop_id()) refuse(axes[0], "an inner loop computes over it", at);
      if (axes.size() > 1) refuse(axes[1], fmt::format("so does {} in the same expression", block_param(axes[0])), at);
      ReduceLoop rl;
      rl.axis = axes[0];
      rl.blocks = (k.axes[size_t(rl.axis)].extent + p.block[size_t(rl.axis)] - 1) / p.block[size_t(rl.axis)];
      for (int o : it.group.ops) {
        const ir::Op& op = k.ops[size_t(o)];
        if (op.result < 0 || p.computed[size_t(op.result)]) rl.ops.push_back(o);
      }
      if (rl.ops.empty()) continue;
      for (int o : rl.ops) out.of_op[o] = int(out.loops.size());
      out.loops.push_back(rl);
    }
  // Everything else that reads a value over a looped axis runs once, not block by block.
  for (size_t o = 0; o < k.ops.size(); ++o) {
    const ir::Op& op = k.ops[o];
    if (out.of_op.count(int(o)) || (op.result >= 0 && (!p.computed[size_t(op.result)] || looped_dim(p, op.result) >= 0)))
      continue;
    for (ir::ValueId in : op.inputs)
      if (int axis = looped_dim(p, in); axis >= 0)
        refuse(axis, fmt::format("{} reads %{} over it", op.kind == ir::OpKind::Dot ? "a block product" : ir::name(op.kind), in),
               format_location(op.loc));
  }
  for (size_t v = 0; v < k.values.size(); ++v) {
    const ir::Value& val = k.values[v];
    int axis = looped_dim(p, ir::ValueId(v));
    if (axis < 0 || !p.materialized[v] || (val.def_op >= 0 && k.ops[size_t(val.def_op)].kind == ir::OpKind::Load)) continue;
    refuse(axis, fmt::format("the value %{} over it is carried by a loop", v), format_location(k.loc));
  }
  return out;
}

std::vector<std::string> walk_reduce_loop(const Plan& p, const ReduceLoop& rl, bool indices, std::set<ir::ValueId>& emitted,
                                          const std::function<void(const ir::Op&)>& start,
                                          const std::function<void(const ir::Op&, bool inside)>& write) {
  const ir::Kernel& k = p.kernel;
  std::set<ir::ValueId> this_block;
  std::function<void(const ir::Op&)> inputs = [&](const ir::Op& op) {
    std::vector<ir::ValueId> reads = op.inputs;
    for (const ir::Index& e : op.index)
      if (e.kind == ir::Index::Kind::Gather || (indices && e.value >= 0)) reads.push_back(e.value);
    for (ir::ValueId v : reads) {
      const ir::Value& val = k.value(v);
      bool per_block = looped_dim(p, v) >= 0;
      // (A loop's phi or result, def_op < 0, is written by its loop.)
      if (val.def_op < 0 || (per_block ? this_block.count(v) : emitted.count(v))) continue;
      const ir::Op& def = k.ops[size_t(val.def_op)];
      inputs(def);
      write(def, per_block);
      (per_block ? this_block : emitted).insert(v);
    }
  };
  std::vector<std::string> does;
  for (int o : rl.ops) {
    const ir::Op& op = k.ops[size_t(o)];
    inputs(op);
    if (op.kind == ir::OpKind::Reduce && k.value(op.inputs[0]).dims[size_t(op.dim)] == rl.axis) {
      start(op);
      does.push_back(ir::name(op.reduce));
      emitted.insert(op.result);  // complete after the loop
    } else if (op.result >= 0) {
      this_block.insert(op.result);
    } else {
      does.push_back("store " + runtime::escaped(k.tensors[size_t(op.tensor)].name));
    }
    write(op, true);
  }
  return does;
}

}  // namespace deuteron::plan
