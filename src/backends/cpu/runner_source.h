// Source of deuteron-runner, the program that runs and times candidate kernels of the CPU
// target, one fresh process per candidate (see autotune/process.h for why a fresh process).
// The CPU harness (harness.cpp) compiles it on first use into the cache; the autotuner starts
// it with posix_spawn.
//
// Protocol, one command per line on stdin (a socket), answers on stdout:
//   arena <fd> <bytes>                  shared memory holding every tensor (fd 3); the kernels
//                                       run on a private copy on huge pages (on the arena where
//                                       that would take over half the memory left)
//   region <offset> <bytes> ro|rw       ro: inputs (copied, then read-only: a kernel writing into
//                                       its inputs faults); rw: outputs, filled with 0xff bytes
//                                       (NaN for floats) before the first run, copied back at
//                                       the end
//   tensor <offset>                     next host tensor's address (IR order)
//   scalar <value>                      next scalar argument
//   kernel <scratch/thread> <threads> <entry> <path to .so, %XX-encoded (runtime/text.h)>
//   timing <warmup s> <min reps> <max reps> <budget s> <cutoff s> <pause 0|1>
//   memlimit <bytes>                    address space the runs may add (RLIMIT_AS)
//   inject crash|hang|wrong|oom|none    test hook (DEUTERON_AUTOTUNE_INJECT)
//   run
// Answers: "loaded", "ready" (then it waits for "go"; only when pause is 1), "first <k> <s>",
// "samples <k> <n> <s>..." per kernel, "done"; or "error <text>" and exit status 2
// (3: out of memory).
//
// With several kernels (re-timing the finalists) the timed runs go round-robin, so drift in
// the machine's speed affects every kernel alike.
#pragma once

