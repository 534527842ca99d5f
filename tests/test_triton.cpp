// The triton target: every catalogue kernel's module run under Triton's interpreter on the CPU
// (TRITON_INTERPRET=1, torch CPU tensors) at its small ragged shape, with small and with large
// blocks, checked against the double-precision references; the rules that prune configs Triton
// cannot take; and what the module says. The runs need the project's Python environment with
// torch and triton (scripts/setup_python.sh --triton); without it they fail, saying so.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "api/api.h"
#include "autotune/autotune.h"
#include "backends/registry.h"
#include "backends/triton/backend.h"
#include "backends/triton/codegen.h"
#include "catalogue.h"
#include "catalogue_case.h"
#include "config_fit.h"
#include "driver/driver.h"
#include "frontend/tracer.h"
#include "runtime/disk_cache.h"
#include "test_support.h"

namespace deuteron {
namespace {

namespace fs = std::filesystem;
using testing_support::ScopedEnv;

driver::Specialized specialize(const KernelBase& k, const std::vector<Arg>& args) {
  return driver::specialize(k, frontend::describe_args(k, args), "triton");
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string python_problem() {
  return python::environment_problem(triton::runner_spec("interpret"));
}

// Every tile block at `want` (clamped to what its space allows, tl.dot's minimum respected by
// the target's default rules), reductions persistent; the largest block halved while the
// target's rules refuse the config (attention's batch and head blocks multiply its products).
config::Config blocks_at(const driver::Specialized& s, int64_t want) {
  std::map<std::string, int64_t> wish;
  for (const config::Tunable& t : s.space.tunables())
    if (t.kind == config::Tunable::Kind::BlockSize) wish[t.name] = want;
  for (const ir::BlockParam& bp : s.ir.block_params)
    if (bp.reduction && !bp.fixed) wish[bp.name] = bp.max;
  for (int tries = 0;; ++tries) {
    config::Config c = s.backend->adjust_default(s.space, s.space.complete(testing_support::fit(s, wish)), s.ir);
    try {
      driver::lower(s, c);
      return c;
    } catch (const ConfigError& e) {
      if (tries > 20) throw;
      auto largest = wish.end();
      for (auto it = wish.begin(); it != wish.end(); ++it)
        if (!s.ir.block_params.empty() && c.has(it->first) && (largest == wish.end() || c.integer(it->first) > c.integer(largest->first)))
          if (std::none_of(s.ir.block_params.begin(), s.ir.block_params.end(),
                           [&](const ir::BlockParam& bp) { return bp.reduction && bp.name == it->first; }))
            largest = it;
      if (largest == wish.end()) throw;
      largest->second = c.integer(largest->first) / 2;
    }
  }
}

struct RunCase {
  std::string kernel;
  DType dtype;
  int64_t blocks;  // the block wished for every tiled dim
};

std::string run_case_name(const testing::TestParamInfo<RunCase>& info) {
  return fmt::format("{}_{}_blocks{}", info.param.kernel, dtype_name(info.param.dtype), info.param.blocks);
}
void PrintTo(const RunCase& c, std::ostream* os) { *os << run_case_name({c, 0}); }

std::vector<RunCase> run_cases() {
  std::vector<RunCase> out;
  for (const examples::Entry& e : examples::catalogue()) {
    out.push_back({e.name, DType::f32, 16});
    out.push_back({e.name, DType::f32, 128});
    for (DType dt : e.dtypes)
      if (dt == DType::bf16) out.push_back({e.name, dt, 32});
  }
  return out;
}

// Runs under Triton's interpreter, in the project's Python environment.
template <class Case>
class Interpreted : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string problem = python_problem();
    ASSERT_TRUE(problem.empty()) << problem;
  }
  ScopedEnv device_{"DEUTERON_TRITON_DEVICE", "interpret"};
};

// Runs `e` on the triton target with `cfg`, checking every output against the reference.
api::RunResult run_checked(const examples::Entry& e, const std::vector<Arg>& args, const config::Config& cfg) {
  api::RunResult r = api::run(*e.kernel, args, "triton", cfg);
  std::vector<Tensor> want = e.reference(args);
  EXPECT_EQ(r.outputs.size(), want.size());
  for (size_t i = 0; i < want.size() && i < r.outputs.size(); ++i) {
    Tolerance tol = examples::tolerance_for(e, r.outputs[i].dtype());
    CloseResult close = allclose(r.outputs[i], want[i], tol.rtol, tol.atol);
    EXPECT_TRUE(close.close) << "config " << r.config.dump() << ": output " << i << " max abs error "
                             << close.max_abs_err << ", " << close.num_bad << " elements off";
  }
  return r;
}

// Integer scalar arguments keep every bit on the triton target too (JSON integers to the
// runner, Python ints to the kernel): 2^53 + 1 and 6364136223846793005, at 1 and 37 elements.
class TritonScalars : public testing::Test {
 protected:
  void SetUp() override {
    std::string problem = python_problem();
    ASSERT_TRUE(problem.empty()) << problem;
  }
  ScopedEnv device_{"DEUTERON_TRITON_DEVICE", "interpret"};
};
TEST_F(TritonScalars, Int64ScalarsKeepEveryBit) {
  static const auto k = deuteron::kernel("add_int_scalar", [](hl::Tensor x, hl::Scalar s) {
    auto out = hl::empty_like(x);
    for (auto t : hl::tile(x.size(0))) out[t] = x[t] + s;
    return out;
  });
  for (int64_t n : {1, 37}) {
    Tensor x = Tensor::rand({n}, DType::i64, 3, -1000, 1000);
    for (int64_t s : {(int64_t(1) << 53) + 1, int64_t(6364136223846793005LL)}) {
      api::RunResult r = api::run(k, {x, s}, "triton");
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(r.outputs[0].data_as<int64_t>()[i], x.data_as<int64_t>()[i] + s) << "s " << s << " at " << i;
    }
  }
}

using TritonRun = Interpreted<RunCase>;

TEST_P(TritonRun, MatchesReference) {
  const RunCase& c = GetParam();
  const examples::Entry& e = examples::find(c.kernel);
  std::vector<Arg> args = e.inputs(e.small_shape, c.dtype, 5);
  driver::Specialized s = specialize(*e.kernel, args);
  config::Config cfg = blocks_at(s, c.blocks);
  api::RunResult r = run_checked(e, args, cfg);
  EXPECT_EQ(r.origin, "given");
  ASSERT_TRUE(r.exe);
  std::optional<std::string> module = read_file(r.exe->source_path);
  ASSERT_TRUE(module.has_value()) << r.exe->source_path;
  EXPECT_TRUE(contains(*module, "@triton.jit")) << *module;
}

INSTANTIATE_TEST_SUITE_P(Catalogue, TritonRun, testing::ValuesIn(run_cases()), run_case_name);

// ---- looped reductions ------------------------------------------------------------------------

// A reduction whose block (reduce_<axis>) does not cover its dim: loops over the dim's blocks,
// accumulating, and recomputes what uses the reduced values block by block in later loops.
// (TritonRun covers each kernel's persistent reduction.)
struct ShapedCase {
  std::string name;
  std::string kernel;
  std::vector<int64_t> shape;
  DType dtype;
  std::map<std::string, int64_t> blocks;
  std::vector<std::string> shows;  // text the module must hold
};
void PrintTo(const ShapedCase& c, std::ostream* os) { *os << c.name; }

std::vector<ShapedCase> looped_cases() {
  const std::string eight = "for i_r0 in tl.range(0, 8):";  // 1000 columns in blocks of 128, the last of 104
  return {
      {"softmax_f32", "softmax", {13, 1000}, DType::f32, {{"block_rows", 8}, {"reduce_r0", 128}},
       {eight, "mask_r0 = offs_r0 < 1000", "tl.maximum(", "# amax over r0 block by block (8 blocks of BLOCK_R0, the last one partial)"}},
      {"softmax_bf16", "softmax", {13, 1000}, DType::bf16, {{"block_rows", 8}, {"reduce_r0", 128}}, {eight}},
      {"softmax_one_row", "softmax", {1, 300}, DType::f32, {{"block_rows", 1}, {"reduce_r0", 128}},
       {"for i_r0 in tl.range(0, 3):"}},
      // 17 columns in blocks of 16: the last block holds one element.
      {"softmax_last_block_of_one", "softmax", {5, 17}, DType::f32, {{"block_rows", 4}, {"reduce_r0", 16}},
       {"for i_r0 in tl.range(0, 2):", "mask_r0 = offs_r0 < 17"}},
      {"softmax_decomposed_f32", "softmax_decomposed", {13, 1000}, DType::f32, {{"block_rows", 8}, {"reduce_r0", 256}},
       {"for i_r0 in tl.range(0, 4):"}},
      {"batch_softmax_f32", "batch_softmax", {3, 5, 300}, DType::f32, {{"block_batch", 2}, {"block_rows", 4}, {"reduce_r0", 128}},
       {"for i_r0 in tl.range(0, 3):"}},
      {"layer_norm_f32", "layer_norm", {13, 1000}, DType::f32, {{"block_rows", 8}, {"reduce_r0", 256}},
       {"for i_r0 in tl.range(0, 4):"}},
      {"layer_norm_bf16", "layer_norm", {13, 1000}, DType::bf16, {{"block_rows", 8}, {"reduce_r0", 256}},
       {"for i_r0 in tl.range(0, 4):"}},
      {"rms_norm_f32", "rms_norm", {13, 1000}, DType::f32, {{"block_rows", 16}, {"reduce_r0", 128}}, {eight}},
      {"rms_norm_bf16", "rms_norm", {13, 1000}, DType::bf16, {{"block_rows", 16}, {"reduce_r0", 128}}, {eight}},
      // 130 rows (every 7th label ignore_index), a vocabulary of 300 in 3 blocks of 128, and the
      // 130 labels counted in 3 blocks of 64.
      {"cross_entropy_f32", "cross_entropy", {130, 300}, DType::f32,
       {{"block_rows", 32}, {"reduce_r0", 64}, {"reduce_r1", 128}}, {"for i_r0 in tl.range(0, 3):", "for i_r1 in tl.range(0, 3):"}},
      {"cross_entropy_bf16", "cross_entropy", {130, 300}, DType::bf16,
       {{"block_rows", 32}, {"reduce_r0", 64}, {"reduce_r1", 128}}, {"for i_r1 in tl.range(0, 3):"}},
  };
}

// The module a run compiled, checked to hold each of `shows`.
std::optional<std::string> module_showing(const api::RunResult& r, const std::vector<std::string>& shows) {
  std::optional<std::string> module = r.exe ? read_file(r.exe->source_path) : std::nullopt;
  for (const std::string& part : shows) EXPECT_TRUE(module && contains(*module, part)) << part << "\n" << module.value_or("");
  return module;
}

// A case's kernel, inputs, specialization and config (its blocks fitted to the space).
class TritonShaped : public Interpreted<ShapedCase> {
 protected:
  const ShapedCase& c = GetParam();
  const examples::Entry& e = examples::find(c.kernel);
  std::vector<Arg> args = e.inputs(c.shape, c.dtype, 11);
  driver::Specialized s = specialize(*e.kernel, args);
  config::Config cfg = testing_support::fit(s, c.blocks);
};

class TritonLooped : public TritonShaped {};

TEST_P(TritonLooped, MatchesReference) {
  plan::Plan p = driver::lower(s, cfg);
  ASSERT_TRUE(std::any_of(p.reductions.begin(), p.reductions.end(), [](const plan::Reduction& r) { return !r.persistent; }))
      << cfg.dump() << " keeps every reduction persistent";
  api::RunResult r = run_checked(e, args, cfg);
  std::optional<std::string> module = module_showing(r, c.shows);
  ASSERT_TRUE(module.has_value());
  // The rows' offsets do not change from block to block of r0: defined once, before the loops.
  size_t first = module->find("offs_rows = ");
  EXPECT_NE(first, std::string::npos) << *module;
  EXPECT_EQ(module->find("offs_rows = ", first + 1), std::string::npos) << *module;
  EXPECT_EQ(s.backend->emit(driver::lower(s, r.config)), *module) << "the same plan gives the same text";
}

INSTANTIATE_TEST_SUITE_P(LoopedReductions, TritonLooped, testing::ValuesIn(looped_cases()),
                         [](const testing::TestParamInfo<ShapedCase>& i) { return i.param.name; });

// ---- tensor descriptors ----------------------------------------------------------------------

// pointers = descriptor: accesses through tl.make_tensor_descriptor (Triton 3.9 removed block
// pointers: tl.make_block_ptr raises NotImplementedError, on the GPU and in the interpreter),
// made before the inner loops that use them. Rows of 16-byte multiples (what TMA takes), ragged
// blocks (the descriptor pads loads with zeros and clips stores).
std::vector<ShapedCase> descriptor_cases() {
  const std::string made = "= tl.make_tensor_descriptor(";
  return {
      {"matmul", "matmul", {70, 48, 40}, DType::f32, {{"block_m", 32}, {"block_n", 32}, {"block_k", 32}},
       {made, "x_desc.load([pid_m * BLOCK_M, i_k * BLOCK_K])", "out0_desc.store(", "triton.set_allocator("}},
      {"softmax", "softmax", {13, 100}, DType::f32, {{"block_rows", 8}}, {made, "x_desc.load([pid_rows * BLOCK_ROWS, 0])"}},
      {"softmax_looped", "softmax", {13, 1000}, DType::f32, {{"block_rows", 8}, {"reduce_r0", 128}},
       {"x_desc.load([pid_rows * BLOCK_ROWS, i_r0 * BLOCK_R0])"}},
      {"attention", "attention", {1, 2, 37, 16}, DType::f32, {{"block_batch", 1}, {"block_head", 1}, {"block_q", 16}, {"block_kv", 16}},
       {"k_desc.load([pid_batch, pid_head, i_kv * BLOCK_KV, 0])", "out0_desc.store("}},
  };
}

class TritonDescriptors : public TritonShaped {};

TEST_P(TritonDescriptors, MatchesReference) {
  cfg.set(triton::keys::kPointers, "descriptor");
  api::RunResult r = run_checked(e, args, cfg);
  std::optional<std::string> module = module_showing(r, c.shows);
  ASSERT_TRUE(module.has_value());
  EXPECT_FALSE(contains(*module, "tl.load(")) << "every access takes a descriptor\n" << *module;
  cfg.set(triton::keys::kPointers, "plain");
  EXPECT_FALSE(contains(s.backend->emit(driver::lower(s, cfg)), "descriptor")) << "plain pointers by default";
}

INSTANTIATE_TEST_SUITE_P(Pointers, TritonDescriptors, testing::ValuesIn(descriptor_cases()),
                         [](const testing::TestParamInfo<ShapedCase>& i) { return i.param.name; });

// ---- what the module says ---------------------------------------------------------------------

class TritonEmit : public testing::Test {
 protected:
  std::string emit(const std::string& kernel, const std::map<std::string, config::Json>& set = {}) {
    const examples::Entry& e = examples::find(kernel);
    std::vector<Arg> args = e.inputs(e.small_shape, DType::f32, 5);
    driver::Specialized s = specialize(*e.kernel, args);
    config::Config c = blocks_at(s, 32);
    for (const auto& [k, v] : set) c.set(k, v);
    return s.backend->emit(driver::lower(s, s.space.complete(c)));
  }
};

TEST_F(TritonEmit, NamesItsConfigAndSourceLinesAndIsStable) {
  std::string m = emit("matmul");
  EXPECT_EQ(m, emit("matmul")) << "the same plan gives the same text";
  EXPECT_TRUE(contains(m, "# config: {")) << m;
  EXPECT_TRUE(contains(m, "matmul.cpp:")) << "comments name the kernel's source lines\n" << m;
  EXPECT_TRUE(contains(m, "for i_k in tl.range(0, ")) << m;
  EXPECT_TRUE(contains(m, "num_stages=NUM_STAGES")) << m;
  EXPECT_TRUE(contains(m, "tl.dot(")) << m;
  EXPECT_TRUE(contains(m, "input_precision=\"ieee\"")) << m;
  EXPECT_TRUE(contains(m, "mask=")) << "130 rows in blocks of 32: the last one is masked\n" << m;
  EXPECT_FALSE(contains(m, "in_group")) << "flat order by default\n" << m;
}

// Rows that are not a multiple of 16 bytes (x: 67 floats) cannot take a descriptor: those
// accesses keep plain pointers, the others (y, out0: 100 floats) take one.
TEST_F(TritonEmit, UnalignedRowsKeepPlainPointers) {
  std::string m = emit("matmul", {{triton::keys::kPointers, "descriptor"}});
  EXPECT_TRUE(contains(m, "tl.load(x_ptr + ")) << m;
  EXPECT_FALSE(contains(m, "x_desc")) << m;
  EXPECT_TRUE(contains(m, "y_desc = tl.make_tensor_descriptor(y_ptr, shape=[67, 100], strides=[100, 1], "
                          "block_shape=[BLOCK_K, BLOCK_N])")) << m;
  EXPECT_TRUE(contains(m, "out0_desc.store(")) << m;
}

TEST_F(TritonEmit, GroupedOrderingIsAConfigChoice) {
  std::string m = emit("matmul", {{"grid_group", 4}});
  EXPECT_TRUE(contains(m, "in_group = pid % ")) << m;
  EXPECT_TRUE(contains(m, "grouped 4 at a time along ")) << m;
}

TEST_F(TritonEmit, AtomicAddsAndGathers) {
  std::string m = emit("cross_entropy", {{"block_rows", 16}});
  EXPECT_TRUE(contains(m, "tl.atomic_add(out0_ptr")) << m;
  EXPECT_TRUE(contains(m, "tl.load(logits_ptr + offs_rows * 1000 + v")) << "the gather adds the label's column\n" << m;
  EXPECT_TRUE(contains(m, ", mask=mask_rows, other=0)")) << "130 rows in blocks of 16\n" << m;
}

TEST_F(TritonEmit, CarriedValuesOfFlashAttention) {
  std::string m = emit("attention_causal");
  EXPECT_TRUE(contains(m, "carried by the loop over kv")) << m;
  EXPECT_TRUE(contains(m, "tl.range(0, tl.cdiv(")) << "the causal bound is computed on the device\n" << m;
}

// ---- configs Triton cannot take are pruned, naming the rule -----------------------------------

class TritonRules : public testing::Test {
 protected:
  void expect_refused(const std::string& kernel, const std::map<std::string, config::Json>& set, const std::string& rule) {
    const examples::Entry& e = examples::find(kernel);
    std::vector<Arg> args = e.inputs(e.small_shape, DType::f32, 5);
    driver::Specialized s = specialize(*e.kernel, args);
    config::Config c = blocks_at(s, 32);
    for (const auto& [k, v] : set) c.set(k, v);
    try {
      driver::lower(s, s.space.complete(c));
      ADD_FAILURE() << kernel << " " << c.dump() << " was accepted";
    } catch (const ConfigError& err) {
      EXPECT_TRUE(contains(err.what(), rule)) << err.what();
      EXPECT_TRUE(contains(err.what(), "triton:")) << err.what();
    }
  }
};

TEST_F(TritonRules, DotBlocksBelowSixteen) { expect_refused("matmul", {{"block_m", 8}}, "tl.dot needs blocks of at least 16"); }

// rms_norm_bwd keeps a value over the reduced dim for a later group: no loop over its blocks
// can run that; the persistent reduction does.
TEST_F(TritonRules, LoopedReductionsThatKeepAValueOverTheDim) {
  expect_refused("rms_norm_bwd", {{"reduce_r0", 64}}, "is carried by a loop");
}

TEST_F(TritonRules, RegistersOfCarriedValues) {
  expect_refused("matmul", {{"block_m", 128}, {"block_n", 128}, {"num_warps", 1}}, "registers per thread");
}

TEST_F(TritonRules, SharedMemoryOfDotOperands) {
  expect_refused("matmul", {{"block_m", 128}, {"block_n", 128}, {"block_k", 128}, {"num_stages", 4}, {"num_warps", 16}},
                 "shared memory");
}

TEST_F(TritonRules, DefaultsAreLegal) {
  for (const examples::Entry& e : examples::catalogue()) {
    driver::Specialized s = specialize(*e.kernel, e.inputs(e.small_shape, DType::f32, 5));
    EXPECT_NO_THROW(driver::lower(s, s.space.default_config())) << e.name << " " << s.space.default_config().dump();
  }
}

// Inner loops read in place whatever a placement key says, so the space has none: the tuner
// would spend tries on configs that give the same module.
TEST(TritonSpace, HasNoInnerLoopPlacementKeys) {
  for (const char* kernel : {"matmul", "attention", "softmax_two_pass"}) {
    const examples::Entry& e = examples::find(kernel);
    driver::Specialized s = specialize(*e.kernel, e.inputs(e.small_shape, DType::f32, 5));
    EXPECT_TRUE(s.space.find(triton::keys::kNumStages)) << kernel << " has inner loops";
    for (const config::Tunable& t : s.space.tunables()) {
      EXPECT_FALSE(t.name.starts_with("inner_")) << kernel << ": " << t.name;
      EXPECT_FALSE(t.name.starts_with("buffers_")) << kernel << ": " << t.name;
    }
    EXPECT_FALSE(s.space.default_config().has("inner_k") || s.space.default_config().has("inner_kv")) << kernel;
    EXPECT_NO_THROW(driver::lower(s, s.space.default_config())) << kernel;
  }
}

// ---- where it runs ----------------------------------------------------------------------------

TEST(TritonDevice, WithoutAGpuItSaysSoUnlessInterpreting) {
  ASSERT_TRUE(python_problem().empty()) << python_problem();
  ScopedEnv device("DEUTERON_TRITON_DEVICE", "auto");
  ScopedEnv interpret("TRITON_INTERPRET", std::nullopt);
  const auto& b = static_cast<const triton::TritonBackend&>(backends::get("triton"));
  const examples::Entry& e = examples::find("add");
  std::vector<Arg> args = e.inputs(e.small_shape, DType::f32, 5);
  driver::Specialized s = specialize(*e.kernel, args);
  plan::Plan p = driver::lower(s, s.space.default_config());
  if (b.device().gpu) {  // a GPU machine: it runs there
    EXPECT_NO_THROW(b.compile(p));
    return;
  }
  EXPECT_TRUE(contains(b.device_note(), "no GPU visible to torch")) << b.device_note();
  try {
    b.compile(p);
    ADD_FAILURE() << "compiled for a GPU that is not there";
  } catch (const CompileError& err) {
    EXPECT_TRUE(contains(err.what(), "needs a GPU, and none is present")) << err.what();
    EXPECT_TRUE(contains(err.what(), "--interpret")) << err.what();
  }
}

TEST(TritonDevice, MissingPythonEnvironmentIsAClearError) {
  ScopedEnv venv("DEUTERON_VENV", "/nonexistent/venv");
  ScopedEnv device("DEUTERON_TRITON_DEVICE", "interpret");
  const examples::Entry& e = examples::find("add");
  driver::Specialized s = specialize(*e.kernel, e.inputs(e.small_shape, DType::f32, 5));
  try {
    s.backend->compile(driver::lower(s, s.space.default_config()));
    ADD_FAILURE() << "compiled without a Python environment";
  } catch (const CompileError& err) {
    EXPECT_TRUE(contains(err.what(), "setup_python.sh --triton")) << err.what();
  }
}

// ---- tuning ----------------------------------------------------------------------------------

// The tuner's target interface end to end under the interpreter: the runner's --serve worker
// runs each candidate (samples of interpreter time), writes its outputs into the tuner's arena,
// where they are checked against the reference, and the best config is cached under the
// device it was timed on.
TEST(TritonAutotune, HarnessTimesChecksAndCaches) {
  ASSERT_TRUE(python_problem().empty()) << python_problem();
  ScopedEnv device("DEUTERON_TRITON_DEVICE", "interpret");
  const examples::Entry& e = examples::find("softmax");
  std::vector<Arg> args = e.inputs({13, 100}, DType::f32, 3);
  driver::Specialized s = specialize(*e.kernel, args);
  config::Config small = blocks_at(s, 2), large = blocks_at(s, 16);
  ASSERT_NE(small, large);
  fs::remove_all(cache_root() / "autotune" / "softmax");
  autotune::clear_memory_cache();
  autotune::TuneOptions o;
  o.progress = "quiet";
  o.warm_start = false;
  o.search = "random";
  o.args = args;
  o.reference = e.reference;
  o.candidates = {small, large};
  o.max_candidates = 3;
  o.time_budget_s = 120;
  o.run_timeout_s = 60;
  o.sample_s = 0.01;
  o.retime_s = 0.02;
  autotune::TuneResult r = autotune::tune(s, o);
  EXPECT_FALSE(r.from_cache);
  EXPECT_GE(r.ok, 2) << "the default and the two candidates, unless one equals the default";
  for (const autotune::Candidate& c : r.candidates)
    if (c.config == small || c.config == large) {
      EXPECT_EQ(c.status, autotune::Candidate::Status::Ok) << c.config.dump() << ": " << c.reason;
      EXPECT_GT(c.median_s, 0) << c.config.dump();
    }
  ASSERT_TRUE(fs::exists(r.cache_path));
  EXPECT_TRUE(contains(*read_file(r.cache_path), "interpreter on the CPU")) << "the entry names the device";
  autotune::clear_memory_cache();
  EXPECT_TRUE(autotune::tune(s, o).from_cache);
}

}  // namespace
}  // namespace deuteron
