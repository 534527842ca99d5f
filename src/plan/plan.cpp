#include "plan/plan.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "deuteron/error.h"

namespace deuteron::plan {

const char* name(Placement p) {
  switch (p) {
    case Placement::InPlace: return "in_place";
    case Placement::Staged: return "staged";
    case Placement::Resident: return "resident";
  }
  return "?";
}

const char* name(DotRead r) {
  switch (r) {
    case DotRead::InPlace: return "in place";
    case DotRead::Packed: return "packed copy";
    case DotRead::PackInGroup: return "packed by the dot";
  }
  return "?";
}

int64_t packed_a_elements(int64_t m, int64_t k) { return (m + kDotMR - 1) / kDotMR * kDotMR * k; }
int64_t packed_b_elements(int64_t k, int64_t n) { return (n + kDotNR - 1) / kDotNR * kDotNR * k; }

const DotPlan* Plan::dot_for_op(int op) const {
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

namespace {

int64_t cpp_size(DType t) {
  switch (t) {
    case DType::i64: return 8;
    case DType::boolean: return 1;
    default: return 4;  // f32, and bf16/f16/i32 values computed as 32-bit
  }
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

std::vector<int> non_one(const std::vector<int>& dims) {
  std::vector<int> out;
  for (int d : dims)
    if (d != ir::kOne) out.push_back(d);
  return out;
}

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

// Follows views to the value that holds the data.
ir::ValueId source_of(const ir::Kernel& k, ir::ValueId v) {
  while (v >= 0 && k.value(v).def_op >= 0 && k.ops[size_t(k.value(v).def_op)].kind == ir::OpKind::View)
    v = k.ops[size_t(k.value(v).def_op)].inputs[0];
  return v;
}

std::vector<Item> group_body(const ir::Kernel& k, const std::vector<ir::Stmt>& body,
                             const std::set<int>& absorbed) {
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
    if (is_cheap(op.kind) || absorbed.count(s.id)) continue;  // computed where used
    if (op.kind == ir::OpKind::Dot) {  // a block product is a group of its own
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
        if (reduced_here.count(source_of(k, in))) joins = false;
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

Plan lower(const ir::Kernel& k, const config::Config& c, const config::TargetLimits& limits,
           const std::string& target) {
  Plan p;
  p.target = target;
  p.kernel = k;
  p.config = c;
  p.fast_memory_budget = limits.fast_memory_bytes;
  p.threads = c.has("num_threads") ? int(c.integer("num_threads")) : 1;

  // Block sizes.
  p.block.resize(k.axes.size());
  p.persistent.resize(k.axes.size(), false);
  for (size_t a = 0; a < k.axes.size(); ++a) {
    const ir::Axis& ax = k.axes[a];
    if (ax.kind == ir::AxisKind::Fixed) {
      p.block[a] = ax.extent;
      p.persistent[a] = true;
      continue;
    }
    const ir::BlockParam& bp = k.block_params[size_t(ax.block_param)];
    int64_t b = bp.fixed ? bp.fixed : c.integer(bp.name);
    if (b < 1 || (b & (b - 1)))
      throw ConfigError(fmt::format("block size {} = {} is not a positive power of two", bp.name, b));
    if (ax.kind == ir::AxisKind::Reduction) {
      p.persistent[a] = b >= ax.extent;
      p.block[a] = p.persistent[a] ? ax.extent : b;
    } else {
      p.block[a] = b;
    }
  }

  // Grid.
  const ir::Loop& grid = k.grid_loop();
  std::vector<int> order(grid.axes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  if (c.has("grid_order")) order = c.values().at("grid_order").get<std::vector<int>>();
  for (int i : order) {
    int a = grid.axes[size_t(i)];
    int64_t extent = k.axes[size_t(a)].extent - grid.begin[size_t(i)].constant;
    p.grid_axes.push_back(a);
    p.grid_blocks.push_back((std::max<int64_t>(extent, 0) + p.block[size_t(a)] - 1) / p.block[size_t(a)]);
  }

  if (c.has("grid_group")) p.grid_group = std::max<int64_t>(1, c.integer("grid_group"));
  if (c.has("epilogue_subtiles")) p.epilogue_subtiles = int(std::max<int64_t>(1, c.integer("epilogue_subtiles")));

  // Dots: the casts their operands absorb (the packing widens), the elementwise accumulator
  // expressions computed by the dot group itself, and accumulation in place.
  const std::vector<int> uses = ir::use_counts(k);
  std::vector<int> op_loop(k.ops.size(), -1);
  for (size_t l = 0; l < k.loops.size(); ++l)
    for (const ir::Stmt& st : k.loops[l].body)
      if (st.kind == ir::Stmt::Kind::Op) op_loop[size_t(st.id)] = int(l);
  std::set<int> absorbed;
  std::vector<ir::ValueId> absorbed_values;
  for (size_t o = 0; o < k.ops.size(); ++o) {
    const ir::Op& op = k.ops[o];
    if (op.kind != ir::OpKind::Dot || op_loop[o] < 0) continue;
    DotPlan d;
    d.op = int(o);
    d.loop = op_loop[o];
    for (int r = 0; r < 2; ++r) {
      DotOperand& x = r == 0 ? d.a : d.b;
      std::vector<ir::ValueId> path;
      x.value = op.inputs[size_t(r)];
      x.source = ir::dot_operand_source(k, x.value, &path);
      for (size_t i = 0; i + 1 < path.size(); ++i) {
        int def = k.value(path[i]).def_op;
        if (k.ops[size_t(def)].kind == ir::OpKind::Cast && uses[size_t(path[i])] == 1) {
          absorbed.insert(def);
          absorbed_values.push_back(path[i]);
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
      std::vector<ir::ValueId> todo = {op.inputs[2]};
      while (!todo.empty()) {
        ir::ValueId v = todo.back();
        todo.pop_back();
        int def = k.value(v).def_op;
        if (def < 0 || uses[size_t(v)] != 1 || !is_elementwise(k.ops[size_t(def)].kind) || absorbed.count(def)) continue;
        absorbed.insert(def);
        absorbed_values.push_back(v);
        if (v == op.inputs[2]) d.acc_inline = true;
        for (ir::ValueId in : k.ops[size_t(def)].inputs) todo.push_back(in);
      }
    }
    const ir::Loop& home = k.loops[size_t(d.loop)];
    for (const ir::Carried& cv : home.carried) {
      if (cv.next != result) continue;
      bool ok = d.a.source != cv.phi && d.b.source != cv.phi;
      if (op.inputs.size() == 3 && op.inputs[2] != cv.phi) {
        // The accumulator expression may read the old accumulator only elementwise (directly).
        if (!d.acc_inline) ok = ok && source_of(k, op.inputs[2]) != cv.phi;
        std::vector<ir::ValueId> todo = {op.inputs[2]};
        while (ok && !todo.empty()) {
          ir::ValueId v = todo.back();
          todo.pop_back();
          int def = k.value(v).def_op;
          if (def < 0 || !absorbed.count(def)) continue;
          for (ir::ValueId in : k.ops[size_t(def)].inputs) {
            if (in != cv.phi && source_of(k, in) == cv.phi) ok = false;
            todo.push_back(in);
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
  }

  // Epilogue sub-tiling applies along the N dim of a dot in a loop directly inside the grid.
  for (const DotPlan& d : p.dots) {
    const ir::Loop& l = k.loops[size_t(d.loop)];
    int n = k.value(k.ops[size_t(d.op)].result).dims.back();
    if (p.epilogue_axis < 0 && !l.grid && l.parent >= 0 && k.loops[size_t(l.parent)].grid && n != ir::kOne &&
        std::find(grid.axes.begin(), grid.axes.end(), n) != grid.axes.end())
      p.epilogue_axis = n;
  }

  // Grouping.
  p.bodies.resize(k.loops.size());
  for (size_t l = 0; l < k.loops.size(); ++l) p.bodies[l] = group_body(k, k.loops[l].body, absorbed);

  // Inner-loop strategies.
  for (size_t l = 0; l < k.loops.size(); ++l) {
    const ir::Loop& loop = k.loops[l];
    if (loop.grid) continue;
    std::string axis = k.axes[size_t(loop.axes.front())].name;
    InnerLoop il;
    il.loop = int(l);
    if (c.has("inner_" + axis)) {
      std::string s = c.text("inner_" + axis);
      il.placement = s == "stream" ? Placement::Staged : s == "resident" ? Placement::Resident
                                                                           : Placement::InPlace;
      il.buffers = c.has("buffers_" + axis) ? int(c.integer("buffers_" + axis)) : 1;
    }
    p.inner_loops.push_back(il);
  }

  // Block specs of every tensor access.
  std::vector<int> loop_of(k.ops.size(), -1);
  for (size_t l = 0; l < k.loops.size(); ++l)
    for (const ir::Stmt& s : k.loops[l].body)
      if (s.kind == ir::Stmt::Kind::Op) loop_of[size_t(s.id)] = int(l);
  for (size_t o = 0; o < k.ops.size(); ++o) {
    const ir::Op& op = k.ops[o];
    if ((op.kind != ir::OpKind::Load && op.kind != ir::OpKind::Store) || loop_of[o] < 0) continue;
    BlockSpec s;
    s.op = int(o);
    s.tensor = op.tensor;
    s.loop = loop_of[o];
    bool gathers = false;
    for (const ir::Index& e : op.index) {
      if (e.kind == ir::Index::Kind::Axis) {
        const ir::Axis& ax = k.axes[size_t(e.axis)];
        s.block_shape.push_back(p.block[size_t(e.axis)]);
        if (ax.kind == ir::AxisKind::Tile) s.index_map.push_back(ax.name);
        else if (ax.kind == ir::AxisKind::Reduction && p.persistent[size_t(e.axis)]) s.index_map.push_back("0");
        else if (ax.kind == ir::AxisKind::Reduction) s.index_map.push_back(ax.name + " (looped)");
        else s.index_map.push_back(fmt::format("{}+{}", e.offset, 0));
      } else if (e.kind == ir::Index::Kind::Scalar) {
        s.block_shape.push_back(1);
        s.index_map.push_back(e.value >= 0 ? fmt::format("%{}", e.value) : fmt::format("{}", e.constant));
      } else {
        gathers = true;
        s.block_shape.push_back(1);
        s.index_map.push_back(fmt::format("gather %{}", e.value));
      }
    }
    if (op.kind == ir::OpKind::Load && !gathers && !k.loops[size_t(s.loop)].grid) {
      for (const InnerLoop& il : p.inner_loops)
        if (il.loop == s.loop) {
          s.placement = il.placement;
          s.buffers = il.placement == Placement::Staged ? il.buffers : 1;
          // A dot operand may override its loop's strategy.
          bool feeds_dot = false;
          for (const DotPlan& d : p.dots) feeds_dot = feeds_dot || d.a.load_op == int(o) || d.b.load_op == int(o);
          std::string own = fmt::format("inner_{}_{}", k.axes[size_t(k.loops[size_t(s.loop)].axes.front())].name,
                                        k.tensors[size_t(op.tensor)].name);
          if (feeds_dot && c.has(own) && c.text(own) != "loop") {
            std::string v = c.text(own);
            s.placement = v == "stream" ? Placement::Staged : v == "resident" ? Placement::Resident : Placement::InPlace;
            s.buffers = s.placement == Placement::Staged ? il.buffers : 1;
          }
        }
    }
    if (s.placement != Placement::InPlace) {
      int64_t elems = p.block_elements(op.result);
      if (s.placement == Placement::Resident) {
        // The whole extent of the loop's axes instead of one block.
        for (int a : k.loops[size_t(s.loop)].axes)
          for (int d : k.value(op.result).dims)
            if (d == a) elems = elems / p.block[size_t(a)] * k.axes[size_t(a)].extent;
      }
      s.fast_bytes = elems * cpp_size(k.value(op.result).dtype) * s.buffers;
    }
    p.operands.push_back(s);
  }

  // Dot operands: read in place, from a packed staged/resident copy, or packed by the dot.
  auto spec_of = [&](int op) -> BlockSpec* {
    for (auto& s : p.operands)
      if (s.op == op) return &s;
    return nullptr;
  };
  auto extent_of = [&](int axis) { return axis == ir::kOne ? int64_t(1) : p.storage_extent(axis); };
  // Whether a copy of this load can be skipped when the grid indices it depends on repeat.
  auto set_reuse = [&](BlockSpec& s) {
    const ir::Op& lop = k.ops[size_t(s.op)];
    const ir::Loop& grid = k.grid_loop();
    auto in_grid = [&](int a) { return std::find(grid.axes.begin(), grid.axes.end(), a) != grid.axes.end(); };
    std::vector<int> axes;
    bool ok = true;
    for (const ir::Index& e : lop.index) {
      if (e.kind == ir::Index::Kind::Axis) {
        if (k.axes[size_t(e.axis)].kind != ir::AxisKind::Tile) continue;
        if (s.placement == Placement::Resident && k.axes[size_t(e.axis)].loop == s.loop) continue;
        if (in_grid(e.axis)) axes.push_back(e.axis);
        else ok = false;
      } else if (e.kind == ir::Index::Kind::Scalar) {
        if (e.value < 0) continue;
        const ir::Op& def = k.ops[size_t(k.value(e.value).def_op)];
        if (def.kind == ir::OpKind::TileBegin && in_grid(def.axis)) axes.push_back(def.axis);
        else ok = false;
      } else {
        ok = false;
      }
    }
    s.reuse = ok;
    if (ok) s.reuse_axes = axes;
  };
  for (DotPlan& d : p.dots) {
    for (int r = 0; r < 2; ++r) {
      DotOperand& x = r == 0 ? d.a : d.b;
      std::vector<ir::ValueId> path;
      ir::dot_operand_source(k, x.value, &path);
      bool exclusive = true;
      for (ir::ValueId v : path) exclusive = exclusive && uses[size_t(v)] == 1;
      const std::vector<int>& vd = k.value(x.value).dims;
      int rows = vd[vd.size() - 2], cols = vd.back();
      BlockSpec* spec = x.load_op >= 0 ? spec_of(x.load_op) : nullptr;
      DType elem = x.load_op >= 0 ? k.tensors[size_t(k.ops[size_t(x.load_op)].tensor)].dtype : DType::f32;
      // B needs its N dim contiguous to be read in place.
      auto unit_cols = [&](bool from_tensor) {
        if (r == 0 || cols == ir::kOne) return true;
        if (from_tensor) {
          const ir::Op& lop = k.ops[size_t(x.load_op)];
          int64_t stride = 0;
          for (size_t i = 0; i < lop.index.size(); ++i)
            if (lop.index[i].kind == ir::Index::Kind::Axis && lop.index[i].axis == cols)
              stride += k.tensors[size_t(lop.tensor)].strides[i];
          return stride == 1;
        }
        std::vector<int> sd = non_one(k.value(x.source).dims);
        return !sd.empty() && sd.back() == cols;
      };
      if (spec && spec->placement != Placement::InPlace && exclusive) {
        const ir::Loop& l = k.loops[size_t(spec->loop)];
        if (spec->placement == Placement::Resident &&
            (l.axes.size() != 1 || l.begin[0].value >= 0 || l.begin[0].constant != 0)) {
          spec->placement = Placement::Staged;  // blocks of a packed resident copy start at 0
          spec->buffers = 1;
        }
        x.read = DotRead::Packed;
      } else if (spec && spec->placement != Placement::InPlace) {
        x.read = unit_cols(false) ? DotRead::InPlace : DotRead::PackInGroup;  // a plain staged copy
      } else if (x.load_op >= 0) {
        if (elem == DType::f32 && unit_cols(true)) x.read = DotRead::InPlace;
        else if (exclusive && spec && spec->loop != d.loop) {
          // Loop-invariant for the dot: pack once per iteration of the load's own loop.
          spec->placement = Placement::Staged;
          spec->buffers = 1;
          x.read = DotRead::Packed;
        } else {
          x.read = DotRead::PackInGroup;
        }
      } else {
        x.read = unit_cols(false) ? DotRead::InPlace : DotRead::PackInGroup;
      }
      int64_t slab = r == 0 ? packed_a_elements(extent_of(rows), extent_of(cols))
                            : packed_b_elements(extent_of(rows), extent_of(cols));
      if (x.read == DotRead::PackInGroup) x.pack_elements = slab;
      if (x.read == DotRead::Packed) {
        for (size_t i = 0; i + 2 < vd.size(); ++i) slab *= extent_of(vd[i]);
        spec->dot = d.op;
        spec->dot_operand = r;
        spec->slab_elements = slab;
        int64_t blocks = 1;
        if (spec->placement == Placement::Resident) {
          int a = k.loops[size_t(spec->loop)].axes[0];
          if (std::find(vd.begin(), vd.end(), a) != vd.end())
            blocks = (k.axes[size_t(a)].extent + p.block[size_t(a)] - 1) / p.block[size_t(a)];
        }
        spec->fast_bytes = slab * blocks * 4 * (spec->placement == Placement::Staged ? spec->buffers : 1);
        if (spec->placement == Placement::Resident || k.loops[size_t(spec->loop)].grid) set_reuse(*spec);
      }
    }
  }

  for (DotPlan& d : p.dots) {
    auto bf16_packed = [&](const DotOperand& x) {
      return x.load_op >= 0 && x.read != DotRead::InPlace &&
             k.tensors[size_t(k.ops[size_t(x.load_op)].tensor)].dtype == DType::bf16;
    };
    d.bf16_pairs = bf16_packed(d.a) && bf16_packed(d.b);
  }

  // Which values live in fast memory between groups, and which are recomputed where used.
  p.materialized.assign(k.values.size(), false);
  p.recomputed.assign(k.values.size(), false);
  std::vector<bool> staged(k.values.size(), false);  // counted with their block spec
  for (const BlockSpec& s : p.operands)
    if (s.placement != Placement::InPlace) {
      ir::ValueId v = k.ops[size_t(s.op)].result;
      p.materialized[size_t(v)] = staged[size_t(v)] = true;
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
    v = source_of(k, v);
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
    } else if (is_cheap(op.kind) ||
               (op.kind != ir::OpKind::Reduce && looped_dims(v))) {
      p.recomputed[size_t(v)] = true;
      work.push_back(v);
    } else {
      p.materialized[size_t(v)] = true;
    }
  };
  for (ir::ValueId v : absorbed_values) {  // computed inside the dot group or its packing
    p.recomputed[size_t(v)] = true;
    work.push_back(v);
  }
  for (size_t o = 0; o < k.ops.size(); ++o) {
    if (group_of_op[o] < 0) continue;
    for (ir::ValueId in : k.ops[o].inputs) {
      ir::ValueId src = source_of(k, in);
      int def = src >= 0 ? k.value(src).def_op : -1;
      if (def < 0 || group_of_op[size_t(def)] != group_of_op[o]) needed_outside(in);
    }
  }
  for (size_t o = 0; o < k.ops.size(); ++o)  // reductions always hand their result over
    if (k.ops[o].kind == ir::OpKind::Reduce && group_of_op[o] >= 0)
      p.materialized[size_t(k.ops[o].result)] = true;
  for (const ir::Loop& l : k.loops) {
    for (const ir::Carried& cv : l.carried) {
      needed_outside(cv.init);
      needed_outside(cv.next);
      p.materialized[size_t(cv.phi)] = true;
      p.materialized[size_t(cv.result)] = true;
    }
    for (const auto& b : l.begin)
      if (b.value >= 0) needed_outside(b.value);
    for (const auto& b : l.end)
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

  // Fast memory per thread.
  int64_t bytes = 0;
  auto round64 = [](int64_t b) { return (b + 63) / 64 * 64; };
  for (size_t v = 0; v < k.values.size(); ++v)
    if (p.materialized[v] && !staged[v])
      bytes += round64(p.block_elements(ir::ValueId(v)) * cpp_size(k.values[v].dtype));
  for (const BlockSpec& s : p.operands) bytes += round64(s.fast_bytes);
  for (const DotPlan& d : p.dots) {
    bytes += round64(d.a.pack_elements * 4) + round64(d.b.pack_elements * 4);
    ir::ValueId r = k.ops[size_t(d.op)].result;
    if (d.acc_phi >= 0 && p.materialized[size_t(r)])  // shares its accumulator's storage
      bytes -= round64(p.block_elements(r) * cpp_size(k.value(r).dtype));
  }
  p.fast_memory_bytes = bytes;
  if (bytes > limits.fast_memory_bytes)
    throw ConfigError(fmt::format("config {} needs {} KiB of fast memory per thread; the {} target "
                                  "has {} KiB",
                                  c.dump(), (bytes + 1023) / 1024, target,
                                  limits.fast_memory_bytes / 1024),
                      format_location(k.loc),
                      "use smaller blocks, a looped reduction, or the in_place strategy");
  return p;
}

std::string print(const Plan& p) {
  const ir::Kernel& k = p.kernel;
  std::string out = fmt::format("plan {} for target {}\n  config: {}\n", k.name, p.target, p.config.dump());
  std::vector<std::string> g;
  for (size_t i = 0; i < p.grid_axes.size(); ++i)
    g.push_back(fmt::format("{}: {} blocks of {}", k.axes[size_t(p.grid_axes[i])].name, p.grid_blocks[i],
                            p.block[size_t(p.grid_axes[i])]));
  out += fmt::format("  grid ({} blocks, {} threads): {}\n", p.grid_size(), p.threads, fmt::join(g, ", "));
  for (size_t a = 0; a < k.axes.size(); ++a) {
    const ir::Axis& ax = k.axes[a];
    if (ax.kind == ir::AxisKind::Reduction)
      out += fmt::format("  whole dim {} (extent {}): {}\n", ax.name, ax.extent,
                         p.persistent[a] ? "persistent (one block)"
                                         : fmt::format("looped in blocks of {}", p.block[a]));
    else if (ax.kind == ir::AxisKind::Tile && k.loops[size_t(ax.loop)].grid == false)
      out += fmt::format("  inner loop axis {} (extent {}): blocks of {}\n", ax.name, ax.extent, p.block[a]);
  }
  for (const InnerLoop& il : p.inner_loops)
    out += fmt::format("  inner loop over {}: {}{}\n", k.axes[size_t(k.loops[size_t(il.loop)].axes[0])].name,
                       name(il.placement),
                       il.placement == Placement::Staged ? fmt::format(", {} buffers", il.buffers) : "");
  out += "  block specs:\n";
  for (const BlockSpec& s : p.operands) {
    const ir::Op& op = k.ops[size_t(s.op)];
    std::vector<std::string> reuse;
    for (int a : s.reuse_axes) reuse.push_back(k.axes[size_t(a)].name);
    out += fmt::format("    {} {}: block [{}], index map ({}), {}{}{}{}\n",
                       op.kind == ir::OpKind::Load ? "load " : "store", k.tensors[size_t(s.tensor)].name,
                       fmt::join(s.block_shape, ", "), fmt::join(s.index_map, ", "), name(s.placement),
                       s.dot >= 0 ? fmt::format(" (packed for operand {} of a dot)", s.dot_operand == 0 ? "a" : "b") : "",
                       s.fast_bytes ? fmt::format(", {} bytes", s.fast_bytes) : "",
                       s.reuse ? fmt::format(", kept while grid blocks of [{}] repeat", fmt::join(reuse, ", ")) : "");
  }
  for (const DotPlan& d : p.dots) {
    const ir::Op& op = k.ops[size_t(d.op)];
    auto operand = [&](const DotOperand& x) {
      std::string what = x.load_op >= 0 ? k.tensors[size_t(k.ops[size_t(x.load_op)].tensor)].name
                                         : fmt::format("%{} (fast memory)", x.source);
      return fmt::format("{} {}", what, name(x.read));
    };
    out += fmt::format("  dot %{} = %{} @ %{}{}: a = {}, b = {}{}\n", op.result, op.inputs[0], op.inputs[1],
                       op.inputs.size() > 2 ? fmt::format(" + %{}", op.inputs[2]) : "", operand(d.a), operand(d.b),
                       d.acc_phi >= 0 ? fmt::format(", accumulates in place into %{}", d.acc_phi) : "");
    if (d.bf16_pairs) out += "    both operands packed as bf16 (pairs of K steps for vdpbf16ps where the CPU has it)\n";
  }
  if (p.grid_group > 1) out += fmt::format("  grid traversal in groups of {}\n", p.grid_group);
  if (p.epilogue_subtiles > 1 && p.epilogue_axis >= 0)
    out += fmt::format("  epilogue in {} sub-tiles along {}\n", p.epilogue_subtiles, k.axes[size_t(p.epilogue_axis)].name);
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
  out += fmt::format("  fast memory: {} of {} bytes per thread\n", p.fast_memory_bytes, p.fast_memory_budget);
  return out;
}

}  // namespace deuteron::plan
