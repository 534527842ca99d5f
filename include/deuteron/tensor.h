// Host tensors: dtype, shape, strides (in elements), and an owning or borrowed buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deuteron/dtype.h"

struct DLManagedTensor;

namespace deuteron {

class Tensor {
 public:
  Tensor() = default;
  // A new contiguous tensor, 64-byte aligned, uninitialised.
  static Tensor empty(std::vector<int64_t> shape, DType dtype);
  static Tensor zeros(std::vector<int64_t> shape, DType dtype);
  static Tensor empty_like(const Tensor& t);
  // Wraps memory the caller owns and keeps alive; nothing is copied.
  static Tensor borrow(void* data, std::vector<int64_t> shape, DType dtype,
                       std::vector<int64_t> strides = {});
  // Fills with uniform random values in [lo, hi) (integers: [lo, hi)), deterministic per seed.
  static Tensor rand(std::vector<int64_t> shape, DType dtype, uint64_t seed, double lo = -1.0,
                     double hi = 1.0);

  // DLPack: import takes ownership of the managed tensor (calls its deleter when done, or at
  // once if it throws ArgumentError for an unsupported device or dtype); export shares this
  // tensor's buffer with the consumer, who must call the returned tensor's deleter.
  static Tensor from_dlpack(DLManagedTensor* managed);
  DLManagedTensor* to_dlpack() const;

  bool defined() const { return data_ != nullptr; }
  DType dtype() const { return dtype_; }
  int dim() const { return int(shape_.size()); }
  const std::vector<int64_t>& sizes() const { return shape_; }
  int64_t size(int d) const;  // negative d counts from the end
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t numel() const;
  int64_t nbytes() const { return numel() * dtype_size(dtype_); }
  bool is_contiguous() const;
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data_); }

  // A contiguous copy (or this tensor if already contiguous).
  Tensor contiguous() const;
  // Element i of the tensor in row-major logical order, as double (any dtype, any strides).
  double get(int64_t flat_index) const;
  void set(int64_t flat_index, double value);
  // Converts to another dtype (a new contiguous tensor).
  Tensor to(DType dtype) const;
  // "float32[8192, 2560]"
  std::string describe() const;

 private:
  std::shared_ptr<void> owner_;  // keeps the buffer alive; null when borrowed
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  std::vector<int64_t> shape_, strides_;
};

// Largest |a - b| over all elements, and whether every element satisfies
// |a - b| <= atol + rtol * |b| (NaNs compare equal only to NaNs at the same place).
// Indices are flat, row-major logical; a NaN mismatch counts as an infinite error.
struct CloseResult {
  bool close = false;
  double max_abs_err = 0.0;
  int64_t worst_index = -1;      // element with the largest |a - b|; -1 only when empty
  int64_t first_bad_index = -1;  // first element outside the tolerance, -1 when close
  int64_t num_bad = 0;           // how many elements are outside the tolerance
};
CloseResult allclose(const Tensor& actual, const Tensor& expected, double rtol, double atol);

// The tolerance used to check a result of this dtype against a double-precision reference.
struct Tolerance {
  double rtol, atol;
};
Tolerance default_tolerance(DType dtype);

}  // namespace deuteron
