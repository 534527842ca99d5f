// The reliability audit's defects (issue 15), each as its user would meet it: names that try to
// inject code on the cpu and pallas targets, a newline in the cache path, damaged, foreign and
// symlinked artifacts, a cache others can write, `cache clear --all` on a folder that is not
// only Deuteron's, deep JSON, and a parent killed while its compiler or Pallas runner runs.
//
// Most checks run the `deuteron` CLI (built next to this binary) in a fresh process: a damaged
// shared object crashes the process that maps it, and the in-process caches would hide it.
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "backends/pallas/backend.h"
#include "config/config.h"
#include "deuteron/deuteron.h"
#include "driver/driver.h"
#include "runtime/disk_cache.h"
#include "runtime/process.h"
#include "test_support.h"

extern char** environ;

namespace hl = deuteron::hl;
namespace fs = std::filesystem;

namespace deuteron {
namespace {

using testing_support::ScopedEnv;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A fresh cache and temporary directory per test, and the CLI to run against them.
class Reliability : public testing::Test {
 protected:
  void SetUp() override {
    folder_.emplace("deuteron-reliability-");
    dir_ = folder_->path;
    fs::create_directories(dir_ / "tmp");
    cache_.emplace("DEUTERON_CACHE_DIR", (dir_ / "cache").string());
    tmp_.emplace("TMPDIR", (dir_ / "tmp").string());
    effort_.emplace("DEUTERON_AUTOTUNE_EFFORT", "none");
  }
  void TearDown() override {
    effort_.reset();
    tmp_.reset();
    cache_.reset();
    folder_.reset();
  }

  fs::path cache() const { return dir_ / "cache"; }

  static std::string cli() { return (fs::read_symlink("/proc/self/exe").parent_path() / "deuteron").string(); }

  // Runs the CLI with `args`, through sh -c after `shell_prefix` when given ("umask 000;", or
  // a command that runs the CLI as another user).
  static runtime::Captured run_cli(const std::vector<std::string>& args, const std::string& shell_prefix = "") {
    std::vector<std::string> argv = {cli()};
    argv.insert(argv.end(), args.begin(), args.end());
    if (!shell_prefix.empty()) argv.insert(argv.begin(), {"/bin/sh", "-c", shell_prefix + " \"$0\" \"$@\""});
    return runtime::run_captured(argv, 300);
  }
  static bool correct(const runtime::Captured& r) { return r.exit.success() && contains(r.out, "\"correct\":true"); }

  // The only file in cache()/sub whose name ends in `ext`.
  fs::path only(const std::string& sub, const std::string& ext) const {
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator(cache() / sub))
      if (e.path().string().size() >= ext.size() &&
          e.path().string().compare(e.path().string().size() - ext.size(), ext.size(), ext) == 0)
        found.push_back(e.path());
    EXPECT_EQ(found.size(), 1u) << "files ending in " << ext << " in " << (cache() / sub);
    return found.empty() ? fs::path() : found[0];
  }

