#include "frontend/tracer.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace deuteron::frontend {

namespace {
thread_local Tracer* g_current = nullptr;
int g_generation = 0;

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}
}  // namespace

Tracer::Tracer(std::string kernel_name, std::source_location defined_at)
    : generation_(++g_generation), previous_(g_current) {
  k_.name = std::move(kernel_name);
  k_.loc = defined_at;
  g_current = this;
}

Tracer::~Tracer() { g_current = previous_; }

Tracer* Tracer::current_or_null() { return g_current; }

Tracer& Tracer::current(const std::source_location& loc) {
  if (!g_current)
    throw KernelError("a tile-language operation was used outside a kernel trace",
                      format_location(loc),
                      "hl:: operations only work inside the lambda given to deuteron::kernel");
  return *g_current;
}

void Tracer::fail(const std::string& what, const std::source_location& loc,
                  const std::string& hint) const {
  throw KernelError(fmt::format("in kernel '{}': {}", k_.name, what), format_location(loc), hint);
}

std::vector<ir::Stmt>& Tracer::body() {
  if (combine_body_) return *combine_body_;
  if (open_loops_.empty()) return k_.top;
  return k_.loops[size_t(open_loops_.back().loop)].body;
}

std::string Tracer::user_name(const std::string& name, const char* what, const std::source_location& loc) {
  bool identifier = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) && name.size() <= 64 &&
                    std::all_of(name.begin(), name.end(), [](char c) {
                      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                    });
  if (!identifier)
    fail(fmt::format("the {} name '{}' is not an identifier", what, name), loc,
         "use letters, digits and underscores (up to 64), starting with a letter: e.g. \"m\" or \"block_k\"");
  bool taken = std::find(used_names_.begin(), used_names_.end(), name) != used_names_.end() ||
               std::any_of(k_.block_params.begin(), k_.block_params.end(),
                           [&](const ir::BlockParam& p) { return p.name == name || p.name == "block_" + name; });
  if (taken) fail(fmt::format("the {} name '{}' is taken by another dim or block size", what, name), loc,
                  "give each its own name");
  used_names_.push_back(name);
  return name;
}

std::string Tracer::fresh_name(const std::string& base) {
  std::string name;
  do name = fmt::format("{}{}", base, next_index_[base]++);
  while (std::find(used_names_.begin(), used_names_.end(), name) != used_names_.end());
  used_names_.push_back(name);
  return name;
}

// ---- arguments and outputs --------------------------------------------------------------------

std::shared_ptr<Var> Tracer::tensor_arg(const ArgSpec& spec, int arg_index) {
  ir::HostTensor t;
  t.name = spec.name.empty() ? fmt::format("arg{}", arg_index) : spec.name;
  t.role = ir::HostRole::Input;
  t.arg_index = arg_index;
  t.dtype = spec.dtype;
  t.shape = spec.shape;
  t.strides = spec.strides;
  k_.tensors.push_back(t);
  auto v = std::make_shared<Var>();
  v->id = next_var_++;
  v->host = true;
  v->tensor = int(k_.tensors.size()) - 1;
  return v;
}

std::shared_ptr<Var> Tracer::scalar_arg(const ArgSpec& spec, int arg_index) {
  ir::ScalarParam s;
  s.name = spec.name.empty() ? fmt::format("arg{}", arg_index) : spec.name;
  s.arg_index = arg_index;
  s.dtype = spec.dtype;
  s.value = spec.value;
  k_.scalars.push_back(s);
  auto v = std::make_shared<Var>();
  v->id = next_var_++;
  v->scalar = int(k_.scalars.size()) - 1;
  return v;  // its device value is made on first use inside a loop (ScalarArg op)
}

int64_t Tracer::scalar_value(const Var& v, const std::source_location& loc) {
  if (v.scalar < 0)
    fail("item() reads a scalar argument of the kernel in host code; this is not one", loc,
         "use x.size(d) for a tensor's sizes");
  if (!open_loops_.empty())
    fail("item() is host code: call it before the outermost tile loop", loc,
         "inside tile loops, use the scalar itself (it is a device value there)");
  ir::ScalarParam& s = k_.scalars[size_t(v.scalar)];
  if (s.dtype != DType::i64)
    fail(fmt::format("item() needs an integer scalar argument; '{}' is {}", s.name, dtype_name(s.dtype)), loc,
         "pass the size as an integer (int64_t)");
  s.specialized = true;
  return s.value;
}

std::shared_ptr<Var> Tracer::new_output(std::vector<int64_t> shape, DType dtype, const std::source_location& loc,
                                        std::optional<hl::Number> fill) {
  if (!open_loops_.empty())
    fail("outputs must be allocated in host code, outside the tile loops", loc,
         "move hl::empty/hl::empty_like before the outermost hl::tile loop");
  for (int64_t s : shape)
    if (s < 0) fail(fmt::format("negative size in output shape [{}]", fmt::join(shape, ", ")), loc);
  ir::HostTensor t;
  t.name = fmt::format("out{}", std::count_if(k_.tensors.begin(), k_.tensors.end(), [](auto& h) {
                         return h.role == ir::HostRole::Output;
                       }));
  t.role = ir::HostRole::Output;
  t.dtype = dtype;
  t.shape = shape;
  if (fill) t.fill = constant(*fill, compute_dtype(dtype), loc);
  t.strides.assign(shape.size(), 1);
  for (int i = int(shape.size()) - 2; i >= 0; --i)
    t.strides[size_t(i)] = t.strides[size_t(i) + 1] * std::max<int64_t>(shape[size_t(i) + 1], 1);
  k_.tensors.push_back(t);
  auto v = std::make_shared<Var>();
  v->id = next_var_++;
  v->host = true;
  v->tensor = int(k_.tensors.size()) - 1;
  v->loc = loc;
  return v;
}

void Tracer::set_outputs(const std::vector<std::shared_ptr<Var>>& outs,
                         const std::source_location& loc) {
  for (const auto& o : outs) {
    if (!o || !o->host || o->indexed)
      fail("a kernel must return host tensors (its arguments or outputs from hl::empty)", loc,
           "return the tensor allocated with hl::empty/hl::empty_like, not a block value");
    k_.outputs.push_back(o->tensor);
  }
}

