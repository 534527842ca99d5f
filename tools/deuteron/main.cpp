// deuteron: the command-line tool. `deuteron --help` lists the subcommands.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "api/api.h"
#include "backends/registry.h"
#include "config/keys.h"
#include "catalogue.h"
#include "commands.h"

namespace deuteron::cli {

namespace {

using Json = nlohmann::json;

}  // namespace

std::vector<int64_t> pick_shape(const examples::Entry& e, const std::optional<std::string>& shape,
                                const std::string& shapes, const std::string& target) {
  if (shape) {  // given, even as '': then it is a bad shape, not the default one
    auto s = parse_shape(*shape);
    if (s.size() != e.bench_shape.size())
      throw ArgumentError(fmt::format("kernel '{}' takes a shape of {} sizes ({}), got {}", e.name,
                                      e.bench_shape.size(), fmt::join(e.shape_names, ", "), s.size()));
    return s;
  }
  // Pallas runs under TPU interpret mode here, a simulator: bench shapes would take minutes.
  if (shapes == "small" || (shapes.empty() && backends::get(target).simulated())) return e.small_shape;
  if (shapes == "bench" || shapes.empty()) return e.bench_shape;
  throw ArgumentError(fmt::format("--shapes must be small or bench, not '{}'", shapes));
}

DType pick_dtype(const examples::Entry& e, const std::string& name) {
  DType dt = parse_dtype(name);
  if (std::find(e.dtypes.begin(), e.dtypes.end(), dt) == e.dtypes.end()) {
    std::vector<std::string> ok;
    for (DType d : e.dtypes) ok.emplace_back(dtype_name(d));
    throw ArgumentError(fmt::format("kernel '{}' does not run in {}", e.name, name), "",
                        fmt::format("its dtypes: {}", fmt::join(ok, ", ")));
  }
  return dt;
}

// --chip: the hardware generation the target plans for, through its own variable.
void select_chip(const std::string& target, const std::string& chip) {
  if (chip.empty()) return;
  const backends::Backend& b = backends::get(target);
  std::vector<std::string> chips = b.chips();
  if (chips.empty())
    throw ArgumentError(fmt::format("the {} target takes no --chip: it plans for the machine it runs on", target));
  if (std::find(chips.begin(), chips.end(), chip) == chips.end())
    throw ArgumentError(fmt::format("the {} target knows no chip '{}'", target, chip), "",
                        fmt::format("choose one of {}", fmt::join(chips, ", ")));
  setenv(b.chip_variable().c_str(), chip.c_str(), 1);
}

std::vector<frontend::ArgSpec> arg_specs(const examples::Entry& e, const std::vector<int64_t>& shape, DType dt) {
  // Two probes: the small shape, and each size of it grown by a different amount. A tensor dim
  // that follows shape parameter i is small[i] in the first and grown[i] in the second.
  std::vector<int64_t> small = e.small_shape, grown = e.small_shape;
  for (size_t i = 0; i < grown.size(); ++i) grown[i] += int64_t(i) + 1;
  std::vector<Arg> a = e.inputs(small, dt, 1), b = e.inputs(grown, dt, 1);
  std::vector<frontend::ArgSpec> specs = frontend::describe_args(*e.kernel, a);
  std::vector<frontend::ArgSpec> probe = frontend::describe_args(*e.kernel, b);
  for (size_t arg = 0; arg < specs.size(); ++arg) {
    frontend::ArgSpec& s = specs[arg];
    if (!s.is_tensor) continue;
    for (size_t d = 0; d < s.shape.size(); ++d) {
      if (s.shape[d] == probe[arg].shape[d]) continue;  // a fixed size
      std::vector<size_t> follows;
      for (size_t i = 0; i < small.size(); ++i)
        if (small[i] == s.shape[d] && grown[i] == probe[arg].shape[d]) follows.push_back(i);
      if (follows.size() != 1)
        throw ArgumentError(fmt::format("kernel '{}': dim {} of argument {} follows no single shape parameter ({}), "
                                        "so its size at [{}] cannot be derived without making the inputs",
                                        e.name, d, arg, fmt::join(e.shape_names, ", "), fmt::join(shape, ", ")));
      s.shape[d] = shape[follows[0]];
    }
    s.strides.assign(s.shape.size(), 1);  // contiguous, as the entries make them
    for (size_t d = s.shape.size(); d-- > 1;) s.strides[d - 1] = s.strides[d] * s.shape[d];
  }
  return specs;
}

namespace {

std::optional<config::Config> pick_config(const std::string& text) {
  if (text.empty()) return std::nullopt;
  return config::Config::parse(text);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct RunOptions {
  std::string kernel, target = "cpu", shapes, dtype = "float32", config, chip;
  std::optional<std::string> shape;
  int repeat = 0;
  int paired_copy = 0;  // --paired-copy N: N kernel runs, each followed by a pass of the roofline's copy
  bool check = true;  // --no-check: no float64 reference (for repeated timing runs)
  bool json = false;
  bool explain_fast_memory = false;
  bool interpret = false;
  std::string timeline;
  int timeline_steps = 4;
};

// --interpret: the target's simulator on this CPU, through its own variable.
void select_interpret(const RunOptions& o) {
  if (!o.interpret) return;
  auto [variable, value] = backends::get(o.target).interpret_setting();
  if (variable.empty())
    throw ArgumentError(fmt::format("the {} target has no interpreter: it runs on this machine itself", o.target));
  setenv(variable.c_str(), value.c_str(), 1);
}

int cmd_run(const RunOptions& o) {
  select_chip(o.target, o.chip);
  select_interpret(o);
  const examples::Entry& e = examples::find(o.kernel);
  std::vector<int64_t> shape = pick_shape(e, o.shape, o.shapes, o.target);
  DType dt = pick_dtype(e, o.dtype);
  std::function<double()> copy_pass;  // --paired-copy
  if (o.paired_copy > 0 && !(copy_pass = backends::get(o.target).copy_probe()))
    throw ArgumentError(fmt::format("the {} target has no copy to pair runs with", o.target), "",
                        "use --paired-copy on the cpu target");
  auto args = e.inputs(shape, dt, 1);
  // Where it runs, when the target has something to say (a simulator standing in, say).
  std::string device = backends::get(o.target).device_note();
  if (!device.empty() && !o.json) std::cerr << device << "\n";
  api::RunResult r = api::run(*e.kernel, args, o.target, pick_config(o.config));

  // Correctness against the independent reference.
  std::vector<Tensor> want = o.check ? e.reference(args) : r.outputs;
  bool correct = want.size() == r.outputs.size();
  double max_err = 0;
  for (size_t i = 0; o.check && correct && i < want.size(); ++i) {
    Tolerance tol = examples::tolerance_for(e, r.outputs[i].dtype());
    CloseResult c = allclose(r.outputs[i], want[i], tol.rtol, tol.atol);
    correct = correct && c.close;
    max_err = std::max(max_err, c.max_abs_err);
  }

  // Timing: warm-up runs for at least 0.1 s (as Triton's do_bench warms up for 25 ms), then
  // repeated runs until about a second has passed (at least 5). A fresh process's first runs are
  // slower: layer_norm 8192 x 4096 took 9.0-11.3 ms in its first run and 7.1-8.3 after (a Zen 4,
  // 4 processes), and 2-3 slow runs of a 5-run round move its median. A simulator's times only
  // inform: there the call that computed the outputs is the one timed, unless --repeat asks for
  // more (an interpreted call can take seconds).
  using clock = std::chrono::steady_clock;
  bool simulated = backends::get(o.target).simulated();
  std::vector<double> ms;
  auto timed_run = [&] {  // ms
    auto t0 = clock::now();
    r.exe->run(r.bound.tensors, r.bound.scalars);
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  };
  if (simulated && o.repeat <= 0) {
    ms.push_back(r.call_ms);
  } else if (!simulated) {
    auto warm_from = clock::now();
    do r.exe->run(r.bound.tensors, r.bound.scalars);
    while (clock::now() - warm_from < std::chrono::milliseconds(100));
  }
  auto start = clock::now();
  int repeat = o.repeat > 0 ? o.repeat : simulated ? 0 : 1000;
  for (int i = 0; i < repeat; ++i) {
    ms.push_back(timed_run());
    if (o.repeat <= 0 && i >= 4 && clock::now() - start > std::chrono::seconds(1)) break;
  }
  double med = median(ms);
  double bytes = e.bytes(shape, dt), flops = e.flops(shape);
  // The kernel's share of the copy bandwidth, each run next to a pass of the roofline's copy: on
  // a shared host the bandwidth moves by tens of percent within minutes, so a probe taken
  // before or after the runs can see another machine than they did.
  Json paired;
  if (copy_pass) {
    std::vector<double> run_ms, copy_gbps, fractions;
    auto paired_from = clock::now();
    for (int i = 0; i < o.paired_copy; ++i) {
      run_ms.push_back(timed_run());
      copy_gbps.push_back(copy_pass());
      fractions.push_back(bytes / (run_ms.back() * 1e-3) / 1e9 / copy_gbps.back());
    }
    paired = {{"pairs", o.paired_copy},
              {"seconds", std::chrono::duration<double>(clock::now() - paired_from).count()},
              {"median_ms", median(run_ms)},
              {"copy_gbps", median(copy_gbps)},
              {"fraction", median(fractions)},
              {"times_ms", run_ms},
              {"copy_gbps_each", copy_gbps}};
  }
  double gbps = bytes / (med * 1e-3) / 1e9, gflops = flops / (med * 1e-3) / 1e9;
  std::optional<backends::Roofline> roof = backends::get(o.target).roofline(false);
  // bf16 products against the unit that runs them (AMX tiles, vdpbf16ps), where it is measured.
  bool bf16_peak = e.compute_bound && dt == DType::bf16 && roof && roof->bf16_peak_gflops > 0;
  double fraction = !roof          ? 0
                    : bf16_peak    ? gflops / roof->bf16_peak_gflops
                    : e.compute_bound ? gflops / roof->peak_gflops
                                      : gbps / roof->copy_gbps;
  std::string roof_name = bf16_peak ? "bf16 product" : e.compute_bound ? "FMA" : "copy-bandwidth";
  bool compiled = r.compiled;
  if (!o.timeline.empty()) {
    driver::Specialized s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), o.target);
    write_run_timeline(o.timeline, o.timeline_steps,
                       fmt::format("{} {} [{}] on {}", e.name, dtype_name(dt), fmt::join(shape, ", "), o.target), s,
                       r.config, r.bound);
  }

