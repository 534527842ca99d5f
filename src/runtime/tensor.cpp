#include "deuteron/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <sys/mman.h>

#include "deuteron/error.h"

namespace deuteron {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

// ---- Element access, one trait per dtype, so hot loops are instantiated per type pair
// instead of switching on the dtype for every element.

template <DType D>
struct Elem;

template <>
struct Elem<DType::f32> {
  using Storage = float;
  static double load(Storage v) { return v; }
  static Storage store(double v) { return float(v); }
};

template <>
struct Elem<DType::bf16> {
  using Storage = uint16_t;
  static double load(Storage v) { return bf16_to_f32(v); }
  // Rounds through float first; the double rounding this implies is at most one bf16 ulp
  // off in rare halfway cases, well inside any tolerance we use for bf16.
  static Storage store(double v) { return f32_to_bf16(float(v)); }
};

template <>
struct Elem<DType::f16> {
  using Storage = uint16_t;
  static double load(Storage v) { return f16_to_f32(v); }
  static Storage store(double v) { return f32_to_f16(float(v)); }
};

// Float -> integer casts truncate toward zero like PyTorch's; NaN and out-of-range values
// would be undefined behaviour in C++, so they become 0 and saturate instead.
template <typename I>
I saturating_cast(double v) {
  if (std::isnan(v)) return 0;
  constexpr double kMax = double(std::numeric_limits<I>::max());  // rounds up to 2^(bits-1)
  if (v >= kMax) return std::numeric_limits<I>::max();
  if (v <= double(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  return I(v);
}

template <>
struct Elem<DType::i32> {
  using Storage = int32_t;
  static double load(Storage v) { return v; }
  static Storage store(double v) { return saturating_cast<int32_t>(v); }
};

template <>
struct Elem<DType::i64> {
  using Storage = int64_t;
  static double load(Storage v) { return double(v); }
  static Storage store(double v) { return saturating_cast<int64_t>(v); }
};

template <>
struct Elem<DType::boolean> {
  using Storage = uint8_t;
  static double load(Storage v) { return v != 0 ? 1.0 : 0.0; }
  static Storage store(double v) { return v != 0.0 ? 1 : 0; }  // NaN is truthy, as in PyTorch
};

template <DType D>
struct Tag {
  static constexpr DType value = D;
};

// Calls f(Tag<D>{}) for the runtime dtype t.
template <typename F>
decltype(auto) dispatch(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(Tag<DType::f32>{});
    case DType::bf16: return f(Tag<DType::bf16>{});
    case DType::f16: return f(Tag<DType::f16>{});
    case DType::i32: return f(Tag<DType::i32>{});
    case DType::i64: return f(Tag<DType::i64>{});
    case DType::boolean: return f(Tag<DType::boolean>{});
  }
  throw RuntimeError("invalid DType value " + std::to_string(int(t)));
}

double load_any(DType t, const void* p) {
  return dispatch(t, [&](auto tag) {
    using E = Elem<decltype(tag)::value>;
    return E::load(*static_cast<const typename E::Storage*>(p));
  });
}

void store_any(DType t, void* p, double v) {
  dispatch(t, [&](auto tag) {
    using E = Elem<decltype(tag)::value>;
    *static_cast<typename E::Storage*>(p) = E::store(v);
  });
}

// Calls f(i, a_off, b_off) for every element in row-major logical order, where the offsets
// (in elements) follow two stride sets over the same shape, so two tensors with different
// layouts can be walked together. The innermost dimension runs as a plain loop.
template <typename F>
void for_each_offset2(const std::vector<int64_t>& shape, const std::vector<int64_t>& a_strides,
                      const std::vector<int64_t>& b_strides, F&& f) {
  const int nd = int(shape.size());
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  if (n == 0) return;
  if (nd == 0) {
    f(int64_t(0), int64_t(0), int64_t(0));
    return;
  }
  const int64_t inner = shape[nd - 1], a_inner = a_strides[nd - 1], b_inner = b_strides[nd - 1];
  std::vector<int64_t> idx(nd, 0);
  int64_t a_base = 0, b_base = 0;
  for (int64_t i = 0; i < n; i += inner) {
    for (int64_t j = 0; j < inner; ++j) f(i + j, a_base + j * a_inner, b_base + j * b_inner);
    // Odometer step over the outer dimensions.
    for (int d = nd - 2; d >= 0; --d) {
      a_base += a_strides[d];
      b_base += b_strides[d];
      if (++idx[d] < shape[d]) break;
      a_base -= a_strides[d] * shape[d];
      b_base -= b_strides[d] * shape[d];
      idx[d] = 0;
    }
  }
}

template <typename F>
void for_each_offset(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                     F&& f) {
  for_each_offset2(shape, strides, strides, [&](int64_t i, int64_t off, int64_t) { f(i, off); });
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= shape[d];
  }
  return strides;
}

// Rejects negative sizes and element counts whose byte size would overflow.
int64_t checked_numel(const std::vector<int64_t>& shape, DType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0)
      throw ArgumentError("negative size in shape " + shape_string(shape), "",
                          "every dimension must be >= 0");
    if (__builtin_mul_overflow(n, s, &n))
      throw ArgumentError("shape " + shape_string(shape) + " has too many elements");
  }
  int64_t bytes;
  if (__builtin_mul_overflow(n, int64_t(dtype_size(dtype)), &bytes))
    throw ArgumentError("shape " + shape_string(shape) + " is too large for " +
                        std::string(dtype_name(dtype)));
  return n;
}

