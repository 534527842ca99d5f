// What the triton target knows about GPUs: one row per part (on-chip memory, registers, rates),
// for the fast-memory and register estimates a plan is checked against before it compiles.
// Figures name their source in hardware.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deuteron::triton {

struct Gpu {
  std::string name;                  // "h100"
  std::string model;                 // "NVIDIA H100 SXM5 80GB"
  int sms = 0;                       // streaming multiprocessors
  int64_t shared_bytes_per_sm = 0;   // shared memory (with L1) an SM can give to its blocks
  int64_t shared_bytes_per_block = 0;  // the most one program (thread block) may use (opt-in)
  int64_t registers_per_sm = 0;      // 32-bit registers
  int max_registers_per_thread = 255;
  int64_t l2_bytes = 0;
  double hbm_bytes_per_s = 0;
  double f32_flops = 0;   // peak, non-tensor
  double bf16_flops = 0;  // peak dense tensor-core rate
  int warp_size = 32;
};

// Every part the table holds, oldest first.
const std::vector<Gpu>& gpus();
// The part named `name` (case-insensitive); throws ArgumentError listing the known ones.
const Gpu& gpu(const std::string& name);
// The part the triton target plans for: $DEUTERON_GPU, else h100.
const Gpu& default_gpu();

}  // namespace deuteron::triton
