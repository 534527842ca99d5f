// Plan -> a self-contained JAX/Pallas Python module: one pl.pallas_call with the plan's grid,
// one pl.BlockSpec per operand, and the grid loop's body as jnp operations on blocks.
//
// The module defines `run(*inputs, **scalars, interpret=None)` (the convention of
// src/backends/pallas/runtime/deuteron_pallas_runner.py): inputs are the kernel's tensor inputs in IR order,
// scalars its scalar arguments by name; it returns the outputs (one array, or a tuple).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/pallas/hardware.h"
#include "plan/plan.h"

namespace deuteron::pallas {

// The pallas target's own config keys (config/keys.h holds the shared ones).
namespace keys {
// How a gather from `tensor` (x[{rows, idx}]) picks its elements: kOneHot compares the whole
// gathered dim with each index (vector work, no SMEM); kSmem copies the indices into SMEM and
// reads each row's element at its index in a loop over the block's rows.
inline std::string gather(const std::string& tensor) { return "gather_" + tensor; }
inline constexpr const char* kOneHot = "one_hot";
inline constexpr const char* kSmem = "smem";
}  // namespace keys

// Whether `op` (a gathering load) can take the kSmem form: one index per row of a block with
// one other dim.
bool smem_gather_applies(const ir::Op& op);

// VMEM a plan needs on the chip, in bytes (tile-padded, see padded_vmem_bytes): every buffer
// the emitted module allocates.
struct Footprint {
  int64_t operands = 0;     // the pallas_call's pipeline buffers (2 per blocked operand, or 1)
  int64_t pipelines = 0;    // the inner loops' buffers (emit_pipeline's, fori_loop's copies)
  int64_t scratch = 0;      // loop-carried values kept in VMEM scratch
  int64_t temporaries = 0;  // peak of the block values the kernel body keeps live at once
  int64_t total() const { return operands + pipelines + scratch + temporaries; }
  // With the compiler's headroom (kVmemHeadroom): what must fit the core's VMEM.
  int64_t needed() const;
  std::string describe() const;  // "1.0 MiB operand buffers + ... = 1.3 MiB with 15% headroom"
};

// The vmem_limit_bytes the module asks for: what it needs, rounded up to MiB, at least the
// chip's default scoped limit and at most its VMEM.
int64_t vmem_limit_bytes(const TpuGeneration& chip, const Footprint& f);

// A block covering a whole dim becomes the dim (always a legal TPU block, never ragged): the
// plan's block, partial edge and block shapes, as the pallas target runs them.
void fit_blocks(plan::Plan& p);

// The TPU block-shape rule: the `back`-th dim from the end (0: last, 1: second-to-last) of a
// block is a multiple of this, or the array's whole dim.
int64_t block_multiple(const TpuGeneration& chip, size_t back);

// Checks what the config decides: the TPU block-shape rule for every block and the VMEM
// footprint against the core's VMEM (ConfigError naming the operand or the sizes, and
// the fix). Constructs the target cannot express (inner tile loops, gathers, ...) are not
// checked here, since no config fixes them: generate() throws CompileError for them. Returns
// the footprint (zero for a plan the target cannot express).
Footprint check(const plan::Plan& p, const TpuGeneration& chip);

// Throws CompileError naming the first construct the target cannot express.
void check_expressible(const plan::Plan& p, const TpuGeneration& chip);
// The footprint of an expressible plan (throws CompileError like check otherwise).
Footprint vmem_footprint(const plan::Plan& p, const TpuGeneration& chip);

// The Python module. Stable: the same plan and chip give byte-identical text. Throws
// CompileError for constructs the target does not support (it does not re-check the rules).
//
// `general` (ahead-of-time builds): a module for any sizes, generated from a plan at a probe
// shape larger than any block and ragged. Its `run` reads every axis' extent from its inputs'
// shapes (E_<axis>, Python ints at trace time) and takes the dispatch table's `sizes` to check
// them; the grid and the loops count blocks with pl.cdiv, every tiled block is masked where it
// may be partial, operands streamed in whole blocks are padded to them at the call's size, and
// a block that is the whole dim at the probe is the call's whole dim. It throws ConfigError
// for what it cannot follow yet (resident inner loops, a grid over part of a dim, an inner
// loop starting elsewhere than 0, an axis no input's dim gives).
std::string generate(const plan::Plan& p, const TpuGeneration& chip, bool general = false);

// What this target decided beyond the plan (inner-loop strategies, the VMEM arithmetic), for
// `deuteron emit --plan`.
std::string describe(const plan::Plan& p, const TpuGeneration& chip);

// The name given to pallas_call: "deuteron_<kernel>".
std::string entry_name(const plan::Plan& p);

// The Python identifier the module uses for an IR name (tensors, scalars, axes): other
// characters become '_', a leading digit or a reserved word gets an underscore.
std::string python_name(const std::string& name);

}  // namespace deuteron::pallas