namespace deuteron::cpu {

inline constexpr const char* kCpuRunnerSource = R"RUNNER(
#include <dlfcn.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" int omp_get_max_threads(void);

// A scalar argument: `scalar i <integer>` (exact) or `scalar f <double>` in the request.
union Scalar {
  double real;
  int64_t integer;
};
typedef void KernelFn(void* const*, const Scalar*, char*, long, int64_t*);

static double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

static void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

[[noreturn]] static void fail(int code, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  for (char* p = buf; *p; ++p)
    if (*p == '\n') *p = ' ';
  say("error %s\n", buf);
  _exit(code);
}

static bool read_line(std::string& out) {
  out.clear();
  char c;
  for (;;) {
    ssize_t n = read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return !out.empty();
    if (c == '\n') return true;
    out += c;
  }
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A %XX-encoded field (runtime::encode_field); false when malformed.
static bool decode_field(const std::string& in, std::string& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out += in[i];
      continue;
    }
    if (i + 2 >= in.size()) return false;
    int hi = hex_digit(in[i + 1]), lo = hex_digit(in[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out += char(hi * 16 + lo);
    i += 2;
  }
  return true;
}

// MemAvailable from /proc/meminfo, in bytes (0 where it cannot be read).
static long available_bytes() {
  long kib = 0;
  if (FILE* f = fopen("/proc/meminfo", "r")) {
    char line[256];
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %ld kB", &kib) == 1) break;
    fclose(f);
  }
  return kib * 1024;
}

struct Region { long off, bytes; bool rw; };
struct Kernel {
  long per_thread = 0;
  int threads = 1;
  std::string entry, path;
  KernelFn* fn = nullptr;
  char* scratch = nullptr;
  std::vector<double> samples;
  double first = 0, estimate = 0;
};

int main() {
  // Die with the tuner (it may be interrupted while we run a hanging candidate); a tuner that
  // died before this line closed our stdin, and the request below ends early.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // A crashing candidate must not leave core files behind.
  prctl(PR_SET_DUMPABLE, 0);
  rlimit core = {0, 0};
  setrlimit(RLIMIT_CORE, &core);
  (void)omp_get_max_threads();  // libgomp is loaded with the program, not by dlopen

  int arena_fd = -1;
  long arena_bytes = 0, memlimit = 0;
  std::vector<Region> regions;
  std::vector<long> tensor_offsets;
  std::vector<Scalar> scalars;
  std::vector<Kernel> kernels;
  double warmup_s = 0.02, budget_s = 0.1, cutoff_s = 0;
  int min_reps = 3, max_reps = 100, pause = 0;
  std::string inject = "none", line;
  bool go = false;
  while (read_line(line)) {
    char word[64] = {0};
    if (sscanf(line.c_str(), "%63s", word) != 1) continue;
    std::string w = word;
    const char* rest = line.c_str() + w.size();
    if (w == "arena") {
      sscanf(rest, "%d %ld", &arena_fd, &arena_bytes);
    } else if (w == "region") {
      Region r;
      char mode[8] = {0};
      sscanf(rest, "%ld %ld %7s", &r.off, &r.bytes, mode);
      r.rw = std::string(mode) == "rw";
      regions.push_back(r);
    } else if (w == "tensor") {
      long off = 0;
      sscanf(rest, "%ld", &off);
      tensor_offsets.push_back(off);
    } else if (w == "scalar") {
      char kind[4] = {0};
      int used = 0;
      sscanf(rest, "%3s %n", kind, &used);
      Scalar v;
      if (kind[0] == 'i')
        v.integer = strtoll(rest + used, nullptr, 10);
      else
        v.real = strtod(rest + used, nullptr);
      scalars.push_back(v);
    } else if (w == "kernel") {
      Kernel k;
      char entry[512] = {0};
      int used = 0;
      sscanf(rest, "%ld %d %511s %n", &k.per_thread, &k.threads, entry, &used);
      k.entry = entry;
      if (!decode_field(rest + used, k.path)) fail(2, "malformed kernel path '%s'", rest + used);
      kernels.push_back(k);
    } else if (w == "timing") {
      sscanf(rest, "%lf %d %d %lf %lf %d", &warmup_s, &min_reps, &max_reps, &budget_s, &cutoff_s, &pause);
    } else if (w == "memlimit") {
      sscanf(rest, "%ld", &memlimit);
    } else if (w == "inject") {
      char what[32] = {0};
      sscanf(rest, "%31s", what);
      inject = what;
    } else if (w == "run") {
      go = true;
      break;
    } else {
      fail(2, "unknown command '%s'", line.c_str());
    }
  }
  if (!go) fail(2, "request ended before 'run'");
  if (kernels.empty()) fail(2, "no kernel to run");

  // The kernels run on a private copy of the arena on huge pages, as they do on a Tensor (THP
  // "madvise"); the shared arena's 4 KiB pages rank configs differently: softmax 8192 x 2560
  // with streamed stores took 0.89x the time of cached ones on huge pages, 0.98x on 4 KiB pages
  // (a Zen 3, 16 alternating rounds). The outputs are copied back for the tuner to check.
  char* base = nullptr;
  char* work = nullptr;
  if (arena_bytes > 0) {
    void* p = mmap(nullptr, size_t(arena_bytes), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, arena_fd, 0);
    if (p == MAP_FAILED) fail(2, "cannot map the tensors: %s", strerror(errno));
    base = static_cast<char*>(p);
    // Where the copy would take more than half the memory left, the kernels run on the arena.
    const long huge = 2L << 20;
    const size_t rounded = size_t((arena_bytes + huge - 1) / huge * huge);
    if (arena_bytes <= available_bytes() / 2) work = static_cast<char*>(aligned_alloc(size_t(huge), rounded));
    if (work) madvise(work, rounded, MADV_HUGEPAGE);
    else work = base;
  }
  for (const Region& r : regions) {
    if (r.off < 0 || r.bytes < 0 || r.off + r.bytes > arena_bytes) fail(2, "region outside the arena");
    if (r.rw) {
      memset(work + r.off, 0xff, size_t(r.bytes));
    } else {
      if (work != base) memcpy(work + r.off, base + r.off, size_t(r.bytes));
      if (r.bytes > 0 && mprotect(work + r.off, size_t(r.bytes), PROT_READ) != 0)
        fail(2, "cannot protect an input region: %s", strerror(errno));
    }
  }
  std::vector<void*> ptrs;
  for (long off : tensor_offsets) ptrs.push_back(work + off);
  if (scalars.empty()) scalars.push_back(Scalar{0.0});

  for (Kernel& k : kernels) {
    void* h = dlopen(k.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) fail(2, "cannot load %s: %s", k.path.c_str(), dlerror());
    k.fn = reinterpret_cast<KernelFn*>(dlsym(h, k.entry.c_str()));
    if (!k.fn) fail(2, "no symbol %s in %s", k.entry.c_str(), k.path.c_str());
    long bytes = std::max(k.per_thread * long(std::max(k.threads, 1)), 64L);
    bytes = (bytes + 63) / 64 * 64;
    k.scratch = static_cast<char*>(aligned_alloc(64, size_t(bytes)));
    if (!k.scratch) fail(3, "out of memory: %ld bytes of scratch", bytes);
    memset(k.scratch, 0, size_t(bytes));
  }

  if (memlimit > 0) {
    long pages = 0;
    if (FILE* f = fopen("/proc/self/statm", "r")) {
      if (fscanf(f, "%ld", &pages) != 1) pages = 0;
      fclose(f);
    }
    rlimit as;
    as.rlim_cur = as.rlim_max = rlim_t(pages * sysconf(_SC_PAGESIZE) + memlimit);
    setrlimit(RLIMIT_AS, &as);
  }
  say("loaded\n");
  if (pause) {
    // The tuner stops its compilers now, so that they do not share our cores.
    say("ready\n");
    if (!read_line(line) || line != "go") fail(2, "expected 'go'");
  }

  if (inject == "crash") *static_cast<volatile int*>(nullptr) = 1;
  if (inject == "hang") for (;;) ::pause();
  if (inject == "oom") {
    for (;;) {
      char* p = static_cast<char*>(malloc(64 << 20));
      if (!p) fail(3, "out of memory (injected)");
      memset(p, 1, 64 << 20);
    }
  }

  // The outputs to the arena (the first run's values: every later run recomputes them), then
  // the injected wrong answer into them.
  auto publish_outputs = [&] {
    for (const Region& r : regions)
      if (r.rw && work != base) memcpy(base + r.off, work + r.off, size_t(r.bytes));
    if (inject != "wrong") return;
    for (const Region& r : regions)
      if (r.rw) {
        memset(base + r.off, 0x3f, size_t(std::min(r.bytes, 64L)));
        return;
      }
  };
  auto run = [&](Kernel& k) {
    double t0 = now();
    int64_t status[2] = {0, 0};
    k.fn(ptrs.data(), scalars.data(), k.scratch, k.per_thread, status);
    double t = now() - t0;
    // The tuner's inputs are valid: a failed index check is a broken candidate.
    if (status[0] != 0)
      fail(3, "index check %lld failed: index %lld is out of range", (long long)(status[0] - 1),
           (long long)status[1]);
    return t;
  };

  // The first run: its outputs are what the tuner checks (every later run recomputes them).
  for (size_t i = 0; i < kernels.size(); ++i) {
    kernels[i].first = run(kernels[i]);
    say("first %zu %.9g\n", i, kernels[i].first);
  }
  if (kernels.size() == 1 && cutoff_s > 0 && kernels[0].first > cutoff_s) {
    // Far slower than the best so far (and not only because the first run started threads
    // and touched pages): two samples are enough to rule it out.
    double second = run(kernels[0]);
    if (second > cutoff_s) {
      publish_outputs();
      say("samples 0 2 %.9g %.9g\n", kernels[0].first, second);
      say("done\n");
      _exit(0);
    }
  }
  double total = 0;
  for (Kernel& k : kernels) {
    double start = now(), best = 1e30;
    int n = 0;
    do {
      best = std::min(best, run(k));
      ++n;
    } while (now() - start < warmup_s && n < 1000);
    k.estimate = best;
    total += best;
  }
  int reps = int(std::min<double>(max_reps, std::max<double>(min_reps, budget_s / std::max(total, 1e-9))));
  // The warm-up's best run may promise more than a loaded machine gives: stop at twice the
  // budget once the minimum is done.
  double sampling_start = now();
  for (int r = 0; r < reps; ++r) {
    for (Kernel& k : kernels) k.samples.push_back(run(k));
    if (r + 1 >= min_reps && now() - sampling_start > 2 * budget_s) break;
  }
  publish_outputs();
  for (size_t i = 0; i < kernels.size(); ++i) {
    std::string s = "samples " + std::to_string(i) + " " + std::to_string(kernels[i].samples.size());
    char buf[64];
    for (double t : kernels[i].samples) {
      snprintf(buf, sizeof buf, " %.9g", t);
      s += buf;
    }
    say("%s\n", s.c_str());
  }
  say("done\n");
  _exit(0);
}
)RUNNER";

}  // namespace deuteron::cpu
