// The triton target's tuning harness: a candidate compiles through TritonBackend::compile (the
// module goes into the cache) and runs in the runner's --serve worker, which speaks the CPU
// runner's protocol (backends/cpu/runner_source.h; the differences are listed in
// backends/python/runtime/deuteron_runner.py) and times calls on the GPU with CUDA events.
// Under the interpreter the times only inform; the outputs are checked all the same.
#include <fmt/format.h>

#include "backends/python/runner.h"
#include "backends/triton/backend.h"

namespace deuteron::triton {

namespace {

class TritonHarness : public backends::Harness {
 public:
  explicit TritonHarness(const TritonBackend& backend) : backend_(backend) {}

  // The device probe runs once here, not in every compile worker.
  void prepare_parent() override { (void)backend_.device(); }

  backends::Prepared compile(const plan::Plan& p) const override {
    std::unique_ptr<backends::Executable> exe = backend_.compile(p);
    backends::Prepared out;
    out.kernel_line = static_cast<const python::ModuleExecutable&>(*exe).worker_line();
    out.compiled = exe->compiled;
    return out;
  }

  std::vector<std::string> runner_command() override {
    return python::runner_command(runner_spec(backend_.device().gpu ? "gpu" : "interpret"), {"--serve"});
  }

  // The host only waits for the device.
  int threads(const plan::Plan& p) const override {
    (void)p;
    return 1;
  }

  std::string hardware_fingerprint(const config::TargetLimits& l) const override {
    return fmt::format("triton {} | {} | SMs {} | shared memory {}", default_gpu().name, backend_.device().kind, l.cores,
                       l.fast_memory_bytes);
  }

 private:
  const TritonBackend& backend_;
};

}  // namespace

std::unique_ptr<backends::Harness> TritonBackend::harness() const { return std::make_unique<TritonHarness>(*this); }

}  // namespace deuteron::triton
