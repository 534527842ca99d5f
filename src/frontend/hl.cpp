// The tile language's operations: each records itself into the current trace.
#include <cfloat>
#include <cmath>

#include <fmt/format.h>

#include "deuteron/hl.h"
#include "frontend/tracer.h"

namespace deuteron::hl {

using frontend::Tracer;
using detail::Var;

namespace {
Tensor wrap(Tracer& tr, ir::ValueId v, const Loc& loc) { return Tensor(tr.new_device_var(v, loc)); }
const Var& var_of(const Tensor& t, const Loc& loc) {
  if (!t.var())
    Tracer::current(loc).fail("an uninitialised hl::Tensor was used", loc,
                              "assign it a value (e.g. hl::zeros) before use");
  return *t.var();
}
}  // namespace

// ---- Tile -------------------------------------------------------------------------------------

Tensor Tile::index(Loc loc) const {
  auto& tr = Tracer::current(loc);
  return wrap(tr, tr.tile_attr(ir::OpKind::TileIndex, *this, loc), loc);
}
Tensor Tile::begin(Loc loc) const {
  auto& tr = Tracer::current(loc);
  return wrap(tr, tr.tile_attr(ir::OpKind::TileBegin, *this, loc), loc);
}
Tensor Tile::end(Loc loc) const {
  auto& tr = Tracer::current(loc);
  return wrap(tr, tr.tile_attr(ir::OpKind::TileEnd, *this, loc), loc);
}
Tensor Tile::block_size(Loc loc) const {
  auto& tr = Tracer::current(loc);
  return wrap(tr, tr.tile_attr(ir::OpKind::TileSize, *this, loc), loc);
}

Index::Index(const Tensor& t, Loc loc) : loc_(loc) {
  if (!t.var())
    throw KernelError("an uninitialised hl::Tensor was used as an index", format_location(loc));
  if (t.var()->host)
    throw KernelError("a whole tensor cannot be used as an index", format_location(loc),
                      "index with a block of it: labels[tile]");
  v_ = t.var();
}

Bound::Bound(const Tensor& t) {
  if (!t.var()) throw KernelError("an uninitialised hl::Tensor was used as a loop bound");
  v_ = t.var();
}

// ---- Tensor -----------------------------------------------------------------------------------

Tensor::Tensor() = default;
Tensor::Tensor(std::shared_ptr<detail::Var> var) : var_(std::move(var)) {}
Tensor::Tensor(Tensor&& other) noexcept = default;
Tensor::~Tensor() = default;

Tensor::Tensor(const Tensor& other) {
  Tracer* tr = Tracer::current_or_null();
  if (!other.var_ || !tr || other.var_->host) var_ = other.var_;
  else var_ = tr->copy_var(*other.var_);
}

Tensor& Tensor::operator=(const Tensor& other) & {
  if (this == &other) return *this;
  Tracer* tr = Tracer::current_or_null();
  if (!tr || !other.var_) {
    var_ = other.var_;
    return *this;
  }
  if (!var_) {
    var_ = other.var_->host ? other.var_ : tr->copy_var(*other.var_);
    return *this;
  }
  tr->assign(var_, *other.var_, other.var_->loc);
  return *this;
}

Tensor& Tensor::operator=(Tensor&& other) & { return operator=(static_cast<const Tensor&>(other)); }

void Tensor::operator=(const Tensor& value) && {
  // The indexed block records where `out[index]` was written: the store's line.
  Loc loc = var_ ? var_->loc : Loc::current();
  auto& tr = Tracer::current(loc);
  if (!var_) tr.fail("assignment to an uninitialised hl::Tensor", loc);
  tr.store_indexed(*var_, var_of(value, loc), loc);
}

void Tensor::operator+=(const Tensor& value) && {
  Loc loc = value.var_ ? value.var_->loc : Loc::current();
  auto& tr = Tracer::current(loc);
  if (!var_ || !var_->indexed) tr.fail("+= on a temporary block value", loc);
  Tensor sum = Operand(*this, loc) + Operand(value, loc);
  tr.store_indexed(*var_, *sum.var_, loc);
}

Tensor& Tensor::operator+=(const Tensor& value) & { return *this = *this + value; }
Tensor& Tensor::operator-=(const Tensor& value) & { return *this = *this - value; }
Tensor& Tensor::operator*=(const Tensor& value) & { return *this = *this * value; }

std::vector<int64_t> Tensor::sizes(Loc loc) const {
  auto& tr = Tracer::current(loc);
  return tr.host_tensor(var_of(*this, loc), loc, "sizes()").shape;
}
int64_t Tensor::size(int d, Loc loc) const {
  auto& tr = Tracer::current(loc);
  const auto& shape = tr.host_tensor(var_of(*this, loc), loc, "size()").shape;
  int rank = int(shape.size());
  if (d < -rank || d >= rank)
    tr.fail(fmt::format("size({}) of a tensor with {} dims", d, rank), loc);
  return shape[size_t(d < 0 ? d + rank : d)];
}
int Tensor::dim(Loc loc) const { return int(sizes(loc).size()); }
int64_t Tensor::item(Loc loc) const { return Tracer::current(loc).scalar_value(var_of(*this, loc), loc); }

DType Tensor::dtype() const {
  Loc loc = var_ ? var_->loc : Loc::current();
  auto& tr = Tracer::current(loc);
  const Var& v = var_of(*this, loc);
  if (v.host) return tr.kernel().tensors[size_t(v.tensor)].dtype;
  if (v.scalar >= 0) return tr.kernel().scalars[size_t(v.scalar)].dtype;
  return tr.kernel().value(v.value).dtype;
}

int Tensor::rank(Loc loc) const {
  auto& tr = Tracer::current(loc);
  return int(tr.kernel().value(tr.use(var_of(*this, loc), loc, "rank()")).dims.size());
}

Tensor Tensor::operator[](const Index& index) const { return operator[]({index}); }

Tensor Tensor::operator[](std::initializer_list<Index> index) const {
  Loc loc = index.size() ? index.begin()->loc() : Loc::current();
  auto& tr = Tracer::current(loc);
  return Tensor(tr.index(var_of(*this, loc), std::vector<Index>(index), loc));
}

Tensor Tensor::operator[](const TilesIndex& tiles) const {
  std::vector<Index> index;
  for (const Tile& t : tiles.tiles) index.emplace_back(t, tiles.loc);
  auto& tr = Tracer::current(tiles.loc);
  return Tensor(tr.index(var_of(*this, tiles.loc), index, tiles.loc));
}

Tensor Tensor::sum(int d, bool keepdim, Loc loc) const { return hl::sum(*this, d, keepdim, loc); }
Tensor Tensor::mean(int d, bool keepdim, Loc loc) const { return hl::mean(*this, d, keepdim, loc); }
Tensor Tensor::amax(int d, bool keepdim, Loc loc) const { return hl::amax(*this, d, keepdim, loc); }
Tensor Tensor::amin(int d, bool keepdim, Loc loc) const { return hl::amin(*this, d, keepdim, loc); }
Tensor Tensor::cumsum(int d, Loc loc) const { return hl::cumsum(*this, d, false, loc); }
Tensor Tensor::cumprod(int d, Loc loc) const { return hl::cumprod(*this, d, false, loc); }

namespace {
std::vector<int> dims_of_value(Tracer& tr, const Tensor& t, const Loc& loc, const char* what) {
  return tr.kernel().value(tr.use(var_of(t, loc), loc, what)).dims;
}
int norm_dim(Tracer& tr, int d, int rank, const Loc& loc) {
  if (d < -rank || d >= rank)
    tr.fail(fmt::format("dim {} is out of range for a block of rank {}", d, rank), loc);
  return d < 0 ? d + rank : d;
}
}  // namespace

Tensor Tensor::unsqueeze(int d, Loc loc) const {
  auto& tr = Tracer::current(loc);
  auto dims = dims_of_value(tr, *this, loc, "unsqueeze");
  d = norm_dim(tr, d, int(dims.size()) + 1, loc);
  dims.insert(dims.begin() + d, ir::kOne);
  return wrap(tr, tr.view(var_of(*this, loc), dims, loc), loc);
}

Tensor Tensor::squeeze(int d, Loc loc) const {
  auto& tr = Tracer::current(loc);
  auto dims = dims_of_value(tr, *this, loc, "squeeze");
  d = norm_dim(tr, d, int(dims.size()), loc);
  if (dims[size_t(d)] != ir::kOne) return *this;  // PyTorch: squeezing a non-one dim is a no-op
  dims.erase(dims.begin() + d);
  return wrap(tr, tr.view(var_of(*this, loc), dims, loc), loc);
}

Tensor Tensor::transpose(int d0, int d1, Loc loc) const {
  auto& tr = Tracer::current(loc);
  auto dims = dims_of_value(tr, *this, loc, "transpose");
  int r = int(dims.size());
  std::swap(dims[size_t(norm_dim(tr, d0, r, loc))], dims[size_t(norm_dim(tr, d1, r, loc))]);
  return wrap(tr, tr.view(var_of(*this, loc), dims, loc), loc);
}

Tensor Tensor::permute(std::vector<int> order, Loc loc) const {
  auto& tr = Tracer::current(loc);
  auto dims = dims_of_value(tr, *this, loc, "permute");
  if (order.size() != dims.size())
    tr.fail(fmt::format("permute needs {} dims, got {}", dims.size(), order.size()), loc);
  std::vector<int> out;
  std::vector<bool> seen(dims.size(), false);
  for (int o : order) {
    int d = norm_dim(tr, o, int(dims.size()), loc);
    if (seen[size_t(d)]) tr.fail(fmt::format("permute repeats dim {}", o), loc);
    seen[size_t(d)] = true;
    out.push_back(dims[size_t(d)]);
  }
  return wrap(tr, tr.view(var_of(*this, loc), out, loc), loc);
}

Tensor Tensor::reshape(std::vector<Size> shape, Loc loc) const {
  auto& tr = Tracer::current(loc);
  auto dims = dims_of_value(tr, *this, loc, "reshape");
  auto target = tr.dims_of(shape, loc);
  // Supported: adding or removing size-one dims (the block's other dims keep their order).
  std::vector<int> a, b;
  for (int d : dims)
    if (d != ir::kOne) a.push_back(d);
  for (int d : target)
    if (d != ir::kOne) b.push_back(d);
  if (a != b)
    tr.fail("reshape may only add or remove size-one dims of a block", loc,
            "merging or splitting tiled dims is not supported; index the tensor in the shape "
            "you need instead");
  return wrap(tr, tr.view(var_of(*this, loc), target, loc), loc);
}

Tensor Tensor::view(std::vector<Size> shape, Loc loc) const { return reshape(std::move(shape), loc); }

Tensor Tensor::expand(std::vector<Size> shape, Loc loc) const {
  auto& tr = Tracer::current(loc);
  auto dims = dims_of_value(tr, *this, loc, "expand");
  auto target = tr.dims_of(shape, loc);
  if (target.size() < dims.size() || tr.broadcast_dims(dims, target, loc, "expand") != target)
    tr.fail("expand: the block does not broadcast to the requested shape", loc);
  return wrap(tr, tr.view(var_of(*this, loc), target, loc), loc);
}

Tensor Tensor::to(DType dtype, Loc loc) const {
  auto& tr = Tracer::current(loc);
  return wrap(tr, tr.cast(var_of(*this, loc), dtype, loc), loc);
}

// ---- free functions ----------------------------------------------------------------------------

namespace {
Tensor bin(ir::BinaryFn fn, const Operand& a, const Operand& b) {
  const Loc& loc = a.is_number ? b.loc : a.loc;
  auto& tr = Tracer::current(loc);
  if (!a.is_number) var_of(a.tensor, loc);
  if (!b.is_number) var_of(b.tensor, loc);
  return wrap(tr, tr.binary(fn, a, b), loc);
}
Tensor un(ir::UnaryFn fn, const Tensor& x, const Loc& loc) {
  auto& tr = Tracer::current(loc);
  return wrap(tr, tr.unary(fn, var_of(x, loc), loc), loc);
}
Tensor red(ir::ReduceFn fn, const Tensor& x, int d, bool keepdim, const Loc& loc) {
  auto& tr = Tracer::current(loc);
  return wrap(tr, tr.reduce(fn, var_of(x, loc), d, keepdim, loc), loc);
}
}  // namespace

Tensor operator+(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Add, a, b); }
Tensor operator-(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Sub, a, b); }
Tensor operator*(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Mul, a, b); }
Tensor operator/(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Div, a, b); }
Tensor operator==(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Eq, a, b); }
Tensor operator!=(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Ne, a, b); }
Tensor operator<(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Lt, a, b); }
Tensor operator<=(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Le, a, b); }
Tensor operator>(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Gt, a, b); }
Tensor operator>=(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Ge, a, b); }
Tensor operator&&(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::And, a, b); }
Tensor operator||(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Or, a, b); }
Tensor maximum(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Max, a, b); }
Tensor minimum(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Min, a, b); }
Tensor pow(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Pow, a, b); }
Tensor clamp(const Operand& x, const Operand& lo, const Operand& hi) {
  return minimum(Operand(maximum(x, lo), x.loc), hi);
}
Tensor clamp_min(const Operand& x, const Operand& lo) { return maximum(x, lo); }
Tensor clamp_max(const Operand& x, const Operand& hi) { return minimum(x, hi); }
Tensor operator&(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::BitAnd, a, b); }
Tensor operator|(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::BitOr, a, b); }
Tensor operator^(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::BitXor, a, b); }
Tensor operator<<(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Shl, a, b); }
Tensor operator>>(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Shr, a, b); }
Tensor operator%(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Mod, a, b); }
Tensor remainder(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::Mod, a, b); }
Tensor floor_divide(const Operand& a, const Operand& b) { return bin(ir::BinaryFn::FloorDiv, a, b); }
Tensor rand(const Operand& seed, const Operand& offset) { return bin(ir::BinaryFn::Rand, seed, offset); }
Tensor randn(const Operand& seed, const Operand& offset) { return bin(ir::BinaryFn::Randn, seed, offset); }
Tensor randint(const Operand& seed, const Operand& offset) { return bin(ir::BinaryFn::RandInt, seed, offset); }

