// The lowered plan: IR + config, made concrete and backend-neutral. Every target consumes it.
//
// It fixes the grid (axes, order, number of blocks), the block shape of every axis, for every
// tensor access a block spec (shape, index map, where the block lives), each inner loop's
// strategy, the fusion groups of each loop body (ops that run as one loop nest over the same
// block dims), which values must live in fast memory between groups, and the fast memory
// all that needs, checked against the target's budget.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "ir/ir.h"

namespace deuteron::plan {

enum class Placement {
  InPlace,   // read or written where it is (global memory)
  Staged,    // copied into fast memory block by block, `buffers` blocks ahead
  Resident,  // the whole extent of an inner loop copied into fast memory once per outer block
};
const char* name(Placement p);

// One tensor access (a Load or Store op).
struct BlockSpec {
  int op = -1;
  int tensor = -1;
  int loop = -1;  // the loop whose body holds the access
  std::vector<int64_t> block_shape;  // per tensor dim (1 for scalar indices)
  std::vector<std::string> index_map;  // per tensor dim: how the loop indices pick the block
  Placement placement = Placement::InPlace;
  int buffers = 1;
  int64_t fast_bytes = 0;  // fast memory this access needs (0 in place)
};

// A run of ops executed as one loop nest over `domain` (axes, outermost first).
struct Group {
  std::vector<int> ops;
  std::vector<int> domain;
};

// A loop body after grouping: groups and nested loops, in program order.
struct Item {
  bool is_loop = false;
  int loop = -1;  // when is_loop
  Group group;  // otherwise
};

struct InnerLoop {
  int loop = -1;
  Placement placement = Placement::InPlace;
  int buffers = 1;
};

struct Plan {
  std::string target;
  ir::Kernel kernel;
  config::Config config;
  std::vector<int64_t> block;  // per axis: block size (1 for grid() axes, extent for fixed)
  std::vector<bool> persistent;  // per axis: a whole dimension handled in one block
  std::vector<int> grid_axes;  // iteration order, fastest last
  std::vector<int64_t> grid_blocks;  // blocks along each of grid_axes
  std::vector<BlockSpec> operands;
  std::vector<InnerLoop> inner_loops;
  std::vector<std::vector<Item>> bodies;  // per loop: its grouped body
  std::vector<bool> materialized;  // per value: kept in fast memory between groups
  std::vector<bool> recomputed;  // per value: recomputed where used (looped reductions, loads)
  int64_t fast_memory_bytes = 0;  // per thread
  int64_t fast_memory_budget = 0;
  int threads = 1;

  int64_t grid_size() const;
  // Elements a value's block spans along an axis in fast memory: the block size of a tiled
  // axis, the extent of a whole or fixed dimension.
  int64_t storage_extent(int axis) const;
  // Elements of a value's block in fast memory.
  int64_t block_elements(ir::ValueId v) const;
  // The spec of the access made by op `op`, or nullptr.
  const BlockSpec* spec_for_op(int op) const;
};

// Lowers the IR with a config (completed against the kernel's space beforehand). Throws
// ConfigError when the config breaks a rule or needs more fast memory than the budget.
Plan lower(const ir::Kernel& k, const config::Config& c, const config::TargetLimits& limits,
           const std::string& target);

// Human-readable plan (`deuteron emit KERNEL --plan`).
std::string print(const Plan& p);

}  // namespace deuteron::plan
