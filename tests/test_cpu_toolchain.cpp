// The CPU target's toolchain: disk cache, CPU detection, compiling and loading kernels.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "backends/cpu/compiler.h"
#include "backends/cpu/hardware.h"
#include "deuteron/error.h"
#include "runtime/disk_cache.h"

namespace fs = std::filesystem;
using namespace deuteron;
using namespace deuteron::cpu;

namespace {

// Each test gets an empty cache directory through $DEUTERON_CACHE_DIR.
class CpuToolchain : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* var : {"DEUTERON_CACHE_DIR", "XDG_CACHE_HOME"}) {
      const char* v = std::getenv(var);
      saved_.emplace_back(var, v ? std::optional<std::string>(v) : std::nullopt);
    }
    std::string tmpl = (fs::temp_directory_path() / "deuteron-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    setenv("DEUTERON_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    for (const auto& [var, v] : saved_) {
      if (v) {
        setenv(var.c_str(), v->c_str(), 1);
      } else {
        unsetenv(var.c_str());
      }
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Temporary files the cache left behind (there should be none).
  int leftovers() const {
    int n = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir_))
      n += e.path().filename().string().find(".tmp-") != std::string::npos;
    return n;
  }

  fs::path dir_;
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

const char* kAddSource = R"(extern "C" int deuteron_test_add(int a, int b) { return a + b; }
)";

}  // namespace

TEST_F(CpuToolchain, CacheRootFollowsEnvironment) {
  EXPECT_EQ(cache_root(), dir_);
  unsetenv("DEUTERON_CACHE_DIR");
  setenv("XDG_CACHE_HOME", (dir_ / "xdg").c_str(), 1);
  EXPECT_EQ(cache_root(), dir_ / "xdg" / "deuteron");
  EXPECT_TRUE(fs::is_directory(dir_ / "xdg" / "deuteron"));  // created on demand
}

TEST_F(CpuToolchain, AtomicWriteAndRead) {
  fs::path p = dir_ / "sub" / "file.bin";
  EXPECT_EQ(read_file(p), std::nullopt);
  std::string bytes("a\0b\nc", 5);
  atomic_write(p, bytes);
  EXPECT_EQ(read_file(p), bytes);
  atomic_write(p, "second");
  EXPECT_EQ(read_file(p), "second");
  EXPECT_EQ(leftovers(), 0);

  // A path under a regular file cannot be written: the error names the path.
  fs::path bad = p / "child";
  try {
    atomic_write(bad, "x");
    FAIL() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos) << e.what();
  }
}

