#include "backends/python/runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <system_error>

#include "backends/python/npy.h"
#include "deuteron/error.h"
#include "runtime/disk_cache.h"
#include "runtime/env.h"
#include "runtime/process.h"
#include "runtime/text.h"

namespace deuteron::embedded {
// runtime/deuteron_runner.py, carried by the library (CMakeLists.txt: deuteron_embed).
extern const std::string_view deuteron_runner_py;
}  // namespace deuteron::embedded

namespace deuteron::python {

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

std::string setup_hint(const RunnerSpec& spec) {
  return fmt::format("run scripts/setup_python.sh (it installs {} into .venv)", spec.needs);
}

// Runs the target's runner with `args` after the script; its stdout on success. `what` names
// the run in messages ("for kernel 'add'"), `module` is where the error points.
std::string run_runner(const RunnerSpec& spec, const std::vector<std::string>& args, const std::string& what,
                       const std::string& module) {
  std::vector<std::string> argv = runner_command(spec, args);
  double timeout = runtime::env_number(spec.timeout_variable.c_str(), 0, 86400, /*lo_open=*/true).value_or(600);
  runtime::Captured r = runtime::run_captured(argv, timeout);
  if (r.spawn_error != 0)
    throw CompileError(fmt::format("cannot run {}: {}", argv[0], std::generic_category().message(r.spawn_error)),
                       "", setup_hint(spec));
  if (r.timed_out)
    throw RuntimeError(fmt::format("the {} runner {} timed out after {:.0f} s", spec.target, what, timeout), module,
                       fmt::format("raise {} (seconds) or use a smaller grid", spec.timeout_variable));
  if (r.exit.success()) return r.out;
  // The runner's one-line summary, else the last line it printed.
  std::string summary;
  const std::string marker = fmt::format("deuteron_{}_runner: error: ", spec.target);
  if (size_t at = r.err.rfind(marker); at != std::string::npos) {
    summary = r.err.substr(at + marker.size());
    summary = summary.substr(0, summary.find('\n'));
  } else {
    summary = r.exit.exited ? tail(r.err, 1) : r.exit.describe();
  }
  std::vector<std::string> quoted;
  for (const auto& a : argv) quoted.push_back(shell_quote(a));
  std::string message = fmt::format("the {} runner failed {}: {}", spec.target, what, summary);
  std::string hint = fmt::format("runner output (last lines):\n{}\n  rerun by hand: {}", tail(r.err, 12),
                                 fmt::join(quoted, " "));
  bool at_run_time = !r.exit.exited;
  for (const std::string& word : spec.run_time_failures) at_run_time |= summary.find(word) != std::string::npos;
  if (at_run_time) throw RuntimeError(message, module, hint);
  throw CompileError(message, module, hint);
}

}  // namespace

fs::path venv_dir() {
  if (const char* v = std::getenv("DEUTERON_VENV"); v && *v) return v;
  return DEUTERON_DEFAULT_VENV;
}

fs::path python_path() { return venv_dir() / "bin" / "python"; }

std::string environment_problem(const RunnerSpec& spec) {
  if (::access(python_path().c_str(), X_OK) == 0) return "";
  std::error_code ec;
  bool exists = fs::exists(python_path(), ec);
  return fmt::format("the {} target needs the project's Python environment ({}), but {} {}; {}{}", spec.target,
                     spec.needs, python_path().string(), exists ? "is not executable" : "does not exist",
                     exists ? "make it executable (chmod +x) or run scripts/setup_python.sh"
                            : "run scripts/setup_python.sh",
                     std::getenv("DEUTERON_VENV") ? " (or fix $DEUTERON_VENV)" : "");
}

std::vector<std::string> runner_command(const RunnerSpec& spec, const std::vector<std::string>& args) {
  if (std::string problem = environment_problem(spec); !problem.empty())
    throw CompileError(problem, "", setup_hint(spec));
  std::vector<std::string> argv = {python_path().string(), spec.script.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), spec.args.begin(), spec.args.end());
  return argv;
}

fs::path runner_script(std::string_view kind, std::string_view name, std::string_view script) {
  return resource_dir(kind, {{name, script}, {"deuteron_runner.py", embedded::deuteron_runner_py}}) / name;
}

