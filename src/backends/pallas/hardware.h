// What the pallas target knows about TPUs: one row per generation (memory budgets, rates,
// layout), and the layout rules a block must follow. Figures name their source in
// hardware.cpp; uncertain ones are marked there and are defaults to override.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deuteron/dtype.h"

namespace deuteron::pallas {

struct TpuGeneration {
  std::string name;               // "v5e"
  std::string runner_chip;        // the --chip name of runtime/deuteron_pallas_runner.py
  int cores_per_chip = 1;         // TensorCores on one chip
  int cores_per_device = 1;       // TensorCores behind one JAX device (2 on megacore chips)
  int64_t vmem_bytes = 0;         // physical VMEM per TensorCore
  int64_t scoped_vmem_bytes = 0;  // default scoped VMEM limit (what a kernel may use unasked)
  bool scoped_vmem_uncertain = false;
  double hbm_bytes_per_s = 0;  // per JAX device
  double bf16_flops = 0;       // MXU peak per JAX device (bf16 in, f32 accumulation)
  int mxus_per_core = 0;       // matrix units per TensorCore,
  int mxu_width = 0;           // each a mxu_width x mxu_width systolic array
  std::string mxu;             // "4 x 128x128 per core"
  double clock_hz = 0;         // derived: see hardware.cpp
  double vpu_f32_flops = 0;    // VPU peak per JAX device, f32 operations (derived, see hardware.cpp)
  bool vpu_uncertain = true;   // every VPU figure is derived, not published
  int sublanes = 8;            // a vreg is sublanes x lanes 32-bit words
  int lanes = 128;
  double seconds_per_grid_step = 0;  // fixed cost per grid step; 0 = unmeasured
  std::string sources;               // where the figures come from, in one line
};

// Every generation the table holds, oldest first.
const std::vector<TpuGeneration>& tpu_generations();
// The generation named `name` (case-insensitive; "7x" and "v7x" both work); throws
// ArgumentError listing the known ones.
const TpuGeneration& tpu_generation(const std::string& name);
// The generation the pallas target plans for: $DEUTERON_TPU_GENERATION, else v5e.
const TpuGeneration& default_tpu_generation();

// Headroom kept free of the scoped VMEM limit for the compiler's internal scratch (TPU.md:
// 10-20%; 15% is our default, not a measured figure).
inline constexpr double kVmemHeadroom = 0.15;

// Rows of one (sublanes x 128) VMEM tile for an element type: 8 for 32-bit types, 16 for
// 16-bit ones (two rows packed per sublane), 32 for 8-bit ones.
int sublane_tiling(const TpuGeneration& g, DType t);

// Bytes a VMEM buffer of `shape` and `t` occupies: the last dim padded to a multiple of 128
// lanes, the second-to-last to the sublane tiling, rank < 2 treated as one row.
int64_t padded_vmem_bytes(const TpuGeneration& g, const std::vector<int64_t>& shape, DType t);

}  // namespace deuteron::pallas