ir::Kernel Tracer::finish() {
  if (!pending_error_.empty()) fail(pending_error_, pending_error_loc_);
  if (!open_loops_.empty()) fail("a tile loop was not closed", k_.loops.back().loc);
  if (k_.top.empty())
    fail("the kernel has no hl::tile loop, so it has no device code", k_.loc,
         "wrap the computation in `for (auto tile : hl::tile(out.sizes()))`");
  if (k_.outputs.empty())
    fail("the kernel returns nothing", k_.loc, "return the output tensors from the lambda");
  for (const auto& [axis, op] : unsized_axes_)
    if (!sized_axes_.count(axis))
      fail(fmt::format("tile '{}' has bounds computed on the device but never indexes a tensor, so nothing bounds it",
                       k_.axes[size_t(axis)].name),
           k_.loops[size_t(k_.axes[size_t(axis)].loop)].loc,
           "index a tensor with the tile (x[tile]): its loop is clipped to that dim, as a Python slice is");
  return k_;
}

// ---- variables --------------------------------------------------------------------------------

std::shared_ptr<Var> Tracer::new_device_var(ir::ValueId v, const std::source_location& loc) {
  auto var = std::make_shared<Var>();
  var->id = next_var_++;
  var->value = v;
  var->depth = depth();
  var->loc = loc;
  var_depth_[var->id] = var->depth;
  return var;
}

std::shared_ptr<Var> Tracer::copy_var(const Var& from) {
  auto var = std::make_shared<Var>(from);
  var->id = next_var_++;
  var->depth = depth();
  var->origin = from.id;
  var->indexed = false;
  var_origin_[var->id] = from.id;
  var_depth_[var->id] = var->depth;
  return var;
}

void Tracer::assign(const std::shared_ptr<Var>& target_ptr, const Var& from,
                    const std::source_location& loc) {
  Var& target = *target_ptr;
  if (target.host || from.host || from.scalar >= 0) {
    if (target.depth != depth() && target.id >= 0)
      fail("a host tensor or scalar variable was reassigned inside a tile loop", loc,
           "only block values can be updated inside loops");
    int id = target.id, d = target.depth;
    target = from;
    target.id = id;
    target.depth = d;
    target.indexed = false;
    return;
  }
  use(from, loc, "assignment");
  // Variables defined outside an open loop and assigned inside it are carried by that loop.
  for (size_t i = size_t(std::max(target.depth, 0)); i < open_loops_.size(); ++i) {
    auto& carried = open_loops_[i].carried;
    bool known = std::any_of(carried.begin(), carried.end(),
                             [&](auto& c) { return c.first->id == target.id; });
    if (!known && target.value >= 0) carried.emplace_back(target_ptr, target.value);
  }
  target.value = from.value;
  target.indexed = false;
  target.loc = loc;
}

ir::ValueId Tracer::use(const Var& v, const std::source_location& loc, const char* what) {
  if (v.host)
    fail(fmt::format("{} needs a block value, but got the whole tensor '{}'", what,
                     k_.tensors[size_t(v.tensor)].name),
         loc, "index the tensor with a tile to read a block, e.g. x[tile]");
  if (open_loops_.empty())
    fail(fmt::format("{} is device code and must be inside a tile loop", what), loc,
         "put it inside `for (auto tile : hl::tile(...))`");
  if (v.scalar >= 0 && v.value < 0) {
    ir::Op op;
    op.kind = ir::OpKind::ScalarArg;
    op.scalar = v.scalar;
    op.loc = loc;
    DType dt = k_.scalars[size_t(v.scalar)].dtype;
    const_cast<Var&>(v).value = emit(op, dt, {}, {});
  }
  if (v.value < 0) fail(fmt::format("{} uses an uninitialised hl::Tensor", what), loc);
  int defined_in = value_loop_.at(size_t(v.value));
  if (defined_in >= 0 && std::none_of(open_loops_.begin(), open_loops_.end(),
                                      [&](const Frame& f) { return f.loop == defined_in; }))
    fail(fmt::format("{} uses a block value computed inside a tile loop that has ended (at {})", what,
                     format_location(k_.loops[size_t(defined_in)].loc)),
         loc,
         "give the variable its value before the loop (e.g. hl::zeros) so the loop carries it, "
         "or use it inside the loop");
  return v.value;
}

const ir::HostTensor& Tracer::host_tensor(const Var& v, const std::source_location& loc,
                                          const char* what) {
  if (!v.host) fail(fmt::format("{} needs a kernel argument or output tensor", what), loc);
  return k_.tensors[size_t(v.tensor)];
}

// ---- ops ---------------------------------------------------------------------------------------

ir::ValueId Tracer::emit(ir::Op op, DType dtype, std::vector<int> dims,
                         const std::vector<const Var*>& vars) {
  ir::Value val;
  val.dtype = dtype;
  val.dims = std::move(dims);
  int op_id = int(k_.ops.size());
  if (op.kind != ir::OpKind::Store) {
    val.def_op = op_id;
    k_.values.push_back(val);
    value_loop_.push_back(open_loops_.empty() ? -1 : open_loops_.back().loop);
    op.result = int(k_.values.size()) - 1;
  }
  std::vector<int> ids;
  for (const Var* v : vars) ids.push_back(v ? v->id : -1);
  ids.resize(op.inputs.size(), -1);
  k_.ops.push_back(op);
  op_vars_.push_back(ids);
  body().push_back({ir::Stmt::Kind::Op, op_id});
  return op.result;
}

std::vector<int> Tracer::broadcast_dims(const std::vector<int>& a, const std::vector<int>& b,
                                        const std::source_location& loc, const char* what) {
  size_t n = std::max(a.size(), b.size());
  std::vector<int> out(n, ir::kOne);
  for (size_t i = 0; i < n; ++i) {
    int da = i < a.size() ? a[a.size() - 1 - i] : ir::kOne;
    int db = i < b.size() ? b[b.size() - 1 - i] : ir::kOne;
    int& d = out[n - 1 - i];
    if (da == db || db == ir::kOne) d = da;
    else if (da == ir::kOne) d = db;
    else {
      fail(fmt::format("shape mismatch in {}: {} and {} do not broadcast ({} vs {})", what, shape_text(a),
                       shape_text(b), dim_text(da, true), dim_text(db, true)),
           loc, "operands must be indexed by the same tiles (or have size-one dims)");
    }
  }
  return out;
}

std::string Tracer::dim_text(int d, bool spelled) const {
  if (d == ir::kOne) return spelled ? "a dim of size one" : "1";
  const ir::Axis& ax = k_.axes[size_t(d)];
  if (ax.kind == ir::AxisKind::Tile) return spelled ? fmt::format("tile {}", ax.name) : ax.name;
  return spelled ? fmt::format("a whole dim or slice of {}", ax.extent) : fmt::format("{}", ax.extent);
}

std::string Tracer::shape_text(const std::vector<int>& dims) const {
  std::vector<std::string> s;
  for (int d : dims) s.push_back(dim_text(d));
  return fmt::format("[{}]", fmt::join(s, ", "));
}

