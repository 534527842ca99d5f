#include "backends/triton/codegen.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "backends/python/source.h"
#include "deuteron/error.h"
#include "plan/reduce_loops.h"
#include "runtime/text.h"

namespace deuteron::triton {

namespace {

using ir::OpKind;
using Lines = std::vector<std::string>;

// ---- Python text helpers ----------------------------------------------------------------------

// Names a generated identifier must not take besides Python's keywords: the module's own.
const std::set<std::string> kModuleNames = {"torch", "triton", "tl", "run", "pid", "float", "range", "min", "max", "kernel"};

std::string py_name(const std::string& s) { return python::identifier(s, kModuleNames); }

std::string shown(const std::string& s) { return runtime::escaped(s); }

using python::upper;

std::string py_tuple(const std::vector<std::string>& v) { return python::tuple(v); }
std::string py_list(const std::vector<std::string>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }

std::string py_float(double x) { return python::float_literal(x, "float(\"inf\")", "float(\"nan\")"); }

using python::human_bytes;

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}
bool pow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// Values are computed in f32 when floating (bf16 and f16 are storage types, as on the other
// targets), in their own type otherwise.
DType kernel_type(DType t) { return is_floating(t) ? DType::f32 : t; }

const char* tl_type(DType t) {
  switch (t) {
    case DType::f32: return "tl.float32";
    case DType::bf16: return "tl.bfloat16";
    case DType::f16: return "tl.float16";
    case DType::i32: return "tl.int32";
    case DType::i64: return "tl.int64";
    case DType::boolean: return "tl.int1";
  }
  return "tl.float32";
}

const char* torch_type(DType t) {
  switch (t) {
    case DType::f32: return "torch.float32";
    case DType::bf16: return "torch.bfloat16";
    case DType::f16: return "torch.float16";
    case DType::i32: return "torch.int32";
    case DType::i64: return "torch.int64";
    case DType::boolean: return "torch.bool";
  }
  return "torch.float32";
}

// The functions the module spells as @triton.jit helpers (tl.math and plain Triton only:
// libdevice's log1p, expm1, pow and rint do not run under the interpreter), each written into a
// module only when its kernel uses it.
constexpr const char* kRoundHelper = R"(@triton.jit
def _round(x):
    """torch.round: halves to even; the sign of a zero result is x's."""
    f = tl.floor(x)
    d = x - f
    odd = f - 2.0 * tl.floor(0.5 * f) == 1.0
    r = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
    return tl.where(r == 0.0, x * 0.0, r)
)";
constexpr const char* kLog1pHelper = R"(@triton.jit
def _log1p(x):
    """log(1 + x), accurate near 0: log(u) * x / (u - 1) with u = 1 + x (Goldberg)."""
    u = 1.0 + x
    return tl.where((u == 1.0) | (u == float("inf")), x, tl.log(u) * (x / (u - 1.0)))
)";
constexpr const char* kExpm1Helper = R"(@triton.jit
def _expm1(x):
    """exp(x) - 1, accurate near 0: (u - 1) * x / log(u) with u = exp(x) (Kahan)."""
    u = tl.exp(x)
    r = tl.where(u == 1.0, x, (u - 1.0) * (x / tl.log(u)))
    r = tl.where(u - 1.0 == -1.0, -1.0, r)
    return tl.where(u == float("inf"), u, r)
)";
constexpr const char* kPowHelper = R"(@triton.jit
def _pow(a, b):
    """C's powf (torch.pow): |a| ** b from float64 exp2 and log2, then the sign and special cases."""
    a, b = tl.broadcast(a, b)  # (the interpreter cannot & a scalar condition with a block one)
    a64 = a.to(tl.float64)
    b64 = b.to(tl.float64)
    r = tl.exp2(b64 * tl.log2(tl.abs(a64)))
    whole = tl.floor(b64) == b64
    odd = whole & (tl.floor(0.5 * b64) * 2.0 != b64)
    r = tl.where((a.to(tl.int32, bitcast=True) < 0) & odd, -r, r)  # the sign bit: -0.0 too
    r = tl.where((a64 < 0.0) & (a64 > -float("inf")) & (b64 == b64) & ~whole, float("nan"), r)
    r = tl.where((b64 == 0.0) | (a64 == 1.0) | ((a64 == -1.0) & (tl.abs(b64) == float("inf"))), 1.0, r)
    return r.to(tl.float32)
)";
constexpr const char* kNanMinMaxHelper = R"(@triton.jit
def _max_nan(a, b):
    """torch.amax's combine: NaN propagates."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
)";
constexpr const char* kShiftHelper = R"(@triton.jit
def _shl(a, b, BITS: tl.constexpr):
    """torch's <<: a count outside [0, BITS) gives 0 (a shift by BITS or more is undefined in LLVM)."""
    return tl.where((b < 0) | (b >= BITS), 0, a << tl.minimum(tl.maximum(b, 0), BITS - 1))


@triton.jit
def _shr(a, b, BITS: tl.constexpr):
    """torch's >> (arithmetic): a count outside [0, BITS) gives the sign, 0 or -1."""
    return a >> tl.where((b < 0) | (b >= BITS), BITS - 1, b)
)";
constexpr const char* kDivisionHelper = R"(@triton.jit
def _floor_divide(a, b):
    """Python's // (Triton's truncates): rounds down; x // 0 = 0 and MIN // -1 wraps to MIN."""
    d = tl.where((b == 0) | (b == -1), 1, b)
    q = a // d
    q = tl.where((a % d != 0) & ((a < 0) != (d < 0)), q - 1, q)
    return tl.where(b == 0, 0, tl.where(b == -1, -a, q))


@triton.jit
def _remainder(a, b):
    """Python's % (Triton's has a's sign): the divisor's sign; x % 0 = x."""
    d = tl.where((b == 0) | (b == -1), 1, b)
    r = a % d
    r = tl.where((r != 0) & ((r < 0) != (d < 0)), r + d, r)
    return tl.where(b == 0, a, tl.where(b == -1, 0, r))
)";
constexpr const char* kRandomHelper = R"(@triton.jit
def _philox(seed, offset):
    """Philox4x32-10 of counter (offset lo, offset hi, 0, 0) under key (seed lo, seed hi)."""
    seed = seed.to(tl.int64)
    offset = offset.to(tl.int64)
    k0 = seed.to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    c0 = offset.to(tl.uint32)
    c1 = (offset >> 32).to(tl.uint32)
    c2 = tl.zeros_like(c0)
    c3 = tl.zeros_like(c0)
    for _ in tl.static_range(10):
        n0 = tl.umulhi(0xCD9E8D57, c2) ^ c1 ^ k0
        n2 = tl.umulhi(0xD2511F53, c0) ^ c3 ^ k1
        c1 = c2 * 0xCD9E8D57
        c3 = c0 * 0xD2511F53
        c0 = n0
        c2 = n2
        k0 = k0 + 0x9E3779B9  # the last bump is unused
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def _uniform(w):
    """[0, 1) from a word's top 24 bits, exactly."""
    return (w >> 8).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def _rand(seed, offset):
    c0, c1, c2, c3 = _philox(seed, offset)
    return _uniform(c0)


@triton.jit
def _randn(seed, offset):
    """Box-Muller on the first two words; u1 in (0, 1]."""
    c0, c1, c2, c3 = _philox(seed, offset)
    u1 = ((c0 >> 8) + 1).to(tl.float32) * 5.9604644775390625e-08
    return tl.sqrt(-2.0 * tl.log(u1)) * tl.cos(6.283185307179586 * _uniform(c1))


@triton.jit
def _randint(seed, offset):
    c0, c1, c2, c3 = _philox(seed, offset)
    return c0.to(tl.int32, bitcast=True)
)";

std::string literal(const ir::Constant& c, DType t) {
  if (t == DType::boolean) return c.integer != 0 ? "True" : "False";
  if (!is_floating(t)) return fmt::format("{}", c.integer);
  return py_float(c.real);
}

// ---- analysis: the blocks a program holds -----------------------------------------------------

// One axis as a Triton program sees it.
struct AxisInfo {
  int64_t block = 1;     // elements per program (a power of two): BLOCK_<AXIS>
  int64_t begin = 0;     // first element its loop covers
  bool masked = false;   // some block holds elements past the end (ragged or padded)
  bool grid = false;
  bool scalar = false;   // hl::grid: one element per program, no block dim
  bool looped = false;   // a reduced dim split into blocks: loops over them (ReduceLoop)
  int loop = -1;         // the tile loop, or -1 for whole and fixed dims
  ir::ValueId end = -1;  // an end computed on the device (an inner loop's bound)
  ir::ValueId begin_value = -1;  // a begin computed on the device (then `begin` is 0)
  // A general module's whole dim: its block is the launcher's, the dim's size rounded up to a
  // power of two (at least `block`), as a tl.constexpr.
  bool sized_at_call = false;
};

using plan::ReduceLoop;

