#include "backends/cpu/hardware.h"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "deuteron/error.h"
#include "runtime/disk_cache.h"
#include "runtime/env.h"
#include "runtime/json.h"
#include "runtime/machine_load.h"

#if defined(__x86_64__) || defined(__i386__)
#define DEUTERON_X86 1
#include <cpuid.h>
#include <immintrin.h>  // the kernels below use target attributes, not -march flags
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace deuteron::cpu {

namespace {

constexpr int64_t KiB = 1024, MiB = 1024 * KiB;

// ---------------------------------------------------------------------------------------------
// CPUID

#ifdef DEUTERON_X86
struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(uint32_t leaf, uint32_t sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

bool bit(uint32_t word, int i) { return (word >> i) & 1u; }

uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Leaf 4 (Intel) and 0x8000001D (AMD) share one layout: one sub-leaf per cache.
void read_cache_leaf(uint32_t leaf, CpuInfo& info) {
  for (uint32_t i = 0; i < 16; ++i) {
    Regs r = cpuid(leaf, i);
    uint32_t type = r.a & 0x1f;  // 0 none, 1 data, 2 instruction, 3 unified
    if (type == 0) break;
    if (type == 2) continue;
    int level = (r.a >> 5) & 7;
    int64_t ways = ((r.b >> 22) & 0x3ff) + 1, parts = ((r.b >> 12) & 0x3ff) + 1;
    int64_t line = (r.b & 0xfff) + 1, sets = int64_t(r.c) + 1;
    int64_t size = ways * parts * line * sets;
    if (level == 1) info.l1d_bytes = size;
    if (level == 2) info.l2_bytes = size;
    if (level == 3) info.l3_bytes = size;
  }
}

void read_cpuid(CpuInfo& info) {
  Regs v = cpuid(0);
  uint32_t max_leaf = v.a;
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  info.vendor = vendor;

  uint32_t max_ext = cpuid(0x80000000).a;
  if (max_ext >= 0x80000004) {
    char brand[49] = {};
    for (uint32_t i = 0; i < 3; ++i) {
      Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    std::string s = brand;
    s.erase(0, s.find_first_not_of(' '));
    s.erase(s.find_last_not_of(' ') + 1);
    info.model_name = s;
  }

  Regs l1 = max_leaf >= 1 ? cpuid(1) : Regs{};
  Regs l7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  Regs l7_1 = (max_leaf >= 7 && l7.a >= 1) ? cpuid(7, 1) : Regs{};
  Regs ext1 = max_ext >= 0x80000001 ? cpuid(0x80000001) : Regs{};

  // A feature is usable only if the OS saves its registers on context switch (XCR0).
  uint64_t xcr0 = bit(l1.c, 27) ? xgetbv0() : 0;
  bool os_avx = (xcr0 & 0x6) == 0x6;
  bool os_avx512 = (xcr0 & 0xe6) == 0xe6;
  bool os_amx = (xcr0 & 0x60000) == 0x60000;

  info.fma = os_avx && bit(l1.c, 12);
  info.avx2 = os_avx && bit(l7.b, 5);
  info.avx512f = os_avx512 && bit(l7.b, 16);
  info.avx512bw = info.avx512f && bit(l7.b, 30);
  info.avx512vl = info.avx512f && bit(l7.b, 31);
  info.avx512_bf16 = info.avx512f && bit(l7_1.a, 5);
  info.avx512_fp16 = info.avx512f && bit(l7.d, 23);
  info.amx = os_amx && bit(l7.d, 24) && bit(l7.d, 22);  // AMX-TILE and AMX-BF16

  // Leaf 7 EDX also holds mitigation flags that microcode updates flip: keep its ISA bits only.
  const uint32_t l7d_isa = (1u << 2) | (1u << 3) | (1u << 4) | (1u << 5) | (1u << 8) |
                           (1u << 14) | (1u << 16) | (0xfu << 22);
  info.features_key =
      fmt::format("x86:{}{}{}{}{}{}{}{}:{:08x}.{:08x}.{:08x}.{:08x}.{:08x}.{:08x}.{:08x}.{:x}",
                  info.avx2 ? "avx2," : "", info.fma ? "fma," : "",
                  info.avx512f ? "avx512f," : "", info.avx512bw ? "avx512bw," : "",
                  info.avx512vl ? "avx512vl," : "", info.avx512_bf16 ? "avx512_bf16," : "",
                  info.avx512_fp16 ? "avx512_fp16," : "", info.amx ? "amx," : "", l1.c, l1.d,
                  l7.b, l7.c, l7.d & l7d_isa, l7_1.a, ext1.c, xcr0);

  bool amd = info.vendor == "AuthenticAMD" || info.vendor == "HygonGenuine";
  if (amd && max_ext >= 0x8000001D && bit(ext1.c, 22)) {  // TopologyExtensions
    read_cache_leaf(0x8000001D, info);
  } else if (amd && max_ext >= 0x80000006) {  // older AMD: legacy size leaves
    info.l1d_bytes = int64_t(cpuid(0x80000005).c >> 24) * KiB;
    Regs r = cpuid(0x80000006);
    info.l2_bytes = int64_t(r.c >> 16) * KiB;
    info.l3_bytes = int64_t(r.d >> 18) * 512 * KiB;
  } else if (max_leaf >= 4) {
    read_cache_leaf(4, info);
  }
}
#endif  // DEUTERON_X86

int count_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1u, std::thread::hardware_concurrency());
}

CpuInfo detect() {
  CpuInfo info;
#ifdef DEUTERON_X86
  read_cpuid(info);
#else
  info.vendor = "unknown";
  info.features_key = "generic";
#endif
  info.cores = count_cores();
  info.simd_bytes = info.avx512f ? 64 : 32;
  // /sys cache info is missing in some VMs and CPUID may be masked: assume a recent server core.
  if (info.l1d_bytes <= 0) info.l1d_bytes = 48 * KiB;
  if (info.l2_bytes <= 0) info.l2_bytes = 1 * MiB;
  if (info.l3_bytes <= 0) info.l3_bytes = 32 * MiB;
  // At least a page of scratch per thread, at most a TiB.
  if (auto v = runtime::env_bytes("DEUTERON_L2_BYTES", 4 * KiB, int64_t(1) << 40)) info.l2_bytes = *v;
  return info;
}

// ---------------------------------------------------------------------------------------------
// Roofline kernels. Compiled with target attributes so this file needs no -march flag; the
// caller picks the variant the CPU supports.

using FmaFn = float (*)(int64_t iters);
using CopyFn = void (*)(const float* src, float* dst, size_t n);  // n: multiple of 16

#ifdef DEUTERON_X86
// 16 independent accumulators: FMA latency (4-6 cycles) x 2 pipes needs at least 8-12.
__attribute__((target("avx512f,fma"))) float fma_avx512(int64_t iters) {
  constexpr int N = 16;
  __m512 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm512_set1_ps(float(j));
  // x -> x*a + b converges to b/(1-a): no overflow, no denormals to slow the loop down.
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  }
  for (int j = 1; j < N; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  float out[16];
  _mm512_storeu_ps(out, acc[0]);
  float s = 0;
  for (float x : out) s += x;
  return s;
}
constexpr double kFlopsAvx512 = 16 * 16 * 2;

// 12 accumulators + 2 constants fit the 16 ymm registers.
__attribute__((target("avx2,fma"))) float fma_avx2(int64_t iters) {
  constexpr int N = 12;
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_set1_ps(float(j));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < N; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  }
  for (int j = 1; j < N; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  float out[8];
  _mm256_storeu_ps(out, acc[0]);
  float s = 0;
  for (float x : out) s += x;
  return s;
}
constexpr double kFlopsAvx2 = 12 * 8 * 2;

// Explicit vector loads/stores: a plain loop would become a memcpy call, and glibc's memcpy
// switches to non-temporal stores on large blocks, which generated kernels do not use.
__attribute__((target("avx512f"))) void copy_avx512(const float* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i += 16) _mm512_store_ps(dst + i, _mm512_load_ps(src + i));
}
__attribute__((target("avx"))) void copy_avx(const float* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i += 8) _mm256_store_ps(dst + i, _mm256_load_ps(src + i));
}
#endif

