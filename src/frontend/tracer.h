// The frontend: runs a kernel's lambda on symbolic arguments and records the kernel IR.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "deuteron/error.h"
#include "deuteron/hl.h"
#include "ir/ir.h"

namespace deuteron::hl::detail {

// A traced variable. Each hl::Tensor object is one variable; `value` is its current value.
struct Var {
  int id = -1;
  bool host = false;
  int tensor = -1;  // host: the host tensor; indexed blocks: the tensor they were read from
  int scalar = -1;  // scalar kernel arguments
  ir::ValueId value = -1;  // device values
  int depth = 0;  // loop depth where the variable was created
  int origin = -1;  // the variable this one was copied from
  // A block read by `x[index]`, not yet used: assigning to it turns it into a store.
  bool indexed = false;
  int load_op = -1;
  std::vector<ir::Index> index;
  Loc loc;
};

}  // namespace deuteron::hl::detail

namespace deuteron::hl {
// Lets the frontend fill in the private fields of language objects.
struct TileAccess {
  static void set(Tile& t, int axis, int loop, int generation) {
    t.axis_ = axis;
    t.loop_ = loop;
    t.generation_ = generation;
  }
  static void set(BlockSize& b, int param) { b.param_ = param; }
};
}  // namespace deuteron::hl

namespace deuteron::frontend {

using hl::detail::Var;

// What a kernel argument is at one call: a tensor (dtype, shape, strides) or a scalar.
struct ArgSpec {
  bool is_tensor = true;
  DType dtype = DType::f32;
  std::vector<int64_t> shape, strides;
  std::string name;
  int64_t value = 0;  // integer scalars: the call's value (hl::Tensor::item reads it)
};

// Records one trace. While alive it is the current tracer of its thread.
class Tracer {
 public:
  Tracer(std::string kernel_name, std::source_location defined_at);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  static Tracer& current(const std::source_location& loc);
  static Tracer* current_or_null();

  // Arguments.
  std::shared_ptr<Var> tensor_arg(const ArgSpec& spec, int arg_index);
  std::shared_ptr<Var> scalar_arg(const ArgSpec& spec, int arg_index);
  // The value of integer scalar argument `v` in host code; specialises the kernel on it.
  int64_t scalar_value(const Var& v, const std::source_location& loc);
  // Marks the host tensors a kernel returns.
  void set_outputs(const std::vector<std::shared_ptr<Var>>& outs, const std::source_location& loc);
  // The finished IR (after the lambda returned).
  ir::Kernel finish();

  // Variables.
  std::shared_ptr<Var> new_device_var(ir::ValueId v, const std::source_location& loc);
  std::shared_ptr<Var> copy_var(const Var& from);
  void assign(const std::shared_ptr<Var>& target, const Var& from, const std::source_location& loc);
  // `target[index] = value`, or with atomic_add `hl::atomic_add(target, index, value)`.
  void store_indexed(Var& target, const Var& value, const std::source_location& loc, bool atomic_add = false);

  // Checks that a variable is usable here and returns its device value.
  ir::ValueId use(const Var& v, const std::source_location& loc, const char* what);
  const ir::HostTensor& host_tensor(const Var& v, const std::source_location& loc, const char* what);
  // An output of the kernel, allocated in host code; `fill`: hl::zeros / hl::full.
  std::shared_ptr<Var> new_output(std::vector<int64_t> shape, DType dtype, const std::source_location& loc,
                                  std::optional<hl::Number> fill = std::nullopt);

