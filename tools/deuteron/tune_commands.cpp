// `deuteron tune` and `deuteron cache`: the autotuner's command line.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "autotune/autotune.h"
#include "autotune/by_model.h"
#include "autotune/cache.h"
#include "autotune/progress.h"
#include "autotune/search.h"
#include "catalogue.h"
#include "commands.h"
#include "deuteron/error.h"
#include "driver/driver.h"
#include "runtime/disk_cache.h"

namespace deuteron::cli {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

struct TuneCli {
  std::optional<std::string> shape;
  std::string kernel, shapes, dtype = "float32", target = "cpu", effort = "quick", search = "auto";
  std::string progress = "auto", inject, chip;
  uint64_t seed = 0;
  bool retune = false, json = false, no_warm_start = false, by_model = false;
  int model_candidates = 400;
  int jobs = 0, max_candidates = 0;
  double time_budget = 0;
};

// tune --by-model: the model's choice for the hardware, cached without a device or inputs.
int cmd_tune_by_model(const TuneCli& o, const examples::Entry& e, const std::vector<int64_t>& shape, DType dt) {
  driver::Specialized s = driver::specialize(*e.kernel, arg_specs(e, shape, dt), o.target);
  autotune::CacheEntry c = autotune::tune_by_model(s, o.model_candidates);
  const Json& info = c.info;
  if (o.json) {
    std::cout << Json{{"kernel", e.name},         {"shape", shape},
                      {"dtype", dtype_name(dt)},   {"target", o.target},
                      {"key", s.key},              {"origin", "model"},
                      {"hardware", info["hardware_model"]}, {"best", c.config.to_json()},
                      {"predicted_s", c.time_s},   {"default_predicted_s", c.default_time_s},
                      {"predicted_tflops", info["predicted_tflops"]}, {"bound", info["bound"]},
                      {"tried", info["tried"]},    {"fitted", info["fitted"]},
                      {"cache", c.key.path().string()}}
                     .dump()
              << "\n";
    return 0;
  }
  fmt::print("{} {} [{}] on {} ({}): chosen by the model ({} configs predicted, {} fit), no device used\n", e.name,
             dtype_name(dt), fmt::join(shape, ", "), o.target, info["hardware_model"].get<std::string>(),
             info["tried"].get<int>(), info["fitted"].get<int>());
  fmt::print("  default  {}  predicted {}\n", s.space.default_config().dump(), autotune::format_seconds(c.default_time_s));
  fmt::print("  best     {}  predicted {} ({:.3g} TFLOP/s, {}-bound)\n", c.config.dump(), autotune::format_seconds(c.time_s),
             info["predicted_tflops"].get<double>(), info["bound"].get<std::string>());
  fmt::print("  cache: {} (model-chosen: a measured `deuteron tune` on the device replaces it)\n", c.key.path().string());
  return 0;
}

int cmd_tune(const TuneCli& o) {
  const examples::Entry& e = examples::find(o.kernel);
  if (!o.chip.empty()) select_chip(o.target, o.chip);
  std::vector<int64_t> shape = pick_shape(e, o.shape, o.shapes, o.target);
  DType dt = parse_dtype(o.dtype);
  if (std::find(e.dtypes.begin(), e.dtypes.end(), dt) == e.dtypes.end())
    throw ArgumentError(fmt::format("kernel '{}' does not run in {}", e.name, o.dtype));
  if (o.by_model) return cmd_tune_by_model(o, e, shape, dt);

  // The same inputs `deuteron run` makes (seed 1), so the two agree on the specialisation.
  std::vector<Arg> args = e.inputs(shape, dt, 1);
  driver::Specialized s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), o.target);
  autotune::TuneOptions t = tune_options(e, args);
  t.effort = o.effort;
  t.search = o.search;
  t.seed = o.seed;
  t.read_cache = !o.retune;
  t.warm_start = !o.no_warm_start;
  t.jobs = o.jobs;
  t.max_candidates = o.max_candidates;
  t.time_budget_s = o.time_budget;
  t.progress = o.json && o.progress == "auto" ? "quiet" : o.progress;
  t.inject = o.inject;
  autotune::TuneResult r = autotune::tune(s, t);

  if (o.json) {
    Json cands = Json::array();
    for (const auto& c : r.candidates)
      cands.push_back({{"config", c.config.to_json()}, {"status", autotune::status_name(c.status)},
                       {"origin", c.origin}, {"reason", c.reason}, {"median_s", c.median_s},
                       {"retimed_s", c.retimed_s}, {"compiled", c.compiled}, {"compile_s", c.compile_s}});
    Json j = {{"kernel", e.name}, {"shape", shape}, {"dtype", dtype_name(dt)}, {"target", o.target},
              {"key", s.key}, {"from_cache", r.from_cache}, {"effort", r.effort}, {"search", r.search},
              {"best", r.best.to_json()}, {"best_s", r.best_s}, {"default", s.space.default_config().to_json()},
              {"default_s", r.default_s}, {"speedup", r.best_s > 0 && r.default_s > 0 ? r.default_s / r.best_s : 0.0},
              {"tried", r.tried}, {"ok", r.ok}, {"failed", r.failed}, {"rejected", r.rejected},
              {"pruned", r.pruned}, {"pruned_reasons", r.pruned_reasons}, {"elapsed_s", r.elapsed_s},
              {"median_compile_s", r.median_compile_s}, {"cache", r.cache_path}, {"log", r.log_path},
              {"replaced_model", r.replaced_model},
              {"candidates", cands}};
    std::cout << j.dump() << "\n";
    return 0;
  }
  fmt::print("{} {} [{}] on {}: ", e.name, dtype_name(dt), fmt::join(shape, ", "), o.target);
  if (r.effort == "none") {
    fmt::print("effort none: the default config, untimed\n{}\n", r.best.dump());
    return 0;
  }
  if (r.from_cache) {
    fmt::print("from the cache (tuned earlier: {} search, effort {}, {} candidates; --retune tunes again)\n",
               r.search, r.effort, r.tried);
  } else {
    fmt::print("tuned in {:.1f} s with {} search, effort {}\n", r.elapsed_s, r.search, r.effort);
    fmt::print("  candidates: {} tried ({} ok, {} failed, {} rejected), {} pruned\n", r.tried, r.ok, r.failed,
               r.rejected, r.pruned);
    if (r.pruned) {
      std::vector<std::string> why;
      for (auto& [reason, n] : r.pruned_reasons) why.push_back(fmt::format("{} ({})", reason, n));
      fmt::print("  pruned {} configs: {}\n", r.pruned, fmt::join(why, ", "));
    }
    if (r.median_compile_s > 0) fmt::print("  median compile time: {:.2f} s per candidate\n", r.median_compile_s);
  }
  fmt::print("  default  {}  {}\n", s.space.default_config().dump(), autotune::format_seconds(r.default_s));
  fmt::print("  best     {}  {}", r.best.dump(), autotune::format_seconds(r.best_s));
  if (r.best_s > 0 && r.default_s > 0) fmt::print("  ({:.2f}x the default's speed)", r.default_s / r.best_s);
  fmt::print("\n");
  if (!r.cache_path.empty()) fmt::print("  cache: {}\n  log:   {}\n", r.cache_path, r.log_path);
  if (r.replaced_model) fmt::print("  replaced the model-chosen config (tune --by-model) with this measured one\n");
  fmt::print("pin it: {}\n{}\n", r.pin(), r.best.dump());
  return 0;
}

