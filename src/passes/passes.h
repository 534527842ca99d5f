// Passes over the kernel IR, run in order by `run_all` after tracing.
#pragma once

#include "ir/ir.h"

namespace deuteron::passes {

// Removes ops whose results nothing uses (reads of outputs before a store, unused values).
void eliminate_dead_code(ir::Kernel& k);
// `x + hl::dot(a, b)` -> hl::dot(a, b, x) when the product has no other use.
void fuse_dot_accumulate(ir::Kernel& k);
// Checks rules the tracer cannot see op by op: every output is written, loop-carried values
// keep their dtype. Throws KernelError at the offending line.
void check_legality(ir::Kernel& k);
// The whole pipeline.
void run_all(ir::Kernel& k);

}  // namespace deuteron::passes