class Analysis {
 public:
  // general: a module for any sizes (ahead-of-time builds): sizes are arguments of the kernel.
  Analysis(const plan::Plan& p, bool general) : p(p), k(p.kernel), general(general) {
    const ir::Loop& grid = k.grid_loop();
    for (size_t i = 0; i < grid.axes.size(); ++i)
      if (grid.begin[i].value >= 0 || grid.end[i].value >= 0)
        unsupported("grid loops with bounds computed on the device", "has one", format_location(grid.loc));
    for (size_t l = 0; l < k.loops.size(); ++l) {
      const ir::Loop& loop = k.loops[l];
      if (loop.grid) continue;
      if (loop.axes.size() != 1)
        unsupported("inner loops over several axes", "tiles several dims in one inner loop", format_location(loop.loc));
    }
    axes.resize(k.axes.size());
    for (size_t a = 0; a < k.axes.size(); ++a) {
      const ir::Axis& ax = k.axes[a];
      AxisInfo& in = axes[a];
      if (ax.kind == ir::AxisKind::Tile) {
        const ir::Loop& loop = k.loops[size_t(ax.loop)];
        size_t i = size_t(std::find(loop.axes.begin(), loop.axes.end(), int(a)) - loop.axes.begin());
        in.loop = ax.loop;
        in.grid = loop.grid;
        in.scalar = ax.scalar;
        in.begin = loop.begin[i].constant;
        in.end = loop.end[i].value;
        in.begin_value = loop.begin[i].value;
        in.block = ax.scalar ? 1 : p.block[a];
        int64_t span = std::max<int64_t>(ax.extent - in.begin, 0);
        in.masked = in.end >= 0 || span % in.block != 0;
        const ir::BlockParam& bp = k.block_params[size_t(ax.block_param)];
        if (!pow2(in.block) && bp.fixed)
          unsupported("tile blocks that are not a power of two",
                      fmt::format("pins {} = {} (tl.arange needs a power of two)", bp.name, bp.fixed),
                      format_location(k.loc), "pin a power of two, or leave the block size to the config");
      } else if (ax.kind == ir::AxisKind::Reduction && !p.persistent[a]) {
        in.looped = true;  // (plan::looped)
        in.block = p.block[a];
        in.masked = ax.extent % in.block != 0;
      } else {
        // A whole (persistent) or fixed dim: one block, padded to a power of two and masked.
        in.block = next_pow2(std::max<int64_t>(ax.extent, 1));
        in.masked = in.block != ax.extent;
        if (general && ax.kind == ir::AxisKind::Reduction) in.sized_at_call = true;
      }
      // Any size may leave a partial block: every block is masked.
      if (general && ax.kind != ir::AxisKind::Fixed && !in.scalar) in.masked = true;
    }
    // tl.dot's operands hold at least 16 x 16: padded whole dims grow to it, tiled ones are
    // the config's to choose (check()).
    for (const ir::Op& op : k.ops) {
      if (op.kind != OpKind::Dot || op.result < 0) continue;
      for (int d : dot_dims(op)) {
        if (d == ir::kOne)
          unsupported("products with a single row or column",
                      "multiplies along a dim of one element (tl.dot needs blocks of at least 16 x 16)",
                      format_location(op.loc), "give the product's dims a block, or run this kernel on the cpu target");
        AxisInfo& in = axes[size_t(d)];
        if (in.loop < 0 && !in.looped && (in.block < kMinDotBlock || in.sized_at_call)) {
          in.block = in.sized_at_call ? kMinDotBlock : std::max(in.block, kMinDotBlock);
          in.masked = true;
        }
      }
    }
    for (const ir::Op& op : k.ops) {
      if (op.kind != OpKind::Store) continue;
      for (const ir::Index& e : op.index)
        if (e.kind == ir::Index::Kind::Gather)
          unsupported(op.atomic_add ? "scatter-add (hl::atomic_add at gathered indices)" : "scatters",
                      fmt::format("writes {} at indices it reads from a tensor", k.tensors[size_t(op.tensor)].name),
                      format_location(op.loc));
    }
    if (general) {
      auto refuse = [&](const std::string& what, const std::source_location& loc) {
        throw ConfigError(fmt::format("triton: a general module (any sizes) cannot {}", what), format_location(loc),
                          "build this kernel's shapes one by one (each has its module)");
      };
      for (size_t i = 0; i < grid.axes.size(); ++i)
        if (grid.begin[i].constant != 0 || grid.end[i].constant != k.axes[size_t(grid.axes[i])].extent)
          refuse("run a grid over part of a dim", grid.loc);
      for (const ir::Op& op : k.ops) {
        if (op.kind != OpKind::Dot || op.result < 0) continue;
        const std::vector<int>& r = k.value(op.result).dims;
        for (size_t i = 0; i + 2 < r.size(); ++i)
          if (r[i] != ir::kOne && axes[size_t(r[i])].sized_at_call) refuse("batch a product over a whole dim", op.loc);
      }
    }
    plan::ReduceLoops r = plan::find_reduce_loops(p);
    if (r.problem) throw ConfigError("triton: " + r.problem->message(), r.problem->where(), r.problem->hint());
    reduce_loops = std::move(r.loops);
    reduce_loop_of_op = std::move(r.of_op);
  }

  const plan::Plan& p;
  const ir::Kernel& k;
  const bool general;
  std::vector<AxisInfo> axes;
  std::vector<ReduceLoop> reduce_loops;
  std::map<int, int> reduce_loop_of_op;  // op -> its entry of reduce_loops

  bool looped(int axis) const { return plan::looped(p, axis); }
  int looped_dim(ir::ValueId v) const { return plan::looped_dim(p, v); }

  // The M, N and K dims of a product: a [..., M, K] @ b [..., K, N].
  std::vector<int> dot_dims(const ir::Op& op) const {
    const std::vector<int>& r = k.value(op.result).dims;
    return {r[r.size() - 2], r.back(), k.value(op.inputs[0]).dims.back()};
  }
  std::string block_param(int axis) const {
    const ir::Axis& ax = k.axes[size_t(axis)];
    return ax.block_param >= 0 ? k.block_params[size_t(ax.block_param)].name : "";
  }
  bool tunable(int axis) const {
    const ir::Axis& ax = k.axes[size_t(axis)];
    return ax.kind == ir::AxisKind::Tile && !ax.scalar && !k.block_params[size_t(ax.block_param)].fixed;
  }
  int64_t elements(const std::vector<int>& dims) const {
    int64_t n = 1;
    for (int d : dims)
      if (d != ir::kOne) n *= axes[size_t(d)].block;
    return n;
  }
  int64_t blocks(int axis) const {
    const ir::Axis& ax = k.axes[size_t(axis)];
    int64_t span = std::max<int64_t>(ax.extent - axes[size_t(axis)].begin, 0);
    return (span + axes[size_t(axis)].block - 1) / axes[size_t(axis)].block;
  }
  int64_t num_warps() const { return p.config.has(keys::kNumWarps) ? p.config.integer(keys::kNumWarps) : 4; }
  int64_t num_stages() const { return p.config.has(keys::kNumStages) ? p.config.integer(keys::kNumStages) : 2; }
  int64_t grid_group() const { return p.config.has(keys::kGridGroup) ? p.config.integer(keys::kGridGroup) : 1; }

 private:
  [[noreturn]] void unsupported(const std::string& construct, const std::string& detail, const std::string& at,
                                const std::string& hint = "") const {
    throw CompileError(fmt::format("the triton target does not support {} yet: kernel '{}' {}", construct, k.name, detail),
                       at, hint.empty() ? "run this kernel on the cpu target" : hint);
  }
};

Footprint footprint(const Analysis& an) {
  const ir::Kernel& k = an.k;
  Footprint f;
  for (const plan::Dot& d : an.p.dots) {
    const ir::Op& op = k.ops[size_t(d.op)];
    int64_t stages = k.loops[size_t(d.loop)].grid ? 1 : an.num_stages();
    for (const plan::DotOperand* o : {&d.a, &d.b}) {
      bool bf16 = o->load_op >= 0 && k.tensors[size_t(k.ops[size_t(o->load_op)].tensor)].dtype == DType::bf16;
      f.shared_bytes += stages * an.elements(k.value(o->value).dims) * (bf16 ? 2 : 4);
    }
    (void)op;
  }
  int64_t carried = 0;
  for (const plan::CarriedValue& c : an.p.carried) carried += an.elements(k.value(c.phi).dims);
  int64_t threads = 32 * an.num_warps();
  f.carried_registers = (carried + threads - 1) / threads;
  return f;
}

// ---- the generator ----------------------------------------------------------------------------

class Generator {
 public:
  Generator(const Analysis& an, const Gpu& g) : an_(an), p_(an.p), k_(an.k), gpu_(g) {
    for (const ir::HostTensor& t : k_.tensors) taken_.insert(py_name(t.name) + "_ptr");
    for (const ir::ScalarParam& s : k_.scalars) taken_.insert(py_name(s.name));
    for (size_t a = 0; a < k_.axes.size(); ++a) {
      taken_.insert("offs_" + axis_name(int(a)));
      taken_.insert("mask_" + axis_name(int(a)));
      taken_.insert("pid_" + axis_name(int(a)));
    }
    for (const plan::CarriedValue& c : p_.carried) names_[c.result] = name(c.phi);
  }

  std::string run() {
    Lines body;
    scopes_.emplace_back();
    emit_body(k_.grid_loop_id(), body);
    combine_functions_ = combine_functions();
    std::string text = header();
    text += constants();
    text += kernel(body);
    text += "\n\n";
    text += launcher();
    return text;
  }

 private:
  const Analysis& an_;
  const plan::Plan& p_;
  const ir::Kernel& k_;
  const Gpu& gpu_;
  std::set<std::string> taken_;
  std::map<ir::ValueId, std::string> names_;
  // Per open loop body: the offsets and masks already defined there (axis -> dims -> name).
  std::vector<std::set<std::string>> scopes_;
  std::set<ir::ValueId> emitted_;  // values complete in the grid loop's body (not per block)
  Lines* before_reduce_loop_ = nullptr;
  bool uses_descriptors_ = false;
  std::map<int, std::string> hoisted_;  // access op -> the descriptor made before its inner loop  // while writing a reduction loop: the lines before it

  std::string axis_name(int a) const { return py_name(k_.axes[size_t(a)].name); }
  std::string axis_const(int a) const { return "BLOCK_" + upper(axis_name(a)); }
  std::string ptr(int tensor) const { return py_name(k_.tensors[size_t(tensor)].name) + "_ptr"; }
  std::string kernel_name() const { return py_name(k_.name) + "_kernel"; }
  std::string loop_index(int loop) const { return "i_" + axis_name(k_.loops[size_t(loop)].axes.front()); }
  std::string looped_index(int axis) const { return "i_" + axis_name(axis); }

  // A value's Python name: the user's name where the tracer knew it and it is free, else v<id>.
  std::string name(ir::ValueId v) {
    if (auto it = names_.find(v); it != names_.end()) return it->second;
    std::string hint = k_.value(v).hint.empty() ? "" : py_name(k_.value(v).hint);
    std::string n = !hint.empty() && !taken_.count(hint) ? hint : fmt::format("v{}", v);
    taken_.insert(n);
    return names_[v] = n;
  }

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
  std::string where(const ir::Op& op) const { return shown(format_location(op.loc)); }