int Tracer::axis_for(ir::AxisKind kind, int64_t extent, const std::string& prefix) {
  for (size_t i = 0; i < k_.axes.size(); ++i)
    if (k_.axes[i].kind == kind && k_.axes[i].extent == extent) return int(i);
  ir::Axis ax;
  ax.kind = kind;
  ax.extent = extent;
  ax.name = fresh_name(prefix);
  if (kind == ir::AxisKind::Reduction) {
    ir::BlockParam p;
    p.name = "reduce_" + ax.name;
    p.reduction = true;
    p.min = std::min<int64_t>(next_pow2(extent), 16);
    p.max = next_pow2(extent);
    k_.block_params.push_back(p);
    ax.block_param = int(k_.block_params.size()) - 1;
  }
  k_.axes.push_back(ax);
  return int(k_.axes.size()) - 1;
}

int Tracer::tile_axis(const hl::Tile& t, const std::source_location& loc) const {
  int axis = t.axis();
  if (axis < 0) fail("an uninitialised hl::Tile was used", loc);
  const ir::Axis& ax = k_.axes[size_t(axis)];
  bool open = std::any_of(open_loops_.begin(), open_loops_.end(),
                          [&](const Frame& f) { return f.loop == ax.loop; });
  if (!open)
    fail(fmt::format("tile '{}' is used outside its loop (the loop at {} has ended)", ax.name,
                     format_location(k_.loops[size_t(ax.loop)].loc)),
         loc, "use a tile only inside the body of the hl::tile loop that produced it");
  return axis;
}

std::shared_ptr<Var> Tracer::index(const Var& tensor, const std::vector<hl::Index>& index,
                                   const std::source_location& loc) {
  if (!tensor.host)
    fail("indexing a block value is not supported", loc,
         "index the kernel's tensor arguments or outputs (x[tile]), not values computed from them");
  const ir::HostTensor& ht = k_.tensors[size_t(tensor.tensor)];
  if (open_loops_.empty())
    fail(fmt::format("reading or writing a block of '{}' outside a tile loop", ht.name), loc,
         "device code must be inside `for (auto tile : hl::tile(...))`");
  size_t rank = ht.shape.size();
  if (index.size() > rank)
    fail(fmt::format("rank mismatch: '{}' has {} dims ({}) but is indexed with {} entries", ht.name,
                     rank, fmt::join(ht.shape, "x"), index.size()),
         loc, "give one index entry per dimension (hl::all for a whole dimension)");
  std::vector<ir::Index> entries;
  std::vector<int> dims;
  std::vector<const Var*> vars;
  ir::Op op;
  op.kind = ir::OpKind::Load;
  for (size_t d = 0; d < rank; ++d) {
    int64_t size = ht.shape[d];
    ir::Index e;
    hl::Index entry = d < index.size() ? index[d] : hl::Index(hl::all);
    const auto& v = entry.get();
    if (auto* t = std::get_if<hl::Tile>(&v)) {
      int axis = tile_axis(*t, loc);
      size_unsized_axis(axis, size);
      const ir::Axis& ax = k_.axes[size_t(axis)];
      if (ax.extent > size)
        fail(fmt::format("tile '{}' spans {} elements but dim {} of '{}' has size {}", ax.name,
                         ax.extent, d, ht.name, size),
             loc, "tile each dimension with the size of the tensor dims it indexes");
      if (ax.scalar) {
        ir::Op b;
        b.kind = ir::OpKind::TileBegin;
        b.axis = axis;
        b.loc = loc;
        e.kind = ir::Index::Kind::Scalar;
        e.value = emit(b, DType::i64, {}, {});
      } else {
        e.axis = axis;
        dims.push_back(axis);
      }
    } else if (std::holds_alternative<hl::All>(v)) {
      e.axis = axis_for(ir::AxisKind::Reduction, size, "r");
      dims.push_back(e.axis);
    } else if (auto* s = std::get_if<hl::Slice>(&v)) {
      int64_t start = s->start < 0 ? s->start + size : s->start;
      int64_t stop = s->stop < 0 ? s->stop + size : std::min(s->stop, size);
      if (start < 0 || start >= stop)
        fail(fmt::format("empty or invalid slice [{}:{}] of dim {} (size {}) of '{}'", s->start,
                         s->stop, d, size, ht.name),
             loc);
      // Any constant range is a whole-extent axis keyed by its length, so a slice of 3
      // broadcasts with another tensor's whole dim of 3.
      e.axis = axis_for(ir::AxisKind::Reduction, stop - start, "r");
      e.offset = start;
      dims.push_back(e.axis);
    } else if (auto* i = std::get_if<int64_t>(&v)) {
      int64_t idx = *i < 0 ? *i + size : *i;
      if (idx < 0 || idx >= size)
        fail(fmt::format("index {} is out of range for dim {} (size {}) of '{}'", *i, d, size,
                         ht.name),
             loc);
      e.kind = ir::Index::Kind::Scalar;
      e.constant = idx;
    } else {
      const auto& var = *std::get<std::shared_ptr<Var>>(v);
      ir::ValueId val = use(var, loc, "a tensor index");
      const ir::Value& iv = k_.value(val);
      if (iv.dtype != DType::i32 && iv.dtype != DType::i64)
        fail(fmt::format("a tensor used as an index must be int32 or int64, not {}",
                         dtype_name(iv.dtype)),
             loc);
      e.value = val;
      op.inputs.push_back(val);
      vars.push_back(&var);
      if (iv.dims.empty()) {
        e.kind = ir::Index::Kind::Scalar;
      } else {
        // An index block's dims become result dims; a dim the result already has (the same
        // tile) pairs up element by element, as x[rows, labels[rows]] picks one per row.
        e.kind = ir::Index::Kind::Gather;
        for (int d : iv.dims)
          if (d != ir::kOne && std::find(dims.begin(), dims.end(), d) == dims.end()) dims.push_back(d);
      }
    }
    if (e.kind == ir::Index::Kind::Scalar && e.value >= 0 &&
        std::find(op.inputs.begin(), op.inputs.end(), e.value) == op.inputs.end()) {
      op.inputs.push_back(e.value);
      vars.push_back(nullptr);
    }
    entries.push_back(e);
  }
  op.tensor = tensor.tensor;
  op.index = entries;
  op.loc = loc;
  ir::ValueId val = emit(op, compute_dtype(ht.dtype), dims, vars);
  auto var = new_device_var(val, loc);
  var->indexed = true;
  var->tensor = tensor.tensor;
  var->load_op = int(k_.ops.size()) - 1;
  var->index = entries;
  return var;
}

