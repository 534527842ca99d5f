// A shared library of kernels that a program carrying Deuteron opens at run time: the Python
// package's `deuteron.load("libmykernels.so")`. The library defines its kernels as usual and
// lists them once:
//
//   static const auto scale = deuteron::kernel("scale", [](hl::Tensor x) { ... });
//   DEUTERON_KERNEL_LIBRARY(scale, other_kernel)
//
// Build it against the headers alone (`target_link_libraries(mykernels PRIVATE deuteron::headers)`
// after find_package(deuteron)): its calls into Deuteron are left for the loader to bind to the
// copy the program already carries, so one copy serves every library it opens. The headers and
// the program must come from the same Deuteron version.
#pragma once

#include <vector>

#include "deuteron/kernel.h"

// Changes whenever what deuteron_kernel_library() returns changes; the loader checks it first.
#define DEUTERON_LIBRARY_ABI 1

namespace deuteron {

struct KernelLibrary {
  int abi = DEUTERON_LIBRARY_ABI;  // first, so that a loader can read it from any version
  std::vector<const KernelBase*> kernels;
};

template <typename... K>
KernelLibrary kernel_library(const K&... kernels) {
  return KernelLibrary{DEUTERON_LIBRARY_ABI, {static_cast<const KernelBase*>(&kernels)...}};
}

}  // namespace deuteron

// Defines the one function a loader looks up: `deuteron_kernel_library`, with C linkage.
#define DEUTERON_KERNEL_LIBRARY(...)                                                          \
  extern "C" __attribute__((visibility("default"))) const ::deuteron::KernelLibrary*         \
  deuteron_kernel_library() {                                                                \
    static const ::deuteron::KernelLibrary library = ::deuteron::kernel_library(__VA_ARGS__); \
    return &library;                                                                         \
  }