  // Defines `name = text` (the offsets or mask of axis `a`) once per open loop body (and the
  // bodies inside it); inside a reduction loop, before that loop unless `a` is its axis.
  void define(const std::string& name, const std::string& text, int a, Lines& lines) {
    for (const auto& s : scopes_)
      if (s.count(name)) return;
    bool hoist = before_reduce_loop_ && !an_.axes[size_t(a)].looped;
    (hoist ? *before_reduce_loop_ : lines).push_back(fmt::format("{} = {}", name, text));
    scopes_[scopes_.size() - (hoist ? 2 : 1)].insert(name);
  }

  // The first element of the current block along tiled axis a: "pid_m * BLOCK_M" (+ begin).
  std::string block_start(int a) const {
    const AxisInfo& in = an_.axes[size_t(a)];
    if (in.looped) return fmt::format("{} * {}", looped_index(a), axis_const(a));
    if (in.loop < 0) return "0";
    std::string index = in.grid ? "pid_" + axis_name(a) : loop_index(in.loop);
    std::string s = in.block == 1 ? index : fmt::format("{} * {}", index, axis_const(a));
    if (in.begin_value >= 0) return fmt::format("{} + {}", names_.at(in.begin_value), s);
    return in.begin ? fmt::format("{} + {}", in.begin, s) : s;
  }
  std::string axis_end(int a) const {
    const AxisInfo& in = an_.axes[size_t(a)];
    return in.end >= 0 ? names_.at(in.end) : extent(a);
  }
  // An axis' extent: a number, or in a general module the kernel's argument E_<axis> (a fixed
  // dim keeps its number).
  bool general() const { return an_.general; }
  bool runtime_extent(int a) const { return general() && k_.axes[size_t(a)].kind != ir::AxisKind::Fixed; }
  std::string extent(int a) const {
    return runtime_extent(a) ? "E_" + axis_name(a) : fmt::format("{}", k_.axes[size_t(a)].extent);
  }
  // Blocks along an axis (from its loop's first element): a number, or tl.cdiv of its size.
  std::string block_count(int a) const {
    if (!runtime_extent(a)) return fmt::format("{}", an_.blocks(a));
    int64_t begin = an_.axes[size_t(a)].begin;
    return fmt::format("tl.cdiv({}{}, {})", extent(a), begin ? fmt::format(" - {}", begin) : "", axis_const(a));
  }
  // Stride of dim d of tensor t: a number (contiguous), or a general module's argument.
  std::string stride(int t, size_t d) const {
    const ir::HostTensor& x = k_.tensors[size_t(t)];
    if (general() && d + 1 < x.shape.size()) return fmt::format("{}_stride{}", py_name(x.name), d);
    int64_t s = 1;
    for (size_t i = d + 1; i < x.shape.size(); ++i) s *= x.shape[i];
    return fmt::format("{}", s);
  }

  // offs_<axis>: the element indices of the current block (a scalar for hl::grid axes).
  std::string offsets(int a, Lines& lines) {
    const AxisInfo& in = an_.axes[size_t(a)];
    std::string n = "offs_" + axis_name(a);
    if (in.scalar) return block_start(a);
    std::string range = fmt::format("tl.arange(0, {})", axis_const(a));
    define(n, in.loop < 0 && !in.looped ? range : fmt::format("{} + {}", block_start(a), range), a, lines);
    return n;
  }
  // mask_<axis>: which of them are in range; empty when all are.
  std::string mask(int a, Lines& lines) {
    const AxisInfo& in = an_.axes[size_t(a)];
    if (!in.masked || in.scalar) return "";
    std::string offs = offsets(a, lines);
    std::string n = "mask_" + axis_name(a);
    define(n, fmt::format("{} < {}", offs, axis_end(a)), a, lines);
    return n;
  }

  // Lays `e` (dims `from`) out as dims `to`: permuted, size-one dims added or dropped, and
  // broadcast when `exact` (otherwise left to Triton's numpy-style broadcasting).
  std::string align(const std::string& e, const std::vector<int>& from, const std::vector<int>& to, bool exact,
                    const ir::Op& op) const {
    if (from == to) return e;
    std::vector<int> src;
    for (int d : from)
      if (d != ir::kOne) src.push_back(d);
    if (!exact && from.size() <= to.size()) {
      size_t off = to.size() - from.size();
      bool ok = true;
      for (size_t i = 0; i < from.size(); ++i)
        if (from[i] != ir::kOne && from[i] != to[off + i]) ok = false;
      if (ok) return e;
    }
    std::vector<int> order;  // src axes in the order `to` has them
    for (int d : to)
      if (d != ir::kOne && std::find(src.begin(), src.end(), d) != src.end()) order.push_back(d);
    if (order.size() != src.size())
      throw CompileError(fmt::format("triton codegen: cannot lay out a value of dims {} as {}", dims_text(from),
                                     dims_text(to)),
                         format_location(op.loc), "this is a bug in the triton target; please report it");
    std::string x = e;
    std::vector<int> now = from;
    if (order != src) {
      if (from != src) x = fmt::format("tl.reshape({}, {})", x, py_tuple(shape_of(src)));
      std::vector<std::string> perm;
      for (int d : order) perm.push_back(fmt::format("{}", std::find(src.begin(), src.end(), d) - src.begin()));
      x = fmt::format("tl.permute({}, {})", x, py_tuple(perm));
      now = order;
    }
    std::vector<int> mid;  // `to` with size one wherever the value has no axis
    bool broadcast = false;
    for (int d : to) {
      bool have = d != ir::kOne && std::find(src.begin(), src.end(), d) != src.end();
      mid.push_back(have ? d : ir::kOne);
      broadcast = broadcast || (d != ir::kOne && !have);
    }
    if (now != mid) {
      // Only size-one dims to add: x[:, None] reads best; anything else is a reshape.
      std::vector<int> real;
      for (int d : now)
        if (d != ir::kOne) real.push_back(d);
      bool adds_only = real == now && !now.empty();
      if (adds_only) {
        std::vector<std::string> idx;
        for (int d : mid) idx.push_back(d == ir::kOne ? "None" : ":");
        x = fmt::format("{}[{}]", x, fmt::join(idx, ", "));
      } else {
        x = fmt::format("tl.reshape({}, {})", x, mid.empty() ? "()" : py_tuple(shape_of(mid)));
      }
    }
    if (broadcast && exact) x = fmt::format("tl.broadcast_to({}, {})", x, py_tuple(shape_of(to)));
    return x;
  }

  // Converts a kernel value of IR dtype `from` to IR dtype `to` (rounding to bf16/f16 where the
  // IR casts to them, as the cpu target does).
  static std::string convert(const std::string& e, DType from, DType to) {
    if ((to == DType::bf16 || to == DType::f16) && from != to)
      return fmt::format("{}.to({}).to(tl.float32)", e, tl_type(to));
    if (to == DType::boolean && from != DType::boolean) return fmt::format("({} != 0)", e);
    if (kernel_type(from) == kernel_type(to)) return e;
    return fmt::format("{}.to({})", e, tl_type(kernel_type(to)));
  }

  // ---- the kernel ----

  void emit_body(int loop, Lines& lines) {
    for (const ir::Stmt& s : k_.loops[size_t(loop)].body) {
      if (s.kind == ir::Stmt::Kind::Loop) {
        inner_loop(s.id, lines);
        continue;
      }
      if (auto it = an_.reduce_loop_of_op.find(s.id); it != an_.reduce_loop_of_op.end()) {
        const ReduceLoop& rl = an_.reduce_loops[size_t(it->second)];
        if (rl.ops.front() == s.id) reduce_loop(rl, lines);
        continue;
      }
      const ir::Op& op = k_.ops[size_t(s.id)];
      // Values over a looped axis exist one block at a time, inside the loops that use them.
      if (op.result >= 0 && (emitted_.count(op.result) || an_.looped_dim(op.result) >= 0)) continue;
      statement(op, lines);
      if (op.result >= 0) emitted_.insert(op.result);
    }
  }

  // A group over a looped reduction axis: a loop over the axis' blocks. Values over the axis
  // are computed block by block inside it (in each loop that uses them: the plan recomputes
  // them), the others before it; a reduction over the axis starts at its identity and takes in
  // each block.
  void reduce_loop(const ReduceLoop& rl, Lines& lines) {
    const ir::Axis& ax = k_.axes[size_t(rl.axis)];
    Lines before, inside;
    scopes_.emplace_back();
    before_reduce_loop_ = &before;
    std::vector<std::string> does = plan::walk_reduce_loop(
        p_, rl, true, emitted_,
        [&](const ir::Op& op) {
          const ir::Value& r = k_.value(op.result);
          before.push_back(fmt::format("{} = tl.full({}, {}, {})  # {} over {}: its identity, then each block",
                                       name(op.result), r.dims.empty() ? "()" : py_tuple(shape_of(r.dims)),
                                       identity(op.reduce, r.dtype), tl_type(kernel_type(r.dtype)),
                                       ir::name(op.reduce), ax.name));
        },
        [&](const ir::Op& op, bool in_loop) { statement(op, in_loop ? inside : before); });
    before_reduce_loop_ = nullptr;
    scopes_.pop_back();
    int64_t blocks = rl.blocks;
    if (!lines.empty() && !lines.back().empty()) lines.push_back("");
    if (general())
      lines.push_back(fmt::format("# {} over {} block by block (blocks of {})", fmt::join(does, ", "), ax.name,
                                  axis_const(rl.axis)));
    else
      lines.push_back(fmt::format("# {} over {} block by block ({} block{} of {}{})", fmt::join(does, ", "), ax.name, blocks,
                                  blocks == 1 ? "" : "s", axis_const(rl.axis),
                                  an_.axes[size_t(rl.axis)].masked ? ", the last one partial" : ""));
    lines.insert(lines.end(), before.begin(), before.end());
    lines.push_back(fmt::format("for {} in tl.range(0, {}):", looped_index(rl.axis),
                                general() ? fmt::format("tl.cdiv({}, {})", extent(rl.axis), axis_const(rl.axis))
                                          : fmt::format("{}", blocks)));
    for (const std::string& l : inside) lines.push_back("    " + l);
    lines.push_back("");
  }

