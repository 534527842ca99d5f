#include "backends/cpu/backend.h"

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/cpu/codegen.h"
#include "backends/cpu/compiler.h"
#include "backends/cpu/hardware.h"
#include "backends/cpu/packing.h"
#include "backends/cpu/refine.h"
#include "backends/cpu/space.h"
#include "deuteron/error.h"
#include "runtime/disk_cache.h"

namespace deuteron::embedded {
// The runtime headers (runtime/*.h), carried by the library (CMakeLists.txt: deuteron_embed).
extern const std::string_view deuteron_cpu_h, deuteron_gemm_h;
}  // namespace deuteron::embedded

namespace deuteron::cpu {

namespace {

// Where the generated code finds deuteron_cpu.h: $DEUTERON_CPU_RUNTIME_DIR (a folder to edit
// them in), else the library's own copy written into the cache, so kernels compile wherever
// the library was built, installed or linked.
std::string runtime_dir() {
  if (const char* d = std::getenv("DEUTERON_CPU_RUNTIME_DIR")) return d;
  return resource_dir("cpu-runtime", {{"deuteron_cpu.h", embedded::deuteron_cpu_h},
                                      {"deuteron_gemm.h", embedded::deuteron_gemm_h}})
      .string();
}

using KernelFn = void(void* const*, const backends::ScalarValue*, char*, long, int64_t*);

class CpuExecutable : public backends::Executable {
 public:
  CpuExecutable(std::shared_ptr<SharedObject> so, KernelFn* fn, int64_t scratch_per_thread, int threads,
                const plan::Plan& p)
      : so_(std::move(so)), fn_(fn), per_thread_(scratch_per_thread), threads_(threads), checks_(index_checks(p)) {
    int64_t bytes = std::max<int64_t>(per_thread_ * threads_, 64);
    scratch_.reset(static_cast<char*>(std::aligned_alloc(64, size_t((bytes + 63) / 64 * 64))));
  }
  // Traced: the source's `<entry>_trace` pointer, aimed at 3 doubles per grid step.
  void trace_into(double** slot, int64_t grid_size) {
    trace_slot_ = slot;
    trace_.assign(size_t(3 * grid_size), 0.0);
  }
  void run(const std::vector<Tensor>& tensors, const std::vector<backends::ScalarValue>& scalars) override {
    std::vector<void*> ptrs;
    for (const Tensor& t : tensors) ptrs.push_back(t.data());
    int64_t status[2] = {0, 0};
    if (trace_slot_) *trace_slot_ = trace_.data();
    fn_(ptrs.data(), scalars.data(), scratch_.get(), long(per_thread_), status);
    if (status[0] > 0 && size_t(status[0]) <= checks_.size()) {
      const IndexCheck& c = checks_[size_t(status[0] - 1)];
      throw RuntimeError(fmt::format("index {} is out of range for {}", status[1], c.what), c.where,
                         "the index tensor holds a value outside the dim; the outputs are incomplete");
    }
  }
  std::vector<StepTime> step_times() const override {
    std::vector<StepTime> out;
    double first = 0;
    for (size_t i = 0; i + 2 < trace_.size(); i += 3) first = i == 0 ? trace_[1] : std::min(first, trace_[i + 1]);
    for (size_t i = 0; i + 2 < trace_.size(); i += 3)
      out.push_back({int(trace_[i]), int64_t(i / 3), trace_[i + 1] - first, trace_[i + 2] - first});
    return out;
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::shared_ptr<SharedObject> so_;
  KernelFn* fn_;
  int64_t per_thread_;
  int threads_;
  std::vector<IndexCheck> checks_;  // for the message of a failed one
  std::unique_ptr<char, Free> scratch_;
  double** trace_slot_ = nullptr;
  std::vector<double> trace_;
};

}  // namespace

config::TargetLimits CpuBackend::limits() const {
  const CpuInfo& info = cpu_info();
  config::TargetLimits l;
  l.cores = info.cores;
  l.fast_memory_bytes = info.l2_bytes;
  return l;
}

void CpuBackend::extend_space(const ir::Kernel& k, const config::TargetLimits& limits,
                              config::ConfigSpace& space) const {
  cpu::extend_space(k, limits, space);
}

std::function<double()> CpuBackend::copy_probe() const {
  auto probe = std::make_shared<CopyProbe>();
  return [probe] { return probe->pass_gbps(); };
}

std::optional<backends::Roofline> CpuBackend::roofline(bool remeasure) const {
  const CpuInfo& info = cpu_info();
  Roofline r = cpu::roofline(remeasure);
  backends::Roofline out;
  out.hardware = fmt::format("{} ({} cores, {}-bit SIMD, L2 {} KiB per core)", info.model_name, info.cores,
                             info.simd_bytes * 8, info.l2_bytes / 1024);
  out.details = {{"cpu", info.model_name},
                 {"cores", info.cores},
                 {"l2_bytes", info.l2_bytes},
                 {"simd_bytes", info.simd_bytes},
                 {"samples", r.samples},
                 {"others_cores", r.others_cores}};
  for (auto [key, b] : {std::pair{"copy", r.copy}, {"copy_nt", r.copy_nt}, {"read", r.read}})
    out.details[key] = {{"best_gbps", b.best}, {"median_gbps", b.median}, {"min_gbps", b.min}, {"spread", b.spread()}};
  out.peak_gflops = r.peak_gflops;
  out.peak_gflops_1core = r.peak_gflops_1core;
  out.bf16_peak_gflops = r.bf16_peak_gflops;
  out.bf16_unit = r.bf16_unit;
  out.details["bf16"] = {{"peak_gflops", r.bf16_peak_gflops},
                         {"peak_gflops_1core", r.bf16_peak_gflops_1core},
                         {"unit", r.bf16_unit}};
  out.copy_gbps = r.copy.best;
  out.copy_gbps_1core = r.copy_gbps_1core;
  out.read_gbps = r.read.best;
  out.spread = fmt::format(
      "best of {} samples, median and slowest: copy {:.1f}, {:.1f}, {:.1f}; non-temporal copy {:.1f}, {:.1f}, {:.1f}; "
      "read {:.1f}, {:.1f}, {:.1f} GB/s; other processes kept {:.2f} cores busy",
      r.samples, r.copy.best, r.copy.median, r.copy.min, r.copy_nt.best, r.copy_nt.median, r.copy_nt.min, r.read.best,
      r.read.median, r.read.min, r.others_cores);
  return out;
}

std::optional<model::Hardware> CpuBackend::model_hardware(const plan::Plan& p) const {
  const CpuInfo& info = cpu_info();
  Roofline r = cpu::roofline(false);
  const CpuPlan c = cpu::refine(p);
  model::Hardware hw;
  hw.name = fmt::format("{} ({} of {} cores)", info.model_name, c.threads, info.cores);
  hw.cores = std::max(c.threads, 1);
  hw.matrix_flops = r.peak_gflops_1core * 1e9;
  // Products whose operands are all bf16 run on the bf16 unit (AMX tiles, vdpbf16ps or, widened,
  // the f32 FMA: Roofline::bf16_unit).
  bool bf16_products =
      !c.gemms.empty() && std::all_of(c.gemms.begin(), c.gemms.end(), [](const Gemm& g) { return g.bf16_pairs; });
  if (bf16_products && r.bf16_peak_gflops_1core > 0) hw.matrix_flops = r.bf16_peak_gflops_1core * 1e9;
  // An elementwise operation is one vector lane op, where an FMA counts two flops; with its
  // loads, stores and reduction chains the generated loops run at about a third of that
  // (bench/model_validation.py: one-thread layer_norm and softmax rows, 0.31-0.35 of the time
  // measured at half the rate). Vector transcendentals (deuteron_cpu.h) cost about a dozen
  // operations each, on the FMA pipes at their full rate: their element's loads and stores are
  // counted with the vector work (exp_nonpositive in a sum over L1, a Zen 4: 4.7 G/s per core,
  // where this gives 4.9; a third of it, as before, predicted cross_entropy 2.6x and the softmaxes
  // 2.3-4.6x their time).
  hw.vector_flops = r.peak_gflops_1core * 1e9 / 2 / 3;
  hw.transcendental_rate = r.peak_gflops_1core * 1e9 / 2 / 12;
  // Tensors that fit the caches stay there from one call to the next (as in a timing loop or a
  // training step): they move at cache speed, about 8 times one core's DRAM copy rate per core
  // (measured: add [130, 1000], 1.5 MiB, one thread at 104 GB/s where copying DRAM runs at 12).
  double footprint = 0;
  for (const ir::HostTensor& t : p.kernel.tensors) {
    double bytes = dtype_size(t.dtype);
    for (int64_t d : t.shape) bytes *= double(d);
    footprint += bytes;
  }
  bool in_cache = footprint <= double(info.l3_bytes + info.l2_bytes * info.cores);
  // From DRAM, fewer threads than cores get their cores' share (one core cannot draw the
  // whole bandwidth).
  double dram = hw.cores >= info.cores ? r.copy.best : std::min(r.copy.best, hw.cores * r.copy_gbps_1core);
  hw.memory_bytes_per_s = in_cache ? hw.cores * 8 * r.copy_gbps_1core * 1e9 : dram * 1e9;
  // A grid step of the generated loop: its bounds and pointers (measured: add [130, 1000] in
  // blocks of 32 x 2, 2500 steps in 37 us all told).
  // Each row of a block that is not the whole row of its tensor starts a new stream: a TLB
  // miss and a prefetcher restart (measured: add [4096, 4096] in blocks of 1024 x 8, 6.3 M such
  // rows, 18 ms over its time in blocks of 32 x 512 on two cores). Cached tensors pay little.
  hw.segment_seconds = in_cache ? 0.4e-9 : 3e-9;
  hw.step_seconds = 0.015e-6;
  hw.trip_seconds = 0.015e-6;
  // Block products run deuteron_gemm.h's micro-kernel: NR columns, rows in pairs at the edges.
  hw.matrix_tile_rows = 2;
  hw.matrix_tile_cols = int(dot_panel_columns());
  // Per chunk of K the micro-kernel loads and stores its register tile of C (24 loads and 24
  // stores beside 24 FMAs a step with AVX-512, 12 and 12 beside 12 with AVX2): about 3 steps'
  // time. matmul_layernorm 1024^3 in K blocks of 64 (y in place) against 256 (y packed): 2-5%
  // slower in five paired experiments of 5-8 rounds (the model: 3.4%).
  hw.product_k_chunk = dot_k_chunk();
  hw.product_pass_steps = 3;
  hw.overlaps_copies = true;  // hardware prefetch streams the next lines while this block computes
  hw.prefetches_in_place = true;  // ... also for the blocks an inner loop reads in place
  hw.fast_memory_bytes = double(info.l2_bytes);  // a looped reduction's rows, read again by its next pass
  hw.vector_lanes = info.simd_bytes / 4;  // f32 lanes: bf16 storage is computed in f32
  hw.line_bytes = 64;
  return hw;
}

void CpuBackend::refine(plan::Plan& p, const config::TargetLimits& limits) const {
  CpuPlan c = cpu::refine(p, limits);
  p.fast_memory_bytes = c.fast_memory_bytes;
  p.fast_memory_budget = c.fast_memory_budget;
}

std::string CpuBackend::describe(const plan::Plan& p) const {
  return cpu::describe(cpu::refine(p));
}

std::string CpuBackend::emit(const plan::Plan& p) const { return generate(cpu::refine(p)); }

backends::AotVariant CpuBackend::emit_aot(const plan::Plan& base, const std::string& entry, bool general) const {
  CpuPlan p = cpu::refine(base);
  backends::AotVariant v{generate(p, {.entry = entry, .runtime_sizes = general}), entry, scratch_per_thread(p), std::max(p.threads, 1), {}, {}};
  if (general) {  // its scratch follows the call's sizes
    v.scratch_function = entry + "_scratch_per_thread";
    v.scratch_per_thread = 0;
  }
  for (const IndexCheck& c : index_checks(p)) v.index_checks.push_back({p.kernel.ops[size_t(c.op)].tensor, c.dim, c.where});
  return v;
}

std::vector<std::pair<std::string, std::string>> CpuBackend::aot_support_files() const {
  return {{"deuteron_cpu.h", std::string(embedded::deuteron_cpu_h)},
          {"deuteron_gemm.h", std::string(embedded::deuteron_gemm_h)}};
}

namespace {

std::unique_ptr<CpuExecutable> compile_plan(const plan::Plan& base, bool trace) {
  CpuPlan p = cpu::refine(base);
  std::string source = generate(p, {.trace = trace});
  CompileOptions opts;
  std::string dir = runtime_dir();
  opts.include_dirs = {dir};
  opts.precompiled_header = dir + "/deuteron_cpu.h";
  CompileResult r = compile_and_load(p.kernel.name, source, opts);
  auto fn = r.so->function<KernelFn>(entry_name(p));
  auto exe = std::make_unique<CpuExecutable>(r.so, fn, scratch_per_thread(p), p.threads, p);
  if (trace) exe->trace_into(static_cast<double**>(r.so->symbol(entry_name(p) + "_trace")), p.grid_size());
  exe->compiled = r.compiled;
  exe->compile_seconds = r.compile_seconds;
  exe->source_path = r.source_path.string();
  return exe;
}

}  // namespace

std::string CpuBackend::build_identity() const {
  return fmt::format("{} {}", default_compiler(), fmt::join(default_flags(), " "));
}

std::unique_ptr<backends::Executable> CpuBackend::compile(const plan::Plan& p) const { return compile_plan(p, false); }

std::unique_ptr<backends::Executable> CpuBackend::compile_traced(const plan::Plan& p) const {
  return compile_plan(p, true);
}

std::unique_ptr<backends::Backend> make_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace deuteron::cpu