// Portable fallback (mul + add, whatever the compiler vectorises it to).
float fma_generic(int64_t iters) {
  constexpr int N = 32;
  float acc[N];
  for (int j = 0; j < N; ++j) acc[j] = float(j);
  for (int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < N; ++j) acc[j] = acc[j] * 0.999f + 0.001f;
  float s = 0;
  for (float x : acc) s += x;
  return s;
}
constexpr double kFlopsGeneric = 32 * 2;

void copy_generic(const float* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = src[i];
}

struct Kernels {
  FmaFn fma;
  double flops_per_iter;
  CopyFn copy;
};

Kernels pick_kernels(const CpuInfo& info) {
#ifdef DEUTERON_X86
  if (info.avx512f && info.fma) return {fma_avx512, kFlopsAvx512, copy_avx512};
  if (info.avx2 && info.fma) return {fma_avx2, kFlopsAvx2, copy_avx};
#endif
  (void)info;
  return {fma_generic, kFlopsGeneric, copy_generic};
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}
int team_size() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}

volatile float g_sink;  // keeps the FMA results alive

// GFLOP/s of the best of `reps` runs of `iters` iterations on `threads` threads (1: this one).
double fma_gflops(const Kernels& k, int threads, int64_t iters, int reps) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    int used = 1;
    double t0 = now();
    if (threads == 1) {
      g_sink = k.fma(iters);
    } else {
#pragma omp parallel num_threads(threads)
      {
        float v = k.fma(iters);
        if (thread_id() == 0) {
          used = team_size();
          g_sink = v;
        }
      }
    }
    double dt = now() - t0;
    best = std::max(best, used * double(iters) * k.flops_per_iter / dt * 1e-9);
  }
  return best;
}

