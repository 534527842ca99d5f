#include "backends/pallas/codegen.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "config/keys.h"
#include "backends/python/source.h"
#include "deuteron/error.h"
#include "plan/reduce_loops.h"
#include "runtime/text.h"

namespace deuteron::pallas {

namespace {

using ir::OpKind;

// ---- Python text helpers ----------------------------------------------------------------------

// Names a generated identifier must not take besides Python's keywords: the module's own.
const std::set<std::string> kModuleNames = {"jax", "jnp", "pl", "pltpu", "functools", "run", "interpret", "INTERPRET", "kernel", "sizes"};

std::string py_name(const std::string& s) { return python::identifier(s, kModuleNames); }

// Users' names (and source file names) in comments and docstrings: escaped, so that none can
// end the comment or the docstring and start code.
std::string shown(const std::string& name) { return runtime::escaped(name); }

using python::upper;

std::string py_tuple(const std::vector<std::string>& v) { return python::tuple(v); }

std::string py_float(double x) { return python::float_literal(x, "jnp.inf", "jnp.nan"); }

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

// Integer and random functions the module spells as Python helpers, written into a module
// only when its kernel uses them: torch's semantics, in int32 and uint32 (TPUs have no 64-bit integers).
constexpr const char* kShiftHelpers = R"(def _shl(a, b, bits):
    """torch's <<: a count outside [0, bits) gives 0."""
    return jnp.where((b < 0) | (b >= bits), 0, jax.lax.shift_left(a, jnp.clip(b, 0, 31)))


def _shr(a, b, bits):
    """torch's >> (arithmetic): a count outside [0, bits) gives the sign, 0 or -1."""
    return jax.lax.shift_right_arithmetic(a, jnp.where((b < 0) | (b >= bits), 31, jnp.minimum(b, 31)))


)";

constexpr const char* kDivisionHelpers = R"(def _floor_divide(a, b):
    """Python's // : rounds down; x // 0 = 0 and MIN // -1 wraps to MIN (as on every target)."""
    d = jnp.where((b == 0) | (b == -1), 1, b)
    q = jax.lax.div(a, d)
    q = jnp.where((jax.lax.rem(a, d) != 0) & ((a < 0) != (d < 0)), q - 1, q)
    return jnp.where(b == 0, 0, jnp.where(b == -1, -a, q))


def _remainder(a, b):
    """Python's % : the divisor's sign; x % 0 = x."""
    d = jnp.where((b == 0) | (b == -1), 1, b)
    r = jax.lax.rem(a, d)
    r = jnp.where((r != 0) & ((r < 0) != (d < 0)), r + d, r)
    return jnp.where(b == 0, a, jnp.where(b == -1, 0, r))


)";

constexpr const char* kRandomHelpers = R"(def _umulhi(a, b):
    """The high word of the 64-bit product of uint32 a and b, from 16-bit halves (no uint64 on TPUs)."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    b_lo, b_hi = b & 0xFFFF, b >> 16
    cross = ((a_lo * b_lo) >> 16) + ((a_hi * b_lo) & 0xFFFF) + a_lo * b_hi
    return a_hi * b_hi + ((a_hi * b_lo) >> 16) + (cross >> 16)


def _philox(seed, offset):
    """Philox4x32-10 of counter (offset lo, offset hi, 0, 0) under key (seed lo, seed hi).

    Both are int32 here, int64 in the kernel: their high words are the sign extension."""
    k0, k1 = seed.astype(jnp.uint32), (seed >> 31).astype(jnp.uint32)
    c0, c1 = offset.astype(jnp.uint32), (offset >> 31).astype(jnp.uint32)
    c2 = c3 = jnp.zeros_like(c0)
    for r in range(10):
        if r > 0:
            k0, k1 = k0 + jnp.uint32(0x9E3779B9), k1 + jnp.uint32(0xBB67AE85)
        m0, m1 = jnp.uint32(0xD2511F53), jnp.uint32(0xCD9E8D57)
        c0, c1, c2, c3 = _umulhi(m1, c2) ^ c1 ^ k0, m1 * c2, _umulhi(m0, c0) ^ c3 ^ k1, m0 * c0
    return c0, c1, c2, c3


def _uniform(w, add=0):
    """[0, 1) (with add=1: (0, 1]) from a word's top 24 bits, exactly."""
    return ((w >> 8) + jnp.uint32(add)).astype(jnp.float32) * jnp.float32(2.0**-24)


def _rand(seed, offset):
    return _uniform(_philox(seed, offset)[0])


def _randn(seed, offset):
    """Box-Muller on the first two words."""
    w = _philox(seed, offset)
    return jnp.sqrt(-2.0 * jnp.log(_uniform(w[0], 1))) * jnp.cos(jnp.float32(6.283185307179586) * _uniform(w[1]))


def _randint(seed, offset):
    return jax.lax.bitcast_convert_type(_philox(seed, offset)[0], jnp.int32)


)";

using python::human_bytes;

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// ---- analysis: how the plan maps onto one pallas_call -----------------------------------------

// How an inner loop runs on a TPU, from the placement the plan gave its operands (config
// inner_<axis>): resident operands are whole in VMEM and sliced by a loop unrolled at trace
// time; streamed ones are staged block by block by a nested pltpu.emit_pipeline; in-place ones
// stay in HBM and the loop (a jax.lax.fori_loop) copies each block into VMEM scratch itself.
enum class LoopKind { Unroll, Pipeline, Fori };

// One block of a tensor as a BlockSpec (of the pallas_call or of a nested pipeline) or a
// manual copy sees it.
struct Block {
  int tensor = -1;
  bool output = false;
  std::vector<int64_t> shape;           // per tensor dim; 1 for a squeezed dim
  std::vector<bool> squeezed;           // per tensor dim: block dim None (a scalar index)
  std::vector<std::string> shape_text;  // per tensor dim: "BLOCK_M", "None", "300"
  std::vector<std::string> index;       // per tensor dim: the block index
  std::vector<int> axis;                // per tensor dim: the axis setting the block, or -1
  std::set<int> grid_axes;              // grid axes its index depends on
  std::vector<int64_t> reach;           // per tensor dim: elements the block indices reach
  int first_op = -1;
  int buffers = 2;
  bool same_as(const Block& o) const {
    return tensor == o.tensor && output == o.output && shape == o.shape && squeezed == o.squeezed && index == o.index;
  }
};

// One operand of the pallas_call: a blocked VMEM operand, or (hbm) the whole array left in HBM
// (memory_space=pl.ANY) for inner loops to stream.
struct Operand {
  Block block;
  bool hbm = false;
  std::string ref;  // kernel parameter
  // An HBM array streamed in whole blocks, padded up to them: run() pads the input, or slices
  // the output; empty when no copy reads past the array. A fori_loop's copies move whole
  // blocks, so its arrays are always padded. emit_pipeline rounds a partial block's copy up
  // to whole (8, 128) tiles, which a TPU's tiled HBM layout holds but the interpreter's
  // bounds check (against the logical shape) does not: those are padded in interpret mode.
  std::vector<int64_t> padded;
  std::vector<std::string> padded_text;  // a general module's: per dim, the padded size as an expression
  bool pad_on_tpu = false;
};

// A block an inner loop streams from an HBM operand: a spec of its emit_pipeline, or the VMEM
// scratch buffers of its fori_loop's copies.
struct Stream {
  int loop = -1;  // index into Analysis::inner
  int operand = -1;  // the HBM operand
  Block block;
  int inner_dim = -1;  // the tensor dim the loop's axis drives
  std::string ref;     // the body's block ref (pipeline) or the scratch buffer (fori_loop)
};

// An inner loop of the grid loop's body.
struct Inner {
  int loop = -1;  // IR loop
  int axis = -1;
  LoopKind kind = LoopKind::Unroll;
  int buffers = 2;        // Pipeline: blocks staged ahead; Fori: 1 or 2 (single, double)
  int64_t begin = 0;      // first element (a constant begin)
  ir::ValueId begin_value = -1;  // a begin computed on the device (then `begin` is 0)
  int64_t blocks = 0;     // blocks when the end is a constant (else an upper bound)
  ir::ValueId end = -1;   // an end computed on the device (else the axis' extent)
  std::vector<int> streams;
  std::vector<int> carried;  // indices into plan.carried
  std::string index;         // the loop's block index variable: "i_kv"
};

// Where an access op finds its block: a pallas_call operand or a stream, and the ref index.
struct Access {
  int operand = -1;
  int stream = -1;
  std::string index;  // "[...]", "[:, 2:5]", "[pl.ds(i_kv * BLOCK_KV, BLOCK_KV), :]"
};

// Inside a ReduceLoop, the pl.ds slice of the current block of its axis: "r0_block".
std::string block_slice(const ir::Kernel& k, int axis) { return py_name(k.axes[size_t(axis)].name) + "_block"; }

// A fusion group of the grid loop's body over an axis reduced in blocks (plan/reduce_loops.h):
// the operand blocks hold the whole dim, and the group runs as a loop unrolled at trace time
// over the axis' blocks, its reductions accumulating in Python values (initialised before the
// loop, complete after it). Each block is sliced to its real length, so the last one is short
// rather than masked.
using plan::ReduceLoop;

// An access at indices read from a tensor.
bool gathers(const ir::Op& op);

class Analysis {
 public:
  // general: a module for any sizes (ahead-of-time builds), see generate().
  Analysis(const plan::Plan& p, const TpuGeneration& chip, bool general = false)
      : p(p), k(p.kernel), chip(chip), general(general), block(p.block), partial(p.partial) {
    run();
  }

  const plan::Plan& p;
  const ir::Kernel& k;
  const TpuGeneration& chip;
  const bool general;
  int grid_loop = -1;
  const std::vector<int64_t>& block;  // per axis: the plan's block (refined by fit_blocks)
  const std::vector<bool>& partial;   // per axis: the plan's ragged edges
  std::vector<int64_t> begin;         // per axis: first index its loop covers
  std::vector<int> inner_of_axis;   // per axis: its entry of `inner`, or -1
  std::vector<Operand> operands;    // inputs (tensor order), then outputs (tensor order)
  std::vector<Stream> streams;
  std::vector<Inner> inner;
  std::map<int, Access> access;     // access op -> its block
  std::vector<ReduceLoop> reduce_loops;
  std::map<int, int> reduce_loop_of_op;  // op -> its entry of reduce_loops
  std::set<int> smem_gathers;            // gathering loads in the keys::kSmem form (else one-hot)
  // Integer tensors read as scalars (offsets[{s}], lengths[{r, 0}]): passed whole, flattened, into
  // SMEM by scalar prefetch (pltpu.PrefetchScalarGridSpec), in tensor order, each once.
  std::set<int> scatters;                 // hl::atomic_add ops at gathered indices
  std::vector<int> prefetched;            // tensors
  std::map<int, int> prefetch_of_op;      // scalar load op -> its tensor's entry of `prefetched`

  // An axis of kind Reduction split into blocks (not persistent).
  bool looped(int axis) const { return plan::looped(p, axis); }
  // The looped axis among a value's dims, or -1: the value exists one block at a time.
  int looped_dim(ir::ValueId v) const { return plan::looped_dim(p, v); }

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
  const Inner* inner_for_loop(int loop) const {
    for (const Inner& in : inner)
      if (in.loop == loop) return &in;
    return nullptr;
  }
  // The block an access op reads or writes (a pallas_call operand's or a stream's).
  const Block& access_block(int op) const {
    const Access& a = access.at(op);
    return a.stream >= 0 ? streams[size_t(a.stream)].block : operands[size_t(a.operand)].block;
  }
  bool grid_axis(int axis) const {
    return std::find(p.grid_axes.begin(), p.grid_axes.end(), axis) != p.grid_axes.end();
  }
  int grid_position(int axis) const {
    return int(std::find(p.grid_axes.begin(), p.grid_axes.end(), axis) - p.grid_axes.begin());
  }

  // ---- sizes: numbers, or in a general module the call's ----
  // A general module is generated at a probe shape whose sizes are larger than any block and
  // ragged (tools/deuteron/aot_command.cpp), so a block that equals its axis' extent there is
  // the whole dim at any size, and any other block leaves a partial last block at some size.

  // Whether axis a's extent is the call's in a general module (E_<axis>): all but fixed axes.
  bool sized_at_call(int a) const { return general && k.axes[size_t(a)].kind != ir::AxisKind::Fixed; }
  // Axis a's block covers its whole dim (in a general module: the call's whole dim, BLOCK_<AXIS> = E_<axis>).
  bool whole(int a) const { return block[size_t(a)] >= k.axes[size_t(a)].extent; }
  bool whole_at_call(int a) const { return sized_at_call(a) && whole(a); }
  // The last block along tiled axis a may be partial.
  bool ragged(int a) const {
    return partial[size_t(a)] ||
           (general && k.axes[size_t(a)].kind == ir::AxisKind::Tile && !whole(a) && block[size_t(a)] > 1);
  }
  // Grid position i runs one step: the whole dim in one block.
  bool single_step(size_t i) const { return general ? whole(p.grid_axes[i]) : p.grid_blocks[i] <= 1; }
  // The size axis a's extent is: the first axis of that extent (axes of one extent follow one
  // shape parameter at the probe shape, so share one name, E_<first axis>).
  int size_axis(int a) const {
    for (int b = 0; b < a; ++b)
      if (sized_at_call(b) && k.axes[size_t(b)].extent == k.axes[size_t(a)].extent) return b;
    return a;
  }
  std::string extent_text(int a) const {
    return sized_at_call(a) ? "E_" + py_name(k.axes[size_t(size_axis(a))].name) : fmt::format("{}", k.axes[size_t(a)].extent);
  }
  // The size dim d of tensor t is (a size_axis), or -1: a number.
  int dim_axis(int t, size_t d) const {
    if (!general) return -1;
    for (size_t a = 0; a < k.axes.size(); ++a)
      if (sized_at_call(int(a)) && k.axes[a].extent == k.tensors[size_t(t)].shape[d]) return int(a);
    return -1;
  }
  std::string dim_text(int t, size_t d) const {
    int a = dim_axis(t, d);
    return a >= 0 ? extent_text(a) : fmt::format("{}", k.tensors[size_t(t)].shape[d]);
  }

 private:
  [[noreturn]] void unsupported(const std::string& construct, const std::string& detail,
                                const std::string& at, const std::string& hint = "") const {
    throw CompileError(
        fmt::format("the pallas target does not support {} yet: kernel '{}' {}", construct, k.name, detail),
        at, hint.empty() ? "run this kernel on the cpu target" : hint);
  }
  void config_error(const std::string& message, const std::string& at, const std::string& hint) {
    if (!config_problem) config_problem = ConfigError(message, at, hint);
  }

  void run() {
    grid_loop = k.grid_loop_id();
    const ir::Loop& grid = k.grid_loop();
    for (size_t i = 0; i < grid.axes.size(); ++i)
      if (grid.begin[i].value >= 0 || grid.end[i].value >= 0)
        unsupported("grid loops with bounds computed on the device", "has one", format_location(grid.loc));
    for (const ir::Stmt& s : grid.body)
      if (s.kind == ir::Stmt::Kind::Loop) find_inner_loop(s.id);
    for (size_t o = 0; o < k.ops.size(); ++o) {
      const ir::Op& op = k.ops[o];
      if (op.kind != OpKind::Store || !gathers(op)) continue;
      if (!op.atomic_add)
        unsupported("scatters (stores at gathered indices)",
                    fmt::format("writes {} at indices it reads from a tensor", k.tensors[size_t(op.tensor)].name),
                    where(op), "add with hl::atomic_add into an hl::zeros output, or run this kernel on the cpu target");
      check_scatter(op);
      scatters.insert(int(o));
    }
    check_blocks();
    find_reduce_loops();
    find_scalar_reads();
    build_operands();
    choose_gathers();
    check_revisits();
    check_integer_ranges();
    // Constructs first (CompileError: no config helps), then what the config got wrong.
    if (config_problem) throw *config_problem;
    if (general) check_general();
  }

