// The CPU target's code generator: lowered plan -> readable C++ source.
#pragma once

#include <string>

#include "plan/plan.h"

namespace deuteron::cpu {

// Name of the exported entry point: `deuteron_<kernel>`.
std::string entry_name(const plan::Plan& p);

// One C++ function per kernel, the config in a comment. Signature of the entry point:
//   void deuteron_<kernel>(void* const* tensors, const double* scalars, char* scratch,
//                          long scratch_per_thread)
// tensors: the IR's host tensors in order; scalars: the scalar arguments; scratch: per-thread
// fast memory, threads x scratch_per_thread bytes, 64-byte aligned.
std::string generate(const plan::Plan& p);

}  // namespace deuteron::cpu
