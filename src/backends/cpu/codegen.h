// The CPU target's code generator: lowered plan -> readable C++ source.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace deuteron::cpu {

// Name of the exported entry point: `deuteron_<kernel>`.
std::string entry_name(const plan::Plan& p);

// One C++ function per kernel, the config in a comment. Signature of the entry point:
//   void deuteron_<kernel>(void* const* tensors, const double* scalars, char* scratch,
//                          long scratch_per_thread, int64_t* status)
// tensors: the IR's host tensors in order; scalars: the scalar arguments; scratch: per-thread
// fast memory, threads x scratch_per_thread bytes, 64-byte aligned; status: two zeroed words,
// where the kernel records the first failed index check (1 + its number in index_checks, and
// the index).
std::string generate(const plan::Plan& p);

// An index the kernel computes (a gather's indices, a scalar from device values), checked
// against the size of the dim it indexes wherever it is used.
struct IndexCheck {
  int op = -1;    // the load or store
  int dim = -1;   // the indexed dim of its tensor
  int64_t size = 0;
};
std::vector<IndexCheck> index_checks(const plan::Plan& p);
// "index 40000 is out of range for dim 1 of logits (size 32000)", for a failed check.
std::string describe_failed_check(const ir::Kernel& k, const IndexCheck& c, int64_t index);

}  // namespace deuteron::cpu