void Tracer::store_indexed(Var& target, const Var& value, const std::source_location& loc, bool atomic_add) {
  if (!target.indexed)
    fail("assignment to a temporary block value", loc,
         "store into a tensor with `out[tile] = value`");
  ir::ValueId v = use(value, loc, atomic_add ? "hl::atomic_add" : "a store");
  const ir::HostTensor& ht = k_.tensors[size_t(target.tensor)];
  if (atomic_add) {
    if (ht.role != ir::HostRole::Output || !ht.fill)
      fail(fmt::format("hl::atomic_add into '{}', which {}", ht.name,
                       ht.role == ir::HostRole::Output ? "hl::empty leaves uninitialised" : "is an input"),
           loc, "add into an output created with hl::zeros (or hl::full) in host code");
    if (ht.dtype != DType::f32 && ht.dtype != DType::i32 && ht.dtype != DType::i64)
      fail(fmt::format("hl::atomic_add into '{}' of dtype {}: atomic adds are f32, int32 or int64",
                       ht.name, dtype_name(ht.dtype)),
           loc, "accumulate into an f32 output and cast afterwards");
  }
  ir::Op load = k_.ops[size_t(target.load_op)];
  const std::vector<int>& block = k_.value(load.result).dims;
  std::vector<int> vd = k_.value(v).dims;
  if (vd.size() > block.size() || broadcast_dims(vd, block, loc, "a store") != block)
    fail(fmt::format("storing a block of shape {} into '{}' whose indexed block has shape {}", shape_text(vd),
                     ht.name, shape_text(block)),
         loc, "the stored value must have (or broadcast to) the shape of the indexed block");
  // The read made by `out[index]` is not needed: drop it from the body.
  auto& stmts = body();
  for (auto it = stmts.rbegin(); it != stmts.rend(); ++it)
    if (it->kind == ir::Stmt::Kind::Op && it->id == target.load_op) {
      stmts.erase(std::next(it).base());
      break;
    }
  ir::Op st;
  st.kind = ir::OpKind::Store;
  st.atomic_add = atomic_add;
  st.tensor = target.tensor;
  st.index = load.index;
  st.inputs = load.inputs;
  std::vector<const Var*> vars(load.inputs.size(), nullptr);
  st.inputs.push_back(v);
  vars.push_back(&value);
  st.loc = loc;
  emit(st, ht.dtype, {}, vars);
  target.indexed = false;
}

ir::Constant Tracer::constant(const hl::Number& n, DType dt, const std::source_location& loc) const {
  ir::Constant c;
  if (is_floating(dt)) {
    c.real = n.real;
    return c;
  }
  // Integers and booleans are exact, and must fit their dtype (as torch requires).
  bool fits = n.is_integer || (std::isfinite(n.real) && n.real == std::trunc(n.real) && std::abs(n.real) < 0x1p63);
  int64_t v = n.is_integer ? n.integer : fits ? int64_t(n.real) : 0;
  int64_t lo = dt == DType::i32 ? INT32_MIN : dt == DType::boolean ? 0 : INT64_MIN;
  int64_t hi = dt == DType::i32 ? INT32_MAX : dt == DType::boolean ? 1 : INT64_MAX;
  if (!fits || v < lo || v > hi)
    fail(fmt::format("the constant {} does not fit {}", n.is_integer ? fmt::format("{}", n.integer) : fmt::format("{}", n.real),
                     dtype_name(dt)),
         loc, fmt::format("use a value of {}'s range, or convert the other operand with .to() first", dtype_name(dt)));
  c.integer = v;
  c.real = double(v);
  return c;
}

ir::ValueId Tracer::number(const hl::Number& n, DType other, std::vector<int> dims, const std::source_location& loc) {
  // A number takes the other operand's dtype, unless it is a float and that is not (then f32),
  // or a boolean cannot hold it (then int64).
  bool integral = n.is_integer || (std::isfinite(n.real) && n.real == std::trunc(n.real));
  DType dt = is_floating(other) || integral ? other : DType::f32;
  double x = n.is_integer ? double(n.integer) : n.real;
  if (dt == DType::boolean && !(x == 0 || x == 1)) dt = DType::i64;
  ir::Op f;
  f.kind = ir::OpKind::Full;
  f.number = constant(n, dt, loc);
  f.loc = loc;
  return emit(f, dt, std::move(dims), {});
}

ir::ValueId Tracer::binary(ir::BinaryFn fn, const hl::Operand& a, const hl::Operand& b) {
  const hl::Operand* ops[2] = {&a, &b};
  const std::source_location& loc = a.is_number ? b.loc : a.loc;
  if (a.is_number && b.is_number) fail("a binary op needs at least one tensor operand", loc);
  const hl::Operand& t = a.is_number ? b : a;
  ir::ValueId tv = use(*t.tensor.var(), loc, ir::name(fn));
  DType tdt = k_.value(tv).dtype;
  ir::ValueId vals[2];
  for (int i = 0; i < 2; ++i)
    vals[i] = ops[i]->is_number ? number(ops[i]->number, tdt, {}, loc) : use(*ops[i]->tensor.var(), loc, ir::name(fn));
  const ir::Value& va = k_.value(vals[0]);
  const ir::Value& vb = k_.value(vals[1]);
  std::vector<int> dims = broadcast_dims(va.dims, vb.dims, loc, ir::name(fn));
  DType promoted = promote(va.dtype, vb.dtype);
  if (!ir::accepts(ir::operand_rule(fn), promoted)) {
    bool bools = ir::operand_rule(fn) == ir::DTypeRule::IntegerOrBool;
    fail(fmt::format("{} takes {} operands, not {} ({} and {})", ir::name(fn),
                     bools ? "integer or boolean" : "integer", dtype_name(promoted), dtype_name(va.dtype),
                     dtype_name(vb.dtype)),
         loc, is_floating(promoted) ? "convert with .to(DType::i32) (or hl::bitcast for the bits) first" : "");
  }
  DType dt = ir::result_dtype(fn, promoted);
  ir::Op op;
  op.kind = ir::OpKind::Binary;
  op.binary = fn;
  op.inputs = {vals[0], vals[1]};
  op.loc = loc;
  return emit(op, dt, dims,
              {a.is_number ? nullptr : a.tensor.var().get(),
               b.is_number ? nullptr : b.tensor.var().get()});
}

ir::ValueId Tracer::unary(ir::UnaryFn fn, const Var& x, const std::source_location& loc) {
  ir::ValueId v = use(x, loc, ir::name(fn));
  const ir::Value& xv = k_.value(v);
  DType dt = ir::result_dtype(fn, xv.dtype);
  ir::Op op;
  op.kind = ir::OpKind::Unary;
  op.unary = fn;
  op.inputs = {v};
  op.loc = loc;
  return emit(op, dt, xv.dims, {&x});
}

