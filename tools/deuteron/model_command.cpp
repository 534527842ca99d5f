// deuteron model: what the performance model (model/model.h) predicts for a kernel on a target,
// at any shape (no inputs are made) and without the device.
#include <iostream>
#include <random>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "commands.h"
#include "config/keys.h"
#include "driver/driver.h"

namespace deuteron::cli {

namespace {

using Json = nlohmann::json;

struct ModelOptions {
  std::string kernel, target = "cpu", shapes, dtype = "float32", config, chip, strategy;
  std::optional<std::string> shape;
  int candidates = 400;
  int sample = 0;
  uint64_t seed = 1;
  bool json = false;
};

// --strategy names the Pallas forms; the config spells them as placements.
std::string placement_of(const std::string& strategy) {
  if (strategy == "emit_pipeline") return config::keys::kStream;
  if (strategy == "unroll") return config::keys::kResident;
  if (strategy == "fori_loop") return config::keys::kInPlace;
  throw ArgumentError(fmt::format("unknown --strategy '{}'", strategy), "",
                      "choose emit_pipeline (stream), unroll (resident) or fori_loop (in_place)");
}

// Every inner loop of the kernel set to `placement` (its operands following it).
void force_strategy(const driver::Specialized& s, const std::string& placement, config::Config& c) {
  for (const ir::Loop& loop : s.ir.loops) {
    if (loop.grid) continue;
    std::string key = config::keys::inner_loop(s.ir.axes[size_t(loop.axes.front())].name);
    if (s.space.find(key)) c.set(key, placement);
  }
  for (const config::Tunable& t : s.space.tunables())
    if (!t.follows.empty()) c.set(t.name, config::keys::kFollowLoop);
}

struct Outcome {
  config::Config config;
  std::optional<model::Prediction> prediction;  // nullopt: the config does not fit
  std::string why;                              // the target's reason, with its arithmetic
};

Outcome evaluate(const driver::Specialized& s, const config::Config& c) {
  Outcome o{driver::complete(s, c), std::nullopt, ""};
  try {
    plan::Plan p = driver::lower(s, o.config);
    std::optional<model::Hardware> hw = s.backend->model_hardware(p);
    if (!hw) throw ArgumentError(fmt::format("the {} target has no hardware description for the model", s.backend->name()));
    o.prediction = model::predict(p, *hw);
  } catch (const ConfigError& e) {
    o.why = e.message();
  }
  return o;
}

// What the model says of one outcome, for --json.
Json outcome_json(const driver::Specialized& s, const Outcome& out) {
  Json j = {{"config", out.config.to_json()}, {"fits", bool(out.prediction)}};
  if (!out.prediction) {
    j["why"] = out.why;
    return j;
  }
  const model::Prediction& m = *out.prediction;
  j.update({{"hardware", s.backend->model_hardware(driver::lower(s, out.config))->name},
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
  return j;
}

// --sample N: N distinct configs of the space other than the default that lower (drawn with
// --seed, so the same N every time), with the model's prediction of each: the configs the
// validation against measured times (bench/model_validation.py) times besides the default.
int cmd_sample(const ModelOptions& o, const examples::Entry& e, const std::vector<int64_t>& shape, DType dt,
               const driver::Specialized& s) {
  std::mt19937_64 rng(o.seed);
  std::set<std::string> seen = {s.space.default_config().dump()};
  Json rows = Json::array();
  for (int tries = 0; int(rows.size()) < o.sample && tries < 200 * o.sample; ++tries) {
    config::Config c = s.space.random(rng);
    if (!seen.insert(c.dump()).second) continue;
    Outcome out = evaluate(s, c);
    if (!out.prediction) continue;
    rows.push_back(outcome_json(s, out));
  }
  if (o.json) {
    std::cout << Json{{"kernel", e.name}, {"target", o.target}, {"shape", shape}, {"dtype", dtype_name(dt)},
                      {"seed", o.seed}, {"samples", rows}}.dump()
              << "\n";
    return 0;
  }
  for (const Json& r : rows)
    fmt::print("{:>10.4g} ms  {:<15} {}\n", r["predicted_ms"].get<double>(), r["bound"].get<std::string>(),
               r["config"].dump());
  if (int(rows.size()) < o.sample)
    fmt::print("(only {} valid configs other than the default were found)\n", rows.size());
  return 0;
}

int cmd_model(const ModelOptions& o) {
  select_chip(o.target, o.chip);
  const examples::Entry& e = examples::find(o.kernel);
  std::vector<int64_t> shape = pick_shape(e, o.shape, o.shapes.empty() ? "bench" : o.shapes, o.target);
  DType dt = pick_dtype(e, o.dtype);
  driver::Specialized s = driver::specialize(*e.kernel, arg_specs(e, shape, dt), o.target);
  if (o.sample > 0) return cmd_sample(o, e, shape, dt, s);

  config::Config base = o.config.empty() ? s.space.default_config() : config::Config::parse(o.config);
  Outcome best;
  if (o.strategy.empty()) {
    best = evaluate(s, base);
  } else {
    // The best config of that strategy by the model: the default and random points of the
    // space (a fixed seed: the same answer every time), each with the strategy forced.
    std::string placement = placement_of(o.strategy);
    std::mt19937_64 rng(1);
    for (int i = 0; i <= o.candidates; ++i) {
      config::Config c = i == 0 ? base : s.space.random(rng);
      force_strategy(s, placement, c);
      Outcome next = evaluate(s, c);
      if (i == 0 || (next.prediction && (!best.prediction || next.prediction->seconds < best.prediction->seconds)))
        best = next;
    }
  }

  Json j = {{"kernel", e.name}, {"target", o.target}, {"shape", shape}, {"dtype", dtype_name(dt)}};
  j.update(outcome_json(s, best));
  if (!o.strategy.empty()) j["strategy"] = o.strategy;
  std::string hardware = j.value("hardware", "");
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
  m->add_option("--sample", o.sample,
                "print N valid configs other than the default, drawn with --seed, each with its prediction")
      ->check(CLI::Range(1, 10000));
  m->add_option("--seed", o.seed, "seed of --sample (default 1)");
  m->add_flag("--json", o.json, "machine-readable output");
  m->callback([] { std::exit(cmd_model(o)); });
}

}  // namespace deuteron::cli
