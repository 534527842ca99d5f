// A performance model of a lowered plan: what each grid step moves and computes, run through a
// two-lane pipeline (a memory lane of block copies, a compute lane of matrix, vector and
// transcendental work) on a hardware description that each target supplies
// (Backend::model_hardware). It predicts the kernel's time and what bounds it, so strategies
// and configs can be compared without the device.
//
// The model simulates the pipeline of one core, grid step by grid step, on two lanes:
//   memory   block copies and write-backs, one at a time at the core's share of the bandwidth.
//            A grid-level block is fetched only when its block index changes (a revisited or
//            unchanged block is not fetched again), a resident operand (an inner loop's whole
//            extent) when its outer block changes, an inner loop's staged or in-place blocks
//            once per trip. A copy may start as many blocks ahead as its buffers allow
//            (buffers_<axis>, pl.Buffered(n)): with n buffers the block of step s + n - 1 is
//            issued when step s starts; with one, a block is fetched only after the previous
//            step's compute is done;
//   compute  2*M*N*K per block product on the matrix unit, plus its passes over the accumulator
//            (Hardware::product_pass_steps); one operation per element of every
//            other computed value on the vector unit, transcendental functions at their own
//            rate; a fixed cost per grid step and per inner trip; an inner loop's body once per trip. An inner
//            loop (emit_pipeline, fori_loop) starts its copies when its outer step starts, so
//            its first trip waits for its first block: the bubble.
// A looped reduction (a whole dim reduced in blocks) runs each of its passes over the dim's blocks
// within the step; a grid-level access over that dim moves the whole row of blocks per step,
// and later passes read it again from fast memory where it fits (Hardware::fast_memory_bytes).
// Without overlap (Hardware::overlaps_copies false) the two lanes run one after the other.
// The first grid steps are simulated event by event; for a big grid the time per step of the
// steady state (over whole periods of the slowest-changing operand) is extrapolated, so a
// prediction stays cheap. A loop whose end is computed on the device runs half its blocks.
#pragma once

#include <string>
#include <vector>

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
  double trip_seconds = 0;          // fixed cost of one trip of an inner loop
  // Memory cost of each contiguous run of a block besides its bytes (a CPU's TLB miss and
  // stream start for every short row of a block; 0: none).
  double segment_seconds = 0;
  // A block product computes whole tiles of this many result rows and columns (1: any size).
  int matrix_tile_rows = 1, matrix_tile_cols = 1;
  // A block product passes over its accumulator once per chunk of K of at most this many steps
  // (0: once per block), and each pass costs as much as this many steps of K (0: free). A CPU
  // micro-kernel loads and stores its register tile of C at every chunk, so short K blocks
  // pay for it more often.
  int64_t product_k_chunk = 0;
  double product_pass_steps = 0;
  bool overlaps_copies = true;      // copies of the next block run under this one's compute
  // Elements one vector operation works on: a block's last dim is padded to whole vectors
  // (1: no padding).
  int vector_lanes = 1;
  // Memory moves whole lines of this many bytes: each row of a block (its last dim) is rounded
  // up to whole lines (0: any size).
  int line_bytes = 0;
  // Fast memory per core (a CPU's L2): the rows a looped reduction's passes read again stay
  // there when they fit, else every pass reads them from memory (0: they always stay, as in a
  // target whose plan holds them in fast memory).
  double fast_memory_bytes = 0;
  // In-place blocks of an inner loop stream ahead by themselves (a CPU's hardware prefetch),
  // rather than with the loop's buffer count (a TPU's fori_loop copies them by hand).
  bool prefetches_in_place = false;
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

// One interval of the simulated pipeline. A schedule records the events issued during its
// first steps (a copy issued ahead belongs to a later step).
struct Event {
  enum class Lane { Memory, Compute };
  enum class Kind {
    Copy,       // memory: a block fetched into fast memory
    WriteBack,  // memory: a block written back
    Compute,    // compute: one grid step's own work, or one trip of an inner loop
    Step,       // compute: the fixed cost of a grid step
    Wait,       // compute: idle, waiting for a copy (memory)
    Bubble,     // compute: idle at the start of an inner loop, waiting for its first block
  };
  Lane lane = Lane::Compute;
  Kind kind = Kind::Compute;
  int operand = -1;   // Copy, WriteBack: index into Schedule::operands
  int64_t step = 0;   // the grid step (of this core) it belongs to
  int64_t trip = -1;  // the inner loop's trip, or -1 for the grid level
  int loop = -1;      // the inner loop (index into Plan::inner_loops), or -1
  int64_t trips = 1;  // Compute: the trips it stands for (a loop without copies runs them back to back)
  double start = 0, end = 0;  // seconds from the kernel's start
};
const char* name(Event::Kind k);

// The simulated pipeline of one core: the events of its first `steps` grid steps, and the
// prediction of the same simulation.
struct Schedule {
  std::vector<std::string> operands;  // names of the tensors the copies move
  std::vector<Event> events;          // in the order they were placed
  int64_t steps = 0;                  // grid steps recorded
  int64_t steps_per_core = 0;         // grid steps each core runs
  int64_t simulated_steps = 0;        // steps simulated event by event (the rest extrapolated)
  Prediction prediction;
};

// The schedule of plan `p` on `hw`, with the events of the first `steps` grid steps.
Schedule schedule(const plan::Plan& p, const Hardware& hw, int64_t steps = 3);

}  // namespace deuteron::model
