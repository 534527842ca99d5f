#include "ir/ir.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

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
    case OpKind::Store: return "store";
  }
  return "?";
}

const char* name(UnaryFn f) {
  switch (f) {
    case UnaryFn::Neg: return "neg";
    case UnaryFn::Exp: return "exp";
    case UnaryFn::Exp2: return "exp2";
    case UnaryFn::Log: return "log";
    case UnaryFn::Sqrt: return "sqrt";
    case UnaryFn::Rsqrt: return "rsqrt";
    case UnaryFn::Tanh: return "tanh";
    case UnaryFn::Sigmoid: return "sigmoid";
    case UnaryFn::Silu: return "silu";
    case UnaryFn::GeluTanh: return "gelu_tanh";
    case UnaryFn::GeluErf: return "gelu";
    case UnaryFn::Abs: return "abs";
    case UnaryFn::Not: return "logical_not";
    case UnaryFn::Erf: return "erf";
  }
  return "?";
}

const char* name(BinaryFn f) {
  switch (f) {
    case BinaryFn::Add: return "add";
    case BinaryFn::Sub: return "sub";
    case BinaryFn::Mul: return "mul";
    case BinaryFn::Div: return "div";
    case BinaryFn::Max: return "maximum";
    case BinaryFn::Min: return "minimum";
    case BinaryFn::Eq: return "eq";
    case BinaryFn::Ne: return "ne";
    case BinaryFn::Lt: return "lt";
    case BinaryFn::Le: return "le";
    case BinaryFn::Gt: return "gt";
    case BinaryFn::Ge: return "ge";
    case BinaryFn::And: return "logical_and";
    case BinaryFn::Or: return "logical_or";
  }
  return "?";
}

const char* name(ReduceFn f) {
  switch (f) {
    case ReduceFn::Sum: return "sum";
    case ReduceFn::Max: return "amax";
    case ReduceFn::Min: return "amin";
  }
  return "?";
}

bool is_comparison(BinaryFn f) {
  return f == BinaryFn::Eq || f == BinaryFn::Ne || f == BinaryFn::Lt || f == BinaryFn::Le ||
         f == BinaryFn::Gt || f == BinaryFn::Ge;
}

const Loop& Kernel::grid_loop() const {
  for (const Stmt& s : top)
    if (s.kind == Stmt::Kind::Loop) return loops.at(size_t(s.id));
  throw std::logic_error("kernel has no grid loop");
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

std::string index_text(const Kernel& k, const std::vector<Index>& index) {
  std::vector<std::string> parts;
  for (const Index& e : index) {
    switch (e.kind) {
      case Index::Kind::Axis: {
        const Axis& ax = k.axes[size_t(e.axis)];
        std::string s = ax.kind == AxisKind::Reduction ? ":" : ax.name;
        if (ax.kind == AxisKind::Fixed) s = fmt::format("{}:{}", e.offset, e.offset + ax.extent);
        parts.push_back(s);
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

void print_body(const Kernel& k, const std::vector<Stmt>& body, int indent, std::string& out) {
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
      print_body(k, l.body, indent + 1, out);
      continue;
    }
    const Op& op = k.ops[size_t(s.id)];
    std::string lhs = op.result >= 0 ? fmt::format("%{}: {} = ", op.result, value_type(k, op.result)) : "";
    std::vector<std::string> in;
    for (ValueId v : op.inputs) in.push_back(fmt::format("%{}", v));
    std::string rhs;
    switch (op.kind) {
      case OpKind::Load:
        rhs = fmt::format("load {}[{}]", k.tensors[size_t(op.tensor)].name, index_text(k, op.index));
        break;
      case OpKind::Store:
        rhs = fmt::format("{} {}[{}]{} %{}", op.atomic_add ? "atomic_add" : "store", k.tensors[size_t(op.tensor)].name,
                          index_text(k, op.index), op.atomic_add ? "," : " =", op.inputs.back());
        break;
      case OpKind::Full: rhs = fmt::format("full {}", op.number); break;
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
      default: rhs = fmt::format("{} {}", name(op.kind), fmt::join(in, ", ")); break;
    }
    out += fmt::format("{}{}{}    # {}:{}\n", pad, lhs, rhs, op.loc.file_name(), op.loc.line());
  }
}

}  // namespace

std::string print(const Kernel& k) {
  std::string out = fmt::format("kernel {}(", k.name);
  std::vector<std::string> params;
  for (const auto& t : k.tensors)
    if (t.role == HostRole::Input)
      params.push_back(fmt::format("{}: {}[{}]", t.name, dtype_name(t.dtype), fmt::join(t.shape, ", ")));
  for (const auto& s : k.scalars) params.push_back(fmt::format("{}: {}", s.name, dtype_name(s.dtype)));
  out += fmt::format("{}) -> (", fmt::join(params, ", "));
  std::vector<std::string> outs;
  for (int o : k.outputs) {
    const auto& t = k.tensors[size_t(o)];
    outs.push_back(fmt::format("{}: {}[{}]", t.name, dtype_name(t.dtype), fmt::join(t.shape, ", ")));
  }
  out += fmt::format("{})\n", fmt::join(outs, ", "));
  for (const auto& t : k.tensors)
    if (t.role == HostRole::Output)
      out += fmt::format("  {} = {}([{}], {}{})\n", t.name, !t.fill ? "empty" : *t.fill == 0 ? "zeros" : "full",
                         fmt::join(t.shape, ", "), t.fill && *t.fill != 0 ? fmt::format("{}, ", *t.fill) : "",
                         dtype_name(t.dtype));
  for (const auto& p : k.block_params)
    out += fmt::format("  block size {}: {}\n", p.name,
                       p.fixed ? fmt::format("fixed {}", p.fixed)
                               : fmt::format("tunable {}..{}{}", p.min, p.max,
                                             p.reduction ? " (reduction: persistent at max)" : ""));
  print_body(k, k.top, 1, out);
  return out;
}

namespace {
void count_uses(const Kernel& k, const std::vector<Stmt>& body, std::vector<int>& uses) {
  for (const Stmt& s : body) {
    if (s.kind == Stmt::Kind::Loop) {
      const Loop& l = k.loops[size_t(s.id)];
      for (const auto& b : l.begin)
        if (b.value >= 0) ++uses[size_t(b.value)];
      for (const auto& b : l.end)
        if (b.value >= 0) ++uses[size_t(b.value)];
      for (const auto& c : l.carried) {
        ++uses[size_t(c.init)];
        ++uses[size_t(c.next)];
      }
      count_uses(k, l.body, uses);
      continue;
    }
    for (ValueId v : k.ops[size_t(s.id)].inputs) ++uses[size_t(v)];
  }
}

}  // namespace

std::vector<int> use_counts(const Kernel& k) {
  std::vector<int> uses(k.values.size(), 0);
  count_uses(k, k.top, uses);
  return uses;
}

}  // namespace deuteron::ir
