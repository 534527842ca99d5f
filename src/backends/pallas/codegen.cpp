#include "backends/pallas/codegen.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "deuteron/error.h"
#include "runtime/text.h"

namespace deuteron::pallas {

namespace {

using ir::OpKind;

// ---- Python text helpers ----------------------------------------------------------------------

// Names a generated identifier must not take: Python keywords and the module's own names.
bool reserved(const std::string& s) {
  static const std::set<std::string> names = {
      "False",   "None",     "True",      "and",    "as",        "assert",    "async",  "await",
      "break",   "class",    "continue",  "def",    "del",       "elif",      "else",   "except",
      "finally", "for",      "from",      "global", "if",        "import",    "in",     "is",
      "lambda",  "nonlocal", "not",       "or",     "pass",      "raise",     "return", "try",
      "while",   "with",     "yield",     "match",  "case",      "type",      "jax",    "jnp",
      "pl",      "pltpu",    "functools", "run",    "interpret", "INTERPRET", "kernel"};
  return names.count(s) > 0;
}

std::string py_name(const std::string& s) {
  std::string out = runtime::identifier(s);
  if (reserved(out)) out += "_";
  return out;
}

// Users' names (and source file names) in comments and docstrings: escaped, so that none can
// end the comment or the docstring and start code.
std::string shown(const std::string& name) { return runtime::escaped(name); }

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string py_tuple(const std::vector<std::string>& v) {
  if (v.size() == 1) return "(" + v[0] + ",)";
  return fmt::format("({})", fmt::join(v, ", "));
}

std::string py_float(double x) {
  if (std::isnan(x)) return "jnp.nan";
  if (std::isinf(x)) return x > 0 ? "jnp.inf" : "-jnp.inf";
  std::string s = fmt::format("{}", x);  // shortest text that reads back as the same double
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// The dtype a value of IR dtype `t` has inside the kernel: floating values are computed in
// float32 (as on the cpu target: bf16/f16 are storage types), integers in int32 (TPUs have no
// 64-bit vector types; Analysis::check_integer_ranges rejects an int64 value that int32 cannot
// hold), booleans as bool.
DType kernel_type(DType t) {
  if (is_floating(t)) return DType::f32;
  if (t == DType::boolean) return DType::boolean;
  return DType::i32;
}

const char* jnp_type(DType t) {
  switch (t) {
    case DType::f32: return "jnp.float32";
    case DType::bf16: return "jnp.bfloat16";
    case DType::f16: return "jnp.float16";
    case DType::i32: return "jnp.int32";
    case DType::i64: return "jnp.int64";
    case DType::boolean: return "jnp.bool_";
  }
  return "jnp.float32";
}

std::string literal(const ir::Constant& c, DType t) {
  if (t == DType::boolean) return c.integer != 0 ? "True" : "False";
  if (!is_floating(t)) return fmt::format("{}", c.integer);
  return py_float(c.real);
}

std::string human_bytes(int64_t b) {
  if (b >= 1024 * 1024) return fmt::format("{:.1f} MiB", double(b) / (1024.0 * 1024.0));
  if (b >= 1024) return fmt::format("{:.1f} KiB", double(b) / 1024.0);
  return fmt::format("{} bytes", b);
}

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// ---- analysis: how the plan maps onto one pallas_call -----------------------------------------

// One operand of the pallas_call: a tensor with one block spec. Accesses with the same block
// spec share it; the same input read with two different specs becomes two operands.
struct Operand {
  int tensor = -1;
  bool output = false;
  std::vector<int64_t> block;           // per tensor dim; 1 for a squeezed dim
  std::vector<bool> squeezed;           // per tensor dim: block dim None (a scalar index)
  std::vector<std::string> block_text;  // per tensor dim: "BLOCK_T0", "None", "300"
  std::vector<std::string> index;       // per tensor dim: block index from the grid indices
  std::vector<int> axis;                // per tensor dim: the axis setting the block, or -1
  std::set<int> grid_axes;              // grid axes its index map depends on
  std::string ref;                      // kernel parameter
  int first_op = -1;
  int buffers = 2;
};

class Analysis {
 public:
  Analysis(const plan::Plan& p, const TpuGeneration& chip) : p(p), k(p.kernel), chip(chip) { run(); }

  const plan::Plan& p;
  const ir::Kernel& k;
  const TpuGeneration& chip;
  int grid_loop = -1;
  std::vector<int64_t> block;            // per axis: the block this target uses (see effective_blocks)
  std::vector<int> grid_pos;             // per axis: position among p.grid_axes, or -1
  std::vector<int64_t> grid_begin;       // per axis: first index the grid loop covers
  std::vector<bool> partial;             // per axis: the last block along it is partial
  std::vector<Operand> operands;         // inputs (tensor order), then outputs (tensor order)
  std::map<int, int> operand_of_op;      // access op -> operand
  std::map<int, std::string> ref_index;  // access op -> "[...]" or "[:, 2:5]"
  std::vector<int> body;                 // ops of the grid loop body, in program order
  std::vector<bool> needed;              // per value: computed in the kernel body

  std::string where(const ir::Op& op) const { return format_location(op.loc); }
  std::string tensor_label(int t) const {
    const ir::HostTensor& h = k.tensors[size_t(t)];
    return fmt::format("{} {}", h.role == ir::HostRole::Input ? "input" : "output", h.name);
  }
  std::string block_param(int axis) const {
    const ir::Axis& ax = k.axes[size_t(axis)];
    return ax.block_param >= 0 ? k.block_params[size_t(ax.block_param)].name : "";
  }
  bool tunable(int axis) const {
    const ir::Axis& ax = k.axes[size_t(axis)];
    return ax.block_param >= 0 && !k.block_params[size_t(ax.block_param)].fixed && !ax.scalar;
  }

 private:
  [[noreturn]] void unsupported(const std::string& construct, const std::string& detail,
                                const std::string& at, const std::string& hint = "") const {
    throw CompileError(
        fmt::format("the pallas target does not support {} yet: kernel '{}' {}", construct, k.name, detail),
        at, hint.empty() ? "run this kernel on the cpu target" : hint);
  }

  void run() {
    const ir::Loop& grid = k.grid_loop();
    grid_loop = int(&grid - k.loops.data());

    // Structure: one grid loop holding straight-line ops.
    for (const ir::Stmt& s : grid.body) {
      if (s.kind == ir::Stmt::Kind::Loop) {
        const ir::Loop& inner = k.loops[size_t(s.id)];
        std::vector<std::string> names;
        for (int a : inner.axes) names.push_back(k.axes[size_t(a)].name);
        unsupported("inner tile loops",
                    fmt::format("has a loop over {} inside its grid loop", fmt::join(names, ", ")),
                    format_location(inner.loc),
                    "use a variant of the kernel that handles the whole dimension in one block "
                    "(e.g. softmax rather than softmax_two_pass), or the cpu target");
      }
      body.push_back(s.id);
    }
    for (size_t i = 0; i < grid.axes.size(); ++i)
      if (grid.begin[i].value >= 0 || grid.end[i].value >= 0)
        unsupported("grid loops with bounds computed on the device", "has one", format_location(grid.loc));

    for (int o : body) {
      const ir::Op& op = k.ops[size_t(o)];
      if (op.kind == OpKind::Dot) unsupported("hl::dot", "multiplies matrices", where(op));
      for (const ir::Index& e : op.index)
        if (e.kind == ir::Index::Kind::Gather) {
          const std::string& t = k.tensors[size_t(op.tensor)].name;
          if (op.atomic_add)
            unsupported("scatter-add (hl::atomic_add at gathered indices)",
                        fmt::format("adds into {} at indices it reads from a tensor", t), where(op));
          unsupported(op.kind == OpKind::Store ? "scatters" : "gathers",
                      fmt::format("indexes {} with a tensor of indices", t), where(op));
        }
      if (op.kind == OpKind::Load || op.kind == OpKind::Store) continue;
      for (ir::ValueId in : op.inputs)
        if (k.value(in).def_op < 0) unsupported("loop-carried values", "uses one", where(op));
    }
    effective_blocks(grid);
    build_operands();
    check_revisits();
    mark_needed();
    check_integer_ranges();
    // Constructs first (CompileError: no config helps), then what the config got wrong.
    if (config_problem) throw *config_problem;
  }

  std::optional<ConfigError> config_problem;

  // A filled output (the target of hl::atomic_add) keeps its block in VMEM across the grid steps
  // that revisit it, which a TPU does only while the steps are consecutive: the grid axes it
  // does not move along must run inside (faster than) those it does.
  void check_revisits() {
    for (const Operand& o : operands) {
      const ir::HostTensor& t = k.tensors[size_t(o.tensor)];
      if (!o.output || !t.fill) continue;
      int last_moving = -1;
      for (size_t i = 0; i < p.grid_axes.size(); ++i)
        if (o.grid_axes.count(p.grid_axes[i])) last_moving = int(i);
      for (int i = 0; i < last_moving; ++i) {
        int a = p.grid_axes[size_t(i)];
        if (o.grid_axes.count(a) || p.grid_blocks[size_t(i)] <= 1 || config_problem) continue;
        config_problem = ConfigError(
            fmt::format("{} is revisited along grid axis {}, which runs outside an axis its blocks move along: a "
                        "TPU writes a block back when the grid moves on, so the additions would not meet",
                        t.name, k.axes[size_t(a)].name),
            format_location(k.loc), fmt::format("choose a grid_order with {} last", k.axes[size_t(a)].name));
      }
    }
  }

  // Block sizes as this target uses them: a tiled axis whose block covers its whole extent in
  // one grid step uses the extent (a block equal to the array dim is always legal on a TPU and
  // never partial); a whole dim must be one block (persistent); fixed dims are their extent.
  void effective_blocks(const ir::Loop& grid) {
    size_t n = k.axes.size();
    block.assign(n, 1);
    grid_pos.assign(n, -1);
    grid_begin.assign(n, 0);
    partial.assign(n, false);
    for (size_t i = 0; i < p.grid_axes.size(); ++i) grid_pos[size_t(p.grid_axes[i])] = int(i);
    for (size_t i = 0; i < grid.axes.size(); ++i) grid_begin[size_t(grid.axes[i])] = grid.begin[i].constant;
    for (size_t a = 0; a < n; ++a) {
      const ir::Axis& ax = k.axes[a];
      int64_t b = p.block[a];
      if (ax.kind == ir::AxisKind::Tile) {
        if (grid_pos[a] < 0)
          unsupported("tiled dims outside the grid loop", fmt::format("tiles dim {} elsewhere", ax.name),
                      format_location(k.loc));
        int64_t begin = grid_begin[a], span = std::max<int64_t>(ax.extent - begin, 0);
        if (begin == 0 && b >= span) b = std::max<int64_t>(span, 1);
        if (begin % b != 0 && !config_problem)
          config_problem = ConfigError(
              fmt::format(
                  "the grid loop over {} starts at {}, which is not a multiple of its block {} = {}: Pallas "
                  "index maps address whole blocks",
                  ax.name, begin, block_param(int(a)), b),
              format_location(k.loc), fmt::format("choose {} dividing {}", block_param(int(a)), begin));
        block[a] = b;
        partial[a] = span % b != 0;
      } else if (ax.kind == ir::AxisKind::Reduction) {
        if (!p.persistent[a]) {
          const ir::BlockParam& bp = k.block_params[size_t(ax.block_param)];
          if (!config_problem)
            config_problem = ConfigError(
                fmt::format(
                    "{} = {} reduces over dim {} (extent {}) in a loop of blocks; the pallas target needs "
                    "the whole dim in one block",
                    bp.name, b, ax.name, ax.extent),
                format_location(k.loc),
                fmt::format("set {} to {} (persistent: the whole dim in one block)", bp.name, bp.max));
        }
        block[a] = ax.extent;
      } else {
        block[a] = ax.extent;
      }
    }
  }

  // A scalar index: the grid index of a one-element (hl::grid) axis (the plan's Scalar term).
  std::string scalar_index(const plan::IndexTerm& t, const ir::Op& op) {
    if (t.grid_axis >= 0 && block[size_t(t.grid_axis)] == 1) {
      int64_t begin = grid_begin[size_t(t.grid_axis)];
      std::string name = py_name(k.axes[size_t(t.grid_axis)].name);
      return begin ? fmt::format("{} + {}", name, begin) : name;
    }
    unsupported("indexing with scalars computed on the device",
                fmt::format("indexes {} with one (only constants and hl::grid indices address whole blocks)",
                            k.tensors[size_t(op.tensor)].name),
                where(op));
  }

  // The pallas_call operands: one per distinct block spec of the grid loop (the plan's
  // de-duplication), its block shape and index map from the spec's index terms.
  void build_operands() {
    std::vector<Operand> found;
    std::map<int, int> found_of_spec;  // spec -> entry of `found`
    for (size_t i = 0; i < p.operands.size(); ++i) {
      const plan::BlockSpec& s = p.operands[i];
      if (s.loop != grid_loop) continue;
      const ir::Op& op = k.ops[size_t(s.op)];
      const ir::HostTensor& t = k.tensors[size_t(s.tensor)];
      if (!s.store && t.role == ir::HostRole::Output)
        unsupported("reading output tensors", fmt::format("reads output {}", t.name), where(op));
      if (s.store && t.role == ir::HostRole::Input)
        unsupported("writing input tensors in place", fmt::format("writes input {}", t.name), where(op));
      if (t.dtype == DType::i64)
        unsupported("int64 tensors",
                    fmt::format("accesses {} (TPUs have no 64-bit vector types)", tensor_label(s.tensor)),
                    where(op), "pass int32 data");
      std::vector<std::string> slices;
      bool sliced = false;
      Operand o;
      o.tensor = s.tensor;
      o.output = s.store;
      o.first_op = s.op;
      for (size_t d = 0; d < s.index_map.size(); ++d) {
        const plan::IndexTerm& e = s.index_map[d];
        int64_t dim = t.shape[d];
        switch (e.kind) {
          case plan::IndexTerm::Kind::Gather:
            unsupported("gathers", fmt::format("indexes {} with a tensor of indices", t.name), where(op));
          case plan::IndexTerm::Kind::Constant:
          case plan::IndexTerm::Kind::Scalar:
            o.block.push_back(1);
            o.squeezed.push_back(true);
            o.block_text.push_back("None");
            o.index.push_back(e.kind == plan::IndexTerm::Kind::Constant ? fmt::format("{}", e.constant)
                                                                       : scalar_index(e, op));
            o.axis.push_back(-1);
            if (e.grid_axis >= 0) o.grid_axes.insert(e.grid_axis);
            continue;
          case plan::IndexTerm::Kind::Block: {
            if (e.offset != 0)
              unsupported("offset slices of a tiled dim",
                          fmt::format("indexes dim {} of {} at {} + {}", d, t.name, k.axes[size_t(e.axis)].name,
                                      e.offset),
                          where(op));
            int64_t b = block[size_t(e.axis)];
            std::string name = py_name(k.axes[size_t(e.axis)].name);
            o.squeezed.push_back(false);
            o.block.push_back(b);
            o.block_text.push_back("BLOCK_" + upper(name));
            o.index.push_back(e.begin / b ? fmt::format("{} + {}", name, e.begin / b) : name);
            o.axis.push_back(e.axis);
            o.grid_axes.insert(e.axis);
            slices.push_back(":");
            continue;
          }
          case plan::IndexTerm::Kind::Whole:
          case plan::IndexTerm::Kind::Looped:  // refused by effective_blocks: a TPU block is whole
            o.squeezed.push_back(false);
            o.index.push_back("0");
            if (e.offset == 0 && k.axes[size_t(e.axis)].extent == dim) {
              // A whole dim (hl::all) or a fixed range covering it: one block, index 0.
              o.block.push_back(dim);
              o.block_text.push_back("BLOCK_" + upper(py_name(k.axes[size_t(e.axis)].name)));
              o.axis.push_back(e.axis);
              slices.push_back(":");
            } else {
              // Part of a dim at a fixed place: the block holds the whole dim, the kernel slices it.
              o.block.push_back(dim);
              o.block_text.push_back(fmt::format("{}", dim));
              o.axis.push_back(-1);
              slices.push_back(fmt::format("{}:{}", e.offset, e.offset + k.axes[size_t(e.axis)].extent));
              sliced = true;
            }
            continue;
        }
      }
      ref_index[s.op] = sliced ? fmt::format("[{}]", fmt::join(slices, ", ")) : "[...]";
      if (s.first != int(i) && found_of_spec.count(s.first)) {
        found_of_spec[int(i)] = found_of_spec[s.first];  // the same block as an earlier access
        continue;
      }
      found_of_spec[int(i)] = int(found.size());
      found.push_back(o);
    }

    // Inputs in tensor order (then first access), then outputs in tensor order.
    std::vector<int> order(found.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      const Operand &a = found[size_t(x)], &b = found[size_t(y)];
      if (a.output != b.output) return !a.output;
      if (a.tensor != b.tensor) return a.tensor < b.tensor;
      return a.first_op < b.first_op;
    });
    std::vector<int> operand_of_found(found.size());
    for (int f : order) {
      const Operand& o = found[size_t(f)];
      if (o.output)
        for (const Operand& other : operands)
          if (other.output && other.tensor == o.tensor)
            unsupported("stores with different block specs to one output",
                        fmt::format("stores to {} with two", k.tensors[size_t(o.tensor)].name),
                        where(k.ops[size_t(o.first_op)]));
      operand_of_found[size_t(f)] = int(operands.size());
      operands.push_back(o);
    }
    for (auto [spec, f] : found_of_spec) operand_of_op[p.operands[size_t(spec)].op] = operand_of_found[size_t(f)];
    // Kernel parameter names: <tensor>_ref, numbered when one tensor is read with several specs.
    std::map<int, int> count, seen;
    for (const Operand& o : operands) ++count[o.tensor];
    for (Operand& o : operands) {
      std::string base = py_name(k.tensors[size_t(o.tensor)].name);
      o.ref = count[o.tensor] > 1 ? fmt::format("{}_ref{}", base, seen[o.tensor]++) : base + "_ref";
      // One buffer when the block is the whole array and never changes; two (the pipeline's
      // double buffering) otherwise.
      bool whole = o.grid_axes.empty();
      for (size_t d = 0; d < o.block.size(); ++d)
        if (o.block[d] != k.tensors[size_t(o.tensor)].shape[d] || o.index[d] != "0") whole = false;
      o.buffers = whole ? 1 : 2;
    }
    for (size_t t = 0; t < k.tensors.size(); ++t) {
      if (k.tensors[t].role != ir::HostRole::Output) continue;
      bool stored = std::any_of(operands.begin(), operands.end(),
                                [&](const Operand& o) { return o.output && o.tensor == int(t); });
      if (!stored)
        unsupported("outputs the grid loop never stores", fmt::format("never stores {}", k.tensors[t].name),
                    format_location(k.loc));
    }
  }

  // ---- integer ranges ----

  // The values an integer may take, bounded from tile extents, constants and the ops. Bounds
  // are clamped to +-2^64: anything beyond int64 is "does not fit" either way.
  struct Range {
    __int128 lo = 0, hi = 0;
  };
  static constexpr __int128 kWide = __int128(1) << 64;
  static Range clamp(__int128 lo, __int128 hi) {
    return {std::clamp(lo, -kWide, kWide), std::clamp(hi, -kWide, kWide)};
  }
  static Range of_dtype(DType t) {
    if (t == DType::boolean) return {0, 1};
    if (t == DType::i32) return {INT32_MIN, INT32_MAX};
    return {INT64_MIN, INT64_MAX};
  }
  static bool fits_int32(const Range& r) { return r.lo >= INT32_MIN && r.hi <= INT32_MAX; }

  Range range(ir::ValueId v) {
    if (auto it = ranges.find(v); it != ranges.end()) return it->second;
    Range r = compute_range(v);
    ranges[v] = r;
    return r;
  }

  Range compute_range(ir::ValueId v) {
    const ir::Value& val = k.value(v);
    if (val.def_op < 0 || is_floating(val.dtype)) return of_dtype(val.dtype);
    const ir::Op& op = k.ops[size_t(val.def_op)];
    auto in = [&](size_t i) { return range(op.inputs[i]); };
    auto extent = [&](int axis) -> __int128 { return axis < 0 ? 1 : k.axes[size_t(axis)].extent; };
    switch (op.kind) {
      case OpKind::Full: return {op.number.integer, op.number.integer};
      case OpKind::ScalarArg: return {INT32_MIN, INT32_MAX};  // the executable checks int64 ones
      case OpKind::TileIndex: return {op.axis < 0 ? 0 : grid_begin[size_t(op.axis)], extent(op.axis) - 1};
      case OpKind::TileBegin:
      case OpKind::TileEnd: return {0, extent(op.axis)};
      case OpKind::TileSize: return {1, block[size_t(op.axis)]};
      case OpKind::View: return in(0);
      case OpKind::Where: {
        Range a = in(1), b = in(2);
        return {std::min(a.lo, b.lo), std::max(a.hi, b.hi)};
      }
      case OpKind::Cast: {
        const ir::Value& from = k.value(op.inputs[0]);
        if (is_floating(from.dtype)) return of_dtype(val.dtype);
        Range r = in(0);
        // To int32 it wraps, as on every target: beyond int32 anything in it is possible.
        return val.dtype == DType::i32 && !fits_int32(r) ? of_dtype(DType::i32) : r;
      }
      case OpKind::Unary:
        if (op.unary == ir::UnaryFn::Neg) return clamp(-in(0).hi, -in(0).lo);
        if (op.unary == ir::UnaryFn::Abs) {
          Range a = in(0);
          __int128 m = std::max(a.hi < 0 ? -a.hi : a.hi, a.lo < 0 ? -a.lo : a.lo);
          return {a.lo >= 0 ? a.lo : a.hi <= 0 ? -a.hi : 0, m};
        }
        return {0, 1};  // logical_not
      case OpKind::Binary: {
        if (ir::is_comparison(op.binary) || op.binary == ir::BinaryFn::And || op.binary == ir::BinaryFn::Or)
          return {0, 1};
        Range a = in(0), b = in(1);
        switch (op.binary) {
          case ir::BinaryFn::Add: return clamp(a.lo + b.lo, a.hi + b.hi);
          case ir::BinaryFn::Sub: return clamp(a.lo - b.hi, a.hi - b.lo);
          case ir::BinaryFn::Mul: {
            __int128 c[4] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
            return clamp(*std::min_element(c, c + 4), *std::max_element(c, c + 4));
          }
          case ir::BinaryFn::Max: return {std::max(a.lo, b.lo), std::max(a.hi, b.hi)};
          case ir::BinaryFn::Min: return {std::min(a.lo, b.lo), std::min(a.hi, b.hi)};
          default: return of_dtype(val.dtype);
        }
      }
      case OpKind::Reduce: {
        Range a = in(0);
        if (op.reduce != ir::ReduceFn::Sum) return a;
        __int128 n = extent(k.value(op.inputs[0]).dims[size_t(op.dim)]);  // at most this many add up
        return clamp(std::min<__int128>(a.lo, 0) * n, std::max<__int128>(a.hi, 0) * n);
      }
      case OpKind::Load: return of_dtype(val.dtype);
      case OpKind::Dot:
      case OpKind::Store: break;
    }
    return of_dtype(val.dtype);
  }

  // A TPU computes integers in 32 bits. An int64 value the body computes must provably fit in
  // int32, or the kernel is rejected naming it: narrowing it would change the result.
  void check_integer_ranges() {
    for (int o : body) {
      const ir::Op& op = k.ops[size_t(o)];
      if (op.result < 0 || !needed[size_t(op.result)] || k.value(op.result).dtype != DType::i64) continue;
      Range r = range(op.result);
      if (fits_int32(r)) continue;
      auto bound = [](__int128 x) {
        return x <= -kWide ? std::string("-2^64") : x >= kWide ? std::string("2^64") : fmt::format("{}", int64_t(x));
      };
      std::string what = op.kind == OpKind::Full
                             ? fmt::format("the int64 constant {}", op.number.integer)
                             : fmt::format("the int64 value %{} ({}), which may take values in [{}, {}]", op.result,
                                           op.kind == OpKind::Binary ? ir::name(op.binary) : ir::name(op.kind),
                                           bound(r.lo), bound(r.hi));
      unsupported("int64 values outside int32",
                  fmt::format("computes {}: TPUs compute integers in 32 bits", what), where(op),
                  "keep integer values within int32 (cast with .to(DType::i32) where 32-bit wrap-around is what "
                  "you want), compute in float32, or run this kernel on the cpu target");
    }
  }

  std::map<ir::ValueId, Range> ranges;

  // Values the body must compute: what stores depend on (index-only values are not needed:
  // the index maps compute them).
  void mark_needed() {
    needed.assign(k.values.size(), false);
    std::vector<ir::ValueId> work;
    for (int o : body) {
      const ir::Op& op = k.ops[size_t(o)];
      if (op.kind == OpKind::Store) work.push_back(op.inputs.back());
    }
    while (!work.empty()) {
      ir::ValueId v = work.back();
      work.pop_back();
      if (needed[size_t(v)]) continue;
      needed[size_t(v)] = true;
      int def = k.value(v).def_op;
      if (def < 0) continue;
      const ir::Op& op = k.ops[size_t(def)];
      if (op.kind == OpKind::Load) continue;  // its index is the operand's index map
      for (ir::ValueId in : op.inputs) work.push_back(in);
    }
  }
};

// Shape of a value in the kernel: one entry per IR dim (size-one dims stay, as 1).
std::vector<int64_t> value_shape(const Analysis& an, ir::ValueId v) {
  std::vector<int64_t> s;
  for (int d : an.k.value(v).dims) s.push_back(d == ir::kOne ? 1 : an.block[size_t(d)]);
  return s;
}

Footprint footprint(const Analysis& an) {
  Footprint f;
  const ir::Kernel& k = an.k;
  for (const Operand& o : an.operands)
    f.operands += int64_t(o.buffers) * padded_vmem_bytes(an.chip, o.block, k.tensors[size_t(o.tensor)].dtype);
  // Peak of the live block values over the body (program order; a value lives from its
  // definition to its last use).
  std::vector<int> last_use(k.values.size(), -1);
  std::vector<int> defined_at(k.values.size(), -1);
  std::vector<int> ops;
  for (int o : an.body) {
    const ir::Op& op = k.ops[size_t(o)];
    if (op.result >= 0 && !an.needed[size_t(op.result)]) continue;
    int pos = int(ops.size());
    ops.push_back(o);
    if (op.result >= 0) defined_at[size_t(op.result)] = pos;
    for (ir::ValueId in : op.inputs) last_use[size_t(in)] = pos;
  }
  for (size_t pos = 0; pos < ops.size(); ++pos) {
    int64_t live = 0;
    for (size_t v = 0; v < k.values.size(); ++v) {
      if (defined_at[v] < 0 || size_t(defined_at[v]) > pos || std::max(last_use[v], defined_at[v]) < int(pos))
        continue;
      live += padded_vmem_bytes(an.chip, value_shape(an, ir::ValueId(v)), kernel_type(k.values[v].dtype));
    }
    f.temporaries = std::max(f.temporaries, live);
  }
  return f;
}

// ---- the generator ----------------------------------------------------------------------------

class Generator {
 public:
  explicit Generator(const Analysis& an) : an_(an), p_(an.p), k_(an.k) {}