  std::optional<testing_support::TempFolder> folder_;
  fs::path dir_;
  std::optional<ScopedEnv> cache_, tmp_, effort_;
};

// ---- names that try to inject code ---------------------------------------------------------

struct Injection {
  const char* label;
  std::string name;  // "MARKER" stands for the file the injected code would create
};

// Each would run code at load time if pasted raw into a comment, a docstring or a string:
// `cpu` in the C++ source (a constructor), `py` in the Python module (a statement).
std::vector<Injection> injections() {
  const std::string cpp =
      "extern \"C\" int creat(const char*, unsigned); "
      "__attribute__((constructor)) static void deuteron_injected() { creat(\"MARKER\", 0600); }";
  const std::string py = "open('MARKER', 'w').close()";
  return {
      {"newline", "nl\n" + cpp + "\n" + py + "\n#"},
      {"quotes", "q\"\"\"; " + py + "; \"\"\"'\"'"},
      {"comment_end", "c*/ " + cpp + " /*"},
      {"backslashes", "bs\\\n" + cpp + "\\"},
      {"non_ascii", "na\xc3\xafve\xe2\x88\x91 \xff\xfe bytes that are not UTF-8"},
      {"carriage_return", "cr\r" + py + "\r#"},
  };
}

void PrintTo(const Injection& i, std::ostream* os) { *os << i.label; }

std::string with_marker(std::string s, const fs::path& marker) {
  for (size_t at; (at = s.find("MARKER")) != std::string::npos;) s.replace(at, 6, marker.string());
  return s;
}

class NameInjection : public Reliability, public testing::WithParamInterface<std::tuple<std::string, Injection>> {};

TEST_P(NameInjection, RunsCorrectlyAndRunsNothingInjected) {
  const auto& [target, inj] = GetParam();
  if (target == "pallas") {
    ASSERT_EQ(pallas::environment_problem(), "");
  }
  fs::path marker = dir_ / "injected";
  std::string name = with_marker(inj.name, marker);
  KernelOptions options;
  options.arg_names = {name + " x", "y " + name};
  auto k = deuteron::kernel(
      name,
      [](hl::Tensor x, hl::Tensor y) {
        auto out = hl::empty_like(x);
        for (auto t : hl::tile(out.sizes())) out[t] = x[t] + y[t];
        return out;
      },
      options);
  Tensor x = Tensor::rand({5, 3}, DType::f32, 1), y = Tensor::rand({5, 3}, DType::f32, 2);
  api::RunResult r = api::run(k, {x, y}, target, config::Config());
  ASSERT_EQ(r.outputs.size(), 1u);
  for (int64_t i = 0; i < 15; ++i) EXPECT_FLOAT_EQ(r.outputs[0].get(i), x.get(i) + y.get(i)) << i;
  EXPECT_FALSE(fs::exists(marker)) << "injected code ran; source: " << r.exe->source_path;
}

std::string injection_name(const testing::TestParamInfo<std::tuple<std::string, Injection>>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param).label;
}

INSTANTIATE_TEST_SUITE_P(Names, NameInjection,
                         testing::Combine(testing::Values("cpu", "pallas"), testing::ValuesIn(injections())),
                         injection_name);

// ---- the runner's line protocol --------------------------------------------------------------

TEST_F(Reliability, NewlinesInTheCachePathDoNotReachTheRunnerAsCommands) {
  // The .so's path ends the runner's "kernel" line: raw, the rest would be commands.
  fs::path odd = dir_ / "a b\ninject crash\nc";
  ScopedEnv env("DEUTERON_CACHE_DIR", odd.string());
  runtime::Captured r = run_cli({"tune", "add", "--shape", "5,3", "--max-candidates", "2", "--time-budget", "60",
                                 "--search", "random", "--progress", "quiet", "--json"});
  ASSERT_TRUE(r.exit.success()) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "\"failed\":0")) << r.out;
  EXPECT_FALSE(contains(r.out, "\"ok\":0")) << r.out;
}

// ---- damaged artifacts -----------------------------------------------------------------------

// Damage as the audit found it: a truncated file (SIGBUS in dlopen), zeroed pages (SIGSEGV),
// garbage (SIGILL).
void damage(const fs::path& p, const std::string& how) {
  std::string bytes = slurp(p);
  if (how == "truncated") {
    bytes.resize(bytes.size() / 2);
  } else {
    size_t from = std::min<size_t>(4096, bytes.size() / 4), to = std::min(bytes.size(), from + 8192);
    for (size_t i = from; i < to; ++i) bytes[i] = how == "zeroed" ? '\0' : char((i * 2654435761u) >> 13);
  }
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

class DamagedArtifact : public Reliability, public testing::WithParamInterface<std::string> {};

TEST_P(DamagedArtifact, KernelIsCompiledAgain) {
  ASSERT_TRUE(correct(run_cli({"run", "add", "--shape", "5,3", "--repeat", "1", "--json"})));
  damage(only("cpu", ".so"), GetParam());
  runtime::Captured r = run_cli({"run", "add", "--shape", "5,3", "--repeat", "1", "--json"});
  EXPECT_TRUE(correct(r)) << r.exit.describe() << "\n" << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "compiling it again")) << r.err;
}

