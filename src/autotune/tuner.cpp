// The tuning loop: one process (this one) proposes, prunes, hands candidates to compile
// workers, runs each compiled candidate in a runner, checks and times it, and feeds the cost
// back to the search strategy. Single-threaded: everything is driven by poll() over the
// workers' pipes, so no thread of ours holds a lock while a worker is forked.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "autotune/autotune.h"
#include "autotune/by_model.h"
#include "autotune/cache.h"
#include "autotune/process.h"
#include "autotune/progress.h"
#include "autotune/search.h"
#include "backends/registry.h"
#include "deuteron/error.h"
#include "runtime/disk_cache.h"
#include "runtime/env.h"
#include "runtime/machine_load.h"
#include "runtime/process.h"

namespace deuteron::autotune {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using config::Config;

const char* status_name(Candidate::Status s) {
  switch (s) {
    case Candidate::Status::Ok: return "ok";
    case Candidate::Status::Pruned: return "pruned";
    case Candidate::Status::Failed: return "failed";
    case Candidate::Status::Rejected: return "rejected";
    case Candidate::Status::Skipped: return "skipped";
  }
  return "?";
}

std::string TuneResult::pin() const {
  return fmt::format("KernelOptions{{.config = R\"({})\"}}", best.dump());
}

std::string prune_reason(const std::string& message) {
  if (message.find("fast memory") != std::string::npos) return "fast memory over budget";
  // Otherwise the message without the config and numbers, so that alike reasons add up.
  std::string out;
  int depth = 0;
  for (char c : message) {
    if (c == '{') ++depth;
    if (depth == 0) out += std::isdigit(static_cast<unsigned char>(c)) ? 'N' : c;
    if (c == '}' && depth > 0) --depth;
  }
  std::string squeezed;
  for (char c : out)
    if (!(c == 'N' && !squeezed.empty() && squeezed.back() == 'N')) squeezed += c;
  size_t start = squeezed.find_first_not_of(" :");
  squeezed = start == std::string::npos ? "" : squeezed.substr(start);
  if (squeezed.size() > 80) squeezed = squeezed.substr(0, 77) + "...";
  return squeezed.empty() ? "illegal config" : squeezed;
}

namespace {

// ---- process-wide state ------------------------------------------------------------------

std::mutex g_mu;                                // guards the two maps below
std::map<std::string, CacheEntry> g_memory;     // entries read or written by this process
std::set<std::string> g_reported;               // corrupt entries already reported
std::mutex g_tune_mu;                           // one tuning at a time in a process

// Other processes' load (in cores) above which a tuning run's timings are suspect.
constexpr double kBusyCores = 0.5;

// ---- effort ------------------------------------------------------------------------------

struct Budget {
  int max_candidates;
  double time_s;
  double warmup_s, sample_s;
  int min_reps, max_reps;
  int finalists;
  double retime_s;  // per finalist
  int model_top;    // --search model: the top-ranked configs compiled and timed
};

Budget budget_for(const std::string& effort) {
  if (effort == "quick") return {48, 50.0, 0.02, 0.10, 3, 60, 4, 0.4, 8};
  if (effort == "full") return {400, 600.0, 0.05, 0.30, 5, 300, 8, 1.5, 32};
  throw ArgumentError(fmt::format("unknown autotuning effort '{}'", effort), "",
                      "use none, quick or full");
}

int cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)));
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// ---- injected failures (tests) -----------------------------------------------------------

struct Injection {
  std::vector<std::pair<std::string, std::string>> rules;  // kind, substring

  explicit Injection(const std::string& spec) {
    std::string all = spec;
    std::string e = env("DEUTERON_AUTOTUNE_INJECT");
    if (!e.empty()) all += (all.empty() ? "" : ";") + e;
    std::istringstream in(all);
    for (std::string part; std::getline(in, part, ';');) {
      size_t colon = part.find(':');
      if (part.empty()) continue;
      if (colon == std::string::npos)
        throw ArgumentError(fmt::format("bad autotune injection '{}'", part), "",
                            "write kind:substring, kind one of crash, hang, wrong, oom, "
                            "compile_crash, compile_hang");
      std::string kind = part.substr(0, colon);
      static const std::set<std::string> kinds = {"crash", "hang", "wrong", "oom", "compile_crash", "compile_hang"};
      if (!kinds.count(kind))
        throw ArgumentError(fmt::format("bad autotune injection kind '{}'", kind), "",
                            "kinds: crash, hang, wrong, oom, compile_crash, compile_hang");
      rules.push_back({kind, part.substr(colon + 1)});
    }
  }
  // The first rule whose substring occurs in the config, else "none".
  std::string for_config(const std::string& dump, bool compile_stage) const {
    for (auto& [kind, sub] : rules) {
      bool compile_kind = kind.rfind("compile_", 0) == 0;
      if (compile_kind == compile_stage && dump.find(sub) != std::string::npos) return kind;
    }
    return "none";
  }
};

// ---- the tensors, in shared memory --------------------------------------------------------

class Arena {
 public:
  struct Slot {
    size_t off = 0, bytes = 0;
    bool output = false;
    Tensor view;
  };

