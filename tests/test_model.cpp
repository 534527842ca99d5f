// The performance model (model/model.h) on hand-checkable cases: the bytes and flops it counts
// against the kernel's own arithmetic, what bounds it, and how placements change what moves.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "catalogue.h"
#include "driver/driver.h"
#include "frontend/tracer.h"
#include "model/model.h"

namespace deuteron {
namespace {

std::vector<frontend::ArgSpec> specs(const std::vector<std::vector<int64_t>>& shapes, DType dt) {
  std::vector<frontend::ArgSpec> out;
  for (const auto& shape : shapes) {
    frontend::ArgSpec a;
    a.dtype = dt;
    a.shape = shape;
    a.strides.assign(shape.size(), 1);
    for (size_t d = shape.size(); d-- > 1;) a.strides[d - 1] = a.strides[d] * shape[d];
    out.push_back(a);
  }
  return out;
}

plan::Plan lower(const std::string& kernel, const std::vector<std::vector<int64_t>>& shapes,
                 const config::Json& cfg, DType dt = DType::f32) {
  const examples::Entry& e = examples::find(kernel);
  std::vector<frontend::ArgSpec> args = specs(shapes, dt);
  for (size_t i = 0; i < args.size() && i < e.kernel->options().arg_names.size(); ++i)
    args[i].name = e.kernel->options().arg_names[i];
  // The space's defaults follow the machine's limits: pin them (the configs below set every
  // tunable the expected counts depend on).
  config::TargetLimits limits;
  limits.cores = 2;
  limits.fast_memory_bytes = 1 << 20;
  driver::Specialized s = driver::specialize(*e.kernel, args, "cpu", limits);
  config::Config c;
  for (const auto& [key, value] : cfg.items()) c.set(key, value);
  return plan::lower(s.ir, driver::complete(s, c), "cpu");
}

// Round figures, so that the expected times are plain arithmetic.
model::Hardware simple_hardware() {
  model::Hardware hw;
  hw.cores = 1;
  hw.matrix_flops = 1e12;
  hw.vector_flops = 1e11;
  hw.transcendental_rate = 1e10;
  hw.memory_bytes_per_s = 1e11;
  hw.step_seconds = 0;
  return hw;
}

TEST(Model, AddMovesItsArraysOnceAndIsMemoryBound) {
  // 256 x 1024 f32 in blocks of 64 x 256: x, y read and out written once each.
  plan::Plan p = lower("add", {{256, 1024}, {256, 1024}}, {{"block_t0", 64}, {"block_t1", 256}, {"num_threads", 1}});
  model::Prediction m = model::predict(p, simple_hardware());
  double bytes = 3.0 * 256 * 1024 * 4;
  EXPECT_DOUBLE_EQ(m.bytes, bytes);
  EXPECT_DOUBLE_EQ(m.flops, 256.0 * 1024);  // one add per element
  EXPECT_EQ(m.bound, model::Bound::Memory);
  // The copies run back to back: the last block's adds run while the block before it is
  // written back, so nothing but memory shows.
  EXPECT_NEAR(m.seconds, bytes / 1e11, 1e-12);
  EXPECT_NEAR(m.peak_fraction, 1.0, 1e-9);
}

TEST(Model, MatmulCountsItsProductsAndReusesBlocksAlongTheGrid) {
  // M = N = K = 512, blocks 128: 16 output blocks, 4 k steps each.
  config::Json cfg = {{"block_m", 128}, {"block_n", 128}, {"block_k", 128}, {"num_threads", 1},
                      {"inner_k", "in_place"}, {"inner_k_x", "loop"}, {"inner_k_y", "loop"}};
  plan::Plan p = lower("matmul", {{512, 512}, {512, 512}}, cfg);
  model::Hardware hw = simple_hardware();
  hw.memory_bytes_per_s = 1e15;  // memory free: the products bound it
  model::Prediction m = model::predict(p, hw);
  EXPECT_EQ(m.bound, model::Bound::Compute);
  EXPECT_GE(m.flops, 2.0 * 512 * 512 * 512);
  EXPECT_LE(m.flops, 2.0 * 512 * 512 * 512 * 1.01);  // plus the stores' casts
  EXPECT_NEAR(m.compute_seconds, 2.0 * 512 * 512 * 512 / 1e12, 2.0 * 512 * 512 * 512 / 1e12 * 0.02);
  // Each output block reads a 128-row panel of x and a 128-column panel of y (4 k blocks of
  // each) and writes itself once: 16 x (2 x 4 x 128 x 128 + 128 x 128) x 4 bytes.
  EXPECT_DOUBLE_EQ(m.bytes, 16.0 * (2 * 4 * 128 * 128 + 128 * 128) * 4);
}

// A CPU micro-kernel loads and stores its tile of C once per chunk of K: a K block shorter
// than the chunk pays that once per block, a longer one once per chunk.
TEST(Model, AProductPassesOverItsAccumulatorOncePerChunkOfK) {
  model::Hardware hw = simple_hardware();
  hw.memory_bytes_per_s = 1e15;  // memory free: the products bound it
  hw.product_k_chunk = 256;
  hw.product_pass_steps = 3;
  auto compute = [&](int64_t block_k) {
    config::Json cfg = {{"block_m", 128}, {"block_n", 128}, {"block_k", block_k}, {"num_threads", 1},
                        {"inner_k", "in_place"}, {"inner_k_x", "loop"}, {"inner_k_y", "loop"}};
    return model::predict(lower("matmul", {{512, 512}, {512, 512}}, cfg), hw).compute_seconds;
  };
  // One pass costs 2 x 3 flops per result element: 512 x 512 of them.
  double pass = 2.0 * 3 * 512 * 512 / hw.matrix_flops;
  EXPECT_NEAR(compute(64) - compute(256), (8 - 2) * pass, pass * 0.01);  // 8 blocks of K against 2
  EXPECT_NEAR(compute(512), compute(256), pass * 0.01);                   // 1 block of 2 chunks
  hw.product_pass_steps = 0;
  EXPECT_NEAR(compute(64), compute(256), pass * 0.01);  // free passes: the K block does not matter
}

TEST(Model, ResidentOperandsAreFetchedOncePerOuterBlockAndStreamedOnesWaitForTheirFirstBlock) {
  // Attention with 4 query blocks per head: resident K and V are read once per head, streamed
  // ones once per query block; only the stream waits for its first block (the bubble).
  std::vector<std::vector<int64_t>> shapes = {{1, 2, 512, 64}, {1, 2, 512, 64}, {1, 2, 512, 64}};
  config::Json base = {{"block_batch", 1}, {"block_head", 1}, {"block_q", 128}, {"block_kv", 128}, {"num_threads", 1}};
  config::Json resident = base, stream = base;
  resident["inner_kv"] = "resident";
  stream["inner_kv"] = "stream";
  resident["inner_kv_k"] = resident["inner_kv_v"] = stream["inner_kv_k"] = stream["inner_kv_v"] = "loop";
  model::Prediction r = model::predict(lower("attention", shapes, resident), simple_hardware());
  model::Prediction s = model::predict(lower("attention", shapes, stream), simple_hardware());
  double kv = 2.0 * 2 * 512 * 64 * 4;  // K and V of both heads, once
  double q_and_out = 2.0 * 2 * 512 * 64 * 4;
  EXPECT_DOUBLE_EQ(r.bytes, q_and_out + kv);
  EXPECT_DOUBLE_EQ(s.bytes, q_and_out + 4 * kv);
  EXPECT_EQ(r.bubble_seconds, 0);
  EXPECT_GT(s.bubble_seconds, 0);
  EXPECT_DOUBLE_EQ(r.flops, s.flops);  // the same work either way
}

// ---- the schedule ---------------------------------------------------------------------------

using model::Event;

std::vector<const Event*> lane(const model::Schedule& s, Event::Lane l) {
  std::vector<const Event*> out;
  for (const Event& e : s.events)
    if (e.lane == l) out.push_back(&e);
  std::sort(out.begin(), out.end(), [](const Event* a, const Event* b) { return a->start < b->start; });
  return out;
}

double last_end(const model::Schedule& s) {
  double t = 0;
  for (const Event& e : s.events) t = std::max(t, e.end);
  return t;
}

// What every schedule keeps: events in a lane never overlap, work never starts before its
// blocks arrive, and for a grid simulated in full the prediction is the last event's end.
void expect_invariants(const model::Schedule& s) {
  constexpr double eps = 1e-15;
  for (Event::Lane l : {Event::Lane::Memory, Event::Lane::Compute}) {
    std::vector<const Event*> es = lane(s, l);
    for (size_t i = 1; i < es.size(); ++i)
      EXPECT_GE(es[i]->start, es[i - 1]->end - eps) << "overlap in lane " << int(l) << " at event " << i;
    for (const Event* e : es) EXPECT_LE(e->start, e->end);
  }
  for (const Event& c : s.events) {
    if (c.kind != Event::Kind::Compute && c.kind != Event::Kind::Step) continue;
    for (const Event& m : s.events) {
      if (m.kind != Event::Kind::Copy || m.step != c.step) continue;
      // An inner trip needs its own blocks; a step (its fixed cost first) its grid-level ones.
      bool needs = c.trip >= 0 ? (m.loop == c.loop && m.trip == c.trip) : (m.trip < 0 && c.kind == Event::Kind::Step);
      if (needs) {
        EXPECT_GE(c.start, m.end - eps) << "step " << c.step << " trip " << c.trip << " ran before its copy";
      }
    }
  }
  if (s.simulated_steps == s.steps_per_core && s.steps == s.steps_per_core) {
    EXPECT_NEAR(s.prediction.seconds, last_end(s), 1e-9 * last_end(s));
  }
  const model::Prediction& m = s.prediction;
  EXPECT_NEAR(m.compute_seconds + m.memory_seconds + m.overhead_seconds + m.bubble_seconds, m.seconds, 1e-15 + 1e-12 * m.seconds);
}

std::vector<std::vector<int64_t>> attention_shapes(int64_t seq, int64_t d) {
  return {{1, 2, seq, d}, {1, 2, seq, d}, {1, 2, seq, d}};
}

config::Json attention_config(const std::string& inner, int buffers) {
  return {{"block_batch", 1}, {"block_head", 1}, {"block_q", 128}, {"block_kv", 128}, {"num_threads", 1},
          {"inner_kv", inner}, {"buffers_kv", buffers}, {"inner_kv_k", "loop"}, {"inner_kv_v", "loop"}};
}

TEST(ModelSchedule, KeepsItsInvariantsForEveryStrategy) {
  // Shapes that are not multiples of the blocks (ragged last blocks), and a single row.
  std::vector<plan::Plan> plans = {
      lower("add", {{200, 1000}, {200, 1000}}, {{"block_t0", 64}, {"block_t1", 256}, {"num_threads", 1}}),
      lower("add", {{1, 1}, {1, 1}}, {{"block_t0", 1}, {"block_t1", 1}, {"num_threads", 1}}),
      lower("matmul", {{300, 200}, {200, 250}},
            {{"block_m", 128}, {"block_n", 128}, {"block_k", 64}, {"num_threads", 1}, {"inner_k", "in_place"},
             {"inner_k_x", "loop"}, {"inner_k_y", "loop"}}),
      lower("attention", attention_shapes(600, 64), attention_config("stream", 2)),
      lower("attention", attention_shapes(600, 64), attention_config("stream", 3)),
      lower("attention", attention_shapes(600, 64), attention_config("resident", 1)),
      lower("attention", attention_shapes(600, 64), attention_config("resident", 2)),
      lower("attention", attention_shapes(600, 64), attention_config("in_place", 1)),
  };
  for (bool overlaps : {true, false}) {
    model::Hardware hw = simple_hardware();
    hw.step_seconds = 1e-8;
    hw.overlaps_copies = overlaps;
    for (const plan::Plan& p : plans) {
      SCOPED_TRACE(p.kernel.name + " " + p.config.dump() + (overlaps ? " overlapped" : " serial"));
      model::Schedule s = model::schedule(p, hw, 1 << 20);
      EXPECT_EQ(s.simulated_steps, s.steps_per_core);
      expect_invariants(s);
      model::Prediction m = model::predict(p, hw);
      EXPECT_DOUBLE_EQ(m.seconds, s.prediction.seconds);  // the same simulation, events or not
    }
  }
}

// Copies of an inner loop run at most `buffers` - 1 trips ahead of the compute: the copy of
// trip j waits for the compute of trip j - buffers to free its buffer, and a memory-bound loop
// does use the lookahead it has.
TEST(ModelSchedule, TheBufferCountLimitsHowFarCopiesRunAhead) {
  model::Hardware hw = simple_hardware();
  hw.memory_bytes_per_s = 1e9;  // memory-bound: copies would run ahead if they could
  for (int buffers : {1, 2, 3}) {
    SCOPED_TRACE(buffers);
    model::Schedule s = model::schedule(lower("attention", attention_shapes(1000, 64), attention_config("stream", buffers)), hw, 2);
    expect_invariants(s);
    auto compute_end = [&](int64_t step, int64_t trip) {
      for (const Event& e : s.events)
        if (e.kind == Event::Kind::Compute && e.step == step && e.trip == trip) return e.end;
      ADD_FAILURE() << "no compute for trip " << trip;
      return 0.0;
    };
    int ahead = 0;  // copies that start while the trip before theirs still computes
    for (const Event& e : s.events) {
      if (e.kind != Event::Kind::Copy || e.trip < 0) continue;
      if (e.trip >= buffers) {
        EXPECT_GE(e.start, compute_end(e.step, e.trip - buffers) - 1e-15);
      }
      if (e.trip >= 1 && e.start < compute_end(e.step, e.trip - 1)) ++ahead;
    }
    if (buffers == 1) {
      EXPECT_EQ(ahead, 0);
    } else {
      EXPECT_GT(ahead, 0);
    }
  }
}

TEST(ModelSchedule, AStreamWaitsForItsFirstBlockInEveryOuterStepAndAResidentLoopDoesNot) {
  model::Hardware hw = simple_hardware();
  model::Schedule stream = model::schedule(lower("attention", attention_shapes(512, 64), attention_config("stream", 2)), hw, 100);
  model::Schedule resident = model::schedule(lower("attention", attention_shapes(512, 64), attention_config("resident", 2)), hw, 100);
  std::set<int64_t> bubbles;
  for (const Event& e : stream.events)
    if (e.kind == Event::Kind::Bubble) {
      EXPECT_EQ(e.trip, 0);
      bubbles.insert(e.step);
    }
  EXPECT_EQ(int64_t(bubbles.size()), stream.steps_per_core);  // every outer block (2 heads x 4 query blocks)
  for (const Event& e : resident.events) EXPECT_NE(e.kind, Event::Kind::Bubble);
  // Resident K and V are copied once per head: twice in all.
  int kv_copies = 0;
  for (const Event& e : resident.events)
    if (e.kind == Event::Kind::Copy && resident.operands[size_t(e.operand)] == "k") ++kv_copies;
  EXPECT_EQ(kv_copies, 2);
}

TEST(ModelSchedule, ABigGridIsExtrapolatedFromItsSteadyState) {
  // 16384 x 4096 and 32768 x 4096 in blocks of 8 x 128: 64k and 128k steps, more than are
  // simulated; the time per step of the steady state carries over, so twice the rows take
  // twice the time (up to the pipeline's fill and drain), and the first steps still show.
  model::Hardware hw = simple_hardware();
  hw.step_seconds = 1e-7;
  config::Json cfg = {{"block_t0", 8}, {"block_t1", 128}, {"num_threads", 1}};
  model::Schedule a = model::schedule(lower("add", {{16384, 4096}, {16384, 4096}}, cfg), hw, 3);
  model::Schedule b = model::schedule(lower("add", {{32768, 4096}, {32768, 4096}}, cfg), hw, 3);
  EXPECT_LT(a.simulated_steps, a.steps_per_core);
  EXPECT_EQ(a.steps, 3);
  EXPECT_NEAR(b.prediction.seconds / a.prediction.seconds, 2.0, 0.01);
  // The steady state is the slower lane per step: three 8 x 128 f32 blocks copied, against
  // the step's fixed cost and its adds.
  expect_invariants(a);
  double per_step = std::max(hw.step_seconds + 8.0 * 128 / 1e11, 3.0 * 8 * 128 * 4 / 1e11);
  EXPECT_NEAR(a.prediction.seconds, per_step * a.steps_per_core, per_step * 4);
}

// The cpu target's traced build (deuteron run --timeline) records every grid step once, on a
// thread of the team, in time order per thread, and computes the same result as the normal
// build, whose source has none of the tracing.
TEST(ModelSchedule, TheTracedCpuKernelRecordsEveryGridStepAndComputesTheSame) {
  const examples::Entry& e = examples::find("add");
  std::vector<Arg> args = e.inputs({67, 301}, DType::f32, 1);  // ragged against the blocks
  driver::Specialized s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "cpu");
  config::Config c;
  c.set("block_t0", 16);
  c.set("block_t1", 128);
  c.set("num_threads", 2);
  plan::Plan p = driver::lower(s, driver::complete(s, c));
  std::string normal = s.backend->emit(p);
  EXPECT_EQ(normal.find("_trace"), std::string::npos);
  driver::Bound traced = driver::bind_args(s, args), plain = driver::bind_args(s, args);
  auto exe = s.backend->compile_traced(p);
  ASSERT_TRUE(exe);
  EXPECT_TRUE(exe->step_times().size() == size_t(p.grid_size()));  // zeros before a run
  exe->run(traced.tensors, traced.scalars);
  s.backend->compile(p)->run(plain.tensors, plain.scalars);
  std::vector<backends::Executable::StepTime> steps = exe->step_times();
  ASSERT_EQ(int64_t(steps.size()), p.grid_size());  // 5 x 3 blocks
  std::map<int, std::vector<backends::Executable::StepTime>> by_thread;
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].step, int64_t(i));
    EXPECT_GE(steps[i].start, 0);
    EXPECT_GE(steps[i].end, steps[i].start);
    EXPECT_GE(steps[i].thread, 0);
    EXPECT_LT(steps[i].thread, 2);
    by_thread[steps[i].thread].push_back(steps[i]);
  }
  for (auto& [thread, list] : by_thread) {  // a thread runs one step at a time
    std::sort(list.begin(), list.end(), [](const auto& x, const auto& y) { return x.start < y.start; });
    for (size_t i = 1; i < list.size(); ++i) EXPECT_GE(list[i].start, list[i - 1].end) << "thread " << thread;
  }
  const Tensor &a = traced.outputs.front(), &b = plain.outputs.front();
  ASSERT_EQ(a.numel(), b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.get(i), b.get(i));
}