TEST_P(DamagedArtifact, PrecompiledHeaderIsBuiltAgain) {
  ASSERT_TRUE(correct(run_cli({"run", "add", "--shape", "5,3", "--repeat", "1", "--json"})));
  fs::path pch;
  for (const auto& e : fs::directory_iterator(cache() / "cpu"))
    if (e.is_directory()) pch = e.path();
  ASSERT_FALSE(pch.empty());
  fs::path gch;
  for (const auto& e : fs::directory_iterator(pch))
    if (e.path().extension() == ".gch") gch = e.path();
  ASSERT_FALSE(gch.empty());
  damage(gch, GetParam());
  // A kernel not compiled yet, so it needs the header.
  runtime::Captured r = run_cli({"run", "softmax", "--shape", "5,3", "--repeat", "1", "--json"});
  EXPECT_TRUE(correct(r)) << r.exit.describe() << "\n" << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "building it again")) << r.err;
}

TEST_P(DamagedArtifact, TunersRunnerIsBuiltAgain) {
  std::vector<std::string> tune = {"tune", "add", "--shape", "5,3", "--max-candidates", "2", "--time-budget", "60",
                                   "--search", "random", "--progress", "quiet", "--retune", "--json"};
  ASSERT_TRUE(run_cli(tune).exit.success());
  fs::path runner;
  for (const auto& e : fs::directory_iterator(cache() / "autotune" / "bin"))
    if (e.path().extension().empty()) runner = e.path();
  ASSERT_FALSE(runner.empty());
  damage(runner, GetParam());
  runtime::Captured r = run_cli(tune);
  ASSERT_TRUE(r.exit.success()) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "\"failed\":0")) << r.out;
  EXPECT_TRUE(contains(r.err, "building it again")) << r.err;
}

TEST_P(DamagedArtifact, PallasModuleIsWrittenAgain) {
  ASSERT_EQ(pallas::environment_problem(), "");
  std::vector<std::string> run = {"run", "add", "--target", "pallas", "--shape", "5,3", "--json"};
  ASSERT_TRUE(correct(run_cli(run)));
  fs::path module = only("pallas", ".py");
  if (GetParam() == "garbage") {
    // Tampered: still valid Python, but it computes something else.
    std::ofstream(module, std::ios::app) << "\n\ndef run(x, y, **kw):\n    return x * 0\n";
  } else {
    damage(module, GetParam());
  }
  runtime::Captured r = run_cli(run);
  EXPECT_TRUE(correct(r)) << r.exit.describe() << "\n" << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "writing it again")) << r.err;
}

INSTANTIATE_TEST_SUITE_P(Kinds, DamagedArtifact, testing::Values("truncated", "zeroed", "garbage"));

TEST_F(Reliability, LibraryFilesInTheCacheAreWrittenAgain) {
  ASSERT_TRUE(correct(run_cli({"run", "add", "--shape", "5,3", "--repeat", "1", "--json"})));
  fs::path header;
  for (const auto& e : fs::recursive_directory_iterator(cache() / "resources"))
    if (e.path().filename() == "deuteron_cpu.h") header = e.path();
  ASSERT_FALSE(header.empty());
  std::ofstream(header, std::ios::app) << "\n#error tampered\n";
  // A kernel not compiled yet, so the compiler reads the header.
  runtime::Captured r = run_cli({"run", "softmax", "--shape", "5,3", "--repeat", "1", "--json"});
  EXPECT_TRUE(correct(r)) << r.exit.describe() << "\n" << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "writing it again")) << r.err;
  EXPECT_FALSE(contains(slurp(header), "tampered"));
}

// ---- who owns the cache ----------------------------------------------------------------------