  Arena(const driver::Specialized& s, const std::vector<Arg>& args, uint64_t seed) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    size_t total = 0;
    for (const ir::HostTensor& t : s.ir.tensors) {
      Slot slot;
      slot.output = t.role == ir::HostRole::Output;
      int64_t extent = 1;
      bool empty = false;
      for (size_t d = 0; d < t.shape.size(); ++d) {
        if (t.shape[d] == 0) empty = true;
        int64_t stride = d < t.strides.size() ? t.strides[d] : 0;
        if (stride < 0)
          throw ArgumentError(fmt::format("cannot tune with a negatively strided argument ({})", t.name));
        extent += (t.shape[d] - 1) * stride;
      }
      if (empty) extent = 0;
      if (slot.output) {
        extent = 1;
        for (int64_t d : t.shape) extent *= d;
      }
      slot.bytes = size_t(extent) * size_t(dtype_size(t.dtype));
      slot.off = total;
      total += (std::max<size_t>(slot.bytes, 1) + page - 1) / page * page;
      slots_.push_back(slot);
    }
    bytes_ = std::max<size_t>(total, page);
    int fd = memfd_create("deuteron-autotune", MFD_CLOEXEC);
    if (fd < 0) throw RuntimeError(fmt::format("memfd_create failed: {}", std::strerror(errno)));
    // Away from 0-3, so that handing it to a runner as descriptor 3 is a plain dup2.
    fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    ::close(fd);
    if (fd_ < 0 || ftruncate(fd_, off_t(bytes_)) != 0)
      throw RuntimeError(fmt::format("cannot size the tuning buffers ({} bytes): {}", bytes_,
                                     std::strerror(errno)));
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) throw RuntimeError(fmt::format("cannot map the tuning buffers: {}", std::strerror(errno)));
    base_ = static_cast<char*>(p);

    for (size_t i = 0; i < s.ir.tensors.size(); ++i) {
      const ir::HostTensor& t = s.ir.tensors[i];
      Slot& slot = slots_[i];
      char* at = base_ + slot.off;
      if (!slot.output && slot.bytes > 0) {
        if (!args.empty()) {
          const Tensor& a = std::get<Tensor>(args.at(size_t(t.arg_index)));
          std::memcpy(at, a.data(), slot.bytes);
        } else if (is_floating(t.dtype)) {
          int64_t n = int64_t(slot.bytes) / dtype_size(t.dtype);
          Tensor r = Tensor::rand({n}, t.dtype, seed * 1000003 + i + 1);
          std::memcpy(at, r.data(), slot.bytes);
        } else {
          // Integer inputs are often indices (labels, gathers): 0 is valid for any extent.
          std::memset(at, 0, slot.bytes);
        }
      }
      slot.view = Tensor::borrow(at, t.shape, t.dtype, slot.output ? std::vector<int64_t>{} : t.strides);
    }
    for (const ir::ScalarParam& sp : s.ir.scalars) {
      if (!args.empty()) {
        scalars_.push_back(backends::scalar_value(args.at(size_t(sp.arg_index)), sp.dtype));
      } else {
        scalars_.push_back(is_floating(sp.dtype) ? backends::scalar_value(0.5, sp.dtype)
                                                 : backends::scalar_value(int64_t(1), sp.dtype));
      }
      integer_.push_back(!is_floating(sp.dtype));
    }
  }
  ~Arena() {
    if (base_) munmap(base_, bytes_);
    if (fd_ >= 0) ::close(fd_);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  int fd() const { return fd_; }
  const std::vector<Slot>& slots() const { return slots_; }

  // The runner commands that describe the tensors.
  std::string request() const {
    std::string r = fmt::format("arena 3 {}\n", bytes_);
    for (const Slot& s : slots_)
      if (s.bytes > 0) r += fmt::format("region {} {} {}\n", s.off, s.bytes, s.output ? "rw" : "ro");
    for (const Slot& s : slots_) r += fmt::format("tensor {}\n", s.off);
    for (size_t i = 0; i < scalars_.size(); ++i)
      r += integer_[i] ? fmt::format("scalar i {}\n", scalars_[i].integer) : fmt::format("scalar f {:.17g}\n", scalars_[i].real);
    return r;
  }
  size_t bytes() const { return bytes_; }

 private:
  int fd_ = -1;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<Slot> slots_;
  std::vector<backends::ScalarValue> scalars_;
  std::vector<bool> integer_;  // per scalar: an integer (exact in the request)
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- one tuning run ------------------------------------------------------------------------

class Tuner {
 public:
  Tuner(const driver::Specialized& s, const TuneOptions& o, backends::Harness& h, const CacheKey& key)
      : s_(s), o_(o), harness_(h), key_(key), budget_(budget_for(o.effort)), inject_(o.inject) {
    if (o.time_budget_s > 0) budget_.time_s = o.time_budget_s;
    if (o.max_candidates > 0) budget_.max_candidates = o.max_candidates;
    if (o.sample_s > 0) budget_.sample_s = o.sample_s;
    if (o.retime_s > 0) budget_.retime_s = o.retime_s;
    jobs_ = o.jobs > 0 ? o.jobs : cores();
  }

  ~Tuner();
  TuneResult run();
  // The log of every candidate, next to the cache entry.
  void write_log(const TuneResult& r);

 private:
  struct Eval {
    Candidate c;
    std::string key, inject, kernel_line;
    plan::Plan plan;
    int reports = 0;  // proposals waiting for its cost
    bool done = false;
  };
  struct CompileJob {
    int eval;
    pid_t pid;
    int fd;
    double deadline;
    std::string out;
    bool stopped = false;
  };
  struct RunnerJob {
    std::vector<int> evals;
    bool retime = false;
    proc::Spawned sp;
    double deadline = 0, timeout_s = 0;
    std::string out, err;
    bool io_open = true, err_open = true, timed_out = false, done = false, ready = false;
    std::map<int, std::vector<double>> samples;
    std::string error;
  };

  // Proposals, pruning and compiles.
  void propose();
  void add_candidate(const Config& c, const std::string& origin, bool from_strategy);
  void start_compile(int e);
  void finish_compile(CompileJob& job);
  // Runs.
  void start_runner(const std::vector<int>& evals, bool retime);
  void handle_runner_output();
  void finish_runner();
  void finish_candidate(int e, Candidate::Status st, const std::string& reason);
  std::string check_outputs();
  void scale_time_budget();
  // Compiles pause while samples are taken.
  void pause_compiles(int keep);
  void resume_compiles();
  void kill_compiles(const std::string& why);
  bool spares(int id) const;
  void poll_once(double max_wait);
  void retime_finalists();
  void report_progress(bool force);
  double elapsed() const { return runtime::monotonic_seconds() - start_; }
  double run_timeout() const;
  std::string choose_search();
  std::string choose_search_without_model();
  TuneResult result();

  const driver::Specialized& s_;
  const TuneOptions& o_;
  backends::Harness& harness_;
  CacheKey key_;
  Budget budget_;
  Injection inject_;
  int jobs_ = 1;
  double start_ = runtime::monotonic_seconds();
  const runtime::CpuUse load_from_ = runtime::cpu_use();
  // Under load (other processes kept more than kBusyCores busy until the finalists were chosen)
  // fewer threads look faster, as a thread that shares its core with another process holds the
  // whole kernel back; on a quiet machine that config leaves cores idle. So a busy run does not
  // decide the thread count: only configs with the default's take part in the final choice.
  double others_ = 0;
  bool threads_kept_ = false;
  int default_threads_ = 0;  // the default config's threads (0: it does not lower)
  bool may_win(const Eval& e) const { return !threads_kept_ || harness_.threads(e.plan) == default_threads_; }
  void decide_threads();

  std::unique_ptr<Arena> arena_;
  std::vector<std::string> runner_cmd_;
  std::unique_ptr<Strategy> strategy_;
  std::string search_, search_note_;
  std::vector<Config> ranked_;  // --search model: the configs to try after the seeds
  std::vector<Eval> evals_;
  std::map<std::string, int> by_key_;
  std::map<std::string, std::string> seed_origin_;  // seeds' origins (the strategy proposes them)
  std::deque<int> ready_;
  std::vector<CompileJob> compiles_;
  std::unique_ptr<RunnerJob> runner_;
  bool paused_ = false;
  double paused_at_ = 0;
  bool strategy_done_ = false, stopped_ = false, first_compile_done_ = false;
  int started_ = 0;  // candidates sent to compile
  std::string stop_reason_;
  std::string budget_scaled_;  // why the time budget is below the effort's

  // Accuracy baseline.
  std::vector<Tensor> expected_;
  std::string baseline_from_;  // "reference", "default config", "candidate #N"
  double base_time_ = 0;       // the first correct candidate's median (normally the default's)
  double best_time_ = 0;

  std::unique_ptr<Progress> progress_;
  std::vector<std::string> log_lines_;
};

std::string Tuner::choose_search() {
  // The model ranks every valid config in a second or so; the quick effort uses it where the
  // target has one, and compiles only the top of the ranking.
  if (o_.search == "model" || (o_.search == "auto" && o_.effort == "quick")) {
    ModelRanking m = rank_by_model(s_, 20000, o_.seed);
    if (m.available) {
      int top = o_.max_candidates > 0 ? o_.max_candidates : budget_.model_top;
      for (size_t i = 0; i < m.configs.size() && int(i) < top; ++i) ranked_.push_back(m.configs[i].config);
      search_note_ = fmt::format(
          "the model ranked {} valid configs ({} {}, {} pruned); the top {} are timed, then the best point's "
          "neighbours",
          m.configs.size(), m.considered, m.sampled ? "sampled" : "in the space", m.pruned, ranked_.size());
      return "model";
    }
    if (o_.search == "model") {
      std::string fallback = choose_search_without_model();
      search_note_ = fmt::format("{}: --search model falls back to {} search", m.why_not, fallback);
      progress_->message(search_note_);
      return fallback;
    }
  }
  return o_.search == "auto" ? choose_search_without_model() : o_.search;
}

std::string Tuner::choose_search_without_model() {
  // Small spaces: count what survives pruning (lowering is cheap) and try all of it.
  if (s_.space.size() <= 20000) {
    int valid = 0;
    for (const Config& c : enumerate(s_.space, 20000)) {
      try {
        driver::lower(s_, c);
        ++valid;
      } catch (const ConfigError&) {
      }
      if (valid > budget_.max_candidates) break;
    }
    if (valid <= budget_.max_candidates) return "exhaustive";
  }
  return "pattern";
}

double Tuner::run_timeout() const {
  if (o_.run_timeout_s > 0) return o_.run_timeout_s;
  if (base_time_ <= 0) return 60;
  return std::max(5.0, 4 * (budget_.warmup_s + budget_.sample_s) + 60 * base_time_);
}

Tuner::~Tuner() {
  // Only reached with work in flight when an exception leaves run(): leave no process behind.
  for (CompileJob& job : compiles_) {
    proc::signal_tree(job.pid, SIGKILL);
    runtime::ExitStatus ex;
    runtime::reap(job.pid, &ex, true);
    ::close(job.fd);
  }
  if (runner_) {
    proc::signal_tree(runner_->sp.pid, SIGKILL);
    runtime::ExitStatus ex;
    runtime::reap(runner_->sp.pid, &ex, true);
    ::close(runner_->sp.io);
    ::close(runner_->sp.err);
  }
}

void Tuner::add_candidate(const Config& c, const std::string& origin, bool from_strategy) {
  std::string key = c.dump();
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    Eval& e = evals_[size_t(it->second)];
    if (!from_strategy) return;
    if (e.done) {
      strategy_->report(e.c.config, e.c.status == Candidate::Status::Ok ? e.c.median_s : kFailed);
    } else {
      ++e.reports;
    }
    return;
  }
  int id = int(evals_.size());
  evals_.push_back(Eval{});
  Eval& e = evals_.back();
  e.c.config = c;
  e.c.origin = origin;
  if (auto it = seed_origin_.find(key); it != seed_origin_.end()) e.c.origin = it->second;
  e.key = key;
  e.reports = from_strategy ? 1 : 0;
  by_key_[key] = id;
  try {
    e.plan = driver::lower(s_, c);
  } catch (const ConfigError& err) {
    finish_candidate(id, Candidate::Status::Pruned, prune_reason(err.message()));
    return;
  } catch (const Error& err) {
    finish_candidate(id, Candidate::Status::Failed, "lowering failed: " + err.message());
    return;
  }
  e.inject = inject_.for_config(key, true);
  start_compile(id);
}

