// The lowered plan: IR + config, made concrete and backend-neutral. Every target consumes it.
//
// It fixes the grid (axes, order, number of blocks), the block shape of every axis and whether
// its last block is partial, for every tensor access a block spec (shape, a structured index
// map, where the block lives and how many buffers it takes), each inner loop's strategy, each
// loop-carried value, each reduction (persistent or looped), each block product, the fusion
// groups of each loop body (ops that run as one loop nest over the same block dims), and which
// values live in fast memory between groups. What it costs in bytes, and whether that fits, is
// the target's to say (Backend::refine): a TPU and a CPU size the same block differently.
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

// How one tensor dim of an access is addressed.
struct IndexTerm {
  enum class Kind {
    Block,     // block `i` of loop axis `axis`: elements [begin + i*block, ...) (+ offset)
    Whole,     // the whole extent of a whole-dim or fixed axis, from element `offset`
    Looped,    // a whole dim reduced in blocks of `block` (a looped reduction's axis)
    Constant,  // the single element `constant` (no block dim)
    Scalar,    // the single element given by the device value `value` (no block dim)
    Gather,    // elements given by a block of indices `value`
  };
  Kind kind = Kind::Block;
  int axis = -1;       // Block, Whole, Looped
  int loop = -1;       // Block: the loop whose index drives it
  bool grid = false;   // Block: that loop is the grid
  int64_t begin = 0;   // Block: the loop's first element (a constant bound)
  int64_t offset = 0;  // Block, Whole: added to the element index (slices start:stop)
  int64_t constant = 0;
  ir::ValueId value = -1;
  // Scalar: the grid axis whose block begin the value is (hl::grid indices), else -1.
  int grid_axis = -1;
  bool operator==(const IndexTerm&) const = default;
};

// One tensor access (a Load or Store op).
struct BlockSpec {
  int op = -1;
  int tensor = -1;
  bool store = false;
  int loop = -1;  // the loop whose body holds the access
  std::vector<int64_t> block_shape;  // per tensor dim (1 for a single element)
  std::vector<IndexTerm> index_map;  // per tensor dim
  // The first spec with the same tensor, direction, loop, block shape and index map (this
  // one's index when it is the first): targets that pass operands once de-duplicate by it.
  int first = -1;
  Placement placement = Placement::InPlace;
  int buffers = 1;
  int64_t elements = 0;  // elements of one buffer in fast memory (0 in place)
  // reuse: a resident copy (or a staged copy in the grid loop) is skipped when the grid block
  // indices on reuse_axes equal those of the thread's previous grid step: the block is already
  // there (Pallas' rule for a block index that did not change).
  bool reuse = false;
  std::vector<int> reuse_axes;
};

// One operand of a block product.
struct DotOperand {
  ir::ValueId value = -1;   // the operand as the dot sees it
  ir::ValueId source = -1;  // the value holding the data, past views and widening casts
  int load_op = -1;         // source's Load (a tensor read), or -1 for a value in fast memory
};

struct Dot {
  int op = -1;
  int loop = -1;  // the loop whose body holds the dot
  DotOperand a, b;
  // The product accumulates into the storage of the loop-carried accumulator `acc_phi` (the
  // result is the carried value's next value and nothing reads the old one afterwards).
  ir::ValueId acc_phi = -1;
  // The accumulator operand is an elementwise expression computed by the dot group itself.
  bool acc_inline = false;
  // Causal triangles (find_triangles), in global indices of the dot's axes: C's entries (row i,
  // column j) with j - i > c_unused_above are never read (a where() replaces them with -inf); a's
  // entries (row i, K index k) with k - i > a_zero_above are zero. kNoTriangle: none.
  static constexpr int64_t kNoTriangle = int64_t(1) << 60;
  int64_t c_unused_above = kNoTriangle;
  int64_t a_zero_above = kNoTriangle;
};

// A condition index(col) - index(row) > t on two tile axes (a causal mask, kv > q), found by
// find_triangles: a target may test per block that it holds nowhere (a block below the
// diagonal) and run that block without it.
struct DiagonalMask {
  ir::ValueId cond = -1;
  int row = -1, col = -1;
  int64_t t = 0;
};

// A value updated around a loop; it lives in fast memory for the loop's whole run.
struct CarriedValue {
  int loop = -1;
  ir::ValueId init = -1, phi = -1, next = -1, result = -1;
  int dot = -1;  // the dot op accumulating into it in place, or -1
};

struct Reduction {
  int op = -1;
  int axis = -1;  // the axis reduced over
  bool persistent = true;  // the whole dim in one block, else looped in blocks of `block`
  int64_t block = 0;
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
  std::vector<bool> partial;  // per axis: the last block is partial (ragged edge: masked)
  std::vector<int> grid_axes;  // iteration order, fastest last
  std::vector<int64_t> grid_blocks;  // blocks along each of grid_axes
  std::vector<BlockSpec> operands;
  std::vector<InnerLoop> inner_loops;
  std::vector<Dot> dots;
  std::vector<DiagonalMask> diagonal_masks;
  std::vector<CarriedValue> carried;
  std::vector<Reduction> reductions;
  std::vector<std::vector<Item>> bodies;  // per loop: its grouped body
  std::vector<bool> materialized;  // per value: kept in fast memory between groups
  std::vector<bool> recomputed;  // per value: recomputed where used (looped reductions, loads)
  // Per value: its data reaches a store or a loop bound, so a loop body computes it. Values that
  // only address tensors (hl::grid indices, tile begins in an index) are the index maps' part.
  std::vector<bool> computed;
  // Filled by the target (Backend::refine): what the plan needs of its fast memory, per core.
  int64_t fast_memory_bytes = 0;
  int64_t fast_memory_budget = 0;

  int64_t grid_size() const;
  // Elements a value's block spans along an axis in fast memory: the block size of a tiled
  // axis, the extent of a whole or fixed dimension.
  int64_t storage_extent(int axis) const;
  // Elements of a value's block in fast memory.
  int64_t block_elements(ir::ValueId v) const;
  // The spec of the access made by op `op`, or nullptr.
  const BlockSpec* spec_for_op(int op) const;
  const Dot* dot_for_op(int op) const;
};

// Lowers the IR with a config (completed against the kernel's space beforehand), through the
// steps in lower.cpp. Throws ConfigError when the config breaks a rule every target shares.
// DEUTERON_DUMP_PLAN=1 prints the plan after each step to stderr.
Plan lower(const ir::Kernel& k, const config::Config& c, const std::string& target);

// Human-readable plan (`deuteron emit KERNEL --plan`).
std::string print(const Plan& p);
std::string print(const Plan& p, const IndexTerm& t);

}  // namespace deuteron::plan
