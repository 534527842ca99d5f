#include "backends/cpu/hardware.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
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
    if (level == 2) info.l2_bytes = size, info.l2_ways = ways;
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
  // $DEUTERON_CPU_ISA=avx2: act as an AVX2-only CPU (the generated code is built with
  // -mno-avx512f, the plans and the roofline use 256-bit vectors), to test that path here.
  if (runtime::env_choice("DEUTERON_CPU_ISA", {"native", "avx2"}) == "avx2") {
    info.avx512f = info.avx512bw = info.avx512vl = info.avx512_bf16 = info.avx512_fp16 = info.amx = false;
    info.isa_limit = "avx2";
    info.features_key += ":isa=avx2";
  }
  info.simd_bytes = info.avx512f ? 64 : 32;
  // /sys cache info is missing in some VMs and CPUID may be masked: assume a recent server core.
  if (info.l1d_bytes <= 0) info.l1d_bytes = 48 * KiB;
  if (info.l2_bytes <= 0) info.l2_bytes = 1 * MiB;
  if (info.l2_ways <= 0) info.l2_ways = 8;  // the fewest of recent server cores (AMD's)
  if (info.l3_bytes <= 0) info.l3_bytes = 32 * MiB;
  // A VM sees its socket's whole L3 (300 MiB on a 2-vCPU Emerald Rapids guest, whose CPUID says
  // two threads share it) but gets a share of it beside the other tenants: count at most 16 MiB a
  // core. Measured there, softmax with its output streamed over cached (5 alternating rounds):
  // 1.06x at 20 MB of output, 0.96x at 41 MB, 0.70x at 82 MB.
  info.l3_bytes = std::min(info.l3_bytes, std::max<int64_t>(info.cores, 1) * 16 * MiB);
  // At least a page of scratch per thread, at most a TiB.
  if (auto v = runtime::env_bytes("DEUTERON_L2_BYTES", 4 * KiB, int64_t(1) << 40)) info.l2_bytes = *v;
  if (auto v = runtime::env_bytes("DEUTERON_L1D_BYTES", 4 * KiB, 16 * MiB)) info.l1d_bytes = *v;
  if (auto v = runtime::env_bytes("DEUTERON_L3_BYTES", 64 * KiB, int64_t(1) << 40)) info.l3_bytes = *v;
  return info;
}

// ---------------------------------------------------------------------------------------------
// Roofline kernels. Compiled with target attributes so this file needs no -march flag; the
// caller picks the variant the CPU supports.