  std::string run() {
    std::string kernel_body = kernel();
    header();
    constants();
    out_ += "INTERPRET = pltpu.InterpretParams(\n";
    out_ += "    detect_races=True, out_of_bounds_reads=\"raise\", uninitialized_memory=\"nan\")\n\n\n";
    check_helper();
    out_ += kernel_body;
    out_ += "\n\n";
    launcher();
    return out_;
  }

 private:
  const Analysis& an_;
  const plan::Plan& p_;
  const ir::Kernel& k_;
  std::string out_;
  std::set<int> used_pids_;  // grid positions whose program_id the body reads
  std::map<std::pair<int, std::vector<int>>, std::string> masks_;  // (axis, dims) -> in-range mask

  std::string kernel_name() const { return py_name(k_.name) + "_kernel"; }
  std::string axis_const(int a) const { return "BLOCK_" + upper(py_name(k_.axes[size_t(a)].name)); }
  std::string pid(int a) {
    used_pids_.insert(an_.grid_pos[size_t(a)]);
    return "b_" + py_name(k_.axes[size_t(a)].name);
  }
  // First element index of the current block along tiled axis a.
  std::string block_start(int a) {
    int64_t begin = an_.grid_begin[size_t(a)];
    std::string s = an_.block[size_t(a)] == 1 ? pid(a) : fmt::format("{} * {}", pid(a), axis_const(a));
    return begin ? fmt::format("{} + {}", s, begin) : s;
  }
  static std::string var(ir::ValueId v) { return fmt::format("v{}", v); }