  if (o.json) {
    Json j = {{"kernel", e.name},
              {"target", o.target},
              {"shape", shape},
              {"dtype", dtype_name(dt)},
              {"config", r.config.to_json()},
              {"config_origin", r.origin},
              {"correct", o.check ? Json(correct) : Json()},
              {"max_abs_err", o.check ? Json(max_err) : Json()},
              {"median_ms", med},
              {"runs", ms.size()},
              {"times_ms", ms},
              {"gbps", gbps},
              {"gflops", gflops},
              {"compiled", compiled},
              {"tuned", r.tuned},
              {"roofline_fraction", fraction},
              {"roofline", roof_name},
              {"source", r.exe->source_path}};
    if (!device.empty()) j["device"] = device;
    if (!paired.is_null()) j["paired_copy"] = paired;
    std::cout << j.dump() << "\n";
  } else {
    fmt::print("{} {} [{}] on {}: {}\n", e.name, dtype_name(dt), fmt::join(shape, ", "), o.target,
               !o.check ? "not checked (--no-check)" : correct ? "correct" : "WRONG");
    if (o.check) fmt::print("  max abs error vs reference: {:.3g}\n", max_err);
    fmt::print("  median {:.3f} ms over {} runs: {:.1f} GB/s, {:.1f} GFLOP/s", med, ms.size(), gbps, gflops);
    if (roof)
      fmt::print(", {:.0f}% of the {} roofline", 100 * fraction, roof_name);
    if (!paired.is_null())
      fmt::print(
          "\n  paired with a copy pass after each of {} runs: median {:.3f} ms, copy {:.1f} GB/s, {:.0f}% of "
          "it",
          o.paired_copy, paired["median_ms"].get<double>(), paired["copy_gbps"].get<double>(),
          100 * paired["fraction"].get<double>());
    fmt::print("\n  config ({}): {}\n  compiled: {}, tuned: {}\n", r.origin, r.config.dump(),
               compiled ? "yes" : "no (cache)", r.tuned ? "yes" : "no");
  }
  return correct ? 0 : 1;
}

// Which configs of each inner-loop strategy fit the target's fast memory, and why the others
// do not: every inner loop's strategy, buffer count and block size swept around `base` (the
// other tunables keep its values). The target's own check decides and words the reason.
std::string explain_fast_memory(const driver::Specialized& s, const config::Config& base) {
  std::vector<const config::Tunable*> swept;
  for (const ir::Loop& loop : s.ir.loops) {
    if (loop.grid) continue;
    for (int a : loop.axes) {
      const ir::Axis& ax = s.ir.axes[size_t(a)];
      std::vector<std::string> names = {config::keys::inner_loop(ax.name), config::keys::buffers(ax.name)};
      if (ax.block_param >= 0) names.push_back(s.ir.block_params[size_t(ax.block_param)].name);
      for (const std::string& n : names)
        if (const config::Tunable* t = s.space.find(n)) swept.push_back(t);
    }
  }
  if (swept.empty()) return fmt::format("# kernel '{}' has no inner loops: nothing to choose between\n", s.kernel->name());
  std::string out = fmt::format("# fast memory of the {} target, per config (the others as {}):\n", s.backend->name(),
                                base.dump());
  std::vector<size_t> at(swept.size(), 0);
  int fit = 0, pruned = 0;
  while (true) {
    config::Config c = base;
    std::vector<std::string> shown;
    for (size_t i = 0; i < swept.size(); ++i) {
      c.set(swept[i]->name, swept[i]->values[at[i]]);
      shown.push_back(fmt::format("{}={}", swept[i]->name, swept[i]->values[at[i]].dump()));
    }
    std::string row = fmt::format("{}", fmt::join(shown, " "));
    try {
      plan::Plan p = driver::lower(s, driver::complete(s, c));
      out += fmt::format("#   fits    {}: {:.1f} MiB\n", row, double(p.fast_memory_bytes) / (1 << 20));
      ++fit;
    } catch (const ConfigError& e) {
      out += fmt::format("#   pruned  {}: {}\n", row, e.message());
      ++pruned;
    }
    size_t i = 0;
    while (i < swept.size() && ++at[i] == swept[i]->values.size()) at[i++] = 0;
    if (i == swept.size()) break;
  }
  return out + fmt::format("# {} configs fit, {} pruned\n", fit, pruned);
}

int cmd_emit(const RunOptions& o, bool ir, bool plan) {
  select_chip(o.target, o.chip);
  select_interpret(o);
  const examples::Entry& e = examples::find(o.kernel);
  std::vector<int64_t> shape = pick_shape(e, o.shape, o.shapes, o.target);
  DType dt = pick_dtype(e, o.dtype);
  auto s = driver::specialize(*e.kernel, arg_specs(e, shape, dt), o.target);  // no inputs are made
  std::string kind = ir ? "ir" : plan ? "plan" : "source", text, origin = "default";
  config::Config c;
  if (ir) {
    text = ir::print(s.ir) + "config space:\n" + s.space.describe();
  } else {
    // Printing never tunes: the given config, else the pinned or cached one, else the default.
    if (auto cfg = pick_config(o.config)) {
      c = driver::complete(s, *cfg);
      origin = "given";
    } else {
      driver::Choice choice = api::untuned_config(s);
      c = choice.config;
      origin = choice.origin;
    }
    if (!o.json)
      std::cerr << fmt::format("deuteron: {} config{}\n", origin,
                               origin == "default" ? " (not tuned; `deuteron tune` tunes it)" : "");
    plan::Plan p = driver::lower(s, c);
    text = plan ? plan::print(p) + s.backend->describe(p) : s.backend->emit(p);
    if (o.explain_fast_memory) text += explain_fast_memory(s, c);
  }
  if (o.json)
    std::cout << Json{{"kernel", e.name}, {"target", o.target}, {"kind", kind}, {"shape", shape},
                      {"dtype", dtype_name(dt)}, {"config", ir ? Json() : c.to_json()},
                      {"config_origin", ir ? Json() : Json(origin)}, {"text", text}}
                     .dump()
              << "\n";
  else
    std::cout << text;
  return 0;
}

// The targets that can express a kernel (at its small shape, with the default config), and why
// the others cannot.
std::pair<std::vector<std::string>, Json> expressible_on(const examples::Entry& e) {
  std::vector<std::string> ok;
  Json why = Json::object();
  auto args = e.inputs(e.small_shape, e.dtypes.front(), 1);
  for (const std::string& target : backends::names()) {
    try {
      auto s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), target);
      s.backend->check_expressible(driver::lower(s, s.space.default_config()));
      ok.push_back(target);
    } catch (const Error& err) {
      why[target] = err.message();
    }
  }
  return {ok, why};
}