void Tuner::propose() {
  if (stopped_) return;
  for (;;) {
    if (started_ >= budget_.max_candidates) {
      stop_reason_ = fmt::format("{} candidates compiled (the {} budget)", started_, o_.effort);
      stopped_ = true;
      return;
    }
    if (elapsed() >= budget_.time_s) {
      stop_reason_ = fmt::format("time budget of {:.0f} s spent{}", budget_.time_s, budget_scaled_);
      stopped_ = true;
      kill_compiles("skipped: the time budget ran out while it compiled");
      return;
    }
    if (strategy_done_ || paused_) return;
    int limit = first_compile_done_ ? jobs_ : 1;  // the first compile may build the PCH: alone
    if (int(compiles_.size()) >= limit) return;
    if (int(ready_.size() + compiles_.size()) >= jobs_ + 1) return;
    Proposal p = strategy_->next();
    if (p.kind == Proposal::Kind::Done) {
      strategy_done_ = true;
      return;
    }
    if (p.kind == Proposal::Kind::Wait) return;
    add_candidate(s_.space.complete(p.config), "search", true);
  }
}

void Tuner::start_compile(int id) {
  Eval& e = evals_[size_t(id)];
  ++started_;
  e.c.status = Candidate::Status::Skipped;
  const backends::Harness& h = harness_;
  const plan::Plan& plan = e.plan;
  std::string inject = e.inject;
  proc::Forked f = proc::fork_child([&h, &plan, inject](int fd) {
    if (inject == "compile_crash") {
      // A crash as the tuner meets it, whatever handlers the host installed (a sanitizer's).
      ::signal(SIGSEGV, SIG_DFL);
      ::raise(SIGSEGV);
    }
    if (inject == "compile_hang")
      for (;;) pause();
    Json out;
    try {
      backends::Prepared p = h.compile(plan);
      out = {{"ok", true}, {"line", p.kernel_line}, {"compiled", p.compiled}, {"seconds", p.compile_seconds}};
    } catch (const std::exception& ex) {
      out = {{"ok", false}, {"error", ex.what()}};
    }
    proc::write_all(fd, out.dump());
  });
  compiles_.push_back({id, f.pid, f.fd, runtime::monotonic_seconds() + o_.compile_timeout_s, ""});
}