// Zero-element tensors still need a non-null pointer so that defined() is true.
alignas(64) unsigned char g_empty_storage[64];

// splitmix64's output function: a strong 64-bit mix, so hash(seed_base + i) is a
// counter-based generator (each element independent, trivially parallel and reproducible).
inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// Next representable 16-bit float below / above h. bf16 and f16 both encode magnitude
// monotonically below the sign bit, so one pair of helpers serves both.
uint16_t next_down16(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x8001u;
  return (h & 0x8000u) ? uint16_t(h + 1) : uint16_t(h - 1);
}
uint16_t next_up16(uint16_t h) {
  if ((h & 0x7fffu) == 0) return 0x0001u;
  return (h & 0x8000u) ? uint16_t(h - 1) : uint16_t(h + 1);
}
float next_down(float f) { return std::nextafter(f, -std::numeric_limits<float>::infinity()); }
float next_up(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }

template <DType D>
void fill_uniform_float(typename Elem<D>::Storage* out, int64_t n, uint64_t seed, double lo,
                        double hi) {
  using E = Elem<D>;
  using S = typename E::Storage;
  auto step_down = [](S s) {
    if constexpr (D == DType::f32) return next_down(s);
    else return next_down16(s);
  };
  auto step_up = [](S s) {
    if constexpr (D == DType::f32) return next_up(s);
    else return next_up16(s);
  };
  // Rounding to the storage type can land on hi or below lo; clamp to the representable
  // values inside [lo, hi), found once here.
  S top = E::store(hi), bottom = E::store(lo);
  while (E::load(top) >= hi) top = step_down(top);
  while (E::load(bottom) < lo) bottom = step_up(bottom);
  if (E::load(bottom) > E::load(top))
    throw ArgumentError("no " + std::string(dtype_name(D)) + " value lies in [" +
                        std::to_string(lo) + ", " + std::to_string(hi) + ")",
                        "", "widen the range passed to Tensor::rand");
  // Float arithmetic is plenty for the values (24 random bits per element) and keeps the loop
  // cheap. Clamping before the final rounding suffices: rounding is monotonic and both
  // bounds are representable, so the stored value stays in [bottom, top].
  const float top_f = float(E::load(top)), bottom_f = float(E::load(bottom));
  const float lo_f = float(lo), span_f = float(hi - lo);
  if (!std::isfinite(span_f) || !std::isfinite(lo_f))
    throw ArgumentError("rand: range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        ") is too wide for float arithmetic");
  const uint64_t base = splitmix64(seed);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 20))
#endif
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bits = splitmix64(base + uint64_t(i + 1) * kGolden);
    const float u = float(bits >> 40) * 0x1p-24f;  // uniform in [0, 1)
    const float v = std::min(std::max(lo_f + span_f * u, bottom_f), top_f);
    if constexpr (D == DType::f32) out[i] = v;
    else if constexpr (D == DType::bf16) out[i] = f32_to_bf16(v);
    else out[i] = f32_to_f16(v);
  }
}

