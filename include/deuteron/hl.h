// The tile language: the types a kernel's lambda sees.
//
// A kernel is a C++ lambda taking `hl::Tensor` (and `hl::Scalar`) arguments. Deuteron calls it
// once per specialisation (shapes, dtypes) with symbolic arguments and records what it does:
// code outside the tile loops is host code (shape arithmetic, allocating outputs), the
// outermost `hl::tile` loop becomes the launch grid, and its body runs on one block.
//
//   for (auto tile : hl::tile(out.sizes()))   // body traced once, on a symbolic tile
//     out[tile] = x[tile] + y[tile];
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "deuteron/dtype.h"

namespace deuteron::hl {

using Loc = std::source_location;

namespace detail {
struct Var;  // a traced variable: identity plus its current value
}  // namespace detail

class Tensor;

// One tiled dimension of the block the current loop iteration works on.
class Tile {
 public:
  Tile() = default;
  // Global indices of this block's elements: a 1-D block of int64.
  Tensor index(Loc loc = Loc::current()) const;
  Tensor begin(Loc loc = Loc::current()) const;
  Tensor end(Loc loc = Loc::current()) const;  // one past the last valid index
  Tensor block_size(Loc loc = Loc::current()) const;
  int axis() const { return axis_; }

 private:
  friend struct TileAccess;
  int axis_ = -1;
  int loop_ = -1;
  int generation_ = -1;  // which trace this tile belongs to
};

// Several tiles from one `hl::tile(sizes)` loop; usable as an index (`out[tiles]`).
using Tiles = std::vector<Tile>;

// `hl::all` (PyTorch's `:`): a whole dimension.
struct All {};
inline constexpr All all{};

// `hl::slice(start, stop)`: a constant range of a dimension.
struct Slice {
  int64_t start = 0, stop = 0;
};
inline Slice slice(int64_t start, int64_t stop) { return {start, stop}; }

// One entry of an index: a tile, hl::all, a slice, an integer, or a device tensor
// (a scalar, or a block of integer indices to gather).
class Index {
 public:
  // Each constructor records the user's source location (the conversion happens at the
  // indexing expression), so errors about the index point at the kernel's line.
  Index(const Tile& t, Loc loc = Loc::current()) : v_(t), loc_(loc) {}
  Index(All a, Loc loc = Loc::current()) : v_(a), loc_(loc) {}
  Index(Slice s, Loc loc = Loc::current()) : v_(s), loc_(loc) {}
  Index(int64_t i, Loc loc = Loc::current()) : v_(i), loc_(loc) {}
  Index(int i, Loc loc = Loc::current()) : v_(int64_t(i)), loc_(loc) {}
  Index(const Tensor& t, Loc loc = Loc::current());
  const auto& get() const { return v_; }
  const Loc& loc() const { return loc_; }

 private:
  std::variant<Tile, All, Slice, int64_t, std::shared_ptr<detail::Var>> v_;
  Loc loc_;
};

// An index made of the tiles of one multi-dimensional loop, with the user's location.
struct TilesIndex {
  TilesIndex(const Tiles& t, Loc loc = Loc::current()) : tiles(t), loc(loc) {}
  template <size_t N>
  TilesIndex(const std::array<Tile, N>& t, Loc loc = Loc::current())
      : tiles(t.begin(), t.end()), loc(loc) {}
  Tiles tiles;
  Loc loc;
};

// A size in a device shape: an integer or a tile's block size.
class Size {
 public:
  Size(int64_t n) : v_(n) {}
  Size(int n) : v_(int64_t(n)) {}
  Size(const Tile& t) : v_(t) {}
  const auto& get() const { return v_; }