  void inner_loop(int id, Lines& lines) {
    const ir::Loop& loop = k_.loops[size_t(id)];
    int a = loop.axes.front();
    const AxisInfo& in = an_.axes[size_t(a)];
    std::vector<const plan::CarriedValue*> carried;
    for (const plan::CarriedValue& c : p_.carried)
      if (c.loop == id) carried.push_back(&c);
    const ir::Op* any = nullptr;
    for (const ir::Stmt& s : loop.body)
      if (s.kind == ir::Stmt::Kind::Op && !any) any = &k_.ops[size_t(s.id)];
    if (!lines.empty() && !lines.back().empty()) lines.push_back("");
    for (const auto* c : carried)
      lines.push_back(fmt::format("{} = {}  # carried by the loop over {}", name(c->phi),
                                  align(name(c->init), k_.value(c->init).dims, k_.value(c->phi).dims, true, *any),
                                  k_.axes[size_t(a)].name));
    std::string trips = block_count(a);
    if (in.end >= 0) {
      std::string end = names_.at(in.end);
      std::string begin = in.begin_value >= 0 ? names_.at(in.begin_value) : fmt::format("{}", in.begin);
      trips = fmt::format("tl.cdiv({}, {})", begin != "0" ? fmt::format("{} - {}", end, begin) : end, axis_const(a));
    }
    // The descriptors of the loop's accesses are made once, before it.
    for (const ir::Stmt& s : loop.body)
      if (s.kind == ir::Stmt::Kind::Op) {
        const ir::Op& op = k_.ops[size_t(s.id)];
        if (std::string d = descriptor(op); !d.empty()) {
          lines.push_back(fmt::format("{} = {}", descriptor_name(op), d));
          hoisted_[s.id] = descriptor_name(op);
          uses_descriptors_ = true;
        }
      }
    lines.push_back(fmt::format("for {} in tl.range(0, {}, num_stages=NUM_STAGES):  # loop over {}  ({})", loop_index(id),
                                trips, k_.axes[size_t(a)].name, shown(format_location(loop.loc))));
    Lines inside;
    scopes_.emplace_back();
    emit_body(id, inside);
    for (const auto* c : carried)
      inside.push_back(fmt::format("{} = {}", name(c->phi),
                                   align(name(c->next), k_.value(c->next).dims, k_.value(c->phi).dims, true, *any)));
    scopes_.pop_back();
    for (const std::string& l : inside) lines.push_back(l.empty() ? l : "    " + l);
    lines.push_back("");
  }

  // The dims of the block an access reads (the loaded value's) or writes.
  std::vector<int> access_dims(const ir::Op& op) const {
    if (op.kind == OpKind::Load) return k_.value(op.result).dims;
    std::vector<int> dims;
    for (const ir::Index& e : op.index)
      if (e.kind == ir::Index::Kind::Axis) dims.push_back(e.axis);
    return dims;
  }

  bool descriptors() const { return p_.config.has(keys::kPointers) && p_.config.text(keys::kPointers) == "descriptor"; }
  std::string descriptor_name(const ir::Op& op) const { return py_name(k_.tensors[size_t(op.tensor)].name) + "_desc"; }

  // tl.make_tensor_descriptor for an access (config pointers = descriptor) whose every dim is
  // a block of its own axis in the tensor's order, bounded by the tensor's extent (all a
  // descriptor checks: slices, and loop ends computed on the device, keep plain pointers), of
  // 2 to 5 dims with 16-byte aligned rows and block rows (what TMA takes); else "".
  std::string descriptor(const ir::Op& op) const {
    if (!descriptors() || general() || op.atomic_add || (op.kind != OpKind::Load && op.kind != OpKind::Store)) return "";
    const ir::HostTensor& t = k_.tensors[size_t(op.tensor)];
    const plan::BlockSpec& s = *p_.spec_for_op(int(&op - k_.ops.data()));
    int64_t bytes = dtype_size(t.dtype);
    if (t.shape.size() < 2 || t.shape.size() > 5 || (t.shape.back() * bytes) % 16 != 0) return "";
    std::vector<int> axes;
    std::vector<std::string> shape, strides(t.shape.size()), block;
    int64_t stride = 1;
    for (size_t d = t.shape.size(); d-- > 0;) {
      strides[d] = fmt::format("{}", stride);  // the module takes contiguous tensors
      stride *= t.shape[d];
    }
    for (size_t d = 0; d < s.index_map.size(); ++d) {
      const plan::IndexTerm& e = s.index_map[d];
      using K = plan::IndexTerm::Kind;
      if (e.kind != K::Block && e.kind != K::Whole && e.kind != K::Looped) return "";
      const AxisInfo& in = an_.axes[size_t(e.axis)];
      if (in.scalar || in.end >= 0 || e.offset != 0 || k_.axes[size_t(e.axis)].extent != t.shape[d]) return "";
      axes.push_back(e.axis);
      shape.push_back(fmt::format("{}", t.shape[d]));
      block.push_back(axis_const(e.axis));
    }
    if (axes != access_dims(op) || an_.axes[size_t(axes.back())].block * bytes < 16) return "";
    return fmt::format("tl.make_tensor_descriptor({}, shape={}, strides={}, block_shape={})", ptr(op.tensor),
                       py_list(shape), py_list(strides), py_list(block));
  }
  // The descriptor an access goes through: its inner loop's, or one made here; "" for plain.
  std::string descriptor_of(const ir::Op& op, Lines& lines) {
    if (auto it = hoisted_.find(int(&op - k_.ops.data())); it != hoisted_.end()) return it->second;
    std::string d = descriptor(op);
    if (d.empty()) return "";
    uses_descriptors_ = true;
    lines.push_back(fmt::format("{} = {}", descriptor_name(op), d));
    return descriptor_name(op);
  }
  // The first element of the block, per dim: "[pid_m * BLOCK_M, i_k * BLOCK_K]".
  std::string descriptor_offsets(const ir::Op& op) const {
    std::vector<std::string> at;
    for (int a : access_dims(op)) at.push_back(block_start(a));
    return py_list(at);
  }

  // The pointers, mask and dims of an access: `dims` are the block's (the loaded value's, or
  // for a store the tensor dims it addresses).
  struct Address {
    std::string pointers, mask;
    std::vector<int> dims;
  };
  Address address(const ir::Op& op, std::vector<int> dims, Lines& lines) {
    const ir::HostTensor& t = k_.tensors[size_t(op.tensor)];
    const plan::BlockSpec& s = *p_.spec_for_op(int(&op - k_.ops.data()));
    std::vector<std::string> terms, masks;
    auto add_mask = [&](const std::string& m, int axis) {
      if (m.empty()) return;
      std::string aligned = align(m, {axis}, dims, false, op);
      if (std::find(masks.begin(), masks.end(), aligned) == masks.end()) masks.push_back(aligned);
    };
    for (size_t d = 0; d < s.index_map.size(); ++d) {
      const plan::IndexTerm& e = s.index_map[d];
      std::string st = stride(op.tensor, d);  // the module takes contiguous tensors
      std::string times = st == "1" ? "" : " * " + st;
      std::string term;
      switch (e.kind) {
        case plan::IndexTerm::Kind::Constant:
          if (e.constant != 0) term = st.find('_') == std::string::npos ? fmt::format("{}", e.constant * std::stoll(st))
                                                                         : fmt::format("{}{}", e.constant, times);
          break;
        case plan::IndexTerm::Kind::Scalar: {
          std::string v = e.grid_axis >= 0 && an_.axes[size_t(e.grid_axis)].scalar ? block_start(e.grid_axis)
                                                                                   : name(e.value);
          term = v.find(' ') == std::string::npos || times.empty() ? v + times : fmt::format("({}){}", v, times);
          break;
        }
        case plan::IndexTerm::Kind::Gather: {
          const ir::Value& idx = k_.value(e.value);
          term = align(name(e.value), idx.dims, dims, false, op) + times;
          for (int a : idx.dims)
            if (a != ir::kOne) add_mask(mask(a, lines), a);
          break;
        }
        case plan::IndexTerm::Kind::Block:
        case plan::IndexTerm::Kind::Whole:
        case plan::IndexTerm::Kind::Looped: {
          if (an_.axes[size_t(e.axis)].scalar) {  // an hl::grid index: one element
            std::string v = block_start(e.axis);
            if (e.offset) v = fmt::format("{} + {}", v, e.offset);
            term = v.find(' ') == std::string::npos || times.empty() ? v + times : fmt::format("({}){}", v, times);
            break;
          }
          if (std::find(dims.begin(), dims.end(), e.axis) == dims.end())
            throw CompileError(fmt::format("triton codegen: the access of {} at {} has no block dim for its axis {}",
                                           t.name, where(op), k_.axes[size_t(e.axis)].name),
                               format_location(op.loc), "this is a bug in the triton target; please report it");
          std::string offs = offsets(e.axis, lines);
          if (e.offset) offs = fmt::format("({} + {})", offs, e.offset);
          term = align(offs, {e.axis}, dims, false, op) + times;
          add_mask(mask(e.axis, lines), e.axis);
          break;
        }
      }
      if (!term.empty()) terms.push_back(term);
    }
    Address out;
    out.pointers = terms.empty() ? ptr(op.tensor) : fmt::format("{} + {}", ptr(op.tensor), fmt::join(terms, " + "));
    out.mask = fmt::format("{}", fmt::join(masks, " & "));
    out.dims = std::move(dims);
    return out;
  }

