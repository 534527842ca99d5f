// A performance model of a lowered plan: what each grid step moves and computes, run through a
// two-lane pipeline (a memory lane of block copies, a compute lane of matrix, vector and
// transcendental work) on a hardware description that each target supplies
// (Backend::model_hardware). It predicts the kernel's time and what bounds it, so strategies
// and configs can be compared without the device.
//
// The model, step by step (per grid step, every step alike):
//   memory   bytes of every block the step fetches or writes back: a grid-level block only when
//            its block index changes between consecutive steps (a revisited or unchanged block
//            is not fetched again); an inner loop's staged or in-place blocks once per trip; a
//            resident block (the loop's whole extent) when its outer index changes;
//   compute  2*M*N*K per block product on the matrix unit; one operation per element of every
//            other computed value on the vector unit, transcendental functions at their own
//            rate; an inner loop's body once per trip;
//   overlap  with double buffering the two lanes overlap (the step costs the longer one),
//            otherwise they add; a fixed cost per grid step; an inner loop that streams its
//            operands waits for its first block at the start of every outer step (the bubble).
// A loop whose end is computed on the device runs half its blocks on average.
#pragma once

#include <string>

#include "plan/plan.h"

namespace deuteron::model {

// Rates per core, except the memory bandwidth, which the cores share.
struct Hardware {
  std::string name;
  int cores = 1;
  double matrix_flops = 0;          // block products (MXU, FMA units), flop/s
  double vector_flops = 0;          // elementwise and reduction operations, op/s
  double transcendental_rate = 0;   // exp, log, tanh, ... per second
  double memory_bytes_per_s = 0;    // HBM or DRAM, all cores together
  double step_seconds = 0;          // fixed cost of one grid step
  bool overlaps_copies = true;      // copies of the next block run under this one's compute
  // Elements one vector operation works on: a block's last dim is padded to whole vectors
  // (1: no padding).
  int vector_lanes = 1;
  // Memory moves whole lines of this many bytes: each row of a block (its last dim) is rounded
  // up to whole lines (0: any size).
  int line_bytes = 0;
};

// What bounds the kernel: the largest share of its predicted time.
enum class Bound { Compute, Memory, StepOverhead, Bubble };
const char* name(Bound b);

struct Prediction {
  double seconds = 0;
  double flops = 0;  // useful work: block products and vector operations, whole kernel
  double bytes = 0;  // moved to and from memory, whole kernel
  // The predicted time split by cause (they add up to `seconds`).
  double compute_seconds = 0, memory_seconds = 0, overhead_seconds = 0, bubble_seconds = 0;
  Bound bound = Bound::Compute;
  double tflops() const { return seconds > 0 ? flops / seconds / 1e12 : 0; }
  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  // Share of the hardware's peak for what bounds it (flops for compute, bandwidth otherwise).
  double peak_fraction = 0;
};

// The predicted time of plan `p` on `hw`.
Prediction predict(const plan::Plan& p, const Hardware& hw);

}  // namespace deuteron::model