void Tuner::finish_compile(CompileJob& job) {
  runtime::ExitStatus ex;
  runtime::reap(job.pid, &ex, true);
  ::close(job.fd);
  first_compile_done_ = true;
  Eval& e = evals_[size_t(job.eval)];
  if (!ex.exited) {
    finish_candidate(job.eval, Candidate::Status::Failed, fmt::format("compile worker {}", ex.describe()));
    return;
  }
  Json j;
  try {
    j = Json::parse(job.out);
  } catch (const Json::exception&) {
    finish_candidate(job.eval, Candidate::Status::Failed,
                     fmt::format("compile worker ended ({}) without a result", ex.describe()));
    return;
  }
  if (!j.value("ok", false)) {
    std::string msg = j.value("error", std::string("unknown error"));
    finish_candidate(job.eval, Candidate::Status::Failed, "compile failed: " + msg.substr(0, 2000));
    return;
  }
  e.kernel_line = j["line"];
  e.c.compiled = j.value("compiled", false);
  e.c.compile_s = j.value("seconds", 0.0);
  ready_.push_back(job.eval);
}

void Tuner::kill_compiles(const std::string& why) {
  std::vector<CompileJob> kept;
  for (CompileJob& job : compiles_) {
    if (spares(job.eval)) {
      kept.push_back(job);
      continue;
    }
    proc::signal_tree(job.pid, SIGKILL);
    runtime::ExitStatus ex;
    runtime::reap(job.pid, &ex, true);
    ::close(job.fd);
    finish_candidate(job.eval, Candidate::Status::Skipped, why);
  }
  compiles_ = std::move(kept);
  paused_ = false;
}

// The time budget never cuts the default config before it has run: a budget smaller than one
// compile (a tiny --time-budget on a busy machine) still tunes to a config that works.
bool Tuner::spares(int id) const { return id == 0 && !evals_.empty() && !evals_[0].done; }

// Stops all compile workers but the `keep` oldest (nearest to done).
void Tuner::pause_compiles(int keep) {
  if (paused_) return;
  for (size_t i = 0; i < compiles_.size(); ++i) {
    if (int(i) < keep) continue;
    proc::signal_tree(compiles_[i].pid, SIGSTOP);
    compiles_[i].stopped = true;
  }
  paused_ = true;
  paused_at_ = runtime::monotonic_seconds();
}

void Tuner::resume_compiles() {
  if (!paused_) return;
  double stopped_for = runtime::monotonic_seconds() - paused_at_;
  for (CompileJob& job : compiles_) {
    if (!job.stopped) continue;
    proc::signal_tree(job.pid, SIGCONT);
    job.deadline += stopped_for;
    job.stopped = false;
  }
  paused_ = false;
}

void Tuner::start_runner(const std::vector<int>& evals, bool retime) {
  auto job = std::make_unique<RunnerJob>();
  job->evals = evals;
  job->retime = retime;
  std::string req = arena_->request();
  for (int e : evals) req += evals_[size_t(e)].kernel_line + "\n";
  if (retime) {
    double budget = budget_.retime_s * double(evals.size());
    req += fmt::format("timing {} 5 100000 {} 0 0\n", budget_.warmup_s * 2, budget);
    req += "inject none\n";
    job->timeout_s = 30 + 4 * budget + 20 * base_time_ * double(evals.size());
  } else {
    const Eval& e = evals_[size_t(evals[0])];
    double cutoff = best_time_ > 0 ? 20 * best_time_ : 0;
    req += fmt::format("timing {} {} {} {} {} 1\n", budget_.warmup_s, budget_.min_reps, budget_.max_reps,
                       budget_.sample_s, cutoff);
    req += fmt::format("inject {}\n", inject_.for_config(e.key, false));
    job->timeout_s = run_timeout();
  }
  job->deadline = runtime::monotonic_seconds() + job->timeout_s;
  int64_t mem = o_.memory_limit_bytes > 0 ? o_.memory_limit_bytes : (int64_t(4) << 30);
  req += fmt::format("memlimit {}\nrun\n", mem);
  job->sp = proc::spawn(runner_cmd_, arena_->fd());
  proc::write_all(job->sp.io, req);
  runner_ = std::move(job);
}

void Tuner::handle_runner_output() {
  RunnerJob& r = *runner_;
  size_t nl;
  while ((nl = r.out.find('\n')) != std::string::npos) {
    std::string line = r.out.substr(0, nl);
    r.out.erase(0, nl + 1);
    std::istringstream in(line);
    std::string word;
    in >> word;
    if (word == "ready") {
      // Runs next: stop the compilers that would share the candidate's cores.
      int threads = r.retime ? jobs_ : std::max(harness_.threads(evals_[size_t(r.evals[0])].plan), 1);
      pause_compiles(std::max(0, cores() - threads));
      r.ready = true;
      proc::write_all(r.sp.io, "go\n");
    } else if (word == "samples") {
      size_t k = 0, n = 0;
      in >> k >> n;
      std::vector<double> v;
      for (double t; v.size() < n && in >> t;) v.push_back(t);
      if (k < r.evals.size()) r.samples[int(k)] = v;
    } else if (word == "done") {
      r.done = true;
    } else if (word == "error") {
      r.error = line.size() > 6 ? line.substr(6) : "unknown error";
    }
  }
}

std::string Tuner::check_outputs() {
  const auto& slots = arena_->slots();
  if (expected_.empty()) {
    for (int o : s_.ir.outputs) expected_.push_back(slots[size_t(o)].view.to(slots[size_t(o)].view.dtype()));
    return "";
  }
  for (size_t i = 0; i < s_.ir.outputs.size() && i < expected_.size(); ++i) {
    const Tensor& got = slots[size_t(s_.ir.outputs[i])].view;
    Tolerance tol = o_.tolerance ? o_.tolerance(got.dtype()) : accuracy_tolerance(s_.ir, expected_[i]);
    CloseResult c = allclose(got, expected_[i], tol.rtol, tol.atol);
    if (!c.close)
      return fmt::format("wrong answer: output {} differs from the {} at {} of {} elements "
                         "(max abs error {:.3g} at flat index {}), beyond |err| <= {:.3g} + {:.3g} |want| ({}, "
                         "reductions over up to {} elements)",
                         i, baseline_from_, c.num_bad, got.numel(), c.max_abs_err, c.worst_index, tol.atol, tol.rtol,
                         dtype_name(got.dtype()), longest_reduction(s_.ir));
  }
  return "";
}