// A shared object with deuteron_add's entry point that writes 42 everywhere (a 5x3 output), with
// a checksum trailer as Deuteron writes it: only its owner, mode or path can give it away.
void plant_forged_kernel(const fs::path& at, const fs::path& work) {
  fs::path src = work / "forged.cpp", so = work / "forged.so";
  std::ofstream(src) << "extern \"C\" void deuteron_add(void* const* t, const double*, char*, long, long*) {\n"
                        "  for (int i = 0; i < 15; ++i) static_cast<float*>(t[2])[i] = 42;\n}\n";
  runtime::Captured c = runtime::run_captured({"g++", "-shared", "-fPIC", src.string(), "-o", so.string()}, 120,
                                              {.search_path = true, .merge_output = true});
  ASSERT_TRUE(c.exit.success()) << c.out;
  std::string bytes = slurp(so);
  bytes += "\ndeuteron-checksum xxh3-128 " + hash_hex(bytes) + "\n";
  fs::remove(at);
  std::ofstream(at, std::ios::binary) << bytes;
  fs::permissions(at, fs::perms(0700));
}

TEST_F(Reliability, KernelOwnedByAnotherUserIsNotLoaded) {
  std::vector<std::string> run = {"run", "add", "--shape", "5,3", "--repeat", "1", "--json"};
  ASSERT_TRUE(correct(run_cli(run)));
  fs::path so = only("cpu", ".so");
  ASSERT_NO_FATAL_FAILURE(plant_forged_kernel(so, dir_));
  struct passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  if (geteuid() == 0) {
    ASSERT_EQ(::chown(so.c_str(), nobody->pw_uid, nobody->pw_gid), 0);
  } else {
    fs::permissions(so, fs::perms(0777));  // not root: a file others can write stands in for it
  }
  runtime::Captured r = run_cli(run);
  EXPECT_TRUE(correct(r)) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, geteuid() == 0 ? "owned by another user" : "writable by others")) << r.err;
}

TEST_F(Reliability, KernelWritableByOthersIsNotLoaded) {
  std::vector<std::string> run = {"run", "add", "--shape", "5,3", "--repeat", "1", "--json"};
  ASSERT_TRUE(correct(run_cli(run)));
  fs::path so = only("cpu", ".so");
  ASSERT_NO_FATAL_FAILURE(plant_forged_kernel(so, dir_));
  fs::permissions(so, fs::perms(0757));
  runtime::Captured r = run_cli(run);
  EXPECT_TRUE(correct(r)) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "writable by others")) << r.err;
}

TEST_F(Reliability, KernelBehindASymlinkIsNotLoaded) {
  std::vector<std::string> run = {"run", "add", "--shape", "5,3", "--repeat", "1", "--json"};
  ASSERT_TRUE(correct(run_cli(run)));
  fs::path so = only("cpu", ".so");
  ASSERT_NO_FATAL_FAILURE(plant_forged_kernel(dir_ / "elsewhere.so", dir_));
  fs::remove(so);
  fs::create_symlink(dir_ / "elsewhere.so", so);
  runtime::Captured r = run_cli(run);
  EXPECT_TRUE(correct(r)) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "symbolic link")) << r.err;
}

TEST_F(Reliability, CacheFolderOthersCanWriteIsRefused) {
  fs::create_directories(cache());
  fs::permissions(cache(), fs::perms(0777));
  runtime::Captured r = run_cli({"run", "add", "--shape", "5,3", "--repeat", "1", "--json"});
  EXPECT_FALSE(r.exit.success()) << r.out;
  EXPECT_TRUE(contains(r.err, "writable by others")) << r.err;
  EXPECT_TRUE(contains(r.err, "chmod 700")) << r.err;
  EXPECT_FALSE(fs::exists(cache() / "cpu"));
}