Tensor operator-(const Tensor& a) {
  Loc loc = a.var() ? a.var()->loc : Loc::current();
  return un(ir::UnaryFn::Neg, a, loc);
}
Tensor operator!(const Tensor& a) {
  Loc loc = a.var() ? a.var()->loc : Loc::current();
  return un(ir::UnaryFn::Not, a, loc);
}

Tensor where(const Operand& c, const Operand& a, const Operand& b) {
  auto& tr = Tracer::current(c.loc);
  return wrap(tr, tr.where(c, a, b), c.loc);
}

Tensor exp(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Exp, x, loc); }
Tensor exp2(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Exp2, x, loc); }
Tensor log(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Log, x, loc); }
Tensor sqrt(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Sqrt, x, loc); }
Tensor rsqrt(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Rsqrt, x, loc); }
Tensor tanh(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Tanh, x, loc); }
Tensor sigmoid(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Sigmoid, x, loc); }
Tensor silu(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Silu, x, loc); }
Tensor erf(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Erf, x, loc); }
Tensor abs(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Abs, x, loc); }
Tensor sin(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Sin, x, loc); }
Tensor cos(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Cos, x, loc); }
Tensor log1p(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Log1p, x, loc); }
Tensor expm1(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Expm1, x, loc); }
Tensor floor(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Floor, x, loc); }
Tensor ceil(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Ceil, x, loc); }
Tensor round(const Tensor& x, Loc loc) { return un(ir::UnaryFn::Round, x, loc); }

