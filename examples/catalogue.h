// The kernel catalogue (docs/KERNELS.md): each kernel with how to make its inputs, an
// independent reference (plain loops in double precision), its shapes and its traffic.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "deuteron/deuteron.h"

namespace deuteron::examples {

struct Entry {
  std::string name;
  std::string summary;  // one line: inputs -> outputs, semantics
  const KernelBase* kernel = nullptr;
  // The shape parameters the kernel is described by (e.g. {M, N}; for matmul {M, K, N}),
  // at the CPU bench size and at a small ragged test size.
  std::vector<int64_t> bench_shape, small_shape;
  std::vector<std::string> shape_names;  // {"M", "N"}
  std::vector<DType> dtypes = {DType::f32, DType::bf16};
  // Kernel arguments for a shape and dtype, deterministic per seed.
  std::function<std::vector<Arg>(const std::vector<int64_t>& shape, DType dtype, uint64_t seed)> inputs;
  // Expected outputs, computed in double precision from the same arguments.
  std::function<std::vector<Tensor>(const std::vector<Arg>& args)> reference;
  // Bytes a perfect kernel moves to and from memory, and flops it performs.
  std::function<double(const std::vector<int64_t>& shape, DType dtype)> bytes;
  std::function<double(const std::vector<int64_t>& shape)> flops;
  bool compute_bound = false;  // roofline against peak flops rather than bandwidth
  // Tolerance of the check against the reference, when the dtype's default is too tight
  // (a long reduction accumulates rounding); empty means default_tolerance(dtype).
  std::function<Tolerance(DType dtype)> tolerance = {};
};

// The tolerance to check an entry's output of this dtype with.
Tolerance tolerance_for(const Entry& e, DType dtype);

// Every registered kernel, in registration order.
const std::vector<Entry>& catalogue();
// The entry named `name`; throws ArgumentError listing the known ones.
const Entry& find(const std::string& name);

// Registers an entry at static-initialisation time: `static Registrar r{Entry{...}};`.
struct Registrar {
  explicit Registrar(Entry e);
};

}  // namespace deuteron::examples
