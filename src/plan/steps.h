// The steps of plan::lower, in the order lower.cpp calls them. Each reads what the steps before
// it decided and adds its own part of the plan.
#pragma once

#include <set>
#include <vector>

#include "plan/plan.h"

namespace deuteron::plan {

// What the steps share besides the plan itself.
struct Lowering {
  Plan p;
  const ir::Kernel& k;
  std::vector<int> loop_of;  // per op: the loop whose body holds it
  std::vector<int> uses;     // per value: ir::use_counts
  std::vector<bool> index_arithmetic;  // per value: index_arithmetic_values
  // Ops a dot computes itself (the casts its operands absorb, its accumulator expression).
  std::set<int> absorbed;
  std::vector<ir::ValueId> absorbed_values;
};

void choose_blocks(Lowering& l);        // blocks.cpp: block sizes, ragged edges, reductions
void lay_out_grid(Lowering& l);         // blocks.cpp: grid axes, order, block counts
void find_dots(Lowering& l);            // dots.cpp: block products, in-place accumulation
void find_triangles(Lowering& l);       // triangles.cpp: causal parts a product may skip
void group_bodies(Lowering& l);         // groups.cpp: fusion groups per loop body
void choose_inner_loops(Lowering& l);   // access.cpp: each inner loop's strategy
void build_block_specs(Lowering& l);    // access.cpp: a block spec per tensor access
void place_values(Lowering& l);         // storage.cpp: values kept in fast memory or recomputed
void mark_computed(Lowering& l);        // storage.cpp: values whose data a loop body needs

// Shared by the steps.
std::vector<int> non_one(const std::vector<int>& dims);
bool is_cheap(ir::OpKind k);  // computed where used, never kept
// Per value: whether it is a block of integer or comparison arithmetic on tile indices, sizes,
// constants and scalar arguments only (a causal mask, an index offset). Such a value costs a
// few instructions per element, so it is computed where used, never kept.
std::vector<bool> index_arithmetic_values(const ir::Kernel& k);

}  // namespace deuteron::plan