  // Float amax/amin reduce with the NaN-propagating helpers (tl.max and tl.min drop NaN, where
  // torch.amax gives NaN); the rest with tl.sum/max/min.
  static std::string reduce(ir::ReduceFn f, DType t, const std::string& x, int dim, bool keepdim) {
    std::string keep = keepdim ? ", keep_dims=True" : "";
    bool nan = is_floating(t) && f != ir::ReduceFn::Sum;
    switch (f) {
      case ir::ReduceFn::Sum: return fmt::format("tl.sum({}, axis={}{})", x, dim, keep);
      case ir::ReduceFn::Max:
        return nan ? fmt::format("tl.reduce({}, {}, _max_nan{})", x, dim, keep) : fmt::format("tl.max({}, axis={}{})", x, dim, keep);
      case ir::ReduceFn::Min:
        return nan ? fmt::format("tl.reduce({}, {}, _min_nan{})", x, dim, keep) : fmt::format("tl.min({}, axis={}{})", x, dim, keep);
    }
    return x;
  }
  static std::string combine(ir::ReduceFn f, DType t, const std::string& acc, const std::string& x) {
    switch (f) {
      case ir::ReduceFn::Sum: return binary(ir::BinaryFn::Add, acc, x, t);
      case ir::ReduceFn::Max: return binary(ir::BinaryFn::Max, acc, x, t);
      case ir::ReduceFn::Min: return binary(ir::BinaryFn::Min, acc, x, t);
    }
    return x;
  }
  static std::string identity(ir::ReduceFn f, DType t) {
    DType kt = kernel_type(t);
    bool wide = kt == DType::i64;
    switch (f) {
      case ir::ReduceFn::Sum: return kt == DType::f32 ? "0.0" : "0";
      case ir::ReduceFn::Max:
        return kt == DType::f32 ? "-float(\"inf\")" : kt == DType::boolean ? "0" : wide ? "-9223372036854775807 - 1" : "-2147483648";
      case ir::ReduceFn::Min:
        return kt == DType::f32 ? "float(\"inf\")" : kt == DType::boolean ? "1" : wide ? "9223372036854775807" : "2147483647";
    }
    return "0";
  }