TEST_F(Reliability, CacheIsPrivateWhateverTheUmask) {
  ASSERT_TRUE(correct(run_cli({"run", "add", "--shape", "5,3", "--repeat", "1", "--json"}, "umask 000;")));
  ASSERT_TRUE(run_cli({"tune", "add", "--shape", "5,3", "--max-candidates", "1", "--time-budget", "60", "--progress",
                       "quiet"},
                      "umask 000;")
                  .exit.success());
  int checked = 0;
  for (auto it = fs::recursive_directory_iterator(cache()); it != fs::recursive_directory_iterator(); ++it) {
    struct stat st;
    ASSERT_EQ(::lstat(it->path().c_str(), &st), 0);
    if (S_ISDIR(st.st_mode)) EXPECT_EQ(st.st_mode & 0777, 0700u) << it->path();
    else EXPECT_EQ(st.st_mode & 077, 0u) << it->path();
    ++checked;
  }
  struct stat st;
  ASSERT_EQ(::stat(cache().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_GT(checked, 8);
}

// ---- cache clear -----------------------------------------------------------------------------

TEST_F(Reliability, ClearAllRemovesOnlyWhatDeuteronWrote) {
  ASSERT_TRUE(correct(run_cli({"run", "add", "--shape", "5,3", "--repeat", "1", "--json"})));
  std::ofstream(cache() / "precious.txt") << "mine";
  std::ofstream(cache() / "cpu" / "notes.md") << "mine too";
  runtime::Captured r = run_cli({"cache", "clear", "--all"});
  EXPECT_TRUE(r.exit.success()) << r.out << r.err;
  EXPECT_TRUE(fs::exists(cache() / "precious.txt"));
  EXPECT_TRUE(fs::exists(cache() / "cpu" / "notes.md"));
  EXPECT_TRUE(contains(r.out, "precious.txt")) << r.out;
  for (const auto& e : fs::recursive_directory_iterator(cache())) {
    std::string ext = e.path().extension().string();
    EXPECT_TRUE(ext != ".so" && ext != ".cpp" && ext != ".gch") << e.path() << " is left";
  }
}

TEST_F(Reliability, ClearAllLeavesAFolderThatIsNotACache) {
  // Someone's folder, named as the cache by mistake.
  fs::create_directories(cache() / "cpu");
  std::ofstream(cache() / "thesis.tex") << "years of work";
  std::ofstream(cache() / "cpu" / "model.cpp") << "int main() {}";
  runtime::Captured r = run_cli({"cache", "clear", "--all"});
  EXPECT_FALSE(r.exit.success()) << r.out;
  EXPECT_TRUE(contains(r.err, "not known to be a Deuteron cache")) << r.err;
  EXPECT_TRUE(fs::exists(cache() / "thesis.tex"));
  EXPECT_TRUE(fs::exists(cache() / "cpu" / "model.cpp"));
}

TEST_F(Reliability, ClearReportsRemovalsThatFailed) {
  ASSERT_TRUE(correct(run_cli({"run", "add", "--shape", "5,3", "--repeat", "1", "--json"})));
  std::string prefix;
  if (geteuid() == 0) {
    // Root can remove anything: clear as `nobody`, in a cache that is nobody's but for one folder.
    struct passwd* nobody = getpwnam("nobody");
    ASSERT_NE(nobody, nullptr);
    fs::permissions(dir_, fs::perms(0755));
    for (const auto& e : fs::recursive_directory_iterator(cache()))
      ASSERT_EQ(::lchown(e.path().c_str(), nobody->pw_uid, nobody->pw_gid), 0);
    ASSERT_EQ(::chown(cache().c_str(), nobody->pw_uid, nobody->pw_gid), 0);
    ASSERT_EQ(::chown((cache() / "cpu").c_str(), 0, 0), 0);
    fs::permissions(cache() / "cpu", fs::perms(0755));
    prefix = fmt::format("HOME=/ setpriv --reuid={} --regid={} --clear-groups", nobody->pw_uid, nobody->pw_gid);
  } else {
    fs::permissions(cache() / "cpu", fs::perms(0500));
  }
  runtime::Captured r = run_cli({"cache", "clear", "--all"}, prefix);
  fs::permissions(cache() / "cpu", fs::perms(0700));
  EXPECT_FALSE(r.exit.success()) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "could not remove")) << r.err;
  EXPECT_TRUE(contains(r.err, ".so")) << r.err;
}