// Anonymous memory, huge pages where the kernel allows (fewer TLB misses, faster faults).
struct Buffer {
  float* p = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t n) : bytes(n * sizeof(float)) {
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
      throw RuntimeError(fmt::format("roofline: cannot allocate {} MiB", bytes / MiB));
    madvise(m, bytes, MADV_HUGEPAGE);
    p = static_cast<float*>(m);
  }
  ~Buffer() { munmap(p, bytes); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// Median GB/s (bytes read + written) of `reps` copies of n floats on `threads` threads.
double copy_gbps(const Kernels& k, const float* src, float* dst, size_t n, int threads,
                 int reps) {
  std::vector<double> rates;
  for (int r = 0; r <= reps; ++r) {  // the first run is a warm-up
    double t0 = now();
#pragma omp parallel num_threads(threads)
    {
      // Chunks of whole 64-byte lines, so every thread's stores stay aligned.
      size_t lines = n / 16, t = size_t(thread_id()), nt = size_t(team_size());
      size_t begin = lines * t / nt * 16, end = lines * (t + 1) / nt * 16;
      k.copy(src + begin, dst + begin, end - begin);
    }
    double dt = now() - t0;
    if (r > 0) rates.push_back(2.0 * double(n) * sizeof(float) / dt * 1e-9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

const CpuInfo& cpu_info() {
  static const CpuInfo info = detect();
  return info;
}

Roofline measure_roofline() {
  const CpuInfo& info = cpu_info();
  const Kernels k = pick_kernels(info);
  const int threads = info.cores;
  Roofline out;

  // FMA: calibrate to ~0.2 s per run on one core (this also warms up clocks).
  int64_t iters = 1 << 16;
  double dt = 0;
  for (;;) {
    double t0 = now();
    g_sink = k.fma(iters);
    dt = now() - t0;
    if (dt > 0.02 || iters > (int64_t(1) << 40)) break;
    iters *= 4;
  }
  iters = std::max<int64_t>(1, int64_t(double(iters) * 0.2 / dt));
  out.peak_gflops_1core = fma_gflops(k, 1, iters, 3);
  out.peak_gflops = fma_gflops(k, threads, iters, 3);

  // Copy: each array at least 2x L3 (and 256 MiB), but at most a quarter of free memory.
  int64_t want = std::max(2 * info.l3_bytes, 256 * MiB);
  int64_t free_bytes = int64_t(sysconf(_SC_AVPHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
  if (free_bytes > 0) want = std::min(want, free_bytes / 4);
  want = std::clamp<int64_t>(want, 16 * MiB, 2048 * MiB);
  size_t n = size_t(want) / sizeof(float) / 16 * 16;
  Buffer src(n), dst(n);
  // First touch with the same split as the copies (NUMA-local pages); writes to both arrays,
  // since reading untouched memory would hit the shared zero page and overstate bandwidth.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < n; ++i) {
    src.p[i] = float(i & 1023);
    dst.p[i] = 0.0f;
  }
  out.copy_gbps = copy_gbps(k, src.p, dst.p, n, threads, 5);
  out.copy_gbps_1core = copy_gbps(k, src.p, dst.p, n, 1, 3);
  return out;
}

namespace {
// Every core has its own FMA units, so all cores together must clearly beat one. When they do
// not, other processes took cores during the measurement (a shared machine): it is not kept.
bool plausible(const Roofline& r, int cores) { return cores <= 1 || r.peak_gflops >= 1.3 * r.peak_gflops_1core; }
}  // namespace

Roofline roofline(bool remeasure) {
  static std::mutex mu;
  static std::optional<Roofline> memo;
  std::lock_guard lock(mu);
  if (memo && !remeasure) return *memo;

  const CpuInfo& info = cpu_info();
  std::string key = hash_hex(info.model_name + "\n" + info.features_key + "\n" +
                             std::to_string(info.cores));
  std::filesystem::path path = cache_root() / ("roofline-" + key.substr(0, 16) + ".json");
  if (!remeasure) {
    std::string problem;
    std::optional<std::string> text = read_cache_file(path, &problem);
    std::optional<nlohmann::json> j = text ? runtime::parse_json(*text, &problem) : std::nullopt;
    // A damaged, foreign or old-format file (a NaN figure is written as null) is measured again.
    auto figure = [&](const char* key) { return j ? runtime::finite_number(*j, key).value_or(0.0) : 0.0; };
    Roofline cached{figure("peak_gflops"), figure("peak_gflops_1core"), figure("copy_gbps"), figure("copy_gbps_1core")};
    if (cached.peak_gflops > 0 && cached.peak_gflops_1core > 0 && cached.copy_gbps > 0 && cached.copy_gbps_1core > 0 &&
        !runtime::measure_again(!plausible(cached, info.cores), figure("measured_at"))) {
      memo = cached;
      return *memo;
    }
  }
  Roofline r = measure_roofline();
  if (!plausible(r, info.cores)) r = measure_roofline();
  if (!plausible(r, info.cores))
    fmt::print(stderr,
               "deuteron: the roofline looks disturbed by other processes ({} cores: {:.0f} GFLOP/s, one core: "
               "{:.0f}); it is measured again after an hour, or with `deuteron roofline --remeasure`\n",
               info.cores, r.peak_gflops, r.peak_gflops_1core);
  nlohmann::json j = {{"peak_gflops", r.peak_gflops},
                      {"peak_gflops_1core", r.peak_gflops_1core},
                      {"copy_gbps", r.copy_gbps},
                      {"copy_gbps_1core", r.copy_gbps_1core},
                      {"model_name", info.model_name},
                      {"features_key", info.features_key},
                      {"cores", info.cores},
                      {"measured_at", runtime::unix_now()}};
  atomic_write(path, j.dump(2) + "\n");
  memo = r;
  return r;
}

}  // namespace deuteron::cpu
