// Looped reductions (reduce_<axis> below the dim's extent) as the Python targets run them: each
// fusion group of the grid loop's body over a looped axis becomes a loop over the axis' blocks,
// its reductions accumulating across them; values over the axis exist one block at a time.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <optional>
#include <vector>

#include "deuteron/error.h"
#include "plan/plan.h"

namespace deuteron::plan {

struct ReduceLoop {
  int axis = -1;
  int64_t blocks = 0;    // blocks of the axis (the last one may be partial)
  std::vector<int> ops;  // the group's computed ops, in program order
};

struct ReduceLoops {
  std::vector<ReduceLoop> loops;
  std::map<int, int> of_op;  // op -> its entry of loops
  // The first thing a loop over blocks cannot run (the persistent reduction runs it).
  std::optional<ConfigError> problem;
};

// An axis of kind Reduction split into blocks (not persistent).
bool looped(const Plan& p, int axis);
// The looped axis among a value's dims, or -1.
int looped_dim(const Plan& p, ir::ValueId v);
ReduceLoops find_reduce_loops(const Plan& p);

// Walks one reduction loop in the order its code is written: for each of its ops, first what
// the op reads that is not written yet (and what that reads), then the op. `write(op, inside)`
// writes an op inside the loop (values over the axis, block by block: recomputed in each loop
// that uses them) or before it (the others, once: `emitted` holds those). A reduction over the
// axis is `start`ed first (its identity, before the loop), then written inside. `indices`: the
// values of scalar indices are read too (else only gathered ones). Returns what the loop does
// for its comment: "amax", "store out".
std::vector<std::string> walk_reduce_loop(const Plan& p, const ReduceLoop& rl, bool indices, std::set<ir::ValueId>& emitted,
                                          const std::function<void(const ir::Op&)>& start,
                                          const std::function<void(const ir::Op&, bool inside)>& write);

}  // namespace deuteron::plan