// ---- files and JSON read back ----------------------------------------------------------------

TEST_F(Reliability, RooflineWithANullFieldIsMeasuredAgain) {
  ASSERT_TRUE(run_cli({"roofline", "--json"}).exit.success());
  fs::path roof;
  for (const auto& e : fs::directory_iterator(cache()))
    if (e.path().filename().string().rfind("roofline-", 0) == 0) roof = e.path();
  ASSERT_FALSE(roof.empty());
  std::string text = slurp(roof);
  size_t at = text.find("\"copy_gbps\": ");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, text.find(',', at) - at, "\"copy_gbps\": null");  // how nlohmann writes NaN
  std::ofstream(roof, std::ios::trunc) << text;
  runtime::Captured r = run_cli({"roofline", "--json"});
  EXPECT_TRUE(r.exit.success()) << r.out << r.err;
  EXPECT_FALSE(contains(slurp(roof), "null"));
}

TEST(ConfigJson, DeepNestingIsAClearError) {
  std::string deep = "{\"block_t0\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}";
  try {
    config::Config::parse(deep);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.message(), "deeper than")) << e.message();
  }
}

TEST(ConfigJson, NumbersOutOfRangeAreAConfigError) {
  EXPECT_THROW(config::Config::parse(R"({"block_t0": 1e400})"), ConfigError);
}

TEST(ConfigJson, ABlockSizeWrittenAsAFloatIsIllegal) {
  auto k = deuteron::kernel("reliability_scale", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto t : hl::tile(out.sizes())) out[t] = x[t] * 2.0;
    return out;
  });
  std::vector<Arg> args = {Tensor::rand({5, 3}, DType::f32, 1)};
  driver::Specialized s = driver::specialize(k, frontend::describe_args(k, args), "cpu");
  try {
    s.space.complete(config::Config::parse(R"({"block_t0": 4.0})"));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.message(), "illegal value 4.0 for 'block_t0'")) << e.message();
    EXPECT_TRUE(contains(e.hint(), "legal values")) << e.hint();
  }
}

// ---- options and environment -------------------------------------------------------------------

struct BadInput {
  const char* label;
  std::vector<std::string> args;
  std::vector<std::pair<const char*, std::string>> env;
  std::string says;  // the error names this (the option or variable)
};

std::vector<BadInput> bad_inputs() {
  std::vector<std::string> run_once = {"run", "add", "--shape", "5,3"};
  std::vector<std::string> run = {"run", "add", "--shape", "5,3", "--repeat", "1"};
  std::vector<std::string> tune = {"tune", "add", "--shape", "5,3", "--effort", "none"};
  auto with = [](std::vector<std::string> base, std::vector<std::string> more) {
    base.insert(base.end(), more.begin(), more.end());
    return base;
  };
  std::vector<BadInput> out = {
      {"empty_shape", {"run", "add", "--shape", "", "--repeat", "1"}, {}, "bad shape ''"},
      {"negative_repeat", with(run_once, {"--repeat", "-1"}), {}, "--repeat"},
      {"zero_repeat", with(run_once, {"--repeat", "0"}), {}, "--repeat"},
      {"zero_paired_copy", with(run_once, {"--paired-copy", "0"}), {}, "--paired-copy"},
      {"too_many_jobs", with(tune, {"--jobs", "1000"}), {}, "--jobs"},
      {"negative_jobs", with(tune, {"--jobs", "-2"}), {}, "--jobs"},
      {"negative_candidates", with(tune, {"--max-candidates", "-1"}), {}, "--max-candidates"},
      {"nan_time_budget", with(tune, {"--time-budget", "nan"}), {}, "--time-budget"},
      {"negative_seed", with(tune, {"--seed", "-1"}), {}, "--seed"},
      {"float_block_size", with(run, {"--config", R"({"block_t0": 4.0})"}), {}, "legal values"},
      {"huge_block_size", with(run, {"--config", R"({"block_t0": 1e400})"}), {}, "out of range"},
      {"compile_timeout", run, {{"DEUTERON_COMPILE_TIMEOUT", "abc"}}, "DEUTERON_COMPILE_TIMEOUT"},
      {"compile_timeout", run, {{"DEUTERON_COMPILE_TIMEOUT", "0.001"}}, "DEUTERON_COMPILE_TIMEOUT"},
      {"tmpdir", run, {{"TMPDIR", "/nonexistent"}}, "TMPDIR"},
  };
  for (std::string v : {"abc", "0", "-1"}) {
    out.push_back({"l2_bytes", run, {{"DEUTERON_L2_BYTES", v}}, "DEUTERON_L2_BYTES"});
    out.push_back({"autotune_seed", run, {{"DEUTERON_AUTOTUNE_SEED", v}, {"DEUTERON_AUTOTUNE_EFFORT", "quick"}},
                   "DEUTERON_AUTOTUNE_SEED"});
    out.push_back({"pallas_timeout", with(run, {"--target", "pallas"}), {{"DEUTERON_PALLAS_TIMEOUT", v}},
                   "DEUTERON_PALLAS_TIMEOUT"});
  }
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](const BadInput& b) {
                             // A seed of 0 is a seed (the default one).
                             return std::string(b.label) == "autotune_seed" && b.env[0].second == "0";
                           }),
            out.end());
  return out;
}