  static std::string unary(ir::UnaryFn f, const std::string& x) {
    // tl.math and plain Triton only: libdevice functions (tanh among them) do not run under the
    // interpreter, and these forms compile to the same fast instructions on a GPU.
    switch (f) {
      case ir::UnaryFn::Neg: return "-" + x;
      case ir::UnaryFn::Not: return fmt::format("({} == 0)", x);
      case ir::UnaryFn::Exp: return fmt::format("tl.exp({})", x);
      case ir::UnaryFn::Exp2: return fmt::format("tl.exp2({})", x);
      case ir::UnaryFn::Log: return fmt::format("tl.log({})", x);
      case ir::UnaryFn::Sqrt: return fmt::format("tl.sqrt({})", x);
      case ir::UnaryFn::Rsqrt: return fmt::format("tl.rsqrt({})", x);
      case ir::UnaryFn::Tanh: return fmt::format("_tanh({})", x);
      case ir::UnaryFn::Sigmoid: return fmt::format("tl.sigmoid({})", x);
      case ir::UnaryFn::Silu: return fmt::format("{0} * tl.sigmoid({0})", x);
      case ir::UnaryFn::GeluTanh: return fmt::format("_gelu_tanh({})", x);
      case ir::UnaryFn::GeluErf: return fmt::format("0.5 * {0} * (1.0 + tl.math.erf({0} * 0.7071067811865476))", x);
      case ir::UnaryFn::Abs: return fmt::format("tl.abs({})", x);
      case ir::UnaryFn::Erf: return fmt::format("tl.math.erf({})", x);
      case ir::UnaryFn::Sin: return fmt::format("tl.sin({})", x);
      case ir::UnaryFn::Cos: return fmt::format("tl.cos({})", x);
      case ir::UnaryFn::Log1p: return fmt::format("_log1p({})", x);
      case ir::UnaryFn::Expm1: return fmt::format("_expm1({})", x);
      case ir::UnaryFn::Floor: return fmt::format("tl.floor({})", x);
      case ir::UnaryFn::Ceil: return fmt::format("tl.ceil({})", x);
      case ir::UnaryFn::Round: return fmt::format("_round({})", x);
      case ir::UnaryFn::BitcastI32: return fmt::format("{}.to(tl.int32, bitcast=True)", x);
      case ir::UnaryFn::BitcastF32: return fmt::format("{}.to(tl.float32, bitcast=True)", x);
    }
    return x;
  }
  // `t`: the operands' dtype (shift counts are checked against its width).
  static std::string binary(ir::BinaryFn f, const std::string& a, const std::string& b, DType t) {
    switch (f) {
      case ir::BinaryFn::Add: return fmt::format("{} + {}", a, b);
      case ir::BinaryFn::Sub: return fmt::format("{} - {}", a, b);
      case ir::BinaryFn::Mul: return fmt::format("{} * {}", a, b);
      case ir::BinaryFn::Div: return fmt::format("{} / {}", a, b);
      // NaN propagates, as in torch.maximum (tl.maximum's default drops it).
      case ir::BinaryFn::Max:
        return fmt::format("tl.maximum({}, {}{})", a, b, is_floating(t) ? ", propagate_nan=tl.PropagateNan.ALL" : "");
      case ir::BinaryFn::Min:
        return fmt::format("tl.minimum({}, {}{})", a, b, is_floating(t) ? ", propagate_nan=tl.PropagateNan.ALL" : "");
      case ir::BinaryFn::Eq: return fmt::format("{} == {}", a, b);
      case ir::BinaryFn::Ne: return fmt::format("{} != {}", a, b);
      case ir::BinaryFn::Lt: return fmt::format("{} < {}", a, b);
      case ir::BinaryFn::Le: return fmt::format("{} <= {}", a, b);
      case ir::BinaryFn::Gt: return fmt::format("{} > {}", a, b);
      case ir::BinaryFn::Ge: return fmt::format("{} >= {}", a, b);
      case ir::BinaryFn::And: return fmt::format("{} & {}", a, b);
      case ir::BinaryFn::Or: return fmt::format("{} | {}", a, b);
      case ir::BinaryFn::Pow: return fmt::format("_pow({}, {})", a, b);
      case ir::BinaryFn::BitAnd: return fmt::format("{} & {}", a, b);
      case ir::BinaryFn::BitOr: return fmt::format("{} | {}", a, b);
      case ir::BinaryFn::BitXor: return fmt::format("{} ^ {}", a, b);
      case ir::BinaryFn::Shl: case ir::BinaryFn::Shr: case ir::BinaryFn::Mod: case ir::BinaryFn::FloorDiv:
      case ir::BinaryFn::Rand: case ir::BinaryFn::Randn: case ir::BinaryFn::RandInt:
        return python::helper_call(f, a, b, t);  // helpers written into the module where used
    }
    return a;
  }
  // Operands of binary ops that are compound expressions get parentheses.
  static std::string paren(const std::string& e) {
    bool simple = std::all_of(e.begin(), e.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; });
    return simple || (e.back() == ')' && e.find(' ') > e.find('(')) || e.back() == ']' ? e : "(" + e + ")";
  }

  bool uses_tanh_ = false, uses_gelu_tanh_ = false;

  // The helpers the kernel's functions call, in a fixed order (the module is byte-identical).
  std::vector<const char*> helpers() const {
    auto uses = [&](auto... fns) {
      return std::any_of(k_.ops.begin(), k_.ops.end(), [&](const ir::Op& op) {
        if constexpr ((std::is_same_v<decltype(fns), ir::UnaryFn> && ...))
          return op.kind == OpKind::Unary && ((op.unary == fns) || ...);
        else
          return op.kind == OpKind::Binary && ((op.binary == fns) || ...);
      });
    };
    using ir::BinaryFn;
    using ir::UnaryFn;
    std::vector<const char*> out;
    if (uses(UnaryFn::Round)) out.push_back(kRoundHelper);
    if (uses(UnaryFn::Log1p)) out.push_back(kLog1pHelper);
    if (uses(UnaryFn::Expm1)) out.push_back(kExpm1Helper);
    if (uses(BinaryFn::Pow)) out.push_back(kPowHelper);
    if (std::any_of(k_.ops.begin(), k_.ops.end(), [&](const ir::Op& op) {
          return op.kind == OpKind::Reduce && op.reduce != ir::ReduceFn::Sum && is_floating(k_.value(op.result).dtype);
        }))
      out.push_back(kNanMinMaxHelper);
    if (uses(BinaryFn::Shl, BinaryFn::Shr)) out.push_back(kShiftHelper);
    if (uses(BinaryFn::FloorDiv, BinaryFn::Mod)) out.push_back(kDivisionHelper);
    if (uses(BinaryFn::Rand, BinaryFn::Randn, BinaryFn::RandInt)) out.push_back(kRandomHelper);
    return out;
  }

  // a @ b (+ acc) with tl.dot, accumulating in f32.
  std::string dot(const ir::Op& op, Lines& lines) {
    const ir::Value& r = k_.value(op.result);
    const ir::Value &a = k_.value(op.inputs[0]), &b = k_.value(op.inputs[1]);
    const plan::Dot* planned = p_.dot_for_op(int(&op - k_.ops.data()));
    std::vector<int> batch(r.dims.begin(), r.dims.end() - 2);
    std::vector<int> md = an_.dot_dims(op);
    int m = md[0], n = md[1], kd = md[2];
    std::string x = name(op.inputs[0]), y = name(op.inputs[1]);
    // Past the end of K the operands must be zero: a masked load gave zeros, anything computed
    // there may not be (exp(0 - max) is not).
    std::string km = mask(kd, lines);
    if (!km.empty()) {
      if (!planned || planned->a.load_op < 0)
        x = fmt::format("tl.where({}, {}, 0.0)", align(km, {kd}, a.dims, false, op), x);
      if (!planned || planned->b.load_op < 0)
        y = fmt::format("tl.where({}, {}, 0.0)", align(km, {kd}, b.dims, false, op), y);
    }
    // Operands holding bf16 data (read from bf16 tensors, through views and widening casts) go
    // to the tensor cores as bf16: exact, and their native input type.
    auto bf16_data = [&](const plan::DotOperand& o) {
      return o.load_op >= 0 && k_.tensors[size_t(k_.ops[size_t(o.load_op)].tensor)].dtype == DType::bf16;
    };
    bool bf16 = planned && bf16_data(planned->a) && bf16_data(planned->b);
    int64_t batch_block = an_.elements(batch);
    std::vector<int> da = batch, db = batch, dr = batch;
    da.insert(da.end(), {m, kd});
    db.insert(db.end(), {kd, n});
    dr.insert(dr.end(), {m, n});
    // tl.dot takes 2-D operands, or 3-D with one batch dim: the batch dims (blocks of one, or
    // of more) fold into it.
    bool flat2 = batch_block == 1;
    bool fold = !batch.empty() && (flat2 || batch.size() > 1);
    auto folded = [&](const std::string& v, int rows, int cols) {
      return flat2 ? fmt::format("tl.reshape({}, ({}, {}))", v, axis_const(rows), axis_const(cols))
                   : fmt::format("tl.reshape({}, ({}, {}, {}))", v, batch_block, axis_const(rows), axis_const(cols));
    };
    x = align(x, a.dims, da, true, op);
    y = align(y, b.dims, db, true, op);
    if (fold) {
      x = folded(x, m, kd);
      y = folded(y, kd, n);
    }
    if (bf16) {
      x = paren(x) + ".to(tl.bfloat16)";
      y = paren(y) + ".to(tl.bfloat16)";
    }
    std::vector<std::string> args = {x, y};
    if (op.inputs.size() > 2) {
      std::string acc = align(name(op.inputs[2]), k_.value(op.inputs[2]).dims, dr, true, op);
      args.push_back(fold ? folded(acc, m, n) : acc);
    }
    if (!bf16)
      args.push_back(p_.config.has(keys::kDotPrecision) ? fmt::format("input_precision=\"{}\"", p_.config.text(keys::kDotPrecision))
                                                         : "input_precision=\"ieee\"");
    std::string e = fmt::format("tl.dot({})", fmt::join(args, ", "));
    if (fold || r.dims != dr) e = fmt::format("tl.reshape({}, {})", e, py_tuple(shape_of(r.dims)));
    return e;
  }

  // ---- scans ----

  // Each scan's combine function as a @triton.jit function of two elements, and for reverse
  // scans along a padded dim a form that skips the padding (an invalid element is the
  // identity: associative whenever the combine is).
  std::string combine_functions_;
  std::string combine_functions() {
    std::string out;
    for (size_t i = 0; i < k_.combines.size(); ++i) {
      const ir::Combine& c = k_.combines[i];
      auto fn = ir::combine_binary(k_, c);
      if (fn == ir::BinaryFn::Add || fn == ir::BinaryFn::Mul) continue;  // spelled as cumsum, cumprod
      Lines lines;
      for (int o : c.ops) statement(k_.ops[size_t(o)], lines);
      out += "@triton.jit\n";
      out += fmt::format("def _combine{}({}, {}):\n", i, name(c.a), name(c.b));
      out += fmt::format("    \"\"\"The combine function of the scan at {}: (accumulated, next) -> accumulated.\"\"\"\n",
                         shown(format_location(c.loc)));
      for (const std::string& l : lines) out += "    " + l + "\n";
      out += fmt::format("    return {}\n\n\n", name(c.result));
      bool reverse = std::any_of(k_.ops.begin(), k_.ops.end(),
                                 [&](const ir::Op& op) { return op.kind == OpKind::Scan && op.combine == int(i) && op.reverse; });
      if (!reverse) continue;
      out += "@triton.jit\n";
      out += fmt::format("def _combine{}_skipping(a, a_valid, b, b_valid):\n", i);
      out += "    \"\"\"The same, where invalid elements (past the dim's end) are skipped.\"\"\"\n";
      out += fmt::format("    both = tl.where(a_valid & b_valid, _combine{}(a, b), tl.where(a_valid, a, b))\n", i);
      out += "    return both, a_valid | b_valid\n\n\n";
    }
    return out;
  }

  std::string scan(const ir::Op& op, Lines& lines) {
    const ir::Value& r = k_.value(op.result);
    const ir::Value& xv = k_.value(op.inputs[0]);
    std::string x = convert(name(op.inputs[0]), xv.dtype, r.dtype);
    int axis = xv.dims[size_t(op.dim)];
    auto fn = ir::combine_binary(k_, k_.combines[size_t(op.combine)]);
    std::string rev = op.reverse ? ", reverse=True" : "";
    // A forward scan never reads the padding past the dim's end (it comes after every real
    // element); a reverse one starts there, so the padding must not count.
    std::string m = op.reverse ? mask(axis, lines) : "";
    if (!m.empty()) m = align(m, {axis}, xv.dims, true, op);
    if (fn == ir::BinaryFn::Add || fn == ir::BinaryFn::Mul) {
      bool sum = fn == ir::BinaryFn::Add;
      const char* identity = kernel_type(r.dtype) == DType::f32 ? (sum ? "0.0" : "1.0") : (sum ? "0" : "1");
      if (!m.empty()) x = fmt::format("tl.where({}, {}, {})", m, x, identity);
      return fmt::format("tl.{}({}, axis={}{})", sum ? "cumsum" : "cumprod", x, op.dim, rev);
    }
    if (m.empty()) return fmt::format("tl.associative_scan({}, {}, _combine{}{})", x, op.dim, op.combine, rev);
    lines.push_back(fmt::format("{}, _ = tl.associative_scan(({}, {}), {}, _combine{}_skipping{})  # associative_scan "
                                "along {}, skipping the padding: {}{}  ({})",
                                name(op.result), x, m, op.dim, op.combine, rev, ir::dim_name(k_, axis),
                                dtype_name(r.dtype), dims_text(r.dims), where(op)));
    return "";
  }

  void statement(const ir::Op& op, Lines& lines) {
    std::string loc = where(op);
    auto in = [&](size_t i) { return name(op.inputs[i]); };
    auto in_dtype = [&](size_t i) { return k_.value(op.inputs[i]).dtype; };
    auto in_dims = [&](size_t i) { return k_.value(op.inputs[i]).dims; };
    if (op.kind == OpKind::Store) {
      const ir::HostTensor& t = k_.tensors[size_t(op.tensor)];
      std::vector<int> dims = access_dims(op);
      size_t last = op.inputs.size() - 1;
      std::string v = align(in(last), in_dims(last), dims, true, op);
      if (kernel_type(t.dtype) != kernel_type(in_dtype(last)) || kernel_type(t.dtype) != t.dtype)
        v = fmt::format("{}.to({})", paren(v), tl_type(t.dtype));
      if (std::string d = descriptor_of(op, lines); !d.empty()) {
        lines.push_back(fmt::format("{}.store({}, {})  # store {}  ({})", d, descriptor_offsets(op), v, shown(t.name), loc));
        return;
      }
      Address at = address(op, dims, lines);
      std::string m = at.mask.empty() ? "" : ", mask=" + at.mask;
      // hl::atomic_add: programs that add into one element meet in tl.atomic_add (in no fixed
      // order: float sums may differ in their last bits from run to run).
      lines.push_back(fmt::format("tl.{}({}, {}{})  # {} {}  ({})", op.atomic_add ? "atomic_add" : "store", at.pointers, v,
                                  m, op.atomic_add ? "atomic_add into" : "store", shown(t.name), loc));
      return;
    }
    const ir::Value& r = k_.value(op.result);
    std::string e;
    std::string what = ir::name(op.kind);
    switch (op.kind) {
      case OpKind::Load: {
        const ir::HostTensor& t = k_.tensors[size_t(op.tensor)];
        if (std::string d = descriptor_of(op, lines); !d.empty()) {
          e = fmt::format("{}.load({})", d, descriptor_offsets(op));
        } else {
          Address at = address(op, r.dims, lines);
          e = at.mask.empty() ? fmt::format("tl.load({})", at.pointers)
                              : fmt::format("tl.load({}, mask={}, other=0)", at.pointers, at.mask);
        }
        if (kernel_type(t.dtype) != t.dtype || kernel_type(r.dtype) != kernel_type(t.dtype))
          e = fmt::format("{}.to({})", e, tl_type(kernel_type(r.dtype)));
        what = "load " + shown(t.name);
        break;
      }
      case OpKind::Full:  // a whole dim's extent (op.axis) is an argument in a general module
        e = fmt::format("tl.full({}, {}, {})", r.dims.empty() ? "()" : py_tuple(shape_of(r.dims)),
                        op.axis >= 0 && runtime_extent(op.axis) ? extent(op.axis) : literal(op.number, kernel_type(r.dtype)),
                        tl_type(kernel_type(r.dtype)));
        break;
      case OpKind::ScalarArg:
        e = py_name(k_.scalars[size_t(op.scalar)].name);
        what = "scalar " + shown(k_.scalars[size_t(op.scalar)].name);
        break;
      case OpKind::TileIndex: {
        auto pos = std::find(r.dims.begin(), r.dims.end(), op.axis);
        e = pos == r.dims.end() ? block_start(op.axis) : align(offsets(op.axis, lines), {op.axis}, r.dims, true, op);
        what = "tile_index " + k_.axes[size_t(op.axis)].name;
        break;
      }
      case OpKind::TileBegin:
        e = block_start(op.axis);
        what = "tile_begin " + k_.axes[size_t(op.axis)].name;
        break;
      case OpKind::TileEnd: {
        const AxisInfo& ax = an_.axes[size_t(op.axis)];
        e = ax.loop < 0 ? extent(op.axis)
                        : fmt::format("tl.minimum({} + {}, {})", block_start(op.axis), axis_const(op.axis), axis_end(op.axis));
        what = "tile_end " + k_.axes[size_t(op.axis)].name;
        break;
      }
      case OpKind::TileSize:
        e = axis_const(op.axis);
        what = "tile_size " + k_.axes[size_t(op.axis)].name;
        break;
      case OpKind::Unary: {
        DType t = ir::operand_dtype(op.unary, in_dtype(0));
        uses_tanh_ = uses_tanh_ || op.unary == ir::UnaryFn::Tanh;
        uses_gelu_tanh_ = uses_gelu_tanh_ || op.unary == ir::UnaryFn::GeluTanh;
        e = unary(op.unary, paren(align(convert(in(0), in_dtype(0), t), in_dims(0), r.dims, false, op)));
        what = ir::name(op.unary);
        break;
      }
      case OpKind::Binary: {
        DType t = ir::operand_dtype(op.binary, promote(in_dtype(0), in_dtype(1)));
        e = binary(op.binary, paren(align(convert(in(0), in_dtype(0), t), in_dims(0), r.dims, false, op)),
                   paren(align(convert(in(1), in_dtype(1), t), in_dims(1), r.dims, false, op)), t);
        what = ir::name(op.binary);
        break;
      }
      case OpKind::Where:
        e = fmt::format("tl.where({}, {}, {})",
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
        if (axis != ir::kOne) {
          // Elements past the end (a ragged or padded block) must not reach the reduction.
          std::string m = mask(axis, lines);
          if (!m.empty())
            x = fmt::format("tl.where({}, {}, {})", align(m, {axis}, in_dims(0), false, op), x, identity(op.reduce, r.dtype));
        }
        e = reduce(op.reduce, r.dtype, x, op.dim, op.keepdim);
        if (an_.looped(axis)) e = combine(op.reduce, r.dtype, name(op.result), e);  // this block into the running result
        what = fmt::format("{} over {}", ir::name(op.reduce), ir::dim_name(k_, axis));
        break;
      }
      case OpKind::Dot:
        e = dot(op, lines);
        what = "dot";
        break;
      case OpKind::Scan: {
        e = scan(op, lines);
        if (e.empty()) return;  // written with its own line
        what = fmt::format("{} along {}{}", ir::scan_name(k_, k_.combines[size_t(op.combine)]),
                           ir::dim_name(k_, k_.value(op.inputs[0]).dims[size_t(op.dim)]), op.reverse ? ", reversed" : "");
        break;
      }
      case OpKind::Store: break;
    }
    lines.push_back(fmt::format("{} = {}  # {}: {}{}  ({})", name(op.result), e, what, dtype_name(r.dtype),
                                dims_text(r.dims), loc));
  }

  // ---- the module ----

  std::vector<std::string> tensor_comments() const {
    std::vector<std::string> lines;
    for (const ir::HostTensor& t : k_.tensors)
      lines.push_back(fmt::format("{} {}: {}{}{}", t.role == ir::HostRole::Input ? "input " : "output", shown(t.name),
                                  dtype_name(t.dtype),
                                  general() ? fmt::format(", rank {}", t.shape.size()) : fmt::format("[{}]", fmt::join(t.shape, ", ")),
                                  t.fill ? fmt::format(" (starts at {})", literal(*t.fill, t.dtype)) : ""));
    for (const ir::ScalarParam& s : k_.scalars) lines.push_back(fmt::format("scalar {}: {}", shown(s.name), dtype_name(s.dtype)));
    return lines;
  }

  std::string header() const {
    std::string out = fmt::format("# Kernel '{}', generated by Deuteron for the triton target{}.\n", shown(k_.name),
                                  general() ? ": a general module, for any sizes (run(..., sizes=...))" : "");
    out += fmt::format("# config: {}\n", p_.config.dump());
    for (const std::string& l : tensor_comments()) out += "# " + l + "\n";
    if (general()) {
      out += "# grid: tl.cdiv(size, block) programs per tiled axis, last axis fastest; sizes are the kernel's\n";
      out += "# arguments E_<axis>, a whole dim's block the launcher's (its size, to a power of two).\n";
      out += "# Every block is masked: loads read 0 past the end, stores skip it, and reductions and\n";
      out += "# products ignore it.\n";
    } else {
      std::vector<std::string> g;
      for (size_t i = 0; i < p_.grid_axes.size(); ++i)
        g.push_back(fmt::format("{}: {}", k_.axes[size_t(p_.grid_axes[i])].name, p_.grid_blocks[i]));
      out += fmt::format("# grid: {} programs ({}), last axis fastest{}\n", p_.grid_size(), fmt::join(g, ", "),
                         grouped() ? fmt::format("; grouped {} at a time along {}", an_.grid_group(),
                                                 k_.axes[size_t(p_.grid_axes[p_.grid_axes.size() - 2])].name)
                                   : "");
      Footprint f = footprint(an_);
      out += fmt::format("# {} (estimate)\n", f.describe(gpu_));
      out += "# Partial and padded blocks are masked: loads read 0 there, stores skip them, and\n";
      out += "# reductions and products ignore them.\n";
    }
    out += "import torch\n";
    out += "import triton\n";
    out += "import triton.language as tl\n\n";
    return out;
  }

  std::string constants() const {
    std::string out = "# Block sizes in elements, per axis (powers of two).\n";
    for (size_t a = 0; a < k_.axes.size(); ++a) {
      const ir::Axis& ax = k_.axes[a];
      const AxisInfo& in = an_.axes[a];
      std::string what;
      if (in.sized_at_call) continue;  // the launcher's: from the call's size
      if (general() && !in.scalar && ax.kind != ir::AxisKind::Fixed) {
        what = fmt::format("{} dim {}: any size", in.looped ? "looped reduction" : in.grid ? "tiled" : "inner-loop", ax.name);
      } else if (in.scalar) {
        what = fmt::format("grid index {}: one element per program", ax.name);
      } else if (in.loop >= 0 || in.looped) {
        int64_t blocks = an_.blocks(int(a));
        what = fmt::format("{} dim {}: {} elements in {} block{}{}",
                           in.looped ? "looped reduction" : in.grid ? "tiled" : "inner-loop", ax.name,
                           ax.extent - in.begin, blocks, blocks == 1 ? "" : "s",
                           in.end >= 0 ? ", up to a bound computed on the device" : in.masked ? ", the last one partial" : "");
      } else {
        what = fmt::format("{} dim {}: {} elements{}", ax.kind == ir::AxisKind::Reduction ? "whole" : "fixed", ax.name,
                           ax.extent, in.masked ? ", padded" : "");
      }
      out += fmt::format("{} = {}  # {}\n", axis_const(int(a)), in.block, what);
    }
    out += fmt::format("NUM_WARPS = {}\n", an_.num_warps());
    out += fmt::format("NUM_STAGES = {}  # software pipelining of inner loops (tl.range)\n\n\n", an_.num_stages());
    return out;
  }

  // A product as an operand of % or //: parenthesised when it is one.
  static std::string grouped_term(const std::string& x) { return x.find(' ') == std::string::npos ? x : "(" + x + ")"; }

  // A general module's size arguments: the extent of every axis but the fixed ones, then the
  // strides of each tensor's dims but its last.
  std::vector<std::string> size_args() const {
    std::vector<std::string> out;
    if (!general()) return out;
    for (size_t a = 0; a < k_.axes.size(); ++a)
      if (runtime_extent(int(a))) out.push_back(extent(int(a)));
    for (size_t t = 0; t < k_.tensors.size(); ++t)
      for (size_t d = 0; d + 1 < k_.tensors[t].shape.size(); ++d) out.push_back(stride(int(t), d));
    return out;
  }

  bool loops() const {
    return std::any_of(k_.loops.begin(), k_.loops.end(), [](const ir::Loop& l) { return !l.grid; });
  }
  bool grouped() const { return an_.grid_group() > 1 && p_.grid_axes.size() >= 2; }

  // pid -> a block index per grid axis (last axis fastest), grouped along the second-fastest
  // one when the config says so (Triton's L2-friendly ordering for matmul-like grids).
  Lines program_ids() const {
    Lines out = {"pid = tl.program_id(0)"};
    size_t n = p_.grid_axes.size();
    auto pid = [&](size_t i) { return "pid_" + axis_name(p_.grid_axes[i]); };
    // Blocks along grid axis i: a number, or in a general module counted from its size.
    auto blocks = [&](size_t i) {
      return runtime_extent(p_.grid_axes[i]) ? "G_" + axis_name(p_.grid_axes[i]) : fmt::format("{}", p_.grid_blocks[i]);
    };
    auto product = [](const std::string& a, const std::string& b) {
      if (a.find_first_not_of("0123456789") == std::string::npos && b.find_first_not_of("0123456789") == std::string::npos)
        return fmt::format("{}", std::stoll(a) * std::stoll(b));
      return fmt::format("{} * {}", a, b);
    };
    if (general())
      for (size_t i = 0; i < n; ++i)
        if (runtime_extent(p_.grid_axes[i]))
          out.push_back(fmt::format("{} = {}  # blocks along {}", blocks(i), block_count(p_.grid_axes[i]),
                                    k_.axes[size_t(p_.grid_axes[i])].name));
    if (n == 1) {
      out.push_back(fmt::format("{} = pid  # block index along {}", pid(0), k_.axes[size_t(p_.grid_axes[0])].name));
      return out;
    }
    size_t inner = grouped() ? n - 2 : n - 1;  // axes from `inner` on are decoded together
    std::string stride;
    if (grouped()) {
      std::string m = blocks(n - 2), nn = blocks(n - 1), group = fmt::format("{}", an_.grid_group());
      std::string local = inner == 0 ? "pid" : fmt::format("pid % {}", grouped_term(product(m, nn)));
      out.push_back(fmt::format("in_group = {} % {}  # {} rows of {} blocks form a group", local,
                                grouped_term(product(group, nn)), group, k_.axes[size_t(p_.grid_axes[n - 1])].name));
      out.push_back(fmt::format("first = ({}) // {} * {}", local, grouped_term(product(group, nn)), group));
      out.push_back(fmt::format("rows = tl.minimum({} - first, {})", m, group));
      out.push_back(fmt::format("{} = first + in_group % rows", pid(n - 2)));
      out.push_back(fmt::format("{} = in_group // rows", pid(n - 1)));
      stride = product(m, nn);
    } else {
      out.push_back(fmt::format("{} = pid % {}", pid(n - 1), blocks(n - 1)));
      stride = blocks(n - 1);
    }
    for (size_t i = inner; i-- > 0;) {
      std::string q = stride.find(' ') == std::string::npos ? fmt::format("pid // {}", stride) : fmt::format("pid // ({})", stride);
      out.push_back(fmt::format("{} = {}", pid(i), i == 0 ? q : fmt::format("{} % {}", q, blocks(i))));
      stride = product(stride, blocks(i));
    }
    return out;
  }

  std::string kernel(const Lines& body) const {
    std::vector<std::string> params;
    for (const ir::HostTensor& t : k_.tensors) params.push_back(py_name(t.name) + "_ptr");
    for (const ir::ScalarParam& s : k_.scalars) params.push_back(py_name(s.name));
    for (const std::string& a : size_args()) params.push_back(a);
    for (size_t a = 0; a < k_.axes.size(); ++a) params.push_back(axis_const(int(a)) + ": tl.constexpr");
    if (loops()) params.push_back("NUM_STAGES: tl.constexpr");
    std::string out;
    if (uses_tanh_ || uses_gelu_tanh_) {
      out += "@triton.jit\n";
      out += "def _tanh(x):\n";
      out += "    return 2.0 * tl.sigmoid(2.0 * x) - 1.0  # tl.math has no tanh (libdevice's does not interpret)\n\n\n";
    }
    if (uses_gelu_tanh_) {
      out += "@triton.jit\n";
      out += "def _gelu_tanh(x):\n";
      out += "    return 0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))\n\n\n";
    }
    for (const char* h : helpers()) out += std::string(h) + "\n\n";
    out += combine_functions_;
    out += "@triton.jit\n";
    out += fmt::format("def {}(\n", kernel_name());
    for (const std::string& s : params) out += fmt::format("    {},\n", s);
    out += "):\n";
    out += fmt::format("    \"\"\"One program of '{}': the grid loop's body on one block.\"\"\"\n", shown(k_.name));
    for (const std::string& l : program_ids()) out += "    " + l + "\n";
    Lines trimmed = body;
    while (!trimmed.empty() && trimmed.back().empty()) trimmed.pop_back();
    for (const std::string& l : trimmed) out += l.empty() ? "\n" : "    " + l + "\n";
    return out;
  }

  std::string launcher() const {
    std::vector<std::string> inputs, doc_in, doc_out, outputs;
    for (const ir::HostTensor& t : k_.tensors) {
      std::string n = py_name(t.name);
      (t.role == ir::HostRole::Input ? inputs : outputs).push_back(n);
      (t.role == ir::HostRole::Input ? doc_in : doc_out)
          .push_back(general() ? fmt::format("{} {} rank {}", n, dtype_name(t.dtype), t.shape.size())
                               : fmt::format("{} {}[{}]", n, dtype_name(t.dtype), fmt::join(t.shape, ", ")));
    }
    std::vector<std::string> params = inputs;
    std::vector<std::string> kw;
    for (const ir::ScalarParam& s : k_.scalars) kw.push_back(py_name(s.name));
    if (general()) kw.push_back("sizes");
    std::string out;
    out += "def _check(name, x, shape, dtype):\n";
    out += "    if tuple(x.shape) != shape or x.dtype != dtype or not x.is_contiguous():\n";
    out += "        raise ValueError(f\"{name}: expected a contiguous {dtype} tensor of shape {list(shape)}, \"\n";
    out += "                         f\"got {x.dtype}{list(x.shape)} with strides {x.stride()}\")\n\n\n";
    out += fmt::format("def run({}{}):\n", fmt::join(params, ", "),
                       kw.empty() ? "" : fmt::format("{}*, {}", params.empty() ? "" : ", ", fmt::join(kw, ", ")));
    out += fmt::format("    \"\"\"{}: {} -> {}.\"\"\"\n", shown(k_.name), fmt::join(doc_in, ", "), fmt::join(doc_out, ", "));
    std::string device = inputs.empty() ? "\"cuda\"" : inputs.front() + ".device";
    size_t at = k_.axes.size();  // where the tensors' dims start in `sizes`
    if (general()) {
      out += "    # sizes: the extent of every axis, then each tensor's dims\n";
      for (size_t a = 0; a < k_.axes.size(); ++a)
        if (runtime_extent(int(a))) out += fmt::format("    {} = sizes[{}]\n", extent(int(a)), a);
      for (size_t a = 0; a < k_.axes.size(); ++a)
        if (an_.axes[a].sized_at_call)
          out += fmt::format("    {} = {}  # the whole dim {} in one block\n", axis_const(int(a)),
                             an_.axes[a].block > 1 ? fmt::format("max(triton.next_power_of_2({}), {})", extent(int(a)), an_.axes[a].block)
                                                   : fmt::format("triton.next_power_of_2({})", extent(int(a))),
                             k_.axes[a].name);
    }
    for (const ir::HostTensor& t : k_.tensors) {
      std::vector<std::string> shape;
      for (int64_t d : t.shape) shape.push_back(general() ? fmt::format("sizes[{}]", at++) : fmt::format("{}", d));
      std::string n = py_name(t.name);
      if (t.role == ir::HostRole::Input) {
        out += fmt::format("    _check(\"{}\", {}, {}, {})\n", n, n, py_tuple(shape), torch_type(t.dtype));
      } else if (t.fill) {
        out += fmt::format("    {} = torch.full({}, {}, dtype={}, device={})\n", n, py_tuple(shape),
                           literal(*t.fill, t.dtype), torch_type(t.dtype), device);
      } else {
        out += fmt::format("    {} = torch.empty({}, dtype={}, device={})\n", n, py_tuple(shape), torch_type(t.dtype), device);
      }
    }
    if (uses_descriptors_) {
      out += "    # Tensor descriptors take a scratch allocation on the device (TMA).\n";
      out += fmt::format("    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, "
                         "device={}))\n", device);
    }
    std::vector<std::string> args;
    for (const ir::HostTensor& t : k_.tensors) args.push_back(py_name(t.name));
    for (const ir::ScalarParam& s : k_.scalars) args.push_back(py_name(s.name));
    if (general()) {
      for (size_t a = 0; a < k_.axes.size(); ++a)
        if (runtime_extent(int(a))) args.push_back(extent(int(a)));
      for (const ir::HostTensor& t : k_.tensors)
        for (size_t d = 0; d + 1 < t.shape.size(); ++d) args.push_back(fmt::format("{}.stride({})", py_name(t.name), d));
    }
    for (size_t a = 0; a < k_.axes.size(); ++a) args.push_back(fmt::format("{0}={0}", axis_const(int(a))));
    if (loops()) args.push_back("NUM_STAGES=NUM_STAGES");
    args.push_back("num_warps=NUM_WARPS");
    args.push_back("num_stages=NUM_STAGES");
    std::string grid = fmt::format("{}", p_.grid_size());
    if (general()) {
      std::vector<std::string> g;
      for (int a : p_.grid_axes) {
        int64_t begin = an_.axes[size_t(a)].begin;
        g.push_back(runtime_extent(a) ? fmt::format("triton.cdiv({}{}, {})", extent(a), begin ? fmt::format(" - {}", begin) : "",
                                                    axis_const(a))
                                      : fmt::format("{}", an_.blocks(a)));
      }
      grid = g.empty() ? "1" : fmt::format("{}", fmt::join(g, " * "));
    }
    out += fmt::format("    {}[({},)](\n", kernel_name(), grid);
    for (const std::string& a : args) out += fmt::format("        {},\n", a);
    out += "    )\n";
    out += fmt::format("    return {}\n", outputs.size() == 1 ? outputs[0] : fmt::format("{}", fmt::join(outputs, ", ")));
    return out;
  }
};

}  // namespace

