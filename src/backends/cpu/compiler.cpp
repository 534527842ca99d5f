#include "backends/cpu/compiler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "backends/cpu/hardware.h"
#include "deuteron/error.h"
#include "runtime/checksum.h"
#include "runtime/disk_cache.h"
#include "runtime/env.h"
#include "runtime/process.h"
#include "runtime/text.h"


namespace deuteron::cpu {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_invocations{0};

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string join(const std::vector<std::string>& v, const char* sep = " ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// Runs the compiler (PATH lookup), its stdout and stderr interleaved; on timeout kills its whole
// process group (the driver's cc1plus, as and ld too). Throws CompileError if it cannot start.
runtime::Captured run_compiler(const std::vector<std::string>& argv, double timeout_s) {
  if (argv.empty()) throw CompileError("no C++ compiler given", "", "set $CXX or CompileOptions::compiler");
  (void)runtime::temp_dir();  // throws, naming TMPDIR, where the compiler could not write its files
  runtime::Captured r = runtime::run_captured(
      argv, timeout_s, {.search_path = true, .merge_output = true, .max_output = 256 * 1024});
  if (r.spawn_error != 0)
    throw CompileError(fmt::format("cannot run C++ compiler '{}': {}", argv[0],
                                   std::generic_category().message(r.spawn_error)),
                       "", "install g++ or set $CXX to a C++20 compiler");
  return r;
}

std::string truncated(std::string s, size_t limit = 4000) {
  s.erase(s.find_last_not_of(" \n") + 1);
  if (s.size() <= limit) return s;
  return s.substr(0, limit) + fmt::format("\n... ({} more characters)", s.size() - limit);
}

// Sizes and mtimes of every file under the include dirs: a header edit changes the key.
// (Hashing mtimes, not contents, keeps a cache hit cheap.)
std::string include_fingerprint(const std::vector<std::string>& dirs) {
  std::string out;
  for (const auto& d : dirs) {
    std::vector<std::string> entries;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(d, fs::directory_options::skip_permission_denied, ec),
         end;
         !ec && it != end; it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      auto size = it->file_size(ec);
      auto mtime = it->last_write_time(ec).time_since_epoch().count();
      entries.push_back(fmt::format("{}:{}:{}", fs::relative(it->path(), d, ec).string(), size,
                                    int64_t(mtime)));
    }
    std::sort(entries.begin(), entries.end());  // directory order is arbitrary
    out += "dir " + d + "\n";
    for (const auto& e : entries) out += e + "\n";
  }
  return out;
}

std::vector<std::string> include_args(const std::vector<std::string>& dirs) {
  std::vector<std::string> out;
  for (const auto& d : dirs) out.push_back("-I" + d);
  return out;
}

// Flags that let the compiler assume no NaN, infinity or signed zero, or reassociate sums:
// kernels then give other answers than their references (softmax by 2e-3 under -ffast-math).
void warn_about_fp_flags(const std::vector<std::string>& words) {
  static const std::set<std::string> risky = {
      "-ffast-math",       "-Ofast",          "-funsafe-math-optimizations", "-ffinite-math-only",
      "-fno-signed-zeros", "-freciprocal-math", "-fassociative-math",        "-fcx-limited-range",
      "-fno-honor-nans",   "-fno-honor-infinities"};
  static std::mutex mu;
  static std::set<std::string> warned;
  for (const std::string& w : words) {
    std::lock_guard lock(mu);
    if (risky.count(w) && warned.insert(w).second)
      runtime::warn(fmt::format("DEUTERON_CXXFLAGS has {}, which changes floating-point semantics: kernels may no "
                                "longer match their references (NaN, infinity and rounding behave differently)",
                                w));
  }
}

std::mutex g_pch_mu;
std::set<std::string> g_pch_failed;  // keys whose PCH build failed in this process

// Arguments that force-include the precompiled header: through a prebuilt .gch when one
// exists or can be built, else the header itself (same meaning, just slower to compile).
//
// Layout: <cache>/cpu/pch-<key>/<basename> is a one-line wrapper that #includes the original
// by absolute path (so its relative includes still resolve); <basename>.gch sits next to it,
// where GCC looks for it when given `-include <dir>/<basename>`.
std::vector<std::string> pch_args(const CompileOptions& opt, const std::string& base_key,
                                  const fs::path& cache_dir, double* seconds) {
  fs::path header = fs::absolute(opt.precompiled_header);
  std::vector<std::string> fallback = {"-include", header.string()};
  auto text = read_file(header);
  if (!text) return fallback;  // the kernel compile will report the missing file
  // The wrapper names the header in an #include, which has no escapes: a path holding a quote
  // or a line break cannot be written there (it is given to -include as an argument instead).
  if (header.string().find_first_of("\"\n\r") != std::string::npos) return fallback;

  std::string key = hash_hex(base_key + "\npch " + header.string() + "\n" + *text);
  std::string base = header.filename().string();
  fs::path dir = cache_dir / ("pch-" + key);
  std::vector<std::string> use = {"-include", (dir / base).string()};
  std::string wrapper = "#include \"" + header.string() + "\"\n";
  std::error_code ec;
  runtime::ArtifactCheck gch = runtime::check_artifact(dir / (base + ".gch"));
  std::string problem;
  std::optional<std::string> kept = read_cache_file(dir / base, &problem);
  if (gch.ok() && kept == wrapper) return use;
  if (gch.exists || kept || !problem.empty()) {
    std::string why = !gch.problem.empty() ? gch.problem
                      : !problem.empty()     ? "has a wrapper that " + problem
                                             : "is incomplete or was modified";
    runtime::warn(fmt::format("the precompiled header in {} {}; building it again", dir.string(), why));
    fs::remove_all(dir, ec);
  }
  {
    std::lock_guard lock(g_pch_mu);
    if (g_pch_failed.count(key)) return fallback;
  }

  // Build in a private directory, then rename it into place: the rename is atomic, and a
  // loser of a race between processes just drops its copy.
  fs::path tmp = cache_dir / ("pch-" + key + ".tmp-" + unique_suffix());
  atomic_write(tmp / base, wrapper);
  std::vector<std::string> argv = split_words(opt.compiler);
  for (const auto& f : opt.flags)
    if (f != "-shared") argv.push_back(f);
  for (auto& a : include_args(opt.include_dirs)) argv.push_back(a);
  for (std::string a : {"-x", "c++-header"}) argv.push_back(a);
  argv.push_back((tmp / base).string());
  argv.push_back("-o");
  argv.push_back((tmp / (base + ".gch")).string());

  double t0 = runtime::monotonic_seconds();
  ++g_invocations;
  runtime::Captured r = run_compiler(argv, opt.timeout_s);
  *seconds += runtime::monotonic_seconds() - t0;
  bool ok = r.exit.success() && !r.timed_out;
  if (ok) runtime::seal_artifact(tmp / (base + ".gch"), 0600);
  if (ok && ::rename(tmp.c_str(), dir.c_str()) != 0 && !fs::exists(dir / (base + ".gch"), ec))
    ok = false;
  fs::remove_all(tmp, ec);  // no-op after a successful rename
  if (ok) return use;
  std::lock_guard lock(g_pch_mu);
  g_pch_failed.insert(key);
  return fallback;
}

}  // namespace

