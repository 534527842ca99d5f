#include "backends/pallas/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "backends/pallas/codegen.h"
#include "config/keys.h"
#include "deuteron/error.h"

namespace deuteron::embedded {
// runtime/deuteron_pallas_runner.py, carried by the library (CMakeLists.txt: deuteron_embed).
extern const std::string_view deuteron_pallas_runner_py;
}  // namespace deuteron::embedded

namespace deuteron::pallas {

namespace {

// $DEUTERON_PALLAS_DEVICE: auto (a TPU when JAX sees one), tpu or interpret.
std::string device_choice() {
  const char* v = std::getenv("DEUTERON_PALLAS_DEVICE");
  std::string choice = v && *v ? v : "auto";
  if (choice != "auto" && choice != "tpu" && choice != "interpret")
    throw ArgumentError(fmt::format("DEUTERON_PALLAS_DEVICE is '{}'", choice), "",
                        "set it to auto (a TPU when JAX sees one, else interpret mode), tpu or interpret");
  return choice;
}

}  // namespace

python::RunnerSpec runner_spec(const TpuGeneration& chip, const std::string& device) {
  python::RunnerSpec spec;
  spec.target = "pallas";
  spec.needs = "jax and jaxlib, run in TPU interpret mode";
  spec.script = python::runner_script("pallas-runner", "deuteron_pallas_runner.py", embedded::deuteron_pallas_runner_py);
  spec.args = {"--chip", chip.runner_chip, "--device", device};
  spec.timeout_variable = "DEUTERON_PALLAS_TIMEOUT";
  spec.narrow_int64 = true;
  // Failures inside the simulated TPU (out-of-bounds reads, races) are run-time errors;
  // anything before (import, tracing, lowering the module) is the target's compile step.
  spec.run_time_failures = {"JaxRuntimeError", "XlaRuntimeError", "race"};
  return spec;
}

std::string environment_problem() { return python::environment_problem(runner_spec(default_tpu_generation(), "")); }

Device PallasBackend::device() const {
  std::string choice = device_choice();
  if (choice == "interpret")
    return {false, "interpret mode on the CPU",
            "pallas: running in interpret mode on the CPU (DEUTERON_PALLAS_DEVICE=interpret)"};
  const nlohmann::json& report = python::probe(runner_spec(generation(), choice));
  std::string jax = report.value("jax", "?");
  if (report.value("device", "") == "tpu") {
    std::string kind = report.value("device_kind", "?");
    return {true, fmt::format("{}, jax {}", kind, jax),
            fmt::format("pallas: running on {} {} TPU device(s) ({}, jax {})", report.value("devices", 0), kind,
                        generation().name, jax)};
  }
  return {false, fmt::format("interpret mode on the CPU, jax {}", jax),
          fmt::format("pallas: no TPU visible to JAX {}; running in interpret mode on the CPU", jax)};
}

bool PallasBackend::simulated() const {
  // Without the Python environment nothing runs; compile() says so.
  return !python::environment_problem(runner_spec(generation(), "")).empty() || !device().tpu;
}

std::string PallasBackend::device_note() const { return device().note; }

std::vector<std::string> PallasBackend::chips() const {
  std::vector<std::string> out;
  for (const TpuGeneration& g : tpu_generations()) out.push_back(g.name);
  return out;
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
  for (const ir::Op& op : k.ops) {
    if (op.kind != ir::OpKind::Load || !smem_gather_applies(op)) continue;
    std::string key = keys::gather(k.tensors[size_t(op.tensor)].name);
    if (space.find(key)) continue;
    space.add({.name = key,
               .kind = config::Tunable::Kind::Choice,
               .values = {keys::kOneHot, keys::kSmem},
               .help = "how a gather picks its elements: a one-hot select over the gathered dim, or reads at "
                       "indices copied into SMEM",
               .follows = ""},
              keys::kOneHot);
  }
  for (const ir::Loop& loop : k.loops) {
    if (loop.grid) continue;
    std::string key = config::keys::inner_loop(k.axes[size_t(loop.axes.front())].name);
    // A loop starting at a device value runs only as a fori_loop (its blocks start at element
    // offsets, which emit_pipeline's block indices cannot express).
    bool device_begin = loop.begin.front().value >= 0;
    if (space.find(key)) space.set_default_value(key, device_begin ? config::keys::kInPlace : config::keys::kStream);
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

std::optional<model::Hardware> PallasBackend::model_hardware(const plan::Plan& p) const {
  const TpuGeneration& g = generation();
  bool bf16 = std::all_of(p.kernel.tensors.begin(), p.kernel.tensors.end(),
                          [](const ir::HostTensor& t) { return t.dtype != DType::f32; });
  int cores = std::max(g.cores_per_device, 1);
  model::Hardware hw;
  hw.name = fmt::format("TPU {} ({} TensorCore{} per device)", g.name, cores, cores == 1 ? "" : "s");
  hw.cores = cores;
  // The MXU's bf16 rate; f32 products take several bf16 passes (3 assumed, as XLA's default
  // f32 matmul precision does on TPUs: not a published figure).
  hw.matrix_flops = g.bf16_flops / cores / (bf16 ? 1.0 : 3.0);
  hw.vector_flops = g.vpu_f32_flops / cores;
  hw.transcendental_rate = hw.vector_flops / 4;  // the EUP's rate is unpublished: an assumption
  hw.memory_bytes_per_s = g.hbm_bytes_per_s;
  hw.step_seconds = g.seconds_per_grid_step > 0 ? g.seconds_per_grid_step : 0.35e-6;  // docs/TPU.md (v5e)
  hw.overlaps_copies = true;  // the grid pipeline double-buffers every blocked operand
  return hw;
}

std::string PallasBackend::describe(const plan::Plan& p) const { return pallas::describe(p, generation()); }

std::string PallasBackend::emit(const plan::Plan& p) const { return generate(p, generation()); }

backends::AotVariant PallasBackend::emit_aot(const plan::Plan& p, const std::string& entry, bool general) const {
  (void)entry;
  return {generate(p, generation(), general), "run", 0, 1, {}, {}};
}

std::unique_ptr<backends::Executable> PallasBackend::compile(const plan::Plan& p) const {
  std::string source = generate(p, generation());
  if (std::string problem = environment_problem(); !problem.empty())
    throw CompileError(problem, "", "run scripts/setup_python.sh (it installs jax and jaxlib into .venv)");
  auto [path, fresh] = python::cache_module("pallas", p.kernel.name, source);
  // The module's run() takes scalars by their Python names.
  std::vector<std::string> scalar_names;
  for (const ir::ScalarParam& s : p.kernel.scalars) scalar_names.push_back(python_name(s.name));
  python::RunnerSpec spec = runner_spec(generation(), device().tpu ? "tpu" : "interpret");
  auto exe = std::make_unique<python::ModuleExecutable>(p, path, source, std::move(spec), std::move(scalar_names));
  exe->compiled = fresh;
  return exe;
}

std::unique_ptr<backends::Backend> make_backend() { return std::make_unique<PallasBackend>(); }

}  // namespace deuteron::pallas