Tensor bitcast(const Tensor& x, DType to, Loc loc) {
  DType from = x.dtype();
  if (from == to) return x;
  if (from == DType::f32 && to == DType::i32) return un(ir::UnaryFn::BitcastI32, x, loc);
  if (from == DType::i32 && to == DType::f32) return un(ir::UnaryFn::BitcastF32, x, loc);
  Tracer::current(loc).fail(
      fmt::format("hl::bitcast from {} ({} bits) to {} ({} bits): {}", dtype_name(from), 8 * dtype_size(from),
                  dtype_name(to), 8 * dtype_size(to),
                  dtype_size(from) != dtype_size(to) ? "the widths differ" : "no bitcast between these types"),
      loc, "bitcast between float32 and int32; convert values with .to(dtype)");
}

Tensor gelu(const Tensor& x, const char* approximate, Loc loc) {
  std::string a = approximate ? approximate : "none";
  if (a == "tanh") return un(ir::UnaryFn::GeluTanh, x, loc);
  if (a == "none") return un(ir::UnaryFn::GeluErf, x, loc);
  Tracer::current(loc).fail(fmt::format("gelu: unknown approximate='{}'", a), loc,
                            "use \"none\" (erf form) or \"tanh\"");
}

Tensor sum(const Tensor& x, int d, bool keepdim, Loc loc) {
  return red(ir::ReduceFn::Sum, x, d, keepdim, loc);
}
Tensor amax(const Tensor& x, int d, bool keepdim, Loc loc) {
  return red(ir::ReduceFn::Max, x, d, keepdim, loc);
}
Tensor amin(const Tensor& x, int d, bool keepdim, Loc loc) {
  return red(ir::ReduceFn::Min, x, d, keepdim, loc);
}
Tensor associative_scan(const CombineFn& combine, const Tensor& x, int d, bool reverse, Loc loc) {
  auto& tr = Tracer::current(loc);
  if (!combine) tr.fail("hl::associative_scan without a combine function", loc, "pass a callable (a, b) -> value");
  return wrap(tr, tr.scan(var_of(x, loc), d, reverse, combine, "hl::associative_scan", loc), loc);
}
namespace {
// cumsum and cumprod: floats keep their dtype, integers and booleans accumulate in int64 (torch).
Tensor accumulate(ir::BinaryFn fn, const char* what, const Tensor& x, int d, bool reverse, const Loc& loc) {
  auto& tr = Tracer::current(loc);
  Tensor in = is_floating(x.dtype()) || x.dtype() == DType::i64 ? x : x.to(DType::i64, loc);
  CombineFn combine = [&](Tensor a, Tensor b) { return bin(fn, Operand(a, loc), Operand(b, loc)); };
  return wrap(tr, tr.scan(var_of(in, loc), d, reverse, combine, what, loc), loc);
}
}  // namespace
Tensor cumsum(const Tensor& x, int d, bool reverse, Loc loc) {
  return accumulate(ir::BinaryFn::Add, "hl::cumsum", x, d, reverse, loc);
}
Tensor cumprod(const Tensor& x, int d, bool reverse, Loc loc) {
  return accumulate(ir::BinaryFn::Mul, "hl::cumprod", x, d, reverse, loc);
}