template <DType D>
void fill_uniform_int(typename Elem<D>::Storage* out, int64_t n, uint64_t seed, double lo,
                      double hi) {
  using S = typename Elem<D>::Storage;
  // Integers in [lo, hi): ceil(lo) .. ceil(hi) - 1.
  const double first = std::ceil(lo), end = std::ceil(hi);
  if (first < double(std::numeric_limits<S>::min()) ||
      end - 1 > double(std::numeric_limits<S>::max()) || end >= 0x1p63)
    throw ArgumentError("range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        ") does not fit " + std::string(dtype_name(D)));
  const int64_t first_i = int64_t(first);
  const uint64_t range = uint64_t(int64_t(end)) - uint64_t(first_i);
  if (range == 0)
    throw ArgumentError("no integer lies in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        ")", "", "widen the range passed to Tensor::rand");
  const uint64_t base = splitmix64(seed);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 20))
#endif
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bits = splitmix64(base + uint64_t(i + 1) * kGolden);
    // Multiply-shift maps 64 random bits onto [0, range) without a division.
    const uint64_t r = uint64_t((unsigned __int128)bits * range >> 64);
    out[i] = S(int64_t(uint64_t(first_i) + r));
  }
}

}  // namespace

// ---- Construction

Tensor Tensor::empty(std::vector<int64_t> shape, DType dtype) {
  const int64_t n = checked_numel(shape, dtype);
  // aligned_alloc wants a size that is a multiple of the alignment; never ask for 0 bytes.
  const size_t bytes = size_t(n) * size_t(dtype_size(dtype));
  // Tensors of 2 MiB or more sit on huge pages where the kernel allows (THP "madvise"): a
  // kernel streaming through them misses the TLB every 4 KiB otherwise.
  const size_t align = bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (p && align == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);
  if (!p)
    throw RuntimeError("out of host memory allocating " + std::to_string(rounded) +
                       " bytes for " + std::string(dtype_name(dtype)) + shape_string(shape));
  Tensor t;
  t.owner_ = std::shared_ptr<void>(p, std::free);
  t.data_ = p;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  std::memset(t.data_, 0, size_t(t.nbytes()));
  return t;
}

Tensor Tensor::empty_like(const Tensor& t) { return empty(t.shape_, t.dtype_); }

Tensor Tensor::borrow(void* data, std::vector<int64_t> shape, DType dtype,
                      std::vector<int64_t> strides) {
  const int64_t n = checked_numel(shape, dtype);
  if (strides.empty() && !shape.empty()) strides = contiguous_strides(shape);
  if (strides.size() != shape.size())
    throw ArgumentError("borrow: " + std::to_string(strides.size()) + " strides for shape " +
                        shape_string(shape), "", "give one stride per dimension, or none");
  if (!data && n > 0)
    throw ArgumentError("borrow: null data for " + std::string(dtype_name(dtype)) +
                        shape_string(shape));
  Tensor t;
  t.data_ = data ? data : g_empty_storage;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  return t;
}

Tensor Tensor::rand(std::vector<int64_t> shape, DType dtype, uint64_t seed, double lo,
                    double hi) {
  if (dtype != DType::boolean && !(std::isfinite(lo) && std::isfinite(hi) && lo < hi))
    throw ArgumentError("rand: invalid range [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + ")", "", "need finite lo < hi");
  Tensor t = empty(std::move(shape), dtype);
  const int64_t n = t.numel();
  dispatch(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* out = t.data_as<typename Elem<D>::Storage>();
    if constexpr (D == DType::boolean) {
      // Bools ignore the range: a fair coin per element.
      const uint64_t base = splitmix64(seed);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 20))
#endif
      for (int64_t i = 0; i < n; ++i)
        out[i] = uint8_t(splitmix64(base + uint64_t(i + 1) * kGolden) >> 63);
    } else if constexpr (D == DType::i32 || D == DType::i64) {
      fill_uniform_int<D>(out, n, seed, lo, hi);
    } else {
      fill_uniform_float<D>(out, n, seed, lo, hi);
    }
  });
  return t;
}

// ---- Shape queries