TEST_F(CpuToolchain, HashHex) {
  std::string h = hash_hex("deuteron");
  EXPECT_EQ(h.size(), 32u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(h, hash_hex("deuteron"));
  EXPECT_NE(h, hash_hex("deuteroN"));
  EXPECT_EQ(hash_hex(""), "99aa06d3014798d86001c324468d497f");  // XXH3-128 reference value
}

TEST_F(CpuToolchain, CpuInfoIsSane) {
  const CpuInfo& info = cpu_info();
  EXPECT_GE(info.cores, 1);
  EXPECT_GT(info.l1d_bytes, 0);
  EXPECT_GT(info.l2_bytes, 0);
  EXPECT_GT(info.l3_bytes, 0);
  EXPECT_EQ(info.simd_bytes, info.avx512f ? 64 : 32);
  EXPECT_FALSE(info.features_key.empty());
  if (info.avx512bw) {
    EXPECT_TRUE(info.avx512f);
  }
  EXPECT_EQ(&info, &cpu_info());
}

// Generated code learns the L1D size from the compile (deuteron_gemm.h's K chunk follows it), so
// the size is part of the flags and of every cache key built from them.
TEST_F(CpuToolchain, FlagsCarryTheL1dSize) {
  const std::vector<std::string> flags = default_flags();
  const std::string want = "-DDT_L1D_BYTES=" + std::to_string(cpu_info().l1d_bytes);
  EXPECT_NE(std::find(flags.begin(), flags.end(), want), flags.end()) << want;
}

// GCC keeps generated loops whole (no copy or fill split out into memcpy/memset); clang has no
// such pass and would reject the flag.
TEST_F(CpuToolchain, GccKeepsGeneratedLoopsWhole) {
  const std::vector<std::string> flags = default_flags();
  const bool kept =
      std::find(flags.begin(), flags.end(), "-fno-tree-loop-distribute-patterns") != flags.end();
  EXPECT_EQ(kept, is_gcc(default_compiler())) << compiler_identity(default_compiler());
  EXPECT_FALSE(is_gcc("clang++")) << "clang would reject the flag";
  EXPECT_FALSE(is_gcc("/nonexistent/deuteron-no-compiler")) << "no compiler: no flag, and no throw";
}

// bf16 products widen to f32 where the CPU's pair instruction (vdpbf16ps) is measured slower than
// its f32 FMA and there are no AMX tiles, and only there.
TEST_F(CpuToolchain, Bf16ProductsWidenWherePairsAreSlower) {
  const CpuInfo& info = cpu_info();
  const double speedup = bf16_pair_speedup();
  if (!info.avx512_bf16) {
    EXPECT_EQ(speedup, 0.0);
  } else {
    // Two products a lane per instruction: from about half the FMA's flop rate (Intel Xeons) to
    // twice it (Zen 4).
    EXPECT_GT(speedup, 0.2);
    EXPECT_LT(speedup, 8.0);
  }
  if (!info.amx) EXPECT_EQ(bf16_pairs_pay(), speedup > 1.0);
  const std::vector<std::string> flags = default_flags();
  bool widen = std::find(flags.begin(), flags.end(), "-DDT_GEMM_WIDEN_BF16") != flags.end();
  EXPECT_EQ(widen, info.avx512_bf16 && !bf16_pairs_pay());
}

TEST_F(CpuToolchain, CompilesLoadsAndCaches) {
  int before = compiler_invocations();
  CompileResult r = compile_and_load("add", kAddSource);
  EXPECT_TRUE(r.compiled);
  EXPECT_GT(r.compile_seconds, 0);
  EXPECT_EQ(compiler_invocations(), before + 1);
  EXPECT_TRUE(fs::exists(r.source_path));
  EXPECT_EQ(r.so_path.parent_path(), dir_ / "cpu");
  EXPECT_EQ(r.so->path(), r.so_path);
  auto add = r.so->function<int(int, int)>("deuteron_test_add");
  EXPECT_EQ(add(2, 3), 5);

  CompileResult again = compile_and_load("add", kAddSource);
  EXPECT_FALSE(again.compiled);
  EXPECT_EQ(compiler_invocations(), before + 1);
  EXPECT_EQ(again.so_path, r.so_path);
  EXPECT_EQ(again.so->function<int(int, int)>("deuteron_test_add")(40, 2), 42);
  EXPECT_EQ(leftovers(), 0);

  // Other flags are another kernel.
  CompileOptions o2;
  o2.flags.push_back("-DDEUTERON_TEST_VARIANT=1");
  CompileResult other = compile_and_load("add", kAddSource, o2);
  EXPECT_TRUE(other.compiled);
  EXPECT_NE(other.so_path, r.so_path);
}

TEST_F(CpuToolchain, MissingSymbolNamesSymbolAndPath) {
  CompileResult r = compile_and_load("add", kAddSource);
  try {
    r.so->symbol("no_such_kernel");
    FAIL() << "expected RuntimeError";
  } catch (const RuntimeError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("no_such_kernel"), std::string::npos) << what;
    EXPECT_NE(what.find(r.so_path.string()), std::string::npos) << what;
  }
}