TEST(Model, StepOverheadBoundsTinyBlocks) {
  plan::Plan p = lower("add", {{64, 128}, {64, 128}}, {{"block_t0", 1}, {"block_t1", 1}, {"num_threads", 1}});
  model::Hardware hw = simple_hardware();
  hw.step_seconds = 1e-6;
  model::Prediction m = model::predict(p, hw);
  EXPECT_EQ(m.bound, model::Bound::StepOverhead);
  EXPECT_NEAR(m.overhead_seconds, 64.0 * 128 * 1e-6, 1e-9);
}

// A looped reduction (reduce_r0 below the row) runs its passes over the whole row in each grid
// step. softmax's three passes (max, sum, out) move x once and out once, as the persistent form
// does, while the rows fit fast memory, and recompute what each pass needs (the exponentials of
// the sum, again for the output); when the rows do not fit, the later two passes read x again.
TEST(Model, ALoopedReductionMovesItsWholeRowAndRereadsItOnlyWhenItDoesNotFit) {
  std::vector<std::vector<int64_t>> shapes = {{64, 1000}};
  model::Hardware hw = simple_hardware();
  auto with = [&](int64_t reduce) {
    return model::predict(lower("softmax", shapes, {{"block_rows", 4}, {"reduce_r0", reduce}, {"num_threads", 1}}), hw);
  };
  model::Prediction whole = with(1024), looped = with(256);
  EXPECT_NEAR(looped.bytes, whole.bytes, whole.bytes * 0.03);  // the looped rows end in a whole block
  EXPECT_GT(looped.flops, whole.flops);
  hw.fast_memory_bytes = 1024;  // a 4 x 1024 f32 row block no longer fits
  model::Prediction reread = with(256);
  double x_bytes = 64.0 * 1024 * 4;  // rows padded to whole blocks of 256
  EXPECT_NEAR(reread.bytes - looped.bytes, 2 * x_bytes, x_bytes * 0.01);
}

// Short rows cost a memory segment each: a block of 64 x 4 over a 64 x 1024 array is 64 runs,
// one of 64 x 1024 is one.
TEST(Model, EveryShortRowOfABlockPaysTheSegmentCost) {
  model::Hardware hw = simple_hardware();
  hw.segment_seconds = 1e-8;
  auto time = [&](int64_t cols) {
    return model::predict(lower("add", {{64, 1024}, {64, 1024}}, {{"block_t0", 64}, {"block_t1", cols}, {"num_threads", 1}}), hw)
        .seconds;
  };
  double narrow = time(4), whole = time(1024);
  // 256 blocks x 3 arrays x 64 rows against 3 arrays x 1 run.
  EXPECT_NEAR(narrow - whole, (256.0 * 3 * 64 - 3) * hw.segment_seconds, 3 * 64 * hw.segment_seconds);
}

}  // namespace
}  // namespace deuteron
