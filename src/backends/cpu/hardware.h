// What the CPU this process runs on can do: ISA features, caches, and measured peaks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace deuteron::cpu {

struct CpuInfo {
  std::string vendor;      // "GenuineIntel", "AuthenticAMD", ...
  std::string model_name;  // CPUID brand string, e.g. "AMD EPYC 9R45"
  int cores = 1;           // logical CPUs this process may run on
  // ISA features usable here (CPU support and OS-enabled register state).
  bool avx2 = false, fma = false, avx512f = false, avx512bw = false, avx512vl = false;
  bool avx512_bf16 = false, avx512_fp16 = false;
  // AMX tiles + bf16. A process must still ask Linux for permission (arch_prctl) to use them.
  bool amx = false;
  int simd_bytes = 32;  // 64 if avx512f else 32
  // "avx2" when $DEUTERON_CPU_ISA narrows what the generated code may use (the flags above then
  // say AVX2 only, and the compiler gets -mno-avx512f); empty for the CPU's own ISA.
  std::string isa_limit;
  // Per-core L1D and L2; L3 of one instance (shared by several cores).
  int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  // The L2's associativity: lines a multiple of l2_bytes / l2_ways apart compete for these ways.
  int64_t l2_ways = 0;
  // The feature flags above plus CPUID's raw ISA words: code built with -march=native on this
  // CPU runs on any CPU with the same key. For cache keys.
  std::string features_key;
};

// Read once with CPUID. $DEUTERON_L2_BYTES and $DEUTERON_L1D_BYTES override l2_bytes and
// l1d_bytes; $DEUTERON_CPU_ISA=avx2 masks AVX-512.
const CpuInfo& cpu_info();

// One bandwidth figure over samples, in GB/s: the fastest sample (the figure kept, as STREAM
// keeps its best time: another process or the host's other VMs only ever slow a pass down), the
// median and the slowest, which say how disturbed the samples were.
struct Bandwidth {
  double best = 0, median = 0, min = 0;
  double spread() const { return best > 0 ? (best - min) / best : 0; }  // (best - slowest) / best
};

struct Roofline {
  double peak_gflops = 0;        // f32 FMA, all cores
  double peak_gflops_1core = 0;  // f32 FMA, one core
  // Products of bf16 operands, on the unit generated code runs them on (bf16_unit: AMX tiles,
  // vdpbf16ps, or the f32 FMA where bf16 is widened), all cores and one.
  double bf16_peak_gflops = 0, bf16_peak_gflops_1core = 0;
  std::string bf16_unit;
  // Arrays much larger than L3, all cores, in bytes moved per second (read + written for copies).
  Bandwidth copy;     // plain stores, as generated kernels write: each line is read before it is written
  Bandwidth copy_nt;  // non-temporal stores: no read of the destination
  Bandwidth read;     // a read-only sum
  double copy_gbps_1core = 0;  // plain-store copy on one core (best sample)
  double others_cores = 0;     // cores other processes kept busy while it was measured
  int samples = 0;             // per bandwidth figure
};

// The one-core flop rate of vdpbf16ps over the f32 FMA's, measured once a process (tens of ms)
// where the CPU has AVX512_BF16; 0 elsewhere. About 2 on a Zen 4, 0.5 on Intel Xeons.
double bf16_pair_speedup();

// Whether generated code multiplies bf16 operands as they are (AMX tiles where Linux grants
// them, or vdpbf16ps where it outruns the f32 FMA) rather than widening them to f32.
bool bf16_pairs_pay();

// Measures now (a few seconds): FMA peak with the widest vectors the CPU has, and bandwidths on
// arrays much larger than L3, the three kinds interleaved sample by sample so that a disturbance
// touches all of them alike.
Roofline measure_roofline();

// The roofline of this machine: measured once and kept in
// cache_root()/roofline-<hash of model, features, cores>.json (and in memory). A measurement in
// which all cores do not beat one core by 1.3x on FMA was disturbed by other processes: it is
// retried once, and if still disturbed, kept but measured again when an hour old.
Roofline roofline(bool remeasure = false);

// One plain-store copy pass at a time, on all cores, over two arrays of 4x the L3 (at least 64
// MiB, at most an eighth of free memory each), as the roofline measures copy bandwidth.
// `deuteron run --paired-copy` alternates it with a kernel's runs: this host's bandwidth moves by
// tens of percent within minutes, and a pass next to each run sees what the run saw.
class CopyProbe {
 public:
  CopyProbe();
  ~CopyProbe();
  CopyProbe(const CopyProbe&) = delete;
  CopyProbe& operator=(const CopyProbe&) = delete;
  // Times one pass now: bytes read + written per second, in GB/s.
  double pass_gbps();

 private:
  struct Arrays;
  std::unique_ptr<Arrays> arrays_;
};

}  // namespace deuteron::cpu
