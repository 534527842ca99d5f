// The layer Python-based targets share (backends/python): the .npy exchange, the narrowing of
// int64 tensors, and the module executable as the pallas target uses it (where it runs, what
// the module receives).
#include <cstdint>
#include <filesystem>
#include <limits>

#include <gtest/gtest.h>

#include "api/api.h"
#include "backends/pallas/backend.h"
#include "backends/python/npy.h"
#include "backends/python/runner.h"
#include "backends/registry.h"
#include "catalogue.h"
#include "driver/driver.h"
#include "runtime/disk_cache.h"
#include "test_support.h"

namespace hl = deuteron::hl;

namespace deuteron {
namespace {

namespace fs = std::filesystem;

using testing_support::ScopedEnv;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(PythonNpy, RoundTripsEveryDtype) {
  fs::path dir = fs::temp_directory_path() / ("deuteron-npy-" + unique_suffix());
  fs::create_directories(dir);
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean}) {
    Tensor t = Tensor::rand({3, 5}, dt, 2, 0.0, 4.0);
    python::write_npy(dir / "t.npy", t);
    python::NpyArray a = python::read_npy(dir / "t.npy");
    EXPECT_EQ(a.descr, python::npy_descr(dt));
    EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 5}));
    Tensor back = Tensor::empty({3, 5}, dt);
    python::copy_npy_into(a, back, "t.npy");
    for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(back.get(i), t.get(i)) << dtype_name(dt) << " at " << i;
    EXPECT_EQ((fs::file_size(dir / "t.npy") - size_t(t.nbytes())) % 64, 0u);  // header padded to 64 bytes
  }
  EXPECT_THROW(
      python::copy_npy_into(python::read_npy(dir / "t.npy"), Tensor::empty({5, 3}, DType::boolean), "t"),
      RuntimeError);
  fs::remove_all(dir);
}

Tensor int64s(std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  Tensor t = Tensor::empty(std::move(shape), DType::i64);
  for (size_t i = 0; i < values.size(); ++i) t.data_as<int64_t>()[i] = values[i];
  return t;
}

