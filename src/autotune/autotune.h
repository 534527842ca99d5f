// The autotuner: for one specialised kernel, search its config space for the fastest config
// that fits the target and gives the right answer, and remember it on disk.
//
//   candidates   proposed by a search strategy (search.h), the default config first, then
//                the best configs cached for other shapes of the kernel (warm starts)
//   pruning      driver::lower on each (plan rules, backend check, fast-memory budget): a
//                ConfigError means the config is never compiled; counted per reason
//   compiling    in forked worker processes, one per core, each with a timeout; the next
//                candidates compile while the current one is timed
//   running      each candidate in a fresh runner process (process.h says why fresh): crash,
//                hang (timeout), out of memory are recorded as failures and tuning goes on
//   accuracy     outputs compared with the reference (when the caller has one) or the default
//                config's outputs, within accuracy_tolerance(); a mismatch is rejected, saying
//                the bound
//   timing       warm-up, repeated runs, median; compiles are paused (SIGSTOP) while samples
//                are taken; the top few and the default are re-timed round-robin at the end
//   cache        cache.h; the tuning process holds a lock file so that two processes tuning
//                the same kernel and shape do it once
//
// The layer above (api/api.h) calls choose() for a kernel's first call of a shape; the target's
// side of tuning is its harness (backends/harness.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "deuteron/kernel.h"
#include "driver/driver.h"