ir::ValueId Tracer::where(const hl::Operand& c, const hl::Operand& a, const hl::Operand& b) {
  const std::source_location& loc = c.loc;
  if (c.is_number) fail("where() needs a boolean block as its condition", loc);
  ir::ValueId cv = use(*c.tensor.var(), loc, "where");
  if (k_.value(cv).dtype != DType::boolean)
    fail("where() needs a boolean condition (a comparison)", loc);
  // Numbers take the dtype of the other branch, as in a binary op; two numbers are int64 when
  // both are integers (as torch.where gives), else f32.
  DType other = a.number.is_integer && b.number.is_integer ? DType::i64 : DType::f32;
  if (!a.is_number) other = k_.value(use(*a.tensor.var(), loc, "where")).dtype;
  else if (!b.is_number) other = k_.value(use(*b.tensor.var(), loc, "where")).dtype;
  ir::ValueId vals[2];
  const hl::Operand* ops[2] = {&a, &b};
  for (int i = 0; i < 2; ++i)
    vals[i] = ops[i]->is_number ? number(ops[i]->number, other, {}, loc) : use(*ops[i]->tensor.var(), loc, "where");
  auto dims = broadcast_dims(k_.value(cv).dims, k_.value(vals[0]).dims, loc, "where");
  dims = broadcast_dims(dims, k_.value(vals[1]).dims, loc, "where");
  DType dt = promote(k_.value(vals[0]).dtype, k_.value(vals[1]).dtype);
  ir::Op op;
  op.kind = ir::OpKind::Where;
  op.inputs = {cv, vals[0], vals[1]};
  op.loc = loc;
  return emit(op, dt, dims,
              {c.tensor.var().get(), a.is_number ? nullptr : a.tensor.var().get(),
               b.is_number ? nullptr : b.tensor.var().get()});
}

ir::ValueId Tracer::cast(const Var& x, DType to, const std::source_location& loc) {
  ir::ValueId v = use(x, loc, "to()");
  ir::Op op;
  op.kind = ir::OpKind::Cast;
  op.inputs = {v};
  op.loc = loc;
  return emit(op, to, k_.value(v).dims, {&x});
}

ir::ValueId Tracer::reduce(ir::ReduceFn fn, const Var& x, int dim, bool keepdim,
                           const std::source_location& loc) {
  ir::ValueId v = use(x, loc, ir::name(fn));
  const ir::Value& xv = k_.value(v);
  int rank = int(xv.dims.size());
  if (dim < -rank || dim >= rank || rank == 0)
    fail(fmt::format("reduction dim {} is out of range for a block of rank {}", dim, rank), loc);
  if (dim < 0) dim += rank;
  std::vector<int> dims = xv.dims;
  if (keepdim) dims[size_t(dim)] = ir::kOne;
  else dims.erase(dims.begin() + dim);
  DType dt = ir::result_dtype(fn, xv.dtype);
  ir::Op op;
  op.kind = ir::OpKind::Reduce;
  op.reduce = fn;
  op.dim = dim;
  op.keepdim = keepdim;
  op.inputs = {v};
  op.loc = loc;
  return emit(op, dt, dims, {&x});
}

ir::ValueId Tracer::scan(const Var& x, int dim, bool reverse, const hl::CombineFn& combine, const char* what,
                         const std::source_location& loc) {
  if (combine_body_) fail(fmt::format("{} inside a scan's combine function", what), loc,
                          "a combine function works on two elements; scan outside it");
  ir::ValueId v = use(x, loc, what);
  const ir::Value xv = k_.value(v);
  int rank = int(xv.dims.size());
  if (rank == 0 || dim < -rank || dim >= rank)
    fail(fmt::format("{} along dim {}: the block {} has {} dims", what, dim, shape_text(xv.dims), rank), loc,
         rank == 0 ? "scan a block with dims, e.g. x[{tile, hl::all}]" : fmt::format("use a dim in [{}, {})", -rank, rank));
  if (dim < 0) dim += rank;
  int axis = xv.dims[size_t(dim)];
  if (axis != ir::kOne && k_.axes[size_t(axis)].kind == ir::AxisKind::Tile) {
    const ir::Axis& ax = k_.axes[size_t(axis)];
    fail(fmt::format("{} along dim {} of {}: that dim is tile {}, which the loop at {} splits into blocks, and a scan "
                     "needs the whole dim in one block",
                     what, dim, shape_text(xv.dims), ax.name, format_location(k_.loops[size_t(ax.loop)].loc)),
         loc, "read the dim whole and scan along it: tile the other dims and index this one with hl::all "
              "(x[{tile, hl::all}])");
  }
  // The combine function, traced on two elements without dims.
  ir::Combine c;
  c.loc = loc;
  for (ir::ValueId* param : {&c.a, &c.b}) {
    ir::Value pv;
    pv.dtype = xv.dtype;
    k_.values.push_back(pv);
    value_loop_.push_back(open_loops_.back().loop);
    *param = int(k_.values.size()) - 1;
  }
  std::vector<ir::Stmt> stmts;
  combine_body_ = &stmts;
  hl::Tensor result;
  try {
    result = combine(hl::Tensor(new_device_var(c.a, loc)), hl::Tensor(new_device_var(c.b, loc)));
  } catch (...) {
    combine_body_ = nullptr;
    throw;
  }
  combine_body_ = nullptr;
  if (!result.var() || result.var()->host || result.var()->value < 0)
    fail(fmt::format("the combine function of {} returned {}", what, !result.var() ? "an uninitialised hl::Tensor" : "no block value"),
         loc, "return a value computed from its two arguments, e.g. hl::maximum(a, b)");
  c.result = result.var()->value;
  std::set<ir::ValueId> inside = {c.a, c.b};
  for (const ir::Stmt& st : stmts) {
    const ir::Op& op = k_.ops[size_t(st.id)];
    bool elementwise = op.kind == ir::OpKind::Full || op.kind == ir::OpKind::Unary || op.kind == ir::OpKind::Binary ||
                       op.kind == ir::OpKind::Where || op.kind == ir::OpKind::Cast;
    if (!elementwise)
      fail(fmt::format("the combine function of {} uses {}: a combine function computes elementwise on its two "
                       "arguments and numbers only",
                       what, op.kind == ir::OpKind::ScalarArg ? "a scalar argument of the kernel" : ir::name(op.kind)),
           op.loc, "compute that outside the combine function and scan the result (or scan a tuple of values later)");
    for (ir::ValueId in : op.inputs)
      if (!inside.count(in))
        fail(fmt::format("the combine function of {} uses a block value from outside it (%{})", what, in), op.loc,
             "a combine function sees only its two arguments; combine blocks before the scan");
    if (!k_.value(op.result).dims.empty())
      fail(fmt::format("the combine function of {} makes a value of shape {}, not an element", what,
                       shape_text(k_.value(op.result).dims)),
           op.loc, "use numbers, not blocks (hl::full with dims), inside a combine function");
    inside.insert(op.result);
    c.ops.push_back(st.id);
  }
  if (!inside.count(c.result))
    fail(fmt::format("the combine function of {} returns a value from outside it", what), loc,
         "return a value computed from its two arguments, e.g. a + b");
  DType rt = k_.value(c.result).dtype;
  if (rt != xv.dtype)
    fail(fmt::format("the combine function of {} returns {}, but the scan is over {} values", what, dtype_name(rt),
                     dtype_name(xv.dtype)),
         loc, fmt::format("convert its result with .to(DType::{}), or convert x before the scan", dtype_name(xv.dtype)));
  if (axis == ir::kOne) return v;  // one element along the dim: the scan is x itself
  k_.combines.push_back(c);
  ir::Op op;
  op.kind = ir::OpKind::Scan;
  op.inputs = {v};
  op.dim = dim;
  op.reverse = reverse;
  op.combine = int(k_.combines.size()) - 1;
  op.loc = loc;
  return emit(op, xv.dtype, xv.dims, {&x});
}