int cmd_list(bool json) {
  Json all = Json::array();
  for (const auto& e : examples::catalogue()) {
    std::vector<std::string> dts;
    for (DType d : e.dtypes) dts.emplace_back(dtype_name(d));
    auto [targets, why] = expressible_on(e);
    if (json)
      all.push_back({{"name", e.name}, {"summary", e.summary}, {"bench_shape", e.bench_shape},
                     {"small_shape", e.small_shape}, {"dtypes", dts}, {"targets", targets}, {"not_on", why}});
    else
      fmt::print("{:<20} {}  [bench {}; dtypes {}; targets {}]\n", e.name, e.summary, fmt::join(e.bench_shape, "x"),
                 fmt::join(dts, ", "), fmt::join(targets, ", "));
  }
  if (json) std::cout << all.dump() << "\n";
  return 0;
}

int cmd_roofline(bool json, bool remeasure) {
  const std::string& target = backends::default_target();
  std::optional<backends::Roofline> roof = backends::get(target).roofline(remeasure);
  if (!roof) throw ArgumentError(fmt::format("the {} target has no roofline", target));
  const backends::Roofline& r = *roof;
  if (json) {
    Json j = r.details;
    j.update({{"peak_gflops", r.peak_gflops},
              {"peak_gflops_1core", r.peak_gflops_1core},
              {"bf16_peak_gflops", r.bf16_peak_gflops},
              {"copy_gbps", r.copy_gbps},
              {"copy_gbps_1core", r.copy_gbps_1core},
              {"read_gbps", r.read_gbps}});
    std::cout << j.dump() << "\n";
  } else {
    fmt::print("{}\n", r.hardware);
    fmt::print("  f32 FMA peak: {:.1f} GFLOP/s ({:.1f} on one core)\n", r.peak_gflops, r.peak_gflops_1core);
    if (r.bf16_peak_gflops > 0)
      fmt::print("  bf16 product peak: {:.1f} GFLOP/s, on {}\n", r.bf16_peak_gflops, r.bf16_unit);
    fmt::print("  copy bandwidth: {:.1f} GB/s ({:.1f} on one core)\n", r.copy_gbps, r.copy_gbps_1core);
    if (r.read_gbps > 0) fmt::print("  read bandwidth: {:.1f} GB/s\n", r.read_gbps);
    if (!r.spread.empty()) fmt::print("  {}\n", r.spread);
  }
  return 0;
}

}  // namespace