  std::vector<std::string> shape_of(const std::vector<int>& dims) const {
    std::vector<std::string> s;
    for (int d : dims) s.push_back(d == ir::kOne ? "1" : axis_const(d));
    return s;
  }
  std::string dims_text(const std::vector<int>& dims) const {
    std::vector<std::string> s;
    for (int d : dims) s.push_back(ir::dim_name(k_, d));
    return fmt::format("[{}]", fmt::join(s, ", "));
  }

  std::vector<std::string> tensor_comments() const {
    std::vector<std::string> lines;
    for (const ir::HostTensor& t : k_.tensors)
      lines.push_back(fmt::format("{} {}: {}[{}]", t.role == ir::HostRole::Input ? "input " : "output",
                                  shown(t.name), dtype_name(t.dtype), fmt::join(t.shape, ", ")));
    for (const ir::ScalarParam& s : k_.scalars)
      lines.push_back(fmt::format("scalar {}: {}", shown(s.name), dtype_name(s.dtype)));
    return lines;
  }

  void header() {
    Footprint f = footprint(an_);
    const TpuGeneration& chip = an_.chip;
    out_ += fmt::format("# Kernel '{}', generated by Deuteron for the pallas target.\n", shown(k_.name));
    out_ += fmt::format("# config: {}\n", p_.config.dump());
    for (const std::string& l : tensor_comments()) out_ += "# " + l + "\n";
    std::vector<std::string> g;
    for (size_t i = 0; i < p_.grid_axes.size(); ++i)
      g.push_back(fmt::format("{}: {}", k_.axes[size_t(p_.grid_axes[i])].name, p_.grid_blocks[i]));
    out_ += fmt::format("# grid: {} steps ({}), last axis fastest\n", p_.grid_size(), fmt::join(g, ", "));
    out_ += fmt::format(
        "# VMEM on {}: {} operand buffers + {} temporaries = {} with {:.0f}% headroom; scoped limit {}\n",
        chip.name, human_bytes(f.operands), human_bytes(f.temporaries), human_bytes(f.needed()),
        kVmemHeadroom * 100, human_bytes(chip.scoped_vmem_bytes));
    out_ +=
        "# Runs in TPU interpret mode on a CPU by default; run(..., interpret=False) compiles for a TPU.\n";
    out_ += "# Partial edge blocks: out-of-range input elements are garbage (NaN in interpret mode) and\n";
    out_ += "# out-of-range writes are dropped; reductions over a partial block are masked.\n";
    if (!k_.scalars.empty()) out_ += "import functools\n\n";
    out_ += "import jax\n";
    out_ += "import jax.numpy as jnp\n";
    out_ += "from jax.experimental import pallas as pl\n";
    out_ += "from jax.experimental.pallas import tpu as pltpu\n\n";
  }