TEST_F(CpuToolchain, SyntaxErrorReportsCompilerOutputAndSource) {
  try {
    compile_and_load("broken", "extern \"C\" int f() { return undeclared_thing_42; }\n");
    FAIL() << "expected CompileError";
  } catch (const CompileError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("undeclared_thing_42"), std::string::npos) << what;
    EXPECT_NE(what.find((dir_ / "cpu" / "broken-").string()), std::string::npos) << what;
  }
  EXPECT_EQ(leftovers(), 0);
}

TEST_F(CpuToolchain, IncludeDirEditInvalidatesCache) {
  fs::path inc = dir_ / "inc";
  atomic_write(inc / "value.h", "#define DEUTERON_VALUE 7\n");
  CompileOptions opt;
  opt.include_dirs = {inc.string()};
  const char* src = "#include \"value.h\"\nextern \"C\" int value() { return DEUTERON_VALUE; }\n";
  CompileResult a = compile_and_load("value", src, opt);
  EXPECT_EQ(a.so->function<int()>("value")(), 7);
  atomic_write(inc / "value.h", "#define DEUTERON_VALUE 1234\n");
  CompileResult b = compile_and_load("value", src, opt);
  EXPECT_TRUE(b.compiled);
  EXPECT_EQ(b.so->function<int()>("value")(), 1234);
}

TEST_F(CpuToolchain, PrecompiledHeaderIsBuiltOnceAndUsed) {
  fs::path header = dir_ / "inc" / "common.h";
  atomic_write(header,
               "#pragma once\n#include <cstdint>\n"
               "inline int64_t deuteron_twice(int64_t x) { return 2 * x; }\n");
  CompileOptions opt;
  opt.precompiled_header = header.string();
  int before = compiler_invocations();
  // The kernels do not include the header themselves: it is force-included.
  CompileResult a = compile_and_load(
      "pch_a", "extern \"C\" int64_t a(int64_t x) { return deuteron_twice(x); }\n", opt);
  EXPECT_EQ(compiler_invocations(), before + 2);  // the PCH, then the kernel
  EXPECT_EQ(a.so->function<int64_t(int64_t)>("a")(21), 42);
  int gch = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "cpu"))
    gch += e.path().filename() == "common.h.gch";
  EXPECT_EQ(gch, 1);

  CompileResult b = compile_and_load(
      "pch_b", "extern \"C\" int64_t b(int64_t x) { return deuteron_twice(x) + 1; }\n", opt);
  EXPECT_EQ(compiler_invocations(), before + 3);  // the PCH is reused
  EXPECT_EQ(b.so->function<int64_t(int64_t)>("b")(1), 3);
  EXPECT_EQ(leftovers(), 0);
}

TEST_F(CpuToolchain, ConcurrentCompilesOfOneKernelBothSucceed) {
  // A source no earlier test or run has compiled.
  std::string token = std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  std::string src = "extern \"C\" long deuteron_token() { return " + token + "L; }\n";
  CompileResult results[2];
  std::string errors[2];
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      try {
        results[i] = compile_and_load("concurrent", src);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(errors[i], "");
    ASSERT_TRUE(results[i].so);
    EXPECT_EQ(results[i].so->function<long()>("deuteron_token")(), std::stol(token));
  }
  EXPECT_EQ(results[0].so_path, results[1].so_path);
  EXPECT_EQ(leftovers(), 0);
}

TEST_F(CpuToolchain, TimeoutKillsTheCompiler) {
  // A "compiler" that answers --version and then hangs.
  fs::path cc = dir_ / "slowcc";
  atomic_write(cc, "#!/bin/sh\n[ \"$1\" = --version ] && { echo slowcc 1.0; exit 0; }\nsleep 30\n");
  fs::permissions(cc, fs::perms::owner_all);
  CompileOptions opt;
  opt.compiler = cc.string();
  opt.timeout_s = 0.5;
  auto t0 = std::chrono::steady_clock::now();
  try {
    compile_and_load("slow", kAddSource, opt);
    FAIL() << "expected CompileError";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
}