ir::ValueId Tracer::view(const Var& x, std::vector<int> dims, const std::source_location& loc) {
  ir::ValueId v = use(x, loc, "a view");
  ir::Op op;
  op.kind = ir::OpKind::View;
  op.inputs = {v};
  op.loc = loc;
  return emit(op, k_.value(v).dtype, std::move(dims), {&x});
}

ir::ValueId Tracer::dot(const Var& a, const Var& b, const Var* acc, const std::source_location& loc) {
  ir::ValueId va = use(a, loc, "hl::dot");
  ir::ValueId vb = use(b, loc, "hl::dot");
  const ir::Value xa = k_.value(va);
  const ir::Value xb = k_.value(vb);
  auto show = [&](const std::vector<int>& dims) { return shape_text(dims); };
  for (const ir::Value* x : {&xa, &xb}) {
    const char* which = x == &xa ? "first" : "second";
    if (x->dims.size() < 2)
      fail(fmt::format("hl::dot needs blocks of rank 2 or more, but its {} operand has shape {} (rank {})",
                       which, show(x->dims), x->dims.size()),
           loc, "make a vector a matrix with unsqueeze (x.unsqueeze(0) for a row, x.unsqueeze(1) for a column)");
    if (!is_floating(x->dtype))
      fail(fmt::format("hl::dot multiplies floating-point blocks, but its {} operand is {}", which,
                       dtype_name(x->dtype)),
           loc, "convert it with .to(hl::f32) (or bf16/f16) first");
  }
  size_t ra = xa.dims.size(), rb = xb.dims.size();
  int ka = xa.dims[ra - 1], kb = xb.dims[rb - 2];
  if (ka != kb)
    fail(fmt::format("hl::dot: contraction dims differ: {} @ {} contracts {} with {}", show(xa.dims),
                     show(xb.dims), dim_text(ka, true), dim_text(kb, true)),
         loc,
         "the last dim of the first operand must be the second-to-last dim of the second, read with "
         "the same tile (or the same whole dim); transpose an operand if needed");
  std::vector<int> batch_a(xa.dims.begin(), xa.dims.end() - 2), batch_b(xb.dims.begin(), xb.dims.end() - 2);
  std::vector<int> dims = broadcast_dims(batch_a, batch_b, loc, "hl::dot (batch dims)");
  // A whole dim of size one in a product is a size-one dim (as hl::zeros({tm, 1}) makes it).
  for (int d : {xa.dims[ra - 2], xb.dims[rb - 1]}) {
    bool one = d != ir::kOne && k_.axes[size_t(d)].kind != ir::AxisKind::Tile && k_.axes[size_t(d)].extent == 1;
    dims.push_back(one ? ir::kOne : d);
  }
  ir::Op op;
  op.kind = ir::OpKind::Dot;
  op.inputs = {va, vb};
  op.loc = loc;
  std::vector<const Var*> vars = {&a, &b};
  if (acc) {
    ir::ValueId vc = use(*acc, loc, "hl::dot (accumulator)");
    const ir::Value& xc = k_.value(vc);
    if (!is_floating(xc.dtype))
      fail(fmt::format("hl::dot accumulates in f32, but its accumulator is {}", dtype_name(xc.dtype)), loc,
           "start the accumulator with hl::zeros({...}) (f32)");
    if (xc.dims.size() > dims.size() || broadcast_dims(xc.dims, dims, loc, "hl::dot (accumulator)") != dims)
      fail(fmt::format("hl::dot: the accumulator has shape {} but a @ b has shape {}", show(xc.dims), show(dims)),
           loc, "give the accumulator the shape of the product, e.g. hl::zeros({tm, tn})");
    op.inputs.push_back(vc);
    vars.push_back(acc);
  }
  return emit(op, DType::f32, dims, vars);
}

std::vector<int> Tracer::dims_of(const std::vector<hl::Size>& shape,
                                 const std::source_location& loc) {
  std::vector<int> dims;
  for (const auto& s : shape) {
    if (auto* t = std::get_if<hl::Tile>(&s.get())) {
      int axis = tile_axis(*t, loc);
      dims.push_back(k_.axes[size_t(axis)].scalar ? ir::kOne : axis);
    } else {
      int64_t n = std::get<int64_t>(s.get());
      if (n < 1) fail(fmt::format("block dims must be positive, got {}", n), loc);
      if (n == 1) dims.push_back(ir::kOne);
      else {
        // The whole-extent axis of this length (shared with any tensor dim of that size).
        dims.push_back(axis_for(ir::AxisKind::Reduction, n, "r"));
      }
    }
  }
  return dims;
}

ir::ValueId Tracer::full(const std::vector<hl::Size>& shape, const hl::Number& value, DType dtype,
                         const std::source_location& loc) {
  if (open_loops_.empty())
    fail("hl::zeros/hl::full create blocks and must be inside a tile loop", loc,
         "use hl::empty for host-side outputs");
  ir::Op op;
  op.kind = ir::OpKind::Full;
  op.number = constant(value, compute_dtype(dtype), loc);
  op.loc = loc;
  return emit(op, compute_dtype(dtype), dims_of(shape, loc), {});
}

ir::ValueId Tracer::extent(int axis, const std::source_location& loc) {
  ir::Op op;
  op.kind = ir::OpKind::Full;
  op.axis = axis;
  op.number = {double(k_.axes[size_t(axis)].extent), k_.axes[size_t(axis)].extent};
  op.loc = loc;
  return emit(op, DType::f32, {}, {});
}