  void constants() {
    out_ += "# Block sizes in elements, per axis.\n";
    for (size_t a = 0; a < k_.axes.size(); ++a) {
      const ir::Axis& ax = k_.axes[a];
      std::string what;
      if (ax.kind == ir::AxisKind::Tile && ax.scalar) {
        what = fmt::format("grid index {}: one element per step, {} steps", ax.name,
                           ax.extent - an_.grid_begin[a]);
      } else if (ax.kind == ir::AxisKind::Tile) {
        int64_t span = ax.extent - an_.grid_begin[a];
        int64_t blocks = (span + an_.block[a] - 1) / an_.block[a];
        what = fmt::format("tiled dim {}: {} elements in {} block{}{}", ax.name, span, blocks,
                           blocks == 1 ? "" : "s", an_.partial[a] ? ", the last one partial" : "");
        if (an_.block[a] != p_.block[a])
          what += fmt::format(" ({} = {} covers it)", an_.block_param(int(a)), p_.block[a]);
      } else if (ax.kind == ir::AxisKind::Reduction) {
        what = fmt::format("whole dim {}: one block", ax.name);
      } else {
        what = fmt::format("fixed dim {}", ax.name);
      }
      out_ += fmt::format("{} = {}  # {}\n", axis_const(int(a)), an_.block[a], what);
    }
    out_ += "\n";
  }

