// The kernel IR: what tracing a kernel records, specialised to one set of shapes and dtypes.
//
// Host part: the kernel's tensor arguments, scalar arguments and the outputs it allocates.
// Device part: a tree of tile loops; the outermost one becomes the launch grid. Loop bodies
// hold ops on *blocks*: values whose dims are axes (a tiled dimension, a whole dimension read
// with `hl::all`, or a fixed-size one) or size-one broadcast dims. Block sizes stay symbolic
// here; the config chooses them and the plan makes them concrete.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "deuteron/dtype.h"
#include "ir/ops.h"

namespace deuteron::ir {

using ValueId = int;
inline constexpr int kOne = -1;  // a size-one dim in Value::dims

// A constant (a Full op's value, an output's fill). Integer and boolean ones are exact in
// `integer` (a double cannot hold every int64); floating ones are `real`. Which one counts
// is decided by the dtype of what it fills.
struct Constant {
  double real = 0.0;
  int64_t integer = 0;
  bool operator==(const Constant&) const = default;
};

// ---- host part ------------------------------------------------------------------------------

enum class HostRole { Input, Output };

struct HostTensor {
  std::string name;
  HostRole role = HostRole::Input;
  int arg_index = -1;  // position among the kernel's arguments (inputs)
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; outputs are contiguous
  // Outputs made by hl::zeros / hl::full in host code: every element is set to this before the
  // kernel's grid runs (each launch, so repeated runs do not accumulate).
  std::optional<Constant> fill;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct ScalarParam {
  std::string name;
  int arg_index = -1;
  DType dtype = DType::f32;  // f32 or i64
  // Host code read the value (hl::Tensor::item): the kernel is specialised on it.
  bool specialized = false;
  int64_t value = 0;
};

// ---- axes and block sizes --------------------------------------------------------------------

// A tunable block size, shared by every axis that names it (hl::register_block_size).
struct BlockParam {
  std::string name;  // "block_m", "block_n", "reduce_n", ...
  int64_t min = 1, max = 1;  // legal range (powers of two between them)
  int64_t fixed = 0;  // non-zero: pinned in the kernel source, not tunable
  bool reduction = false;  // the block of a dimension read whole (persistent vs looped)
};

enum class AxisKind {
  Tile,       // a dimension tiled by a tile loop
  Reduction,  // a whole dimension read with hl::all or a full slice
  Fixed,      // a compile-time extent (hl::arange(n), a constant slice): one block covers it
};

struct Axis {
  std::string name;  // "m", "n", ...: used for loop variables in generated code
  AxisKind kind = AxisKind::Tile;
  int64_t extent = 0;  // number of elements along the dimension
  int block_param = -1;  // Tile and Reduction axes
  int loop = -1;  // Tile axes: the loop that tiles it
  bool scalar = false;  // hl::grid: block size one, the dim is dropped when indexing
};

// ---- ops ------------------------------------------------------------------------------------

enum class OpKind {
  // leaves
  Load,       // a block of a host tensor: tensor, index
  Full,       // a block filled with `number`: dims, dtype; with `axis` >= 0, `number` is that
              // axis' extent (a mean's count), which a general variant reads at run time
  ScalarArg,  // a scalar kernel argument: scalar index
  TileIndex,  // the global indices of an axis' block (hl::arange(n) too): axis
  TileBegin,  // first index of the current block of an axis: axis
  TileEnd,    // one past the last valid index of the current block: axis
  TileSize,   // the block size of an axis: axis
  // compute
  Unary,      // fn: UnaryFn
  Binary,     // fn: BinaryFn
  Where,      // cond, a, b
  Cast,       // to dtype
  Reduce,     // fn: ReduceFn, over dim `dim`, keepdim
  View,       // same data, new dims (unsqueeze, squeeze, expand, permute, reshape by ones)
  Dot,        // a @ b (+ acc): inputs a [..., M, K], b [..., K, N] (, acc); f32 result [..., M, N]
  Scan,       // inclusive scan of input 0 along dim `dim` with Kernel::combines[combine], `reverse`
  // effects
  Store,      // value into a block of a host tensor
};

// UnaryFn, BinaryFn and ReduceFn, with their names and dtype rules: ir/ops.h.
const char* name(OpKind k);

// One entry of an index into a host tensor.
struct Index {
  enum class Kind {
    Axis,    // the block of `axis` (a tile, hl::all, a slice): one result dim
    Scalar,  // a scalar value `value` (hl::grid index, an integer): no result dim
    Gather,  // a block of integer indices `value`: its dims become result dims
  };
  Kind kind = Kind::Axis;
  int axis = -1;
  int64_t offset = 0;  // Axis: added to the axis' global index (slices start:stop)
  int64_t constant = 0;  // Scalar without value: an integer literal
  ValueId value = -1;
};

struct Op {
  OpKind kind = OpKind::Load;
  ValueId result = -1;  // -1 for Store
  std::vector<ValueId> inputs;
  int tensor = -1;  // Load/Store: host tensor
  std::vector<Index> index;  // Load/Store
  bool atomic_add = false;  // Store: adds into the tensor atomically (hl::atomic_add)
  int axis = -1;  // TileIndex/TileBegin/TileEnd/TileSize
  int scalar = -1;  // ScalarArg
  Constant number;  // Full
  UnaryFn unary{};
  BinaryFn binary{};
  ReduceFn reduce{};
  int dim = -1;  // Reduce, Scan
  bool keepdim = false;
  int combine = -1;  // Scan: its entry of Kernel::combines
  bool reverse = false;  // Scan: from the last element to the first
  std::source_location loc;
};

struct Value {
  DType dtype = DType::f32;
  std::vector<int> dims;  // axis ids or kOne
  int def_op = -1;  // op defining it; -1 for loop-defined values (phi, results)
  std::string hint;  // the user's variable name where known (for readable code)
};

// A value updated inside a loop (`acc = acc + ...`): phi is its value at the top of each
// iteration (init on the first), next its value at the end, result its value after the loop.
struct Carried {
  ValueId init = -1, phi = -1, next = -1, result = -1;
};

// A loop bound: a constant or a device scalar value.
struct Bound {
  int64_t constant = 0;
  ValueId value = -1;
};

struct Stmt {
  enum class Kind { Op, Loop } kind;
  int id;
};

struct Loop {
  std::vector<int> axes;  // one per tiled dimension, outermost first
  std::vector<Bound> begin, end;  // per axis
  int parent = -1;  // enclosing loop, -1 for a top-level (grid) loop
  bool grid = false;  // the outermost loop: its iterations run in parallel
  std::vector<Stmt> body;
  std::vector<Carried> carried;
  std::source_location loc;
};

// The combine function of a scan (hl::associative_scan, hl::cumsum), traced once on two
// elements: `a` (what the scan has accumulated) and `b` (the next element), both of the scanned
// dtype and without dims (def_op -1, like a loop's phi). Its ops are elementwise (Full, Unary,
// Binary, Where, Cast) on them and on constants; they stand in no loop body, so only the Scan
// op reaches them. The result has the scanned dtype.
struct Combine {
  ValueId a = -1, b = -1;
  std::vector<int> ops;  // in program order
  ValueId result = -1;
  std::source_location loc;  // the hl::associative_scan call
};

struct Kernel {
  std::string name;
  std::vector<HostTensor> tensors;
  std::vector<ScalarParam> scalars;
  std::vector<int> outputs;  // host tensors returned, in order
  std::vector<BlockParam> block_params;
  std::vector<Axis> axes;
  std::vector<Value> values;
  std::vector<Op> ops;
  std::vector<Loop> loops;
  std::vector<Stmt> top;  // top-level statements: grid loops only (host code is gone)
  std::vector<Combine> combines;  // of the Scan ops
  std::source_location loc;  // where the kernel was defined
  // Float hl::atomic_adds are summed in a fixed order (KernelOptions::atomic_add), the same on
  // every run; otherwise they are atomic (which targets without threads may ignore).
  bool ordered_adds = false;