  // What a general module cannot follow at run time yet: ConfigError (aot_command.cpp then
  // builds no general module, saying why).
  void check_general() const {
    auto refuse = [&](const std::string& what, const std::string& at) {
      throw ConfigError(fmt::format("pallas: a general module (any sizes) cannot {}", what), at,
                        "build this kernel's shapes one by one (each has its module)");
    };
    const ir::Loop& grid = k.grid_loop();
    for (size_t i = 0; i < grid.axes.size(); ++i)
      if (grid.begin[i].constant != 0 || grid.end[i].constant != k.axes[size_t(grid.axes[i])].extent)
        refuse("run a grid over part of a dim", format_location(grid.loc));
    for (const Inner& in : inner) {
      if (in.kind == LoopKind::Unroll)
        refuse(fmt::format("keep an inner loop's operands resident (its VMEM and its unrolled trips follow the "
                           "size of {})", k.axes[size_t(in.axis)].name),
               format_location(k.loops[size_t(in.loop)].loc));
      if (in.begin != 0) refuse("start an inner loop at a constant other than 0", format_location(k.loops[size_t(in.loop)].loc));
    }
    // Its sizes come from the inputs' shapes: every axis' extent must be a dim of an input.
    for (size_t a = 0; a < k.axes.size(); ++a) {
      if (!sized_at_call(int(a)) || size_axis(int(a)) != int(a)) continue;
      bool read = false;
      for (size_t t = 0; t < k.tensors.size() && !read; ++t)
        if (k.tensors[t].role == ir::HostRole::Input)
          for (size_t d = 0; d < k.tensors[t].shape.size(); ++d) read = read || dim_axis(int(t), d) == int(a);
      if (!read) refuse(fmt::format("size axis {}: its extent is no input's dim", k.axes[a].name), format_location(k.loc));
    }
  }

  std::optional<ConfigError> config_problem;

  // An inner loop directly inside the grid loop, its kind from its operands' placements.
  void find_inner_loop(int id) {
    const ir::Loop& loop = k.loops[size_t(id)];
    for (const ir::Stmt& s : loop.body)
      if (s.kind == ir::Stmt::Kind::Loop)
        unsupported("loops nested inside inner loops", "has one", format_location(k.loops[size_t(s.id)].loc));
    if (loop.axes.size() != 1)
      unsupported("inner loops over several axes", "tiles several dims in one inner loop", format_location(loop.loc));
    Inner in;
    in.loop = id;
    in.axis = loop.axes.front();
    in.index = "i_" + py_name(k.axes[size_t(in.axis)].name);
    in.begin = loop.begin[0].constant;
    in.begin_value = loop.begin[0].value;
    in.end = loop.end[0].value;
    bool staged = false, in_place = false;
    for (const plan::BlockSpec& s : p.operands) {
      if (s.loop != id || s.store) continue;
      staged = staged || s.placement == plan::Placement::Staged;
      in_place = in_place || s.placement == plan::Placement::InPlace;
    }
    in.kind = staged ? LoopKind::Pipeline : in_place ? LoopKind::Fori : LoopKind::Unroll;
    for (const plan::InnerLoop& il : p.inner_loops)
      if (il.loop == id) in.buffers = std::max(il.buffers, 1);
    if (in.kind == LoopKind::Fori) in.buffers = std::min(in.buffers, 2);
    for (size_t c = 0; c < p.carried.size(); ++c)
      if (p.carried[c].loop == id) in.carried.push_back(int(c));
    const std::string axis = k.axes[size_t(in.axis)].name;
    // Blocks that start at a device value are element offsets, not block indices: only the
    // fori_loop's own copies (pl.ds(begin + i * block, block) from HBM) can address them.
    if (in.begin_value >= 0 && in.kind != LoopKind::Fori)
      config_error(fmt::format("the inner loop over {} starts at a bound computed on the device, so its blocks start "
                               "at element offsets that {} cannot address",
                               axis, in.kind == LoopKind::Unroll ? "a loop unrolled at trace time"
                                                                 : "emit_pipeline's block index maps"),
                   format_location(loop.loc),
                   fmt::format("set {} to {} (a fori_loop copying each block from HBM)", config::keys::inner_loop(axis),
                               config::keys::kInPlace));
    if (in.kind == LoopKind::Unroll && in.end >= 0)
      config_error(fmt::format("the inner loop over {} ends at a bound computed on the device, which a loop "
                               "unrolled at trace time (every operand resident) cannot follow",
                               axis),
                   format_location(loop.loc),
                   fmt::format("set {} to {} (emit_pipeline) or {} (fori_loop)", config::keys::inner_loop(axis),
                               config::keys::kStream, config::keys::kInPlace));
    inner.push_back(in);
  }

  // Blocks and ragged edges are the plan's (refined by fit_blocks); this checks what a TPU
  // adds: index maps address whole blocks, and a whole dim is one block.
  void check_blocks() {
    size_t n = k.axes.size();
    begin.assign(n, 0);
    inner_of_axis.assign(n, -1);
    const ir::Loop& grid = k.grid_loop();
    for (size_t i = 0; i < grid.axes.size(); ++i) begin[size_t(grid.axes[i])] = grid.begin[i].constant;
    for (size_t i = 0; i < inner.size(); ++i) {
      inner_of_axis[size_t(inner[i].axis)] = int(i);
      begin[size_t(inner[i].axis)] = inner[i].begin;
    }
    for (size_t a = 0; a < n; ++a) {
      const ir::Axis& ax = k.axes[a];
      int64_t b = p.block[a];
      if (ax.kind == ir::AxisKind::Tile) {
        if (!grid_axis(int(a)) && inner_of_axis[a] < 0)
          unsupported("tiled dims outside the grid loop and its inner loops",
                      fmt::format("tiles dim {} elsewhere", ax.name), format_location(k.loc));
        if (begin[a] % b != 0)
          config_error(fmt::format("the loop over {} starts at {}, which is not a multiple of its block {} = {}: "
                                   "Pallas index maps address whole blocks",
                                   ax.name, begin[a], block_param(int(a)), b),
                       format_location(k.loc), fmt::format("choose {} dividing {}", block_param(int(a)), begin[a]));
        if (inner_of_axis[a] >= 0) {
          int64_t span = std::max<int64_t>(ax.extent - begin[a], 0);
          inner[size_t(inner_of_axis[a])].blocks = (span + b - 1) / b;
        }
      }
    }
  }

  // The grid loop's groups over a looped reduction axis, and what a loop over its blocks cannot
  // run (a config problem: the persistent reduction runs it).
  void find_reduce_loops() {
    plan::ReduceLoops r = plan::find_reduce_loops(p);
    reduce_loops = std::move(r.loops);
    reduce_loop_of_op = std::move(r.of_op);
    if (r.problem) config_error(r.problem->message(), r.problem->where(), r.problem->hint());
  }

  // A scalar index: the grid index of a one-element (hl::grid) axis (the plan's Scalar term).
  std::string scalar_index(const plan::IndexTerm& t, const ir::Op& op) {
    if (t.grid_axis >= 0 && block[size_t(t.grid_axis)] == 1) {
      int64_t first = begin[size_t(t.grid_axis)];
      std::string name = py_name(k.axes[size_t(t.grid_axis)].name);
      return first ? fmt::format("{} + {}", name, first) : name;
    }
    unsupported("indexing with scalars computed on the device",
                fmt::format("indexes {} with one (only constants and hl::grid indices address whole blocks)",
                            k.tensors[size_t(op.tensor)].name),
                where(op));
  }

  // The block of one access as seen by loop `kind` (the grid's BlockSpec, a resident block
  // spanning the inner loop's whole extent, or one inner block), and its ref index inside the
  // kernel. Block indices along grid axes are the grid's names (the index map's arguments).
  enum class View { Grid, Resident, Streamed };
  Block make_block(const plan::BlockSpec& s, View view, const Inner* in, std::string& ref_index) {
    const ir::Op& op = k.ops[size_t(s.op)];
    const ir::HostTensor& t = k.tensors[size_t(s.tensor)];
    // Inside the kernel (a nested pipeline's index map, a copy's offsets) the grid's block
    // indices are b_<axis>; the pallas_call's index maps take them as arguments named <axis>.
    const std::string g = view == View::Streamed ? "b_" : "";
    std::vector<std::string> slices;
    bool sliced = false;
    Block o;
    o.tensor = s.tensor;
    o.output = s.store;
    o.first_op = s.op;
    for (size_t d = 0; d < s.index_map.size(); ++d) {
      const plan::IndexTerm& e = s.index_map[d];
      int64_t dim = t.shape[d];
      switch (e.kind) {
        case plan::IndexTerm::Kind::Constant:
        case plan::IndexTerm::Kind::Scalar:
          o.shape.push_back(1);
          o.reach.push_back(dim);
          o.squeezed.push_back(true);
          o.shape_text.push_back("None");
          o.index.push_back(e.kind == plan::IndexTerm::Kind::Constant ? fmt::format("{}", e.constant)
                                                                     : g + scalar_index(e, op));
          o.axis.push_back(-1);
          if (e.grid_axis >= 0) o.grid_axes.insert(e.grid_axis);
          continue;
        case plan::IndexTerm::Kind::Block: {
          if (e.offset != 0)
            unsupported("offset slices of a tiled dim",
                        fmt::format("indexes dim {} of {} at {} + {}", d, t.name, k.axes[size_t(e.axis)].name, e.offset),
                        where(op));
          int64_t b = block[size_t(e.axis)];
          std::string name = py_name(k.axes[size_t(e.axis)].name);
          std::string constant = "BLOCK_" + upper(name);
          if (e.grid) name = g + name;
          o.squeezed.push_back(false);
          o.axis.push_back(e.axis);
          if (e.grid) {
            o.reach.push_back((p.grid_blocks[size_t(grid_position(e.axis))] + e.begin / b) * b);
            o.shape.push_back(b);
            o.shape_text.push_back(constant);
            o.index.push_back(e.begin / b ? fmt::format("{} + {}", name, e.begin / b) : name);
            o.grid_axes.insert(e.axis);
            slices.push_back(":");
          } else if (view == View::Resident) {
            // The whole extent, padded to whole blocks so that every slice is in the buffer.
            o.reach.push_back(in->blocks * b + e.begin);
            o.shape.push_back(in->blocks * b + e.begin);
            o.shape_text.push_back(fmt::format("{}", in->blocks * b + e.begin));
            o.index.push_back("0");
            std::string start = fmt::format("{} * {}", in->index, constant);
            if (e.begin) start += fmt::format(" + {}", e.begin);
            slices.push_back(fmt::format("pl.ds({}, {})", start, constant));
            sliced = true;
          } else {  // one block of the inner loop: index i (+ the loop's first block)
            // From a device begin (at most the extent) a block may reach one block past the
            // blocks of the extent.
            o.reach.push_back((in->blocks + (in->begin_value >= 0 ? 1 : 0) + e.begin / b) * b);
            o.shape.push_back(b);
            o.shape_text.push_back(constant);
            o.index.push_back(e.begin / b ? fmt::format("{} + {}", in->index, e.begin / b) : in->index);
            slices.push_back(":");
          }
          continue;
        }
        case plan::IndexTerm::Kind::Gather:  // the whole dim: the kernel picks from it (one-hot)
        case plan::IndexTerm::Kind::Whole:
        case plan::IndexTerm::Kind::Looped:  // the whole dim, sliced by its ReduceLoop
          o.squeezed.push_back(false);
          o.index.push_back("0");
          o.shape.push_back(dim);
          o.reach.push_back(dim);
          if (e.kind == plan::IndexTerm::Kind::Looped) {
            std::string at = block_slice(k, e.axis);
            o.shape_text.push_back(dim_text(s.tensor, d));
            o.axis.push_back(e.axis);
            slices.push_back(e.offset ? fmt::format("pl.ds({} + {}.start, {}.size)", e.offset, at, at) : at);
            sliced = true;
          } else if (e.kind != plan::IndexTerm::Kind::Gather && e.offset == 0 && k.axes[size_t(e.axis)].extent == dim) {
            // A whole dim (hl::all) or a fixed range covering it: one block, index 0.
            o.shape_text.push_back("BLOCK_" + upper(py_name(k.axes[size_t(e.axis)].name)));
            o.axis.push_back(e.axis);
            slices.push_back(":");
          } else if (e.kind == plan::IndexTerm::Kind::Gather) {
            o.shape_text.push_back(dim_text(s.tensor, d));
            o.axis.push_back(-1);
            slices.push_back(":");
          } else {
            // Part of a dim at a fixed place: the block holds the whole dim, the kernel slices it.
            o.shape_text.push_back(dim_text(s.tensor, d));
            o.axis.push_back(-1);
            slices.push_back(sized_at_call(e.axis) ? fmt::format("{}:{} + {}", e.offset, e.offset, extent_text(e.axis))
                                                   : fmt::format("{}:{}", e.offset, e.offset + k.axes[size_t(e.axis)].extent));
            sliced = true;
          }
          continue;
      }
    }
    ref_index = sliced ? fmt::format("[{}]", fmt::join(slices, ", ")) : "[...]";
    return o;
  }

  // hl::atomic_add(out, {idx[t], ...}, v): its block of out holds the whole gathered dim (a
  // constant index map, so the grid steps that add into it run in order on one core: the grid
  // axes are "arbitrary"), and a fori_loop adds one row of v at a time at its index. What that
  // loop needs: one gathered dim, the first of the block, indices over one dim of the block.
  void check_scatter(const ir::Op& op) {
    const ir::HostTensor& t = k.tensors[size_t(op.tensor)];
    int gathered = 0, before = 0;
    ir::ValueId idx = -1;
    for (const ir::Index& e : op.index) {
      if (e.kind == ir::Index::Kind::Gather) {
        ++gathered;
        idx = e.value;
      } else if (e.kind == ir::Index::Kind::Axis && !gathered) {
        ++before;
      }
    }
    std::vector<int> rows;
    for (int d : k.value(idx).dims)
      if (d != ir::kOne) rows.push_back(d);
    if (gathered != 1 || before != 0 || rows.size() != 1)
      unsupported("this scatter-add",
                  fmt::format("adds into {} at {}", t.name,
                              gathered != 1 ? "indices along several dims"
                              : before     ? "a gathered dim after a sliced one"
                                           : "indices that are not one block of a tile"),
                  where(op), "gather along the first sliced dim with a 1-D block of indices, or run this kernel on the cpu target");
  }

  // A load of one element of an integer input at constants and hl::grid indices reads SMEM: a
  // VMEM block of one element breaks the block-shape rule, and the scalar unit wants it in SMEM
  // anyway (loop bounds, indices).
  void find_scalar_reads() {
    std::set<int> tensors;
    std::vector<int> ops;
    for (const plan::BlockSpec& s : p.operands) {
      const ir::HostTensor& t = k.tensors[size_t(s.tensor)];
      if (s.store || t.role != ir::HostRole::Input || (t.dtype != DType::i32 && t.dtype != DType::i64)) continue;
      bool scalar = std::all_of(s.index_map.begin(), s.index_map.end(), [&](const plan::IndexTerm& e) {
        return e.kind == plan::IndexTerm::Kind::Constant ||
               (e.kind == plan::IndexTerm::Kind::Scalar && e.grid_axis >= 0 && block[size_t(e.grid_axis)] == 1) ||
               (e.kind == plan::IndexTerm::Kind::Scalar && e.value >= 0 && scalar_index_expressible(e.value));
      });
      if (!scalar) continue;
      tensors.insert(s.tensor);
      ops.push_back(s.op);
    }
    prefetched.assign(tensors.begin(), tensors.end());
    for (int op : ops)
      prefetch_of_op[op] = int(std::find(prefetched.begin(), prefetched.end(), k.ops[size_t(op)].tensor) - prefetched.begin());
  }

  // An index value the kernel can spell as a scalar expression (index_expression): computed
  // values, constants, hl::grid indices and integer arithmetic on them.
  bool scalar_index_expressible(ir::ValueId v) const {
    const ir::Value& val = k.value(v);
    if (p.computed[size_t(v)]) return true;
    if (val.def_op < 0 || is_floating(val.dtype)) return false;
    const ir::Op& op = k.ops[size_t(val.def_op)];
    switch (op.kind) {
      case OpKind::Full: return true;
      case OpKind::TileIndex:
      case OpKind::TileBegin: return op.axis >= 0 && grid_axis(op.axis) && block[size_t(op.axis)] == 1;
      case OpKind::Cast: return scalar_index_expressible(op.inputs[0]);
      case OpKind::Binary:
        return (op.binary == ir::BinaryFn::Add || op.binary == ir::BinaryFn::Sub || op.binary == ir::BinaryFn::Mul ||
                op.binary == ir::BinaryFn::Max || op.binary == ir::BinaryFn::Min) &&
               scalar_index_expressible(op.inputs[0]) && scalar_index_expressible(op.inputs[1]);
      default: return false;
    }
  }

