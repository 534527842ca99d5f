#include "ir/ir.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/disk_cache.h"

namespace deuteron::ir {

const char* name(OpKind k) {
  switch (k) {
    case OpKind::Load: return "load";
    case OpKind::Full: return "full";
    case OpKind::ScalarArg: return "scalar_arg";
    case OpKind::TileIndex: return "tile_index";
    case OpKind::TileBegin: return "tile_begin";
    case OpKind::TileEnd: return "tile_end";
    case OpKind::TileSize: return "tile_size";
    case OpKind::Unary: return "unary";
    case OpKind::Binary: return "binary";
    case OpKind::Where: return "where";
    case OpKind::Cast: return "cast";
    case OpKind::Reduce: return "reduce";
    case OpKind::View: return "view";
    case OpKind::Dot: return "dot";
    case OpKind::Scan: return "scan";
    case OpKind::Store: return "store";
  }
  return "?";
}

const Loop& Kernel::grid_loop() const {
  for (const Stmt& s : top)
    if (s.kind == Stmt::Kind::Loop) return loops.at(size_t(s.id));
  throw std::logic_error("kernel has no grid loop");
}

int Kernel::grid_loop_id() const { return int(&grid_loop() - loops.data()); }

const Op* Kernel::def(ValueId v) const {
  int d = value(v).def_op;
  return d < 0 ? nullptr : &ops.at(size_t(d));
}

ValueId strip_views(const Kernel& k, ValueId v) {
  while (v >= 0 && k.def(v) && k.def(v)->kind == OpKind::View) v = k.def(v)->inputs[0];
  return v;
}

namespace {
bool is_number(const Kernel& k, ValueId v, double x) {
  const Op* d = k.def(strip_views(k, v));
  return d && d->kind == OpKind::Full && d->axis < 0 && is_floating(k.value(d->result).dtype) && d->number.real == x;
}

bool at_most(const Kernel& k, ValueId a, ValueId b, int depth) {
  if (a == b) return true;
  if (depth > 8) return false;  // keeps the search short; false only loses the faster code
  const Op* d = k.def(b);
  if (!d) return false;
  switch (d->kind) {
    case OpKind::View: return at_most(k, a, d->inputs[0], depth + 1);
    // Both sides broadcast by axis, so every element of a meets the max over its own row.
    case OpKind::Reduce: return d->reduce == ReduceFn::Max && at_most(k, a, d->inputs[0], depth + 1);
    case OpKind::Binary:
      return d->binary == BinaryFn::Max &&
             (at_most(k, a, d->inputs[0], depth + 1) || at_most(k, a, d->inputs[1], depth + 1));
    case OpKind::Where: {
      if (at_most(k, a, d->inputs[1], depth + 1) && at_most(k, a, d->inputs[2], depth + 1)) return true;
      // where(m == -inf, anything, m): where the guard holds, a <= m = -inf, so a is -inf too.
      const Op* c = k.def(d->inputs[0]);
      if (!c || c->kind != OpKind::Binary || c->binary != BinaryFn::Eq) return false;
      const ValueId m = d->inputs[2];
      const bool guard = (c->inputs[0] == m && is_number(k, c->inputs[1], -INFINITY)) ||
                         (c->inputs[1] == m && is_number(k, c->inputs[0], -INFINITY));
      return guard && at_most(k, a, m, depth + 1);
    }
    default: return false;
  }
}
}  // namespace

bool at_most(const Kernel& k, ValueId a, ValueId b) { return at_most(k, a, b, 0); }

bool nonpositive(const Kernel& k, ValueId v) {
  const Op* d = k.def(v);
  return d && d->kind == OpKind::Binary && d->binary == BinaryFn::Sub && at_most(k, d->inputs[0], d->inputs[1]);
}

namespace {
void walk_body(const Kernel& k, const std::vector<Stmt>& body, int loop,
               const std::function<void(const Stmt&, int)>& visit) {
  for (const Stmt& s : body) {
    visit(s, loop);
    if (s.kind == Stmt::Kind::Loop) walk_body(k, k.loop(s.id).body, s.id, visit);
  }
}
}  // namespace

void walk(const Kernel& k, const std::function<void(const Stmt& s, int loop)>& visit) {
  walk_body(k, k.top, -1, visit);
}

std::vector<int> loop_of_ops(const Kernel& k) {
  std::vector<int> out(k.ops.size(), -1);
  walk(k, [&](const Stmt& s, int loop) {
    if (s.kind == Stmt::Kind::Op) out[size_t(s.id)] = loop;
  });
  return out;
}

ValueId dot_operand_source(const Kernel& k, ValueId v, std::vector<ValueId>* path) {
  for (;;) {
    if (path) path->push_back(v);
    int def = k.value(v).def_op;
    if (def < 0) return v;
    const Op& op = k.ops[size_t(def)];
    if (op.kind == OpKind::View) {
      v = op.inputs[0];
      continue;
    }
    if (op.kind == OpKind::Cast) {
      DType from = k.value(op.inputs[0]).dtype, to = k.value(v).dtype;
      if (is_floating(from) && (to == DType::f32 || to == from)) {
        v = op.inputs[0];
        continue;
      }
    }
    return v;
  }
}

std::string constant_text(const Constant& c, DType t) {
  return is_floating(t) ? fmt::format("{}", c.real) : fmt::format("{}", c.integer);
}

std::string dim_name(const Kernel& k, int dim) {
  if (dim == kOne) return "1";
  const Axis& ax = k.axes.at(size_t(dim));
  if (ax.kind == AxisKind::Fixed) return fmt::format("{}", ax.extent);
  return k.block_params.at(size_t(ax.block_param)).name;
}

namespace {

std::string value_type(const Kernel& k, ValueId v) {
  const Value& val = k.value(v);
  std::vector<std::string> d;
  for (int x : val.dims) d.push_back(dim_name(k, x));
  return fmt::format("{}[{}]", dtype_name(val.dtype), fmt::join(d, ", "));
}

// An access's index: a tile's name (+ an offset), ":" for a whole dim, start:stop for a part.
std::string index_text(const Kernel& k, const HostTensor& t, const std::vector<Index>& index) {
  std::vector<std::string> parts;
  for (size_t d = 0; d < index.size(); ++d) {
    const Index& e = index[d];
    switch (e.kind) {
      case Index::Kind::Axis: {
        const Axis& ax = k.axes[size_t(e.axis)];
        if (ax.kind == AxisKind::Tile)
          parts.push_back(e.offset ? fmt::format("{} + {}", ax.name, e.offset) : ax.name);
        else if (e.offset == 0 && ax.extent == t.shape[d])
          parts.push_back(":");
        else
          parts.push_back(fmt::format("{}:{}", e.offset, e.offset + ax.extent));
        break;
      }
      case Index::Kind::Scalar:
        parts.push_back(e.value >= 0 ? fmt::format("%{}", e.value) : fmt::format("{}", e.constant));
        break;
      case Index::Kind::Gather: parts.push_back(fmt::format("%{}", e.value)); break;
    }
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::string bound_text(const Bound& b) {
  return b.value >= 0 ? fmt::format("%{}", b.value) : fmt::format("{}", b.constant);
}

// One op as the IR text prints it, without its source line.
std::string op_text(const Kernel& k, const Op& op);

void print_body(const Kernel& k, const std::vector<Stmt>& body, int indent, bool locations, std::string& out) {
  std::string pad(size_t(indent) * 2, ' ');
  for (const Stmt& s : body) {
    if (s.kind == Stmt::Kind::Loop) {
      const Loop& l = k.loops[size_t(s.id)];
      std::vector<std::string> ax;
      for (size_t i = 0; i < l.axes.size(); ++i) {
        const Axis& a = k.axes[size_t(l.axes[i])];
        ax.push_back(fmt::format("{} in [{}, {}) step {}", a.name, bound_text(l.begin[i]),
                                 bound_text(l.end[i]), dim_name(k, l.axes[i])));
      }
      out += fmt::format("{}{} {}:\n", pad, l.grid ? "grid" : "for", fmt::join(ax, ", "));
      for (const Carried& c : l.carried)
        out += fmt::format("{}  carried %{} = %{} (init) / %{} (next) -> %{}\n", pad, c.phi, c.init,
                           c.next, c.result);
      print_body(k, l.body, indent + 1, locations, out);
      continue;
    }
    const Op& op = k.ops[size_t(s.id)];
    out += fmt::format("{}{}", pad, op_text(k, op));
    out += locations ? fmt::format("    # {}:{}\n", op.loc.file_name(), op.loc.line()) : "\n";
    if (op.kind == OpKind::Scan) {  // its combine function, one op a line
      const Combine& c = k.combines[size_t(op.combine)];
      for (int o : c.ops) out += fmt::format("{}    {}\n", pad, op_text(k, k.ops[size_t(o)]));
      out += fmt::format("{}    return %{}\n", pad, c.result);
    }
  }
}

std::string op_text(const Kernel& k, const Op& op) {
  std::string lhs = op.result >= 0 ? fmt::format("%{}: {} = ", op.result, value_type(k, op.result)) : "";
  std::vector<std::string> in;
  for (ValueId v : op.inputs) in.push_back(fmt::format("%{}", v));
  std::string rhs;
  switch (op.kind) {
    case OpKind::Load:
      rhs = fmt::format("load {}[{}]", k.tensors[size_t(op.tensor)].name,
                        index_text(k, k.tensors[size_t(op.tensor)], op.index));
      break;
    case OpKind::Store:
      rhs = fmt::format("{} {}[{}]{} %{}", op.atomic_add ? "atomic_add" : "store", k.tensors[size_t(op.tensor)].name,
                        index_text(k, k.tensors[size_t(op.tensor)], op.index), op.atomic_add ? "," : " =", op.inputs.back());
      break;
    case OpKind::Full:
      rhs = fmt::format("full {}", constant_text(op.number, k.value(op.result).dtype));
      if (op.axis >= 0) rhs += fmt::format(" (extent of {})", k.axes[size_t(op.axis)].name);
      break;
    case OpKind::ScalarArg: rhs = fmt::format("scalar {}", k.scalars[size_t(op.scalar)].name); break;
    case OpKind::TileIndex:
    case OpKind::TileBegin:
    case OpKind::TileEnd:
    case OpKind::TileSize:
      rhs = fmt::format("{} {}", name(op.kind), k.axes[size_t(op.axis)].name);
      break;
    case OpKind::Unary: rhs = fmt::format("{} {}", name(op.unary), fmt::join(in, ", ")); break;
    case OpKind::Binary: rhs = fmt::format("{} {}", name(op.binary), fmt::join(in, ", ")); break;
    case OpKind::Reduce:
      rhs = fmt::format("{} {}, dim={}{}", name(op.reduce), fmt::join(in, ", "), op.dim,
                        op.keepdim ? ", keepdim" : "");
      break;
    case OpKind::Scan: {
      const Combine& c = k.combines[size_t(op.combine)];
      rhs = fmt::format("scan {}, dim={}{}, combine(%{}, %{})", fmt::join(in, ", "), op.dim, op.reverse ? ", reverse" : "",
                        c.a, c.b);
      break;
    }
    default: rhs = fmt::format("{} {}", name(op.kind), fmt::join(in, ", ")); break;
  }
  return lhs + rhs;
}

}  // namespace

std::string print(const Kernel& k, bool locations) {
  std::string out = fmt::format("kernel {}(", k.name);
  std::vector<std::string> params;
  for (const auto& t : k.tensors)
    if (t.role == HostRole::Input)
      params.push_back(fmt::format("{}: {}[{}]", t.name, dtype_name(t.dtype), fmt::join(t.shape, ", ")));
  for (const auto& s : k.scalars)
    params.push_back(s.specialized ? fmt::format("{}: {} = {}", s.name, dtype_name(s.dtype), s.value)
                                   : fmt::format("{}: {}", s.name, dtype_name(s.dtype)));
  out += fmt::format("{}) -> (", fmt::join(params, ", "));
  std::vector<std::string> outs;
  for (int o : k.outputs) {
    const auto& t = k.tensors[size_t(o)];
    outs.push_back(fmt::format("{}: {}[{}]", t.name, dtype_name(t.dtype), fmt::join(t.shape, ", ")));
  }
  out += fmt::format("{})\n", fmt::join(outs, ", "));
  for (const auto& t : k.tensors)
    if (t.role == HostRole::Output)
      out += fmt::format("  {} = {}([{}], {}{})\n", t.name, !t.fill ? "empty" : t.fill->real == 0 ? "zeros" : "full",
                         fmt::join(t.shape, ", "),
                         t.fill && t.fill->real != 0 ? constant_text(*t.fill, t.dtype) + ", " : "", dtype_name(t.dtype));
  if (k.ordered_adds) out += "  atomic adds: summed in a fixed order\n";
  for (const auto& p : k.block_params)
    out += fmt::format("  block size {}: {}\n", p.name,
                       p.fixed ? fmt::format("fixed {}", p.fixed)
                               : fmt::format("tunable {}..{}{}", p.min, p.max,
                                             p.reduction ? " (reduction: persistent at max)" : ""));
  print_body(k, k.top, 1, locations, out);
  return out;
}

std::string fingerprint(const Kernel& k) { return hash_hex(print(k, false)); }

std::vector<int> use_counts(const Kernel& k) {
  std::vector<int> uses(k.values.size(), 0);
  walk(k, [&](const Stmt& s, int) {
    if (s.kind == Stmt::Kind::Op) {
      for (ValueId v : k.op(s.id).inputs) ++uses[size_t(v)];
      return;
    }
    const Loop& l = k.loop(s.id);
    for (const auto* bounds : {&l.begin, &l.end})
      for (const Bound& b : *bounds)
        if (b.value >= 0) ++uses[size_t(b.value)];
    for (const Carried& c : l.carried) {
      ++uses[size_t(c.init)];
      ++uses[size_t(c.next)];
    }
  });
  return uses;
}

namespace {

class Verifier {
 public:
  explicit Verifier(const Kernel& k) : k(k), defined(k.values.size(), false), placed(k.ops.size(), false) {}

  void run() {
    for (size_t v = 0; v < k.values.size(); ++v) {
      const Value& val = k.values[v];
      if (val.def_op >= int(k.ops.size())) fail("value %{} names op {} as its definition", v, val.def_op);
      if (val.def_op >= 0 && k.ops[size_t(val.def_op)].result != ValueId(v))
        fail("value %{} names op {}, which defines %{}", v, val.def_op, k.ops[size_t(val.def_op)].result);
      for (int d : val.dims)
        if (d != kOne && (d < 0 || d >= int(k.axes.size()))) fail("value %{} has dim {}, not an axis", v, d);
    }
    for (const Axis& ax : k.axes)
      if ((ax.kind != AxisKind::Fixed && (ax.block_param < 0 || ax.block_param >= int(k.block_params.size()))) ||
          (ax.kind == AxisKind::Tile && (ax.loop < 0 || ax.loop >= int(k.loops.size()))))
        fail("axis {} names a block param or loop that does not exist", ax.name);
    int grids = 0;
    for (const Stmt& s : k.top) {
      if (s.kind != Stmt::Kind::Loop) fail("op {} stands outside every loop", s.id);
      ++grids;
    }
    if (grids != 1) fail("the kernel has {} top-level loops, not one grid loop", grids);
    body(k.top, -1);
  }

 private:
  template <typename... A>
  [[noreturn]] void fail(fmt::format_string<A...> f, A&&... a) {
    throw std::logic_error(fmt::format("invalid IR for kernel '{}': {}", k.name, fmt::format(f, std::forward<A>(a)...)));
  }

  void use(ValueId v, const char* what, int id) {
    if (v < 0 || v >= int(k.values.size())) fail("{} {} uses value %{}, which does not exist", what, id, v);
    if (!defined[size_t(v)]) fail("{} {} uses %{} before it is defined", what, id, v);
  }

  void define(ValueId v) {
    if (v < 0 || v >= int(k.values.size())) fail("a definition of %{}, which does not exist", v);
    if (defined[size_t(v)]) fail("%{} is defined twice", v);
    defined[size_t(v)] = true;
  }

  void body(const std::vector<Stmt>& stmts, int parent) {
    for (const Stmt& s : stmts) {
      if (s.kind == Stmt::Kind::Loop) {
        loop(s.id, parent);
        continue;
      }
      if (s.id < 0 || s.id >= int(k.ops.size())) fail("loop {} holds op {}, which does not exist", parent, s.id);
      if (placed[size_t(s.id)]) fail("op {} stands in two places", s.id);
      placed[size_t(s.id)] = true;
      op(s.id);
    }
  }

  void loop(int id, int parent) {
    if (id < 0 || id >= int(k.loops.size())) fail("loop {} does not exist", id);
    const Loop& l = k.loop(id);
    if (l.parent != parent) fail("loop {} names {} as its parent but stands in {}", id, l.parent, parent);
    if (l.grid != (parent < 0)) fail("loop {} is {}a grid loop at depth {}", id, l.grid ? "" : "not ", parent < 0 ? 0 : 1);
    if (l.axes.empty() || l.begin.size() != l.axes.size() || l.end.size() != l.axes.size())
      fail("loop {} has {} axes, {} begins and {} ends", id, l.axes.size(), l.begin.size(), l.end.size());
    for (int a : l.axes)
      if (a < 0 || a >= int(k.axes.size()) || k.axis(a).loop != id) fail("loop {} tiles axis {}, which is not its own", id, a);
    for (const auto* bounds : {&l.begin, &l.end})
      for (const Bound& b : *bounds)
        if (b.value >= 0) use(b.value, "the bounds of loop", id);
    for (const Carried& c : l.carried) {
      use(c.init, "loop", id);
      define(c.phi);
    }
    body(l.body, id);
    for (const Carried& c : l.carried) {
      use(c.next, "loop", id);
      define(c.result);
    }
  }

  void op(int id) {
    const Op& o = k.op(id);
    for (ValueId v : o.inputs) use(v, "op", id);
    if (o.kind == OpKind::Load || o.kind == OpKind::Store) {
      if (o.tensor < 0 || o.tensor >= int(k.tensors.size())) fail("op {} accesses tensor {}, which does not exist", id, o.tensor);
      if (o.index.size() != k.tensors[size_t(o.tensor)].shape.size())
        fail("op {} indexes {} dims of {}, which has {}", id, o.index.size(), k.tensors[size_t(o.tensor)].name,
             k.tensors[size_t(o.tensor)].shape.size());
      for (const Index& e : o.index) {
        if (e.kind == Index::Kind::Axis && (e.axis < 0 || e.axis >= int(k.axes.size())))
          fail("op {} indexes with axis {}, which does not exist", id, e.axis);
        if (e.kind != Index::Kind::Axis && e.value >= 0) use(e.value, "the index of op", id);
        if (e.kind == Index::Kind::Gather && e.value < 0) fail("op {} gathers without an index value", id);
      }
    }
    if ((o.kind == OpKind::Store) != (o.result < 0)) fail("op {} ({}) has result %{}", id, name(o.kind), o.result);
    if (o.kind == OpKind::Scan) combine(id, o);
    if (o.result >= 0) define(o.result);
  }

  // A combine function uses only its operands and what it computes from them.
  void combine(int id, const Op& scan) {
    if (scan.combine < 0 || scan.combine >= int(k.combines.size())) fail("scan op {} names combine {}", id, scan.combine);
    const Combine& c = k.combines[size_t(scan.combine)];
    std::vector<bool> outer = defined;
    define(c.a);
    define(c.b);
    for (int o : c.ops) {
      if (o < 0 || o >= int(k.ops.size()) || placed[size_t(o)]) fail("the combine of scan op {} holds op {}", id, o);
      placed[size_t(o)] = true;
      const Op& op = k.op(o);
      for (ValueId v : op.inputs)
        if (v < 0 || v >= int(k.values.size()) || !defined[size_t(v)] || outer[size_t(v)])
          fail("op {} in the combine of scan op {} uses %{}, which the combine does not define", o, id, v);
      if (op.result < 0) fail("op {} in the combine of scan op {} has no result", o, id);
      define(op.result);
    }
    use(c.result, "the combine of scan op", id);
    if (outer[size_t(c.result)]) fail("the combine of scan op {} returns %{} from outside it", id, c.result);
  }

  const Kernel& k;
  std::vector<bool> defined, placed;
};

}  // namespace

void verify(const Kernel& k) { Verifier(k).run(); }

std::optional<BinaryFn> combine_binary(const Kernel& k, const Combine& c) {
  if (c.ops.size() != 1) return std::nullopt;
  const Op& op = k.op(c.ops[0]);
  if (op.kind != OpKind::Binary || op.result != c.result || op.inputs != std::vector<ValueId>{c.a, c.b}) return std::nullopt;
  return op.binary;
}

const char* scan_name(const Kernel& k, const Combine& c) {
  auto fn = combine_binary(k, c);
  return fn == BinaryFn::Add ? "cumsum" : fn == BinaryFn::Mul ? "cumprod" : "associative_scan";
}

}  // namespace deuteron::ir
