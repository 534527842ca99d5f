// deuteron model: what the performance model (model/model.h) predicts for a kernel on a target,
// at any shape (no inputs are made) and without the device.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autotune/by_model.h"
#include "backends/registry.h"
#include "commands.h"
#include "config/keys.h"
#include "driver/driver.h"
#include "timeline.h"

namespace deuteron::cli {

namespace {

using Json = nlohmann::json;

struct ModelOptions {
  std::string kernel, target = "cpu", shapes, dtype = "float32", config, chip, strategy, timeline;
  std::optional<std::string> shape;
  int candidates = 400;
  int timeline_steps = 3;
  bool json = false;
};

int cmd_model(const ModelOptions& o) {
  select_chip(o.target, o.chip);
  const examples::Entry& e = examples::find(o.kernel);
  std::vector<int64_t> shape = pick_shape(e, o.shape, o.shapes.empty() ? "bench" : o.shapes, o.target);
  DType dt = pick_dtype(e, o.dtype);
  driver::Specialized s = driver::specialize(*e.kernel, arg_specs(e, shape, dt), o.target);

  config::Config base = o.config.empty() ? s.space.default_config() : config::Config::parse(o.config);
  // --strategy: the best config of that strategy by the model (autotune/by_model.h).
  autotune::ModelChoice best = o.strategy.empty()
                                   ? autotune::predict_config(s, base)
                                   : autotune::best_by_model(s, base, o.candidates, autotune::placement_of_strategy(o.strategy));

  std::string hardware;
  if (best.prediction) {
    plan::Plan p = driver::lower(s, best.config);
    model::Hardware hw = *s.backend->model_hardware(p);
    hardware = hw.name;
    if (!o.timeline.empty()) {
      model::Schedule sched = model::schedule(p, hw, o.timeline_steps);
      std::string what = fmt::format("{} {} [{}] on {}", e.name, dtype_name(dt), fmt::join(shape, ", "), hardware);
      std::string strategy = o.strategy.empty() ? "" : fmt::format(", --strategy {}", o.strategy);
      write_timeline_png(
          o.timeline, fmt::format("Predicted pipeline: {}{}", what, strategy),
          {schedule_panel(sched,
                          fmt::format("the first {} of {} grid steps per core: predicted {:.4g} ms in all, {}-bound",
                                      sched.steps, sched.steps_per_core, best.prediction->seconds * 1e3,
                                      model::name(best.prediction->bound)),
                          "config " + best.config.dump())});
    }
  } else if (!o.timeline.empty()) {
    throw ConfigError(fmt::format("no timeline: the config does not fit: {}", best.why), "",
                      "choose a config or --strategy that fits, then ask for the timeline again");
  }
  Json j = {{"kernel", e.name}, {"target", o.target}, {"shape", shape}, {"dtype", dtype_name(dt)},
            {"config", best.config.to_json()}, {"fits", bool(best.prediction)}};
  if (!o.strategy.empty()) j["strategy"] = o.strategy;
  if (best.prediction) {
    const model::Prediction& m = *best.prediction;
    j.update({{"hardware", hardware},
              {"predicted_ms", m.seconds * 1e3},
              {"tflops", m.tflops()},
              {"gbps", m.gbps()},
              {"peak_fraction", m.peak_fraction},
              {"bound", model::name(m.bound)},
              {"breakdown_ms",
               {{"compute", m.compute_seconds * 1e3},
                {"memory", m.memory_seconds * 1e3},
                {"step_overhead", m.overhead_seconds * 1e3},
                {"bubble", m.bubble_seconds * 1e3}}}});
  } else {
    j["why"] = best.why;
  }
  if (o.json) {
    std::cout << j.dump() << "\n";
  } else if (best.prediction) {
    const model::Prediction& m = *best.prediction;
    fmt::print("{} {} [{}] on {} ({}): predicted {:.4g} ms, {:.3g} TFLOP/s, {:.3g} GB/s, {:.0f}% of peak, {}-bound\n",
               e.name, dtype_name(dt), fmt::join(shape, ", "), o.target, hardware, m.seconds * 1e3, m.tflops(),
               m.gbps(), 100 * m.peak_fraction, model::name(m.bound));
    fmt::print("  config: {}\n", best.config.dump());
  } else {
    fmt::print("{} {} [{}] on {}: does not fit: {}\n  config: {}\n", e.name, dtype_name(dt), fmt::join(shape, ", "),
               o.target, best.why, best.config.dump());
  }
  return 0;
}

}  // namespace

void write_run_timeline(const std::string& path, int steps, const std::string& what, const driver::Specialized& s,
                        const config::Config& config, const driver::Bound& bound) {
  plan::Plan p = driver::lower(s, config);
  std::unique_ptr<backends::Executable> exe = s.backend->compile_traced(p);
  if (!exe)
    throw ArgumentError(fmt::format("the {} target cannot record when its grid steps run", s.backend->name()), "",
                        "`deuteron run --timeline` measures on the cpu target; `deuteron model KERNEL --target "
                        "T --timeline FILE` draws the predicted pipeline of any target");
  exe->run(bound.tensors, bound.scalars);  // warm-up: caches, pages, the thread pool
  auto t0 = std::chrono::steady_clock::now();
  exe->run(bound.tensors, bound.scalars);
  double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Each thread's first `steps` grid steps, in the order it ran them.
  std::map<int, std::vector<backends::Executable::StepTime>> by_thread;
  for (const auto& st : exe->step_times()) by_thread[st.thread].push_back(st);
  TimelinePanel measured;
  double shown_end = 0;
  for (auto& [thread, list] : by_thread) {
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
    TimelineLane lane{fmt::format("thread {}", thread), {}};
    for (size_t i = 0; i < list.size() && i < size_t(steps); ++i) {
      lane.bars.push_back({list[i].start, list[i].end, "measured grid step", fmt::format("step {}", list[i].step)});
      shown_end = std::max(shown_end, list[i].end);
    }
    measured.lanes.push_back(lane);
  }
  measured.title = fmt::format("measured: the first {} grid steps of each of {} threads ({:.3g} us); the whole run took {:.4g} ms",
                               steps, by_thread.size(), shown_end * 1e6, run_s * 1e3);
  measured.note = "timed inside the generated code (omp_get_wtime at each grid step's start and end), second of two runs";

  model::Hardware hw = *s.backend->model_hardware(p);
  model::Schedule sched = model::schedule(p, hw, steps);
  double predicted_end = 0;
  for (const model::Event& e : sched.events) predicted_end = std::max(predicted_end, e.end);
  TimelinePanel predicted = schedule_panel(
      sched,
      fmt::format("predicted ({}): the first {} grid steps of one thread ({:.3g} us); the whole run {:.4g} ms", hw.name,
                  sched.steps, predicted_end * 1e6, sched.prediction.seconds * 1e3),
      "config " + config.dump());
  write_timeline_png(path, "Pipeline of " + what, {measured, predicted});
}

void add_model_commands(CLI::App& app) {
  static ModelOptions o;
  CLI::App* m = app.add_subcommand("model", "predict a kernel's time on a target with the performance model (no device)");
  m->add_option("kernel", o.kernel, "kernel name (see `deuteron list`)")->required();
  m->add_option("--target", o.target, "cpu (default), pallas, ...");
  m->add_option("--chip", o.chip, "the hardware the target plans for (pallas: v4, v5e, v5p, v6e, v7x)");
  m->add_option("--shape", o.shape, "sizes (default: the kernel's CPU bench shape); no inputs are made");
  m->add_option("--shapes", o.shapes, "small or bench");
  m->add_option("--dtype", o.dtype, "float32, bfloat16, ...");
  m->add_option("--config", o.config, "a config as JSON (default: the default config)");
  m->add_option("--strategy", o.strategy,
                "emit_pipeline, unroll or fori_loop on every inner loop; the model picks that strategy's best config");
  m->add_option("--candidates", o.candidates, "configs the --strategy search tries (default 400)")->check(CLI::Range(1, 100000));
  m->add_option("--timeline", o.timeline, "draw the predicted pipeline of the first grid steps into this PNG file");
  m->add_option("--timeline-steps", o.timeline_steps, "grid steps the timeline shows (default 3)")->check(CLI::Range(1, 64));
  m->add_flag("--json", o.json, "machine-readable output");
  m->callback([] { std::exit(cmd_model(o)); });
}

}  // namespace deuteron::cli