using FmaFn = float (*)(int64_t iters);
using CopyFn = void (*)(const float* src, float* dst, size_t n);  // n: multiple of 64
using ReadFn = float (*)(const float* src, size_t n);              // n: multiple of 64

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
// Non-temporal stores write whole lines to memory without reading them first.
__attribute__((target("avx512f"))) void copy_nt_avx512(const float* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i += 16) _mm512_stream_ps(dst + i, _mm512_load_ps(src + i));
  _mm_sfence();
}
__attribute__((target("avx"))) void copy_nt_avx(const float* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(dst + i, _mm256_load_ps(src + i));
  _mm_sfence();
}
// Four independent sums, so the adds' latency does not bound the loads.
__attribute__((target("avx512f"))) float read_avx512(const float* src, size_t n) {
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  for (size_t i = 0; i < n; i += 64) {
    a = _mm512_add_ps(a, _mm512_load_ps(src + i));
    b = _mm512_add_ps(b, _mm512_load_ps(src + i + 16));
    c = _mm512_add_ps(c, _mm512_load_ps(src + i + 32));
    d = _mm512_add_ps(d, _mm512_load_ps(src + i + 48));
  }
  // Summed through memory: GCC 12's _mm512_reduce_add_ps warns about its own undefined lanes.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}
__attribute__((target("avx"))) float read_avx(const float* src, size_t n) {
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  for (size_t i = 0; i < n; i += 32) {
    a = _mm256_add_ps(a, _mm256_load_ps(src + i));
    b = _mm256_add_ps(b, _mm256_load_ps(src + i + 8));
    c = _mm256_add_ps(c, _mm256_load_ps(src + i + 16));
    d = _mm256_add_ps(d, _mm256_load_ps(src + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  float s = 0;
  for (float x : out) s += x;
  return s;
}

// bf16 products as generated code runs them (deuteron_gemm.h). vdpbf16ps: each 32-bit lane adds
// a pair of bf16 products, 64 flops an instruction; its latency (about 6 cycles on a Zen 4) x 2
// pipes needs at least 12 accumulators.
__attribute__((target("avx512f,avx512bf16"))) float dot_pairs_avx512(int64_t iters) {
  constexpr int N = 16;
  __m512 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm512_set1_ps(float(j));
  // Products of 2^-10: the sums grow by 2^-19 a step, far from overflow and from denormals.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3a80);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, a);
  }
  for (int j = 1; j < N; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc[0]);
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}
constexpr double kFlopsDotPairs = 16 * 16 * 2 * 2;

// AMX (tdpbf16ps): four 16 x 16 C tiles from two A and two B tiles, 16 x 16 x 32 x 2 flops each,
// the 2 x 2 block deuteron_gemm.h's tile path keeps. The caller has the tile state granted. The
// instructions are written as in that header (GCC needs no target flag for inline asm).
float tiles_amx(int64_t iters) {
  // The tile configuration: palette 1 (byte 0); tiles 0-7 of 64 bytes a row (16-bit words at
  // byte 16) and 16 rows (bytes at 48).
  alignas(64) uint8_t config[64] = {1};
  for (int t = 0; t < 8; ++t) {
    config[16 + 2 * t] = 64;
    config[48 + t] = 16;
  }
  asm volatile("ldtilecfg %0" ::"m"(config));
  asm volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3\n\t"
               "tilezero %%tmm4\n\ttilezero %%tmm5\n\ttilezero %%tmm6\n\ttilezero %%tmm7" ::);
  for (int64_t i = 0; i < iters; ++i)
    asm volatile("tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\ttdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
                 "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\ttdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::);
  asm volatile("tilerelease" ::);
  return 0;
}
constexpr double kFlopsTiles = 4 * 16 * 16 * 32 * 2;

// Linux grants a process the AMX tile state only on request.
bool amx_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
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
float read_generic(const float* src, size_t n) {
  float s = 0;
  for (size_t i = 0; i < n; ++i) s += src[i];
  return s;
}

struct Kernels {
  FmaFn fma;
  double flops_per_iter;
  CopyFn copy, copy_nt;
  ReadFn read;
};

Kernels pick_kernels(const CpuInfo& info) {
#ifdef DEUTERON_X86
  if (info.avx512f && info.fma) return {fma_avx512, kFlopsAvx512, copy_avx512, copy_nt_avx512, read_avx512};
  if (info.avx2 && info.fma) return {fma_avx2, kFlopsAvx2, copy_avx, copy_nt_avx, read_avx};
#endif
  (void)info;
  return {fma_generic, kFlopsGeneric, copy_generic, copy_generic, read_generic};
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CPU time this thread has used, in seconds (not the time it waited for a core).
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
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

// A loop of arithmetic from registers (FMAs, bf16 products) and the flops of one iteration.
struct ArithmeticLoop {
  FmaFn run = nullptr;
  double flops_per_iter = 0;
};

// Iterations of `loop` that take about `seconds` on one core (the first runs warm up clocks).
int64_t calibrate(ArithmeticLoop loop, double seconds) {
  int64_t iters = 1 << 10;
  double dt = 0;
  for (;;) {
    double t0 = now();
    g_sink = loop.run(iters);
    dt = now() - t0;
    if (dt > seconds / 10 || iters > (int64_t(1) << 40)) break;
    iters *= 4;
  }
  return std::max<int64_t>(1, int64_t(double(iters) * seconds / dt));
}

// GFLOP/s of the best of `reps` runs of `iters` iterations on `threads` threads (1: this one).
double loop_gflops(ArithmeticLoop loop, int threads, int64_t iters, int reps) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    int used = 1;
    double t0 = now();
    if (threads == 1) {
      g_sink = loop.run(iters);
    } else {
#pragma omp parallel num_threads(threads)
      {
        float v = loop.run(iters);
        if (thread_id() == 0) {
          used = team_size();
          g_sink = v;
        }
      }
    }
    double dt = now() - t0;
    best = std::max(best, used * double(iters) * loop.flops_per_iter / dt * 1e-9);
  }
  return best;
}

// The vdpbf16ps loop, where the CPU has it.
std::optional<ArithmeticLoop> dot_pairs_loop(const CpuInfo& info) {
#ifdef DEUTERON_X86
  if (info.avx512_bf16) return ArithmeticLoop{dot_pairs_avx512, kFlopsDotPairs};
#endif
  (void)info;
  return std::nullopt;
}

// The loop of the unit generated code runs bf16 products on, and its name (see bf16_pairs_pay).
std::pair<ArithmeticLoop, std::string> bf16_product_loop(const CpuInfo& info, const Kernels& k) {
#ifdef DEUTERON_X86
  if (info.amx && amx_granted()) return {{tiles_amx, kFlopsTiles}, "AMX tiles (tdpbf16ps)"};
#endif
  if (bf16_pairs_pay()) return {*dot_pairs_loop(info), "vdpbf16ps"};
  return {{k.fma, k.flops_per_iter}, "the f32 FMA (bf16 widened)"};
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

// The two arrays of bandwidth passes: each at least 4x L3 and `floor` bytes (so that neither
// the caches nor the timer's resolution matter: a pass takes tens of ms), at most 1/free_share
// of free memory, and written once on `threads` threads (reading untouched memory would hit the
// shared zero page and overstate bandwidth).
struct PassArrays {
  size_t n;  // floats in each
  Buffer src, dst;
  PassArrays(int64_t floor, int64_t free_share, int threads)
      : n(floats_for(floor, free_share)), src(n), dst(n) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; ++i) {
      src.p[i] = float(i & 1023);
      dst.p[i] = 0.0f;
    }
  }
  // GB/s of a copy pass that took `seconds`: bytes read + written.
  double copy_gbps(double seconds) const { return 2 * double(n) * sizeof(float) / seconds * 1e-9; }

 private:
  static size_t floats_for(int64_t floor, int64_t free_share) {
    int64_t want = std::max(4 * cpu_info().l3_bytes, floor);
    int64_t free_bytes = int64_t(sysconf(_SC_AVPHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
    if (free_bytes > 0) want = std::min(want, free_bytes / free_share);
    want = std::clamp<int64_t>(want, 16 * MiB, 2048 * MiB);
    return size_t(want) / sizeof(float) / 64 * 64;
  }
};

enum class Pass { Copy, CopyNt, Read };

// Seconds of one pass over n floats on `threads` threads, in 1 MiB chunks handed out as threads
// free up (as generated kernels hand out grid steps), so that a thread sharing its core with
// another process does not hold the pass back.
double timed_pass(const Kernels& k, Pass pass, const float* src, float* dst, size_t n, int threads) {
  constexpr size_t kChunk = 256 * 1024;  // floats; a multiple of 64, so loads and stores stay aligned
  const long chunks = long((n + kChunk - 1) / kChunk);
  double t0 = now();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (long c = 0; c < chunks; ++c) {
    size_t begin = size_t(c) * kChunk, len = std::min(kChunk, n - begin);
    switch (pass) {
      case Pass::Copy: k.copy(src + begin, dst + begin, len); break;
      case Pass::CopyNt: k.copy_nt(src + begin, dst + begin, len); break;
      case Pass::Read: {
        float v = k.read(src + begin, len);
        if (v == -1.0f) g_sink = v;  // keeps the sum alive (the data never sums to -1)
        break;
      }
    }
  }
  return now() - t0;
}

Bandwidth summarize(std::vector<double> rates) {
  std::sort(rates.begin(), rates.end());
  size_t m = rates.size();
  return {rates.back(), m % 2 ? rates[m / 2] : 0.5 * (rates[m / 2 - 1] + rates[m / 2]), rates.front()};
}

}  // namespace

const CpuInfo& cpu_info() {
  static const CpuInfo info = detect();
  return info;
}

double bf16_pair_speedup() {
  static const double speedup = [] {
    const CpuInfo& info = cpu_info();
    std::optional<ArithmeticLoop> pairs = dot_pairs_loop(info);
    if (!pairs) return 0.0;
    // On this thread, alternating runs of about 2 ms, each timed by the CPU time it used: the
    // decision changes the build flags, so every process must reach the same one, also while
    // other processes take turns on its core (wall time then swings by whole 4 ms time
    // slices). The best of seven keeps what is left out. Tens of ms in all, once a process.
    const Kernels k = pick_kernels(info);
    const ArithmeticLoop fma{k.fma, k.flops_per_iter};
    int64_t fma_iters = calibrate(fma, 0.002), pair_iters = calibrate(*pairs, 0.002);
    auto rate = [](ArithmeticLoop loop, int64_t iters) {
      double t0 = thread_seconds();
      g_sink = loop.run(iters);
      double dt = thread_seconds() - t0;
      return dt > 0 ? double(iters) * loop.flops_per_iter / dt : 0.0;
    };
    double fma_rate = 0, pair_rate = 0;
    for (int r = 0; r < 7; ++r) {
      fma_rate = std::max(fma_rate, rate(fma, fma_iters));
      pair_rate = std::max(pair_rate, rate(*pairs, pair_iters));
    }
    return fma_rate > 0 ? pair_rate / fma_rate : 0.0;
  }();
  return speedup;
}

bool bf16_pairs_pay() {
#ifdef DEUTERON_X86
  if (cpu_info().amx && amx_granted()) return true;
#endif
  return bf16_pair_speedup() > 1.0;
}

Roofline measure_roofline() {
  const CpuInfo& info = cpu_info();
  const Kernels k = pick_kernels(info);
  const int threads = info.cores;
  const runtime::CpuUse load_from = runtime::cpu_use();
  Roofline out;

  // FMA and bf16 products: the best of 7 runs of about 0.1 s. On a shared host another
  // tenant takes a core for stretches of tens of ms; more, shorter runs leave more of them
  // clear (a Zen 4, session 26: best of 3 x 0.2 s gave 222 GFLOP/s in a benchmark run, 230-235
  // when quiet, the matmul's own time unchanged).
  constexpr int kRuns = 7;
  const ArithmeticLoop fma{k.fma, k.flops_per_iter};
  int64_t iters = calibrate(fma, 0.1);
  out.peak_gflops_1core = loop_gflops(fma, 1, iters, kRuns);
  out.peak_gflops = loop_gflops(fma, threads, iters, kRuns);
  auto [bf16, unit] = bf16_product_loop(info, k);
  iters = calibrate(bf16, 0.1);
  out.bf16_peak_gflops_1core = loop_gflops(bf16, 1, iters, kRuns);
  out.bf16_peak_gflops = loop_gflops(bf16, threads, iters, kRuns);
  out.bf16_unit = unit;

  // Bandwidth: arrays of at least 512 MiB, at most a quarter of free memory.
  const PassArrays a(512 * MiB, 4, threads);
  // One warm-up round, then the kinds interleaved: a disturbance (another process, the host's
  // other VMs) falls on all of them alike, and the best sample keeps it out.
  constexpr int kSamples = 9;
  const double bytes = double(a.n) * sizeof(float);
  std::vector<double> copy, copy_nt, read, copy_1core;
  for (int r = 0; r <= kSamples; ++r) {
    double tc = timed_pass(k, Pass::Copy, a.src.p, a.dst.p, a.n, threads);
    double tn = timed_pass(k, Pass::CopyNt, a.src.p, a.dst.p, a.n, threads);
    double tr = timed_pass(k, Pass::Read, a.src.p, a.dst.p, a.n, threads);
    if (r == 0) continue;
    copy.push_back(a.copy_gbps(tc));
    copy_nt.push_back(a.copy_gbps(tn));
    read.push_back(bytes / tr * 1e-9);
  }
  for (int r = 0; r <= 3; ++r) {
    double t = timed_pass(k, Pass::Copy, a.src.p, a.dst.p, a.n, 1);
    if (r > 0) copy_1core.push_back(a.copy_gbps(t));
  }
  out.copy = summarize(copy);
  out.copy_nt = summarize(copy_nt);
  out.read = summarize(read);
  out.copy_gbps_1core = summarize(copy_1core).best;
  out.samples = kSamples;
  out.others_cores = runtime::others_cores(load_from, runtime::cpu_use());
  return out;
}

// Arrays of at least 64 MiB (a pass beside each kernel run), at most an eighth of free memory.
struct CopyProbe::Arrays : PassArrays {
  Arrays() : PassArrays(64 * MiB, 8, cpu_info().cores) {}
};

CopyProbe::CopyProbe() : arrays_(std::make_unique<Arrays>()) {
  pass_gbps();  // a warm-up pass
}

CopyProbe::~CopyProbe() = default;

double CopyProbe::pass_gbps() {
  const Arrays& a = *arrays_;
  return a.copy_gbps(
      timed_pass(pick_kernels(cpu_info()), Pass::Copy, a.src.p, a.dst.p, a.n, cpu_info().cores));
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
    auto figure = [&](const std::string& key) { return j ? runtime::finite_number(*j, key.c_str()).value_or(0.0) : 0.0; };
    auto bandwidth = [&](const std::string& key) {
      return Bandwidth{figure(key), figure(key + "_median"), figure(key + "_min")};
    };
    Roofline cached;
    cached.peak_gflops = figure("peak_gflops");
    cached.peak_gflops_1core = figure("peak_gflops_1core");
    cached.copy = bandwidth("copy_gbps");
    cached.copy_nt = bandwidth("copy_nt_gbps");
    cached.read = bandwidth("read_gbps");
    cached.copy_gbps_1core = figure("copy_gbps_1core");
    cached.others_cores = figure("others_cores");
    cached.samples = int(figure("samples"));
    cached.bf16_peak_gflops = figure("bf16_peak_gflops");
    cached.bf16_peak_gflops_1core = figure("bf16_peak_gflops_1core");
    if (j && j->contains("bf16_unit") && (*j)["bf16_unit"].is_string()) cached.bf16_unit = (*j)["bf16_unit"];
    bool complete = cached.peak_gflops > 0 && cached.peak_gflops_1core > 0 && cached.copy_gbps_1core > 0 &&
                    cached.samples > 0 && cached.bf16_peak_gflops > 0 && cached.bf16_peak_gflops_1core > 0 &&
                    !cached.bf16_unit.empty();
    for (const Bandwidth& b : {cached.copy, cached.copy_nt, cached.read})
      complete = complete && b.min > 0 && b.median >= b.min && b.best >= b.median;
    if (complete && !runtime::measure_again(!plausible(cached, info.cores), figure("measured_at"))) {
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
                      {"copy_gbps_1core", r.copy_gbps_1core},
                      {"bf16_peak_gflops", r.bf16_peak_gflops},
                      {"bf16_peak_gflops_1core", r.bf16_peak_gflops_1core},
                      {"bf16_unit", r.bf16_unit},
                      {"samples", r.samples},
                      {"others_cores", r.others_cores},
                      {"model_name", info.model_name},
                      {"features_key", info.features_key},
                      {"cores", info.cores},
                      {"measured_at", runtime::unix_now()}};
  for (auto [key, b] : {std::pair{"copy_gbps", r.copy}, {"copy_nt_gbps", r.copy_nt}, {"read_gbps", r.read}}) {
    j[key] = b.best;
    j[std::string(key) + "_median"] = b.median;
    j[std::string(key) + "_min"] = b.min;
  }
  atomic_write(path, j.dump(2) + "\n");
  memo = r;
  return r;
}

}  // namespace deuteron::cpu