void PrintTo(const BadInput& b, std::ostream* os) {
  *os << b.label;
  for (const auto& [name, value] : b.env) *os << " " << name << "=" << value;
}

class BadOption : public Reliability, public testing::WithParamInterface<BadInput> {};

TEST_P(BadOption, IsAClearErrorNamingIt) {
  const BadInput& b = GetParam();
  std::vector<std::unique_ptr<ScopedEnv>> env;
  for (const auto& [name, value] : b.env) env.push_back(std::make_unique<ScopedEnv>(name, value));
  runtime::Captured r = run_cli(b.args);
  env.clear();
  EXPECT_TRUE(r.exit.exited && r.exit.code != 0) << r.exit.describe() << "\n" << r.out << r.err;
  EXPECT_TRUE(contains(r.err, b.says)) << r.err;
}

std::string bad_input_name(const testing::TestParamInfo<BadInput>& info) {
  std::string value = info.param.env.empty() ? "" : info.param.env[0].second;
  for (char& c : value) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return std::string(info.param.label) + (value.empty() ? "" : "_" + value);
}

INSTANTIATE_TEST_SUITE_P(Cli, BadOption, testing::ValuesIn(bad_inputs()), bad_input_name);

TEST_F(Reliability, NonExecutableVenvPythonIsNamedAsSuch) {
  fs::create_directories(dir_ / "venv" / "bin");
  std::ofstream(dir_ / "venv" / "bin" / "python") << "#!/bin/sh\n";
  fs::permissions(dir_ / "venv" / "bin" / "python", fs::perms(0644));
  ScopedEnv venv("DEUTERON_VENV", (dir_ / "venv").string());
  runtime::Captured r = run_cli({"run", "add", "--target", "pallas", "--shape", "5,3"});
  EXPECT_FALSE(r.exit.success());
  EXPECT_TRUE(contains(r.err, "is not executable")) << r.err;
}

TEST_F(Reliability, FastMathFlagsDrawAWarning) {
  ScopedEnv flags("DEUTERON_CXXFLAGS", "-O2 -ffast-math");
  runtime::Captured r = run_cli({"run", "add", "--shape", "5,3", "--repeat", "1", "--json"});
  EXPECT_TRUE(r.exit.success()) << r.err;
  EXPECT_TRUE(contains(r.err, "-ffast-math")) << r.err;
  EXPECT_TRUE(contains(r.err, "floating-point")) << r.err;
}

// ---- a parent killed mid-work ----------------------------------------------------------------