// The extent of a whole dim is an op naming its axis (not a number), so that a general variant
// reads it at run time; a fixed dim's is a number.
Tensor count(const Tensor& x, int d, Loc loc) {
  auto& tr = Tracer::current(loc);
  auto dims = dims_of_value(tr, x, loc, "hl::count");
  int axis = dims[size_t(norm_dim(tr, d, int(dims.size()), loc))];
  if (axis == ir::kOne) return full({}, 1.0, DType::f32, loc);
  const ir::Axis& ax = tr.kernel().axes[size_t(axis)];
  if (ax.kind == ir::AxisKind::Reduction) return wrap(tr, tr.extent(axis, loc), loc);
  if (ax.kind != ir::AxisKind::Tile) return full({}, double(ax.extent), DType::f32, loc);
  hl::Tile t;
  TileAccess::set(t, axis, ax.loop, 0);
  return (Operand(t.end(loc), loc) - Operand(t.begin(loc), loc)).to(DType::f32, loc);
}

namespace {
// The corrected two-pass algorithm (Chan, Golub and LeVeque) that hl::mean and hl::var_mean
// share: one pass for a centre c, a first estimate of the mean; one for s1 = sum(e) (and for
// var_mean s2 = sum(e^2) in the same loop) over the deviations e = (x - c) * scale; then
// mean = c + s1 / n / scale and sum((x - mean)^2) = (s2 - s1^2 / n) / scale^2.
struct Deviations {
  Tensor n, c, scale;
  // e, traced anew for each use: each then has one use, so the plan computes it in the loop of
  // the sum that reads it instead of storing a centred copy of the block.
  Tensor at(const Tensor& x, const Loc& loc) const {
    return Operand(Operand(x, loc) - Operand(c, loc), loc) * Operand(scale, loc);
  }
};
Deviations deviations(const Tensor& x, int d, const Loc& loc) {
  Deviations v;
  v.n = count(x, d, loc);
  // c = sum(x * (0.5 / n)) doubled: halved, no partial sum overflows near the f32 limit (the
  // doubling is clamped to it instead). Where that sum is not finite (an inf or NaN in the row)
  // c is 0, so the row gives the plain sum's inf, -inf or NaN.
  Tensor half = sum(Operand(x, loc) * Operand(Operand(0.5, loc) / Operand(v.n, loc), loc), d, true, loc);
  Tensor finite = Operand(abs(half, loc), loc) < Operand(INFINITY, loc);
  Tensor doubled = clamp(Operand(Operand(half, loc) * Operand(2.0, loc), loc), Operand(-FLT_MAX, loc),
                         Operand(FLT_MAX, loc));
  v.c = where(Operand(finite, loc), Operand(doubled, loc), Operand(0.0, loc));
  // Deviations from a centre beyond 2^60 are scaled by 2^-60, so that their squares (an ulp of
  // 3e38 is 2e31) and sums stay finite. A power of two, so the scaling is exact, and one whose
  // square is a normal f32: XLA turns a / scale / scale into a / (scale * scale), and flushes
  // denormals.
  Tensor huge = Operand(abs(v.c, loc), loc) >= Operand(0x1p60, loc);
  v.scale = where(Operand(huge, loc), Operand(0x1p-60, loc), Operand(1.0, loc));
  return v;
}
}  // namespace

