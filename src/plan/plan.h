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
  // Staged or resident as an operand of a dot (op `dot`, operand 0 = a, 1 = b): the copy is
  // made in the micro-kernel's packed layout (A: MR-row panels, B: NR-column panels), one
  // packed slab per block (resident: one per block of the loop's extent).
  int dot = -1;
  int dot_operand = -1;
  int64_t slab_elements = 0;  // packed floats per block (all batch dims of the operand)
  // reuse: a resident copy (or a staged copy in the grid loop) is skipped when the grid block
  // indices on reuse_axes equal those of the thread's previous grid step: the block is already
  // there (Pallas' rule for a block index that did not change).
  bool reuse = false;
  std::vector<int> reuse_axes;
};

// How one operand of a dot reaches the micro-kernel.
enum class DotRead {
  InPlace,      // read where it is (a tensor or a value in fast memory), by strides
  Packed,       // from its packed staged/resident copy (BlockSpec with dot == this op)
  PackInGroup,  // packed by the dot itself into the dot's scratch each time it runs
};
const char* name(DotRead r);

struct DotOperand {
  ir::ValueId value = -1;   // the operand as the dot sees it
  ir::ValueId source = -1;  // the value holding the data, past views and widening casts
  int load_op = -1;         // source's Load (a tensor read), or -1 for a value in fast memory
  DotRead read = DotRead::InPlace;
  int64_t pack_elements = 0;  // PackInGroup: floats of the dot's packing scratch
};

struct DotPlan {
  int op = -1;
  int loop = -1;  // the loop whose body holds the dot
  DotOperand a, b;
  // The product accumulates into the storage of the loop-carried accumulator `acc_phi` (the
  // result is the carried value's next value and nothing reads the old one afterwards).
  ir::ValueId acc_phi = -1;
  // The accumulator operand is an elementwise expression computed by the dot group itself.
  bool acc_inline = false;
  // Both operands are bf16 tensor reads packed for the micro-kernel: they may stay bf16 (pairs
  // of K steps for vdpbf16ps where the CPU has it).
  bool bf16_pairs = false;
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
  std::vector<DotPlan> dots;
  // Grid traversal: consecutive blocks walk `grid_group` blocks of the second-fastest grid
  // axis before stepping the fastest one (1: plain row-major order over grid_axes).
  int64_t grid_group = 1;
  // Groups after a dot's loop that only map over the dot's N axis run in this many sub-tiles
  // along it (epilogue sub-tiling); 1 = whole blocks.
  int epilogue_subtiles = 1;
  int epilogue_axis = -1;
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
  const DotPlan* dot_for_op(int op) const;
};

// Padding of the CPU micro-kernel's packed layouts (deuteron_gemm.h): A panels of kDotMR rows,
// B panels of kDotNR columns (its NR divides this).
inline constexpr int64_t kDotMR = 6, kDotNR = 64;
int64_t packed_a_elements(int64_t m, int64_t k);
int64_t packed_b_elements(int64_t k, int64_t n);

// Lowers the IR with a config (completed against the kernel's space beforehand). Throws
// ConfigError when the config breaks a rule or needs more fast memory than the budget.
Plan lower(const ir::Kernel& k, const config::Config& c, const config::TargetLimits& limits,
           const std::string& target);

// Human-readable plan (`deuteron emit KERNEL --plan`).
std::string print(const Plan& p);

}  // namespace deuteron::plan