  void check_helper() {
    out_ += "def _check(name, x, shape, dtype):\n";
    out_ += "    if tuple(x.shape) != shape or x.dtype != dtype:\n";
    out_ += "        raise ValueError(f\"{name}: expected {jnp.dtype(dtype).name}{list(shape)}, \"\n";
    out_ += "                         f\"got {x.dtype}{list(x.shape)}\")\n\n\n";
  }

  // ---- the kernel function ----

  std::string kernel() {
    std::vector<std::string> lines;
    for (int o : an_.body) {
      const ir::Op& op = k_.ops[size_t(o)];
      if (op.result >= 0 && !an_.needed[size_t(op.result)]) continue;
      statement(op, lines);
    }
    std::vector<std::string> params;
    for (const Operand& o : an_.operands) params.push_back(o.ref);
    std::string sig = fmt::format("def {}({}", kernel_name(), fmt::join(params, ", "));
    if (!k_.scalars.empty()) {
      std::vector<std::string> s;
      for (const ir::ScalarParam& sp : k_.scalars) s.push_back(py_name(sp.name));
      sig += fmt::format(", *, {}", fmt::join(s, ", "));
    }
    std::string text = sig + "):\n";
    text += fmt::format(
        "    \"\"\"One grid step of '{}': the grid loop's body on one block of each operand.\"\"\"\n",
        shown(k_.name));
    for (size_t i = 0; i < p_.grid_axes.size(); ++i)
      if (used_pids_.count(int(i)))
        text += fmt::format("    b_{} = pl.program_id({})  # block index along {}\n",
                            py_name(k_.axes[size_t(p_.grid_axes[i])].name), i,
                            k_.axes[size_t(p_.grid_axes[i])].name);
    text += fill_outputs();
    for (const std::string& l : lines) text += "    " + l + "\n";
    return text;
  }

  // Outputs made by hl::zeros / hl::full in host code: each block is set on its first visit,
  // when the grid axes it does not move along (sequential, "arbitrary") are at their start.
  std::string fill_outputs() const {
    std::string text;
    for (const Operand& o : an_.operands) {
      const ir::HostTensor& t = k_.tensors[size_t(o.tensor)];
      if (!o.output || !t.fill) continue;
      std::vector<std::string> first;
      for (size_t i = 0; i < p_.grid_axes.size(); ++i)
        if (!o.grid_axes.count(p_.grid_axes[i]) && p_.grid_blocks[i] > 1)
          first.push_back(fmt::format("pl.program_id({}) == 0", i));
      std::string fill = fmt::format("{}[...] = jnp.full({}.shape, {}, {}.dtype)", o.ref, o.ref,
                                     literal(*t.fill, kernel_type(t.dtype)), o.ref);
      std::string what = fmt::format("{} = {}", shown(t.name), t.fill->real == 0 ? "zeros" : "full");
      if (first.empty()) {
        text += fmt::format("    {}  # {}: each block is visited once\n", fill, what);
      } else {
        std::string when = first.size() == 1 ? first[0] : fmt::format("({})", fmt::join(first, ") & ("));
        text += fmt::format("\n    @pl.when({})\n", when);
        text += fmt::format("    def _fill_{}():  # {}, on the block's first visit\n", py_name(t.name), what);
        text += fmt::format("        {}\n\n", fill);
      }
    }
    return text;
  }

  // Converts a kernel value of IR dtype `from` to IR dtype `to` (rounding to bf16/f16 where
  // the IR casts to them, as the cpu target does).
  static std::string convert(const std::string& e, DType from, DType to) {
    if ((to == DType::bf16 || to == DType::f16) && from != to)
      return fmt::format("{}.astype({}).astype(jnp.float32)", e, jnp_type(to));
    if (to == DType::boolean && from != DType::boolean) return fmt::format("({} != 0)", e);
    if (kernel_type(from) == kernel_type(to)) return e;
    return fmt::format("{}.astype({})", e, jnp_type(kernel_type(to)));
  }