// The deviations from c are small and integral multiples of the smaller ulp of x and c, so
// the rounding error scales with the values' spread, not their magnitude, and a constant row's
// deviations all equal one multiple k of its ulp: s1 = n * k ulps is exact while n * k < 2^24
// (k, c's error in ulps, is at most about n / 32 + 1 on the cpu), and the mean is the constant.
Tensor mean(const Tensor& x, int d, bool keepdim, Loc loc) {
  if (!is_floating(x.dtype())) return Operand(sum(x, d, keepdim, loc), loc) / Operand(count(x, d, loc), loc);
  Deviations v = deviations(x, d, loc);
  Tensor s1 = sum(v.at(x, loc), d, true, loc);
  Tensor offset = Operand(Operand(s1, loc) / Operand(v.n, loc), loc) / Operand(v.scale, loc);
  Tensor m = Operand(v.c, loc) + Operand(offset, loc);
  return keepdim ? m : m.squeeze(d, loc);
}

std::pair<Tensor, Tensor> var_mean(const Tensor& x, int d, bool keepdim, int64_t correction, Loc loc) {
  Tensor xf = is_floating(x.dtype()) ? x : x.to(DType::f32, loc);
  Deviations v = deviations(xf, d, loc);
  // Traced one after the other, over the same block: the plan sums them in one loop.
  Tensor s1 = sum(v.at(xf, loc), d, true, loc);
  Tensor s2 = sum(Operand(v.at(xf, loc), loc) * Operand(v.at(xf, loc), loc), d, true, loc);
  Tensor offset = Operand(s1, loc) / Operand(v.n, loc);  // of the mean from c, scaled
  Tensor mu = Operand(v.c, loc) + Operand(Operand(offset, loc) / Operand(v.scale, loc), loc);
  // s1 * offset is second order in c's error; a constant row's s2 equals it exactly (n * k^2 <
  // 2^24), and the maximum keeps rounding from making a variance negative (NaN passes).
  Tensor m2 = maximum(Operand(Operand(s2, loc) - Operand(Operand(s1, loc) * Operand(offset, loc), loc), loc),
                      Operand(0.0, loc));
  Tensor dof = Operand(v.n, loc) - Operand(double(correction), loc);
  Tensor var = Operand(Operand(Operand(m2, loc) / Operand(dof, loc), loc) / Operand(v.scale, loc), loc) /
               Operand(v.scale, loc);
  if (keepdim) return {var, mu};
  return {var.squeeze(d, loc), mu.squeeze(d, loc)};
}
Tensor var(const Tensor& x, int d, bool keepdim, int64_t correction, Loc loc) {
  return var_mean(x, d, keepdim, correction, loc).first;
}