int64_t Tensor::size(int d) const {
  const int nd = dim();
  if (d < -nd || d >= nd)
    throw ArgumentError("dimension " + std::to_string(d) + " out of range for " + describe(),
                        "", "valid dimensions are -" + std::to_string(nd) + " .. " +
                                std::to_string(nd - 1));
  return shape_[d < 0 ? d + nd : d];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

bool Tensor::is_contiguous() const {
  // Size-1 dimensions may carry any stride, as in PyTorch.
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int d = dim() - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

// ---- Element access and copies

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return to(dtype_);
}

double Tensor::get(int64_t flat_index) const {
  if (!defined()) throw ArgumentError("get() on an undefined tensor");
  const int64_t n = numel();
  if (flat_index < 0 || flat_index >= n)
    throw ArgumentError("index " + std::to_string(flat_index) + " out of range for " +
                        describe());
  int64_t offset = 0;
  for (int d = dim() - 1; d >= 0; --d) {
    offset += (flat_index % shape_[d]) * strides_[d];
    flat_index /= shape_[d];
  }
  return load_any(dtype_, static_cast<const char*>(data_) + offset * dtype_size(dtype_));
}

void Tensor::set(int64_t flat_index, double value) {
  if (!defined()) throw ArgumentError("set() on an undefined tensor");
  const int64_t n = numel();
  if (flat_index < 0 || flat_index >= n)
    throw ArgumentError("index " + std::to_string(flat_index) + " out of range for " +
                        describe());
  int64_t offset = 0;
  for (int d = dim() - 1; d >= 0; --d) {
    offset += (flat_index % shape_[d]) * strides_[d];
    flat_index /= shape_[d];
  }
  store_any(dtype_, static_cast<char*>(data_) + offset * dtype_size(dtype_), value);
}

Tensor Tensor::to(DType dtype) const {
  if (!defined()) throw ArgumentError("to() on an undefined tensor");
  Tensor out = empty(shape_, dtype);
  if (dtype == dtype_ && is_contiguous()) {
    std::memcpy(out.data_, data_, size_t(nbytes()));
    return out;
  }
  dispatch(dtype_, [&](auto src_tag) {
    dispatch(dtype, [&](auto dst_tag) {
      constexpr DType S = decltype(src_tag)::value, D = decltype(dst_tag)::value;
      const auto* src = data_as<const typename Elem<S>::Storage>();
      auto* dst = out.data_as<typename Elem<D>::Storage>();
      for_each_offset(shape_, strides_, [&](int64_t i, int64_t off) {
        if constexpr (S == D) dst[i] = src[off];  // exact copy, keeps NaN payloads
        else dst[i] = Elem<D>::store(Elem<S>::load(src[off]));
      });
    });
  });
  return out;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_string(shape_);
}

// ---- Comparison

CloseResult allclose(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  if (actual.sizes() != expected.sizes())
    throw ArgumentError("allclose: shape mismatch: actual is " + actual.describe() +
                        ", expected is " + expected.describe());
  if (!actual.defined() || !expected.defined())
    throw ArgumentError("allclose: undefined tensor");
  CloseResult r;
  r.close = true;
  dispatch(actual.dtype(), [&](auto a_tag) {
    dispatch(expected.dtype(), [&](auto e_tag) {
      using A = Elem<decltype(a_tag)::value>;
      using E = Elem<decltype(e_tag)::value>;
      const auto* a = actual.data_as<const typename A::Storage>();
      const auto* e = expected.data_as<const typename E::Storage>();
      // Walk both tensors in the same logical order; their strides may differ.
      for_each_offset2(actual.sizes(), actual.strides(), expected.strides(),
                       [&](int64_t i, int64_t a_off, int64_t e_off) {
        const double x = A::load(a[a_off]), y = E::load(e[e_off]);
        double err;
        bool ok;
        if (std::isnan(x) || std::isnan(y)) {
          ok = std::isnan(x) && std::isnan(y);
          err = ok ? 0.0 : std::numeric_limits<double>::infinity();
        } else if (x == y) {  // also covers equal infinities, whose difference is NaN
          ok = true;
          err = 0.0;
        } else if (std::isinf(x) || std::isinf(y)) {
          // rtol * |inf| would accept anything against an infinite expectation.
          ok = false;
          err = std::numeric_limits<double>::infinity();
        } else {
          err = std::fabs(x - y);
          ok = err <= atol + rtol * std::fabs(y);
        }
        if (r.worst_index < 0 || err > r.max_abs_err) {
          r.max_abs_err = err;
          r.worst_index = i;
        }
        if (!ok) {
          r.close = false;
          if (r.first_bad_index < 0) r.first_bad_index = i;
          ++r.num_bad;
        }
      });
    });
  });
  return r;
}

Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return {1e-4, 1e-5};
    case DType::bf16: return {2e-2, 2e-2};
    case DType::f16: return {5e-3, 5e-3};
    case DType::i32:
    case DType::i64:
    case DType::boolean: return {0.0, 0.0};
  }
  throw RuntimeError("invalid DType value " + std::to_string(int(dtype)));
}

}  // namespace deuteron