// Cache entries by kernel name, id prefix or path.
std::vector<autotune::ListedEntry> select_entries(const std::string& what) {
  std::vector<autotune::ListedEntry> out;
  for (auto& le : autotune::list_entries()) {
    std::string id = le.path.stem().string();
    bool match = what.empty() || le.path.string() == what || id.rfind(what, 0) == 0 ||
                 (le.entry && le.entry->key.kernel == what) || le.path.parent_path().filename() == what;
    if (match) out.push_back(std::move(le));
  }
  return out;
}

uint64_t dir_bytes(const fs::path& p, int* files) {
  uint64_t n = 0;
  std::error_code ec;
  if (!fs::exists(p, ec)) return 0;
  for (auto it = fs::recursive_directory_iterator(p, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) {
      n += it->file_size(ec);
      ++*files;
    }
  return n;
}

int cmd_cache_list(const std::string& what, bool json) {
  auto entries = select_entries(what);
  if (json) {
    Json all = Json::array();
    for (auto& le : entries) {
      Json j = {{"path", le.path.string()}, {"id", le.path.stem().string()}};
      if (le.entry) {
        j["kernel"] = le.entry->key.kernel;
        j["key"] = le.entry->key.spec_key;
        j["target"] = le.entry->key.target;
        j["config"] = le.entry->config.to_json();
        j["time_s"] = le.entry->time_s;
        j["default_time_s"] = le.entry->default_time_s;
        j["info"] = le.entry->info;
        j["origin"] = le.entry->info.value("origin", "measured");
      } else {
        j["problem"] = le.problem;
      }
      all.push_back(j);
    }
    std::cout << all.dump() << "\n";
    return 0;
  }
  fs::path root = cache_root();
  fmt::print("autotune cache: {}\n", (root / "autotune").string());
  if (entries.empty()) fmt::print("  (no entries)\n");
  for (auto& le : entries) {
    std::string id = le.path.stem().string().substr(0, 12);
    if (!le.entry) {
      fmt::print("  {}  {:<20} CORRUPT: {}\n", id, le.path.parent_path().filename().string(), le.problem);
      continue;
    }
    const auto& k = le.entry->key;
    std::string speed = le.entry->default_time_s > 0 && le.entry->time_s > 0
                            ? fmt::format(" ({:.2f}x default)", le.entry->default_time_s / le.entry->time_s)
                            : "";
    bool by_model = le.entry->info.value("origin", "") == "model";
    std::string time = by_model ? "predicted " + autotune::format_seconds(le.entry->time_s) + " (model-chosen)"
                                : autotune::format_seconds(le.entry->time_s);
    fmt::print("  {}  {:<20} {:<4} {}  {}{}  {}  [{}]\n", id, k.kernel, k.target, k.spec_key, time, speed,
               le.entry->config.dump(), le.entry->info.value("created", ""));
  }
  int files = 0;
  uint64_t bytes = dir_bytes(root / "cpu", &files);
  fmt::print("compiled kernels (cpu): {} files, {:.1f} MiB in {}\n", files, double(bytes) / (1 << 20),
             (root / "cpu").string());
  return 0;
}

int cmd_cache_show(const std::string& what, bool log) {
  auto entries = select_entries(what);
  if (entries.empty())
    throw ArgumentError(fmt::format("no autotune cache entry matches '{}'", what), "",
                        "`deuteron cache list` shows the entries (kernel name, id prefix or path)");
  for (auto& le : entries) {
    fmt::print("# {}\n", le.path.string());
    if (le.entry) {
      fmt::print("{}", autotune::entry_text(*le.entry));
    } else {
      fmt::print("CORRUPT: {}\n", le.problem);
    }
    fs::path lp = le.path;
    lp.replace_extension(".log");
    std::error_code ec;
    if (fs::exists(lp, ec)) {
      if (log) {
        fmt::print("# {}\n{}", lp.string(), read_file(lp).value_or(""));
      } else {
        fmt::print("# log: {} (--log prints it)\n", lp.string());
      }
    }
    if (le.entry) fmt::print("pin it: KernelOptions{{.config = R\"({})\"}}\n", le.entry->config.dump());
  }
  return 0;
}

// Prints what a clear did; non-zero when a removal failed.
int report_clear(const ClearReport& r, const std::string& what) {
  fmt::print("removed {} from {}\n", what, cache_root().string());
  if (!r.kept.empty()) {
    fmt::print("kept {} file{} Deuteron did not write:\n", r.kept.size(), r.kept.size() == 1 ? "" : "s");
    for (size_t i = 0; i < r.kept.size() && i < 10; ++i) fmt::print("  {}\n", r.kept[i].string());
    if (r.kept.size() > 10) fmt::print("  ... and {} more\n", r.kept.size() - 10);
  }
  for (const std::string& f : r.failed) fmt::print(stderr, "deuteron: could not remove {}\n", f);
  return r.failed.empty() ? 0 : 1;
}

int cmd_cache_clear(const std::string& what, bool all) {
  fs::path root = cache_root();
  if (all) {
    ClearReport r = clear_cache(root, true);
    return report_clear(r, fmt::format("{} files ({:.1f} MiB)", r.removed, double(r.bytes) / (1 << 20)));
  }
  if (what.empty()) {
    size_t n = autotune::list_entries().size();
    ClearReport r = clear_cache(root, false);
    return report_clear(r, fmt::format("{} autotune cache entr{} (compiled kernels kept: --all removes them too)", n,
                                       n == 1 ? "y" : "ies"));
  }
  ClearReport r;
  std::vector<autotune::ListedEntry> entries = select_entries(what);
  for (auto& le : entries) {
    fs::path p = le.path;
    for (const char* ext : {".json", ".log", ".lock"}) {
      std::error_code ec;
      if (fs::remove(p.replace_extension(ext), ec)) ++r.removed;
      else if (ec) r.failed.push_back(fmt::format("{}: {}", p.string(), ec.message()));
    }
  }
  return report_clear(r, fmt::format("{} autotune cache entr{}", entries.size(), entries.size() == 1 ? "y" : "ies"));
}

}  // namespace