std::pair<fs::path, bool> cache_module(std::string_view target, std::string_view kernel, const std::string& source) {
  fs::path path =
      cache_root() / target / fmt::format("{}-{}.py", runtime::file_stem(kernel), hash_hex(source).substr(0, 16));
  std::string problem;
  std::optional<std::string> kept = read_cache_file(path, &problem);
  if (kept == source) return {path, false};
  if (kept || !problem.empty())
    runtime::warn(fmt::format("the cached {} module {} {}; writing it again", target, path.string(),
                              problem.empty() ? "was modified or damaged" : problem));
  atomic_write(path, source);
  return {path, true};
}

Tensor narrow_to_int32(const Tensor& t, std::string_view target, std::string_view kernel, std::string_view tensor) {
  Tensor c = t.contiguous();
  Tensor out = Tensor::empty(t.sizes(), DType::i32);
  const int64_t* from = c.data_as<int64_t>();
  int32_t* to = out.data_as<int32_t>();
  for (int64_t i = 0; i < c.numel(); ++i) {
    if (from[i] >= INT32_MIN && from[i] <= INT32_MAX) {
      to[i] = int32_t(from[i]);
      continue;
    }
    std::vector<int64_t> at(t.sizes().size());
    for (int64_t d = int64_t(at.size()) - 1, rest = i; d >= 0; --d) {
      at[size_t(d)] = rest % t.sizes()[size_t(d)];
      rest /= t.sizes()[size_t(d)];
    }
    throw ArgumentError(
        fmt::format("kernel '{}': the int64 tensor '{}' holds {} at flat index {} [{}], which int32 cannot hold; "
                    "the {} target computes integers in int32 (TPUs have no 64-bit vectors)",
                    kernel, tensor, from[i], i, fmt::join(at, ", "), target),
        "", fmt::format("pass values within [{}, {}], or run this kernel on the cpu target", INT32_MIN, INT32_MAX));
  }
  return out;
}

const nlohmann::json& probe(const RunnerSpec& spec) {
  static std::mutex mu;
  static std::map<std::vector<std::string>, nlohmann::json> seen;
  // What decides the answer: the Python, the runner, its options and the platforms JAX may use.
  const char* platforms = std::getenv("JAX_PLATFORMS");
  std::vector<std::string> key = {python_path().string(), spec.script.string(), platforms ? platforms : "-"};
  key.insert(key.end(), spec.args.begin(), spec.args.end());
  std::lock_guard lock(mu);
  if (auto it = seen.find(key); it != seen.end()) return it->second;
  std::string out = run_runner(spec, {"--probe"}, "probing the device", "");
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object())
    throw CompileError(fmt::format("the {} runner's device report is not a JSON object: {}", spec.target, out));
  return seen[key] = j;
}

ModuleExecutable::ModuleExecutable(const plan::Plan& p, fs::path module, std::string source, RunnerSpec spec,
                                   std::vector<std::string> scalar_names)
    : kernel_(p.kernel.name),
      where_(format_location(p.kernel.loc)),
      module_(std::move(module)),
      source_(std::move(source)),
      spec_(std::move(spec)),
      tensors_(p.kernel.tensors),
      scalars_(p.kernel.scalars),
      scalar_names_(std::move(scalar_names)) {
  for (size_t i = 0; i < tensors_.size(); ++i)
    (tensors_[i].role == ir::HostRole::Input ? inputs_ : outputs_).push_back(i);
  source_path = module_.string();
}

std::string ModuleExecutable::worker_line() const {
  nlohmann::json tensors = nlohmann::json::array(), scalars = nlohmann::json::array();
  for (const ir::HostTensor& t : tensors_)
    tensors.push_back({{"dtype", dtype_name(t.dtype)},
                       {"shape", t.shape},
                       {"strides", t.strides},
                       {"output", t.role == ir::HostRole::Output}});
  for (size_t i = 0; i < scalars_.size(); ++i)
    scalars.push_back({{"name", scalar_names_.at(i)}, {"dtype", dtype_name(scalars_[i].dtype)}});
  nlohmann::json layout = {{"tensors", tensors}, {"scalars", scalars}};
  return fmt::format("kernel {} {}", runtime::encode_field(module_.string()), runtime::encode_field(layout.dump()));
}