void Tuner::finish_runner() {
  RunnerJob& r = *runner_;
  runtime::ExitStatus ex;
  runtime::reap(r.sp.pid, &ex, true);
  ::close(r.sp.io);
  ::close(r.sp.err);
  resume_compiles();

  std::string failure;
  if (r.timed_out) {
    failure = fmt::format("timed out after {:.1f} s (killed)", r.timeout_s);
  } else if (!ex.exited) {
    failure = ex.signal == SIGKILL ? "killed by SIGKILL (out of memory?)" : "crashed: " + ex.describe();
  } else if (ex.code == 3) {
    failure = "out of memory: " + r.error;
  } else if (ex.code != 0 || !r.done) {
    std::string err = r.error.empty() ? r.err : r.error;
    while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
    failure = fmt::format("runner failed ({}){}{}", ex.describe(), err.empty() ? "" : ": ", err.substr(0, 2000));
  }

  if (r.retime) {
    if (!failure.empty()) {
      progress_->message(fmt::format("re-timing the finalists failed ({}); using the first timings", failure));
    } else {
      for (size_t k = 0; k < r.evals.size(); ++k)
        evals_[size_t(r.evals[k])].c.retimed_s = median(r.samples[int(k)]);
    }
    runner_.reset();
    return;
  }

  int id = r.evals[0];
  Eval& e = evals_[size_t(id)];
  if (failure.empty() && r.samples[0].empty()) failure = "runner reported no timings";
  if (!failure.empty()) {
    runner_.reset();
    finish_candidate(id, Candidate::Status::Failed, failure);
    return;
  }
  e.c.samples = int(r.samples[0].size());
  e.c.median_s = median(r.samples[0]);
  runner_.reset();
  bool first = expected_.empty();
  std::string wrong = check_outputs();
  if (first) {
    baseline_from_ = id == 0 ? "default config" : fmt::format("candidate #{}", id);
    if (id != 0)
      progress_->message(fmt::format("the default config failed; candidate #{} {} is the accuracy baseline",
                                     id, e.c.config.dump()));
  }
  if (!wrong.empty()) {
    finish_candidate(id, Candidate::Status::Rejected, wrong);
    return;
  }
  if (base_time_ <= 0) {
    base_time_ = e.c.median_s;
    scale_time_budget();
  }
  if (best_time_ <= 0 || e.c.median_s < best_time_) best_time_ = e.c.median_s;
  finish_candidate(id, Candidate::Status::Ok, "");
}

// Tuning pays back over calls: a kernel that runs in microseconds cannot win back a minute of
// search. Once the baseline's time is known, the search may take what 10^4 calls of it take,
// and at least 5 s, unless the caller set a time budget.
void Tuner::scale_time_budget() {
  constexpr double kCalls = 1e4, kMinSeconds = 5;
  double worth = std::max(kMinSeconds, kCalls * base_time_);
  if (o_.time_budget_s > 0 || worth >= budget_.time_s) return;
  budget_.time_s = worth;
  budget_scaled_ = fmt::format(" (scaled to the baseline's {:.3g} ms a call)", base_time_ * 1e3);
  progress_->message(fmt::format("the baseline runs in {:.3g} ms: tuning for at most {:.0f} s (what 10^4 calls take, "
                                 "at least 5 s)",
                                 base_time_ * 1e3, budget_.time_s));
}

void Tuner::finish_candidate(int id, Candidate::Status st, const std::string& reason) {
  Eval& e = evals_[size_t(id)];
  e.c.status = st;
  e.c.reason = reason;
  e.c.finished_s = elapsed();
  e.done = true;
  if (st == Candidate::Status::Failed || st == Candidate::Status::Rejected)
    progress_->message(fmt::format("candidate #{} {} {}: {}", id, e.c.config.dump(),
                                   st == Candidate::Status::Failed ? "failed" : "rejected", reason));
  double cost = st == Candidate::Status::Ok ? e.c.median_s : kFailed;
  for (; e.reports > 0; --e.reports) strategy_->report(e.c.config, cost);
}

