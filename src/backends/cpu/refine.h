// The cpu target's refinement of the lowered plan: how each dot's operands reach the
// micro-kernel (read in place, from a packed staged or resident copy, or packed by the dot),
// the packed copies' layouts, bf16 pairs, threads, grid traversal, epilogue sub-tiles, and the
// scratch each thread needs (checked against the L2 budget). The code generator and the tuning
// harness read this; the neutral plan knows none of it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/plan.h"

namespace deuteron::cpu {

// How one operand of a dot reaches the micro-kernel.
enum class DotRead {
  InPlace,      // read where it is (a tensor or a value in fast memory), by strides
  Packed,       // from its packed staged/resident copy (Staging with dot == this op)
  PackInGroup,  // packed by the dot itself into the dot's scratch each time it runs
};
const char* name(DotRead r);

struct GemmOperand : plan::DotOperand {
  DotRead read = DotRead::InPlace;
  int64_t pack_elements = 0;  // PackInGroup: floats of the dot's packing scratch
  // PackInGroup of a value computed before the dot's loop (attention's scaled q), one slab per
  // block: packed on the loop's first trip only, as it does not change in the loop.
  bool pack_once = false;
};

// A dot lowered onto the micro-kernel.
struct Gemm {
  int op = -1;
  int loop = -1;
  GemmOperand a, b;
  ir::ValueId acc_phi = -1;  // as plan::Dot
  bool acc_inline = false;
  // Both operands are bf16, tensor reads packed for the micro-kernel or computed values the dot
  // packs: they may stay bf16 (pairs of K steps for vdpbf16ps or AMX tiles where the CPU has them).
  bool bf16_pairs = false;
  // The Store that writes the accumulator's final value to an output (a plain tile store, the
  // only access to that output, f32, not streamed), where the accumulator starts as zeros: the
  // dot then accumulates in the output's tile itself, its first block of K overwriting it, with
  // no zero fill and no copy out of fast memory (as a BLAS writes C). -1: in fast memory.
  int out_store = -1;
  // With out_store: the store writes an elementwise epilogue of the accumulator (gelu(acc + bias
  // + residual)), not the accumulator itself. The epilogue reads the accumulator from the
  // output's tile and writes its result over it, element by element, so the product may take
  // Goto's order (a tile of whole rows of N, larger than fast memory) and still be fused.
  bool out_epilogue = false;
  // The store that could have been out_store, but whose tile rows compete for the same L2 sets
  // (Refiner::tile_rows_collide): the accumulator stays in fast memory. -1: none.
  int out_store_collides = -1;
};

// Per block spec: its copy in scratch.
struct Staging {
  int64_t fast_bytes = 0;  // scratch the copy needs (0 in place), prefetched blocks included
  // A copy made in the micro-kernel's packed layout for operand `dot_operand` (0 = a, 1 = b) of
  // dot `dot`: one packed slab per block (resident: one per block of the loop's extent).
  int dot = -1;
  int dot_operand = -1;
  int64_t slab_elements = 0;  // packed floats per block (all batch dims of the operand)
  // A resident packed copy that no grid index selects: the team packs it once, before its grid
  // steps, into thread 0's scratch, and every thread reads it there (dt::SharedPack). The other
  // threads' scratch keeps room for it, unused (the entry point's scratch is per thread).
  bool shared = false;
};

// An output row written with streaming (non-temporal) stores, past the caches (config `stores:
// stream`): the group computes the row into a buffer in scratch, then dt::stream_store copies
// it out in whole cache lines.
struct StreamedStore {
  int op = -1;           // the Store
  int axis = -1;         // its row: the innermost dim of its group, contiguous in the tensor
  int64_t elements = 0;  // the row buffer: the axis' block
};

// A float cumsum along its value's contiguous dim: the code generator scans it a row at a time
// with dt::cumsum_f32_in_double (SIMD prefix sums in double).
bool is_row_cumsum(const ir::Kernel& k, const ir::Op& scan);
// Whether a load or store at op's indices runs along an f32 tensor's contiguous last dim for axis a.
bool along_f32_row(const ir::Kernel& k, const ir::Op& op, int a);

// The Store ops that may stream: each the only access to an output the kernel never reads,
// at plain tile indices, with the last dim contiguous. The space offers `stores` for these.
std::vector<int> streamable_stores(const ir::Kernel& k);

// The store whose output tile may hold the accumulator carried as `c` around dot loop `loop`
// (Gemm::out_store), from the kernel alone: c starts as zeros, and the store, the only access to
// an f32 output (a streamable store), writes at c's axes its final value or values computed from
// it. -1: none. Whether an epilogue may write over the tile in place depends on the plan's groups:
// the refiner checks that (Gemm::out_epilogue).
int accumulator_store(const ir::Kernel& k, int loop, const ir::Carried& c);

// A software prefetch that a pass of a row kernel's grid step issues one cache line at a time,
// in its chunked loop along a tensor's contiguous rows, so that memory stays busy while the core
// computes on cached rows (the hardware prefetcher runs only while a stream is being read):
//   - next_step: a Load's lines at the next grid step (the block the next step's first pass
//     reads from memory), into L2, issued by the pass that reads this step's block a second
//     time. Into L2 rather than L1, measured on the session-12 Xeon (`deuteron run K`, default
//     configs, 3-4 alternating rounds, ms): cross_entropy 26.5-28.1 -> 24.0-24.9, rms_norm
//     8.7-9.3 -> 7.5-8.1, layer_norm 9.9-11.1 -> 9.4-10.5, softmax 5.5-6.5 -> 5.3-6.3;
//     welford, batch_softmax and softmax_two_pass within their rounds' spread; on the
//     session-13 Zen 4 2-13% faster on each row kernel (docs/CPU.md);
//   - rows_ahead: in a dot's epilogue (a pass over the dot's tile after its loop), a Load's row
//     that many rows ahead of the pass's outer loop, into L1, issued by that pass. Its tile was
//     not touched while the dot ran, and its short rows (a block's width) are too short for the
//     hardware prefetcher: epilogue_subtiling's residual stalled a quarter of the epilogue's
//     time (0.973x the time with it, 12 alternating rounds on a Zen 4, session 26);
//   - otherwise a Store's lines at this step, for writing (a plain store reads each line before
//     it writes it), issued by the last earlier pass over the same rows.
// Only for blocks of at most kPrefetchBlockBytes (a quarter of the smallest L2 seen), so that
// prefetched lines are still cached when they are used.
struct RowPrefetch {
  int group_op = -1;  // the pass that issues it, by its first op (passes partition the ops)
  int op = -1;        // the Load or Store
  bool next_step = false;
  int rows_ahead = 0;
};
inline constexpr int kEpilogueRowsAhead = 4;
inline constexpr int64_t kPrefetchBlockBytes = 256 * 1024;

// A value that a pass over a row computes and a later pass over the same row computes again
// from the same elements (softmax_two_pass's exp(x - max): once for the row's sum, once for its
// output). Where each pass's loop covers the row in one trip, the earlier pass keeps the value in
// fast memory and the later one reads it, in a version of its loop that runs where the row
// values both computations take (the keys: each pass's max) have the same bits; elsewhere (a
// row of -inf, whose max the sum's pass guards) it computes the value again. So the result is
// the same, bit for bit, as computing it twice (softmax_two_pass [4096, 4096] on a Zen 4: 0.755x
// the time, docs/CPU.md).
struct KeptValue {
  ir::ValueId kept = -1;                // computed by the earlier pass, kept in fast memory (materialized)
  ir::ValueId again = -1;               // the same value in the later pass, read from `kept`'s array
  int kept_axis = -1, again_axis = -1;  // the passes' row axes (their loops' one axis)
  std::vector<std::pair<ir::ValueId, ir::ValueId>> keys;  // (earlier, later) row values that must match
};

struct CpuPlan : plan::Plan {
  std::vector<Gemm> gemms;
  std::vector<Staging> staging;  // per operands[i]
  int threads = 1;
  // Grid traversal: consecutive blocks walk `grid_group` blocks of the second-fastest grid
  // axis before stepping the fastest one (1: plain row-major order over grid_axes).
  int64_t grid_group = 1;
  // Groups after a dot's loop that only map over the dot's N axis run in this many sub-tiles
  // along it (epilogue sub-tiling); 1 = whole blocks.
  int epilogue_subtiles = 1;
  int epilogue_axis = -1;
  std::vector<StreamedStore> streamed;
  std::vector<RowPrefetch> prefetches;
  std::vector<KeptValue> kept;
  // Groups of the grid body (by their first op) that depend on no grid index: each thread runs
  // them once, before its grid steps, instead of in every step (cross_entropy counts all N
  // labels that are not ignored for the mean's denominator: 4% of its time in every step).
  std::vector<int> hoisted;
  // A row cumsum (is_row_cumsum) whose only use is a Store in the next group, writing it
  // unchanged along an f32 tensor's rows that nothing in the kernel reads: the scan writes each
  // row there itself, so that the row crosses memory once, and its result takes no fast memory.
  // Scan op -> that Store (which its group then skips).
  std::map<int, int> scan_stores;
  // Scratch bytes of resident packed copies no grid index selects (Staging::shared), checked
  // against half the last-level cache instead of the L2 (one column panel each counts there).
  int64_t l3_resident_bytes = 0;
  // Scratch bytes per thread of resident packed copies that grid indices select (attention's
  // kᵀ for one head), each thread's own, kept in the L3: one block of the loop counts in the L2.
  int64_t l3_per_thread_bytes = 0;

  const Gemm* gemm_for_op(int op) const;
  const StreamedStore* streamed_store(int op) const;
  std::vector<RowPrefetch> prefetches_of(const plan::Group& g) const;
  std::vector<KeptValue> kept_in(const plan::Group& g) const;  // those group g computes again
  const Staging& staging_of(const plan::BlockSpec& s) const { return staging[size_t(&s - operands.data())]; }
};

// Throws ConfigError when the scratch per thread exceeds `limits`' fast memory.
CpuPlan refine(const plan::Plan& p, const config::TargetLimits& limits);
// The same for a plan whose budget was checked when it was lowered (Backend::refine).
CpuPlan refine(const plan::Plan& p);

// The cpu-only part of `deuteron emit --plan`.
std::string describe(const CpuPlan& p);

}  // namespace deuteron::cpu