void ModuleExecutable::run(const std::vector<Tensor>& tensors, const std::vector<backends::ScalarValue>& scalars) {
  cache_module(spec_.target, kernel_, source_);  // what the runner imports is what was generated
  TempDir dir;
  std::vector<std::string> args = {module_.string(), "--inputs"};
  std::vector<std::string> dtypes;
  bool any_bf16 = false;
  for (size_t i : inputs_) {
    fs::path f = dir.path() / fmt::format("in{}.npy", i);
    const Tensor& t = tensors.at(i);
    write_npy(f, spec_.narrow_int64 && t.dtype() == DType::i64
                     ? narrow_to_int32(t, spec_.target, kernel_, tensors_[i].name)
                     : t);
    args.push_back(f.string());
    any_bf16 |= t.dtype() == DType::bf16;
    dtypes.push_back(t.dtype() == DType::bf16 ? "bfloat16" : "-");
  }
  args.push_back("--outputs");
  std::vector<fs::path> outs;
  for (size_t i : outputs_) {
    outs.push_back(dir.path() / fmt::format("out{}.npy", i));
    args.push_back(outs.back().string());
  }
  if (any_bf16) {
    args.push_back("--dtypes");
    args.push_back(fmt::format("{}", fmt::join(dtypes, ",")));
  }
  if (!scalars_.empty()) {
    std::vector<std::string> kv;
    for (size_t i = 0; i < scalars_.size(); ++i) {
      const backends::ScalarValue& v = scalars.at(i);
      bool integer = !is_floating(scalars_[i].dtype);
      if (spec_.narrow_int64 && scalars_[i].dtype == DType::i64 && (v.integer < INT32_MIN || v.integer > INT32_MAX))
        throw ArgumentError(
            fmt::format("kernel '{}': the int64 scalar argument '{}' = {} does not fit int32, in which the {} "
                        "target computes integers",
                        kernel_, scalars_[i].name, v.integer, spec_.target),
            where_, "pass a value within int32, or run this kernel on the cpu target");
      // Integers as JSON integers, every digit (Python's json reads them exactly).
      kv.push_back(fmt::format("\"{}\": {}", scalar_names_.at(i),
                               integer ? fmt::format("{}", v.integer) : json_number(v.real, scalars_[i].dtype)));
    }
    args.push_back("--scalars");
    args.push_back(fmt::format("{{{}}}", fmt::join(kv, ", ")));
  }
  std::string out = run_runner(spec_, args, fmt::format("for kernel '{}'", kernel_), module_.string());
  report_ = nlohmann::json::parse(tail(out, 1), nullptr, /*allow_exceptions=*/false);
  for (size_t j = 0; j < outputs_.size(); ++j) {
    const Tensor& dst = tensors.at(outputs_[j]);
    NpyArray a = read_npy(outs[j]);
    std::string what = fmt::format("output {} of the {} runner ({})", j, spec_.target, outs[j].filename().string());
    if (spec_.narrow_int64 && dst.dtype() == DType::i64 && a.descr == npy_descr(DType::i32)) {
      // An int64 output computed in int32 widens exactly.
      Tensor narrow = Tensor::empty(dst.sizes(), DType::i32);
      copy_npy_into(a, narrow, what);
      Tensor wide = narrow.to(DType::i64);
      a.descr = npy_descr(DType::i64);
      a.data.assign(static_cast<const char*>(wide.data()), size_t(wide.nbytes()));
    }
    copy_npy_into(a, dst, what);
  }
}

backends::Prepared ModuleHarness::compile(const plan::Plan& p) const {
  std::unique_ptr<backends::Executable> exe = backend_.compile(p);
  backends::Prepared out;
  out.kernel_line = static_cast<const ModuleExecutable&>(*exe).worker_line();
  out.compiled = exe->compiled;
  return out;
}

std::vector<std::string> ModuleHarness::runner_command() { return python::runner_command(hooks_.runner(), {"--serve"}); }

}  // namespace deuteron::python