  // Ops. Each checks its operands and throws KernelError at `loc` on misuse.
  ir::ValueId emit(ir::Op op, DType dtype, std::vector<int> dims, const std::vector<const Var*>& vars);
  std::shared_ptr<Var> index(const Var& tensor, const std::vector<hl::Index>& index,
                             const std::source_location& loc);
  ir::ValueId binary(ir::BinaryFn fn, const hl::Operand& a, const hl::Operand& b);
  ir::ValueId unary(ir::UnaryFn fn, const Var& x, const std::source_location& loc);
  ir::ValueId where(const hl::Operand& c, const hl::Operand& a, const hl::Operand& b);
  ir::ValueId cast(const Var& x, DType to, const std::source_location& loc);
  ir::ValueId reduce(ir::ReduceFn fn, const Var& x, int dim, bool keepdim,
                     const std::source_location& loc);
  // An inclusive scan of x along `dim` with `combine`, traced here on two elements of x's dtype.
  ir::ValueId scan(const Var& x, int dim, bool reverse, const hl::CombineFn& combine, const char* what,
                   const std::source_location& loc);
  ir::ValueId view(const Var& x, std::vector<int> dims, const std::source_location& loc);
  // a @ b (+ acc): checks ranks, contraction dims, batch broadcasting and dtypes.
  ir::ValueId dot(const Var& a, const Var& b, const Var* acc, const std::source_location& loc);
  ir::ValueId full(const std::vector<hl::Size>& shape, const hl::Number& value, DType dtype,
                   const std::source_location& loc);
  // `n` as a constant of dtype `dt`: integers exact; fails where it does not fit the dtype.
  ir::Constant constant(const hl::Number& n, DType dt, const std::source_location& loc) const;
  // A number used with an operand of dtype `other`, as a Full of the dtype it takes.
  ir::ValueId number(const hl::Number& n, DType other, std::vector<int> dims, const std::source_location& loc);
  // The extent of a whole-dim axis as an f32 scalar (a Full op that names the axis).
  ir::ValueId extent(int axis, const std::source_location& loc);
  ir::ValueId tile_attr(ir::OpKind kind, const hl::Tile& t, const std::source_location& loc);
  ir::ValueId arange(int64_t n, const std::source_location& loc);
  std::vector<int> dims_of(const std::vector<hl::Size>& shape, const std::source_location& loc);
  // Broadcasts a value to `dims` by PyTorch's rules (inserting a View op when needed).
  std::vector<int> broadcast_dims(const std::vector<int>& a, const std::vector<int>& b,
                                  const std::source_location& loc, const char* what);

  // Loops and block sizes.
  int register_block_size(int64_t min, int64_t max, const std::string& name, const std::source_location& loc);
  // names: per dim, the user's name for it or "" (then "t0", "t1", ...).
  std::pair<hl::Tiles, int> open_loop(const std::vector<int64_t>& extents,
                                      const std::vector<hl::Bound>& begins,
                                      const std::vector<hl::Bound>& ends, const std::vector<std::string>& names,
                                      hl::TileOptions opts, bool scalar, const std::source_location& loc);
  void close_loop(int loop);
  void abandon_loop(int loop) noexcept;
  int depth() const { return int(open_loops_.size()); }
  bool in_host_code() const { return open_loops_.empty(); }
  // The tile's axis, after checking that its loop is open.
  int tile_axis(const hl::Tile& t, const std::source_location& loc) const;

  // A block shape as the user wrote it, for errors: tiles by name, whole dims and slices by
  // their length ("[t0, 300]"); `spelled`: "tile t0", "a whole dim or slice of 300".
  std::string shape_text(const std::vector<int>& dims) const;
  std::string dim_text(int dim, bool spelled = false) const;

  const ir::Kernel& kernel() const { return k_; }
  [[noreturn]] void fail(const std::string& what, const std::source_location& loc,
                         const std::string& hint = "") const;

 private:
  struct Frame {
    int loop;
    std::vector<std::pair<std::shared_ptr<Var>, ir::ValueId>> carried;  // variable, init
    size_t first_op;  // ops recorded from here on belong to this loop (or nested ones)
  };
  std::vector<ir::Stmt>& body();
  // While a combine function is traced: its statements (ops on its two elements).
  std::vector<ir::Stmt>* combine_body_ = nullptr;
  int axis_for(ir::AxisKind kind, int64_t extent, const std::string& name);
  std::string fresh_name(const std::string& base);
  // A name the user gave a dim or block size, checked: an identifier, not used before.
  std::string user_name(const std::string& name, const char* what, const std::source_location& loc);

  ir::Kernel k_;
  int generation_;
  int next_var_ = 0;
  std::vector<Frame> open_loops_;
  std::vector<std::vector<int>> op_vars_;  // per op: the variable each input was read through
  std::vector<int> value_loop_;  // per value: the loop whose body defines it (-1: none)
  std::map<int, int> var_origin_;  // variable -> variable it was copied from
  std::map<int, int> var_depth_;
  // Tile loops with bounds computed on the device (not a tile's begin or end): the device bounds
  // are clipped to [0, extent] where extent is the smallest dim the tile indexes; per axis, the
  // Full op holding that extent, patched as the tile indexes tensors (sized_axes_).
  bool is_tile_bound(ir::ValueId v) const;
  int clip_bounds(ir::Bound& b, ir::Bound& e, const std::vector<const Var*>& vars, const std::source_location& loc);
  void size_unsized_axis(int axis, int64_t size);
  std::map<int, int> unsized_axes_;
  std::set<int> sized_axes_;
  std::vector<std::string> used_names_;  // of dims, so that no two share one
  std::map<std::string, int> next_index_;  // per base of generated names ("t", "r"): the next number
  std::string pending_error_;
  std::source_location pending_error_loc_;
  Tracer* previous_;
};

}  // namespace deuteron::frontend