// TPUs have no 64-bit vectors: int64 tensors go to the module as int32, and a value that
// int32 cannot hold is an error, never a wrap-around.
TEST(PythonRunner, NarrowsInt64ToInt32WithARangeCheck) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max(), kMin = std::numeric_limits<int32_t>::min();
  std::vector<int64_t> fits = {0, 1, -1, 7, kMax, kMin, 123456789, -987654321, 42, 3, 2, 1, -2, -3, 5};
  Tensor t = int64s({3, 5}, fits);
  Tensor n = python::narrow_to_int32(t, "pallas", "gather", "labels");
  ASSERT_EQ(n.dtype(), DType::i32);
  ASSERT_EQ(n.sizes(), t.sizes());
  for (size_t i = 0; i < fits.size(); ++i) EXPECT_EQ(n.data_as<int32_t>()[i], fits[i]) << i;
  // Size 1, and a strided view (the narrowing reads in logical order).
  EXPECT_EQ(python::narrow_to_int32(int64s({1}, {kMin}), "pallas", "k", "t").data_as<int32_t>()[0], kMin);
  Tensor wide = int64s({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor transposed = Tensor::borrow(wide.data(), {3, 2}, DType::i64, {1, 3});
  Tensor nt = python::narrow_to_int32(transposed, "pallas", "k", "t");
  EXPECT_EQ(std::vector<int32_t>(nt.data_as<int32_t>(), nt.data_as<int32_t>() + 6),
            (std::vector<int32_t>{1, 4, 2, 5, 3, 6}));

  for (int64_t bad : {kMax + 1, kMin - 1, int64_t(1) << 40}) {
    std::vector<int64_t> values = fits;
    values[7] = bad;  // flat index 7 = [1, 2]
    values[12] = bad;  // only the first is named
    try {
      python::narrow_to_int32(int64s({3, 5}, values), "pallas", "gather", "labels");
      FAIL() << bad << " was narrowed";
    } catch (const ArgumentError& e) {
      std::string m = e.message();
      EXPECT_TRUE(contains(m, "kernel 'gather'")) << m;
      EXPECT_TRUE(contains(m, "'labels'")) << m;
      EXPECT_TRUE(contains(m, std::to_string(bad) + " at flat index 7 [1, 2]")) << m;
      EXPECT_TRUE(contains(m, "int32")) << m;
      EXPECT_TRUE(contains(e.hint(), "[-2147483648, 2147483647]")) << e.hint();
    }
  }
}

// ---- the module executable, as the pallas target runs it ----------------------------------

class PallasRunner : public testing::Test {
 protected:
  void SetUp() override {
    std::string problem = pallas::environment_problem();
    ASSERT_TRUE(problem.empty()) << problem;
  }
};

const auto twice = deuteron::kernel("twice", [](hl::Tensor idx) {
  auto out = hl::empty_like(idx);
  for (auto t : hl::tile(idx.size(0))) out[t] = idx[t] * 2;
  return out;
});

// A module written by hand (the plan only names the tensors), so that this checks the host
// side alone: the int64 input arrives as int32, the int32 result widens back exactly.
TEST_F(PallasRunner, Int64InputsReachTheModuleAsInt32) {
  constexpr int64_t kHalf = std::numeric_limits<int32_t>::max() / 2;
  std::vector<int64_t> values = {0, -1, kHalf, -kHalf - 1, 12345, 7, -7};
  Tensor idx = int64s({7}, values);
  driver::Specialized s = driver::specialize(twice, frontend::describe_args(twice, {idx}), "cpu");
  plan::Plan p = driver::lower(s, s.space.default_config());
  std::string source =
      "import jax.numpy as jnp\n\n\n"
      "def run(idx, *, interpret=None):\n"
      "    if idx.dtype != jnp.int32:\n"
      "        raise TypeError(f'idx arrived as {idx.dtype}')\n"
      "    return idx * 2\n";
  auto [path, written] = python::cache_module("pallas", "twice", source);
  (void)written;
  python::ModuleExecutable exe(p, path, source, pallas::runner_spec(pallas::default_tpu_generation(), "interpret"),
                               {});
  driver::Bound bound = driver::bind_args(s, {idx});
  exe.run(bound.tensors, bound.scalars);
  const Tensor& out = bound.tensors.at(1);
  ASSERT_EQ(out.dtype(), DType::i64);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(out.data_as<int64_t>()[i], 2 * values[i]) << i;
  EXPECT_EQ(exe.report().value("device", ""), "interpret") << exe.report().dump();

  // One value beyond int32: refused before the runner starts.
  bound.tensors[0].data_as<int64_t>()[3] = int64_t(1) << 33;
  try {
    exe.run(bound.tensors, bound.scalars);
    FAIL() << "2^33 was passed as an int32";
  } catch (const ArgumentError& e) {
    EXPECT_TRUE(contains(e.message(), "8589934592 at flat index 3 [3]")) << e.what();
    EXPECT_TRUE(contains(e.message(), "kernel 'twice'")) << e.what();
  }
}

// Without a TPU the target says so and runs in interpret mode; DEUTERON_PALLAS_DEVICE picks.
// JAX_PLATFORMS=cpu keeps this deterministic on a machine with a TPU too.
TEST_F(PallasRunner, SaysWhereItRuns) {
  ScopedEnv platforms("JAX_PLATFORMS", "cpu");
  const auto& b = dynamic_cast<const pallas::PallasBackend&>(backends::get("pallas"));
  {
    ScopedEnv device("DEUTERON_PALLAS_DEVICE", std::nullopt);
    EXPECT_FALSE(b.device().tpu);
    EXPECT_TRUE(b.simulated());
    EXPECT_EQ(b.device_note().rfind("pallas: no TPU visible to JAX 0.", 0), 0u) << b.device_note();
    EXPECT_TRUE(contains(b.device_note(), "; running in interpret mode on the CPU")) << b.device_note();
    const examples::Entry& e = examples::find("add");
    api::RunResult r = api::run(*e.kernel, e.inputs({9, 130}, DType::f32, 1), "pallas");
    auto* exe = dynamic_cast<python::ModuleExecutable*>(r.exe.get());
    ASSERT_TRUE(exe);
    EXPECT_EQ(exe->report().value("device", ""), "interpret") << exe->report().dump();
  }
  {
    ScopedEnv device("DEUTERON_PALLAS_DEVICE", "interpret");
    EXPECT_TRUE(b.simulated());
    EXPECT_TRUE(contains(b.device_note(), "interpret mode on the CPU (DEUTERON_PALLAS_DEVICE=interpret)"))
        << b.device_note();
  }
  {
    ScopedEnv device("DEUTERON_PALLAS_DEVICE", "tpu");
    try {
      b.device();
      FAIL() << "a TPU was found under JAX_PLATFORMS=cpu";
    } catch (const CompileError& e) {
      EXPECT_TRUE(contains(e.message(), "no TPU visible to JAX")) << e.what();
      EXPECT_TRUE(contains(e.hint(), "rerun by hand")) << e.what();
    }
  }
  {
    ScopedEnv device("DEUTERON_PALLAS_DEVICE", "gpu");
    try {
      b.device();
      FAIL() << "DEUTERON_PALLAS_DEVICE=gpu was accepted";
    } catch (const ArgumentError& e) {
      EXPECT_TRUE(contains(e.what(), "DEUTERON_PALLAS_DEVICE is 'gpu'")) << e.what();
    }
  }
}

}  // namespace
}  // namespace deuteron
