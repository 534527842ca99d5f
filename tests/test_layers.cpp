// What the layering rests on: the registry of built-in targets, and the files the library
// carries into the cache for the programs it starts (runtime/disk_cache.h: resource_dir).
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

#include "backends/registry.h"
#include "deuteron/error.h"
#include "runtime/disk_cache.h"

namespace fs = std::filesystem;

namespace deuteron {
namespace {

TEST(Registry, TargetsInTheBuildsOrderTheFirstIsTheDefault) {
  std::vector<std::string> names = backends::names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(backends::default_target(), names.front());
  for (const std::string& n : names) EXPECT_EQ(backends::get(n).name(), n);
  // The default build (DEUTERON_TARGETS): cpu first, pallas and triton.
  EXPECT_EQ(names.front(), "cpu");
  EXPECT_NE(std::find(names.begin(), names.end(), "pallas"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "triton"), names.end());
}

// Every target can be tuned (pallas and triton through their runners' --serve workers).
TEST(Registry, EveryTargetHasAHarness) {
  for (const std::string& name : backends::names()) EXPECT_NE(backends::get(name).harness(), nullptr) << name;
}

TEST(Registry, AnUnknownTargetNamesTheKnownOnes) {
  try {
    backends::get("tpu");
    FAIL() << "no error";
  } catch (const ArgumentError& e) {
    EXPECT_NE(e.message().find("unknown target 'tpu'"), std::string::npos) << e.message();
    EXPECT_NE(e.hint().find("cpu, pallas"), std::string::npos) << e.hint();
  }
}

class Resources : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("deuteron-resources-" + unique_suffix());
    const char* v = std::getenv("DEUTERON_CACHE_DIR");
    saved_ = v ? v : "";
    setenv("DEUTERON_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    if (saved_.empty()) unsetenv("DEUTERON_CACHE_DIR");
    else setenv("DEUTERON_CACHE_DIR", saved_.c_str(), 1);
    fs::remove_all(dir_);
  }
  fs::path dir_;
  std::string saved_;
};

TEST_F(Resources, SameFilesShareADirectoryOtherFilesGetTheirOwn) {
  fs::path a = resource_dir("test", {{"x.h", "int x;\n"}, {"y.h", "int y;\n"}});
  EXPECT_EQ(a.parent_path(), dir_ / "resources");
  EXPECT_EQ(read_file(a / "x.h"), "int x;\n");
  EXPECT_EQ(read_file(a / "y.h"), "int y;\n");
  EXPECT_EQ(resource_dir("test", {{"x.h", "int x;\n"}, {"y.h", "int y;\n"}}), a);
  // Another build's header, or the same text under another name, is another directory.
  EXPECT_NE(resource_dir("test", {{"x.h", "int x2;\n"}, {"y.h", "int y;\n"}}), a);
  EXPECT_NE(resource_dir("test", {{"x.h", "int x;\n"}, {"z.h", "int y;\n"}}), a);
  EXPECT_NE(resource_dir("other", {{"x.h", "int x;\n"}, {"y.h", "int y;\n"}}), a);
}

TEST_F(Resources, WrittenOnceSoCompilersSeeStableFiles) {
  fs::path a = resource_dir("test", {{"x.h", "int x;\n"}});
  struct stat before {};
  ASSERT_EQ(stat((a / "x.h").c_str(), &before), 0);
  fs::path again = resource_dir("test", {{"x.h", "int x;\n"}});
  struct stat after {};
  ASSERT_EQ(stat((again / "x.h").c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  // A removed file comes back.
  fs::remove(a / "x.h");
  EXPECT_EQ(read_file(resource_dir("test", {{"x.h", "int x;\n"}}) / "x.h"), "int x;\n");
}

}  // namespace
}  // namespace deuteron