std::string Footprint::describe(const Gpu& g) const {
  return fmt::format("{}: {} of shared memory for tl.dot operands (of {} per block), {} registers per thread for "
                     "loop-carried values (of {})",
                     g.name, human_bytes(shared_bytes), human_bytes(g.shared_bytes_per_block), carried_registers,
                     g.max_registers_per_thread);
}

std::string python_name(const std::string& name) { return py_name(name); }

void check_expressible(const plan::Plan& p) { Analysis an(p, false); }

Footprint check(const plan::Plan& p, const Gpu& g, bool resources) {
  Analysis an(p, false);
  const ir::Kernel& k = p.kernel;
  auto fail = [&](const std::string& rule, const std::string& hint) {
    throw ConfigError("triton: " + rule, format_location(k.loc), hint);
  };
  for (size_t a = 0; a < k.axes.size(); ++a)
    if ((an.tunable(int(a)) || an.axes[a].looped) && !pow2(an.axes[a].block))
      fail(fmt::format("{} = {} is not a power of two, which tl.arange needs", an.block_param(int(a)), an.axes[a].block),
           fmt::format("choose a power of two for {}", an.block_param(int(a))));
  for (const ir::Op& op : k.ops) {
    if (op.kind == OpKind::Dot && op.result >= 0) {
      for (int d : an.dot_dims(op))
        if (an.axes[size_t(d)].block < kMinDotBlock)
          throw ConfigError(fmt::format("triton: tl.dot needs blocks of at least {0} x {0} x {0}, but {1} = {2}",
                                        kMinDotBlock, an.block_param(d), an.axes[size_t(d)].block),
                            format_location(op.loc), fmt::format("set {} to {} or more", an.block_param(d), kMinDotBlock));
    }
    if (op.result >= 0 && an.elements(k.value(op.result).dims) > kMaxBlockElements)
      throw ConfigError(fmt::format("triton: a block of {} elements ({}) is more than Triton's limit of {} "
                                    "(TRITON_MAX_TENSOR_NUMEL)",
                                    an.elements(k.value(op.result).dims), ir::dim_name(k, k.value(op.result).dims.front()),
                                    kMaxBlockElements),
                        format_location(op.loc), "use smaller blocks");
  }
  Footprint f = footprint(an);
  if (!resources) return f;
  if (f.shared_bytes > g.shared_bytes_per_block)
    fail(fmt::format("the config needs {} of shared memory for tl.dot's operands on {}, more than its {} per block",
                     human_bytes(f.shared_bytes), g.name, human_bytes(g.shared_bytes_per_block)),
         "use smaller blocks or fewer num_stages");
  if (f.carried_registers > g.max_registers_per_thread)
    fail(fmt::format("the loop-carried values need about {} registers per thread with num_warps = {}, more than {}'s "
                     "{} (they would spill)",
                     f.carried_registers, an.num_warps(), g.name, g.max_registers_per_thread),
         "use smaller blocks or more num_warps");
  return f;
}

std::string generate(const plan::Plan& p, const Gpu& g, bool general) {
  Analysis an(p, general);
  return Generator(an, g).run();
}

}  // namespace deuteron::triton