std::string default_compiler() {
  const char* cxx = std::getenv("CXX");
  return (cxx && *cxx) ? cxx : "g++";
}

std::vector<std::string> default_flags() {
  std::vector<std::string> flags = {"-O3",    "-march=native", "-fopenmp",         "-fPIC",
                                    "-shared", "-std=c++20",   "-fno-math-errno", "-ffp-contract=fast"};
  // -mno-avx512f also turns off every AVX-512 extension that builds on it (BW, VL, BF16, FP16).
  if (cpu_info().isa_limit == "avx2") flags.push_back("-mno-avx512f");
  // GCC's tuning for Intel cores with AVX-512 vectorises loops 256 bits wide (-march=native on a
  // Xeon: -mprefer-vector-width=256), which halves the rate of row code bound by arithmetic:
  // exp(x - max) over a 16 x 4096 block took 15.7 us in ymm and 10.9 in zmm on a session-11
  // Xeon. The explicit vectors of deuteron_gemm.h are 512 bits wide either way. Its tuning for
  // Zen 1 (AVX2, 256-bit operations split in two) goes 128 bits wide: 256 ran softmax and
  // cross_entropy 8-9% faster there (session 18, 3-4 alternating rounds).
  flags.push_back(cpu_info().avx512f ? "-mprefer-vector-width=512" : "-mprefer-vector-width=256");
  // GCC's loop distribution takes a copy or a zero fill out of a generated loop into memcpy or
  // memset, expanded inline in 16-byte moves: a row's exps, written to a chunk in one loop and
  // stored and summed in the next, went out through the stack and general registers, and the
  // sum became a loop of its own. A 128 x 128 block of exp(s - max) with its row sums took 5.3
  // instead of 8.2 us without it; batch_softmax ran 0.80x the time, softmax_decomposed 0.89x,
  // welford 0.93x, the products even (session 34, a Zen 3, 6 alternating rounds). Clang has no
  // such pass and rejects the flag.
  if (is_gcc(default_compiler())) flags.push_back("-fno-tree-loop-distribute-patterns");
  // bf16 products widen to f32 where vdpbf16ps is the slower (an Emerald Rapids without AMX:
  // matmul 2048^3 bf16 ran 163 ms on vdpbf16ps, 104 widened).
  if (cpu_info().avx512_bf16 && !bf16_pairs_pay()) flags.push_back("-DDT_GEMM_WIDEN_BF16");
  // The matrix products' K chunk follows the L1D (deuteron_gemm.h's KC), their N chunk the L2.
  flags.push_back("-DDT_L1D_BYTES=" + std::to_string(cpu_info().l1d_bytes));
  flags.push_back("-DDT_L2_BYTES=" + std::to_string(cpu_info().l2_bytes));
  if (const char* extra = std::getenv("DEUTERON_CXXFLAGS")) {
    std::vector<std::string> words = split_words(extra);
    warn_about_fp_flags(words);
    for (std::string& f : words) flags.push_back(std::move(f));
  }
  return flags;
}

