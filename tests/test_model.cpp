// The performance model (model/model.h) on hand-checkable cases: the bytes and flops it counts
// against the kernel's own arithmetic, what bounds it, and how placements change what moves.
#include <gtest/gtest.h>

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

TEST(Model, StepOverheadBoundsTinyBlocks) {
  plan::Plan p = lower("add", {{64, 128}, {64, 128}}, {{"block_t0", 1}, {"block_t1", 1}, {"num_threads", 1}});
  model::Hardware hw = simple_hardware();
  hw.step_seconds = 1e-6;
  model::Prediction m = model::predict(p, hw);
  EXPECT_EQ(m.bound, model::Bound::StepOverhead);
  EXPECT_NEAR(m.overhead_seconds, 64.0 * 128 * 1e-6, 1e-9);
}

}  // namespace
}  // namespace deuteron