// Processes below `root` (from /proc), with their command names.
std::vector<std::pair<pid_t, std::string>> descendants(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> all;  // pid, ppid
  std::map<pid_t, std::string> names;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::string n = e.path().filename().string();
    if (n.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = slurp(e.path() / "stat");
    size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (state == "Z") continue;
    all.push_back({pid_t(std::stol(n)), ppid});
    names[pid_t(std::stol(n))] = stat.substr(open + 1, close - open - 1);
  }
  std::vector<std::pair<pid_t, std::string>> out;
  std::vector<pid_t> todo = {root};
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    for (auto [pid, ppid] : all)
      if (ppid == p) {
        out.push_back({pid, names[pid]});
        todo.push_back(pid);
      }
  }
  return out;
}

bool alive(pid_t pid) {
  std::string stat = slurp(fmt::format("/proc/{}/stat", pid));
  size_t close = stat.rfind(')');
  return close != std::string::npos && stat.substr(close + 2, 1) != "Z";
}

// Starts the CLI, waits until a process named `wanted` runs below it (and `ready` holds),
// SIGKILLs the CLI alone, and returns what ran below it then.
std::vector<std::pair<pid_t, std::string>> kill_cli_when(const std::vector<std::string>& args,
                                                         const std::string& wanted,
                                                         const std::function<bool()>& ready) {
  std::vector<std::string> argv = {(fs::read_symlink("/proc/self/exe").parent_path() / "deuteron").string()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  std::vector<std::pair<pid_t, std::string>> below;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool seen = false;
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    below = descendants(pid);
    for (auto& [p, name] : below) seen |= name.rfind(wanted, 0) == 0;
    seen = seen && ready();
  }
  EXPECT_TRUE(seen) << wanted << " never ran below the CLI";
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return below;
}

// Waits up to 10 s for every process in `procs` to end; returns those still alive.
std::vector<std::string> survivors(const std::vector<std::pair<pid_t, std::string>>& procs) {
  std::vector<std::string> left;
  for (int i = 0; i < 500; ++i) {
    left.clear();
    for (auto& [pid, name] : procs)
      if (alive(pid)) left.push_back(fmt::format("{} ({})", pid, name));
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return left;
}

std::vector<std::string> temporaries(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (contains(name, ".tmp-") || name.rfind("deuteron-", 0) == 0 || name.rfind("cc", 0) == 0)
      out.push_back(it->path().string());
  }
  return out;
}

TEST_F(Reliability, KilledMidCompileLeavesNoChildAndNoTemporaryFile) {
  auto below = kill_cli_when({"run", "softmax", "--shape", "5,3", "--repeat", "1"}, "cc1plus", [] { return true; });
  std::vector<std::string> left = survivors(below);
  EXPECT_TRUE(left.empty()) << "still running after the CLI was killed: " << fmt::format("{}", fmt::join(left, ", "));
  // The next use of the cache sweeps what the dead process left.
  ASSERT_TRUE(run_cli({"cache", "list"}).exit.success());
  EXPECT_EQ(temporaries(cache()), std::vector<std::string>{});
  EXPECT_EQ(temporaries(dir_ / "tmp"), std::vector<std::string>{});
}

TEST_F(Reliability, KilledMidPallasRunLeavesNoChildAndNoTemporaryFile) {
  ASSERT_EQ(pallas::environment_problem(), "");
  fs::path tmp = dir_ / "tmp";
  auto inputs_written = [&] { return !fs::is_empty(tmp); };
  auto below = kill_cli_when({"run", "add", "--target", "pallas", "--shape", "5,3"}, "python", inputs_written);
  std::vector<std::string> left = survivors(below);
  EXPECT_TRUE(left.empty()) << "still running after the CLI was killed: " << fmt::format("{}", fmt::join(left, ", "));
  ASSERT_TRUE(run_cli({"cache", "list"}).exit.success());
  EXPECT_EQ(temporaries(tmp), std::vector<std::string>{});
  EXPECT_EQ(temporaries(cache()), std::vector<std::string>{});
}

}  // namespace
}  // namespace deuteron