  // Reshapes/transposes/broadcasts `e` (dims `from`) to dims `to`. Without `exact`, a value
  // that already broadcasts to `to` the numpy way (right-aligned, size-one dims) is left alone.
  std::string align(const std::string& e, const std::vector<int>& from, const std::vector<int>& to,
                    bool exact, const ir::Op& op) const {
    if (from == to) return e;
    if (!exact && from.size() <= to.size()) {
      size_t off = to.size() - from.size();
      bool ok = true;
      for (size_t i = 0; i < from.size(); ++i)
        if (from[i] != ir::kOne && from[i] != to[off + i]) ok = false;
      if (ok) return e;
    }
    std::vector<int> src;  // the value's real axes, in order
    for (int d : from)
      if (d != ir::kOne) src.push_back(d);
    std::vector<int> order;  // src axes in the order `to` has them
    for (int d : to)
      if (d != ir::kOne && std::find(src.begin(), src.end(), d) != src.end()) order.push_back(d);
    if (order.size() != src.size())
      throw CompileError(fmt::format("pallas codegen: cannot lay out a value of dims {} as {}",
                                     dims_text(from), dims_text(to)),
                         format_location(op.loc), "this is a bug in the pallas target; please report it");
    std::string x = e;
    if (order != src) {
      if (from != src) x = fmt::format("{}.reshape({})", x, py_tuple(shape_of(src)));
      std::vector<std::string> perm;
      for (int d : order)
        perm.push_back(fmt::format("{}", std::find(src.begin(), src.end(), d) - src.begin()));
      x = fmt::format("jnp.transpose({}, {})", x, py_tuple(perm));
    }
    std::vector<int> mid;  // `to` with size one wherever the value has no axis
    bool broadcast = false;
    for (int d : to) {
      bool have = d != ir::kOne && std::find(src.begin(), src.end(), d) != src.end();
      mid.push_back(have ? d : ir::kOne);
      if (d != ir::kOne && !have) broadcast = true;
    }
    std::vector<int> now = order != src ? order : from;
    if (now != mid) x = fmt::format("{}.reshape({})", x, py_tuple(shape_of(mid)));
    if (broadcast && exact) x = fmt::format("jnp.broadcast_to({}, {})", x, py_tuple(shape_of(to)));
    return x;
  }

  // A boolean block of `dims` that is true where dim `pos` (tiled axis `axis`) is in range;
  // emitted once per axis and shape.
  std::string valid_mask(int axis, const std::vector<int>& dims, int pos, std::vector<std::string>& lines) {
    auto key = std::make_pair(axis, dims);
    auto it = masks_.find(key);
    if (it != masks_.end()) return it->second;
    std::string base = fmt::format("valid_{}", py_name(k_.axes[size_t(axis)].name)), name = base;
    for (int n = 1;
         std::any_of(masks_.begin(), masks_.end(), [&](const auto& m) { return m.second == name; }); ++n)
      name = fmt::format("{}_{}", base, n);
    lines.push_back(
        fmt::format("{} = {} + jax.lax.broadcasted_iota(jnp.int32, {}, {}) < {}  # in range along {} "
                    "(its last block is partial)",
                    name, block_start(axis), py_tuple(shape_of(dims)), pos, k_.axes[size_t(axis)].extent,
                    k_.axes[size_t(axis)].name));
    masks_[key] = name;
    return name;
  }

  static const char* reduce_fn(ir::ReduceFn f) {
    switch (f) {
      case ir::ReduceFn::Sum: return "jnp.sum";
      case ir::ReduceFn::Max: return "jnp.max";
      case ir::ReduceFn::Min: return "jnp.min";
    }
    return "jnp.sum";
  }
  static std::string identity(ir::ReduceFn f, DType t) {
    DType kt = kernel_type(t);
    switch (f) {
      case ir::ReduceFn::Sum: return kt == DType::f32 ? "0.0" : kt == DType::boolean ? "False" : "0";
      case ir::ReduceFn::Max:
        return kt == DType::f32 ? "-jnp.inf" : kt == DType::boolean ? "False" : "jnp.iinfo(jnp.int32).min";
      case ir::ReduceFn::Min:
        return kt == DType::f32 ? "jnp.inf" : kt == DType::boolean ? "True" : "jnp.iinfo(jnp.int32).max";
    }
    return "0";
  }

  std::string unary(ir::UnaryFn f, const std::string& x) const {
    switch (f) {
      case ir::UnaryFn::Neg: return "-" + x;
      case ir::UnaryFn::Not: return fmt::format("jnp.logical_not({})", x);
      case ir::UnaryFn::Exp: return fmt::format("jnp.exp({})", x);
      case ir::UnaryFn::Exp2: return fmt::format("jnp.exp2({})", x);
      case ir::UnaryFn::Log: return fmt::format("jnp.log({})", x);
      case ir::UnaryFn::Sqrt: return fmt::format("jnp.sqrt({})", x);
      case ir::UnaryFn::Rsqrt: return fmt::format("jax.lax.rsqrt({})", x);
      case ir::UnaryFn::Tanh: return fmt::format("jnp.tanh({})", x);
      case ir::UnaryFn::Sigmoid: return fmt::format("jax.nn.sigmoid({})", x);
      case ir::UnaryFn::Silu: return fmt::format("jax.nn.silu({})", x);
      case ir::UnaryFn::GeluTanh: return fmt::format("jax.nn.gelu({}, approximate=True)", x);
      case ir::UnaryFn::GeluErf: return fmt::format("jax.nn.gelu({}, approximate=False)", x);
      case ir::UnaryFn::Abs: return fmt::format("jnp.abs({})", x);
      case ir::UnaryFn::Erf: return fmt::format("jax.lax.erf({})", x);
    }
    return x;
  }

  static std::string binary(ir::BinaryFn f, const std::string& a, const std::string& b) {
    switch (f) {
      case ir::BinaryFn::Add: return fmt::format("{} + {}", a, b);
      case ir::BinaryFn::Sub: return fmt::format("{} - {}", a, b);
      case ir::BinaryFn::Mul: return fmt::format("{} * {}", a, b);
      case ir::BinaryFn::Div: return fmt::format("{} / {}", a, b);
      case ir::BinaryFn::Max: return fmt::format("jnp.maximum({}, {})", a, b);
      case ir::BinaryFn::Min: return fmt::format("jnp.minimum({}, {})", a, b);
      case ir::BinaryFn::Eq: return fmt::format("{} == {}", a, b);
      case ir::BinaryFn::Ne: return fmt::format("{} != {}", a, b);
      case ir::BinaryFn::Lt: return fmt::format("{} < {}", a, b);
      case ir::BinaryFn::Le: return fmt::format("{} <= {}", a, b);
      case ir::BinaryFn::Gt: return fmt::format("{} > {}", a, b);
      case ir::BinaryFn::Ge: return fmt::format("{} >= {}", a, b);
      case ir::BinaryFn::And: return fmt::format("jnp.logical_and({}, {})", a, b);
      case ir::BinaryFn::Or: return fmt::format("jnp.logical_or({}, {})", a, b);
    }
    return a;
  }

  // Dims of the block an access reads or writes, in tensor-dim order (squeezed dims dropped).
  std::vector<int> access_dims(const ir::Op& op) const {
    std::vector<int> dims;
    for (const ir::Index& e : op.index)
      if (e.kind == ir::Index::Kind::Axis) dims.push_back(e.axis);
    return dims;
  }