 private:
  std::variant<int64_t, Tile> v_;
};

// A symbolic tensor: a kernel argument or output (host side), or a block value (device side).
//
// Copying makes a new variable; assigning (`acc = acc + x`) updates this variable, which is
// how values carried around a tile loop are found. `x[index]` reads a block; assigning to it
// (`out[tile] = value`) stores one.
class Tensor {
 public:
  Tensor();
  Tensor(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(const Tensor& other) &;
  Tensor& operator=(Tensor&& other) &;
  // Store through an indexed block: `out[tile] = value`.
  void operator=(const Tensor& value) &&;
  void operator+=(const Tensor& value) &&;
  Tensor& operator+=(const Tensor& value) &;
  Tensor& operator-=(const Tensor& value) &;
  Tensor& operator*=(const Tensor& value) &;
  ~Tensor();

  // Host side: the concrete shape of the argument or output.
  std::vector<int64_t> sizes(Loc loc = Loc::current()) const;
  int64_t size(int dim, Loc loc = Loc::current()) const;
  int dim(Loc loc = Loc::current()) const;
  DType dtype() const;
  // Host side: the value of an integer scalar argument, to size outputs and loops
  // (`hl::empty({n, d})`, `hl::grid(n)`). The kernel is then specialised on the value, as on a
  // shape: each new value traces and compiles again.
  int64_t item(Loc loc = Loc::current()) const;

  // Reading a block.
  Tensor operator[](const Index& index) const;
  Tensor operator[](std::initializer_list<Index> index) const;
  Tensor operator[](const TilesIndex& tiles) const;

  // Reductions over a block dim.
  Tensor sum(int dim, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor mean(int dim, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor amax(int dim, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor amin(int dim, bool keepdim = false, Loc loc = Loc::current()) const;
  // Scans along a block dim (hl::cumsum, hl::cumprod).
  Tensor cumsum(int dim, Loc loc = Loc::current()) const;
  Tensor cumprod(int dim, Loc loc = Loc::current()) const;

  // Views.
  Tensor reshape(std::vector<Size> shape, Loc loc = Loc::current()) const;
  Tensor view(std::vector<Size> shape, Loc loc = Loc::current()) const;
  Tensor unsqueeze(int dim, Loc loc = Loc::current()) const;
  Tensor squeeze(int dim, Loc loc = Loc::current()) const;
  Tensor transpose(int dim0, int dim1, Loc loc = Loc::current()) const;
  Tensor permute(std::vector<int> dims, Loc loc = Loc::current()) const;
  Tensor expand(std::vector<Size> shape, Loc loc = Loc::current()) const;
  Tensor to(DType dtype, Loc loc = Loc::current()) const;
  // The block's rank (device values).
  int rank(Loc loc = Loc::current()) const;

  // Internal: the traced variable behind this tensor.
  explicit Tensor(std::shared_ptr<detail::Var> var);
  const std::shared_ptr<detail::Var>& var() const { return var_; }

 private:
  std::shared_ptr<detail::Var> var_;
};

// A scalar kernel argument (float or integer), usable in device expressions.
using Scalar = Tensor;

// A number written in a kernel. Integers stay exact: an int64 such as 6364136223846793005
// is not rounded to the nearest double.
struct Number {
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  Number(T x) : real(double(x)), integer(std::is_integral_v<T> ? int64_t(x) : 0), is_integer(std::is_integral_v<T>) {}
  double real;
  int64_t integer;
  bool is_integer;
};

// An operand of a pointwise op: a tensor or a number. Taking it by this type lets operators
// record the user's source location.
struct Operand {
  template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
  Operand(T x, Loc loc = Loc::current()) : number(x), is_number(true), loc(loc) {}
  Operand(const Tensor& t, Loc loc = Loc::current()) : tensor(t), loc(loc) {}
  Tensor tensor;
  Number number = 0;
  bool is_number = false;
  Loc loc;
};

Tensor operator+(const Operand& a, const Operand& b);
Tensor operator-(const Operand& a, const Operand& b);
Tensor operator*(const Operand& a, const Operand& b);
Tensor operator/(const Operand& a, const Operand& b);
Tensor operator-(const Tensor& a);
Tensor operator==(const Operand& a, const Operand& b);
Tensor operator!=(const Operand& a, const Operand& b);
Tensor operator<(const Operand& a, const Operand& b);
Tensor operator<=(const Operand& a, const Operand& b);
Tensor operator>(const Operand& a, const Operand& b);
Tensor operator>=(const Operand& a, const Operand& b);
Tensor operator&&(const Operand& a, const Operand& b);
Tensor operator||(const Operand& a, const Operand& b);
Tensor operator!(const Tensor& a);

Tensor maximum(const Operand& a, const Operand& b);
Tensor minimum(const Operand& a, const Operand& b);
Tensor where(const Operand& cond, const Operand& a, const Operand& b);
// torch.pow: a ** b for tensors or numbers (integers are raised in f32), with C's pow special
// cases (pow(x, 0) = 1 and pow(1, y) = 1 even for NaN; a negative base and a non-integer
// exponent give NaN).
Tensor pow(const Operand& a, const Operand& b);
// torch.clamp: minimum(maximum(x, lo), hi), so NaN propagates and lo > hi gives hi.
Tensor clamp(const Operand& x, const Operand& lo, const Operand& hi);
Tensor clamp_min(const Operand& x, const Operand& lo);
Tensor clamp_max(const Operand& x, const Operand& hi);

// Integer operations (int32, int64; &, | and ^ also on booleans). Integer arithmetic wraps,
// as in PyTorch. A shift count outside [0, bits of the dtype) gives 0 for << and the sign
// (0 or -1) for >>, as torch does; >> is arithmetic. `%` and hl::floor_divide follow Python
// and torch (the remainder has the divisor's sign; the quotient rounds down); division by zero
// is defined: x // 0 = 0 and x % 0 = x (torch raises, and C++ would be undefined), so
// x == (x // y) * y + x % y always holds, and the most negative value // -1 wraps to itself.
Tensor operator&(const Operand& a, const Operand& b);
Tensor operator|(const Operand& a, const Operand& b);
Tensor operator^(const Operand& a, const Operand& b);
Tensor operator<<(const Operand& a, const Operand& b);
Tensor operator>>(const Operand& a, const Operand& b);
Tensor operator%(const Operand& a, const Operand& b);
Tensor floor_divide(const Operand& a, const Operand& b);
Tensor remainder(const Operand& a, const Operand& b);
// The bits of `x` as another dtype of the same width (torch's Tensor.view(dtype)): float32 and
// int32 either way; other pairs (different widths, booleans) are errors. A block read from
// bf16/f16 storage is an f32 value (they compute in f32), so its bitcast gives the f32 bits.
Tensor bitcast(const Tensor& x, DType dtype, Loc loc = Loc::current());

// Random numbers from a counter-based generator, Philox4x32-10 (as Triton's tl.rand): the
// same (seed, offset) give the same number on every target and every run, and each offset an
// independent one. Both are integers (a scalar argument, a literal, a tile's index); the
// Philox key is the seed's 64 bits (lo, hi), the counter (offset lo, offset hi, 0, 0). On the
// pallas target both must fit int32 (TPUs compute integers in 32 bits).
//   rand:    uniform in [0, 1): the first output word's top 24 bits times 2^-24 (f32, exact);
//   randn:   standard normal by Box-Muller on the first two words (f32);
//   randint: the first output word as int32 bits (all 2^32 patterns equally likely).
Tensor rand(const Operand& seed, const Operand& offset);
Tensor randn(const Operand& seed, const Operand& offset);
Tensor randint(const Operand& seed, const Operand& offset);

Tensor exp(const Tensor& x, Loc loc = Loc::current());
Tensor exp2(const Tensor& x, Loc loc = Loc::current());
Tensor log(const Tensor& x, Loc loc = Loc::current());
Tensor sqrt(const Tensor& x, Loc loc = Loc::current());
Tensor rsqrt(const Tensor& x, Loc loc = Loc::current());
Tensor tanh(const Tensor& x, Loc loc = Loc::current());
Tensor sigmoid(const Tensor& x, Loc loc = Loc::current());
Tensor silu(const Tensor& x, Loc loc = Loc::current());
Tensor erf(const Tensor& x, Loc loc = Loc::current());
// approximate: "none" (erf form, PyTorch's default) or "tanh".
Tensor gelu(const Tensor& x, const char* approximate = "none", Loc loc = Loc::current());
Tensor abs(const Tensor& x, Loc loc = Loc::current());
Tensor sin(const Tensor& x, Loc loc = Loc::current());
Tensor cos(const Tensor& x, Loc loc = Loc::current());
Tensor log1p(const Tensor& x, Loc loc = Loc::current());  // log(1 + x), accurate near 0
Tensor expm1(const Tensor& x, Loc loc = Loc::current());  // exp(x) - 1, accurate near 0
Tensor floor(const Tensor& x, Loc loc = Loc::current());
Tensor ceil(const Tensor& x, Loc loc = Loc::current());
// torch.round: to the nearest integer, halves to even (2.5 -> 2, -0.5 -> -0).
Tensor round(const Tensor& x, Loc loc = Loc::current());

Tensor sum(const Tensor& x, int dim, bool keepdim = false, Loc loc = Loc::current());
// The number of elements a reduction along `dim` of block x sees, as an f32 scalar: a whole
// dim's size, or the valid elements of a tile's block (the last may be partial). For a mean of
// squares, `(x * x).sum(1) / hl::count(x, 1)`. Unlike a number computed in host code from
// x.size(1), a general variant of an ahead-of-time build reads it at run time.
Tensor count(const Tensor& x, int dim, Loc loc = Loc::current());
// The mean along `dim`, computed soundly for what usually follows it (x - mean): the corrected
// two-pass algorithm, c = a first estimate sum(x / n), then mean = c + sum(x - c) / n. It errs
// in proportion to the values' spread rather than their size, does not overflow for values
// near the f32 limit, and is exact for a constant row (while n times the first sum's error in
// ulps stays below 2^24: tested up to 4096 elements). It costs one more pass than
// sum(x) / n, which is as accurate where nothing cancels afterwards (a mean of squares).
Tensor mean(const Tensor& x, int dim, bool keepdim = false, Loc loc = Loc::current());
// torch.var / torch.var_mean: the variance along `dim` around hl::mean's centre c, from the
// sums of x - c and (x - c)^2 taken in one pass: (s2 - s1^2 / n) / (n - correction) (1:
// unbiased, 0: biased, as layer norm uses), never E[x^2] - E[x]^2. Two passes in all, as for
// hl::mean alone. A constant row has variance exactly 0 (while n times the square of the first
// sum's error in ulps stays below 2^24).
Tensor var(const Tensor& x, int dim, bool keepdim = false, int64_t correction = 1, Loc loc = Loc::current());
std::pair<Tensor, Tensor> var_mean(const Tensor& x, int dim, bool keepdim = false, int64_t correction = 1,
                                   Loc loc = Loc::current());
Tensor amax(const Tensor& x, int dim, bool keepdim = false, Loc loc = Loc::current());
Tensor amin(const Tensor& x, int dim, bool keepdim = false, Loc loc = Loc::current());

// Inclusive scans along block dim `dim`, as torch.cumsum: element i of the result combines
// elements 0..i of `x` (with `reverse`, elements i..n-1, as torch.flip(cumsum(torch.flip(x)))).
// The scanned dim must be whole in the block: a dim read with hl::all or a slice (persistent:
// the config space keeps it in one block), hl::arange, or a size-one dim. A tile loop's dim
// holds one block of the dim, so scanning along it is an error. NaN propagates.
// hl::cumsum and hl::cumprod keep a float dtype and make integers and booleans int64, as torch.
Tensor cumsum(const Tensor& x, int dim, bool reverse = false, Loc loc = Loc::current());
Tensor cumprod(const Tensor& x, int dim, bool reverse = false, Loc loc = Loc::current());
// Helion's hl.associative_scan: an inclusive scan with a user function. `combine(a, b)` is
// traced once on two elements (a: the value accumulated so far, b: the next element; with
// `reverse` the accumulation runs from the last element, as on the flipped dim) and may use
// elementwise operations on them and numbers, nothing from outside it (no blocks, tensors,
// loops). It returns the scanned dtype. It must be associative, combine(combine(a, b), c) ==
// combine(a, combine(b, c)), for the targets that scan in a tree (pallas, triton) to agree
// with the sequential scan (cpu); Deuteron cannot check that. Floating-point sums are
// associative only up to rounding, so those targets may differ in the last bits.
//   auto running_max = hl::associative_scan([](hl::Tensor a, hl::Tensor b) { return hl::maximum(a, b); }, x, 1);
using CombineFn = std::function<Tensor(Tensor, Tensor)>;
Tensor associative_scan(const CombineFn& combine, const Tensor& x, int dim, bool reverse = false,
                        Loc loc = Loc::current());

// Matrix products of blocks, accumulated and returned in f32 (torch.matmul semantics).
//
// `a` is [..., M, K] and `b` is [..., K, N]; leading (batch) dims broadcast as in
// torch.matmul ([B, M, K] x [K, N] shares `b` across the batch). Operands may be views
// (`k.transpose(0, 1)`) and f32, bf16 or f16 blocks; products are summed in f32. With `acc`
// (addmm / baddbmm form) the result is acc + a @ b, `acc` broadcasting to the result shape:
//   acc = hl::dot(x[{tm, tk}], y[{tk, tn}], acc);     // inside a loop over tk
// `acc + hl::dot(a, b)` is recognised and computed the same way. The CPU target runs a
// register-blocked micro-kernel over operands packed into fast memory (see the inner_*
// tunables in the config space).
Tensor dot(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor dot(const Tensor& a, const Tensor& b, const Tensor& acc, Loc loc = Loc::current());
// torch.addmm / torch.baddbmm argument order: acc + a @ b.
Tensor addmm(const Tensor& acc, const Tensor& a, const Tensor& b, Loc loc = Loc::current());
// torch.matmul: the same as hl::dot(a, b).
Tensor matmul(const Tensor& a, const Tensor& b, Loc loc = Loc::current());

// Creation. Inside tile loops: a block filled with the value. In host code: an output of the
// kernel, set to the value before the grid runs (what hl::atomic_add needs).
Tensor zeros(std::vector<Size> shape, DType dtype = DType::f32, Loc loc = Loc::current());
Tensor full(std::vector<Size> shape, Number value, DType dtype = DType::f32,
            Loc loc = Loc::current());
// The integers [0, n) as a 1-D block of int64.
Tensor arange(int64_t n, Loc loc = Loc::current());

// Host-side creation of outputs.
Tensor empty(std::vector<int64_t> shape, DType dtype = DType::f32, Loc loc = Loc::current());
Tensor empty_like(const Tensor& t, Loc loc = Loc::current());
Tensor empty_like(const Tensor& t, DType dtype, Loc loc = Loc::current());

// target[index] += value, atomically (Helion's hl.atomic_add, Triton's tl.atomic_add): grid
// steps may add into the same elements, as a sum over every row into one scalar does. `target`
// is an f32, int32 or int64 output created with hl::zeros (or hl::full) in host code; `index`
// may gather (`{idx[t]}`: a scatter-add, its indices checked as a gather's are). On the CPU,
// float adds are by default summed in a fixed order (each thread into its own copy, then the
// copies in thread order: the same bits on every run of a config), or atomically, whose last
// bits vary from run to run: see KernelOptions::atomic_add. Integer adds wrap and are exact in
// any order. On a TPU (pallas) the adding grid steps run in order on one block in VMEM.
void atomic_add(const Tensor& target, std::initializer_list<Index> index, const Tensor& value,
                Loc loc = Loc::current());

// Checks the kernel's arguments in host code (`hl::expect(labels.dtype() == DType::i64, ...)`):
// when false, the call fails with an ArgumentError naming the kernel, this line and `message`.
void expect(bool condition, const std::string& message, Loc loc = Loc::current());

// A block size shared by several tile loops (tuned once for all of them).
class BlockSize {
 public:
  BlockSize() = default;
  int param() const { return param_; }

 private:
  friend struct TileAccess;
  int param_ = -1;
};
// `name` (optional) is the config key, e.g. "block_k"; it must be an identifier.
BlockSize register_block_size(int64_t min, int64_t max, std::string name = "", Loc loc = Loc::current());

// Options of a tile loop. A zero block size means "tuned". `name` (optional, an identifier)
// names the loop's dim in configs and generated code: {.name = "m"} gives "block_m" and "o_m".
// (Every member has an initializer, so `{.block_size = 16}` is quiet under -Wextra.)
struct TileOptions {
  int64_t block_size = 0;
  BlockSize shared{};
  std::string name = {};
};

// A loop bound: a constant, or a device scalar (for example another tile's end).
class Bound {
 public:
  Bound(int64_t n) : v_(n) {}
  Bound(int n) : v_(int64_t(n)) {}
  Bound(const Tensor& t);
  const auto& get() const { return v_; }

 private:
  std::variant<int64_t, std::shared_ptr<detail::Var>> v_;
};

namespace detail {
// The range a traced tile loop iterates over: exactly one symbolic iteration. Entering it
// opens the loop in the trace; leaving it (the iterator reaching the end) closes it.
template <typename Item>
class LoopRange {
 public:
  struct Sentinel {};
  class Iterator {
   public:
    explicit Iterator(LoopRange* r) : r_(r) {}
    Item operator*() const { return r_->item_; }
    Iterator& operator++() {
      r_->close();
      return *this;
    }
    bool operator!=(Sentinel) const { return !r_->closed_; }

   private:
    LoopRange* r_;
  };
  LoopRange(Item item, int loop) : item_(std::move(item)), loop_(loop) {}
  LoopRange(const LoopRange&) = delete;
  ~LoopRange();
  Iterator begin() { return Iterator(this); }
  Sentinel end() { return {}; }

 private:
  void close();
  Item item_;
  int loop_;
  bool closed_ = false;
};
}  // namespace detail

using TileRange = detail::LoopRange<Tile>;
using TilesRange = detail::LoopRange<Tiles>;
template <size_t N>
using TileArrayRange = detail::LoopRange<std::array<Tile, N>>;

// Tile loops. `hl::tile(n)` tiles [0, n); `hl::tile(begin, end)` tiles [begin, end).
TileRange tile(int64_t end, TileOptions opts = {}, Loc loc = Loc::current());
TileRange tile(Bound begin, Bound end, TileOptions opts = {}, Loc loc = Loc::current());
// Several dimensions at once, as structured bindings: `for (auto [tm, tn] : hl::tile({m, n}))`.
template <size_t N>
TileArrayRange<N> tile(const int64_t (&extents)[N], Loc loc = Loc::current());
// The same with a name per dim: `hl::tile({m, n}, {"m", "n"})`.
template <size_t N>
TileArrayRange<N> tile(const int64_t (&extents)[N], const char* const (&names)[N], Loc loc = Loc::current());
// Any number of dimensions: `for (auto tiles : hl::tile(out.sizes()))`.
TilesRange tile(const std::vector<int64_t>& extents, Loc loc = Loc::current());
// Scalar indices: a tile of block size one whose dimension is dropped when indexing.
TileRange grid(int64_t end, Loc loc = Loc::current());

}  // namespace deuteron::hl

// ---- template definitions ---------------------------------------------------------------------
namespace deuteron::hl::detail {
// Opens a tile loop over `extents` in the current trace (dims named `names`, or "t0", "t1",
// ... where a name is empty); returns its tiles and loop id.
std::pair<Tiles, int> open_tile_loop(const std::vector<int64_t>& extents, const std::vector<std::string>& names,
                                     Loc loc);
// Closes the innermost open loop (which must be `loop`).
void close_loop(int loop);
// Whether an exception is unwinding through the trace (then loops close silently).
void abandon_loop(int loop) noexcept;

template <typename Item>
void LoopRange<Item>::close() {
  if (!closed_) {
    closed_ = true;
    close_loop(loop_);
  }
}
template <typename Item>
LoopRange<Item>::~LoopRange() {
  if (!closed_) abandon_loop(loop_);
}
}  // namespace deuteron::hl::detail

namespace deuteron::hl {
template <size_t N>
TileArrayRange<N> tile(const int64_t (&extents)[N], const char* const (&names)[N], Loc loc) {
  auto [tiles, loop] = detail::open_tile_loop(std::vector<int64_t>(extents, extents + N),
                                              std::vector<std::string>(names, names + N), loc);
  std::array<Tile, N> items;
  for (size_t i = 0; i < N; ++i) items[i] = tiles[i];
  return TileArrayRange<N>(items, loop);
}
template <size_t N>
TileArrayRange<N> tile(const int64_t (&extents)[N], Loc loc) {
  const char* names[N] = {};
  for (size_t i = 0; i < N; ++i) names[i] = "";
  return tile(extents, names, loc);
}
}  // namespace deuteron::hl
