// Entry point of the frontend: trace a kernel for one specialisation into its IR.
#pragma once

#include <set>
#include <vector>

#include "deuteron/kernel.h"
#include "frontend/tracer.h"
#include "ir/ir.h"

namespace deuteron::frontend {

// Describes the call's arguments (shapes, dtypes, strides); throws ArgumentError on bad ones.
std::vector<ArgSpec> describe_args(const KernelBase& k, const std::vector<Arg>& args);
// Runs the kernel's lambda on symbolic arguments and returns the recorded IR (unoptimised).
ir::Kernel trace(const KernelBase& k, const std::vector<ArgSpec>& args);
// Whether the kernel's float hl::atomic_adds are summed in a fixed order (ir::Kernel::
// ordered_adds), from its options and DEUTERON_DETERMINISTIC; throws ArgumentError on bad ones.
bool ordered_adds(const KernelBase& k, const ir::Kernel& ir);
// A stable string naming the specialisation: shapes, dtypes and layout of every argument.
// `sized`: the argument positions of integer scalars a trace read in host code (item()), whose
// values the key then holds.
std::string specialization_key(const std::vector<ArgSpec>& args, const std::set<int>& sized = {});
// The argument positions of the scalars `ir` was specialised on.
std::set<int> sized_scalars(const ir::Kernel& ir);

}  // namespace deuteron::frontend