  void statement(const ir::Op& op, std::vector<std::string>& lines) {
    std::string loc = shown(format_location(op.loc));
    auto in = [&](size_t i) { return var(op.inputs[i]); };
    auto in_dtype = [&](size_t i) { return k_.value(op.inputs[i]).dtype; };
    auto in_dims = [&](size_t i) { return k_.value(op.inputs[i]).dims; };
    if (op.kind == OpKind::Store) {
      const Operand& o = an_.operands[size_t(an_.operand_of_op.at(int(&op - k_.ops.data())))];
      std::string v =
          align(in(op.inputs.size() - 1), in_dims(op.inputs.size() - 1), access_dims(op), true, op);
      // hl::atomic_add: the grid steps that add into one block run one after another on a
      // TPU core (the block's revisits make its grid axes "arbitrary"), so a plain += is exact.
      lines.push_back(fmt::format("{}{} {}= {}.astype({}.dtype)  # {} {}  ({})", o.ref,
                                  an_.ref_index.at(int(&op - k_.ops.data())), op.atomic_add ? "+" : "", v, o.ref,
                                  op.atomic_add ? "atomic_add into" : "store", shown(k_.tensors[size_t(op.tensor)].name), loc));
      return;
    }
    const ir::Value& r = k_.value(op.result);
    std::string e;
    std::string what = ir::name(op.kind);
    switch (op.kind) {
      case OpKind::Load: {
        int id = int(&op - k_.ops.data());
        const Operand& o = an_.operands[size_t(an_.operand_of_op.at(id))];
        DType stored = k_.tensors[size_t(op.tensor)].dtype;
        e = fmt::format("{}{}", o.ref, an_.ref_index.at(id));
        if (kernel_type(stored) != stored || kernel_type(r.dtype) != kernel_type(stored))
          e = fmt::format("{}.astype({})", e, jnp_type(kernel_type(r.dtype)));
        e = align(e, access_dims(op), r.dims, true, op);
        what = "load " + shown(k_.tensors[size_t(op.tensor)].name);
        break;
      }
      case OpKind::Full: {
        std::string value = literal(op.number, kernel_type(r.dtype));
        if (r.dims.empty())
          e = fmt::format("{}({})", jnp_type(kernel_type(r.dtype)), value);
        else
          e = fmt::format("jnp.full({}, {}, {})", py_tuple(shape_of(r.dims)), value,
                          jnp_type(kernel_type(r.dtype)));
        break;
      }
      case OpKind::ScalarArg:
        e = fmt::format("{}({})", jnp_type(kernel_type(r.dtype)),
                        py_name(k_.scalars[size_t(op.scalar)].name));
        what = "scalar " + shown(k_.scalars[size_t(op.scalar)].name);
        break;
      case OpKind::TileIndex: {
        const ir::Axis& ax = k_.axes[size_t(op.axis)];
        auto pos = std::find(r.dims.begin(), r.dims.end(), op.axis);
        bool tiled = ax.kind == ir::AxisKind::Tile;
        if (pos == r.dims.end()) {  // a scalar: the index of a one-element block
          e = tiled ? block_start(op.axis) : "0";
          e = fmt::format("jnp.int32({})", e);
        } else {
          e = fmt::format("jax.lax.broadcasted_iota(jnp.int32, {}, {})", py_tuple(shape_of(r.dims)),
                          pos - r.dims.begin());
          if (tiled) e = fmt::format("{} + {}", block_start(op.axis), e);
        }
        what = "tile_index " + ax.name;
        break;
      }
      case OpKind::TileBegin: {
        bool tiled = k_.axes[size_t(op.axis)].kind == ir::AxisKind::Tile;
        e = fmt::format("jnp.int32({})", tiled ? block_start(op.axis) : "0");
        what = "tile_begin " + k_.axes[size_t(op.axis)].name;
        break;
      }
      case OpKind::TileEnd: {
        const ir::Axis& ax = k_.axes[size_t(op.axis)];
        if (ax.kind == ir::AxisKind::Tile)
          e = fmt::format("jnp.minimum({} + {}, {})", block_start(op.axis), axis_const(op.axis), ax.extent);
        else
          e = fmt::format("jnp.int32({})", ax.extent);
        what = "tile_end " + ax.name;
        break;
      }
      case OpKind::TileSize:
        e = fmt::format("jnp.int32({})", axis_const(op.axis));
        what = "tile_size " + k_.axes[size_t(op.axis)].name;
        break;
      case OpKind::Unary: {
        DType t = ir::operand_dtype(op.unary, in_dtype(0));
        e = unary(op.unary, align(convert(in(0), in_dtype(0), t), in_dims(0), r.dims, false, op));
        what = ir::name(op.unary);
        break;
      }
      case OpKind::Binary: {
        DType t = ir::operand_dtype(op.binary, promote(in_dtype(0), in_dtype(1)));
        e = binary(op.binary, align(convert(in(0), in_dtype(0), t), in_dims(0), r.dims, false, op),
                   align(convert(in(1), in_dtype(1), t), in_dims(1), r.dims, false, op));
        what = ir::name(op.binary);
        break;
      }
      case OpKind::Where:
        e = fmt::format("jnp.where({}, {}, {})",
                        align(convert(in(0), in_dtype(0), DType::boolean), in_dims(0), r.dims, false, op),
                        align(convert(in(1), in_dtype(1), r.dtype), in_dims(1), r.dims, false, op),
                        align(convert(in(2), in_dtype(2), r.dtype), in_dims(2), r.dims, false, op));
        break;
      case OpKind::Cast:
        e = convert(in(0), in_dtype(0), r.dtype);
        what = fmt::format("cast to {}", dtype_name(r.dtype));
        break;
      case OpKind::View: e = align(in(0), in_dims(0), r.dims, true, op); break;
      case OpKind::Reduce: {
        std::string x = convert(in(0), in_dtype(0), r.dtype);
        int axis = in_dims(0)[size_t(op.dim)];
        if (axis != ir::kOne && an_.partial[size_t(axis)]) {
          // The last block along a tiled axis is partial: its out-of-range elements are
          // garbage, so they must not reach the reduction.
          std::string mask = valid_mask(axis, in_dims(0), op.dim, lines);
          lines.push_back(
              fmt::format("m{} = jnp.where({}, {}, {})", op.result, mask, x, identity(op.reduce, r.dtype)));
          x = fmt::format("m{}", op.result);
        }
        e = fmt::format("{}({}, axis={}{})", reduce_fn(op.reduce), x, op.dim,
                        op.keepdim ? ", keepdims=True" : "");
        what = fmt::format("{} over {}", ir::name(op.reduce), ir::dim_name(k_, axis));
        break;
      }
      case OpKind::Dot:
      case OpKind::Store: break;
    }
    lines.push_back(fmt::format("{} = {}  # {}: {}{}  ({})", var(op.result), e, what, dtype_name(r.dtype),
                                dims_text(r.dims), loc));
  }

  // ---- run(): the pallas_call ----

  std::string spec(const Operand& o) const {
    std::vector<std::string> args;
    for (const int a : p_.grid_axes) args.push_back(py_name(k_.axes[size_t(a)].name));
    std::string lambda = args.empty() ? "lambda" : fmt::format("lambda {}", fmt::join(args, ", "));
    return fmt::format("pl.BlockSpec({}, {}: {})", py_tuple(o.block_text), lambda, py_tuple(o.index));
  }