namespace deuteron::autotune {

struct TuneOptions {
  std::string effort = "quick";  // none (default config), quick (about a minute), full
  std::string search = "auto";   // auto: model for the quick effort on a target with a
                                 // performance model, else exhaustive when the valid space fits
                                 // the budget, else pattern; or random, pattern, de, exhaustive,
                                 // model (rank every valid config by the model, compile and time
                                 // the top ones: 8 quick, 32 full, or max_candidates)
  uint64_t seed = 0;
  bool read_cache = true;   // false: tune again even if an entry exists (--retune)
  bool write_cache = true;  // store the best config (and the log)
  bool warm_start = true;   // seed the search with other shapes' cached configs
  // The arguments to tune with; empty: tensors of the specialisation's shapes, uniform in
  // [-1, 1) for floats and 0 for integers (often indices), and 0.5 / 1 for float / integer
  // scalars.
  std::vector<Arg> args;
  // Configs to evaluate right after the default one, before the search's own (completed into
  // the space; they count against max_candidates).
  std::vector<config::Config> candidates;
  // Expected outputs for `args` (the catalogue's reference). Without it the default config's
  // outputs are the baseline every candidate is checked against.
  std::function<std::vector<Tensor>(const std::vector<Arg>&)> reference;
  // The tolerance outputs are checked with; empty: accuracy_tolerance().
  std::function<Tolerance(DType)> tolerance;
  int jobs = 0;  // compile workers; 0: one per core
  double compile_timeout_s = 60;
  double run_timeout_s = 0;        // per candidate; 0: from the default config's time
  int64_t memory_limit_bytes = 0;  // address space a runner may add; 0: 4 GiB
  double time_budget_s = 0;        // 0: from the effort (quick 50 s, full 600 s)
  int max_candidates = 0;          // compiled candidates; 0: from the effort (48, 400)
  double sample_s = 0;             // timed runs per candidate, seconds; 0: from the effort
  double retime_s = 0;             // timed runs per finalist at the end; 0: from the effort
  std::string progress = "auto";   // auto (bar on a terminal, else lines), bar, lines, quiet
  // Test hook, merged with $DEUTERON_AUTOTUNE_INJECT: "kind:substring;..." where kind is
  // crash, hang, wrong, oom, compile_crash or compile_hang and substring is matched against
  // the candidate's config as compact JSON (e.g. crash:"block_t0":8,).
  std::string inject;
  // Test hook: the cores other processes kept busy during the run, as the tuner would measure
  // them from /proc/stat (empty: measured). Above half a core the run is busy, and the thread
  // count stays the default config's (TuneResult::threads_kept).
  std::function<double()> others_cores;
};

struct Candidate {
  enum class Status { Ok, Pruned, Failed, Rejected, Skipped };
  config::Config config;
  Status status = Status::Skipped;
  std::string origin;  // "default", "given", "warm start", "search"
  std::string reason;  // why pruned, failed, rejected or skipped
  double median_s = 0;  // screening median
  int samples = 0;
  double retimed_s = 0;  // finalists: median of the final round-robin re-timing
  bool compiled = false;  // the compiler ran for it (not a kernel cache hit)
  double compile_s = 0;
  double finished_s = 0;  // seconds into the tuning run when its result was known
};
const char* status_name(Candidate::Status s);

struct TuneResult {
  config::Config best, default_config;
  double best_s = 0, default_s = 0;  // medians measured in the same run (re-timed finalists)
  bool from_cache = false;
  std::string effort, search;
  std::string search_note;  // why the search is not the one asked for (no model), or how the model ranked
  int tried = 0, ok = 0, failed = 0, rejected = 0, pruned = 0;
  std::map<std::string, int> pruned_reasons;
  double elapsed_s = 0;
  double median_compile_s = 0;  // over candidates the compiler actually ran for
  std::vector<Candidate> candidates;
  std::string cache_path, log_path;
  bool replaced_model = false;  // a model-chosen entry (tune --by-model) was removed for this one
  double others_cores = 0;  // cores other processes kept busy until the finalists were chosen
  // The run was busy (others_cores above half a core): only configs with the default's thread
  // count were re-timed and could win, so a config chosen under load keeps every core in use
  // once the load is gone. (The entry is still tuned again when an hour old.)
  bool threads_kept = false;
  std::string pin() const;  // KernelOptions{.config = R"({...})"}
};

// Tunes (or finds in the cache) the config of a specialised kernel. Throws ArgumentError for
// bad options, RuntimeError when no candidate at all ran correctly (then nothing is cached).
TuneResult tune(const driver::Specialized& s, const TuneOptions& options = {});

// A kernel call's config: the cache, else tuning with `effort` within the kernel's
// tune_budget_s ($DEUTERON_AUTOTUNE_SEARCH, _SEED, _PROGRESS and DEUTERON_AUTOTUNE_RETUNE=1
// apply). Never throws: when tuning fails it says why on stderr and returns the default config.
driver::Choice choose(const driver::Specialized& s, const std::string& effort);

// The config the cache holds for s, if any (measured, else model-chosen); never tunes.
std::optional<config::Config> cached(const driver::Specialized& s);
// Whether the tuner can time kernels on `target` (it has a harness for it).
bool can_tune(const std::string& target);

// Forgets what this process read from the cache and which corrupt entries it reported (as a
// new process would). For tests.
void clear_memory_cache();

// How closely a candidate's output must match the baseline's: default_tolerance(dtype), its
// absolute part widened to 4 sqrt(n) eps(f32) times the baseline's largest |value| for the
// kernel's longest reduction or product over n elements (summed in another order, a long f32
// sum differs in that many low bits; 1e-4 rejected correct configs of a 4096-wide row sum).
Tolerance accuracy_tolerance(const ir::Kernel& k, const Tensor& baseline);
// The number of elements the kernel's longest reduction or dot product adds up (1 if none).
int64_t longest_reduction(const ir::Kernel& k);

// The configs of s's space ranked by the target's performance model, fastest predicted first:
// every config of a space of at most `limit` points, else `limit` drawn at random (`seed`);
// those that do not lower (ConfigError) are left out and counted. Not available (why_not says
// so) when the target has no model.
struct RankedConfig {
  config::Config config;
  double predicted_s = 0;
};
struct ModelRanking {
  bool available = false;
  std::string why_not;
  std::vector<RankedConfig> configs;
  int64_t considered = 0, pruned = 0;
  bool sampled = false;  // the space was too large to rank whole
};
ModelRanking rank_by_model(const driver::Specialized& s, int64_t limit = 20000, uint64_t seed = 0);

// How a ConfigError message is summarised as a pruning reason ("fast memory over budget").
std::string prune_reason(const std::string& message);

}  // namespace deuteron::autotune
