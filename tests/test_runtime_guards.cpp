// The runtime's guards, one by one: escaping and encoding (runtime/text), validated environment
// variables (runtime/env), JSON (runtime/json), artifact checksums (runtime/checksum), the
// cache's ownership rules and clearing (runtime/disk_cache), and child processes that mirror
// their program's exit and die with their parent (runtime/process).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "deuteron/error.h"
#include "runtime/checksum.h"
#include "runtime/disk_cache.h"
#include "runtime/env.h"
#include "runtime/json.h"
#include "runtime/process.h"
#include "runtime/text.h"
#include "test_support.h"

namespace fs = std::filesystem;

namespace deuteron {
namespace {

using runtime::decode_field;
using runtime::encode_field;
using runtime::escaped;

using testing_support::ScopedEnv;
using testing_support::TempFolder;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

mode_t mode_of(const fs::path& p) {
  struct stat st;
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

// ---- text ------------------------------------------------------------------------------------

TEST(Text, EscapedIsPrintableAsciiThatCannotEndACommentOrAString) {
  EXPECT_EQ(escaped("softmax"), "softmax");
  EXPECT_EQ(escaped("a\nb\r\tc"), "a\\nb\\r\\tc");
  EXPECT_EQ(escaped("say \"hi\" 'x'"), "say \\\"hi\\\" \\'x\\'");
  EXPECT_EQ(escaped("\"\"\""), "\\\"\\\"\\\"");
  EXPECT_EQ(escaped("*/"), "*/");  // harmless in a line comment, and no block comment is emitted
  EXPECT_EQ(escaped("a\\"), "a\\134");  // never a trailing backslash (a C++ line splice)
  EXPECT_EQ(escaped("na\xc3\xafve"), "na\\303\\257ve");
  EXPECT_EQ(escaped(std::string("\0\x7f", 2)), "\\000\\177");
  for (int c = 0; c < 256; ++c) {
    std::string e = escaped(std::string(1, char(c)));
    for (char x : e) EXPECT_TRUE(x >= 0x20 && x < 0x7f) << c;
    EXPECT_NE(e.back(), '\\') << c;
  }
}

TEST(Text, IdentifiersAndFileStems) {
  EXPECT_EQ(runtime::identifier("softmax"), "softmax");
  EXPECT_EQ(runtime::identifier("a b\n\"c"), "a_b__c");
  EXPECT_EQ(runtime::identifier("1x"), "_1x");
  EXPECT_EQ(runtime::identifier(""), "_");
  EXPECT_EQ(runtime::file_stem("flash-attn v2/../x"), "flash-attn_v2____x");
  EXPECT_EQ(runtime::file_stem(""), "kernel");
  EXPECT_EQ(runtime::file_stem(std::string(100, 'k')).size(), 64u);
}

TEST(Text, FieldsRoundTripAndHoldNoSpaceOrNewline) {
  for (std::string s : {std::string("/plain/path.so"), std::string("/a b\ninject crash\n%41/\xff.so"),
                        std::string("100%"), std::string()}) {
    std::string e = encode_field(s);
    EXPECT_EQ(e.find_first_of(" \n\r\t"), std::string::npos) << e;
    EXPECT_EQ(decode_field(e), s) << e;
  }
  EXPECT_EQ(encode_field("a b%"), "a%20b%25");
  EXPECT_EQ(decode_field("%4"), std::nullopt);
  EXPECT_EQ(decode_field("%zz"), std::nullopt);
}

// ---- environment -----------------------------------------------------------------------------

TEST(Env, ValuesThatDoNotParseAreErrorsNamingTheVariable) {
  unsetenv("DEUTERON_TEST_VALUE");
  EXPECT_EQ(runtime::env_integer("DEUTERON_TEST_VALUE", 0, 10), std::nullopt);
  {
    ScopedEnv v("DEUTERON_TEST_VALUE", "");
    EXPECT_EQ(runtime::env_number("DEUTERON_TEST_VALUE", 0, 10), std::nullopt);
  }
  for (std::string bad : {"abc", "-1", "11", "3.5", "5x", "99999999999999999999"}) {
    ScopedEnv v("DEUTERON_TEST_VALUE", bad);
    try {
      runtime::env_integer("DEUTERON_TEST_VALUE", 0, 10);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ArgumentError& e) {
      EXPECT_NE(e.message().find("DEUTERON_TEST_VALUE='" + bad + "'"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("from 0 to 10"), std::string::npos) << e.message();
    }
  }
  for (std::string bad : {"abc", "0", "-1", "nan", "inf", "1e400", "2x"}) {
    ScopedEnv v("DEUTERON_TEST_VALUE", bad);
    EXPECT_THROW(runtime::env_number("DEUTERON_TEST_VALUE", 0, 100, /*lo_open=*/true), ArgumentError) << bad;
  }
  {
    ScopedEnv v("DEUTERON_TEST_VALUE", "2.5");
    EXPECT_EQ(runtime::env_number("DEUTERON_TEST_VALUE", 0, 100, true), 2.5);
  }
  for (auto [text, bytes] : {std::pair<const char*, int64_t>{"4096", 4096}, {"512K", 512 << 10}, {"2m", 2 << 20}}) {
    ScopedEnv v("DEUTERON_TEST_VALUE", text);
    EXPECT_EQ(runtime::env_bytes("DEUTERON_TEST_VALUE", 4096, int64_t(1) << 40), bytes) << text;
  }
  for (std::string bad : {"abc", "0", "-1", "1024", "5Q", "99999999G"}) {
    ScopedEnv v("DEUTERON_TEST_VALUE", bad);
    EXPECT_THROW(runtime::env_bytes("DEUTERON_TEST_VALUE", 4096, int64_t(1) << 40), ArgumentError) << bad;
  }
}

TEST(Env, TemporaryDirectory) {
  TempFolder t;
  {
    ScopedEnv v("TMPDIR", (t.path / "missing").string());
    EXPECT_EQ(runtime::temp_dir_if_valid(), std::nullopt);
    try {
      runtime::temp_dir();
      FAIL() << "expected RuntimeError";
    } catch (const RuntimeError& e) {
      EXPECT_NE(e.message().find("TMPDIR='" + (t.path / "missing").string() + "'"), std::string::npos);
    }
  }
  ScopedEnv v("TMPDIR", t.path.string());
  mode_t old = ::umask(0);
  fs::path d = runtime::make_temp_dir();
  ::umask(old);
  EXPECT_EQ(d.parent_path(), t.path);
  EXPECT_EQ(d.filename().string().rfind(runtime::kTempDirPrefix, 0), 0u);
  EXPECT_EQ(mode_of(d), 0700u);  // private whatever the umask
}

// ---- JSON ------------------------------------------------------------------------------------

TEST(Json, DepthIsLimitedAndErrorsAreWords) {
  std::string problem;
  EXPECT_TRUE(runtime::parse_json("[[[1]]]", &problem));
  std::string deep = std::string(65, '[') + std::string(65, ']');
  EXPECT_FALSE(runtime::parse_json(deep, &problem));
  EXPECT_NE(problem.find("deeper than 64"), std::string::npos) << problem;
  // Brackets inside strings do not count.
  EXPECT_TRUE(runtime::parse_json("{\"a\": \"" + deep + "\\\"" + deep + "\"}", &problem)) << problem;
  EXPECT_FALSE(runtime::parse_json("[1e400]", &problem));
  EXPECT_NE(problem.find("out of range"), std::string::npos) << problem;
  EXPECT_FALSE(runtime::parse_json("{", &problem));
  EXPECT_NE(problem.find("not valid JSON"), std::string::npos) << problem;
  EXPECT_FALSE(runtime::parse_json("", &problem));
  EXPECT_EQ(problem, "is empty");
}

TEST(Json, FiniteNumbers) {
  nlohmann::json j = {{"a", 1.5}, {"b", nullptr}, {"c", "7"}, {"d", 3}};
  EXPECT_EQ(runtime::finite_number(j, "a"), 1.5);
  EXPECT_EQ(runtime::finite_number(j, "b"), std::nullopt);
  EXPECT_EQ(runtime::finite_number(j, "c"), std::nullopt);
  EXPECT_EQ(runtime::finite_number(j, "d"), 3.0);
  EXPECT_EQ(runtime::finite_number(j, "missing"), std::nullopt);
  EXPECT_EQ(runtime::finite_number(nlohmann::json::array(), "a"), std::nullopt);
}

// ---- checksums -------------------------------------------------------------------------------

TEST(Checksum, SealedArtifactsAreCheckedBeforeUse) {
  TempFolder t;
  fs::path p = t.path / "artifact.bin";
  EXPECT_FALSE(runtime::check_artifact(p).exists);
  std::string body(10000, 'x');
  for (size_t i = 0; i < body.size(); ++i) body[i] = char(i * 31);
  std::ofstream(p, std::ios::binary) << body;
  EXPECT_EQ(runtime::check_artifact(p).problem, "is truncated or damaged (its checksum does not match)");
  runtime::seal_artifact(p, 0700);
  EXPECT_EQ(mode_of(p), 0700u);
  EXPECT_TRUE(runtime::check_artifact(p).ok()) << runtime::check_artifact(p).problem;
  EXPECT_EQ(slurp(p).substr(0, body.size()), body);  // the bytes themselves are unchanged

  std::string sealed = slurp(p);
  auto rewrite = [&](const std::string& bytes) { std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes; };
  rewrite(sealed.substr(0, sealed.size() / 2));
  EXPECT_FALSE(runtime::check_artifact(p).ok());
  std::string zeroed = sealed;
  std::fill(zeroed.begin() + 100, zeroed.begin() + 200, '\0');
  rewrite(zeroed);
  EXPECT_FALSE(runtime::check_artifact(p).ok());
  rewrite("");
  EXPECT_FALSE(runtime::check_artifact(p).ok());
  rewrite(sealed);
  EXPECT_TRUE(runtime::check_artifact(p).ok());

  fs::permissions(p, fs::perms(0722));
  EXPECT_NE(runtime::check_artifact(p).problem.find("writable by others"), std::string::npos);
  fs::permissions(p, fs::perms(0700));
  fs::create_symlink(p, t.path / "link");
  EXPECT_EQ(runtime::check_artifact(t.path / "link").problem, "is a symbolic link");
}

// ---- the cache -------------------------------------------------------------------------------

TEST(Cache, FilesAndFoldersArePrivateWhateverTheUmask) {
  TempFolder t;
  mode_t old = ::umask(0);
  make_private_dirs(t.path / "a" / "b");
  atomic_write(t.path / "a" / "b" / "c" / "file", "x");
  atomic_write(t.path / "prog", "y", 0700);
  ::umask(old);
  for (const char* d : {"a", "a/b", "a/b/c"}) EXPECT_EQ(mode_of(t.path / d), 0700u) << d;
  EXPECT_EQ(mode_of(t.path / "a" / "b" / "c" / "file"), 0600u);
  EXPECT_EQ(mode_of(t.path / "prog"), 0700u);
}

TEST(Cache, FilesAreReadOnlyWhenTheyCanBeTrusted) {
  TempFolder t;
  fs::path p = t.path / "entry.json";
  std::string problem;
  EXPECT_EQ(read_cache_file(p, &problem), std::nullopt);
  EXPECT_EQ(problem, "");  // missing is not a problem
  atomic_write(p, "{}");
  EXPECT_EQ(read_cache_file(p, &problem), "{}");
  fs::permissions(p, fs::perms(0666));
  EXPECT_EQ(read_cache_file(p, &problem), std::nullopt);
  EXPECT_NE(problem.find("writable by others"), std::string::npos) << problem;
  fs::permissions(p, fs::perms(0600));
  fs::create_symlink(p, t.path / "link.json");
  EXPECT_EQ(read_cache_file(t.path / "link.json", &problem), std::nullopt);
  EXPECT_EQ(problem, "it is a symbolic link");
}

TEST(Cache, RootIsMarkedAndStaleTemporariesOfDeadProcessesAreSwept) {
  TempFolder t;
  fs::path root = t.path / "cache";
  ScopedEnv env("DEUTERON_CACHE_DIR", root.string());
  // A process that wrote temporary files and died before renaming them.
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  ::waitpid(dead, nullptr, 0);
  make_private_dirs(root / "cpu");
  fs::path stale = root / "cpu" / fmt::format("k.so.tmp-{}-0-0000abcd", dead);
  fs::path live = root / "cpu" / ("k.so.tmp-" + unique_suffix());  // this process's: alive
  std::ofstream(stale) << "half";
  std::ofstream(live) << "half";
  EXPECT_EQ(cache_root(), root);
  EXPECT_TRUE(fs::exists(root / kCacheMarker));
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
}

TEST(Cache, ClearRemovesOnlyDeuteronsLayout) {
  TempFolder t;
  fs::path root = t.path;
  EXPECT_THROW(clear_cache(root, true), RuntimeError);  // no marker: not known to be a cache
  atomic_write(root / kCacheMarker, "Signature: 8a477f597d28d172789f06886806bc55\n");
  for (const char* f : {"cpu/k-1.so", "cpu/k-1.cpp", "cpu/pch-2/deuteron_cpu.h", "cpu/pch-2/deuteron_cpu.h.gch",
                        "pallas/k-3.py", "autotune/k/4.json", "autotune/k/4.log", "autotune/k/4.lock",
                        "autotune/bin/deuteron-runner-5", "roofline-6.json", "mine.txt", "cpu/notes.md",
                        "autotune/k/readme"})
    atomic_write(root / f, "x");
  fs::create_symlink("/etc/hostname", root / "cpu" / "link.so");

  ClearReport tuned = clear_cache(root, false);
  EXPECT_EQ(tuned.removed, 3);  // the entry's .json, .log and .lock
  EXPECT_TRUE(tuned.failed.empty());
  ASSERT_EQ(tuned.kept.size(), 1u);
  EXPECT_EQ(tuned.kept[0], root / "autotune" / "k" / "readme");
  EXPECT_TRUE(fs::exists(root / "cpu" / "k-1.so"));

  ClearReport all = clear_cache(root, true);
  EXPECT_EQ(all.removed, 7);
  EXPECT_TRUE(all.failed.empty());
  std::set<fs::path> kept(all.kept.begin(), all.kept.end());
  EXPECT_EQ(kept, (std::set<fs::path>{root / "mine.txt", root / "cpu" / "notes.md", root / "cpu" / "link.so",
                                      root / "autotune" / "k" / "readme"}));
  EXPECT_TRUE(fs::exists("/etc/hostname"));
  EXPECT_TRUE(fs::exists(root / kCacheMarker));
  EXPECT_FALSE(fs::exists(root / "pallas"));  // emptied folders of the layout go too
  EXPECT_TRUE(fs::exists(root / "cpu"));      // not empty
}

// ---- child processes -------------------------------------------------------------------------

TEST(Process, ExitStatusesAreThoseOfTheProgram) {
  runtime::Captured ok = runtime::run_captured({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, 30);
  EXPECT_TRUE(ok.exit.exited);
  EXPECT_EQ(ok.exit.code, 3);
  EXPECT_EQ(ok.out, "out\n");
  EXPECT_EQ(ok.err, "err\n");
  runtime::Captured segv = runtime::run_captured({"/bin/sh", "-c", "kill -SEGV $$"}, 30);
  EXPECT_FALSE(segv.exit.exited);
  EXPECT_EQ(segv.exit.signal, SIGSEGV);
  runtime::Captured missing = runtime::run_captured({"/nonexistent/program"}, 30);
  EXPECT_EQ(missing.spawn_error, ENOENT);
  runtime::Captured slow = runtime::run_captured({"/bin/sh", "-c", "sleep 30 & wait"}, 0.3);
  EXPECT_TRUE(slow.timed_out);
}

TEST(Process, ChildrenDieWithTheThreadThatStartedThem) {
  TempFolder t;
  fs::path pid_file = t.path / "pid";
  // A thread starts a shell whose own child sleeps; the thread's process is then killed (here:
  // a forked copy of this test, so that the test itself survives).
  pid_t parent = fork();
  if (parent == 0) {
    std::string cmd = "sleep 60 & echo $! > " + pid_file.string() + "; wait";
    runtime::run_captured({"/bin/sh", "-c", cmd}, 120);
    _exit(0);
  }
  for (int i = 0; i < 500 && slurp(pid_file).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  pid_t sleeper = pid_t(std::atol(slurp(pid_file).c_str()));
  ASSERT_GT(sleeper, 0);
  ::kill(parent, SIGKILL);
  ::waitpid(parent, nullptr, 0);
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    std::string stat = slurp(fmt::format("/proc/{}/stat", sleeper));
    gone = stat.empty() || stat.find(") Z") != std::string::npos;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone) << "the grandchild " << sleeper << " outlived its killed parent";
}

}  // namespace
}  // namespace deuteron