void Tuner::poll_once(double max_wait) {
  std::vector<pollfd> fds;
  for (CompileJob& j : compiles_) fds.push_back({j.fd, POLLIN, 0});
  size_t runner_at = fds.size();
  if (runner_) {
    fds.push_back({runner_->io_open ? runner_->sp.io : -1, POLLIN, 0});
    fds.push_back({runner_->err_open ? runner_->sp.err : -1, POLLIN, 0});
  }
  double wait = max_wait;
  double now = runtime::monotonic_seconds();
  for (CompileJob& j : compiles_)
    if (!j.stopped) wait = std::min(wait, j.deadline - now);
  if (runner_) wait = std::min(wait, runner_->deadline - now);
  wait = std::max(wait, 0.0);
  int n = ::poll(fds.data(), fds.size(), int(wait * 1000) + 1);
  if (n < 0 && errno != EINTR) throw RuntimeError(fmt::format("poll failed: {}", std::strerror(errno)));

  char buf[65536];
  auto drain = [&](int fd, std::string& into, bool* open) {
    for (;;) {
      ssize_t k = ::read(fd, buf, sizeof buf);
      if (k > 0) {
        if (into.size() < (4u << 20)) into.append(buf, size_t(k));
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      *open = false;
      return;
    }
  };

  // Compile workers.
  std::vector<CompileJob> still;
  for (size_t i = 0; i < compiles_.size(); ++i) {
    CompileJob& j = compiles_[i];
    bool open = true;
    if (n > 0 && fds[i].revents) drain(j.fd, j.out, &open);
    if (!open) {
      finish_compile(j);
      continue;
    }
    if (!j.stopped && runtime::monotonic_seconds() > j.deadline) {
      proc::signal_tree(j.pid, SIGKILL);
      runtime::ExitStatus ex;
      runtime::reap(j.pid, &ex, true);
      ::close(j.fd);
      first_compile_done_ = true;
      finish_candidate(j.eval, Candidate::Status::Failed,
                       fmt::format("compile timed out after {:.0f} s (killed)", o_.compile_timeout_s));
      continue;
    }
    still.push_back(j);
  }
  compiles_ = std::move(still);

  // The runner.
  if (runner_) {
    RunnerJob& r = *runner_;
    if (n > 0 && r.io_open && fds[runner_at].revents) {
      drain(r.sp.io, r.out, &r.io_open);
      handle_runner_output();
    }
    if (n > 0 && r.err_open && fds[runner_at + 1].revents) drain(r.sp.err, r.err, &r.err_open);
    if (!r.io_open && !r.err_open) {
      finish_runner();
    } else if (runtime::monotonic_seconds() > r.deadline && !r.timed_out) {
      r.timed_out = true;
      proc::signal_tree(r.sp.pid, SIGKILL);
    }
  }
}

void Tuner::report_progress(bool force) {
  Progress::State st;
  for (const Eval& e : evals_) {
    switch (e.c.status) {
      case Candidate::Status::Ok: ++st.ok; break;
      case Candidate::Status::Pruned: ++st.pruned; break;
      case Candidate::Status::Failed: ++st.failed; break;
      case Candidate::Status::Rejected: ++st.rejected; break;
      default: break;
    }
  }
  st.tried = st.ok + st.failed + st.rejected;
  st.budget = budget_.max_candidates;
  st.best_s = best_time_;
  st.default_s = evals_.empty() || evals_[0].c.status != Candidate::Status::Ok ? 0 : evals_[0].c.median_s;
  st.elapsed_s = elapsed();
  st.time_budget_s = budget_.time_s;
  st.compiling = int(compiles_.size());
  progress_->update(st, force);
}

void Tuner::decide_threads() {
  others_ = o_.others_cores ? o_.others_cores() : runtime::others_cores(load_from_, runtime::cpu_use());
  try {
    default_threads_ = harness_.threads(driver::lower(s_, s_.space.default_config()));
  } catch (const Error&) {
    default_threads_ = 0;
  }
  threads_kept_ = others_ > kBusyCores && default_threads_ > 0;
  bool any = false;  // a correct config with the default's threads (else the rule cannot apply)
  for (const Eval& e : evals_) any = any || (e.c.status == Candidate::Status::Ok && may_win(e));
  threads_kept_ = threads_kept_ && any;
  if (threads_kept_)
    progress_->message(fmt::format(
        "other processes kept {:.1f} cores busy: the thread count stays the default's ({}), only configs with "
        "it are re-timed and may win",
        others_, default_threads_));
}

void Tuner::retime_finalists() {
  std::vector<int> ok;
  for (size_t i = 0; i < evals_.size(); ++i)
    if (evals_[i].c.status == Candidate::Status::Ok && may_win(evals_[i])) ok.push_back(int(i));
  std::stable_sort(ok.begin(), ok.end(), [&](int a, int b) { return evals_[size_t(a)].c.median_s < evals_[size_t(b)].c.median_s; });
  std::vector<int> finalists(ok.begin(), ok.begin() + std::min<size_t>(ok.size(), size_t(budget_.finalists)));
  if (!evals_.empty() && evals_[0].c.status == Candidate::Status::Ok &&
      std::find(finalists.begin(), finalists.end(), 0) == finalists.end())
    finalists.push_back(0);  // the default too: the reported speed-up is measured side by side
  if (finalists.size() < 2) {
    for (int f : finalists) evals_[size_t(f)].c.retimed_s = evals_[size_t(f)].c.median_s;
    return;
  }
  progress_->phase("re-timing the finalists");
  start_runner(finalists, true);
  while (runner_) {
    poll_once(0.25);
    report_progress(false);
  }
}

TuneResult Tuner::result() {
  TuneResult r;
  r.effort = o_.effort;
  r.search = search_;
  r.search_note = search_note_;
  r.default_config = s_.space.default_config();
  std::vector<double> compile_times;
  int best = -1;
  auto time_of = [&](const Eval& e) { return e.c.retimed_s > 0 ? e.c.retimed_s : e.c.median_s; };
  // The finalists (re-timed together) decide; others only if nothing was re-timed.
  bool any_retimed = false;
  for (const Eval& e : evals_) any_retimed = any_retimed || e.c.retimed_s > 0;
  for (size_t i = 0; i < evals_.size(); ++i) {
    const Eval& e = evals_[i];
    r.candidates.push_back(e.c);
    switch (e.c.status) {
      case Candidate::Status::Ok: ++r.ok; break;
      case Candidate::Status::Failed: ++r.failed; break;
      case Candidate::Status::Rejected: ++r.rejected; break;
      case Candidate::Status::Pruned:
        ++r.pruned;
        ++r.pruned_reasons[e.c.reason];
        break;
      default: break;
    }
    if (e.c.compiled) compile_times.push_back(e.c.compile_s);
    if (e.c.status != Candidate::Status::Ok || (any_retimed && e.c.retimed_s <= 0) || !may_win(e)) continue;
    if (best < 0 || time_of(e) < time_of(evals_[size_t(best)])) best = int(i);
  }
  r.tried = r.ok + r.failed + r.rejected;
  r.others_cores = others_;
  r.threads_kept = threads_kept_;
  r.median_compile_s = median(compile_times);
  r.elapsed_s = elapsed();
  if (best >= 0) {
    r.best = evals_[size_t(best)].c.config;
    r.best_s = time_of(evals_[size_t(best)]);
  }
  if (!evals_.empty() && evals_[0].c.status == Candidate::Status::Ok) r.default_s = time_of(evals_[0]);
  return r;
}

void Tuner::write_log(const TuneResult& r) {
  std::string log;
  log += fmt::format("# deuteron autotune log, {}\n", now_text());
  log += fmt::format("kernel    {}\nkey       {}\ntarget    {}\nhardware  {}\nversion   {}\nsource    {}\n",
                     key_.kernel, key_.spec_key, key_.target, key_.hardware, key_.version, key_.source_hash);
  log += fmt::format("effort    {} (budget {:g} s, {} candidates)\nsearch    {} (seed {}){}\nbaseline  {}\n", o_.effort,
                     budget_.time_s, budget_.max_candidates, search_, o_.seed,
                     search_note_.empty() ? "" : ": " + search_note_, baseline_from_.empty() ? "none" : baseline_from_);
  log += fmt::format("space     {} points\n{}", s_.space.size(), s_.space.describe());
  log += "\n# candidate  status  median_ms  retimed_ms  samples  compile_s  origin  config  reason\n";
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const Candidate& c = r.candidates[i];
    log += fmt::format("#{:<4} {:<8} {:>10} {:>10} {:>4} {:>6} {:<10} {}{}{}\n", i, status_name(c.status),
                       c.status == Candidate::Status::Ok ? fmt::format("{:.4f}", c.median_s * 1e3) : "-",
                       c.retimed_s > 0 ? fmt::format("{:.4f}", c.retimed_s * 1e3) : "-", c.samples,
                       c.compiled ? fmt::format("{:.2f}", c.compile_s) : "-", c.origin, c.config.dump(),
                       c.reason.empty() ? "" : "  ", c.reason);
  }
  log += fmt::format("\nstopped   {}\n", stop_reason_.empty() ? "search finished" : stop_reason_);
  log += fmt::format("load      other processes kept {:.2f} cores busy{}\n", r.others_cores,
                     r.threads_kept ? fmt::format("; threads kept at the default's ({})", default_threads_) : "");
  log += fmt::format("tried {}, ok {}, failed {}, rejected {}, pruned {}; {:.1f} s; median compile {:.2f} s\n",
                     r.tried, r.ok, r.failed, r.rejected, r.pruned, r.elapsed_s, r.median_compile_s);
  for (auto& [why, n] : r.pruned_reasons) log += fmt::format("pruned    {} x {}\n", n, why);
  if (r.ok) {
    log += fmt::format("best      {} {:.4f} ms\n", r.best.dump(), r.best_s * 1e3);
    if (r.default_s > 0)
      log += fmt::format("default   {} {:.4f} ms (best is {:.2f}x faster)\n", r.default_config.dump(),
                         r.default_s * 1e3, r.default_s / r.best_s);
    log += fmt::format("pin       {}\n", r.pin());
  }
  atomic_write(key_.log_path(), log);
}

