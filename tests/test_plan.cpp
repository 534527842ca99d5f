// The lowered plan as every target reads it: structured index maps, placements, ragged edges,
// de-duplicated accesses, carried values, reductions and dots, for a matmul and for flash
// attention. Also the IR verifier and the lowering steps' dump.
#include <cstdlib>
#include <stdexcept>

#include <gtest/gtest.h>

#include "catalogue.h"
#include "deuteron/deuteron.h"
#include "driver/driver.h"
#include "plan/plan.h"
#include "test_kernels.h"

namespace deuteron {
namespace {

namespace hl = deuteron::hl;
using Kind = plan::IndexTerm::Kind;

const config::TargetLimits kLimits = {.cores = 2, .fast_memory_bytes = 2 << 20};

plan::Plan lower(const KernelBase& k, const std::vector<Arg>& args, const std::string& json) {
  auto s = driver::specialize(k, frontend::describe_args(k, args), "cpu", kLimits);
  return driver::lower(s, s.space.complete(config::Config::parse(json)));
}

const plan::BlockSpec& spec_of(const plan::Plan& p, const std::string& tensor, bool store = false) {
  for (const plan::BlockSpec& s : p.operands)
    if (p.kernel.tensors[size_t(s.tensor)].name == tensor && s.store == store) return s;
  throw std::runtime_error("no block spec for " + tensor);
}

int axis_named(const plan::Plan& p, const std::string& name) {
  for (size_t a = 0; a < p.kernel.axes.size(); ++a)
    if (p.kernel.axes[a].name == name) return int(a);
  return -1;
}

const auto matmul = test_kernels::tiled_matmul("plan_matmul");

TEST(Plan, MatmulIndexMapsPlacementsAndEdges) {
  Tensor x = Tensor::rand({100, 70}, DType::f32, 1), y = Tensor::rand({70, 64}, DType::f32, 2);
  plan::Plan p = lower(matmul, {x, y},
                       R"({"block_t0": 32, "block_t1": 32, "block_t2": 16, "inner_t2_arg0": "stream",
                           "buffers_t2": 2, "inner_t2_arg1": "resident"})");
  int m = axis_named(p, "t0"), n = axis_named(p, "t1"), k = axis_named(p, "t2");
  ASSERT_GE(m, 0);
  ASSERT_GE(k, 0);
  // Ragged edges: 100 % 32 and 70 % 16 leave partial last blocks; 64 % 32 does not.
  EXPECT_TRUE(p.partial[size_t(m)]);
  EXPECT_FALSE(p.partial[size_t(n)]);
  EXPECT_TRUE(p.partial[size_t(k)]);

