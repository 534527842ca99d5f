// Small helpers shared by the references: element access in double precision.
#pragma once

#include <cmath>
#include <vector>

#include "deuteron/deuteron.h"

namespace deuteron::examples {

// The tensor argument `i` of a call.
inline const Tensor& tensor_arg(const std::vector<Arg>& args, size_t i) { return std::get<Tensor>(args.at(i)); }
inline double scalar_arg(const std::vector<Arg>& args, size_t i) {
  const Arg& a = args.at(i);
  return std::holds_alternative<double>(a) ? std::get<double>(a) : double(std::get<int64_t>(a));
}

// All elements of a tensor as doubles, in row-major logical order.
inline std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[size_t(i)] = t.get(i);
  return out;
}

// A tensor of `dtype` holding the given values (rounded once, at the end).
inline Tensor from_doubles(const std::vector<double>& v, std::vector<int64_t> shape, DType dtype) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v[size_t(i)]);
  return t;
}

inline double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
inline double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
inline double silu(double x) { return x / (1.0 + std::exp(-x)); }

}  // namespace deuteron::examples
