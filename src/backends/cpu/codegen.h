// The CPU target's code generator: lowered plan -> readable C++ source.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/refine.h"
#include "plan/plan.h"

namespace deuteron::cpu {

// Name of the exported entry point: `deuteron_<kernel>`.
std::string entry_name(const plan::Plan& p);

// One C++ function per kernel, the config in a comment. Signature of the entry point:
//   void deuteron_<kernel>(void* const* tensors, const dt::Scalar* scalars, char* scratch,
//                          long scratch_per_thread, int64_t* status)
// tensors: the IR's host tensors in order; scalars: the scalar arguments; scratch: per-thread
// fast memory, threads x scratch_per_thread bytes, 64-byte aligned; status: two zeroed words,
// where the kernel records the first failed index check (1 + its number in index_checks, and
// the index).
//
// With `trace` (deuteron run --timeline) the source also exports `double* <entry>_trace`: when
// the caller points it at 3 x grid-size doubles, each grid step writes the thread that ran it
// and its start and end (omp_get_wtime seconds) there. Without it, nothing of this is emitted.
//
// A general variant (runtime_sizes, for ahead-of-time builds) takes one more parameter,
// `const int64_t* sizes`: the extent of every axis of the kernel IR in order, then each host
// tensor's dims, then its strides (elements; tensors are contiguous). It reads every size from
// there, so one compiled function serves every shape; a plan that keeps something sized by
// the shape in fast memory (a resident operand) is a ConfigError. Arrays over a whole dim are
// sized at run time, so the source also exports `long <entry>_scratch_per_thread(const int64_t*
// sizes)`: the scratch_per_thread a call at those sizes takes (fast memory, then each thread's
// copies of the ordered atomic-add targets).
struct GenerateOptions {
  std::string entry = {};  // the entry point's name (default entry_name)
  bool runtime_sizes = false;
  bool trace = false;
};
std::string generate(const CpuPlan& p, const GenerateOptions& o = {});

// The entry point's scratch_per_thread: the plan's fast memory (64-byte aligned), then the
// thread's copies of the float targets of hl::atomic_add when the kernel sums them in a fixed
// order (ir::Kernel::ordered_adds).
int64_t scratch_per_thread(const plan::Plan& p);

// An index the kernel computes (a gather's indices, a scalar from device values), checked
// against the size of the dim it indexes wherever it is used.
struct IndexCheck {
  int op = -1;    // the load or store
  int dim = -1;   // the indexed dim of its tensor
  int64_t size = 0;
  std::string what;   // "dim 1 of arg0 (size 7), in a read of kernel 'cross_entropy'"
  std::string where;  // the op's line in the user's kernel
};
std::vector<IndexCheck> index_checks(const plan::Plan& p);

}  // namespace deuteron::cpu