double default_timeout() {
  return runtime::env_number("DEUTERON_COMPILE_TIMEOUT", 0, 86400, /*lo_open=*/true).value_or(60);
}

SharedObject::SharedObject(void* handle, fs::path path)
    : handle_(handle), path_(std::move(path)) {}

SharedObject::~SharedObject() { ::dlclose(handle_); }

std::shared_ptr<SharedObject> SharedObject::open(const fs::path& path) {
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    throw RuntimeError(fmt::format("cannot load {}: {}", path.string(), e ? e : "unknown error"));
  }
  return std::shared_ptr<SharedObject>(new SharedObject(h, path));
}

void* SharedObject::symbol(const std::string& name) const {
  ::dlerror();
  void* p = ::dlsym(handle_, name.c_str());
  if (!p)
    throw RuntimeError(fmt::format("symbol '{}' not found in {}", name, path_.string()), "",
                       "kernel entry points must be declared extern \"C\"");
  return p;
}

std::string compiler_identity(const std::string& compiler) {
  static std::mutex mu;
  static std::map<std::string, std::string> memo;
  {
    std::lock_guard lock(mu);
    if (auto it = memo.find(compiler); it != memo.end()) return it->second;
  }
  std::vector<std::string> argv = split_words(compiler);
  argv.push_back("--version");
  runtime::Captured r = run_compiler(argv, 30);
  if (!r.exit.success() || r.timed_out)
    throw CompileError(fmt::format("'{} --version' failed:\n{}", compiler, truncated(r.out)),
                       "", "set $CXX to a working C++20 compiler");
  std::string id = r.out.substr(0, r.out.find('\n'));
  std::lock_guard lock(mu);
  memo.emplace(compiler, id);
  return id;
}

