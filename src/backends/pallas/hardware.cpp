#include "backends/pallas/hardware.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "deuteron/error.h"

namespace deuteron::pallas {

namespace {

constexpr int64_t MiB = 1024 * 1024;

// Sources (as collected in docs/TPU.md):
//  [jax]   jax 0.10.2, jax/_src/pallas/mosaic/tpu_info.py (_get_tpu_info_impl): VMEM per core,
//          lanes (128) and sublanes (8), MXU count and width, HBM bandwidth and bf16 peak
//          (per chip, divided by the TensorCores per chip), TensorCores per chip and megacore.
//  [gcp]   Google Cloud TPU system architecture pages: cloud.google.com/tpu/docs/v4, /v5e,
//          /v5p, /v6e, /tpu7x (peak bf16, HBM bandwidth, cores per chip, megacore).
//  [pallas] JAX Pallas TPU docs (docs.jax.dev/en/latest/pallas/tpu/): the default scoped VMEM
//          limit is 16 MiB on v4/v5 and 32 MiB on v6e and later; raised with
//          CompilerParams(vmem_limit_bytes=...) up to the physical VMEM.
//  [tpu.md] docs/TPU.md: the 0.35 us per grid step measured on v5e (derived from JAX's
//          matmul tutorial timings).
//  [book]  "How to Scale Your Model" (jax-ml.github.io/scaling-book/tpus): the VPU is a
//          (sublanes x lanes) SIMD unit with 4 ALUs per element slot (described for v5p).
//
// Derived figures (no Google page publishes them):
//  clock_hz = MXU peak per core / (2 flops x mxus_per_core x mxu_width^2). This gives the
//    published 1.05 GHz (v4), 1.5 GHz (v5e) and 1.75 GHz (v5p). For v6e and v7x, [jax]'s 2
//    MXUs per core would give 3.5 and 4.4 GHz, which no TPU runs at; the clock is computed
//    with 4 per core instead (1.75 and 2.2 GHz), and both the clock and the VPU figure are
//    uncertain there.
//  vpu_f32_flops = sublanes x lanes x 4 ALUs [book] x clock x cores per device: f32
//    operations (an FMA counts once). Assumes every generation has v5p's 4 ALUs; uncertain.
constexpr int kVpuAlus = 4;

void derive_rates(TpuGeneration& g, int mxus_for_clock) {
  double per_core = g.bf16_flops / g.cores_per_device;
  g.clock_hz = per_core / (2.0 * mxus_for_clock * g.mxu_width * g.mxu_width);
  g.vpu_f32_flops = double(g.sublanes) * g.lanes * kVpuAlus * g.clock_hz * g.cores_per_device;
  g.mxu = fmt::format("{} x {}x{} per core", g.mxus_per_core, g.mxu_width, g.mxu_width);
}

std::vector<TpuGeneration> make_table() {
  std::vector<TpuGeneration> t;
  {
    TpuGeneration g;
    g.name = "v4";
    g.runner_chip = "v4";
    g.cores_per_chip = 2;            // [gcp], [jax]
    g.cores_per_device = 2;          // megacore [gcp]
    g.vmem_bytes = 16 * MiB;         // [jax]
    g.scoped_vmem_bytes = 16 * MiB;  // unknown in [pallas]; the whole VMEM, uncertain
    g.scoped_vmem_uncertain = true;
    g.hbm_bytes_per_s = 1.2e12;      // [gcp], [jax] 1.23e12
    g.bf16_flops = 275e12;           // [gcp], [jax]
    g.mxus_per_core = 4;             // [jax] num_mxus=4, column size 128
    g.mxu_width = 128;
    derive_rates(g, g.mxus_per_core);  // 1.05 GHz; VPU 8.6e12
    g.sources = "[jax] tpu_info.py; [gcp] cloud.google.com/tpu/docs/v4; VPU derived ([book])";
    t.push_back(g);
  }
  {
    TpuGeneration g;
    g.name = "v5e";
    g.runner_chip = "v5e";
    g.cores_per_chip = 1;               // [gcp], [jax]
    g.cores_per_device = 1;             // [gcp]
    g.vmem_bytes = 128 * MiB;           // [jax]
    g.scoped_vmem_bytes = 16 * MiB;     // [pallas]
    g.hbm_bytes_per_s = 0.82e12;        // [gcp], [jax] 8.20e11
    g.bf16_flops = 197e12;              // [gcp], [jax] 1.97e14
    g.mxus_per_core = 4;                // [jax]
    g.mxu_width = 128;
    derive_rates(g, g.mxus_per_core);   // 1.5 GHz; VPU 6.2e12
    g.seconds_per_grid_step = 0.35e-6;  // [tpu.md]
    g.sources = "[jax] tpu_info.py; [gcp] cloud.google.com/tpu/docs/v5e; [pallas] scoped limit; VPU derived ([book])";
    t.push_back(g);
  }
  {
    TpuGeneration g;
    g.name = "v5p";
    g.runner_chip = "v5p";
    g.cores_per_chip = 2;            // [gcp], [jax]
    g.cores_per_device = 2;          // megacore [gcp]
    g.vmem_bytes = 64 * MiB;         // [jax] (one Google page says 96 MB)
    g.scoped_vmem_bytes = 16 * MiB;  // [pallas], uncertain
    g.scoped_vmem_uncertain = true;
    g.hbm_bytes_per_s = 2.46e12;     // [jax]; [gcp] pages say 2.5 to 2.8 TB/s
    g.bf16_flops = 459e12;           // [gcp], [jax]
    g.mxus_per_core = 4;             // [jax]
    g.mxu_width = 128;
    derive_rates(g, g.mxus_per_core);  // 1.75 GHz; VPU 1.4e13 per device (two cores)
    g.sources = "[jax] tpu_info.py; [gcp] cloud.google.com/tpu/docs/v5p; [pallas] scoped limit; VPU derived ([book])";
    t.push_back(g);
  }
  {
    TpuGeneration g;
    g.name = "v6e";
    g.runner_chip = "v6e";
    g.cores_per_chip = 1;            // [gcp], [jax]
    g.cores_per_device = 1;          // [gcp]
    g.vmem_bytes = 128 * MiB;        // [jax]
    g.scoped_vmem_bytes = 32 * MiB;  // [pallas], uncertain
    g.scoped_vmem_uncertain = true;
    g.hbm_bytes_per_s = 1.64e12;  // [gcp], [jax]
    g.bf16_flops = 918e12;        // [gcp]; [jax] 9.20e14
    g.mxus_per_core = 2;          // [jax] num_mxus=2, column size 256
    g.mxu_width = 256;
    derive_rates(g, 4);           // 1.75 GHz with 4 MXUs (see above); VPU 7.2e12, uncertain
    g.sources = "[jax] tpu_info.py; [gcp] cloud.google.com/tpu/docs/v6e; [pallas] scoped limit; clock and VPU derived";
    t.push_back(g);
  }
  {
    TpuGeneration g;
    g.name = "v7x";
    g.runner_chip = "7x";
    g.cores_per_chip = 2;            // [gcp], [jax]
    g.cores_per_device = 1;          // one JAX device per TensorCore [gcp]
    g.vmem_bytes = 64 * MiB;         // [jax]
    g.scoped_vmem_bytes = 32 * MiB;  // [pallas], uncertain
    g.scoped_vmem_uncertain = true;
    g.hbm_bytes_per_s = 3.7e12;      // [jax] 7.40e12 per chip / 2 cores
    g.bf16_flops = 1150e12;          // [jax] 2.31e15 per chip / 2 cores; [gcp] 2307 TF per chip
    g.mxus_per_core = 2;             // [jax]
    g.mxu_width = 256;
    derive_rates(g, 4);              // 2.2 GHz with 4 MXUs (see above); VPU 9.0e12, uncertain
    g.sources = "[jax] tpu_info.py; [gcp] cloud.google.com/tpu/docs/tpu7x; [pallas] scoped limit; clock and VPU derived";
    t.push_back(g);
  }
  return t;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

const std::vector<TpuGeneration>& tpu_generations() {
  static const std::vector<TpuGeneration> table = make_table();
  return table;
}

const TpuGeneration& tpu_generation(const std::string& name) {
  std::string want = lower(name);
  if (want == "7x" || want == "tpu7x") want = "v7x";
  for (const TpuGeneration& g : tpu_generations())
    if (g.name == want) return g;
  std::string known;
  for (const TpuGeneration& g : tpu_generations()) known += (known.empty() ? "" : ", ") + g.name;
  throw ArgumentError(fmt::format("unknown TPU generation '{}'", name), "",
                      fmt::format("known generations: {} (set DEUTERON_TPU_GENERATION to one)", known));
}

const TpuGeneration& default_tpu_generation() {
  const char* env = std::getenv("DEUTERON_TPU_GENERATION");
  return tpu_generation(env && *env ? env : "v5e");
}

int sublane_tiling(const TpuGeneration& g, DType t) {
  int bits = dtype_size(t) * 8;
  if (t == DType::boolean) bits = 32;  // masks live in 32-bit layouts
  return bits >= 32 ? g.sublanes : g.sublanes * (32 / bits);
}

int64_t padded_vmem_bytes(const TpuGeneration& g, const std::vector<int64_t>& shape, DType t) {
  auto round_up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  int64_t cols = shape.empty() ? 1 : shape.back();
  int64_t rows = shape.size() >= 2 ? shape[shape.size() - 2] : 1;
  int64_t outer = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) outer *= shape[i];
  int64_t elem = t == DType::boolean ? 4 : dtype_size(t);
  return outer * round_up(rows, sublane_tiling(g, t)) * round_up(cols, g.lanes) * elem;
}

}  // namespace deuteron::pallas