Tensor dot(const Tensor& a, const Tensor& b, Loc loc) {
  auto& tr = Tracer::current(loc);
  return wrap(tr, tr.dot(var_of(a, loc), var_of(b, loc), nullptr, loc), loc);
}
Tensor dot(const Tensor& a, const Tensor& b, const Tensor& acc, Loc loc) {
  auto& tr = Tracer::current(loc);
  return wrap(tr, tr.dot(var_of(a, loc), var_of(b, loc), &var_of(acc, loc), loc), loc);
}
Tensor addmm(const Tensor& acc, const Tensor& a, const Tensor& b, Loc loc) { return dot(a, b, acc, loc); }
Tensor matmul(const Tensor& a, const Tensor& b, Loc loc) { return dot(a, b, loc); }

Tensor zeros(std::vector<Size> shape, DType dtype, Loc loc) { return full(std::move(shape), 0, dtype, loc); }
Tensor full(std::vector<Size> shape, Number value, DType dtype, Loc loc) {
  auto& tr = Tracer::current(loc);
  if (tr.in_host_code()) {  // an output, filled before the grid runs
    std::vector<int64_t> sizes;
    for (const Size& s : shape) {
      if (!std::holds_alternative<int64_t>(s.get()))
        tr.fail("a tile used outside its loop, as an output's size", loc, "size outputs with integers (x.size(0))");
      sizes.push_back(std::get<int64_t>(s.get()));
    }
    return Tensor(tr.new_output(std::move(sizes), dtype, loc, value));
  }
  return wrap(tr, tr.full(shape, value, dtype, loc), loc);
}
Tensor arange(int64_t n, Loc loc) {
  auto& tr = Tracer::current(loc);
  return wrap(tr, tr.arange(n, loc), loc);
}