autotune::TuneOptions tune_options(const examples::Entry& e, const std::vector<Arg>& args) {
  autotune::TuneOptions t;
  t.args = args;
  if (e.reference) t.reference = e.reference;
  t.tolerance = [&e](DType d) { return examples::tolerance_for(e, d); };
  return t;
}

void add_tune_commands(CLI::App& app) {
  static TuneCli o;
  CLI::App* tune = app.add_subcommand("tune", "autotune a catalogue kernel for a shape and cache the best config");
  tune->add_option("kernel", o.kernel, "kernel name (see `deuteron list`)")->required();
  tune->add_option("--shape", o.shape, "sizes, e.g. 8192,2560 (default: the kernel's CPU bench shape)");
  tune->add_option("--shapes", o.shapes, "small (ragged test shape) or bench");
  tune->add_option("--dtype", o.dtype, "float32 (default), bfloat16, ...");
  tune->add_option("--target", o.target, "cpu (default), pallas, triton");
  tune->add_option("--effort", o.effort, "quick (default, about a minute), full, or none")
      ->check(CLI::IsMember({"none", "quick", "full"}));
  tune->add_option("--search", o.search, "auto (default), random, pattern, de or exhaustive")
      ->check(CLI::IsMember({"auto", "random", "pattern", "de", "exhaustive"}));
  tune->add_option("--seed", o.seed, "seed of the search (default 0)")->check(CLI::Range(uint64_t(0), uint64_t(INT64_MAX)));
  tune->add_flag("--retune", o.retune, "ignore the cached config and tune again");
  tune->add_flag("--by-model", o.by_model,
                 "choose by the performance model, without a device or inputs, and cache it as model-chosen (a "
                 "measured tune on the device replaces it)");
  tune->add_option("--chip", o.chip, "the hardware to tune for (pallas: v4, v5e, v5p, v6e, v7x)");
  tune->add_option("--model-candidates", o.model_candidates, "--by-model: random configs predicted per strategy (default 400)")
      ->check(CLI::Range(1, 100000));
  tune->add_flag("--no-warm-start", o.no_warm_start, "do not seed the search with other shapes' configs");
  // More compile workers than that only share the cores (1000 started 37 compilers on 2).
  int max_jobs = 4 * std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)));
  tune->add_option("--jobs", o.jobs, fmt::format("compile workers (default: one per core; at most {})", max_jobs))
      ->check(CLI::Range(1, max_jobs));
  tune->add_option("--max-candidates", o.max_candidates, "candidates to compile at most (default: from --effort)")
      ->check(CLI::Range(1, 1000000));
  tune->add_option("--time-budget", o.time_budget, "seconds of search at most (default: from --effort)")
      ->check(finite_range(0.1, 86400));
  tune->add_option("--progress", o.progress, "auto, bar, lines or quiet")
      ->check(CLI::IsMember({"auto", "bar", "lines", "quiet"}));
  tune->add_option("--inject", o.inject, "test hook: crash:SUBSTRING;hang:...;wrong:...;oom:...")->group("");
  tune->add_flag("--json", o.json, "machine-readable output (every candidate)");
  tune->callback([] { std::exit(cmd_tune(o)); });

  static std::string what;
  static bool json = false, log = false, all = false;
  CLI::App* cache = app.add_subcommand("cache", "the autotune cache: list, show or clear entries");
  cache->require_subcommand(1);
  CLI::App* list = cache->add_subcommand("list", "list the tuned configs (and the compiled kernels' size)");
  list->add_option("kernel", what, "only this kernel's entries");
  list->add_flag("--json", json, "machine-readable output");
  list->callback([] { std::exit(cmd_cache_list(what, json)); });
  CLI::App* show = cache->add_subcommand("show", "print entries (kernel name, id prefix or path) and their logs");
  show->add_option("entry", what, "kernel name, id prefix (from `cache list`) or path")->required();
  show->add_flag("--log", log, "print the tuning log too");
  show->callback([] { std::exit(cmd_cache_show(what, log)); });
  CLI::App* clear = cache->add_subcommand("clear", "remove tuned configs (of one kernel or entry, or all)");
  clear->add_option("entry", what, "kernel name or id prefix (default: every entry)");
  clear->add_flag("--all", all, "remove the whole cache: compiled kernels and the runner too");
  clear->callback([] { std::exit(cmd_cache_clear(what, all)); });
}

}  // namespace deuteron::cli