  const plan::BlockSpec& a = spec_of(p, "arg0");
  ASSERT_EQ(a.index_map.size(), 2u);
  EXPECT_EQ(a.index_map[0].kind, Kind::Block);
  EXPECT_EQ(a.index_map[0].axis, m);
  EXPECT_TRUE(a.index_map[0].grid);
  EXPECT_EQ(a.index_map[1].kind, Kind::Block);
  EXPECT_EQ(a.index_map[1].axis, k);
  EXPECT_FALSE(a.index_map[1].grid);
  EXPECT_EQ(a.index_map[1].loop, p.kernel.axes[size_t(k)].loop);
  EXPECT_EQ(a.block_shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(a.placement, plan::Placement::Staged);
  EXPECT_EQ(a.buffers, 2);
  EXPECT_EQ(a.elements, 32 * 16);

  const plan::BlockSpec& b = spec_of(p, "arg1");
  EXPECT_EQ(b.index_map[0].axis, k);
  EXPECT_EQ(b.index_map[1].axis, n);
  EXPECT_EQ(b.placement, plan::Placement::Resident);
  EXPECT_EQ(b.elements, 70 * 32);  // the whole K extent of one N block

  const plan::BlockSpec& out = spec_of(p, "out0", true);
  EXPECT_EQ(out.placement, plan::Placement::InPlace);
  EXPECT_EQ(out.index_map[0].axis, m);
  EXPECT_EQ(out.index_map[1].axis, n);

  // One dot accumulating in place into the carried accumulator.
  ASSERT_EQ(p.dots.size(), 1u);
  EXPECT_EQ(p.dots[0].a.load_op, a.op);
  EXPECT_EQ(p.dots[0].b.load_op, b.op);
  ASSERT_EQ(p.carried.size(), 1u);
  EXPECT_EQ(p.carried[0].phi, p.dots[0].acc_phi);
  EXPECT_EQ(p.carried[0].dot, p.dots[0].op);
  EXPECT_TRUE(p.materialized[size_t(p.carried[0].phi)]);
  ASSERT_EQ(p.inner_loops.size(), 1u);
  EXPECT_EQ(p.inner_loops[0].loop, p.kernel.axes[size_t(k)].loop);

  // The printer renders the maps.
  std::string text = plan::print(p);
  EXPECT_NE(text.find("index map (t0, t2)"), std::string::npos) << text;
  EXPECT_NE(text.find("partial last block (masked) along: t0, t2"), std::string::npos) << text;
}

TEST(Plan, FlashAttentionInnerLoopOperandsAndCarriedValues) {
  const examples::Entry& e = examples::find("attention");
  auto args = e.inputs({1, 2, 40, 16}, DType::f32, 3);  // [B, H, S, D]
  plan::Plan p = lower(*e.kernel, args, R"({"inner_kv": "resident"})");
  int kv = -1;
  for (const plan::InnerLoop& il : p.inner_loops) kv = p.kernel.loops[size_t(il.loop)].axes[0];
  ASSERT_GE(kv, 0);
  ASSERT_EQ(p.inner_loops.size(), 1u);
  EXPECT_EQ(p.inner_loops[0].placement, plan::Placement::Resident);

  // q is read once per grid step, in place; k and v per key block, resident (the loop's choice
  // applies to both, since the config sets neither itself).
  const plan::BlockSpec& q = spec_of(p, "q");
  EXPECT_EQ(q.loop, p.kernel.grid_loop_id());
  EXPECT_EQ(q.placement, plan::Placement::InPlace);
  EXPECT_EQ(q.index_map[3].kind, Kind::Whole);
  for (const char* name : {"k", "v"}) {
    const plan::BlockSpec& s = spec_of(p, name);
    EXPECT_EQ(s.placement, plan::Placement::Resident) << name;
    EXPECT_EQ(s.index_map[0].kind, Kind::Block);
    EXPECT_TRUE(s.index_map[0].grid);
    EXPECT_EQ(s.index_map[2].kind, Kind::Block) << name;
    EXPECT_EQ(s.index_map[2].axis, kv) << name;
    EXPECT_FALSE(s.index_map[2].grid);
    EXPECT_EQ(s.index_map[3].kind, Kind::Whole);
  }
  // m_i, l_i and acc are carried around the key loop; acc is the second dot's accumulator.
  EXPECT_EQ(p.carried.size(), 3u);
  ASSERT_EQ(p.dots.size(), 2u);
  int accumulated = 0;
  for (const plan::CarriedValue& cv : p.carried) accumulated += cv.dot >= 0;
  EXPECT_EQ(accumulated, 1);
  // The row max and row sum reduce over the key block, in one block each.
  EXPECT_EQ(p.reductions.size(), 2u);
  for (const plan::Reduction& r : p.reductions) EXPECT_EQ(r.axis, kv);
}

TEST(Plan, RepeatedAccessesShareOneSpec) {
  static const auto twice = deuteron::kernel("plan_twice", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto t : hl::tile(x.size(0))) out[t] = x[t] * x[t] + x[t];
    return out;
  });
  Tensor x = Tensor::rand({33}, DType::f32, 4);
  plan::Plan p = lower(twice, {x}, "{}");
  int loads = 0, distinct = 0;
  for (size_t i = 0; i < p.operands.size(); ++i)
    if (!p.operands[i].store) {
      ++loads;
      distinct += p.operands[i].first == int(i);
    }
  EXPECT_GE(loads, 1);
  EXPECT_EQ(distinct, 1);
}

TEST(Plan, VerifierRejectsBrokenIr) {
  Tensor a = Tensor::rand({3, 11}, DType::f32, 5), b = Tensor::rand({11, 3}, DType::f32, 6);
  auto s = driver::specialize(matmul, frontend::describe_args(matmul, {a, b}), "cpu");
  ir::Kernel k = s.ir;
  EXPECT_NO_THROW(ir::verify(k));
  ir::Kernel bad = k;
  for (ir::Op& op : bad.ops)
    if (!op.inputs.empty()) {
      op.inputs[0] = int(bad.values.size()) + 5;
      break;
    }
  EXPECT_THROW(ir::verify(bad), std::logic_error);
  bad = k;
  bad.loops[0].parent = 3;
  EXPECT_THROW(ir::verify(bad), std::logic_error);
}

TEST(Plan, DumpShowsEveryStep) {
  Tensor x = Tensor::rand({100, 70}, DType::f32, 1), y = Tensor::rand({70, 64}, DType::f32, 2);
  ::setenv("DEUTERON_DUMP_PLAN", "1", 1);
  testing::internal::CaptureStderr();
  lower(matmul, {x, y}, "{}");
  std::string dump = testing::internal::GetCapturedStderr();
  ::unsetenv("DEUTERON_DUMP_PLAN");
  for (const char* step : {"choose_blocks", "lay_out_grid", "find_dots", "group_bodies", "choose_inner_loops",
                           "build_block_specs", "place_values"})
    EXPECT_NE(dump.find(std::string("after ") + step), std::string::npos) << step;
}

}  // namespace
}  // namespace deuteron
