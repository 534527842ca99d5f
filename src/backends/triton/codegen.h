// Plan -> a self-contained Triton Python module: one @triton.jit kernel (one program per grid
// block, a flat 1-D launch) and a launcher.
//
// The module defines `run(*inputs, **scalars)` (the convention of runtime/
// deuteron_triton_runner.py): inputs are the kernel's tensor inputs in IR order as contiguous
// torch tensors (on the GPU, or on the CPU under TRITON_INTERPRET=1), scalars its scalar
// arguments by name; it returns the outputs (one tensor, or a tuple in tensor order).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/triton/hardware.h"
#include "plan/plan.h"

namespace deuteron::triton {

// This target's own tunables (Backend::extend_space).
namespace keys {
inline constexpr const char* kNumWarps = "num_warps";
inline constexpr const char* kNumStages = "num_stages";
// Programs of the second-fastest grid axis that run before the fastest one steps (1 = flat
// row-major order; more: Triton's grouped ordering, for L2 reuse of the shared operand).
inline constexpr const char* kGridGroup = "grid_group";
// tl.dot on f32 operands: "ieee" (exact f32 products) or "tf32" (tensor cores, ~1e-3 relative).
inline constexpr const char* kDotPrecision = "dot_precision";
// Tensor accesses: "plain" (pointer blocks with masks) or "descriptor" (tl.make_tensor_descriptor,
// where the access allows one: TMA on GPUs that have it). Triton 3.9 removed block pointers.
inline constexpr const char* kPointers = "pointers";
}  // namespace keys

// tl.dot's smallest block along M, N and K.
inline constexpr int64_t kMinDotBlock = 16;
// Triton's largest block (TRITON_MAX_TENSOR_NUMEL).
inline constexpr int64_t kMaxBlockElements = int64_t(1) << 20;

// What one program needs of the GPU, estimated from the plan: the shared memory of the
// operands that feed tl.dot (num_stages copies of each inside a loop, Triton's pipelining), and
// the registers per thread that loop-carried values take (f32, spread over the warps).
struct Footprint {
  int64_t shared_bytes = 0;
  int64_t carried_registers = 0;  // per thread
  std::string describe(const Gpu& g) const;
};

// Throws CompileError naming the first construct the target cannot express.
void check_expressible(const plan::Plan& p);
// Checks what the config decides: power-of-two blocks, tl.dot's minimum, persistent
// reductions, the block-size limit, shared memory and registers on `g` (ConfigError naming
// the rule and the fix). Returns the footprint. `resources` false leaves out the last two: an
// ahead-of-time build's probe shapes size a general module's whole dims beyond any call's.
Footprint check(const plan::Plan& p, const Gpu& g, bool resources = true);

// The Python module. Stable: the same plan and GPU give byte-identical text.
//
// `general` (ahead-of-time builds): a module for any sizes. Its `run` takes one more keyword,
// `sizes`: the extent of every axis of the kernel IR, then each host tensor's dims. The kernel
// takes the extents and the tensors' strides as arguments, masks every block, counts its grid
// and loop trips with tl.cdiv, and the launcher sizes a whole dim's block (a persistent
// reduction) as the dim rounded up to a power of two (a tl.constexpr: Triton compiles one
// kernel per such block).
std::string generate(const plan::Plan& p, const Gpu& g, bool general = false);

// The Python identifier the module uses for an IR name (tensors, scalars, axes).
std::string python_name(const std::string& name);

}  // namespace deuteron::triton
