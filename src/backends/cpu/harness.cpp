// The CPU target's tuning harness: compile = the backend's compile (which fills the on-disk
// kernel cache); run = deuteron-runner, built from runner_source.h into the cache on first use.
#include <filesystem>
#include <mutex>
#include <sstream>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/cpu/backend.h"
#include "backends/cpu/codegen.h"
#include "backends/cpu/compiler.h"
#include "backends/cpu/hardware.h"
#include "backends/cpu/refine.h"
#include "backends/cpu/runner_source.h"
#include "deuteron/error.h"
#include "runtime/checksum.h"
#include "runtime/disk_cache.h"
#include "runtime/env.h"
#include "runtime/process.h"
#include "runtime/text.h"

namespace deuteron::cpu {

namespace fs = std::filesystem;

namespace {

class CpuHarness : public backends::Harness {
 public:
  explicit CpuHarness(const CpuBackend& backend) : backend_(backend) {}

  void prepare_parent() override {
    (void)cpu_info();
    (void)compiler_identity(default_compiler());
  }

  backends::Prepared compile(const plan::Plan& p) const override {
    std::unique_ptr<backends::Executable> exe = backend_.compile(p);
    // The backend caches <stem>.cpp and <stem>.so side by side (cpu/compiler.h); the entry
    // point's signature is documented in cpu/codegen.h.
    fs::path so = fs::path(exe->source_path).replace_extension(".so");
    backends::Prepared out;
    // The path is one encoded field: a newline or space in the cache path cannot end the
    // command early or start another.
    out.kernel_line = fmt::format("kernel {} {} {} {}", scratch_per_thread(p), std::max(threads(p), 1),
                                  entry_name(p), runtime::encode_field(so.string()));
    out.compiled = exe->compiled;
    out.compile_seconds = exe->compile_seconds;
    return out;
  }

  std::vector<std::string> runner_command() override {
    std::lock_guard lock(mu_);
    std::string compiler = default_compiler();
    std::vector<std::string> flags = {"-O2", "-std=c++17", "-fopenmp"};
    std::string key =
        hash_hex(fmt::format("deuteron-runner v1\n{}\n{}\n{}\n{}", compiler, compiler_identity(compiler),
                             fmt::join(flags, " "), kCpuRunnerSource));
    fs::path dir = cache_root() / "autotune" / "bin";
    fs::path exe = dir / ("deuteron-runner-" + key.substr(0, 16));
    std::error_code ec;
    // Used only when it is ours and intact: a truncated runner makes every candidate "crash".
    if (runtime::ArtifactCheck a = runtime::check_artifact(exe); a.ok()) return {exe.string()};
    else if (a.exists)
      runtime::warn(fmt::format("the tuner's runner {} {}; building it again", exe.string(), a.problem));

    fs::path src = dir / ("deuteron-runner-" + key.substr(0, 16) + ".cpp");
    atomic_write(src, kCpuRunnerSource);
    fs::path tmp = exe;
    tmp += ".tmp-" + unique_suffix();
    std::vector<std::string> argv;
    {
      std::istringstream words(compiler);
      for (std::string w; words >> w;) argv.push_back(w);
    }
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(src.string());
    argv.push_back("-o");
    argv.push_back(tmp.string());
    argv.push_back("-ldl");
    (void)runtime::temp_dir();  // throws, naming TMPDIR, where the compiler could not write its files
    runtime::Captured r = runtime::run_captured(argv, 120, {.search_path = true, .merge_output = true});
    if (r.spawn_error || r.timed_out || !r.exit.success()) {
      fs::remove(tmp, ec);
      std::string why = r.spawn_error ? std::generic_category().message(r.spawn_error)
                        : r.timed_out ? "timed out"
                                      : r.exit.describe();
      throw CompileError(fmt::format("cannot build the autotuner's runner program ({}):\n{}", why, r.out), "",
                         "the source is kept at " + src.string());
    }
    runtime::seal_artifact(tmp, 0700);
    fs::rename(tmp, exe, ec);
    if (ec && !fs::exists(exe)) throw RuntimeError("cannot install " + exe.string() + ": " + ec.message());
    fs::remove(tmp, ec);
    return {exe.string()};
  }

  int threads(const plan::Plan& p) const override { return refine(p).threads; }

  std::string hardware_fingerprint(const config::TargetLimits& l) const override {
    const CpuInfo& info = cpu_info();
    return fmt::format("cpu {} | {} | cores {} | fast memory {}", info.model_name, info.features_key, l.cores,
                       l.fast_memory_bytes);
  }

 private:
  const CpuBackend& backend_;
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<backends::Harness> CpuBackend::harness() const { return std::make_unique<CpuHarness>(*this); }

}  // namespace deuteron::cpu
