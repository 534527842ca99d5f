#include "backends/triton/backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "backends/triton/codegen.h"
#include "config/keys.h"
#include "deuteron/error.h"

namespace deuteron::embedded {
// runtime/deuteron_triton_runner.py, carried by the library (CMakeLists.txt: deuteron_embed).
extern const std::string_view deuteron_triton_runner_py;
}  // namespace deuteron::embedded

namespace deuteron::triton {

namespace {

// $DEUTERON_TRITON_DEVICE: auto (a GPU when torch sees one), gpu or interpret; Triton's own
// TRITON_INTERPRET=1 means interpret too.
std::string device_choice() {
  const char* v = std::getenv("DEUTERON_TRITON_DEVICE");
  std::string choice = "auto";
  if (v && *v) choice = v;
  if (choice != "auto" && choice != "gpu" && choice != "interpret")
    throw ArgumentError(fmt::format("DEUTERON_TRITON_DEVICE is '{}'", choice), "",
                        "set it to auto (a GPU when torch sees one), gpu or interpret (Triton's interpreter)");
  const char* interpret = std::getenv("TRITON_INTERPRET");
  if (choice == "auto" && interpret && std::string_view(interpret) == "1") return "interpret";
  return choice;
}

constexpr const char* kNoGpuHint =
    "run with --interpret (DEUTERON_TRITON_DEVICE=interpret) to use Triton's interpreter on the CPU";

}  // namespace

python::RunnerSpec runner_spec(const std::string& device) {
  python::RunnerSpec spec;
  spec.target = "triton";
  spec.needs = "torch and triton (scripts/setup_python.sh --triton)";
  spec.script = python::runner_script("triton-runner", "deuteron_triton_runner.py", embedded::deuteron_triton_runner_py);
  spec.args = {"--device", device};
  spec.timeout_variable = "DEUTERON_TRITON_TIMEOUT";
  // Failures while a program runs (the interpreter's out-of-bounds checks, CUDA errors) are
  // run-time errors; anything before (import, compiling the kernel) is the compile step.
  spec.run_time_failures = {"out of bounds", "CUDA error", "illegal memory access"};
  return spec;
}

Device TritonBackend::device() const {
  std::string choice = device_choice();
  if (choice == "interpret")
    return {false, true, "interpreter on the CPU",
            "triton: running under Triton's interpreter on the CPU (DEUTERON_TRITON_DEVICE=interpret)"};
  if (!python::environment_problem(runner_spec(choice)).empty()) return {false, false, "no Python environment", ""};
  const nlohmann::json& report = python::probe(runner_spec(choice));
  std::string versions = fmt::format("torch {}, triton {}", report.value("torch", "?"), report.value("triton", "?"));
  if (report.value("device", "") == "gpu") {
    std::string kind = report.value("device_kind", "?");
    return {true, false, fmt::format("{}, {}", kind, versions),
            fmt::format("triton: running on {} ({}; planned for {})", kind, versions, default_gpu().name)};
  }
  return {false, false, fmt::format("no GPU, {}", versions),
          fmt::format("triton: no GPU visible to torch ({}); {}", versions, kNoGpuHint)};
}

std::vector<std::string> TritonBackend::chips() const {
  std::vector<std::string> out;
  for (const Gpu& g : gpus()) out.push_back(g.name);
  return out;
}

config::TargetLimits TritonBackend::limits() const {
  const Gpu& g = default_gpu();
  config::TargetLimits l;
  l.cores = g.sms;
  l.fast_memory_bytes = g.shared_bytes_per_block;
  return l;
}

void TritonBackend::extend_space(const ir::Kernel& k, const config::TargetLimits& limits,
                                 config::ConfigSpace& space) const {
  (void)limits;
  bool dots = std::any_of(k.ops.begin(), k.ops.end(), [](const ir::Op& op) { return op.kind == ir::OpKind::Dot; });
  bool loops = std::any_of(k.loops.begin(), k.loops.end(), [](const ir::Loop& l) { return !l.grid; });
  auto add = [&](const char* name, config::Tunable::Kind kind, std::vector<config::Json> values, config::Json dflt,
                 const char* help) {
    config::Tunable t;
    t.name = name;
    t.kind = kind;
    t.values = std::move(values);
    t.help = help;
    space.add(t, std::move(dflt));
  };
  // Inner loops read their blocks in place, whatever the placement keys say: Triton stages
  // operands itself (num_stages), so those keys would only cost the tuner tries.
  for (const ir::Loop& l : k.loops)
    if (!l.grid)
      for (int axis : l.axes) {
        space.remove(config::keys::inner_loop(k.axis(axis).name));
        space.remove(config::keys::buffers(k.axis(axis).name));
      }
  for (const config::OperandTunable& o : config::operand_tunables(k)) space.remove(o.name);
  add(keys::kNumWarps, config::Tunable::Kind::Count, {1, 2, 4, 8, 16}, 4, "warps per program (32 threads each)");
  add(keys::kPointers, config::Tunable::Kind::Choice, {"plain", "descriptor"}, "plain",
      "tensor accesses: pointer blocks with masks (plain), or tensor descriptors (tl.make_tensor_descriptor: "
      "TMA on GPUs that have it) where an access allows one");
  if (loops)
    add(keys::kNumStages, config::Tunable::Kind::Count, {1, 2, 3, 4}, 2,
        "stages of software pipelining of inner loops (tl.range): their loads run this far ahead");
  if (dots && k.grid_loop().axes.size() >= 2)
    add(keys::kGridGroup, config::Tunable::Kind::Count, {1, 4, 8}, 1,
        "programs of the second-fastest grid axis run as a group before the fastest axis steps "
        "(1 = row-major; more shares operand blocks in L2)");
  if (dots)
    add(keys::kDotPrecision, config::Tunable::Kind::Choice, {"ieee", "tf32"}, "ieee",
        "tl.dot on f32 operands: exact f32 products, or TF32 tensor cores (10-bit mantissas)");
}

config::Config TritonBackend::adjust_default(const config::ConfigSpace& space, const config::Config& c,
                                             const ir::Kernel& k) const {
  config::Config out = c;
  // Raises tunable `name` to the smallest listed value >= need (the largest if none is).
  auto raise = [&](const std::string& name, int64_t need) {
    const config::Tunable* t = space.find(name);
    if (!t || !out.has(name) || out.integer(name) >= need) return;
    config::Json pick = t->values.back();
    for (auto it = t->values.rbegin(); it != t->values.rend(); ++it)
      if (it->is_number_integer() && it->get<int64_t>() >= need) pick = *it;
    out.set(name, pick);
  };
  for (const ir::BlockParam& bp : k.block_params)
    if (bp.reduction && !bp.fixed) raise(bp.name, bp.max);
  for (const ir::Op& op : k.ops) {
    if (op.kind != ir::OpKind::Dot || op.result < 0) continue;
    const std::vector<int>& r = k.value(op.result).dims;
    for (int d : {r[r.size() - 2], r.back(), k.value(op.inputs[0]).dims.back()})
      if (d != ir::kOne && k.axis(d).block_param >= 0) raise(k.block_params[size_t(k.axis(d).block_param)].name, kMinDotBlock);
  }
  return out;
}

void TritonBackend::refine(plan::Plan& p, const config::TargetLimits& limits) const {
  // Limits above the GPU's shared memory lift its resource checks: deuteron aot does that at
  // the probe shapes of a general module (whose whole dims follow the call; its blocks were
  // checked at the tuned shape they come from).
  const Gpu& g = default_gpu();
  p.fast_memory_bytes = check(p, g, limits.fast_memory_bytes <= g.shared_bytes_per_block).shared_bytes;
  p.fast_memory_budget = limits.fast_memory_bytes;
}

void TritonBackend::check_expressible(const plan::Plan& p) const { triton::check_expressible(p); }

std::string TritonBackend::describe(const plan::Plan& p) const {
  check_expressible(p);
  return "  triton: " + check(p, default_gpu()).describe(default_gpu()) + "\n";
}

std::string TritonBackend::emit(const plan::Plan& p) const { return generate(p, default_gpu()); }

backends::AotVariant TritonBackend::emit_aot(const plan::Plan& p, const std::string& entry, bool general) const {
  (void)entry;
  return {generate(p, default_gpu(), general), "run", 0, 1, {}, {}};
}

std::unique_ptr<backends::Executable> TritonBackend::compile(const plan::Plan& p) const {
  std::string source = generate(p, default_gpu());
  python::RunnerSpec spec = runner_spec("interpret");
  if (std::string problem = python::environment_problem(spec); !problem.empty())
    throw CompileError(problem, "", "run scripts/setup_python.sh --triton (it installs torch and triton into .venv)");
  Device d = device();
  if (!d.gpu && !d.interpret)
    throw CompileError(fmt::format("the triton target needs a GPU, and none is present: {}", d.kind), "", kNoGpuHint);
  spec.args = {"--device", d.gpu ? "gpu" : "interpret"};
  auto [path, fresh] = python::cache_module("triton", p.kernel.name, source);
  std::vector<std::string> scalar_names;
  for (const ir::ScalarParam& s : p.kernel.scalars) scalar_names.push_back(python_name(s.name));
  auto exe = std::make_unique<python::ModuleExecutable>(p, path, source, std::move(spec), std::move(scalar_names));
  exe->compiled = fresh;
  return exe;
}

std::unique_ptr<backends::Backend> make_backend() { return std::make_unique<TritonBackend>(); }

}  // namespace deuteron::triton