bool is_gcc(const std::string& compiler) {
  try {
    return compiler_identity(compiler).find("clang") == std::string::npos;
  } catch (const Error&) {
    return false;
  }
}

int compiler_invocations() { return g_invocations.load(); }

CompileResult compile_and_load(const std::string& name, const std::string& source,
                               const CompileOptions& opt) {
  fs::path dir = cache_root() / "cpu";
  make_private_dirs(dir);
  std::error_code ec;

  // Everything but the source and the PCH: the PCH key derives from this too.
  std::string base_key = "deuteron-cpu-so v1\n" + opt.compiler + "\n" +
                         compiler_identity(opt.compiler) + "\n" + join(opt.flags, "\n") + "\n" +
                         include_fingerprint(opt.include_dirs) + cpu_info().features_key;
  std::string pch_text;
  if (!opt.precompiled_header.empty())
    pch_text = "pch " + fs::absolute(opt.precompiled_header).string() + "\n" +
               read_file(opt.precompiled_header).value_or("<missing>");
  std::string key = hash_hex(base_key + "\n" + pch_text + "\nsource\n" + source);

  CompileResult res;
  std::string stem = runtime::file_stem(name) + "-" + key;
  res.source_path = dir / (stem + ".cpp");
  res.so_path = dir / (stem + ".so");

  // Loaded only when it is ours and intact: a damaged .so crashes dlopen (SIGBUS, SIGSEGV).
  if (runtime::ArtifactCheck so = runtime::check_artifact(res.so_path); so.ok()) {
    try {
      res.so = SharedObject::open(res.so_path);
      return res;
    } catch (const RuntimeError& e) {
      runtime::warn(fmt::format("{}; compiling it again", e.message()));
    }
  } else if (so.exists) {
    runtime::warn(fmt::format("the cached kernel {} {}; compiling it again", res.so_path.string(), so.problem));
  }

  atomic_write(res.source_path, source);
  std::vector<std::string> argv = split_words(opt.compiler);
  argv.insert(argv.end(), opt.flags.begin(), opt.flags.end());
  for (auto& a : include_args(opt.include_dirs)) argv.push_back(a);
  if (!opt.precompiled_header.empty())
    for (auto& a : pch_args(opt, base_key, dir, &res.compile_seconds)) argv.push_back(a);
  // A private output name, renamed into place when complete: concurrent builders of the same
  // kernel never load a half-written file.
  fs::path tmp_so = res.so_path;
  tmp_so += ".tmp-" + unique_suffix();
  argv.push_back(res.source_path.string());
  argv.push_back("-o");
  argv.push_back(tmp_so.string());

  double t0 = runtime::monotonic_seconds();
  ++g_invocations;
  runtime::Captured r = run_compiler(argv, opt.timeout_s);
  res.compile_seconds += runtime::monotonic_seconds() - t0;
  if (!r.exit.success() || r.timed_out) {
    fs::remove(tmp_so, ec);
    std::string what = r.timed_out ? fmt::format("C++ compiler timed out after {} s", opt.timeout_s)
                                   : fmt::format("C++ compiler failed ({})", r.exit.describe());
    throw CompileError(fmt::format("{} on kernel '{}'\n  source: {}\n  command: {}\n{}", what,
                                   name, res.source_path.string(), join(argv),
                                   truncated(r.out)),
                       "", r.timed_out ? "raise DEUTERON_COMPILE_TIMEOUT (seconds, default 60)"
                                       : "the generated source is kept at " + res.source_path.string());
  }
  runtime::seal_artifact(tmp_so, 0700);
  if (::rename(tmp_so.c_str(), res.so_path.c_str()) != 0) {
    int err = errno;
    fs::remove(tmp_so, ec);
    throw RuntimeError(fmt::format("cannot write {}: {}", res.so_path.string(),
                                   std::generic_category().message(err)));
  }
  res.so = SharedObject::open(res.so_path);
  res.compiled = true;
  return res;
}

}  // namespace deuteron::cpu