ir::ValueId Tracer::tile_attr(ir::OpKind kind, const hl::Tile& t, const std::source_location& loc) {
  int axis = tile_axis(t, loc);
  // An hl::grid index is one element: its block's first.
  if (kind == ir::OpKind::TileIndex && k_.axes[size_t(axis)].scalar) kind = ir::OpKind::TileBegin;
  ir::Op op;
  op.kind = kind;
  op.axis = axis;
  op.loc = loc;
  std::vector<int> dims;
  if (kind == ir::OpKind::TileIndex && !k_.axes[size_t(axis)].scalar) dims = {axis};
  return emit(op, DType::i64, dims, {});
}

ir::ValueId Tracer::arange(int64_t n, const std::source_location& loc) {
  if (n < 1) fail(fmt::format("hl::arange needs a positive size, got {}", n), loc);
  if (open_loops_.empty()) fail("hl::arange creates a block and must be inside a tile loop", loc);
  ir::Op op;
  op.kind = ir::OpKind::TileIndex;
  op.axis = n == 1 ? -1 : dims_of({hl::Size(n)}, loc)[0];
  op.loc = loc;
  if (n == 1) {
    ir::Op f;
    f.kind = ir::OpKind::Full;
    f.loc = loc;
    return emit(f, DType::i64, {ir::kOne}, {});
  }
  return emit(op, DType::i64, {op.axis}, {});
}

// ---- loops ------------------------------------------------------------------------------------

int Tracer::register_block_size(int64_t min, int64_t max, const std::string& name, const std::source_location& loc) {
  if (min < 1 || max < min)
    fail(fmt::format("register_block_size({}, {}): need 1 <= min <= max", min, max), loc);
  ir::BlockParam p;
  p.name = name.empty() ? fmt::format("block_size_{}", k_.block_params.size()) : user_name(name, "block size", loc);
  p.min = next_pow2(min);
  p.max = next_pow2(max);
  k_.block_params.push_back(p);
  return int(k_.block_params.size()) - 1;
}

std::pair<hl::Tiles, int> Tracer::open_loop(const std::vector<int64_t>& extents,
                                            const std::vector<hl::Bound>& begins,
                                            const std::vector<hl::Bound>& ends,
                                            const std::vector<std::string>& names,
                                            hl::TileOptions opts, bool scalar,
                                            const std::source_location& loc) {
  if (!pending_error_.empty()) fail(pending_error_, pending_error_loc_);
  if (combine_body_)
    fail("a tile loop inside a scan's combine function", loc, "a combine function works on two elements; loop outside it");
  if (open_loops_.empty() && !k_.top.empty())
    fail(fmt::format("a kernel has one outermost tile loop (the launch grid, started once per call), and the one at {} "
                     "came first; this is a second one. Kernels run as one launch, so a pass that reads what an "
                     "earlier pass wrote would have no point where every block of the first had finished",
                     format_location(k_.loops[size_t(k_.top.front().id)].loc)),
         loc,
         "split the passes into two kernels called in order, nest the loop inside the first one, or tile several "
         "dimensions at once with hl::tile({m, n})");
  if (extents.empty()) fail("hl::tile needs at least one dimension", loc);
  ir::Loop loop;
  loop.parent = open_loops_.empty() ? -1 : open_loops_.back().loop;
  loop.grid = open_loops_.empty();
  loop.loc = loc;
  int loop_id = int(k_.loops.size());
  hl::Tiles tiles;
  for (size_t i = 0; i < extents.size(); ++i) {
    ir::Bound b, e;
    int64_t extent = extents[i];
    std::vector<const Var*> vars(2, nullptr);  // the user's variables behind a device begin and end
    auto bound = [&](const hl::Bound& hb, ir::Bound& out, const Var*& var) {
      if (auto* c = std::get_if<int64_t>(&hb.get())) {
        out.constant = *c;
      } else {
        const Var& v = *std::get<std::shared_ptr<Var>>(hb.get());
        if (loop.grid)
          fail("the bounds of the outermost tile loop must be constants", loc,
               "only inner loops may depend on the current tile (e.g. a causal mask)");
        out.value = use(v, loc, "a loop bound");
        const ir::Value& bv = k_.value(out.value);
        if (!bv.dims.empty() || is_floating(bv.dtype) || bv.dtype == DType::boolean)
          fail(fmt::format("a loop bound must be an integer scalar, not a {} value of shape {}", dtype_name(bv.dtype),
                           shape_text(bv.dims)),
               loc, "index one element (offsets[b]) or reduce the block to a scalar first");
        var = &v;
      }
    };
    if (!begins.empty()) bound(begins[i], b, vars[0]);
    if (!ends.empty()) bound(ends[i], e, vars[1]);
    else e.constant = extent;
    bool data_bound = (b.value >= 0 && !is_tile_bound(b.value)) || (e.value >= 0 && !is_tile_bound(e.value));
    if (data_bound) {
      extent = 0;  // the dims its tile indexes bound it (learned when it first indexes one)
    } else if (e.value >= 0) {
      extent = k_.axes[size_t(k_.ops[size_t(k_.value(e.value).def_op)].axis)].extent;
    } else {
      extent = e.constant - (b.value >= 0 ? 0 : b.constant);
      if (extent < 0) fail(fmt::format("tile loop over a negative range ({} elements)", extent), loc);
    }
    int clip_extent = -1;
    if (data_bound) clip_extent = clip_bounds(b, e, vars, loc);
    ir::Axis ax;
    ax.kind = ir::AxisKind::Tile;
    ax.extent = e.value >= 0 ? extent : e.constant;  // indices run below this
    ax.loop = loop_id;
    ax.scalar = scalar;
    bool named = i < names.size() && !names[i].empty();
    ax.name = named ? user_name(names[i], "tile dim", loc) : fresh_name(scalar ? "g" : "t");
    if (scalar) {
      ir::BlockParam p;
      p.name = "grid_" + ax.name;
      p.min = p.max = p.fixed = 1;
      k_.block_params.push_back(p);
      ax.block_param = int(k_.block_params.size()) - 1;
    } else if (opts.shared.param() >= 0) {
      ax.block_param = opts.shared.param();
    } else {
      ir::BlockParam p;
      p.name = "block_" + ax.name;
      p.min = 1;
      p.max = std::max<int64_t>(next_pow2(std::max<int64_t>(extent, 1)), 1);
      if (opts.block_size > 0) {
        if ((opts.block_size & (opts.block_size - 1)) != 0)
          fail(fmt::format("block_size {} is not a power of two", opts.block_size), loc);
        p.fixed = p.min = p.max = opts.block_size;
      }
      k_.block_params.push_back(p);
      ax.block_param = int(k_.block_params.size()) - 1;
    }
    k_.axes.push_back(ax);
    int axis = int(k_.axes.size()) - 1;
    if (clip_extent >= 0) unsized_axes_[axis] = clip_extent;
    loop.axes.push_back(axis);
    loop.begin.push_back(b);
    loop.end.push_back(e);
    hl::Tile t;
    hl::TileAccess::set(t, axis, loop_id, generation_);
    tiles.push_back(t);
  }
  k_.loops.push_back(loop);
  body().push_back({ir::Stmt::Kind::Loop, loop_id});
  open_loops_.push_back(Frame{loop_id, {}, k_.ops.size()});
  return {tiles, loop_id};
}

