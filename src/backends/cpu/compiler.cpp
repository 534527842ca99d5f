#include "backends/cpu/compiler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "backends/cpu/hardware.h"
#include "deuteron/error.h"
#include "runtime/disk_cache.h"

extern char** environ;

namespace deuteron::cpu {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_invocations{0};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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

struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal
  bool timed_out = false;
  std::string output;  // stdout and stderr interleaved, capped
};

// Runs argv (PATH lookup) in its own process group with stdin from /dev/null, capturing its
// output; on timeout kills the whole group (the driver's cc1plus/as/ld children too).
ProcessResult run_process(const std::vector<std::string>& argv, double timeout_s) {
  constexpr size_t kMaxOutput = 256 * 1024;  // a runaway error cascade must not eat memory
  if (argv.empty()) throw CompileError("no C++ compiler given", "", "set $CXX or CompileOptions::compiler");
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);

  int fds[2];
  // O_CLOEXEC: children spawned concurrently by other threads must not inherit our pipe, or
  // we would never see EOF.
  if (pipe2(fds, O_CLOEXEC) != 0)
    throw RuntimeError(fmt::format("pipe failed: {}", std::generic_category().message(errno)));

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);  // the host may ignore SIGPIPE; the compiler should not
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  int err = posix_spawnp(&pid, cargv[0], &fa, &attr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (err != 0) {
    ::close(fds[0]);
    throw CompileError(fmt::format("cannot run C++ compiler '{}': {}", argv[0],
                                   std::generic_category().message(err)),
                       "", "install g++ or set $CXX to a C++20 compiler");
  }

  ProcessResult res;
  const double deadline = now() + timeout_s;
  char buf[8192];
  for (;;) {
    double left = deadline - now();
    if (left <= 0) {
      res.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int r = ::poll(&p, 1, int(std::min(left * 1000.0, 1e9)) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;  // timeout: re-checked at the loop head
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: every process holding the pipe has exited
    if (res.output.size() < kMaxOutput) res.output.append(buf, size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) res.exit_code = WEXITSTATUS(status);
  return res;
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

// Kernel names go into file names: keep them tame.
std::string file_stem(const std::string& name) {
  std::string s;
  for (char c : name.substr(0, 64))
    s += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') ? c : '_';
  return s.empty() ? "kernel" : s;
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

  std::string key = hash_hex(base_key + "\npch " + header.string() + "\n" + *text);
  std::string base = header.filename().string();
  fs::path dir = cache_dir / ("pch-" + key);
  std::vector<std::string> use = {"-include", (dir / base).string()};
  std::error_code ec;
  if (fs::exists(dir / (base + ".gch"), ec)) return use;
  {
    std::lock_guard lock(g_pch_mu);
    if (g_pch_failed.count(key)) return fallback;
  }

  // Build in a private directory, then rename it into place: the rename is atomic, and a
  // loser of a race between processes just drops its copy.
  fs::path tmp = cache_dir / ("pch-" + key + ".tmp-" + unique_suffix());
  atomic_write(tmp / base, "#include \"" + header.string() + "\"\n");
  std::vector<std::string> argv = split_words(opt.compiler);
  for (const auto& f : opt.flags)
    if (f != "-shared") argv.push_back(f);
  for (auto& a : include_args(opt.include_dirs)) argv.push_back(a);
  for (std::string a : {"-x", "c++-header"}) argv.push_back(a);
  argv.push_back((tmp / base).string());
  argv.push_back("-o");
  argv.push_back((tmp / (base + ".gch")).string());

  double t0 = now();
  ++g_invocations;
  ProcessResult r = run_process(argv, opt.timeout_s);
  *seconds += now() - t0;
  bool ok = r.exit_code == 0 && !r.timed_out;
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
  if (const char* extra = std::getenv("DEUTERON_CXXFLAGS"))
    for (std::string& f : split_words(extra)) flags.push_back(std::move(f));
  return flags;
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
  ProcessResult r = run_process(argv, 30);
  if (r.exit_code != 0 || r.timed_out)
    throw CompileError(fmt::format("'{} --version' failed:\n{}", compiler, truncated(r.output)),
                       "", "set $CXX to a working C++20 compiler");
  std::string id = r.output.substr(0, r.output.find('\n'));
  std::lock_guard lock(mu);
  memo.emplace(compiler, id);
  return id;
}

int compiler_invocations() { return g_invocations.load(); }

CompileResult compile_and_load(const std::string& name, const std::string& source,
                               const CompileOptions& opt) {
  fs::path dir = cache_root() / "cpu";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RuntimeError("cannot create " + dir.string() + ": " + ec.message());

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
  std::string stem = file_stem(name) + "-" + key;
  res.source_path = dir / (stem + ".cpp");
  res.so_path = dir / (stem + ".so");

  if (fs::exists(res.so_path, ec)) {
    try {
      res.so = SharedObject::open(res.so_path);
      return res;
    } catch (const RuntimeError&) {
      // Unloadable (truncated by a full disk, or foreign): rebuild it below.
      fs::remove(res.so_path, ec);
    }
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

  double t0 = now();
  ++g_invocations;
  ProcessResult r = run_process(argv, opt.timeout_s);
  res.compile_seconds += now() - t0;
  if (r.exit_code != 0 || r.timed_out) {
    fs::remove(tmp_so, ec);
    std::string what = r.timed_out
                           ? fmt::format("C++ compiler timed out after {} s", opt.timeout_s)
                           : fmt::format("C++ compiler failed (exit status {})", r.exit_code);
    throw CompileError(fmt::format("{} on kernel '{}'\n  source: {}\n  command: {}\n{}", what,
                                   name, res.source_path.string(), join(argv),
                                   truncated(r.output)),
                       "", "the generated source is kept at " + res.source_path.string());
  }
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
