// Inner loops on the pallas target: each strategy (a loop unrolled over resident blocks, a
// nested emit_pipeline, a fori_loop with hand-written copies) on attention, softmax_two_pass
// and matmul, and looped reductions (reduce_<axis> below the dim: loops over its blocks inside
// the kernel) on softmax, layer_norm, rms_norm and cross_entropy, at small shapes whose outer
// grid and inner loop both end in a partial block, run
// under TPU interpret mode (races, out-of-bounds reads and uninitialised memory detected) and
// checked against the double-precision references. And the VMEM estimate behind the choice, and
// general modules (one module for any size) with the strategies that stream.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api/api.h"
#include "backends/pallas/backend.h"
#include "backends/pallas/codegen.h"
#include "backends/pallas/hardware.h"
#include "catalogue.h"
#include "config_fit.h"
#include "driver/driver.h"
#include "frontend/tracer.h"
#include "runtime/disk_cache.h"
#include "test_support.h"

namespace deuteron {
namespace {

struct LoopCase {
  std::string kernel;
  std::vector<int64_t> shape;
  DType dtype = DType::f32;
  std::map<std::string, int64_t> blocks;
  config::Json strategy;           // the inner-loop keys: {"inner_kv": "stream", "buffers_kv": 3}
  std::vector<std::string> shows;  // text the module must hold
  std::string name;
};

// Blocks: legal on a TPU (multiples of 8 x 128, or the whole dim), ragged against the shapes.
const std::map<std::string, int64_t> kAttention = {{"block_batch", 1}, {"block_head", 1}, {"block_q", 16}, {"block_kv", 16}};
const std::map<std::string, int64_t> kTwoPass = {{"block_rows", 8}, {"block_n", 128}, {"block_n_out", 128}};
const std::map<std::string, int64_t> kMatmul = {{"block_m", 8}, {"block_n", 128}, {"block_k", 128}};
const std::map<std::string, int64_t> kBatched = {{"block_batch", 2}, {"block_m", 8}, {"block_n", 128}, {"block_k", 32}};

std::vector<LoopCase> loop_cases() {
  using J = config::Json;
  // attention: S = 37 (3 query blocks and 3 key blocks of 16, the last of 5), D = 16.
  const std::vector<int64_t> att = {1, 2, 37, 16};
  return {
      {"attention", att, DType::f32, kAttention, J{{"inner_kv", "resident"}}, {"for i_kv in range(3):"}, "attention_unroll"},
      {"attention", att, DType::f32, kAttention, J{{"inner_kv", "resident"}, {"buffers_kv", 1}},
       {"pipeline_mode=pl.Buffered(1)"}, "attention_unroll_single_buffered"},
      {"attention", att, DType::f32, kAttention, J{{"inner_kv", "stream"}}, {"pltpu.emit_pipeline("}, "attention_pipeline"},
      {"attention", att, DType::bf16, kAttention, J{{"inner_kv", "stream"}, {"buffers_kv", 3}},
       {"pl.Buffered(3)"}, "attention_pipeline_3_buffers_bf16"},
      {"attention", att, DType::f32, kAttention, J{{"inner_kv", "in_place"}, {"buffers_kv", 1}},
       {"jax.lax.fori_loop(", "slot = 0"}, "attention_fori_single"},
      {"attention", att, DType::f32, kAttention, J{{"inner_kv", "in_place"}, {"buffers_kv", 2}},
       {"jax.lax.fori_loop(", "def _prefetch"}, "attention_fori_double"},
      // Causal: the key loop ends at the query block's end, known only on the device.
      {"attention_causal", att, DType::f32, kAttention, J{{"inner_kv", "stream"}},
       {"grid=(pl.cdiv("}, "causal_pipeline"},
      {"attention_causal", att, DType::f32, kAttention, J{{"inner_kv", "in_place"}, {"buffers_kv", 2}},
       {"jax.lax.fori_loop(0, pl.cdiv("}, "causal_fori"},
      // softmax_two_pass: 13 rows (blocks of 8), 300 columns (blocks of 128: the last of 44).
      {"softmax_two_pass", {13, 300}, DType::f32, kTwoPass, J{{"inner_n", "resident"}, {"inner_n_out", "resident"}},
       {"for i_n in range(3):", "for i_n_out in range(3):"}, "two_pass_unroll"},
      {"softmax_two_pass", {13, 300}, DType::f32, kTwoPass, J{{"inner_n", "stream"}, {"inner_n_out", "stream"}},
       {"pltpu.emit_pipeline("}, "two_pass_pipeline"},
      {"softmax_two_pass", {13, 300}, DType::bf16, kTwoPass, J{{"inner_n", "in_place"}, {"inner_n_out", "in_place"}},
       {"def n_out_writes(i, slot):"}, "two_pass_fori_bf16"},
      // matmul: M = 20 (blocks of 8), K = 200 (blocks of 128), N = 130 (blocks of 128).
      {"matmul", {20, 200, 130}, DType::f32, kMatmul, J{{"inner_k", "resident"}}, {"for i_k in range(2):", "jnp.dot("},
       "matmul_unroll"},
      {"matmul", {20, 200, 130}, DType::bf16, kMatmul, J{{"inner_k", "stream"}},
       {"preferred_element_type=jnp.float32", ".astype(jnp.bfloat16)"},
       "matmul_pipeline_bf16"},
      {"matmul", {20, 200, 130}, DType::f32, kMatmul, J{{"inner_k", "in_place"}, {"buffers_k", 2}},
       {"jnp.pad(x, ((0, 4), (0, 56)))"}, "matmul_fori"},
      // Batched products with a batch block of 2 (3 batches: the last block partial).
      {"bmm", {3, 37, 29, 70}, DType::f32, kBatched, J{{"inner_k", "stream"}}, {"jax.lax.dot_general("}, "bmm_batched"},
      {"broadcast_matmul", {3, 37, 29, 70}, DType::bf16, kBatched, J{{"inner_k", "resident"}},
       {"jax.lax.dot_general(", "jnp.broadcast_to("}, "broadcast_matmul_batched_bf16"},
  };
}

// Row blocks legal on a TPU (a multiple of 8 rows, 128 for the 1-D row outputs and labels, or
// all rows); reduction blocks a multiple of 128 that do not divide the dims.
std::vector<LoopCase> reduce_cases() {
  using J = config::Json;
  const std::string loop = "for i_r0 in range(8):",
                    slice = "r0_block = pl.ds(i_r0 * BLOCK_R0, min(BLOCK_R0, 1000 - i_r0 * BLOCK_R0))";
  return {
      // 13 rows in blocks of 8 (the last partial), 1000 columns in 8 blocks of 128 (the last of 104).
      {"softmax", {13, 1000}, DType::f32, {{"block_rows", 8}, {"reduce_r0", 128}}, J{}, {loop, slice}, "softmax_f32"},
      {"softmax", {13, 1000}, DType::bf16, {{"block_rows", 8}, {"reduce_r0", 128}}, J{}, {loop}, "softmax_bf16"},
      // One row, three blocks of 128 (the last of 44).
      {"softmax", {1, 300}, DType::f32, {{"block_rows", 8}, {"reduce_r0", 128}}, J{}, {"for i_r0 in range(3):"},
       "softmax_one_row"},
      {"layer_norm", {13, 1000}, DType::f32, {{"block_rows", 8}, {"reduce_r0", 256}}, J{}, {"for i_r0 in range(4):"},
       "layer_norm_f32"},
      {"layer_norm", {13, 1000}, DType::bf16, {{"block_rows", 8}, {"reduce_r0", 256}}, J{}, {"for i_r0 in range(4):"},
       "layer_norm_bf16"},
      // rstd[M] is 1-D: 13 rows in one block of all rows.
      {"rms_norm", {13, 1000}, DType::f32, {{"block_rows", 16}, {"reduce_r0", 128}}, J{}, {loop}, "rms_norm_f32"},
      {"rms_norm", {13, 1000}, DType::bf16, {{"block_rows", 16}, {"reduce_r0", 128}}, J{}, {loop}, "rms_norm_bf16"},
      // 130 rows in blocks of 128 (every 7th label ignore_index), the vocabulary of 300 in 3
      // blocks of 128, and the 130 labels counted in 2 blocks of 128 (the last of 2).
      {"cross_entropy", {130, 300}, DType::f32, {{"block_rows", 128}, {"reduce_r0", 128}, {"reduce_r1", 128}}, J{},
       {"for i_r0 in range(2):", "for i_r1 in range(3):"}, "cross_entropy_f32"},
      {"cross_entropy", {130, 300}, DType::bf16, {{"block_rows", 128}, {"reduce_r0", 128}, {"reduce_r1", 128}}, J{},
       {"for i_r1 in range(3):"}, "cross_entropy_bf16"},
  };
}

void PrintTo(const LoopCase& c, std::ostream* os) { *os << c.name; }

class PallasLoop : public testing::TestWithParam<LoopCase> {
 protected:
  void SetUp() override {
    std::string problem = pallas::environment_problem();
    ASSERT_TRUE(problem.empty()) << problem;
  }
};

TEST_P(PallasLoop, MatchesReference) {
  const LoopCase& c = GetParam();
  const examples::Entry& e = examples::find(c.kernel);
  std::vector<Arg> args = e.inputs(c.shape, c.dtype, 11);
  driver::Specialized s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "pallas");
  config::Config cfg = testing_support::fit(s, c.blocks);
  for (const auto& [key, value] : c.strategy.items()) cfg.set(key, value);
  api::RunResult r = api::run(*e.kernel, args, "pallas", cfg);
  std::vector<Tensor> want = e.reference(args);
  ASSERT_EQ(r.outputs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    Tolerance tol = examples::tolerance_for(e, c.dtype);
    CloseResult close = allclose(r.outputs[i], want[i], tol.rtol, tol.atol);
    EXPECT_TRUE(close.close) << r.config.dump() << ": max abs error " << close.max_abs_err << " at "
                             << close.worst_index;
  }
  ASSERT_TRUE(r.exe);
  std::optional<std::string> module = read_file(r.exe->source_path);
  ASSERT_TRUE(module.has_value());
  for (const std::string& part : c.shows) EXPECT_NE(module->find(part), std::string::npos) << part << "\n" << *module;
  // A looped reduction over a whole dim slices each block to its length: nothing is masked.
  for (const plan::Reduction& red : driver::lower(s, r.config).reductions) {
    const ir::Axis& axis = s.ir.axes[size_t(red.axis)];
    if (red.persistent || axis.kind != ir::AxisKind::Reduction) continue;
    EXPECT_EQ(module->find(fmt::format("valid_{} =", axis.name)), std::string::npos) << axis.name << "\n" << *module;
  }
  // Stable: lowering the config again gives byte-identical text.
  EXPECT_EQ(s.backend->emit(driver::lower(s, r.config)), *module);
}

auto case_name = [](const testing::TestParamInfo<LoopCase>& i) { return i.param.name; };
INSTANTIATE_TEST_SUITE_P(Strategies, PallasLoop, testing::ValuesIn(loop_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(LoopedReductions, PallasLoop, testing::ValuesIn(reduce_cases()), case_name);

// A loop that ends on the device cannot be unrolled at trace time: the config is refused,
// naming the strategies that can run it.
TEST(PallasLoops, CausalAttentionRefusesResidentOperands) {
  const examples::Entry& e = examples::find("attention_causal");
  std::vector<Arg> args = e.inputs({1, 2, 37, 16}, DType::f32, 3);
  driver::Specialized s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "pallas");
  config::Config cfg = testing_support::fit(s, kAttention);
  cfg.set("inner_kv", "resident");
  try {
    (void)driver::lower(s, driver::complete(s, cfg));
    FAIL() << "a resident causal loop was accepted";
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("computed on the device"), std::string::npos) << err.what();
    EXPECT_NE(err.hint().find("inner_kv"), std::string::npos) << err.hint();
  }
}

// ---- the VMEM estimate (no kernel runs) -------------------------------------------------------

// Attention's arguments at B = 8, H = 32, D = 256, bf16, as shapes only (a 4 GiB tensor is
// not needed to plan it).
std::vector<frontend::ArgSpec> attention_specs(int64_t s) {
  std::vector<frontend::ArgSpec> specs;
  for (const char* name : {"q", "k", "v"}) {
    frontend::ArgSpec a;
    a.dtype = DType::bf16;
    a.shape = {8, 32, s, 256};
    a.strides = {32 * s * 256, s * 256, 256, 1};
    a.name = name;
    specs.push_back(a);
  }
  return specs;
}

// The footprint on v7x of attention at sequence length `s` with the given inner-loop keys, or
// the ConfigError that says why it does not fit.
std::variant<pallas::Footprint, ConfigError> v7x_footprint(int64_t s, const config::Json& strategy) {
  const examples::Entry& e = examples::find("attention");
  driver::Specialized spec = driver::specialize(*e.kernel, attention_specs(s), "pallas");
  config::Config cfg;
  cfg.set("block_q", 512);
  cfg.set("block_kv", 512);
  for (const auto& [key, value] : strategy.items()) cfg.set(key, value);
  plan::Plan p = plan::lower(spec.ir, driver::complete(spec, cfg), "pallas");
  pallas::fit_blocks(p);
  try {
    return pallas::check(p, pallas::tpu_generation("v7x"));
  } catch (const ConfigError& err) {
    return err;
  }
}

TEST(PallasLoops, AttentionVmemOnV7xFollowsTheSequenceLength) {
  using J = config::Json;
  constexpr int64_t MiB = 1024 * 1024;
  // S = 8192: K and V resident (4 MiB each, double-buffered) and streamed both fit 64 MiB.
  auto resident = v7x_footprint(8192, J{{"inner_kv", "resident"}});
  ASSERT_TRUE(std::holds_alternative<pallas::Footprint>(resident)) << std::get<ConfigError>(resident).what();
  EXPECT_EQ(std::get<pallas::Footprint>(resident).operands, 2 * 2 * 8192 * 256 * 2 + 2 * 2 * 512 * 256 * 2);
  auto streamed = v7x_footprint(8192, J{{"inner_kv", "stream"}});
  ASSERT_TRUE(std::holds_alternative<pallas::Footprint>(streamed)) << std::get<ConfigError>(streamed).what();
  EXPECT_EQ(std::get<pallas::Footprint>(streamed).pipelines, 2 * 2 * 512 * 256 * 2);

  // S = 32768: double-buffered resident K and V alone are 64 MiB, all of v7x's VMEM.
  auto big = v7x_footprint(32768, J{{"inner_kv", "resident"}});
  ASSERT_TRUE(std::holds_alternative<ConfigError>(big)) << "a 64 MiB resident K and V fit";
  std::string why = std::get<ConfigError>(big).what();
  EXPECT_NE(why.find("more than its 64.0 MiB of VMEM"), std::string::npos) << why;
  EXPECT_NE(why.find("operand buffers"), std::string::npos) << why;
  EXPECT_NE(std::get<ConfigError>(big).hint().find("inner_kv = stream"), std::string::npos);
  auto big_streamed = v7x_footprint(32768, J{{"inner_kv", "stream"}});
  ASSERT_TRUE(std::holds_alternative<pallas::Footprint>(big_streamed)) << std::get<ConfigError>(big_streamed).what();
  EXPECT_LT(std::get<pallas::Footprint>(big_streamed).needed(), 16 * MiB);
  // Single-buffered resident K and V: 32 MiB of blocks; the estimate decides (and shows why).
  auto single = v7x_footprint(32768, J{{"inner_kv", "resident"}, {"buffers_kv", 1}});
  if (std::holds_alternative<pallas::Footprint>(single))
    EXPECT_EQ(std::get<pallas::Footprint>(single).operands, 2 * 32768 * 256 * 2 + 2 * 2 * 512 * 256 * 2);
  else
    EXPECT_NE(std::string(std::get<ConfigError>(single).what()).find("VMEM"), std::string::npos);
}

// General modules (ahead-of-time builds: generate's `general`): one module, generated at a probe
// shape larger than any block, gives the same text at a second probe and runs every size, size 1
// and sizes no block divides included, with each strategy that streams an inner loop.
TEST(PallasGeneral, OneModuleRunsEverySize) {
  using J = config::Json;
  struct Case {
    std::string kernel;
    std::map<std::string, int64_t> blocks;
    J strategy;
    std::vector<std::vector<int64_t>> probes, sizes;
    std::string name;
  };
  const std::vector<std::vector<int64_t>> mm = {{1, 1, 1}, {20, 200, 130}};  // M, K, N
  const std::vector<Case> cases = {
      {"matmul", kMatmul, J{{"inner_k", "in_place"}, {"buffers_k", 2}}, {{1025, 1027, 1029}, {1027, 1031, 1035}}, mm,
       "matmul_fori_double"},
      {"matmul", kMatmul, J{{"inner_k", "in_place"}, {"buffers_k", 1}}, {{1025, 1027, 1029}, {1027, 1031, 1035}}, mm,
       "matmul_fori_single"},
      {"matmul", kMatmul, J{{"inner_k", "stream"}}, {{1025, 1027, 1029}, {1027, 1031, 1035}}, mm, "matmul_pipeline"},
      {"softmax_two_pass", kTwoPass, J{{"inner_n", "in_place"}, {"inner_n_out", "in_place"}}, {{1025, 1027}, {1027, 1031}},
       {{1, 1}, {13, 300}}, "softmax_two_pass_fori"},
      // A looped reduction: pl.cdiv(E_r0, 128) blocks unrolled at trace time, the last one short.
      {"layer_norm", {{"block_rows", 8}, {"reduce_r0", 128}}, J::object(), {{1025, 1027}, {1027, 1031}},
       {{1, 1}, {13, 300}}, "layer_norm_looped"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const examples::Entry& e = examples::find(c.kernel);
    std::vector<std::string> sources;
    for (const std::vector<int64_t>& probe : c.probes) {
      driver::Specialized s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, e.inputs(probe, DType::f32, 1)), "pallas");
      config::Config cfg = testing_support::fit(s, c.blocks);
      for (const auto& [key, value] : c.strategy.items()) cfg.set(key, value);
      sources.push_back(s.backend->emit_aot(driver::lower(s, cfg), "run", true).source);
    }
    ASSERT_EQ(sources[0], sources[1]) << "the general module follows the probe shape";
    EXPECT_NE(sources[0].find("pl.cdiv(E_"), std::string::npos) << sources[0];
    auto [path, fresh] = python::cache_module("pallas", c.name + "_general", sources[0]);
    for (const std::vector<int64_t>& size : c.sizes) {
      SCOPED_TRACE(fmt::format("size {}", fmt::join(size, "x")));
      std::vector<Arg> args = e.inputs(size, DType::f32, 7);
      driver::Specialized s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "pallas");
      // The plan at this size only lays out the runner's tensors: the module reads their shapes.
      const auto& chip = dynamic_cast<const pallas::PallasBackend&>(*s.backend).generation();
      std::vector<std::string> scalars;
      for (const ir::ScalarParam& sp : s.ir.scalars) scalars.push_back(pallas::python_name(sp.name));
      python::ModuleExecutable exe(driver::lower(s, s.space.default_config()), path, sources[0],
                                   pallas::runner_spec(chip, "interpret"), scalars);
      driver::Bound b = driver::bind_args(s, args);
      exe.run(b.tensors, b.scalars);
      std::vector<Tensor> want = e.reference(args);
      ASSERT_EQ(b.outputs.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        Tolerance tol = examples::tolerance_for(e, DType::f32);
        CloseResult close = allclose(b.outputs[i], want[i], tol.rtol, tol.atol);
        EXPECT_TRUE(close.close) << "max abs error " << close.max_abs_err << " at " << close.worst_index;
      }
    }
  }
}

}  // namespace
}  // namespace deuteron
