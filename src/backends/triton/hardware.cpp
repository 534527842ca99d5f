#include "backends/triton/hardware.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cstdlib>

#include "deuteron/error.h"

namespace deuteron::triton {

namespace {
constexpr int64_t KiB = 1024, MiB = 1024 * KiB;

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

const std::vector<Gpu>& gpus() {
  // Shared memory per SM and per block, registers and the per-thread register limit: the CUDA
  // C++ Programming Guide, "Technical Specifications per Compute Capability" (8.0: 164 KiB per
  // SM, 163 KiB per block; 9.0: 228 KiB per SM, 227 KiB per block; 64 Ki registers per SM, 255
  // per thread). SM counts, L2, HBM bandwidth and peak rates: NVIDIA's A100 datasheet (SXM4
  // 80GB: 108 SMs, 40 MB L2, 2,039 GB/s, 19.5 TFLOPS FP32, 312 TFLOPS BF16 dense) and H100 /
  // H200 datasheets (SXM5: 132 SMs, 50 MB L2, 3.35 TB/s (H100) or 4.8 TB/s (H200), 67 TFLOPS
  // FP32, 989 TFLOPS BF16 dense).
  static const std::vector<Gpu> table = {
      {"a100", "NVIDIA A100 SXM4 80GB", 108, 164 * KiB, 163 * KiB, 65536, 255, 40 * MiB, 2.039e12, 19.5e12, 312e12},
      {"h100", "NVIDIA H100 SXM5 80GB", 132, 228 * KiB, 227 * KiB, 65536, 255, 50 * MiB, 3.35e12, 67e12, 989e12},
      {"h200", "NVIDIA H200 SXM 141GB", 132, 228 * KiB, 227 * KiB, 65536, 255, 50 * MiB, 4.8e12, 67e12, 989e12},
  };
  return table;
}

const Gpu& gpu(const std::string& name) {
  std::string want = lower(name);
  std::vector<std::string> known;
  for (const Gpu& g : gpus()) {
    if (g.name == want) return g;
    known.push_back(g.name);
  }
  throw ArgumentError(fmt::format("unknown GPU '{}'", name), "", fmt::format("known GPUs: {}", fmt::join(known, ", ")));
}

const Gpu& default_gpu() {
  const char* env = std::getenv("DEUTERON_GPU");
  return gpu(env && *env ? env : "h100");
}

}  // namespace deuteron::triton