  void launcher() {
    std::vector<std::string> inputs, outputs;
    for (const ir::HostTensor& t : k_.tensors)
      (t.role == ir::HostRole::Input ? inputs : outputs).push_back(py_name(t.name));
    std::vector<std::string> params = inputs;
    std::vector<std::string> kw;
    for (const ir::ScalarParam& s : k_.scalars) kw.push_back(py_name(s.name));
    kw.push_back("interpret=None");
    out_ += fmt::format("def run({}{}*, {}):\n", fmt::join(params, ", "), params.empty() ? "" : ", ",
                        fmt::join(kw, ", "));
    std::vector<std::string> doc_in, doc_out;
    for (const ir::HostTensor& t : k_.tensors)
      (t.role == ir::HostRole::Input ? doc_in : doc_out)
          .push_back(
              fmt::format("{} {}[{}]", py_name(t.name), dtype_name(t.dtype), fmt::join(t.shape, ", ")));
    out_ += fmt::format("    \"\"\"{}: {} -> {}.\n\n", shown(k_.name), fmt::join(doc_in, ", "),
                        fmt::join(doc_out, ", "));
    out_ += "    interpret: None runs in TPU interpret mode (INTERPRET); False compiles for a TPU.\n";
    out_ += "    \"\"\"\n";
    for (const ir::HostTensor& t : k_.tensors) {
      if (t.role != ir::HostRole::Input) continue;
      std::vector<std::string> shape;
      for (int64_t d : t.shape) shape.push_back(fmt::format("{}", d));
      out_ += fmt::format("    _check(\"{}\", {}, {}, {})\n", py_name(t.name), py_name(t.name),
                          py_tuple(shape), jnp_type(t.dtype));
    }
    out_ += "    if interpret is None:\n";
    out_ += "        interpret = INTERPRET\n";
    std::string kernel = kernel_name();
    if (!k_.scalars.empty()) {
      std::vector<std::string> bind;
      for (const ir::ScalarParam& s : k_.scalars) bind.push_back(fmt::format("{0}={0}", py_name(s.name)));
      kernel = fmt::format("functools.partial({}, {})", kernel, fmt::join(bind, ", "));
    }
    std::vector<std::string> shapes, out_specs, in_specs, call_args;
    for (const Operand& o : an_.operands) {
      const ir::HostTensor& t = k_.tensors[size_t(o.tensor)];
      if (o.output) {
        std::vector<std::string> shape;
        for (int64_t d : t.shape) shape.push_back(fmt::format("{}", d));
        shapes.push_back(fmt::format("jax.ShapeDtypeStruct({}, {})", py_tuple(shape), jnp_type(t.dtype)));
        out_specs.push_back(spec(o));
      } else {
        in_specs.push_back(spec(o));
        call_args.push_back(py_name(t.name));
      }
    }
    std::vector<std::string> semantics;
    for (size_t i = 0; i < p_.grid_axes.size(); ++i) {
      int a = p_.grid_axes[i];
      // An axis some output block does not move along revisits that block: sequential.
      bool revisits = false;
      for (const Operand& o : an_.operands)
        if (o.output && !o.grid_axes.count(a) && p_.grid_blocks[i] > 1) revisits = true;
      semantics.push_back(revisits ? "\"arbitrary\"" : "\"parallel\"");
    }
    std::vector<std::string> grid;
    for (int64_t b : p_.grid_blocks) grid.push_back(fmt::format("{}", b));
    out_ += "    return pl.pallas_call(\n";
    out_ += fmt::format("        {},\n", kernel);
    if (shapes.size() == 1) {
      out_ += fmt::format("        out_shape={},\n", shapes[0]);
    } else {
      out_ += "        out_shape=(\n";
      for (const auto& s : shapes) out_ += fmt::format("            {},\n", s);
      out_ += "        ),\n";
    }
    out_ += fmt::format("        grid={},\n", py_tuple(grid));
    out_ += "        in_specs=[\n";
    for (size_t i = 0; i < in_specs.size(); ++i)
      out_ += fmt::format("            {},  # {}\n", in_specs[i], call_args[i]);
    out_ += "        ],\n";
    if (out_specs.size() == 1) {
      out_ += fmt::format("        out_specs={},\n", out_specs[0]);
    } else {
      out_ += "        out_specs=[\n";
      for (const auto& s : out_specs) out_ += fmt::format("            {},\n", s);
      out_ += "        ],\n";
    }
    out_ += fmt::format("        compiler_params=pltpu.CompilerParams(dimension_semantics={}),\n",
                        py_tuple(semantics));
    out_ += "        interpret=interpret,\n";
    out_ += fmt::format("        name=\"{}\",\n", entry_name(p_));
    out_ += fmt::format("    )({})\n", fmt::join(call_args, ", "));
  }
};

}  // namespace

int64_t Footprint::needed() const { return int64_t(std::ceil(double(total()) * (1.0 + kVmemHeadroom))); }

std::string python_name(const std::string& name) { return py_name(name); }

std::string entry_name(const plan::Plan& p) { return "deuteron_" + py_name(p.kernel.name); }

Footprint vmem_footprint(const plan::Plan& p, const TpuGeneration& chip) {
  return footprint(Analysis(p, chip));
}

void check_expressible(const plan::Plan& p, const TpuGeneration& chip) {
  try {
    Analysis an(p, chip);  // throws CompileError for a construct before any config problem
  } catch (const ConfigError&) {
  }
}

Footprint check(const plan::Plan& p, const TpuGeneration& chip) {
  // Constructs the target cannot express are no config's fault: emit() and compile() report
  // them (CompileError). Here only what a config decides: blocks and VMEM (ConfigError).
  std::optional<Analysis> analysis;
  try {
    analysis.emplace(p, chip);
  } catch (const CompileError&) {
    return {};
  }
  const Analysis& an = *analysis;
  const ir::Kernel& k = p.kernel;

  // The block-shape rule: the last two dims of a block are multiples of 8 and 128, or the
  // array's whole dims. (Interpret mode does not check it; a TPU compile would fail.)
  for (const Operand& o : an.operands) {
    const ir::HostTensor& t = k.tensors[size_t(o.tensor)];
    size_t rank = t.shape.size();
    for (size_t back = 0; back < std::min<size_t>(rank, 2); ++back) {
      size_t d = rank - 1 - back;
      int64_t multiple = back == 0 ? chip.lanes : chip.sublanes;
      int64_t b = o.block[d], full = t.shape[d];
      if (b == full || b % multiple == 0) continue;
      int axis = o.axis[d];
      std::string which = back == 0 ? "last" : "second-to-last";
      std::string source = o.squeezed[d] ? "a scalar index (block size 1)"
                           : axis >= 0 && !an.block_param(axis).empty()
                               ? fmt::format("{} = {}", an.block_param(axis), p.block[size_t(axis)])
                               : "a fixed block";
      std::string hint;
      if (axis >= 0 && an.tunable(axis)) {
        int64_t extent = k.axes[size_t(axis)].extent;
        int64_t want = std::min(multiple, next_pow2(extent));
        hint = fmt::format(
            "set {} to {} or more (e.g. config {{\"{}\": {}}}): a multiple of {}, or a block covering all "
            "{} elements of the dim",
            an.block_param(axis), want, an.block_param(axis), want, multiple, extent);
      } else {
        hint = fmt::format(
            "no config changes this block: the access itself gives the {} dim a block of {}; the "
            "pallas target cannot run it on a TPU (use the cpu target)",
            which, b);
      }
      std::vector<std::string> shown;
      for (size_t i = 0; i < o.block.size(); ++i)
        shown.push_back(o.squeezed[i] ? "None" : fmt::format("{}", o.block[i]));
      throw ConfigError(
          fmt::format("pallas: the block [{}] of {} ({}[{}]) breaks the TPU block-shape rule: its {} "
                      "dim is {} ({}), which must be a multiple of {} or the whole dim ({})",
                      fmt::join(shown, ", "), an.tensor_label(o.tensor), dtype_name(t.dtype),
                      fmt::join(t.shape, ", "), which, b, source, multiple, full),
          format_location(k.ops[size_t(o.first_op)].loc), hint);
    }
  }

  // VMEM: the pipeline's buffers and the body's temporaries must fit the scoped limit.
  Footprint f = footprint(an);
  if (f.needed() > chip.scoped_vmem_bytes) {
    std::vector<std::string> params;
    for (int a : p.grid_axes)
      if (an.tunable(a)) params.push_back(an.block_param(a));
    throw ConfigError(
        fmt::format("pallas: config {} needs {} of VMEM on {} ({} of double-buffered operand blocks + {} of "
                    "temporaries + {:.0f}% headroom); its default scoped VMEM limit is {}{}",
                    p.config.dump(), human_bytes(f.needed()), chip.name, human_bytes(f.operands),
                    human_bytes(f.temporaries), kVmemHeadroom * 100, human_bytes(chip.scoped_vmem_bytes),
                    chip.scoped_vmem_uncertain ? " (an uncertain figure)" : ""),
        format_location(k.loc),
        params.empty() ? "the kernel's blocks are fixed; it cannot run on this TPU generation"
                       : fmt::format("use smaller blocks ({})", fmt::join(params, ", ")));
  }
  return f;
}

std::string generate(const plan::Plan& p, const TpuGeneration& chip) {
  Analysis an(p, chip);
  return Generator(an).run();
}

}  // namespace deuteron::pallas
