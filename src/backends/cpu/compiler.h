// Turns generated C++ into a loaded shared object: system compiler, on-disk cache, dlopen.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace deuteron::cpu {

// $CXX (split on whitespace, so "ccache g++" works) or "g++".
std::string default_compiler();
// -O3 -march=native -fopenmp -fPIC -shared -std=c++20 -fno-math-errno -ffp-contract=fast, the
// flags this CPU and compiler call for (vector width, cache sizes, GCC's loop distribution off;
// compiler.cpp says why), then the words of $DEUTERON_CXXFLAGS (they are part of every cache
// key; flags that change floating-point semantics, such as -ffast-math, draw a warning).
std::vector<std::string> default_flags();
// Whether `compiler` is GCC: its --version does not name clang (false when it cannot run; the
// compile then reports why).
bool is_gcc(const std::string& compiler);
// $DEUTERON_COMPILE_TIMEOUT (seconds), else 60; ArgumentError for a value that is not a
// positive number.
double default_timeout();

struct CompileOptions {
  std::string compiler = default_compiler();
  std::vector<std::string> flags = default_flags();
  std::vector<std::string> include_dirs;  // project headers; their files' sizes and mtimes are
                                          // part of the cache key, so keep them small
  // Optional header force-included (-include) into every kernel. It is precompiled once per
  // (compiler, flags, header text) into the cache; if that fails it is included as plain text.
  std::string precompiled_header;
  double timeout_s = default_timeout();
};

// A dlopen'ed shared object (RTLD_NOW | RTLD_LOCAL), closed when the last owner lets go.
class SharedObject {
 public:
  // Throws RuntimeError with dlerror()'s text and the path.
  static std::shared_ptr<SharedObject> open(const std::filesystem::path& path);
  ~SharedObject();
  SharedObject(const SharedObject&) = delete;
  SharedObject& operator=(const SharedObject&) = delete;

  // Address of an exported (extern "C") symbol; throws RuntimeError naming it and the path.
  void* symbol(const std::string& name) const;
  template <typename Fn>
  Fn* function(const std::string& name) const {
    return reinterpret_cast<Fn*>(symbol(name));
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  SharedObject(void* handle, std::filesystem::path path);
  void* handle_;
  std::filesystem::path path_;
};

struct CompileResult {
  std::shared_ptr<SharedObject> so;
  bool compiled = false;        // false when served from the cache
  double compile_seconds = 0;   // time spent compiling (with a first PCH build); 0 on a hit
  std::filesystem::path source_path, so_path;
};

// Loads cache_root()/cpu/<name>-<key>.so if present, ours and intact (runtime/checksum.h; a
// damaged one is compiled again, with a warning); otherwise writes <name>-<key>.cpp there,
// compiles it, and loads the result. The key hashes the source, the compiler's identity, the
// flags, the include dirs' contents, the precompiled header's text and cpu_info().features_key.
// Safe for concurrent callers, threads or processes. Throws CompileError (compiler output and
// source path in the message) when the compiler fails or times out.
CompileResult compile_and_load(const std::string& name, const std::string& source,
                               const CompileOptions& options = {});

// First line of `compiler --version`, memoized per compiler string. Throws CompileError if
// the compiler cannot be run.
std::string compiler_identity(const std::string& compiler);

// How many times this process ran the compiler to build a kernel or a precompiled header
// (`--version` queries do not count).
int compiler_invocations();

}  // namespace deuteron::cpu