TuneResult Tuner::run() {
  progress_ = std::make_unique<Progress>(o_.progress, fmt::format("{} {}", key_.kernel, key_.spec_key));
  harness_.prepare_parent();
  arena_ = std::make_unique<Arena>(s_, o_.args, o_.seed);
  if (o_.reference) {
    if (o_.args.empty()) throw ArgumentError("TuneOptions::reference needs TuneOptions::args");
    std::vector<Tensor> want = o_.reference(o_.args);
    if (want.size() != s_.ir.outputs.size())
      throw ArgumentError(fmt::format("the reference gives {} outputs, the kernel {}", want.size(),
                                      s_.ir.outputs.size()));
    expected_ = want;
    baseline_from_ = "reference";
  }

  // Candidates: the default first (the baseline), then the given ones, the target's suggestions
  // (ConfigSpace::suggestions) and warm starts, then the search's.
  std::vector<Config> seeds = {s_.space.default_config()};
  std::vector<std::string> seed_origin = {"default"};
  auto seed = [&](const Config& full, const char* origin) {
    if (std::find(seeds.begin(), seeds.end(), full) != seeds.end()) return;
    seeds.push_back(full);
    seed_origin.push_back(origin);
  };
  for (const Config& c : o_.candidates) seed(s_.space.complete(c), "given");
  for (const Config& c : s_.space.suggestions()) seed(c, "target");
  size_t warm_limit = seeds.size() + 3;
  if (o_.warm_start && o_.read_cache) {
    for (const CacheEntry& e : related_entries(key_)) {
      seed(fit_into(s_.space, e.config), "warm start");
      if (seeds.size() >= warm_limit) break;
    }
  }
  for (size_t i = 0; i < seeds.size(); ++i) seed_origin_[seeds[i].dump()] = seed_origin[i];
  search_ = choose_search();
  StrategyOptions so;
  so.seeds = seeds;
  so.seed = o_.seed;
  so.budget = budget_.max_candidates;
  so.ranked = ranked_;
  strategy_ = make_strategy(search_, s_.space, so);
  progress_->start(fmt::format("tuning {} for {} on {}: {} search, effort {} ({} configs, {} compile jobs; "
                               "DEUTERON_AUTOTUNE_EFFORT=none uses the default config, =full searches longer)",
                               key_.kernel, key_.spec_key, key_.target, search_, o_.effort, s_.space.size(), jobs_));
  if (int n = int(std::count(seed_origin.begin(), seed_origin.end(), "warm start")); n > 0)
    progress_->message(fmt::format("warm start from {} cached config(s) of other shapes", n));

  // The default's compile starts before the runner is built (it may take a second).
  add_candidate(seeds[0], "default", false);
  runner_cmd_ = harness_.runner_command();

  for (;;) {
    propose();
    bool spent = stopped_ && elapsed() >= budget_.time_s;
    if (!runner_ && !ready_.empty() && (!spent || spares(ready_.front()))) {
      int id = ready_.front();
      ready_.pop_front();
      start_runner({id}, false);
    }
    if (spent) {
      std::deque<int> kept;
      for (int id : ready_)
        if (spares(id)) kept.push_back(id);
        else finish_candidate(id, Candidate::Status::Skipped, "skipped: the time budget ran out");
      ready_ = std::move(kept);
    }
    bool idle = !runner_ && compiles_.empty() && ready_.empty();
    if (idle && (stopped_ || strategy_done_)) break;
    if (idle && !stopped_) {
      // Nothing in flight and the strategy waits: it cannot get an answer. Treat as done.
      Proposal p = strategy_->next();
      if (p.kind == Proposal::Kind::Evaluate) {
        add_candidate(s_.space.complete(p.config), "search", true);
        continue;
      }
      if (p.kind == Proposal::Kind::Done || p.kind == Proposal::Kind::Wait) {
        strategy_done_ = true;
        continue;
      }
    }
    poll_once(0.2);
    report_progress(false);
  }
  if (stop_reason_.empty()) stop_reason_ = "search finished";
  decide_threads();
  retime_finalists();
  report_progress(true);
  TuneResult r = result();
  progress_->finish();
  return r;
}

// ---- cache lookups -------------------------------------------------------------------------

std::optional<CacheEntry> lookup(const CacheKey& key, const driver::Specialized& s) {
  std::string id = key.id();
  {
    std::lock_guard lock(g_mu);
    if (auto it = g_memory.find(id); it != g_memory.end()) return it->second;
  }
  std::string problem;
  std::optional<CacheEntry> e = read_entry(key, &problem);
  if (e) {
    double others = e->info.value("others_cores", 0.0);
    if (runtime::measure_again(others > kBusyCores, e->info.value("created_unix", 0.0))) {
      problem = fmt::format("it was tuned while other processes kept {:.1f} cores busy", others);
      e.reset();
    }
  }
  if (e) {
    try {
      e->config = s.space.complete(e->config);
      driver::lower(s, e->config);
    } catch (const Error& err) {
      problem = "its config no longer fits: " + err.message();
      e.reset();
    }
  }
  if (!e) {
    if (!problem.empty()) {
      std::lock_guard lock(g_mu);
      if (g_reported.insert(key.path().string()).second)
        std::cerr << fmt::format("deuteron: autotune cache entry {} is unusable ({}); tuning again\n",
                                 key.path().string(), problem);
    }
    return std::nullopt;
  }
  std::lock_guard lock(g_mu);
  g_memory[id] = *e;
  return e;
}

// An exclusive lock on a file for the length of a tuning run (none if it cannot be had).
class FileLock {
 public:
  explicit FileLock(const fs::path& p) {
    make_private_dirs(p.parent_path());
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd_ >= 0)
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_ = -1;
};

TuneResult from_entry(const CacheEntry& e) {
  TuneResult r;
  r.best = e.config;
  r.best_s = e.time_s;
  r.default_s = e.default_time_s;
  r.from_cache = true;
  r.effort = e.info.value("effort", "");
  r.search = e.info.value("search", "");
  r.tried = e.info.value("tried", 0);
  r.cache_path = e.key.path().string();
  r.log_path = e.key.log_path().string();
  return r;
}

}  // namespace

int64_t longest_reduction(const ir::Kernel& k) {
  int64_t n = 1;
  auto extent = [&](int axis) { return axis == ir::kOne ? int64_t(1) : k.axes[size_t(axis)].extent; };
  for (const ir::Op& op : k.ops) {
    if (op.kind == ir::OpKind::Reduce) n = std::max(n, extent(k.value(op.inputs[0]).dims[size_t(op.dim)]));
    if (op.kind == ir::OpKind::Dot) n = std::max(n, extent(k.value(op.inputs[0]).dims.back()));
  }
  return n;
}

Tolerance accuracy_tolerance(const ir::Kernel& k, const Tensor& baseline) {
  Tolerance tol = default_tolerance(baseline.dtype());
  int64_t n = longest_reduction(k);
  if (!is_floating(baseline.dtype()) || n == 1) return tol;
  double scale = 0;
  for (int64_t i = 0; i < baseline.numel(); ++i)
    if (double v = std::abs(baseline.get(i)); std::isfinite(v)) scale = std::max(scale, v);
  tol.atol = std::max(tol.atol, 4 * std::sqrt(double(n)) * 0x1p-24 * scale);
  return tol;
}

