#include "backends/cpu/backend.h"

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "backends/cpu/codegen.h"
#include "backends/cpu/compiler.h"
#include "backends/cpu/hardware.h"
#include "backends/cpu/refine.h"
#include "backends/cpu/space.h"
#include "deuteron/error.h"

namespace deuteron::cpu {

namespace {

// Where deuteron_cpu.h lives: $DEUTERON_CPU_RUNTIME_DIR, else the source tree it was built from.
std::string runtime_dir() {
  if (const char* d = std::getenv("DEUTERON_CPU_RUNTIME_DIR")) return d;
  return std::string(DEUTERON_SOURCE_DIR) + "/src/backends/cpu/runtime";
}

using KernelFn = void(void* const*, const double*, char*, long, int64_t*);

class CpuExecutable : public backends::Executable {
 public:
  CpuExecutable(std::shared_ptr<SharedObject> so, KernelFn* fn, int64_t scratch_per_thread, int threads,
                const plan::Plan& p)
      : so_(std::move(so)), fn_(fn), per_thread_(scratch_per_thread), threads_(threads), checks_(index_checks(p)) {
    int64_t bytes = std::max<int64_t>(per_thread_ * threads_, 64);
    scratch_.reset(static_cast<char*>(std::aligned_alloc(64, size_t((bytes + 63) / 64 * 64))));
  }
  void run(const std::vector<Tensor>& tensors, const std::vector<double>& scalars) override {
    std::vector<void*> ptrs;
    for (const Tensor& t : tensors) ptrs.push_back(t.data());
    int64_t status[2] = {0, 0};
    fn_(ptrs.data(), scalars.data(), scratch_.get(), long(per_thread_), status);
    if (status[0] > 0 && size_t(status[0]) <= checks_.size()) {
      const IndexCheck& c = checks_[size_t(status[0] - 1)];
      throw RuntimeError(fmt::format("index {} is out of range for {}", status[1], c.what), c.where,
                         "the index tensor holds a value outside the dim; the outputs are incomplete");
    }
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

void CpuBackend::refine(plan::Plan& p, const config::TargetLimits& limits) const {
  CpuPlan c = cpu::refine(p, limits);
  p.fast_memory_bytes = c.fast_memory_bytes;
  p.fast_memory_budget = c.fast_memory_budget;
}

std::string CpuBackend::describe(const plan::Plan& p) const {
  return cpu::describe(cpu::refine(p));
}

std::string CpuBackend::emit(const plan::Plan& p) const { return generate(cpu::refine(p)); }

std::unique_ptr<backends::Executable> CpuBackend::compile(const plan::Plan& base) const {
  CpuPlan p = cpu::refine(base);
  std::string source = generate(p);
  CompileOptions opts;
  std::string dir = runtime_dir();
  opts.include_dirs = {dir};
  opts.precompiled_header = dir + "/deuteron_cpu.h";
  CompileResult r = compile_and_load(p.kernel.name, source, opts);
  auto fn = r.so->function<KernelFn>(entry_name(p));
  auto exe = std::make_unique<CpuExecutable>(r.so, fn, (p.fast_memory_bytes + 63) / 64 * 64, p.threads, p);
  exe->compiled = r.compiled;
  exe->compile_seconds = r.compile_seconds;
  exe->source_path = r.source_path.string();
  return exe;
}

}  // namespace deuteron::cpu