std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> shape;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find_first_of(",x", pos);
    std::string part = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      long long v = std::stoll(part, &used);
      if (used != part.size() || v < 1) throw std::invalid_argument(part);
      shape.push_back(v);
    } catch (const std::exception&) {
      throw ArgumentError(fmt::format("bad shape '{}': '{}' is not a positive integer", text, part), "",
                          "write sizes separated by commas, e.g. --shape 8192,2560");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return shape;
}

CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi)
          return fmt::format("'{}' is not a number from {} to {}", text, lo, hi);
        return "";
      },
      fmt::format("NUMBER in [{} - {}]", lo, hi));
}

void add_core_commands(CLI::App& app) {
  static RunOptions o;
  static bool ir = false, plan = false, remeasure = false;
  auto add_kernel_opts = [&](CLI::App* c) {
    c->add_option("kernel", o.kernel, "kernel name (see `deuteron list`)")->required();
    c->add_option("--target", o.target, "cpu (default), pallas or triton");
    c->add_option("--shape", o.shape, "sizes, e.g. 8192,2560 (default: the kernel's CPU bench shape)");
    c->add_option("--shapes", o.shapes, "small (ragged test shape) or bench");
    c->add_option("--dtype", o.dtype, "float32, bfloat16, ...");
    c->add_option("--config", o.config, "a config as JSON; default: pinned, cached or tuned");
    c->add_option("--chip", o.chip, "the hardware the target plans for (pallas: v4, v5e, v5p, v6e, v7x)");
    c->add_flag("--interpret", o.interpret, "run in the target's simulator on this CPU (pallas, triton)");
    c->add_flag("--json", o.json, "machine-readable output");
  };
  CLI::App* run = app.add_subcommand("run", "make inputs, run a kernel, check it against its reference, time it");
  add_kernel_opts(run);
  run->add_option("--repeat", o.repeat, "timed runs (default: about one second's worth)")
      ->check(CLI::Range(1, 1000000));
  run->add_option(
         "--paired-copy", o.paired_copy,
         "after the timed runs, N more, each followed by a pass of the roofline's copy: the kernel's "
         "share of the copy bandwidth, both measured on the same state of the machine (cpu)")
      ->check(CLI::Range(1, 10000));
  run->add_flag("--no-check{false}", o.check,
                "skip the float64 reference (correct and max_abs_err are null): for repeated timing runs");
  run->add_option("--timeline", o.timeline,
                  "draw the measured per-thread grid steps beside the model's prediction into this PNG file (cpu)");
  run->add_option("--timeline-steps", o.timeline_steps, "grid steps per thread the timeline shows (default 4)")
      ->check(CLI::Range(1, 64));
  run->callback([] { std::exit(cmd_run(o)); });

  CLI::App* emit = app.add_subcommand("emit", "print a kernel's generated code, IR or plan");
  add_kernel_opts(emit);
  emit->add_flag("--ir", ir, "print the kernel IR and its config space");
  emit->add_flag("--plan", plan, "print the lowered plan");
  emit->add_flag("--explain-vmem", o.explain_fast_memory,
                 "after the code, which configs of each inner-loop strategy fit the target's fast memory "
                 "(VMEM on pallas, the L2 budget on cpu) and why the others are pruned");
  emit->callback([] { std::exit(cmd_emit(o, ir, plan)); });

  static bool list_json = false;
  CLI::App* list = app.add_subcommand("list", "list the kernel catalogue");
  list->add_flag("--json", list_json, "machine-readable output");
  list->callback([] { std::exit(cmd_list(list_json)); });

  static bool roof_json = false;
  CLI::App* roof = app.add_subcommand("roofline", "measure (once, then cached) this machine's peak FMA and bf16 product rates and its bandwidths");
  roof->add_flag("--json", roof_json, "machine-readable output");
  roof->add_flag("--remeasure", remeasure, "measure again instead of using the cached figures");
  roof->callback([] { std::exit(cmd_roofline(roof_json, remeasure)); });
}

}  // namespace deuteron::cli

namespace {
// libgomp reads its wait policy once, as it loads (before main). Its default spins in every
// barrier for up to 300000 pauses (milliseconds), keeping the core of a thread that finished
// its chunks busy while the thread it waits for shares a core with another process; waiting
// passively frees that core (measured with bench/schedule_ab.py, docs/CPU.md). So unless the
// user chose (OMP_WAIT_POLICY or GOMP_SPINCOUNT), the CLI runs itself again with
// OMP_WAIT_POLICY=passive; the tuner's runners and compile workers inherit it.
void wait_passively(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: run on with libgomp's default
}
}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);
  CLI::App app{"Deuteron: tile-language kernels, compiled for the CPU, Pallas and Triton"};
  app.require_subcommand(1);
  deuteron::cli::add_core_commands(app);
  deuteron::cli::add_tune_commands(app);
  deuteron::cli::add_model_commands(app);
  deuteron::cli::add_aot_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const deuteron::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