TuneResult tune(const driver::Specialized& s, const TuneOptions& options) {
  TuneOptions o = options;
  if (o.effort != "none") budget_for(o.effort);  // validates
  if (o.search != "auto") {
    const auto& names = strategy_names();
    if (std::find(names.begin(), names.end(), o.search) == names.end())
      make_strategy(o.search, s.space, {});  // throws the error that lists them
  }
  if (o.effort == "none") {
    TuneResult r;
    r.best = r.default_config = s.space.default_config();
    r.effort = "none";
    return r;
  }
  std::unique_ptr<backends::Harness> harness = s.backend->harness();
  if (!harness)
    throw ArgumentError(
        fmt::format("the autotuner cannot time kernels on the '{}' target yet", s.backend->name()), "",
        "pin a config (KernelOptions{.config = ...}) or tune on another target");
  CacheKey key = make_key(s, harness->hardware_fingerprint(s.limits));
  if (o.read_cache)
    if (auto e = lookup(key, s)) return from_entry(*e);

  std::lock_guard tune_lock(g_tune_mu);
  std::unique_ptr<FileLock> file_lock;
  if (o.write_cache) {
    file_lock = std::make_unique<FileLock>(key.lock_path());
    // Another process may have tuned it while we waited for the lock.
    if (o.read_cache)
      if (auto e = lookup(key, s)) return from_entry(*e);
  }

  Tuner tuner(s, o, *harness, key);
  TuneResult r = tuner.run();
  const double others = r.others_cores;
  if (others > kBusyCores && r.ok > 0)
    std::cerr << fmt::format(
        "deuteron: other processes kept {:.1f} cores busy while {} was tuned, so its timings may be off; the "
        "config is tuned again when an hour old (now: deuteron tune {} --retune)\n",
        others, key.kernel, key.kernel);
  if (r.ok == 0) {
    std::map<std::string, int> why;
    for (const Candidate& c : r.candidates)
      if (c.status == Candidate::Status::Failed || c.status == Candidate::Status::Rejected) ++why[c.reason];
    std::string reasons;
    for (auto& [w, n] : why) reasons += fmt::format("\n  {} x {}", n, w.substr(0, 300));
    throw RuntimeError(fmt::format("autotuning {} ({}) found no config that runs correctly: {} tried, {} pruned{}",
                                   key.kernel, key.spec_key, r.tried, r.pruned, reasons),
                       "", "run the default config with `deuteron run` to see what goes wrong");
  }
  if (o.write_cache) {
    CacheEntry e;
    e.key = key;
    e.config = r.best;
    e.time_s = r.best_s;
    e.default_time_s = r.default_s;
    e.info = {{"effort", r.effort},     {"search", r.search},      {"seed", o.seed},
              {"tried", r.tried},       {"failed", r.failed},      {"rejected", r.rejected},
              {"pruned", r.pruned},     {"elapsed_s", r.elapsed_s}, {"created", now_text()},
              {"median_compile_s", r.median_compile_s}, {"created_unix", runtime::unix_now()},
              {"others_cores", others},   {"threads_kept", r.threads_kept}};
    r.cache_path = key.path().string();
    r.log_path = key.log_path().string();
    try {
      write_entry(e);
      tuner.write_log(r);
      // Measured on the device, it replaces what the model chose (timings in a simulator do not).
      if (!s.backend->simulated()) r.replaced_model = drop_model_entry(s);
    } catch (const Error& err) {
      std::cerr << "deuteron: cannot write the autotune cache: " << err.message() << "\n";
    }
    std::lock_guard lock(g_mu);
    g_memory[key.id()] = e;
  }
  return r;
}

// The measured entry for s, if any.
static std::optional<config::Config> measured(const driver::Specialized& s) {
  std::unique_ptr<backends::Harness> harness = s.backend->harness();
  if (!harness) return std::nullopt;
  if (auto e = lookup(make_key(s, harness->hardware_fingerprint(s.limits)), s)) return e->config;
  return std::nullopt;
}

std::optional<config::Config> cached(const driver::Specialized& s) {
  if (std::optional<config::Config> c = measured(s)) return c;
  if (std::optional<CacheEntry> e = model_entry(s)) return e->config;
  return std::nullopt;
}

driver::Choice choose(const driver::Specialized& s, const std::string& effort) {
  TuneOptions o;
  o.effort = effort;
  o.time_budget_s = s.kernel->options().tune_budget_s;
  if (std::string v = env("DEUTERON_AUTOTUNE_SEARCH"); !v.empty()) o.search = v;
  if (auto seed = runtime::env_integer("DEUTERON_AUTOTUNE_SEED", 0, INT64_MAX)) o.seed = uint64_t(*seed);
  if (std::string v = env("DEUTERON_AUTOTUNE_PROGRESS"); !v.empty()) o.progress = v;
  if (env("DEUTERON_AUTOTUNE_RETUNE") == "1") o.read_cache = false;
  // A target the tuner cannot time yet runs its default config, quietly. In a simulator
  // (TPU interpret mode) timings only inform: a call takes a cached config, else the default,
  // and tunes only when asked (`deuteron tune`, autotune::tune).
  if (!can_tune(s.backend->name())) return {s.space.default_config(), "default", false};
  if (s.backend->simulated()) {
    if (std::optional<config::Config> c = cached(s)) return {*c, "cache", false};
    return {s.space.default_config(), "default", false};
  }
  // A config the model chose for this hardware (deuteron tune --by-model) serves until a
  // measured tune replaces it.
  if (o.read_cache && !measured(s))
    if (std::optional<CacheEntry> e = model_entry(s)) return {e->config, "model", false};
  try {
    TuneResult r = tune(s, o);
    if (!r.from_cache && o.progress != "quiet")
      std::cerr << fmt::format(
          "deuteron: tuned {} for {} in {:.1f} s: {} ({}{}), cached in {}\n  pin it: {}\n", s.kernel->name(), s.key,
          r.elapsed_s, r.best.dump(), format_seconds(r.best_s),
          r.default_s > 0 ? fmt::format(", {:.2f}x the default's speed", r.default_s / r.best_s) : "",
          r.cache_path, r.pin());
    return {r.best, r.from_cache ? "cache" : "tuned", !r.from_cache};
  } catch (const std::exception& e) {
    std::cerr << fmt::format("deuteron: autotuning {} failed; using the default config.\n  {}\n",
                             s.kernel->name(), e.what());
    return {s.space.default_config(), "default", false};
  }
}

bool can_tune(const std::string& target) { return backends::get(target).harness() != nullptr; }

void clear_memory_cache() {
  std::lock_guard lock(g_mu);
  g_memory.clear();
  g_reported.clear();
}

}  // namespace deuteron::autotune
