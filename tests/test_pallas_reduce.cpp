// Looped reductions on the pallas target: a reduction whose block (reduce_<axis>) does not cover
// its dim runs as loops over the dim's blocks inside the kernel, unrolled at trace time over an
// operand block that holds the whole dim (runs against the references: test_pallas_loops.cpp,
// LoopedReductions). Here the VMEM estimate and the errors behind the choice. And gathers as a
// config choice (gather_<tensor>): a one-hot select, or reads at indices copied into SMEM.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
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

namespace hl = deuteron::hl;

namespace deuteron {
namespace {

using testing_support::ScopedEnv;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

driver::Specialized specialize(const KernelBase& k, const std::vector<Arg>& args) {
  return driver::specialize(k, frontend::describe_args(k, args), "pallas");
}

// ---- the VMEM estimate (no kernel runs) -------------------------------------------------------

pallas::Footprint softmax_footprint(const std::vector<int64_t>& shape, const std::map<std::string, int64_t>& want,
                                    const std::string& chip) {
  const examples::Entry& e = examples::find("softmax");
  std::vector<Arg> args = {Tensor::zeros(shape, DType::f32)};
  driver::Specialized s = specialize(*e.kernel, args);
  plan::Plan p = plan::lower(s.ir, driver::complete(s, testing_support::fit(s, want)), "pallas");
  pallas::fit_blocks(p);
  return pallas::check(p, pallas::tpu_generation(chip));
}

// The operand blocks still hold whole rows; the body's temporaries are one block of the
// reduction, not the row.
TEST(PallasReduceVmem, LoopedTemporariesAreOneBlock) {
  pallas::Footprint persistent = softmax_footprint({13, 1000}, {{"block_rows", 8}}, "v5e");
  pallas::Footprint looped = softmax_footprint({13, 1000}, {{"block_rows", 8}, {"reduce_r0", 128}}, "v5e");
  EXPECT_EQ(looped.operands, persistent.operands);
  EXPECT_LT(looped.temporaries, persistent.temporaries);
  EXPECT_LT(looped.needed(), persistent.needed());
  // Each live value is an 8 x 128 f32 block (4 KiB), a few at once; a whole row block is 32 KiB.
  const int64_t block = 8 * 128 * 4;
  EXPECT_EQ(looped.temporaries % block, 0);
  EXPECT_LE(looped.temporaries, 4 * block);
  EXPECT_GE(persistent.temporaries, 2 * 8 * 1024 * 4);
}

// Softmax rows of 16384 floats in blocks of 32 rows: the operand blocks take 8 MiB of v4's
// 16 MiB, and the temporaries of a whole-row reduction about 4 MiB more; in blocks of 2048
// they are a tenth of that.
TEST(PallasReduceVmem, LoopedTemporariesShrinkLargeRows) {
  pallas::Footprint persistent = softmax_footprint({64, 16384}, {{"block_rows", 32}}, "v4");
  pallas::Footprint looped = softmax_footprint({64, 16384}, {{"block_rows", 32}, {"reduce_r0", 2048}}, "v4");
  EXPECT_EQ(looped.operands, 8 << 20);
  EXPECT_GE(persistent.temporaries, 2 * 32 * 16384 * 4);
  EXPECT_LE(looped.temporaries * 4, persistent.temporaries);
  // And the plan says how the reduction runs (emit --plan).
  ScopedEnv chip("DEUTERON_TPU_GENERATION", "v4");
  const examples::Entry& e = examples::find("softmax");
  driver::Specialized s = specialize(*e.kernel, {Tensor::zeros({64, 16384}, DType::f32)});
  plan::Plan p = driver::lower(s, testing_support::fit(s, {{"block_rows", 32}, {"reduce_r0", 2048}}));
  EXPECT_TRUE(contains(s.backend->describe(p), "reduction over r0 in 8 blocks of BLOCK_R0")) << s.backend->describe(p);
}

// ---- errors ------------------------------------------------------------------------------------

// The slices of a looped reduction keep the TPU block rule: 64 lanes is refused, naming the fix.
TEST(PallasReduceErrors, BlocksBreakingTheTpuRuleAreConfigErrors) {
  const examples::Entry& e = examples::find("softmax");
  std::vector<Arg> args = e.inputs({130, 300}, DType::f32, 1);
  driver::Specialized s = specialize(*e.kernel, args);
  try {
    driver::lower(s, testing_support::fit(s, {{"block_rows", 8}, {"reduce_r0", 64}}));
    FAIL() << "reduce_r0 = 64 was accepted";
  } catch (const ConfigError& err) {
    EXPECT_TRUE(contains(err.message(), "reduce_r0 = 64")) << err.what();
    EXPECT_TRUE(contains(err.message(), "multiple of 128")) << err.what();
    EXPECT_TRUE(contains(err.hint(), "reduce_r0")) << err.what();
  }
  EXPECT_NO_THROW(driver::lower(s, testing_support::fit(s, {{"block_rows", 8}, {"reduce_r0", 128}})));
}

// Sums of x[M, K, N] over K (an inner loop) and N (a whole dim inside it).
const auto inner_sums = deuteron::kernel("inner_sums", [](hl::Tensor x) {
  auto out = hl::empty({x.size(0)}, x.dtype());
  for (auto tm : hl::tile(x.size(0), {.name = "m"})) {
    auto acc = hl::zeros({tm});
    for (auto tk : hl::tile(x.size(1), {.name = "k"})) acc = acc + x[{tm, tk, hl::all}].sum(2).sum(1);
    out[tm] = acc;
  }
  return out;
});

// A reduction dim split inside an inner loop is not looped (yet): a ConfigError that names
// the persistent block; persistent, the kernel runs.
TEST(PallasReduceErrors, SplitReductionsInsideInnerLoopsAreConfigErrors) {
  std::vector<Arg> args = {Tensor::rand({8, 16, 300}, DType::f32, 2)};
  driver::Specialized s = specialize(inner_sums, args);
  try {
    driver::lower(s, testing_support::fit(s, {{"block_m", 8}, {"block_k", 8}, {"reduce_r0", 128}}));
    FAIL() << "a split reduction dim in an inner loop was accepted";
  } catch (const ConfigError& err) {
    EXPECT_TRUE(contains(err.message(), "reduce_r0 = 128 splits the reduction dim r0 into blocks")) << err.what();
    EXPECT_TRUE(contains(err.message(), "an inner loop computes over it")) << err.what();
    EXPECT_TRUE(contains(err.hint(), "set reduce_r0 to 512 (persistent")) << err.what();
    EXPECT_TRUE(contains(err.where(), "test_pallas_reduce.cpp")) << err.what();
  }
  EXPECT_NO_THROW(driver::lower(s, testing_support::fit(s, {{"block_m", 8}, {"block_k", 8}, {"reduce_r0", 512}})));
}

// ---- gathers ------------------------------------------------------------------------------------

api::RunResult run_cross_entropy(const std::vector<Arg>& args, const std::string& form) {
  const examples::Entry& e = examples::find("cross_entropy");
  driver::Specialized s = specialize(*e.kernel, args);
  config::Config cfg = testing_support::fit(s, {{"block_rows", 128}});
  cfg.set(pallas::keys::gather("logits"), form);
  return api::run(*e.kernel, args, "pallas", cfg);
}

// Both forms on cross_entropy's logits[{tn, labels[tn]}]: 130 rows in blocks of 128, every 7th
// label ignore_index (-100, which the kernel maps to index 0), f32 and bf16.
TEST(PallasGather, BothFormsMatchTheReference) {
  ASSERT_TRUE(pallas::environment_problem().empty()) << pallas::environment_problem();
  const examples::Entry& e = examples::find("cross_entropy");
  for (DType dt : {DType::f32, DType::bf16})
    for (const char* form : {pallas::keys::kOneHot, pallas::keys::kSmem}) {
      std::vector<Arg> args = e.inputs({130, 300}, dt, 21);
      api::RunResult r = run_cross_entropy(args, form);
      Tolerance tol = examples::tolerance_for(e, dt);
      CloseResult close = allclose(r.outputs[0], e.reference(args)[0], tol.rtol, tol.atol);
      EXPECT_TRUE(close.close) << r.config.dump() << ": max abs error " << close.max_abs_err;
      std::optional<std::string> module = read_file(r.exe->source_path);
      ASSERT_TRUE(module.has_value());
      bool smem = std::string(form) == pallas::keys::kSmem;
      EXPECT_EQ(contains(*module, "pltpu.sync_copy(g11_index, g11_index_smem)"), smem) << *module;
      EXPECT_EQ(contains(*module, "jax.lax.fori_loop(0, BLOCK_ROWS, pick_g11, 0)"), smem) << *module;
      EXPECT_EQ(contains(*module, "jnp.moveaxis(logits_ref[...]"), !smem) << *module;
    }
  // The default is the one-hot select.
  driver::Specialized s = specialize(*e.kernel, e.inputs({130, 300}, DType::f32, 21));
  EXPECT_EQ(s.space.default_config().text("gather_logits"), pallas::keys::kOneHot);
}

// A label outside the vocabulary (not ignore_index) makes its row's pick NaN in both forms, so
// the loss is NaN (the cpu target raises instead); never another element.
TEST(PallasGather, OutOfRangeIndicesGiveNaN) {
  ASSERT_TRUE(pallas::environment_problem().empty()) << pallas::environment_problem();
  const examples::Entry& e = examples::find("cross_entropy");
  for (int64_t bad : {int64_t(300), int64_t(-1)})
    for (const char* form : {pallas::keys::kOneHot, pallas::keys::kSmem}) {
      std::vector<Arg> args = e.inputs({130, 300}, DType::f32, 22);
      std::get<Tensor>(args[1]).set(2, double(bad));
      api::RunResult r = run_cross_entropy(args, form);
      EXPECT_TRUE(std::isnan(r.outputs[0].get(0))) << form << " label " << bad << ": loss " << r.outputs[0].get(0);
    }
}

// The SMEM form keeps the indices and picked elements in scratch instead of a one-hot block
// as wide as the vocabulary, which (the vocabulary reduced in blocks) is the largest temporary.
TEST(PallasGather, SmemFormNeedsNoVocabularyWideTemporary) {
  const examples::Entry& e = examples::find("cross_entropy");
  std::vector<Arg> args = e.inputs({256, 32000}, DType::f32, 1);
  driver::Specialized s = specialize(*e.kernel, args);
  auto footprint = [&](const char* form) {
    config::Config cfg = testing_support::fit(s, {{"block_rows", 128}, {"reduce_r1", 512}});
    cfg.set(pallas::keys::gather("logits"), form);
    plan::Plan p = plan::lower(s.ir, driver::complete(s, cfg), "pallas");
    pallas::fit_blocks(p);
    return pallas::vmem_footprint(p, pallas::tpu_generation("v5e"));
  };
  pallas::Footprint one_hot = footprint(pallas::keys::kOneHot), smem = footprint(pallas::keys::kSmem);
  EXPECT_EQ(one_hot.scratch, 0);
  EXPECT_GT(smem.scratch, 0);
  EXPECT_GE(one_hot.temporaries, 128 * 32000 * 4);
  EXPECT_LT(smem.temporaries * 4, 128 * 32000 * 4);
}

}  // namespace
}  // namespace deuteron