Tensor empty(std::vector<int64_t> shape, DType dtype, Loc loc) {
  auto& tr = Tracer::current(loc);
  return Tensor(tr.new_output(std::move(shape), dtype, loc));
}
Tensor empty_like(const Tensor& t, Loc loc) { return empty(t.sizes(loc), t.dtype(), loc); }
Tensor empty_like(const Tensor& t, DType dtype, Loc loc) { return empty(t.sizes(loc), dtype, loc); }

void atomic_add(const Tensor& target, std::initializer_list<Index> index, const Tensor& value, Loc loc) {
  auto& tr = Tracer::current(loc);
  if (tr.in_host_code())
    tr.fail("hl::atomic_add in host code", loc, "call it inside a tile loop, with a block index");
  std::shared_ptr<Var> block = tr.index(var_of(target, loc), std::vector<Index>(index), loc);
  tr.store_indexed(*block, var_of(value, loc), loc, true);
}

void expect(bool condition, const std::string& message, Loc loc) {
  auto& tr = Tracer::current(loc);
  if (!condition)
    throw ArgumentError(fmt::format("kernel '{}' cannot take these arguments: {}", tr.kernel().name, message),
                        format_location(loc), "pass arguments of the shapes and dtypes the kernel expects");
}

BlockSize register_block_size(int64_t min, int64_t max, std::string name, Loc loc) {
  auto& tr = Tracer::current(loc);
  BlockSize b;
  TileAccess::set(b, tr.register_block_size(min, max, name, loc));
  return b;
}

// ---- loops ------------------------------------------------------------------------------------

TileRange tile(int64_t end, TileOptions opts, Loc loc) {
  auto& tr = Tracer::current(loc);
  auto [tiles, loop] = tr.open_loop({end}, {}, {}, {opts.name}, opts, false, loc);
  return TileRange(tiles[0], loop);
}

TileRange tile(Bound begin, Bound end, TileOptions opts, Loc loc) {
  auto& tr = Tracer::current(loc);
  int64_t extent = 0;
  if (auto* e = std::get_if<int64_t>(&end.get())) extent = *e;
  auto [tiles, loop] = tr.open_loop({extent}, {begin}, {end}, {opts.name}, opts, false, loc);
  return TileRange(tiles[0], loop);
}

TilesRange tile(const std::vector<int64_t>& extents, Loc loc) {
  auto [tiles, loop] = detail::open_tile_loop(extents, {}, loc);
  return TilesRange(tiles, loop);
}

TileRange grid(int64_t end, Loc loc) {
  auto& tr = Tracer::current(loc);
  auto [tiles, loop] = tr.open_loop({end}, {}, {}, {}, {}, true, loc);
  return TileRange(tiles[0], loop);
}

namespace detail {
std::pair<Tiles, int> open_tile_loop(const std::vector<int64_t>& extents, const std::vector<std::string>& names,
                                     Loc loc) {
  return Tracer::current(loc).open_loop(extents, {}, {}, names, {}, false, loc);
}
void close_loop(int loop) { Tracer::current(Loc::current()).close_loop(loop); }
void abandon_loop(int loop) noexcept {
  if (Tracer* tr = Tracer::current_or_null()) tr->abandon_loop(loop);
}
}  // namespace detail

}  // namespace deuteron::hl