  const Value& value(ValueId v) const { return values.at(size_t(v)); }
  const Op& op(int id) const { return ops.at(size_t(id)); }
  const Loop& loop(int id) const { return loops.at(size_t(id)); }
  const Axis& axis(int id) const { return axes.at(size_t(id)); }
  // The op defining v, or nullptr for loop-defined values (phis, loop results).
  const Op* def(ValueId v) const;
  // The grid loop (the kernel's single top-level loop).
  const Loop& grid_loop() const;
  int grid_loop_id() const;
};

// ---- helpers every layer uses -----------------------------------------------------------------

// The value holding v's data, past views (unsqueeze, expand, permute, ...).
ValueId strip_views(const Kernel& k, ValueId v);

// Whether a <= b elementwise (or either is NaN), known from how b is built: b is a max taken
// over a (amax, maximum, through views), such a max guarded against -inf with a where (a is
// then -inf too), or a loop's running maximum over the whole dim a is loaded from. Lets a
// generator pick a cheaper exponential for x - max(x).
bool at_most(const Kernel& k, ValueId a, ValueId b);
// Whether v <= 0 (or NaN), known from how it is built: a - b with at_most(a, b).
bool nonpositive(const Kernel& k, ValueId v);

// Per op: the loop whose body holds it, or -1 (dead ops).
std::vector<int> loop_of_ops(const Kernel& k);

// Visits every statement reachable from the kernel's top level in program order, a loop before
// its body; `loop` is the enclosing loop (-1 at the top).
void walk(const Kernel& k, const std::function<void(const Stmt& s, int loop)>& visit);

// The data behind a dot operand: follows views and widening casts (to f32, or to the same
// dtype) from `v`. `path` (if given) receives every value passed, `v` first, the result last.
ValueId dot_operand_source(const Kernel& k, ValueId v, std::vector<ValueId>* path = nullptr);

// How many times each value is used by the statements reachable from the kernel's top level:
// as an op input, a loop bound, or a loop-carried initial or next value.
std::vector<int> use_counts(const Kernel& k);

// A constant as the IR prints it: exactly, as the integer or double that `t` takes.
std::string constant_text(const Constant& c, DType t);
// The block extent of a value dim for printing: "block_m", "1", "64".
std::string dim_name(const Kernel& k, int dim);
// Human-readable IR (`deuteron emit KERNEL --ir`); each op names its source line unless
// `locations` is false.
std::string print(const Kernel& k, bool locations = true);
// A hash of what was traced (the IR without source lines, 32 hex digits): kernels that compute
// the same thing share it, whatever their name's line; any traced difference (a captured
// constant, a shape) changes it. The in-memory and on-disk caches are keyed by it.
std::string fingerprint(const Kernel& k);

// A scan's combine when it is one binary function of (a, b) in that order (a + b: cumsum,
// a * b: cumprod), which targets may spell with their own scan; nullopt otherwise.
std::optional<BinaryFn> combine_binary(const Kernel& k, const Combine& c);
// What a scan computes, for generated code's comments: "cumsum", "cumprod", "associative_scan".
const char* scan_name(const Kernel& k, const Combine& c);

// Checks the IR's invariants (ids in range, values defined before use, dims naming real axes,
// loop nesting); throws std::logic_error naming the broken one. A failure is a compiler bug.
void verify(const Kernel& k);

}  // namespace deuteron::ir