  // The pallas_call operands and the inner loops' streams: one per distinct block (the plan's
  // de-duplication, and equal blocks of different accesses), one HBM operand per tensor that an
  // inner loop streams.
  void build_operands() {
    std::vector<Operand> found;
    std::vector<std::pair<int, std::string>> found_access;  // per spec: (found entry, index)
    std::vector<int> spec_stream(p.operands.size(), -1);
    std::vector<std::string> spec_index(p.operands.size());
    std::vector<int> spec_found(p.operands.size(), -1);
    auto add_found = [&](const Operand& o) {
      for (size_t f = 0; f < found.size(); ++f)
        if (found[f].hbm == o.hbm && found[f].block.same_as(o.block)) return int(f);
      found.push_back(o);
      return int(found.size() - 1);
    };
    for (size_t i = 0; i < p.operands.size(); ++i) {
      const plan::BlockSpec& s = p.operands[i];
      const ir::Op& op = k.ops[size_t(s.op)];
      const ir::HostTensor& t = k.tensors[size_t(s.tensor)];
      if (prefetch_of_op.count(s.op)) continue;  // in SMEM, no block
      if (!s.store && t.role == ir::HostRole::Output)
        unsupported("reading output tensors", fmt::format("reads output {}", t.name), where(op));
      if (s.store && t.role == ir::HostRole::Input)
        unsupported("writing input tensors in place", fmt::format("writes input {}", t.name), where(op));
      if (t.dtype == DType::i64 && s.store)
        unsupported("int64 outputs", fmt::format("writes {} (TPUs have no 64-bit vector types)", tensor_label(s.tensor)),
                    where(op), "return int32 data, or run this kernel on the cpu target");
      const Inner* in = s.loop == grid_loop ? nullptr : inner_for_loop(s.loop);
      if (s.loop != grid_loop && !in)
        unsupported("accesses in nested loops", "has one", where(op));
      Operand o;
      if (!in) {
        o.block = make_block(s, View::Grid, nullptr, spec_index[i]);
        spec_found[i] = add_found(o);
      } else if (in->kind == LoopKind::Unroll) {
        o.block = make_block(s, View::Resident, in, spec_index[i]);
        spec_found[i] = add_found(o);
      } else {
        // Streamed by the loop: the array stays in HBM, the loop stages its blocks.
        Stream st;
        st.loop = int(in - inner.data());
        st.block = make_block(s, View::Streamed, in, spec_index[i]);
        st.block.buffers = in->buffers;
        for (size_t d = 0; d < st.block.axis.size(); ++d)
          if (st.block.axis[d] == in->axis) st.inner_dim = int(d);
        int same = -1;
        for (size_t j = 0; j < streams.size(); ++j)
          if (streams[j].loop == st.loop && streams[j].block.same_as(st.block)) same = int(j);
        if (same < 0) {
          o.hbm = true;
          o.block.tensor = s.tensor;
          o.block.output = s.store;
          o.block.first_op = s.op;
          st.operand = add_found(o);
          streams.push_back(st);
          same = int(streams.size() - 1);
          inner[size_t(st.loop)].streams.push_back(same);
        }
        spec_stream[i] = same;
      }
    }

    // Inputs in tensor order (then first access), then outputs in tensor order.
    std::vector<int> order(found.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      const Block &a = found[size_t(x)].block, &b = found[size_t(y)].block;
      if (a.output != b.output) return !a.output;
      if (a.tensor != b.tensor) return a.tensor < b.tensor;
      return a.first_op < b.first_op;
    });
    std::vector<int> operand_of_found(found.size());
    for (int f : order) {
      const Operand& o = found[size_t(f)];
      if (o.block.output)
        for (const Operand& other : operands)
          if (other.block.output && other.block.tensor == o.block.tensor)
            unsupported("stores with different block specs to one output",
                        fmt::format("stores to {} with two", k.tensors[size_t(o.block.tensor)].name),
                        where(k.ops[size_t(o.block.first_op)]));
      operand_of_found[size_t(f)] = int(operands.size());
      operands.push_back(o);
    }
    for (Stream& st : streams) {
      st.operand = operand_of_found[size_t(st.operand)];
      Operand& o = operands[size_t(st.operand)];
      o.pad_on_tpu = o.pad_on_tpu || inner[size_t(st.loop)].kind == LoopKind::Fori;
      const std::vector<int64_t>& shape = k.tensors[size_t(o.block.tensor)].shape;
      if (o.padded.empty()) o.padded = shape;
      for (size_t d = 0; d < shape.size(); ++d) o.padded[d] = std::max(o.padded[d], st.block.reach[d]);
      if (general) pad_at_call(o, st);
    }
    for (Operand& o : operands)
      if (o.padded == k.tensors[size_t(o.block.tensor)].shape) o.padded.clear();
    for (size_t i = 0; i < p.operands.size(); ++i) {
      if (prefetch_of_op.count(p.operands[i].op)) continue;
      Access a;
      a.index = spec_index[i];
      if (spec_stream[i] >= 0) {
        a.stream = spec_stream[i];
        a.operand = streams[size_t(a.stream)].operand;
      } else {
        a.operand = operand_of_found[size_t(spec_found[i])];
      }
      access[p.operands[i].op] = a;
    }
    // Names: <tensor>_ref (<tensor>_hbm in HBM), numbered when one tensor has several; a
    // stream's block is <tensor>_<axis> (<tensor>_<axis>_buf for a fori_loop's buffers).
    std::map<int, int> count, seen;
    for (const Operand& o : operands) ++count[o.block.tensor];
    for (Operand& o : operands) {
      std::string base = py_name(k.tensors[size_t(o.block.tensor)].name);
      std::string suffix = o.hbm ? "_hbm" : "_ref";
      o.ref = count[o.block.tensor] > 1 ? fmt::format("{}{}{}", base, suffix, seen[o.block.tensor]++) : base + suffix;
      // One buffer when the block is the whole array and never changes (pl.Buffered(1)); two
      // (the pipeline's double buffering) otherwise.
      bool whole = o.block.grid_axes.empty();
      for (size_t d = 0; d < o.block.shape.size(); ++d)
        if (o.block.shape[d] < k.tensors[size_t(o.block.tensor)].shape[d] || o.block.index[d] != "0") whole = false;
      o.block.buffers = o.hbm ? 0 : whole ? 1 : 2;
    }
    // A resident block takes its loop's buffer count (1: fetched when its index changes,
    // without overlap; 2: the next outer step's block is fetched while this one computes).
    for (size_t i = 0; i < p.operands.size(); ++i) {
      if (prefetch_of_op.count(p.operands[i].op)) continue;
      const Inner* in = inner_for_loop(p.operands[i].loop);
      Operand& o = operands[size_t(access[p.operands[i].op].operand)];
      if (in && in->kind == LoopKind::Unroll && o.block.buffers == 2) o.block.buffers = std::min(in->buffers, 2);
    }
    std::map<std::string, int> stream_names;
    for (Stream& st : streams) {
      const Inner& in = inner[size_t(st.loop)];
      std::string base = fmt::format("{}_{}", py_name(k.tensors[size_t(st.block.tensor)].name),
                                     py_name(k.axes[size_t(in.axis)].name));
      if (in.kind == LoopKind::Fori) base += "_buf";
      int n = stream_names[base]++;
      st.ref = n ? fmt::format("{}{}", base, n) : base;
    }
    for (size_t t = 0; t < k.tensors.size(); ++t) {
      if (k.tensors[t].role != ir::HostRole::Output) continue;
      bool stored = std::any_of(operands.begin(), operands.end(),
                                [&](const Operand& o) { return o.block.output && o.block.tensor == int(t); });
      if (!stored)
        unsupported("outputs the kernel never stores", fmt::format("never stores {}", k.tensors[t].name),
                    format_location(k.loc));
    }
  }

  // A general module's padding of a streamed operand: each ragged dim up to the whole blocks
  // its stream reaches at the call's size (the specialised module's numbers, as expressions).
  void pad_at_call(Operand& o, const Stream& st) const {
    const int t = o.block.tensor;
    if (o.padded_text.empty())
      for (size_t d = 0; d < k.tensors[size_t(t)].shape.size(); ++d) o.padded_text.push_back(dim_text(t, d));
    for (size_t d = 0; d < st.block.axis.size(); ++d) {
      int a = st.block.axis[d];
      if (a < 0 || st.block.squeezed[d] || !ragged(a) || st.block.reach[d] != o.padded[d]) continue;
      int64_t b = block[size_t(a)];
      int64_t blocks = grid_axis(a) ? p.grid_blocks[size_t(grid_position(a))] : inner[size_t(inner_of_axis[size_t(a)])].blocks;
      std::string name = "BLOCK_" + upper(py_name(k.axes[size_t(a)].name));
      std::string e = fmt::format("pl.cdiv({0}, {1}) * {1}", extent_text(a), name);
      if (int64_t extra = st.block.reach[d] / b - blocks) e += fmt::format(" + {} * {}", extra, name);
      o.padded_text[d] = e;
    }
  }

  // The gathers the config reads through SMEM (keys::gather): those whose block is a whole
  // pallas_call operand (a grid-loop access).
  void choose_gathers() {
    for (size_t o = 0; o < k.ops.size(); ++o) {
      const ir::Op& op = k.ops[o];
      std::string key = op.kind == OpKind::Load ? keys::gather(k.tensors[size_t(op.tensor)].name) : "";
      if (key.empty() || !p.config.has(key) || p.config.text(key) != keys::kSmem || !smem_gather_applies(op)) continue;
      if (access.at(int(o)).stream >= 0 || access.at(int(o)).index != "[...]")
        config_error(fmt::format("{} = {} reads {} through SMEM, which the pallas target does only in the grid "
                                 "loop's body",
                                 key, keys::kSmem, k.tensors[size_t(op.tensor)].name),
                     where(op), fmt::format("set {} to {}", key, keys::kOneHot));
      smem_gathers.insert(int(o));
    }
  }

  // A filled output (the target of hl::atomic_add) keeps its block in VMEM across the grid steps
  // that revisit it, which a TPU does only while the steps are consecutive: the grid axes it
  // does not move along must run inside (faster than) those it does.
  void check_revisits() {
    for (const Operand& o : operands) {
      const ir::HostTensor& t = k.tensors[size_t(o.block.tensor)];
      if (!o.block.output || !t.fill) continue;
      if (o.hbm)
        unsupported("hl::atomic_add inside inner loops", fmt::format("adds into {} in one", t.name),
                    where(k.ops[size_t(o.block.first_op)]));
      int last_moving = -1;
      for (size_t i = 0; i < p.grid_axes.size(); ++i)
        if (o.block.grid_axes.count(p.grid_axes[i])) last_moving = int(i);
      for (int i = 0; i < last_moving; ++i) {
        int a = p.grid_axes[size_t(i)];
        if (o.block.grid_axes.count(a) || single_step(size_t(i))) continue;
        config_error(
            fmt::format("{} is revisited along grid axis {}, which runs outside an axis its blocks move along: a "
                        "TPU writes a block back when the grid moves on, so the additions would not meet",
                        t.name, k.axes[size_t(a)].name),
            format_location(k.loc), fmt::format("choose a grid_order with {} last", k.axes[size_t(a)].name));
      }
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
    // In a general module an extent is the call's: any size an int32 index can reach.
    auto extent = [&](int axis) -> __int128 {
      return axis < 0 ? 1 : sized_at_call(axis) ? INT32_MAX : k.axes[size_t(axis)].extent;
    };
    switch (op.kind) {
      case OpKind::Full: return {op.number.integer, op.number.integer};
      case OpKind::ScalarArg: return {INT32_MIN, INT32_MAX};  // the executable checks int64 ones
      case OpKind::TileIndex: return {op.axis < 0 ? 0 : begin[size_t(op.axis)], extent(op.axis) - 1};
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
        if (op.unary == ir::UnaryFn::BitcastI32) return of_dtype(DType::i32);
        return {0, 1};  // logical_not
      case OpKind::Binary: {
        if (ir::is_comparison(op.binary) || op.binary == ir::BinaryFn::And || op.binary == ir::BinaryFn::Or)
          return {0, 1};
        if (op.binary == ir::BinaryFn::RandInt) return of_dtype(DType::i32);
        Range a = in(0), b = in(1);
        auto magnitude = [](const Range& x) { return std::max(x.lo < 0 ? -x.lo : x.lo, x.hi < 0 ? -x.hi : x.hi); };
        switch (op.binary) {
          // Bitwise results of int32-sized operands are int32-sized (sign-extended either way);
          // with a non-negative operand, & lies in [0, its max].
          case ir::BinaryFn::BitAnd:
            if (a.lo >= 0 || b.lo >= 0) return {0, std::min(a.lo >= 0 ? a.hi : kWide, b.lo >= 0 ? b.hi : kWide)};
            [[fallthrough]];
          case ir::BinaryFn::BitOr:
          case ir::BinaryFn::BitXor:
            if (a.lo >= 0 && b.lo >= 0) {  // below the next power of two
              __int128 top = 1;
              while (top <= std::max(a.hi, b.hi) && top < kWide) top <<= 1;
              return {0, top - 1};
            }
            return fits_int32(a) && fits_int32(b) ? of_dtype(DType::i32) : of_dtype(val.dtype);
          case ir::BinaryFn::Shr: return {std::min(a.lo, __int128(0)), std::max(a.hi, __int128(0))};
          case ir::BinaryFn::Shl:
            if (b.lo == b.hi && b.lo >= 0 && b.lo < 63) return clamp(a.lo << int(b.lo), a.hi << int(b.lo));
            return of_dtype(val.dtype);
          case ir::BinaryFn::Mod: {  // |r| < |b|, with b's sign; x % 0 = x
            __int128 m = magnitude(b);
            Range r = {b.lo < 0 ? 1 - m : 0, b.hi > 0 ? m - 1 : 0};
            if (b.lo <= 0 && b.hi >= 0) r = {std::min(r.lo, a.lo), std::max(r.hi, a.hi)};
            return r;
          }
          case ir::BinaryFn::FloorDiv: return {-magnitude(a), magnitude(a)};  // |x // y| <= |x|
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
      // int64 tensors arrive narrowed to int32 (the host checks every element's range).
      case OpKind::Load: return of_dtype(val.dtype == DType::i64 ? DType::i32 : val.dtype);
      case OpKind::Scan: {  // each element is a reduction of a prefix (or suffix)
        Range a = in(0);
        auto fn = ir::combine_binary(k, k.combines[size_t(op.combine)]);
        if (fn == ir::BinaryFn::Max || fn == ir::BinaryFn::Min) return a;
        if (fn != ir::BinaryFn::Add) return of_dtype(val.dtype);
        __int128 n = extent(k.value(op.inputs[0]).dims[size_t(op.dim)]);
        return clamp(std::min<__int128>(a.lo, 0) * n, std::max<__int128>(a.hi, 0) * n);
      }
      case OpKind::Dot:
      case OpKind::Store: break;
    }
    return of_dtype(val.dtype);
  }

  // A TPU computes integers in 32 bits. An int64 value the body computes must provably fit in
  // int32, or the kernel is rejected naming it: narrowing it would change the result.
  void check_integer_ranges() {
    for (const ir::Op& op : k.ops) {
      if (op.result < 0 || !p.computed[size_t(op.result)] || k.value(op.result).dtype != DType::i64) continue;
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
};

bool gathers(const ir::Op& op) {
  return std::any_of(op.index.begin(), op.index.end(), [](const ir::Index& e) { return e.kind == ir::Index::Kind::Gather; });
}

// The axis of a scatter-add's indices: the rows it adds one at a time.
int scatter_rows(const ir::Kernel& k, const ir::Op& op) {
  for (const ir::Index& e : op.index)
    if (e.kind == ir::Index::Kind::Gather)
      for (int d : k.value(e.value).dims)
        if (d != ir::kOne) return d;
  return -1;
}

// The block axis of a gathering load in the kSmem form (its rows).
int kept_axis(const ir::Op& op) {
  for (const ir::Index& e : op.index)
    if (e.kind == ir::Index::Kind::Axis) return e.axis;
  return -1;
}

// Shape of a value in the kernel: one entry per IR dim (size-one dims stay, as 1).
std::vector<int64_t> value_shape(const Analysis& an, ir::ValueId v) {
  std::vector<int64_t> s;
  for (int d : an.k.value(v).dims) s.push_back(d == ir::kOne ? 1 : an.block[size_t(d)]);
  return s;
}

int64_t value_bytes(const Analysis& an, ir::ValueId v) {
  return padded_vmem_bytes(an.chip, value_shape(an, v), kernel_type(an.k.value(v).dtype));
}

// Peak bytes of the block values a loop body keeps live at once (program order; a value lives
// from its definition to its last use, an inner loop's peak adds to what lives across it).
int64_t peak_temporaries(const Analysis& an, int loop_id) {
  const ir::Kernel& k = an.k;
  const ir::Loop& loop = k.loops[size_t(loop_id)];
  std::vector<int> defined_at(k.values.size(), -1), last_use(k.values.size(), -1);
  std::vector<int64_t> extra(loop.body.size(), 0);  // at a position: an inner loop's peak, a one-hot's block
  auto uses = [&](const ir::Loop& l, auto&& self, int pos) -> void {
    for (const ir::Stmt& s : l.body) {
      if (s.kind == ir::Stmt::Kind::Loop) {
        self(k.loops[size_t(s.id)], self, pos);
        continue;
      }
      for (ir::ValueId in : k.ops[size_t(s.id)].inputs) last_use[size_t(in)] = std::max(last_use[size_t(in)], pos);
    }
    for (const ir::Carried& c : l.carried) last_use[size_t(c.init)] = std::max(last_use[size_t(c.init)], pos);
  };
  for (size_t pos = 0; pos < loop.body.size(); ++pos) {
    const ir::Stmt& s = loop.body[pos];
    if (s.kind == ir::Stmt::Kind::Loop) {
      uses(k.loops[size_t(s.id)], uses, int(pos));
      extra[pos] = peak_temporaries(an, s.id);
      for (const ir::Carried& c : k.loops[size_t(s.id)].carried) defined_at[size_t(c.result)] = int(pos);
      continue;
    }
    const ir::Op& op = k.ops[size_t(s.id)];
    if (op.result >= 0 && !an.p.computed[size_t(op.result)]) continue;
    if (op.result >= 0) defined_at[size_t(op.result)] = int(pos);
    if (gathers(op) && !an.smem_gathers.count(s.id))  // the one-hot select's block, as wide as the gathered dim
      extra[pos] = padded_vmem_bytes(an.chip, an.access_block(s.id).shape, DType::f32);
    for (ir::ValueId in : op.inputs) last_use[size_t(in)] = std::max(last_use[size_t(in)], int(pos));
  }
  for (const ir::Carried& c : loop.carried) defined_at[size_t(c.phi)] = 0;
  int64_t peak = 0;
  for (size_t pos = 0; pos < loop.body.size(); ++pos) {
    int64_t live = extra[pos];
    for (size_t v = 0; v < k.values.size(); ++v) {
      if (defined_at[v] < 0 || size_t(defined_at[v]) > pos || std::max(last_use[v], defined_at[v]) < int(pos)) continue;
      live += value_bytes(an, ir::ValueId(v));
    }
    peak = std::max(peak, live);
  }
  return peak;
}

Footprint footprint(const Analysis& an) {
  Footprint f;
  const ir::Kernel& k = an.k;
  for (const Operand& o : an.operands)
    f.operands += int64_t(o.block.buffers) * padded_vmem_bytes(an.chip, o.block.shape, k.tensors[size_t(o.block.tensor)].dtype);
  for (const Stream& st : an.streams)
    f.pipelines += int64_t(st.block.buffers) * padded_vmem_bytes(an.chip, st.block.shape, k.tensors[size_t(st.block.tensor)].dtype);
  for (const Inner& in : an.inner)
    if (in.kind != LoopKind::Unroll)
      for (int c : in.carried) f.scratch += value_bytes(an, an.p.carried[size_t(c)].phi);
  for (int o : an.smem_gathers) {  // the indices (VMEM, and SMEM, which is not VMEM) and the picked elements
    const ir::Op& op = k.ops[size_t(o)];
    int64_t rows = an.block[size_t(kept_axis(op))];
    f.scratch += padded_vmem_bytes(an.chip, {rows}, DType::i32) +
                 padded_vmem_bytes(an.chip, {rows, 1}, k.tensors[size_t(op.tensor)].dtype);
  }
  for (int o : an.scatters) {  // the indices (VMEM, and SMEM) and the rows added
    const ir::Op& op = k.ops[size_t(o)];
    f.scratch += padded_vmem_bytes(an.chip, {an.block[size_t(scatter_rows(k, op))]}, DType::i32) +
                 value_bytes(an, op.inputs.back());
  }
  f.temporaries = peak_temporaries(an, an.grid_loop);
  return f;
}

// One line on how an inner loop runs, for the module's header and `emit --plan`.
std::string loop_summary(const Analysis& an, const Inner& in) {
const ir::Kernel& k_ = an.k;
const plan::Plan& p_ = an.p;
  const std::string& axis = k_.axes[size_t(in.axis)].name;
  std::string blocks = an.sized_at_call(in.axis)
                           ? fmt::format("pl.cdiv({}, BLOCK_{})", an.extent_text(in.axis), upper(py_name(axis)))
                           : fmt::format("{}", in.blocks);
  std::string count = in.end >= 0 || in.begin_value >= 0 ? fmt::format("up to {} blocks", blocks)
                                                         : fmt::format("{} blocks", blocks);

  std::string how;
  std::string config = fmt::format("{} = {}", config::keys::inner_loop(axis), p_.config.text(config::keys::inner_loop(axis)));
  switch (in.kind) {
    case LoopKind::Unroll: how = "unrolled at trace time, its operands resident in VMEM"; break;
    case LoopKind::Pipeline:
      how = fmt::format("a nested pltpu.emit_pipeline, {} buffers per streamed operand", in.buffers);
      break;
    case LoopKind::Fori:
      how = fmt::format("jax.lax.fori_loop with hand-written copies, {}", in.buffers == 1 ? "single-buffered" : "double-buffered");
      break;
  }
  if (in.kind != LoopKind::Unroll && p_.config.has(config::keys::buffers(axis)))
    config += fmt::format(", {} = {}", config::keys::buffers(axis), p_.config.integer(config::keys::buffers(axis)));
  return fmt::format("inner loop over {} ({} of {}{}): {} ({})", axis, count, "BLOCK_" + upper(py_name(k_.axes[size_t(in.axis)].name)),
                     in.begin_value >= 0 ? ", from a begin computed on the device" : "", how, config);
}

// The looped reduction axes, each once, in axis order.
std::vector<int> looped_axes(const Analysis& an) {
  std::set<int> axes;
  for (const ReduceLoop& rl : an.reduce_loops) axes.insert(rl.axis);
  return {axes.begin(), axes.end()};
}

// One line on how a looped reduction runs, for the module's header and `emit --plan`.
std::string reduction_summary(const Analysis& an, int axis) {
  const ir::Axis& ax = an.k.axes[size_t(axis)];
  int64_t b = an.block[size_t(axis)], blocks = (ax.extent + b - 1) / b, last = ax.extent - (blocks - 1) * b;
  if (an.sized_at_call(axis))
    return fmt::format(
        "reduction over {0} in pl.cdiv({1}, BLOCK_{2}) blocks of BLOCK_{2}, the last one partial at some sizes: "
        "loops unrolled at trace time over operand blocks that hold the whole dim ({3} = {4})",
        ax.name, an.extent_text(axis), upper(py_name(ax.name)), an.block_param(axis), b);
  return fmt::format(
      "reduction over {} in {} blocks of BLOCK_{}{}: loops unrolled at trace time over operand blocks that hold "
      "the whole dim ({} = {})",
      ax.name, blocks, upper(py_name(ax.name)), last != b ? fmt::format(" (the last one of {})", last) : "",
      an.block_param(axis), b);
}

// ---- the generator ----------------------------------------------------------------------------

class Generator {
 public:
  explicit Generator(const Analysis& an) : an_(an), p_(an.p), k_(an.k) {}

  std::string run() {
    std::string kernel_body = kernel();
    combine_functions_ = combine_functions();
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
  std::set<std::string> mask_names_;
  std::vector<std::string> scratch_refs_, scratch_shapes_;  // kernel parameters after the outputs
  const Inner* current_ = nullptr;  // the inner loop being written, if any
  const ReduceLoop* reduce_loop_ = nullptr;  // the reduction loop being written, if any
  std::set<ir::ValueId> emitted_;  // values written so far outside reduction loops

  std::string kernel_name() const { return py_name(k_.name) + "_kernel"; }
  // The SMEM ref of a prefetched tensor (the kernel's first parameters, the index maps' last).
  std::string prefetch_ref(int tensor) const { return py_name(k_.tensors[size_t(tensor)].name) + "_smem"; }
  std::vector<std::string> prefetch_refs() const {
    std::vector<std::string> refs;
    for (int t : an_.prefetched) refs.push_back(prefetch_ref(t));
    return refs;
  }
  // An index value as a scalar expression (Analysis::scalar_index_expressible says which).
  std::string index_expression(ir::ValueId v, bool nested = false) {
    if (p_.computed[size_t(v)]) return var(v);
    const ir::Op& op = k_.ops[size_t(k_.value(v).def_op)];
    switch (op.kind) {
      case OpKind::Full: return fmt::format("{}", op.number.integer);
      case OpKind::TileIndex:
      case OpKind::TileBegin: return block_start(op.axis);
      case OpKind::Cast: return index_expression(op.inputs[0], nested);
      default: {
        std::string e = binary(op.binary, index_expression(op.inputs[0], true), index_expression(op.inputs[1], true));
        return nested ? "(" + e + ")" : e;
      }
    }
  }
  // One element of a prefetched tensor: its flat index from constants and grid indices.
  std::string scalar_read(const ir::Op& op) {
    const plan::BlockSpec& s = *p_.spec_for_op(int(&op - k_.ops.data()));
    const std::vector<int64_t>& shape = k_.tensors[size_t(op.tensor)].shape;
    std::vector<std::string> terms;
    int64_t stride = 1, constant = 0;
    // The stride of dim d: a number, or in a general module the product of the call's dims after it.
    std::vector<std::string> stride_text;
    for (size_t d = shape.size(); d-- > 0; stride *= shape[d]) {
      const plan::IndexTerm& e = s.index_map[d];
      std::vector<std::string> after;
      for (size_t j = d + 1; j < shape.size(); ++j) after.push_back(an_.dim_text(op.tensor, j));
      bool at_call = std::any_of(after.begin(), after.end(), [](const std::string& x) { return x.rfind("E_", 0) == 0; });
      std::string st = at_call ? fmt::format("{}", fmt::join(after, " * ")) : fmt::format("{}", stride);
      if (e.kind == plan::IndexTerm::Kind::Constant) {
        if (at_call && e.constant) terms.insert(terms.begin(), fmt::format("{} * {}", e.constant, st));
        else constant += e.constant * stride;
        continue;
      }
      std::string at = e.grid_axis >= 0 ? block_start(e.grid_axis) : index_expression(e.value, shape.size() > 1);
      terms.insert(terms.begin(), st == "1" ? at : fmt::format("({}) * {}", at, st));
    }
    if (constant || terms.empty()) terms.push_back(fmt::format("{}", constant));
    return fmt::format("{}[{}]", prefetch_ref(op.tensor), fmt::join(terms, " + "));
  }
  std::string axis_name(int a) const { return py_name(k_.axes[size_t(a)].name); }
  std::string axis_const(int a) const { return "BLOCK_" + upper(axis_name(a)); }
  const Inner* inner_of(int a) const {
    int i = an_.inner_of_axis[size_t(a)];
    return i < 0 ? nullptr : &an_.inner[size_t(i)];
  }
  // The block index along axis a: the grid's program id, or the inner loop's index.
  std::string pid(int a) {
    if (const Inner* in = inner_of(a)) {
      uses_index_ = true;
      return in->index;
    }
    used_pids_.insert(an_.grid_position(a));
    return "b_" + axis_name(a);
  }
  // First element index of the current block along tiled axis a.
  std::string block_start(int a) {
    int64_t first = an_.begin[size_t(a)];
    std::string s = an_.block[size_t(a)] == 1 ? pid(a) : fmt::format("{} * {}", pid(a), axis_const(a));
    if (const Inner* in = inner_of(a); in && in->begin_value >= 0) return fmt::format("{} + {}", var(in->begin_value), s);
    return first ? fmt::format("{} + {}", s, first) : s;
  }
  // One past the last index the loop over axis a covers.
  std::string axis_end(int a) const {
    const Inner* in = inner_of(a);
    if (in && in->end >= 0) return var(in->end);
    return an_.extent_text(a);
  }
  static std::string var(ir::ValueId v) { return fmt::format("v{}", v); }

  std::vector<std::string> shape_of(const std::vector<int>& dims) const {
    std::vector<std::string> s;
    for (int d : dims)
      s.push_back(d == ir::kOne                                   ? "1"
                  : reduce_loop_ && d == reduce_loop_->axis ? block_slice(k_, d) + ".size"
                                                                  : axis_const(d));
    return s;
  }
  std::string dims_text(const std::vector<int>& dims) const {
    std::vector<std::string> s;
    for (int d : dims) s.push_back(ir::dim_name(k_, d));
    return fmt::format("[{}]", fmt::join(s, ", "));
  }

  // A tensor's dims: numbers, or in a general module the call's sizes (E_<axis>).
  std::vector<std::string> dims_of(const ir::HostTensor& t) const {
    std::vector<std::string> dims;
    for (size_t d = 0; d < t.shape.size(); ++d) dims.push_back(an_.dim_text(int(&t - k_.tensors.data()), d));
    return dims;
  }
  // Grid steps along grid position i.
  std::string grid_steps(size_t i) const {
    int a = p_.grid_axes[i];
    if (!an_.sized_at_call(a)) return fmt::format("{}", p_.grid_blocks[i]);
    return an_.whole(a) ? "1" : fmt::format("pl.cdiv({}, {})", an_.extent_text(a), axis_const(a));
  }
  // The sizes a general module reads from its inputs: every axis' extent but the fixed ones.
  std::vector<int> call_sizes() const {
    std::vector<int> out;
    for (size_t a = 0; a < k_.axes.size(); ++a)
      if (an_.sized_at_call(int(a)) && an_.size_axis(int(a)) == int(a)) out.push_back(int(a));
    return out;
  }

  std::vector<std::string> tensor_comments() const {
    std::vector<std::string> lines;
    for (const ir::HostTensor& t : k_.tensors)
      lines.push_back(fmt::format("{} {}: {}[{}]{}", t.role == ir::HostRole::Input ? "input " : "output",
                                  shown(t.name), dtype_name(t.dtype), fmt::join(dims_of(t), ", "),
                                  t.dtype == DType::i64 ? " (passed as int32: the host narrows it, checking the range)"
                                                        : ""));
    for (const ir::ScalarParam& s : k_.scalars)
      lines.push_back(fmt::format("scalar {}: {}", shown(s.name), dtype_name(s.dtype)));
    return lines;
  }

  void header() {
    Footprint f = footprint(an_);
    const TpuGeneration& chip = an_.chip;
    out_ += fmt::format("# Kernel '{}', generated by Deuteron for the pallas target{}.\n", shown(k_.name),
                        an_.general ? ": a general module, for any sizes (read from the inputs' shapes)" : "");
    out_ += fmt::format("# config: {}\n", p_.config.dump());
    for (const std::string& l : tensor_comments()) out_ += "# " + l + "\n";
    std::vector<std::string> g;
    for (size_t i = 0; i < p_.grid_axes.size(); ++i)
      g.push_back(fmt::format("{}: {}", k_.axes[size_t(p_.grid_axes[i])].name, grid_steps(i)));
    if (an_.general)
      out_ += fmt::format("# grid: {}, last axis fastest\n", g.empty() ? "1 step" : fmt::format("{}", fmt::join(g, ", ")));
    else
      out_ += fmt::format("# grid: {} steps ({}), last axis fastest\n", p_.grid_size(), fmt::join(g, ", "));
    for (const Inner& in : an_.inner) out_ += "# " + loop_summary(an_, in) + "\n";
    for (int a : looped_axes(an_)) out_ += "# " + reduction_summary(an_, a) + "\n";
    if (an_.general) {
      out_ += "# Sizes are the call's (E_<axis>, Python ints at trace time: JAX traces once per shape). A block\n";
      out_ += "# the config sets is a multiple of the TPU tile, so legal at any size; a whole dim's block is the\n";
      out_ += "# call's dim, and every other tiled dim's last block may be partial.\n";
      out_ += fmt::format("# VMEM on {}: follows the sizes; the module allows it all ({})\n", chip.name,
                          human_bytes(chip.vmem_bytes));
    } else {
      out_ += fmt::format("# VMEM on {}: {}; limit {} (physical {})\n", chip.name, f.describe(),
                          human_bytes(vmem_limit(f)), human_bytes(chip.vmem_bytes));
    }
    out_ +=
        "# Runs in TPU interpret mode on a CPU by default; run(..., interpret=False) compiles for a TPU.\n";
    out_ += "# Partial edge blocks: out-of-range input elements are garbage (NaN in interpret mode) and\n";
    out_ += "# out-of-range writes are dropped; reductions and products over a partial block are masked.\n";
    if (std::any_of(k_.ops.begin(), k_.ops.end(), [](const ir::Op& op) { return gathers(op); }))
      out_ += "# A gathered element whose index is outside its dim is NaN (0 for integers), never another.\n";
    if (!k_.scalars.empty() || !call_sizes().empty()) out_ += "import functools\n\n";
    out_ += "import jax\n";
    out_ += "import jax.numpy as jnp\n";
    out_ += "from jax.experimental import pallas as pl\n";
    out_ += "from jax.experimental.pallas import tpu as pltpu\n\n";
    auto uses = [&](std::initializer_list<ir::BinaryFn> fns) {
      return std::any_of(k_.ops.begin(), k_.ops.end(), [&](const ir::Op& op) {
        return op.kind == OpKind::Binary && std::find(fns.begin(), fns.end(), op.binary) != fns.end();
      });
    };
    using ir::BinaryFn;
    if (uses({BinaryFn::Shl, BinaryFn::Shr})) out_ += std::string("\n") + kShiftHelpers;
    if (uses({BinaryFn::FloorDiv, BinaryFn::Mod})) out_ += std::string("\n") + kDivisionHelpers;
    if (uses({BinaryFn::Rand, BinaryFn::Randn, BinaryFn::RandInt})) out_ += std::string("\n") + kRandomHelpers;
    out_ += combine_functions_;
  }

  // Each scan's combine function, for jax.lax.associative_scan: elementwise on two blocks.
  std::string combine_functions_;
  std::string combine_functions() {
    std::string out;
    for (size_t i = 0; i < k_.combines.size(); ++i) {
      const ir::Combine& c = k_.combines[i];
      auto fn = ir::combine_binary(k_, c);
      if (fn == ir::BinaryFn::Add || fn == ir::BinaryFn::Mul) continue;  // spelled as cumsum, cumprod
      std::vector<std::string> lines;
      for (int o : c.ops) statement(k_.ops[size_t(o)], lines);
      out += fmt::format("\ndef _combine{}({}, {}):\n", i, var(c.a), var(c.b));
      out += fmt::format("    \"\"\"The combine function of the scan at {}: (accumulated, next) -> accumulated.\"\"\"\n",
                         shown(format_location(c.loc)));
      for (const std::string& l : lines) out += "    " + l + "\n";
      out += fmt::format("    return {}\n\n", var(c.result));
    }
    return out;
  }

  int64_t vmem_limit(const Footprint& f) const { return vmem_limit_bytes(an_.chip, f); }

  void constants() {
    out_ += "# Block sizes in elements, per axis.\n";
    for (size_t a = 0; a < k_.axes.size(); ++a) {
      const ir::Axis& ax = k_.axes[a];
      std::string what;
      if (an_.whole_at_call(int(a))) continue;  // the call's dim: run() and the kernel set it
      if (an_.sized_at_call(int(a))) {
        what = ax.kind == ir::AxisKind::Tile && ax.scalar ? fmt::format("grid index {}: one element per step", ax.name)
               : ax.kind == ir::AxisKind::Tile
                   ? fmt::format("{} dim {}: any size, the last block partial", inner_of(int(a)) ? "inner-loop" : "tiled", ax.name)
                   : fmt::format("reduction dim {}: any size, reduced block by block", ax.name);
        out_ += fmt::format("{} = {}  # {}\n", axis_const(int(a)), an_.block[a], what);
        continue;
      }
      if (ax.kind == ir::AxisKind::Tile && ax.scalar) {
        what = fmt::format("grid index {}: one element per step, {} steps", ax.name, ax.extent - an_.begin[a]);
      } else if (ax.kind == ir::AxisKind::Tile) {
        int64_t span = ax.extent - an_.begin[a];
        int64_t blocks = (span + an_.block[a] - 1) / an_.block[a];
        bool ragged = span % an_.block[a] != 0;
        what = fmt::format("{} dim {}: {} elements in {} block{}{}", inner_of(int(a)) ? "inner-loop" : "tiled", ax.name,
                           span, blocks, blocks == 1 ? "" : "s", ragged ? ", the last one partial" : "");
        std::string param = an_.block_param(int(a));
        if (p_.config.has(param) && p_.config.integer(param) != an_.block[a])
          what += fmt::format(" ({} = {} covers it)", param, p_.config.integer(param));
      } else if (an_.looped(int(a))) {
        int64_t blocks = (ax.extent + an_.block[a] - 1) / an_.block[a], last = ax.extent - (blocks - 1) * an_.block[a];
        what = fmt::format("reduction dim {}: {} elements reduced in {} blocks{}", ax.name, ax.extent, blocks,
                           last != an_.block[a] ? fmt::format(", the last one of {}", last) : "");
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
    if (!an_.general) return;
    out_ += "def _rank(name, x, rank):\n";
    out_ += "    if len(x.shape) != rank:\n";
    out_ += "        raise ValueError(f\"{name}: expected rank {rank}, got shape {list(x.shape)}\")\n\n\n";
  }

  // ---- the kernel function ----

  using Lines = std::vector<std::string>;
  static void indent(Lines& lines, const Lines& body, int n = 1) {
    std::string pad(size_t(4 * n), ' ');
    for (const std::string& l : body) lines.push_back(l.empty() ? l : pad + l);
  }

  std::string kernel() {
    Lines lines;
    body(an_.grid_loop, lines);
    std::vector<std::string> params = prefetch_refs();
    for (const Operand& o : an_.operands) params.push_back(o.ref);
    params.insert(params.end(), scratch_refs_.begin(), scratch_refs_.end());
    std::string sig = fmt::format("def {}({}", kernel_name(), fmt::join(params, ", "));
    std::vector<std::string> keywords;
    for (const ir::ScalarParam& sp : k_.scalars) keywords.push_back(py_name(sp.name));
    for (int a : call_sizes()) keywords.push_back(an_.extent_text(a));
    if (!keywords.empty()) sig += fmt::format(", *, {}", fmt::join(keywords, ", "));
    std::string text = sig + "):\n";
    text += fmt::format(
        "    \"\"\"One grid step of '{}': the grid loop's body on one block of each operand.\"\"\"\n",
        shown(k_.name));
    text += whole_blocks("    ");
    for (size_t i = 0; i < p_.grid_axes.size(); ++i)
      if (used_pids_.count(int(i)))
        text += fmt::format("    b_{} = pl.program_id({})  # block index along {}\n", axis_name(p_.grid_axes[i]), i,
                            k_.axes[size_t(p_.grid_axes[i])].name);
    text += fill_outputs();
    while (!lines.empty() && lines.back().empty()) lines.pop_back();
    for (const std::string& l : lines) text += l.empty() ? "\n" : "    " + l + "\n";
    return text;
  }

  // A general module's blocks that are a whole dim: the call's size.
  std::string whole_blocks(const std::string& pad) const {
    std::string text;
    for (size_t i = 0; i < k_.axes.size(); ++i)
      if (int a = int(i); an_.whole_at_call(a))
        text += fmt::format("{}{} = {}  # the whole dim {}\n", pad, axis_const(a), an_.extent_text(a), k_.axes[size_t(a)].name);
    return text;
  }

  // The statements of a loop body, in program order.
  void body(int loop, Lines& lines) {
    for (const ir::Stmt& s : k_.loops[size_t(loop)].body) {
      if (s.kind == ir::Stmt::Kind::Loop) {
        inner_loop(*an_.inner_for_loop(s.id), lines);
        continue;
      }
      const ir::Op& op = k_.ops[size_t(s.id)];
      if (op.result >= 0 && !p_.computed[size_t(op.result)]) continue;
      if (auto it = an_.reduce_loop_of_op.find(s.id); it != an_.reduce_loop_of_op.end()) {
        const ReduceLoop& rl = an_.reduce_loops[size_t(it->second)];
        if (rl.ops.front() == s.id) reduce_loop(rl, lines);
        continue;
      }
      // Values over a looped axis exist one block at a time, inside the loops that use them.
      if (op.result >= 0 && (emitted_.count(op.result) || an_.looped_dim(op.result) >= 0)) continue;
      statement(op, lines);
      if (op.result >= 0) emitted_.insert(op.result);
    }
  }

  // A group over a looped reduction axis: a loop over the axis' blocks, unrolled at trace time.
  // Values over the axis are computed block by block inside it (in each loop that uses them,
  // as the plan recomputes them), the others before it; a reduction over the axis starts at its
  // identity and takes in each block.
  void reduce_loop(const ReduceLoop& rl, Lines& lines) {
    const ir::Axis& ax = k_.axes[size_t(rl.axis)];
    std::string at = block_slice(k_, rl.axis), index = "i_" + axis_name(rl.axis), b = axis_const(rl.axis);
    Lines before, inside;
    auto saved_masks = masks_;
    reduce_loop_ = &rl;
    std::vector<std::string> does = plan::walk_reduce_loop(
        p_, rl, false, emitted_,
        [&](const ir::Op& op) {
          const ir::Value& r = k_.value(op.result);
          before.push_back(fmt::format("{} = jnp.full({}, {}, {})  # {} over {}: its identity, then each block",
                                       var(op.result), py_tuple(shape_of(r.dims)), identity(op.reduce, r.dtype),
                                       jnp_type(kernel_type(r.dtype)), ir::name(op.reduce), ax.name));
        },
        [&](const ir::Op& op, bool in_loop) { statement(op, in_loop ? inside : before); });
    reduce_loop_ = nullptr;
    masks_ = saved_masks;
    int64_t last = ax.extent - (rl.blocks - 1) * an_.block[size_t(rl.axis)];
    bool at_call = an_.sized_at_call(rl.axis);  // then any block count, the last one maybe partial
    std::string size = last == an_.block[size_t(rl.axis)] && !at_call
                           ? b
                           : fmt::format("min({}, {} - {} * {})", b, an_.extent_text(rl.axis), index, b);
    std::string blocks = at_call ? fmt::format("pl.cdiv({}, {})", an_.extent_text(rl.axis), b) : fmt::format("{}", rl.blocks);
    inside.insert(inside.begin(), fmt::format("{} = pl.ds({} * {}, {})", at, index, b, size));
    if (!lines.empty() && !lines.back().empty()) lines.push_back("");
    lines.push_back(fmt::format("# {} over {} block by block ({} blocks of {}{}), unrolled at trace time",
                                fmt::join(does, ", "), ax.name, blocks, b,
                                last != an_.block[size_t(rl.axis)] && !at_call ? fmt::format(", the last one of {}", last) : ""));
    lines.insert(lines.end(), before.begin(), before.end());
    lines.push_back(fmt::format("for {} in range({}):", index, blocks));
    indent(lines, inside);
    lines.push_back("");
  }

  std::string add_scratch(const std::string& name, const std::string& shape) {
    scratch_refs_.push_back(name);
    scratch_shapes_.push_back(shape);
    return name;
  }
  std::string carry_name(const plan::CarriedValue& c) const {
    const std::string& hint = k_.value(c.phi).hint;
    return (hint.empty() ? fmt::format("c{}", c.phi) : py_name(hint)) + "_carry";
  }
  std::string vmem_shape(const std::vector<std::string>& shape, DType t) const {
    return fmt::format("pltpu.VMEM({}, {})", py_tuple(shape), jnp_type(kernel_type(t)));
  }
  // Text of a carried value's initial value at the phi's dims.
  std::string carried_init(const plan::CarriedValue& c, const ir::Op& at) const {
    return align(var(c.init), k_.value(c.init).dims, k_.value(c.phi).dims, true, at);
  }

  void inner_loop(const Inner& in, Lines& lines) {
    const ir::Loop& loop = k_.loops[size_t(in.loop)];
    const ir::Op& any = k_.ops[size_t(first_op(loop))];
    std::string loc = shown(format_location(loop.loc));
    std::string axis = axis_name(in.axis);
    if (!lines.empty() && !lines.back().empty()) lines.push_back("");
    lines.push_back(fmt::format("# {}  ({})", loop_summary(an_, in), loc));
    auto saved_masks = masks_;
    const Inner* saved = current_;
    current_ = &in;
    uses_index_ = false;
    std::string trips = in.begin_value >= 0 ? fmt::format("pl.cdiv({} - {}, {})", axis_end(in.axis), var(in.begin_value),
                                                          axis_const(in.axis))
                        : in.end >= 0 ? fmt::format("pl.cdiv({} - {}, {})", var(in.end), in.begin, axis_const(in.axis))
                        : an_.sized_at_call(in.axis) ? fmt::format("pl.cdiv({}, {})", an_.extent_text(in.axis), axis_const(in.axis))
                                      : fmt::format("{}", in.blocks);
    std::vector<const plan::CarriedValue*> carried;
    for (int c : in.carried) carried.push_back(&p_.carried[size_t(c)]);

    if (in.kind == LoopKind::Unroll) {
      for (const auto* c : carried)
        lines.push_back(fmt::format("{} = {}  # {} enters the loop", var(c->phi), carried_init(*c, any), value_label(c->phi)));
      Lines inside;
      body(in.loop, inside);
      std::vector<std::string> phis, nexts;
      for (const auto* c : carried) {
        phis.push_back(var(c->phi));
        nexts.push_back(align(var(c->next), k_.value(c->next).dims, k_.value(c->phi).dims, true, any));
      }
      if (!carried.empty()) inside.push_back(fmt::format("{} = {}", fmt::join(phis, ", "), fmt::join(nexts, ", ")));
      lines.push_back(fmt::format("for {} in range({}):  # at trace time", in.index, in.blocks));
      indent(lines, inside);
      for (const auto* c : carried) lines.push_back(fmt::format("{} = {}", var(c->result), var(c->phi)));
    } else {
      // Carried values live in VMEM scratch across the loop's steps.
      std::vector<std::string> carry_refs;
      for (const auto* c : carried) {
        std::string ref = add_scratch(carry_name(*c), vmem_shape(shape_of(k_.value(c->phi).dims), k_.value(c->phi).dtype));
        carry_refs.push_back(ref);
        lines.push_back(fmt::format("{}[...] = {}  # {} enters the loop", ref, carried_init(*c, any), value_label(c->phi)));
      }
      Lines inside;
      for (size_t i = 0; i < carried.size(); ++i)
        inside.push_back(fmt::format("{} = {}[...]", var(carried[i]->phi), carry_refs[i]));
      body(in.loop, inside);
      for (size_t i = 0; i < carried.size(); ++i)
        inside.push_back(fmt::format("{}[...] = {}", carry_refs[i],
                                     align(var(carried[i]->next), k_.value(carried[i]->next).dims,
                                           k_.value(carried[i]->phi).dims, true, any)));
      if (in.kind == LoopKind::Pipeline)
        pipeline(in, axis, trips, inside, lines);
      else
        fori(in, axis, trips, inside, lines);
      for (size_t i = 0; i < carried.size(); ++i)
        lines.push_back(fmt::format("{} = {}[...]  # {} after the loop", var(carried[i]->result), carry_refs[i],
                                    value_label(carried[i]->phi)));
    }
    lines.push_back("");
    current_ = saved;
    masks_ = saved_masks;
  }

  int first_op(const ir::Loop& loop) const {
    for (const ir::Stmt& s : loop.body)
      if (s.kind == ir::Stmt::Kind::Op) return s.id;
    return 0;
  }
  std::string value_label(ir::ValueId v) const {
    const std::string& hint = k_.value(v).hint;
    return hint.empty() ? fmt::format("%{}", v) : shown(hint);
  }

  // The index map (or copy offsets) of a stream's block: the grid's block indices and the
  // loop's index.
  std::vector<std::string> stream_index(const Stream& st) {
    for (int a : st.block.grid_axes) pid(a);
    return st.block.index;
  }
  std::string stream_spec(const Stream& st) {
    const Inner& in = an_.inner[size_t(st.loop)];
    std::string mode = !st.block.output && st.block.buffers != 2 ? fmt::format(", pipeline_mode=pl.Buffered({})", st.block.buffers) : "";
    return fmt::format("pl.BlockSpec({}, lambda {}: {}{})", py_tuple(st.block.shape_text), in.index,
                       py_tuple(stream_index(st)), mode);
  }

  void pipeline(const Inner& in, const std::string& axis, const std::string& trips, Lines& inside, Lines& lines) {
    std::vector<std::string> params, in_specs, out_specs, hbm_in, hbm_out;
    for (int s : in.streams) {
      const Stream& st = an_.streams[size_t(s)];
      (st.block.output ? out_specs : in_specs).push_back(stream_spec(st));
      (st.block.output ? hbm_out : hbm_in).push_back(an_.operands[size_t(st.operand)].ref);
    }
    for (int pass : {0, 1})
      for (int s : in.streams)
        if (an_.streams[size_t(s)].block.output == bool(pass)) params.push_back(an_.streams[size_t(s)].ref);
    if (uses_index_) {
      std::string step = add_scratch(axis + "_index", "pltpu.SMEM((1,), jnp.int32)");
      lines.push_back(fmt::format("{}[0] = 0  # the pipeline's step: {}'s block index", step, axis));
      inside.insert(inside.begin(), fmt::format("{} = {}[0]", in.index, step));
      inside.push_back(fmt::format("{}[0] = {} + 1", step, in.index));
      uses_index_ = false;
    }
    lines.push_back("");
    lines.push_back(fmt::format("def {}_body({}):", axis, fmt::join(params, ", ")));
    indent(lines, inside);
    lines.push_back("");
    lines.push_back("pltpu.emit_pipeline(");
    lines.push_back(fmt::format("    {}_body,", axis));
    lines.push_back(fmt::format("    grid=({},),", trips));
    auto list = [&](const char* name, const std::vector<std::string>& specs) {
      if (specs.empty()) return;
      lines.push_back(fmt::format("    {}=[", name));
      for (const std::string& s : specs) lines.push_back(fmt::format("        {},", s));
      lines.push_back("    ],");
    };
    list("in_specs", in_specs);
    list("out_specs", out_specs);
    std::vector<std::string> refs = hbm_in;
    refs.insert(refs.end(), hbm_out.begin(), hbm_out.end());
    lines.push_back(fmt::format(")({})", fmt::join(refs, ", ")));
  }

  // A fori_loop: each step copies its blocks from HBM into VMEM buffers by hand (the next
  // step's while this one computes, when double-buffered), and its stores back.
  void fori(const Inner& in, const std::string& axis, const std::string& trips, Lines& inside, Lines& lines) {
    int slots = in.buffers;
    std::vector<const Stream*> reads, writes;
    for (int s : in.streams) (an_.streams[size_t(s)].block.output ? writes : reads).push_back(&an_.streams[size_t(s)]);
    std::string sems = add_scratch(axis + "_sems", fmt::format("pltpu.SemaphoreType.DMA(({}, {}))", in.streams.size(), slots));
    int sem = 0;
    auto copies = [&](const std::vector<const Stream*>& list, const std::string& name, bool to_hbm) {
      if (list.empty()) return;
      lines.push_back(fmt::format("def {}(i, slot):", name));
      lines.push_back(fmt::format("    \"\"\"The copies of block i of {} {} buffer `slot`.\"\"\"", axis,
                                  to_hbm ? "from" : "into"));
      lines.push_back("    return [");
      for (const Stream* st : list) {
        std::vector<std::string> idx = stream_index(*st), at;
        for (size_t d = 0; d < idx.size(); ++d) {
          if (st->block.squeezed[d]) {
            at.push_back(idx[d]);
            continue;
          }
          std::string e = st->block.axis[d] == in.axis ? "i" + idx[d].substr(in.index.size()) : idx[d];
          std::string start = st->block.axis[d] == in.axis && in.begin_value >= 0
                                  ? fmt::format("{} + i * {}", var(in.begin_value), st->block.shape_text[d])
                              : e == "0" ? "0"
                              : e.find(' ') == std::string::npos
                                  ? fmt::format("{} * {}", e, st->block.shape_text[d])
                                  : fmt::format("({}) * {}", e, st->block.shape_text[d]);
          at.push_back(fmt::format("pl.ds({}, {})", start, st->block.shape_text[d]));
        }
        std::string hbm = fmt::format("{}.at[{}]", an_.operands[size_t(st->operand)].ref, fmt::join(at, ", "));
        std::string buf = fmt::format("{}.at[slot]", st->ref);
        lines.push_back(fmt::format("        pltpu.make_async_copy({}, {}, {}.at[{}, slot]),", to_hbm ? buf : hbm,
                                    to_hbm ? hbm : buf, sems, sem++));
        std::vector<std::string> shape = {fmt::format("{}", slots)};
        for (size_t d = 0; d < st->block.shape_text.size(); ++d)
          if (!st->block.squeezed[d]) shape.push_back(st->block.shape_text[d]);
        add_scratch(st->ref, fmt::format("pltpu.VMEM({}, {})", py_tuple(shape), jnp_type(k_.tensors[size_t(st->block.tensor)].dtype)));
      }
      lines.push_back("    ]");
      lines.push_back("");
    };
    std::string read_fn = axis + "_reads", write_fn = axis + "_writes";
    copies(reads, read_fn, false);
    copies(writes, write_fn, true);
    Lines step;
    step.push_back(slots == 2 ? fmt::format("slot = {} % 2", in.index) : "slot = 0");
    if (!reads.empty()) {
      if (slots == 2) {
        step.push_back(fmt::format("@pl.when({} + 1 < {})", in.index, trips));
        step.push_back("def _prefetch():  # the next block, while this one computes");
        step.push_back(fmt::format("    for c in {}({} + 1, 1 - slot):", read_fn, in.index));
        step.push_back("        c.start()");
        step.push_back("");
      } else {
        step.push_back(fmt::format("for c in {}({}, slot):", read_fn, in.index));
        step.push_back("    c.start()");
      }
      step.push_back(fmt::format("for c in {}({}, slot):", read_fn, in.index));
      step.push_back("    c.wait()");
    }
    uses_index_ = false;
    step.insert(step.end(), inside.begin(), inside.end());
    if (!writes.empty()) {
      step.push_back(fmt::format("for c in {}({}, slot):", write_fn, in.index));
      step.push_back("    c.start()");
      step.push_back(fmt::format("for c in {}({}, slot):", write_fn, in.index));
      step.push_back("    c.wait()");
    }
    step.push_back("return carry");
    if (!reads.empty() && slots == 2) {
      // A loop bounded on the device may run no trips: then nothing may be left in flight.
      bool device_trips = in.end >= 0 || in.begin_value >= 0;
      if (device_trips) {
        lines.push_back(fmt::format("@pl.when({} > 0)", trips));
        lines.push_back("def _first():");
      }
      std::string pad = device_trips ? "    " : "";
      lines.push_back(fmt::format("{}for c in {}(0, 0):  # the first block", pad, read_fn));
      lines.push_back(pad + "    c.start()");
      lines.push_back("");
    }
    lines.push_back(fmt::format("def {}_body({}, carry):", axis, in.index));
    indent(lines, step);
    lines.push_back("");
    lines.push_back(fmt::format("jax.lax.fori_loop(0, {}, {}_body, 0)", trips, axis));
  }

  bool uses_index_ = false;  // the inner loop's body read its block index

  // Outputs made by hl::zeros / hl::full in host code: each block is set on its first visit,
  // when the grid axes it does not move along (sequential, "arbitrary") are at their start.
  std::string fill_outputs() const {
    std::string text;
    for (const Operand& o : an_.operands) {
      const ir::HostTensor& t = k_.tensors[size_t(o.block.tensor)];
      if (!o.block.output || !t.fill) continue;
      std::vector<std::string> first;
      for (size_t i = 0; i < p_.grid_axes.size(); ++i)
        if (!o.block.grid_axes.count(p_.grid_axes[i]) && !an_.single_step(i))
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
    for (int n = 1; mask_names_.count(name); ++n) name = fmt::format("{}_{}", base, n);
    mask_names_.insert(name);
    lines.push_back(
        fmt::format("{} = {} + jax.lax.broadcasted_iota(jnp.int32, {}, {}) < {}  # in range along {} "
                    "(its last block is partial)",
                    name, block_start(axis), py_tuple(shape_of(dims)), pos, axis_end(axis),
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
  static ir::BinaryFn accumulate(ir::ReduceFn f) {
    switch (f) {
      case ir::ReduceFn::Sum: return ir::BinaryFn::Add;
      case ir::ReduceFn::Max: return ir::BinaryFn::Max;
      case ir::ReduceFn::Min: return ir::BinaryFn::Min;
    }
    return ir::BinaryFn::Add;
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
      case ir::UnaryFn::Sin: return fmt::format("jnp.sin({})", x);
      case ir::UnaryFn::Cos: return fmt::format("jnp.cos({})", x);
      case ir::UnaryFn::Log1p: return fmt::format("jnp.log1p({})", x);
      case ir::UnaryFn::Expm1: return fmt::format("jnp.expm1({})", x);
      case ir::UnaryFn::Floor: return fmt::format("jnp.floor({})", x);
      case ir::UnaryFn::Ceil: return fmt::format("jnp.ceil({})", x);
      case ir::UnaryFn::Round: return fmt::format("jnp.round({})", x);  // halves to even
      case ir::UnaryFn::BitcastI32: return fmt::format("jax.lax.bitcast_convert_type({}, jnp.int32)", x);
      case ir::UnaryFn::BitcastF32: return fmt::format("jax.lax.bitcast_convert_type({}, jnp.float32)", x);
    }
    return x;
  }

  // `t`: the operands' IR dtype (shift counts are checked against its width).
  static std::string binary(ir::BinaryFn f, const std::string& a, const std::string& b, DType t = DType::f32) {
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
      case ir::BinaryFn::Pow: return fmt::format("jnp.power({}, {})", a, b);
      case ir::BinaryFn::BitAnd: return fmt::format("({}) & ({})", a, b);
      case ir::BinaryFn::BitOr: return fmt::format("({}) | ({})", a, b);
      case ir::BinaryFn::BitXor: return fmt::format("({}) ^ ({})", a, b);
      case ir::BinaryFn::Shl: case ir::BinaryFn::Shr: case ir::BinaryFn::Mod: case ir::BinaryFn::FloorDiv:
      case ir::BinaryFn::Rand: case ir::BinaryFn::Randn: case ir::BinaryFn::RandInt:
        return python::helper_call(f, a, b, t);  // helpers written into the module where used
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

  // The ref an access reads or writes and its index: a pallas_call block (sliced by a resident
  // loop), a nested pipeline's block, or a fori_loop's buffer slot.
  std::pair<std::string, std::string> block_ref(int op) {
    const Access& a = an_.access.at(op);
    if (current_ && a.index.find(current_->index) != std::string::npos) uses_index_ = true;
    if (a.stream < 0) return {an_.operands[size_t(a.operand)].ref, a.index};
    const Stream& st = an_.streams[size_t(a.stream)];
    if (an_.inner[size_t(st.loop)].kind != LoopKind::Fori) return {st.ref, a.index};
    return {st.ref, a.index == "[...]" ? "[slot]" : "[slot, " + a.index.substr(1)};
  }


  // x[..., idx, ...] with a block of indices: the block holds the whole gathered dim, and each
  // element is picked by comparing the dim's positions with its index (a one-hot select, which
  // a TPU vectorises; dynamic gathers it does not).
  std::string one_hot(const ir::Op& op, const std::string& block, Lines& lines) {
    const ir::Value& r = k_.value(op.result);
    std::vector<int> kept;  // the block's other dims, in order
    int pos = 0, gather_pos = -1;
    ir::ValueId idx = -1;
    for (const ir::Index& e : op.index) {
      if (e.kind == ir::Index::Kind::Axis) kept.push_back(e.axis);
      if (e.kind == ir::Index::Kind::Gather) {
        if (gather_pos >= 0)
          throw CompileError(fmt::format("the pallas target does not support gathers along two dims yet: kernel '{}' "
                                         "indexes {} with two tensors of indices",
                                         k_.name, k_.tensors[size_t(op.tensor)].name),
                             format_location(op.loc), "gather along one dim, or run this kernel on the cpu target");
        gather_pos = pos;
        idx = e.value;
      }
      if (e.kind != ir::Index::Kind::Scalar) ++pos;
    }
    if (non_one_dims(kept) != non_one_dims(r.dims))
      throw CompileError(fmt::format("the pallas target does not support this gather yet: kernel '{}' indexes {} with "
                                     "indices over {}, its block over {}",
                                     k_.name, k_.tensors[size_t(op.tensor)].name, dims_text(k_.value(idx).dims),
                                     dims_text(kept)),
                         format_location(op.loc), "index with a block of the same tiles, or run this kernel on the cpu target");
    std::string blk = fmt::format("g{}", op.result);
    lines.push_back(fmt::format("{} = jnp.moveaxis({}, {}, -1)  # the gathered dim last", blk, block, gather_pos));
    std::string index = align(var(idx), k_.value(idx).dims, kept, true, op);
    std::string picked = fmt::format("jax.lax.broadcasted_iota(jnp.int32, {}.shape, {}) == {}[..., None]", blk, kept.size(), index);
    return align(fmt::format("jnp.sum(jnp.where({}, {}, 0), axis=-1)", picked, blk), kept, r.dims, true, op);
  }
  // What a load applies to the elements it reads: bf16 and f16 are computed in f32, int64
  // arrives narrowed to int32 (the host checks the range), the kernel type already.
  std::string load_cast(const ir::Op& op) const {
    DType stored = k_.tensors[size_t(op.tensor)].dtype, want = kernel_type(k_.value(op.result).dtype);
    if (stored == DType::i64 || (kernel_type(stored) == stored && want == kernel_type(stored))) return "";
    return fmt::format(".astype({})", jnp_type(want));
  }

  // The gathering load's index (the value) and the position of its dim in the block.
  std::pair<ir::ValueId, int> gather_index(const ir::Op& op) const {
    int pos = 0;
    for (const ir::Index& e : op.index) {
      if (e.kind == ir::Index::Kind::Gather) return {e.value, pos};
      if (e.kind != ir::Index::Kind::Scalar) ++pos;
    }
    return {-1, -1};
  }

  // A gathered element whose index is outside the dim is NaN (0 for integers: what the one-hot
  // select picks), never an element elsewhere.
  std::string in_range(const ir::Op& op, const std::string& picked) const {
    ir::ValueId idx = gather_index(op).first;
    const ir::Value& r = k_.value(op.result);
    if (!is_floating(r.dtype)) return picked;
    std::string dim = an_.dim_text(op.tensor, size_t(gather_index(op).second));
    std::string index = align(var(idx), k_.value(idx).dims, r.dims, false, op);
    return fmt::format("jnp.where(({0} >= 0) & ({0} < {1}), {2}, jnp.nan)", index, dim, picked);
  }

  // x[rows, idx] with idx a block of indices in VMEM: copied into SMEM, where the scalar unit
  // reads each row's index to load that row's element (clamped into the dim: in_range then
  // rejects it) into a column of VMEM scratch.
  std::string smem_gather(const ir::Op& op, const std::string& ref, Lines& lines) {
    const ir::Value& r = k_.value(op.result);
    auto [idx, gather_pos] = gather_index(op);
    int rows = kept_axis(op);
    const ir::HostTensor& t = k_.tensors[size_t(op.tensor)];
    std::string g = fmt::format("g{}", op.result), rows_const = axis_const(rows);
    std::string index = add_scratch(g + "_index", fmt::format("pltpu.VMEM(({},), jnp.int32)", rows_const));
    std::string smem = add_scratch(g + "_index_smem", fmt::format("pltpu.SMEM(({},), jnp.int32)", rows_const));
    std::string picked = add_scratch(g + "_picked", fmt::format("pltpu.VMEM(({}, 1), {})", rows_const, jnp_type(t.dtype)));
    std::vector<std::string> at(2);
    at[size_t(gather_pos)] = "pl.ds(i, 1)";
    at[size_t(1 - gather_pos)] = "pl.ds(r, 1)";
    lines.push_back(fmt::format("# {}[{}]: each row's element, read at the index the scalar unit takes from SMEM",
                                shown(t.name), gather_pos == 1 ? "rows, index" : "index, rows"));
    lines.push_back(fmt::format("{}[...] = {}", index, align(var(idx), k_.value(idx).dims, {rows}, true, op)));
    lines.push_back(fmt::format("pltpu.sync_copy({}, {})", index, smem));
    lines.push_back("");
    lines.push_back(fmt::format("def pick_{}(r, carry):", g));
    std::string last = an_.dim_axis(op.tensor, size_t(gather_pos)) >= 0
                           ? an_.dim_text(op.tensor, size_t(gather_pos)) + " - 1"
                           : fmt::format("{}", t.shape[size_t(gather_pos)] - 1);
    lines.push_back(fmt::format("    i = jnp.clip({}[r], 0, {})", smem, last));
    lines.push_back(fmt::format("    {}[pl.ds(r, 1), :] = {}[{}]", picked, ref, fmt::join(at, ", ")));
    lines.push_back("    return carry");
    lines.push_back("");
    lines.push_back(fmt::format("jax.lax.fori_loop(0, {}, pick_{}, 0)", rows_const, g));
    return align(picked + "[:, 0]" + load_cast(op), {rows}, r.dims, true, op);
  }

  // hl::atomic_add(out, {idx[t], ...}, v): the indices go to SMEM, v's rows to VMEM scratch, and
  // a fori_loop adds row j at index idx[j] (a TPU core runs the grid's steps, and so their adds,
  // in order; no atomics needed). Rows past the tile's end, and indices outside the dim, add
  // nothing: like a gather's, they never touch another element.
  void scatter_add(const ir::Op& op, Lines& lines) {
    const ir::HostTensor& t = k_.tensors[size_t(op.tensor)];
    auto [idx, gather_pos] = gather_index(op);
    int rows = scatter_rows(k_, op);
    ir::ValueId v = op.inputs.back();
    std::vector<int> dims = access_dims(op);
    dims.insert(dims.begin(), rows);
    std::string g = fmt::format("s{}", int(&op - k_.ops.data())), rows_const = axis_const(rows);
    auto [ref, unused] = block_ref(int(&op - k_.ops.data()));
    (void)unused;
    std::string index = add_scratch(g + "_index", fmt::format("pltpu.VMEM(({},), jnp.int32)", rows_const));
    std::string smem = add_scratch(g + "_index_smem", fmt::format("pltpu.SMEM(({},), jnp.int32)", rows_const));
    std::string values = add_scratch(g + "_rows", vmem_shape(shape_of(dims), t.dtype));
    std::vector<std::string> at = {"pl.ds(i, 1)"}, from = {"pl.ds(j, 1)"};
    for (size_t d = 1; d < dims.size(); ++d) at.push_back(":"), from.push_back(":");
    std::string loc = shown(format_location(op.loc));
    lines.push_back(fmt::format("# atomic_add into {} at gathered indices, one row at a time in order  ({})", shown(t.name), loc));
    lines.push_back(fmt::format("{}[...] = {}", index, align(var(idx), k_.value(idx).dims, {rows}, true, op)));
    lines.push_back(fmt::format("pltpu.sync_copy({}, {})", index, smem));
    lines.push_back(fmt::format("{}[...] = {}.astype({}.dtype)", values, align(var(v), k_.value(v).dims, dims, true, op), values));
    lines.push_back("");
    lines.push_back(fmt::format("def add_{}(j, carry):", g));
    lines.push_back(fmt::format("    i = {}[j]", smem));
    std::string ok = fmt::format("(i >= 0) & (i < {})", an_.dim_text(op.tensor, size_t(gather_pos)));
    if (an_.ragged(rows)) ok += fmt::format(" & ({} + j < {})", block_start(rows), axis_end(rows));
    lines.push_back(fmt::format("    @pl.when({})  # in the dim, and a row of the tile", ok));
    lines.push_back("    def _add():");
    lines.push_back(fmt::format("        {0}[{1}] = {0}[{1}] + {2}[{3}]", ref, fmt::join(at, ", "), values, fmt::join(from, ", ")));
    lines.push_back("");
    lines.push_back("    return carry");
    lines.push_back("");
    lines.push_back(fmt::format("jax.lax.fori_loop(0, {}, add_{}, 0)", rows_const, g));
  }

  static std::vector<int> non_one_dims(const std::vector<int>& dims) {
    std::vector<int> out;
    for (int d : dims)
      if (d != ir::kOne) out.push_back(d);
    return out;
  }

  // a @ b (+ acc) on the MXU, accumulating in f32. The product's batch dims lead; when their
  // blocks are all one it is a 2-D jnp.dot, else a batched dot_general.
  std::string dot(const ir::Op& op, Lines& lines) {
    const ir::Value& r = k_.value(op.result);
    const ir::Value &a = k_.value(op.inputs[0]), &b = k_.value(op.inputs[1]);
    std::vector<int> batch(r.dims.begin(), r.dims.end() - 2);
    int m = r.dims[r.dims.size() - 2], n = r.dims.back(), kd = a.dims.back();
    std::string x = var(op.inputs[0]), y = var(op.inputs[1]);
    if (kd != ir::kOne && an_.ragged(kd)) {
      // The contracted dim's last block is partial: zero both operands past its end (garbage
      // times zero could still be NaN).
      x = fmt::format("jnp.where({}, {}, 0.0)", valid_mask(kd, a.dims, int(a.dims.size()) - 1, lines), x);
      y = fmt::format("jnp.where({}, {}, 0.0)", valid_mask(kd, b.dims, int(b.dims.size()) - 2, lines), y);
    }
    // Operands that hold bf16 data (read from bf16 tensors, through views and widening casts)
    // go to the MXU as bf16: exact, and the MXU's native input type.
    const plan::Dot* planned = p_.dot_for_op(int(&op - k_.ops.data()));
    auto bf16_data = [&](const plan::DotOperand& o) {
      return o.load_op >= 0 && k_.tensors[size_t(k_.ops[size_t(o.load_op)].tensor)].dtype == DType::bf16;
    };
    if (planned && bf16_data(planned->a) && bf16_data(planned->b)) {
      x += ".astype(jnp.bfloat16)";
      y += ".astype(jnp.bfloat16)";
    }
    bool flat = std::all_of(batch.begin(), batch.end(), [&](int d) { return d == ir::kOne || an_.block[size_t(d)] == 1; });
    std::string e;
    if (flat) {
      auto dim = [&](int d) { return d == ir::kOne ? std::string("1") : axis_const(d); };
      if (a.dims.size() != 2) x = fmt::format("{}.reshape({}, {})", x, dim(m), dim(kd));
      if (b.dims.size() != 2) y = fmt::format("{}.reshape({}, {})", y, dim(kd), dim(n));
      e = fmt::format("jnp.dot({}, {}, preferred_element_type=jnp.float32)", x, y);
      if (r.dims.size() != 2) e = fmt::format("{}.reshape({})", e, py_tuple(shape_of(r.dims)));
    } else {
      std::vector<int> da = batch, db = batch;
      da.insert(da.end(), {m, kd});
      db.insert(db.end(), {kd, n});
      x = align(x, a.dims, da, true, op);
      y = align(y, b.dims, db, true, op);
      std::vector<std::string> bd;
      for (size_t i = 0; i < batch.size(); ++i) bd.push_back(fmt::format("{}", i));
      e = fmt::format("jax.lax.dot_general({}, {}, ((({},), ({},)), ({}, {})), preferred_element_type=jnp.float32)", x,
                      y, da.size() - 1, db.size() - 2, py_tuple(bd), py_tuple(bd));
    }
    if (op.inputs.size() > 2)
      e = fmt::format("{} + {}", align(var(op.inputs[2]), k_.value(op.inputs[2]).dims, r.dims, false, op), e);
    return e;
  }

  void statement(const ir::Op& op, std::vector<std::string>& lines) {
    std::string loc = shown(format_location(op.loc));
    auto in = [&](size_t i) { return var(op.inputs[i]); };
    auto in_dtype = [&](size_t i) { return k_.value(op.inputs[i]).dtype; };
    auto in_dims = [&](size_t i) { return k_.value(op.inputs[i]).dims; };
    if (op.kind == OpKind::Store && an_.scatters.count(int(&op - k_.ops.data()))) {
      scatter_add(op, lines);
      return;
    }
    if (op.kind == OpKind::Store) {
      auto [ref, index] = block_ref(int(&op - k_.ops.data()));
      std::string v =
          align(in(op.inputs.size() - 1), in_dims(op.inputs.size() - 1), access_dims(op), true, op);
      // hl::atomic_add: the grid steps that add into one block run one after another on a
      // TPU core (the block's revisits make its grid axes "arbitrary"), so a plain += is exact.
      lines.push_back(fmt::format("{}{} {}= {}.astype({}.dtype)  # {} {}  ({})", ref, index, op.atomic_add ? "+" : "",
                                  v, ref, op.atomic_add ? "atomic_add into" : "store",
                                  shown(k_.tensors[size_t(op.tensor)].name), loc));
      return;
    }
    const ir::Value& r = k_.value(op.result);
    std::string e;
    std::string what = ir::name(op.kind);
    switch (op.kind) {
      case OpKind::Load: {
        if (an_.prefetch_of_op.count(int(&op - k_.ops.data()))) {
          e = align(scalar_read(op), {}, r.dims, true, op);
          what = "load " + shown(k_.tensors[size_t(op.tensor)].name) + " from SMEM";
          break;
        }
        auto [ref, index] = block_ref(int(&op - k_.ops.data()));
        e = ref + index + load_cast(op);
        if (!gathers(op))
          e = align(e, access_dims(op), r.dims, true, op);
        else
          e = in_range(op, an_.smem_gathers.count(int(&op - k_.ops.data())) ? smem_gather(op, ref, lines)
                                                                               : one_hot(op, e, lines));
        what = "load " + shown(k_.tensors[size_t(op.tensor)].name);
        break;
      }
      case OpKind::Full: {  // a whole dim's extent (op.axis: hl::count) is the call's in a general module
        std::string value = op.axis >= 0 && an_.sized_at_call(op.axis)
                                ? (is_floating(r.dtype) ? fmt::format("float({})", an_.extent_text(op.axis)) : an_.extent_text(op.axis))
                                : literal(op.number, kernel_type(r.dtype));
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
          if (reduce_loop_ && op.axis == reduce_loop_->axis) e = fmt::format("{}.start + {}", block_slice(k_, op.axis), e);
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
          e = fmt::format("jnp.minimum({} + {}, {})", block_start(op.axis), axis_const(op.axis), an_.extent_text(op.axis));
        else
          e = fmt::format("jnp.int32({})", an_.extent_text(op.axis));
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
                   align(convert(in(1), in_dtype(1), t), in_dims(1), r.dims, false, op), t);
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
        // (A looped axis' blocks are sliced to their real length: nothing to mask.)
        if (axis != ir::kOne && an_.ragged(axis) && !an_.looped(axis)) {
          // The last block along a tiled axis is partial: its out-of-range elements are
          // garbage, so they must not reach the reduction.
          std::string mask = valid_mask(axis, in_dims(0), op.dim, lines);
          lines.push_back(
              fmt::format("m{} = jnp.where({}, {}, {})", op.result, mask, x, identity(op.reduce, r.dtype)));
          x = fmt::format("m{}", op.result);
        }
        e = fmt::format("{}({}, axis={}{})", reduce_fn(op.reduce), x, op.dim,
                        op.keepdim ? ", keepdims=True" : "");
        if (reduce_loop_ && axis == reduce_loop_->axis)  // this block's share, into the running value
          e = binary(accumulate(op.reduce), var(op.result), e);
        what = fmt::format("{} over {}", ir::name(op.reduce), ir::dim_name(k_, axis));
        break;
      }
      case OpKind::Dot:
        e = dot(op, lines);
        what = "dot";
        break;
      case OpKind::Scan: {
        // The scanned dim is whole in the block (persistent): no padding to skip.
        std::string x = convert(in(0), in_dtype(0), r.dtype);
        auto fn = ir::combine_binary(k_, k_.combines[size_t(op.combine)]);
        std::string rev = op.reverse ? ", reverse=True" : "";
        const char* kind = ir::scan_name(k_, k_.combines[size_t(op.combine)]);
        if (fn == ir::BinaryFn::Add || fn == ir::BinaryFn::Mul)
          e = fmt::format("jax.lax.{}({}, axis={}{})", kind, x, op.dim, rev);
        else
          e = fmt::format("jax.lax.associative_scan(_combine{}, {}, axis={}{})", op.combine, x, op.dim, rev);
        what = fmt::format("{} along {}{}", kind, ir::dim_name(k_, in_dims(0)[size_t(op.dim)]),
                           op.reverse ? ", reversed" : "");
        break;
      }
      case OpKind::Store: break;
    }
    lines.push_back(fmt::format("{} = {}  # {}: {}{}  ({})", var(op.result), e, what, dtype_name(r.dtype),
                                dims_text(r.dims), loc));
  }

  // ---- run(): the pallas_call ----

  std::string spec(const Operand& o) const {
    if (o.hbm) return "pl.BlockSpec(memory_space=pl.ANY)";
    std::vector<std::string> args;
    for (const int a : p_.grid_axes) args.push_back(axis_name(a));
    for (const std::string& r : prefetch_refs()) args.push_back(r);  // scalar prefetch refs follow
    std::string lambda = args.empty() ? "lambda" : fmt::format("lambda {}", fmt::join(args, ", "));
    // A block that never changes is fetched once: one buffer, as the VMEM estimate counts it.
    std::string mode = o.block.buffers == 1 ? ", pipeline_mode=pl.Buffered(1)" : "";
    return fmt::format("pl.BlockSpec({}, {}: {}{})", py_tuple(o.block.shape_text), lambda, py_tuple(o.block.index), mode);
  }

  static std::string shape_text(const std::vector<int64_t>& shape) {
    std::vector<std::string> s;
    for (int64_t d : shape) s.push_back(fmt::format("{}", d));
    return py_tuple(s);
  }

  // A general module's sizes: each axis' extent from the first input dim that is it (ranks
  // checked first), and the dispatch table's `sizes` checked against them.
  void read_sizes() {
    out_ += "    # The sizes, from the inputs' shapes (Python ints: JAX traces once per shape).\n";
    std::set<int> ranked;
    std::vector<std::string> all;
    for (size_t a = 0; a < k_.axes.size(); ++a) {
      all.push_back(an_.extent_text(int(a)));
      if (!an_.sized_at_call(int(a)) || an_.size_axis(int(a)) != int(a)) continue;
      for (size_t t = 0; t < k_.tensors.size(); ++t) {
        const ir::HostTensor& x = k_.tensors[t];
        size_t d = 0;
        while (d < x.shape.size() && an_.dim_axis(int(t), d) != int(a)) ++d;
        if (x.role != ir::HostRole::Input || d == x.shape.size()) continue;
        if (ranked.insert(int(t)).second)
          out_ += fmt::format("    _rank(\"{0}\", {0}, {1})\n", py_name(x.name), x.shape.size());
        out_ += fmt::format("    {} = int({}.shape[{}])\n", an_.extent_text(int(a)), py_name(x.name), d);
        break;
      }
    }
    out_ += fmt::format("    if sizes is not None and tuple(sizes[:{0}]) != {1}:\n", all.size(), py_tuple(all));
    out_ += fmt::format("        raise ValueError(f\"sizes {{tuple(sizes[:{0}])}} do not match the inputs' {{{1}}}\")\n",
                        all.size(), py_tuple(all));
  }

  void launcher() {
    std::vector<std::string> inputs;
    for (const ir::HostTensor& t : k_.tensors)
      if (t.role == ir::HostRole::Input) inputs.push_back(py_name(t.name));
    std::vector<std::string> params = inputs;
    std::vector<std::string> kw;
    for (const ir::ScalarParam& s : k_.scalars) kw.push_back(py_name(s.name));
    if (an_.general) kw.push_back("sizes=None");
    kw.push_back("interpret=None");
    out_ += fmt::format("def run({}{}*, {}):\n", fmt::join(params, ", "), params.empty() ? "" : ", ",
                        fmt::join(kw, ", "));
    std::vector<std::string> doc_in, doc_out;
    for (const ir::HostTensor& t : k_.tensors)
      (t.role == ir::HostRole::Input ? doc_in : doc_out)
          .push_back(fmt::format("{} {}[{}]", py_name(t.name), dtype_name(t.role == ir::HostRole::Input && t.dtype == DType::i64 ? DType::i32 : t.dtype),
                                 fmt::join(dims_of(t), ", ")));
    out_ += fmt::format("    \"\"\"{}: {} -> {}.\n\n", shown(k_.name), fmt::join(doc_in, ", "), fmt::join(doc_out, ", "));
    if (an_.general)
      out_ += "    sizes: the dispatch table's (every axis' extent, then each tensor's dims), checked against the inputs.\n";
    out_ += "    interpret: None runs in TPU interpret mode (INTERPRET); False compiles for a TPU.\n";
    out_ += "    \"\"\"\n";
    if (an_.general) read_sizes();
    for (const ir::HostTensor& t : k_.tensors) {
      if (t.role != ir::HostRole::Input) continue;
      out_ += fmt::format("    _check(\"{}\", {}, {}, {})\n", py_name(t.name), py_name(t.name), py_tuple(dims_of(t)),
                          jnp_type(t.dtype == DType::i64 ? DType::i32 : t.dtype));
    }
    out_ += whole_blocks("    ");
    out_ += "    if interpret is None:\n";
    out_ += "        interpret = INTERPRET\n";
    for (bool on_tpu : {true, false}) {
      std::vector<std::string> pads;
      for (const Operand& o : an_.operands) {
        if (o.padded.empty() || o.block.output || o.pad_on_tpu != on_tpu) continue;
        const ir::HostTensor& t = k_.tensors[size_t(o.block.tensor)];
        std::vector<std::string> widths, dims = dims_of(t);
        for (size_t d = 0; d < t.shape.size(); ++d)
          widths.push_back(!an_.general ? fmt::format("(0, {})", o.padded[d] - t.shape[d])
                           : o.padded_text[d] == dims[d] ? "(0, 0)"
                                                         : fmt::format("(0, {} - {})", o.padded_text[d], dims[d]));
        pads.push_back(fmt::format("{0} = jnp.pad({0}, {1})", py_name(t.name), py_tuple(widths)));
      }
      if (pads.empty()) continue;
      if (on_tpu) {
        out_ += "    # Whole blocks for the fori_loops' copies.\n";
        for (const std::string& l : pads) out_ += "    " + l + "\n";
      } else {
        out_ += "    if interpret:  # whole tiles for the pipelines' rounded copies (a TPU's HBM layout has them)\n";
        for (const std::string& l : pads) out_ += "        " + l + "\n";
      }
    }
    std::string kernel = kernel_name();
    std::vector<std::string> bind;
    for (const ir::ScalarParam& s : k_.scalars) bind.push_back(fmt::format("{0}={0}", py_name(s.name)));
    for (int a : call_sizes()) bind.push_back(fmt::format("{0}={0}", an_.extent_text(a)));
    if (!bind.empty()) kernel = fmt::format("functools.partial({}, {})", kernel, fmt::join(bind, ", "));
    std::vector<std::string> shapes, out_specs, in_specs, call_args, results;
    bool sliced = false;
    for (const Operand& o : an_.operands) {
      const ir::HostTensor& t = k_.tensors[size_t(o.block.tensor)];
      if (o.block.output) {
        std::string dims = py_tuple(dims_of(t));
        std::string shape = o.padded.empty() ? dims : an_.general ? py_tuple(o.padded_text) : shape_text(o.padded);
        if (!o.padded.empty() && !o.pad_on_tpu) shape = fmt::format("{} if interpret else {}", shape, dims);
        shapes.push_back(fmt::format("jax.ShapeDtypeStruct({}, {})", shape, jnp_type(t.dtype)));
        out_specs.push_back(spec(o));
        std::vector<std::string> cut;
        for (const std::string& d : dims_of(t)) cut.push_back(":" + d);
        results.push_back(o.padded.empty() ? "" : fmt::format("[{}]", fmt::join(cut, ", ")));
        sliced = sliced || !o.padded.empty();
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
        if (o.block.output && !o.hbm && !o.block.grid_axes.count(a) && !an_.single_step(i)) revisits = true;
      semantics.push_back(revisits ? "\"arbitrary\"" : "\"parallel\"");
    }
    std::vector<std::string> grid;
    for (size_t i = 0; i < p_.grid_axes.size(); ++i) grid.push_back(grid_steps(i));
    out_ += fmt::format("    {} pl.pallas_call(\n", sliced ? "out =" : "return");
    out_ += fmt::format("        {},\n", kernel);
    if (shapes.size() == 1) {
      out_ += fmt::format("        out_shape={},\n", shapes[0]);
    } else {
      out_ += "        out_shape=(\n";
      for (const auto& s : shapes) out_ += fmt::format("            {},\n", s);
      out_ += "        ),\n";
    }
    // With scalar prefetch the grid and specs move into a PrefetchScalarGridSpec, and the
    // flattened tensors it puts into SMEM come first.
    bool prefetch = !an_.prefetched.empty();
    std::string pad = prefetch ? "            " : "        ";
    if (prefetch) {
      out_ += "        grid_spec=pltpu.PrefetchScalarGridSpec(\n";
      out_ += fmt::format("            num_scalar_prefetch={},  # {}, whole in SMEM\n", an_.prefetched.size(),
                          fmt::join(prefetch_refs(), ", "));
      std::vector<std::string> flat;
      for (int t : an_.prefetched) flat.push_back(fmt::format("{}.reshape(-1)", py_name(k_.tensors[size_t(t)].name)));
      call_args.insert(call_args.begin(), flat.begin(), flat.end());
    }
    out_ += fmt::format("{}grid={},\n", pad, py_tuple(grid));
    out_ += pad + "in_specs=[\n";
    for (size_t i = 0; i < in_specs.size(); ++i)
      out_ += fmt::format("{}    {},  # {}\n", pad, in_specs[i], call_args[i + an_.prefetched.size()]);
    out_ += pad + "],\n";
    if (out_specs.size() == 1) {
      out_ += fmt::format("{}out_specs={},\n", pad, out_specs[0]);
    } else {
      out_ += pad + "out_specs=[\n";
      for (const auto& s : out_specs) out_ += fmt::format("{}    {},\n", pad, s);
      out_ += pad + "],\n";
    }
    if (!scratch_shapes_.empty()) {
      out_ += pad + "scratch_shapes=[\n";
      for (size_t i = 0; i < scratch_shapes_.size(); ++i)
        out_ += fmt::format("{}    {},  # {}\n", pad, scratch_shapes_[i], scratch_refs_[i]);
      out_ += pad + "],\n";
    }
    if (prefetch) out_ += "        ),\n";
    out_ += fmt::format("        compiler_params=pltpu.CompilerParams(dimension_semantics={}, vmem_limit_bytes={}),\n",
                        py_tuple(semantics), an_.general ? an_.chip.vmem_bytes : vmem_limit(footprint(an_)));
    out_ += "        interpret=interpret,\n";
    out_ += fmt::format("        name=\"{}\",\n", entry_name(p_));
    out_ += fmt::format("    )({})\n", fmt::join(call_args, ", "));
    if (sliced) {
      if (results.size() == 1) {
        out_ += fmt::format("    return out{}  # without the padding\n", results[0]);
      } else {
        std::vector<std::string> r;
        for (size_t i = 0; i < results.size(); ++i) r.push_back(fmt::format("out[{}]{}", i, results[i]));
        out_ += fmt::format("    return {}  # without the padding\n", fmt::join(r, ", "));
      }
    }
  }
};

}  // namespace

int64_t Footprint::needed() const { return int64_t(std::ceil(double(total()) * (1.0 + kVmemHeadroom))); }

std::string Footprint::describe() const {
  std::string s = fmt::format("{} operand buffers", human_bytes(operands));
  if (pipelines) s += fmt::format(" + {} inner-loop buffers", human_bytes(pipelines));
  if (scratch) s += fmt::format(" + {} scratch", human_bytes(scratch));
  return s + fmt::format(" + {} temporaries = {} with {:.0f}% headroom", human_bytes(temporaries), human_bytes(needed()),
                         kVmemHeadroom * 100);
}

int64_t vmem_limit_bytes(const TpuGeneration& chip, const Footprint& f) {
  constexpr int64_t MiB = 1024 * 1024;
  return std::clamp((f.needed() + MiB - 1) / MiB * MiB, chip.scoped_vmem_bytes, std::max(chip.vmem_bytes, chip.scoped_vmem_bytes));
}

std::string python_name(const std::string& name) { return py_name(name); }

bool smem_gather_applies(const ir::Op& op) {
  int axes = 0, gathered = 0;
  for (const ir::Index& e : op.index) {
    axes += e.kind == ir::Index::Kind::Axis;
    gathered += e.kind == ir::Index::Kind::Gather;
  }
  return gathers(op) && axes == 1 && gathered == 1;
}

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

  // The block-shape rule (block_multiple) for every block the kernel moves: the pallas_call's
  // and the inner loops'. (Interpret mode does not check it; a TPU compile would fail.)
  std::vector<const Block*> blocks;
  for (const Operand& o : an.operands)
    if (!o.hbm) blocks.push_back(&o.block);
  for (const Stream& st : an.streams) blocks.push_back(&st.block);
  for (const Block* o : blocks) {
    const ir::HostTensor& t = k.tensors[size_t(o->tensor)];
    size_t rank = t.shape.size();
    for (size_t back = 0; back < std::min<size_t>(rank, 2); ++back) {
      size_t d = rank - 1 - back;
      int64_t multiple = block_multiple(chip, back);
      int64_t b = o->shape[d], full = t.shape[d];
      if (b == full || b % multiple == 0) continue;
      int axis = o->axis[d];
      std::string which = back == 0 ? "last" : "second-to-last";
      std::string source = o->squeezed[d] ? "a scalar index (block size 1)"
                           : axis >= 0 && !an.block_param(axis).empty()
                               ? fmt::format("{} = {}", an.block_param(axis), p.config.has(an.block_param(axis)) ? p.config.integer(an.block_param(axis)) : p.block[size_t(axis)])
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
      for (size_t i = 0; i < o->shape.size(); ++i)
        shown.push_back(o->squeezed[i] ? "None" : fmt::format("{}", o->shape[i]));
      throw ConfigError(
          fmt::format("pallas: the block [{}] of {} ({}[{}]) breaks the TPU block-shape rule: its {} "
                      "dim is {} ({}), which must be a multiple of {} or the whole dim ({})",
                      fmt::join(shown, ", "), an.tensor_label(o->tensor), dtype_name(t.dtype),
                      fmt::join(t.shape, ", "), which, b, source, multiple, full),
          format_location(k.ops[size_t(o->first_op)].loc), hint);
    }
  }

  // A looped reduction slices the blocks it reads and writes along its dim: the slices keep the
  // rule too, so that each starts on a whole (8, 128) tile.
  for (const plan::BlockSpec& s : p.operands) {
    size_t rank = s.index_map.size();
    for (size_t back = 0; back < std::min<size_t>(rank, 2); ++back) {
      const plan::IndexTerm& e = s.index_map[rank - 1 - back];
      int64_t multiple = block_multiple(chip, back);
      if (e.kind != plan::IndexTerm::Kind::Looped || p.block[size_t(e.axis)] % multiple == 0) continue;
      const ir::BlockParam& bp = k.block_params[size_t(k.axes[size_t(e.axis)].block_param)];
      throw ConfigError(
          fmt::format("pallas: {} = {} reduces the {} dim of {} ({}[{}]) in blocks of {}, which must be a multiple "
                      "of {} on a TPU",
                      bp.name, p.block[size_t(e.axis)], back == 0 ? "last" : "second-to-last",
                      an.tensor_label(s.tensor), dtype_name(k.tensors[size_t(s.tensor)].dtype),
                      fmt::join(k.tensors[size_t(s.tensor)].shape, ", "), p.block[size_t(e.axis)], multiple),
          format_location(k.ops[size_t(s.op)].loc),
          fmt::format("set {} to a multiple of {}, or to {} (persistent: the whole dim in one block)", bp.name,
                      multiple, bp.max));
    }
  }

  // VMEM: every buffer the kernel allocates, with headroom, must fit the core's VMEM (the
  // module raises vmem_limit_bytes to what it needs).
  Footprint f = footprint(an);
  if (f.needed() > chip.vmem_bytes) {
    std::vector<std::string> params;
    for (size_t a = 0; a < k.axes.size(); ++a)
      if (an.tunable(int(a)) && (an.grid_axis(int(a)) || an.inner_of_axis[a] >= 0)) params.push_back(an.block_param(int(a)));
    for (const Inner& in : an.inner)
      if (in.kind == LoopKind::Unroll)
        params.push_back(fmt::format("or stream the loop over {} ({} = {})", k.axes[size_t(in.axis)].name,
                                     config::keys::inner_loop(k.axes[size_t(in.axis)].name), config::keys::kStream));
    throw FastMemoryError(
        fmt::format("pallas: the config needs {} of VMEM on {} ({}), more than its {} of VMEM per core",
                    human_bytes(f.needed()), chip.name, f.describe(), human_bytes(chip.vmem_bytes)),
        format_location(k.loc),
        params.empty() ? "the kernel's blocks are fixed; it cannot run on this TPU generation"
                       : fmt::format("use smaller blocks ({})", fmt::join(params, ", ")));
  }
  return f;
}

void fit_blocks(plan::Plan& p) {
  const ir::Kernel& k = p.kernel;
  for (size_t a = 0; a < k.axes.size(); ++a) {
    const ir::Axis& ax = k.axes[a];
    if (ax.kind != ir::AxisKind::Tile || ax.loop < 0) continue;
    const ir::Loop& loop = k.loops[size_t(ax.loop)];
    size_t i = size_t(std::find(loop.axes.begin(), loop.axes.end(), int(a)) - loop.axes.begin());
    // (A begin computed on the device is at least 0, so its blocks never need more than the dim.)
    if (loop.begin[i].value < 0 && loop.begin[i].constant != 0) continue;
    int64_t span = std::max<int64_t>(ax.extent, 1), old = p.block[a];
    if (old <= span) continue;
    p.block[a] = span;
    // A loop bounded on the device may still start or stop inside it.
    p.partial[a] = loop.end[i].value >= 0 || loop.begin[i].value >= 0;
    for (plan::BlockSpec& s : p.operands) {
      for (size_t d = 0; d < s.index_map.size(); ++d)
        if (s.index_map[d].kind == plan::IndexTerm::Kind::Block && s.index_map[d].axis == int(a)) s.block_shape[d] = span;
      if (s.elements && s.op >= 0 && k.ops[size_t(s.op)].result >= 0)
        for (int d : k.value(k.ops[size_t(s.op)].result).dims)
          if (d == int(a)) s.elements = s.elements / old * span;
    }
  }
}

int64_t block_multiple(const TpuGeneration& chip, size_t back) { return back == 0 ? chip.lanes : chip.sublanes; }

std::string describe(const plan::Plan& p, const TpuGeneration& chip) {
  Analysis an(p, chip);
  std::string out;
  for (const Inner& in : an.inner) out += "  pallas: " + loop_summary(an, in) + "\n";
  for (int a : looped_axes(an)) out += "  pallas: " + reduction_summary(an, a) + "\n";
  Footprint f = footprint(an);
  return out + fmt::format("  pallas: VMEM on {}: {}; vmem_limit_bytes {} (VMEM per core {})\n", chip.name, f.describe(),
                           vmem_limit_bytes(chip, f), human_bytes(chip.vmem_bytes));
}

std::string generate(const plan::Plan& p, const TpuGeneration& chip, bool general) {
  Analysis an(p, chip, general);
  return Generator(an).run();
}

}  // namespace deuteron::pallas