bool Tracer::is_tile_bound(ir::ValueId v) const {
  const ir::Op& def = k_.ops[size_t(k_.value(v).def_op)];
  return (def.kind == ir::OpKind::TileBegin || def.kind == ir::OpKind::TileEnd) && !unsized_axes_.count(def.axis);
}

int Tracer::clip_bounds(ir::Bound& b, ir::Bound& e, const std::vector<const Var*>& vars,
                        const std::source_location& loc) {
  auto scalar = [&](ir::Op op, std::vector<const Var*> in) {
    op.loc = loc;
    return emit(op, DType::i64, {}, in);
  };
  auto constant = [&](int64_t c) {
    ir::Op op;
    op.kind = ir::OpKind::Full;
    op.number = {double(c), c};
    return scalar(op, {});
  };
  auto binary = [&](ir::BinaryFn fn, ir::ValueId x, ir::ValueId y, const Var* x_var) {
    ir::Op op;
    op.kind = ir::OpKind::Binary;
    op.binary = fn;
    op.inputs = {x, y};
    return scalar(op, {x_var});
  };
  int extent_op = int(k_.ops.size());
  ir::ValueId extent = constant(0);  // patched when the tile first indexes a tensor
  ir::ValueId zero = constant(0);
  auto clip = [&](ir::Bound& bound, const Var* var) {
    ir::ValueId v = bound.value;
    if (v < 0) {
      v = constant(bound.constant);
    } else if (k_.value(v).dtype != DType::i64) {
      ir::Op cast;
      cast.kind = ir::OpKind::Cast;
      cast.inputs = {v};
      v = scalar(cast, {var});
      var = nullptr;
    }
    return binary(ir::BinaryFn::Min, binary(ir::BinaryFn::Max, v, zero, var), extent, nullptr);
  };
  // A constant begin stays one (targets index blocks from it); the end is clipped past it.
  ir::ValueId begin;
  if (b.value >= 0) {
    begin = b.value = clip(b, vars[0]);
  } else {
    b.constant = std::max<int64_t>(b.constant, 0);
    begin = constant(b.constant);
  }
  e.value = binary(ir::BinaryFn::Max, clip(e, vars[1]), begin, nullptr);  // ends before it begins: empty
  return extent_op;
}

void Tracer::size_unsized_axis(int axis, int64_t size) {
  auto it = unsized_axes_.find(axis);
  if (it == unsized_axes_.end()) return;
  ir::Axis& ax = k_.axes[size_t(axis)];
  ax.extent = ax.extent == 0 ? size : std::min(ax.extent, size);
  k_.ops[size_t(it->second)].number = {double(ax.extent), ax.extent};
  ir::BlockParam& p = k_.block_params[size_t(ax.block_param)];
  if (!p.fixed && p.name == "block_" + ax.name) p.max = std::max<int64_t>(next_pow2(std::max<int64_t>(ax.extent, 1)), 1);
  sized_axes_.insert(axis);
}

void Tracer::close_loop(int loop_id) {
  if (open_loops_.empty() || open_loops_.back().loop != loop_id)
    fail("tile loops closed out of order", k_.loops[size_t(loop_id)].loc);
  Frame frame = open_loops_.back();
  open_loops_.pop_back();
  ir::Loop& loop = k_.loops[size_t(loop_id)];
  for (auto& [var, init] : frame.carried) {
    ir::ValueId next = var->value;
    if (next == init) continue;
    const ir::Value iv = k_.value(init);
    const ir::Value nv = k_.value(next);
    if (iv.dims != nv.dims)
      fail(fmt::format("a value carried around the loop changes shape from {} to {}", shape_text(iv.dims),
                       shape_text(nv.dims)),
           var->loc, "give the accumulator its final shape before the loop (hl::zeros/hl::full)");
    ir::Carried c;
    c.init = init;
    c.next = next;
    ir::Value phi = iv;
    phi.def_op = -1;
    k_.values.push_back(phi);
    value_loop_.push_back(loop_id);
    c.phi = int(k_.values.size()) - 1;
    ir::Value res = iv;
    res.def_op = -1;
    k_.values.push_back(res);
    value_loop_.push_back(open_loops_.empty() ? -1 : open_loops_.back().loop);
    c.result = int(k_.values.size()) - 1;
    // Reads of the variable inside the loop, before it was reassigned, see the phi.
    auto reads_var = [&](int used_var) {
      if (used_var == var->id) return true;
      auto d = var_depth_.find(used_var);
      bool inside = d != var_depth_.end() && d->second > int(open_loops_.size());
      if (!inside) return false;
      for (int o = used_var; o >= 0;) {
        if (o == var->id) return true;
        auto it = var_origin_.find(o);
        o = it == var_origin_.end() ? -1 : it->second;
      }
      return true;  // a copy made inside the loop of the value: the carried one
    };
    for (size_t op = frame.first_op; op < k_.ops.size(); ++op)
      for (size_t i = 0; i < k_.ops[op].inputs.size(); ++i)
        if (k_.ops[op].inputs[i] == init && reads_var(op_vars_[op][i])) {
          k_.ops[op].inputs[i] = c.phi;
          for (auto& e : k_.ops[op].index)
            if (e.value == init) e.value = c.phi;
        }
    for (size_t l = size_t(loop_id) + 1; l < k_.loops.size(); ++l)
      for (auto& nested : k_.loops[l].carried)
        if (nested.init == init) nested.init = c.phi;
    if (c.next == init) c.next = c.phi;
    loop.carried.push_back(c);
    var->value = c.result;
  }
}

void Tracer::abandon_loop(int loop) noexcept {
  if (std::uncaught_exceptions() > 0) return;
  try {
    if (pending_error_.empty()) {
      pending_error_ = "control left a tile loop early (break or return inside hl::tile)";
      pending_error_loc_ = k_.loops[size_t(loop)].loc;
    }
    while (!open_loops_.empty() && open_loops_.back().loop >= loop) open_loops_.pop_back();
  } catch (...) {
  }
}

}  // namespace deuteron::frontend
