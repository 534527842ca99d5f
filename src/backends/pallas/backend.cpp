#include "backends/pallas/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "backends/pallas/codegen.h"
#include "backends/pallas/npy.h"
#include "config/keys.h"
#include "deuteron/error.h"
#include "runtime/disk_cache.h"
#include "runtime/env.h"
#include "runtime/process.h"
#include "runtime/text.h"

namespace deuteron::embedded {
// python/deuteron_pallas_runner.py, carried by the library (CMakeLists.txt: deuteron_embed).
extern const std::string_view deuteron_pallas_runner_py;
}  // namespace deuteron::embedded

namespace deuteron::pallas {

namespace fs = std::filesystem;

namespace {

// A private temporary directory (0700: the inputs may be someone's data), removed with its
// contents when this goes out of scope; the next cache_root() sweeps it if this process dies.
class TempDir {
 public:
  TempDir() : path_(runtime::make_temp_dir()) {}
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string json_number(double x, DType t) {
  if (t == DType::i64 || t == DType::i32) return fmt::format("{}", int64_t(x));
  if (std::isnan(x)) return "NaN";  // Python's json module reads these
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  return fmt::format("{}", x);
}

std::string shell_quote(const std::string& s) {
  if (s.find_first_of(" '\"\\$`{}[]*?;&|<>()!#\n") == std::string::npos && !s.empty()) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The last `n` lines of text.
std::string tail(const std::string& text, size_t n) {
  std::string s = text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  size_t pos = s.size();
  for (size_t i = 0; i < n && pos != std::string::npos && pos > 0; ++i) pos = s.rfind('\n', pos - 1);
  return pos == std::string::npos || pos == 0 ? s : s.substr(pos + 1);
}

double timeout_seconds() { return runtime::env_number("DEUTERON_PALLAS_TIMEOUT", 0, 86400, /*lo_open=*/true).value_or(600); }

// Makes the cached module at `path` hold exactly `source` (the file name carries a hash of it):
// a missing one is written, a damaged, modified or foreign one is rewritten with a warning.
// Returns whether it was written.
bool ensure_module(const fs::path& path, const std::string& source) {
  std::string problem;
  std::optional<std::string> kept = read_cache_file(path, &problem);
  if (kept == source) return false;
  if (kept || !problem.empty())
    runtime::warn(fmt::format("the cached pallas module {} {}; writing it again", path.string(),
                              problem.empty() ? "was modified or damaged" : problem));
  atomic_write(path, source);
  return true;
}

class PallasExecutable : public backends::Executable {
 public:
  PallasExecutable(const plan::Plan& p, fs::path module, std::string source, const TpuGeneration& chip)
      : kernel_(p.kernel.name), module_(std::move(module)), source_(std::move(source)), chip_(chip.runner_chip) {
    for (size_t i = 0; i < p.kernel.tensors.size(); ++i)
      (p.kernel.tensors[i].role == ir::HostRole::Input ? inputs_ : outputs_).push_back(i);
    for (const ir::ScalarParam& s : p.kernel.scalars) scalars_.push_back(s);
    // The module's run() takes scalars by their Python names.
    for (const ir::ScalarParam& s : p.kernel.scalars) scalar_names_.push_back(python_name(s.name));
    source_path = module_.string();
  }

  void run(const std::vector<Tensor>& tensors, const std::vector<double>& scalars) override {
    if (std::string problem = environment_problem(); !problem.empty())
      throw CompileError(problem, "", "run scripts/setup_python.sh (it installs jax and jaxlib into .venv)");
    ensure_module(module_, source_);  // what the runner imports is what was generated
    TempDir dir;
    std::vector<std::string> argv = {python_path().string(), runner_path().string(), module_.string(),
                                     "--inputs"};
    std::vector<std::string> dtypes;
    bool any_bf16 = false;
    for (size_t i : inputs_) {
      fs::path f = dir.path() / fmt::format("in{}.npy", i);
      write_npy(f, tensors.at(i));
      argv.push_back(f.string());
      any_bf16 |= tensors[i].dtype() == DType::bf16;
      dtypes.push_back(tensors[i].dtype() == DType::bf16 ? "bfloat16" : "-");
    }
    argv.push_back("--outputs");
    std::vector<fs::path> outs;
    for (size_t i : outputs_) {
      outs.push_back(dir.path() / fmt::format("out{}.npy", i));
      argv.push_back(outs.back().string());
    }
    if (any_bf16) {
      argv.push_back("--dtypes");
      argv.push_back(fmt::format("{}", fmt::join(dtypes, ",")));
    }
    for (size_t i = 0; i < scalars_.size(); ++i)
      if (scalars_[i].dtype == DType::i64 && (scalars.at(i) < INT32_MIN || scalars.at(i) > INT32_MAX))
        throw ArgumentError(
            fmt::format("kernel '{}': the int64 scalar argument '{}' = {} does not fit int32, in which the pallas "
                        "target computes integers",
                        kernel_, scalars_[i].name, json_number(scalars.at(i), DType::i64)),
            "", "pass a value within int32, or run this kernel on the cpu target");
    if (!scalars_.empty()) {
      std::vector<std::string> kv;
      for (size_t i = 0; i < scalars_.size(); ++i)
        kv.push_back(
            fmt::format("\"{}\": {}", scalar_names_[i], json_number(scalars.at(i), scalars_[i].dtype)));
      argv.push_back("--scalars");
      argv.push_back(fmt::format("{{{}}}", fmt::join(kv, ", ")));
    }
    argv.push_back("--chip");
    argv.push_back(chip_);

    runtime::Captured r = runtime::run_captured(argv, timeout_seconds());
    if (r.spawn_error != 0)
      throw CompileError(fmt::format("cannot run {}: {}", argv[0], std::generic_category().message(r.spawn_error)),
                         "", "run scripts/setup_python.sh to create the project's Python environment");
    std::vector<std::string> quoted;
    for (const auto& a : argv) quoted.push_back(shell_quote(a));
    std::string command = fmt::format("{}", fmt::join(quoted, " "));
    if (r.timed_out)
      throw RuntimeError(fmt::format("the pallas runner for kernel '{}' timed out after {:.0f} s", kernel_,
                                     timeout_seconds()),
                         module_.string(), "raise DEUTERON_PALLAS_TIMEOUT (seconds) or use a smaller grid");
    if (!r.exit.success()) {
      // The runner's one-line summary, else the last line it printed.
      std::string summary;
      const std::string marker = "deuteron_pallas_runner: error: ";
      if (size_t at = r.err.rfind(marker); at != std::string::npos) {
        summary = r.err.substr(at + marker.size());
        summary = summary.substr(0, summary.find('\n'));
      } else {
        summary = r.exit.exited ? tail(r.err, 1) : r.exit.describe();
      }
      std::string message = fmt::format("the pallas runner failed for kernel '{}': {}", kernel_, summary);
      std::string hint =
          fmt::format("runner output (last lines):\n{}\n  rerun by hand: {}", tail(r.err, 12), command);
      // Failures inside the simulated TPU (out-of-bounds reads, races) are run-time errors;
      // anything before (import, tracing, lowering the module) is the target's compile step.
      bool at_run_time = summary.find("JaxRuntimeError") != std::string::npos ||
                         summary.find("XlaRuntimeError") != std::string::npos ||
                         summary.find("race") != std::string::npos || !r.exit.exited;
      if (at_run_time) throw RuntimeError(message, module_.string(), hint);
      throw CompileError(message, module_.string(), hint);
    }
    for (size_t j = 0; j < outputs_.size(); ++j) {
      size_t i = outputs_[j];
      copy_npy_into(read_npy(outs[j]), tensors.at(i),
                    fmt::format("output {} of the pallas runner ({})", j, outs[j].filename().string()));
    }
  }

 private:
  std::string kernel_;
  fs::path module_;
  std::string source_;
  std::string chip_;
  std::vector<size_t> inputs_, outputs_;
  std::vector<ir::ScalarParam> scalars_;
  std::vector<std::string> scalar_names_;
};

}  // namespace

fs::path venv_dir() {
  if (const char* v = std::getenv("DEUTERON_VENV"); v && *v) return v;
  return DEUTERON_DEFAULT_VENV;
}

fs::path python_path() { return venv_dir() / "bin" / "python"; }

fs::path runner_path() {
  return resource_dir("pallas-runner", {{"deuteron_pallas_runner.py", embedded::deuteron_pallas_runner_py}}) /
         "deuteron_pallas_runner.py";
}

std::string environment_problem() {
  if (::access(python_path().c_str(), X_OK) != 0) {
    std::error_code ec;
    bool exists = fs::exists(python_path(), ec);
    return fmt::format(
        "the pallas target needs the project's Python environment (jax and jaxlib, run in TPU "
        "interpret mode), but {} {}; {}{}",
        python_path().string(), exists ? "is not executable" : "does not exist",
        exists ? "make it executable (chmod +x) or run scripts/setup_python.sh" : "run scripts/setup_python.sh",
        std::getenv("DEUTERON_VENV") ? " (or fix $DEUTERON_VENV)" : "");
  }
  return "";
}

const TpuGeneration& PallasBackend::generation() const {
  return generation_.empty() ? default_tpu_generation() : tpu_generation(generation_);
}

config::TargetLimits PallasBackend::limits() const {
  const TpuGeneration& g = generation();
  config::TargetLimits l;
  l.cores = g.cores_per_device;
  l.fast_memory_bytes = g.vmem_bytes;  // the module raises vmem_limit_bytes to what it needs
  return l;
}

void PallasBackend::extend_space(const ir::Kernel& k, const config::TargetLimits& limits,
                                 config::ConfigSpace& space) const {
  (void)limits;
  for (const ir::Loop& loop : k.loops) {
    if (loop.grid) continue;
    std::string key = config::keys::inner_loop(k.axes[size_t(loop.axes.front())].name);
    if (space.find(key)) space.set_default_value(key, config::keys::kStream);
  }
}

void PallasBackend::refine(plan::Plan& p, const config::TargetLimits& limits) const {
  fit_blocks(p);
  p.fast_memory_bytes = pallas::check(p, generation()).needed();
  p.fast_memory_budget = limits.fast_memory_bytes;
}

config::Config PallasBackend::adjust_default(const config::ConfigSpace& space, const config::Config& c,
                                             const ir::Kernel& k) const {
  const TpuGeneration& g = generation();
  config::Config out = c;
  // Raises tunable `name` to the smallest listed value >= need (the largest if none is).
  auto raise = [&](const std::string& name, int64_t need) {
    for (const config::Tunable& t : space.tunables()) {
      if (t.name != name || !out.has(name) || out.integer(name) >= need) continue;
      config::Json pick = t.values.back();
      for (auto it = t.values.rbegin(); it != t.values.rend(); ++it)
        if (it->is_number_integer() && it->get<int64_t>() >= need) pick = *it;
      out.set(name, pick);
    }
  };
  for (const ir::BlockParam& bp : k.block_params)
    if (bp.reduction && !bp.fixed) raise(bp.name, bp.max);
  const ir::Loop& grid = k.grid_loop();
  for (const ir::Op& op : k.ops) {
    if (op.kind != ir::OpKind::Load && op.kind != ir::OpKind::Store) continue;
    size_t rank = op.index.size();
    for (size_t back = 0; back < std::min<size_t>(rank, 2); ++back) {
      const ir::Index& e = op.index[rank - 1 - back];
      if (e.kind != ir::Index::Kind::Axis) continue;
      const ir::Axis& ax = k.axes[size_t(e.axis)];
      if (ax.kind != ir::AxisKind::Tile || ax.scalar || ax.block_param < 0) continue;
      const ir::BlockParam& bp = k.block_params[size_t(ax.block_param)];
      if (bp.fixed) continue;
      const ir::Loop& loop = k.loops[size_t(ax.loop)];
      int64_t begin = 0;
      for (size_t i = 0; i < loop.axes.size(); ++i)
        if (loop.axes[i] == e.axis) begin = loop.begin[i].constant;
      int64_t span = std::max<int64_t>(ax.extent - begin, 1), cover = 1;
      while (cover < span) cover <<= 1;
      raise(bp.name, std::min<int64_t>(block_multiple(g, back), cover));
    }
  }
  // An hl::atomic_add target is revisited along the grid axes its index does not use; a TPU
  // accumulates only over consecutive visits, so those axes go innermost (the others keep
  // their order).
  if (out.has("grid_order")) {
    std::vector<bool> revisit(grid.axes.size(), false);
    for (const ir::Stmt& s : grid.body) {
      if (s.kind != ir::Stmt::Kind::Op || !k.ops[size_t(s.id)].atomic_add) continue;
      const ir::Op& op = k.ops[size_t(s.id)];
      for (size_t i = 0; i < grid.axes.size(); ++i)
        revisit[i] = revisit[i] || std::none_of(op.index.begin(), op.index.end(), [&](const ir::Index& e) {
                       return e.kind == ir::Index::Kind::Axis && e.axis == grid.axes[i];
                     });
    }
    auto order = out.values().at("grid_order").get<std::vector<int>>();
    std::stable_partition(order.begin(), order.end(), [&](int i) { return !revisit[size_t(i)]; });
    out.set("grid_order", order);
  }
  return out;
}

void PallasBackend::check_expressible(const plan::Plan& p) const { pallas::check_expressible(p, generation()); }

std::string PallasBackend::describe(const plan::Plan& p) const { return pallas::describe(p, generation()); }

std::string PallasBackend::emit(const plan::Plan& p) const { return generate(p, generation()); }

std::unique_ptr<backends::Executable> PallasBackend::compile(const plan::Plan& p) const {
  std::string source = generate(p, generation());
  if (std::string problem = environment_problem(); !problem.empty())
    throw CompileError(problem, "", "run scripts/setup_python.sh (it installs jax and jaxlib into .venv)");
  fs::path path = cache_root() / "pallas" /
                  fmt::format("{}-{}.py", runtime::file_stem(p.kernel.name), hash_hex(source).substr(0, 16));
  bool fresh = ensure_module(path, source);
  auto exe = std::make_unique<PallasExecutable>(p, path, source, generation());
  exe->compiled = fresh;
  return exe;
}

std::unique_ptr<backends::Backend> make_backend() { return std::make_unique<PallasBackend>(); }

}  // namespace deuteron::pallas
