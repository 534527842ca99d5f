// What every target provides: limits for the config space, source text from a plan, and an
// executable that runs it. The autotuner and the driver only talk to targets through this.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backends/harness.h"
#include "config/config.h"
#include "deuteron/error.h"
#include "deuteron/tensor.h"
#include "model/model.h"
#include "plan/plan.h"

namespace deuteron::backends {

// A scalar argument as an executable receives it: an integer scalar exactly (all 64 bits, in
// `integer`), a float one in `real`; the IR's ScalarParam dtype says which. The cpu target's
// generated code takes an array of these (dt::Scalar in deuteron_cpu.h, the same layout).
union ScalarValue {
  double real;
  int64_t integer;
};

// The value of a kernel argument (deuteron::Arg) for a scalar parameter of dtype `t`: an
// int64 argument stays exact for an integer parameter (a double one is truncated, as C++ does).
inline ScalarValue scalar_value(const std::variant<Tensor, double, int64_t>& a, DType t) {
  ScalarValue v;
  const int64_t* i = std::get_if<int64_t>(&a);
  double d = i ? double(*i) : std::get<double>(a);
  if (is_floating(t))
    v.real = d;
  else
    v.integer = i ? *i : int64_t(d);
  return v;
}

class Executable {
 public:
  virtual ~Executable() = default;
  // tensors: the IR's host tensors in order (inputs and allocated outputs); scalars: the
  // scalar arguments in order.
  virtual void run(const std::vector<Tensor>& tensors, const std::vector<ScalarValue>& scalars) = 0;
  // An executable compiled to time its grid steps (Backend::compile_traced): the steps of its
  // last run, in grid order; empty for any other.
  struct StepTime {
    int thread = 0;
    int64_t step = 0;
    double start = 0, end = 0;  // seconds from the first step's start
  };
  virtual std::vector<StepTime> step_times() const { return {}; }
  bool compiled = false;  // this process invoked the target's compiler for it
  double compile_seconds = 0;
  std::string source_path;
};

// The peak rates a target's kernels are judged against, and the hardware they were measured on.
struct Roofline {
  std::string hardware;                           // one line: model, cores, vector width, fast memory
  nlohmann::json details;                         // the same as fields, for --json
  double peak_gflops = 0, peak_gflops_1core = 0;  // f32 FMA, all cores and one
  double bf16_peak_gflops = 0;                    // products of bf16 operands, all cores (0: unknown)
  std::string bf16_unit;                          // what computes them, e.g. "vdpbf16ps"
  double copy_gbps = 0, copy_gbps_1core = 0;      // large-array copy, bytes read + written
  double read_gbps = 0;                           // large-array read (0: not measured)
  // How repeatable the figures are, for reports: e.g. "copy 27.1-29.0 GB/s over 9 samples".
  std::string spread;
};

// One variant of a kernel in an ahead-of-time build (`deuteron aot`): source that builds and
// runs without Deuteron, and what calling its entry point needs.
// An index a variant checks (cpu: status word 1 + its number says it failed): a dim of one
// of the IR's host tensors, indexed with values the kernel computed.
struct AotIndexCheck {
  int tensor = -1;
  int dim = -1;
  std::string where;  // the line in the user's kernel
};

struct AotVariant {
  std::string source;
  std::string entry;  // the function to call (cpu: an extern "C" symbol; python: `run`)
  int64_t scratch_per_thread = 0;
  int threads = 1;
  std::vector<AotIndexCheck> index_checks;
  // General variants whose scratch follows the sizes: the function (cpu: `long f(const
  // int64_t* sizes)`) giving scratch_per_thread at a call's sizes; scratch_per_thread is then 0.
  std::string scratch_function;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual config::TargetLimits limits() const = 0;
  // Adds this target's own tunables to a kernel's space and sets defaults that suit it.
  virtual void extend_space(const ir::Kernel& k, const config::TargetLimits& limits,
                            config::ConfigSpace& space) const {
    (void)k;
    (void)limits;
    (void)space;
  }
  // Applies this target's rules to a lowered plan (block alignment, its fast-memory model):
  // records what the plan needs of fast memory, and throws ConfigError when it breaks a rule
  // or does not fit `limits`.
  virtual void refine(plan::Plan& p, const config::TargetLimits& limits) const = 0;
  // What this target decided beyond the neutral plan, for `deuteron emit --plan`.
  virtual std::string describe(const plan::Plan& p) const {
    (void)p;
    return "";
  }
  // Makes the space's heuristic default legal for this target (e.g. TPU block alignment).
  virtual config::Config adjust_default(const config::ConfigSpace& space, const config::Config& c,
                                        const ir::Kernel& k) const {
    (void)space;
    (void)k;
    return c;
  }
  // Throws CompileError naming the first construct of the kernel this target cannot express
  // (no config helps: emit and compile would fail the same way).
  virtual void check_expressible(const plan::Plan& p) const { (void)p; }
  // Whether this target runs in a simulator on this machine (interpret mode): commands then
  // default to the small shapes and a single timed run.
  virtual bool simulated() const { return false; }
  // The hardware generations this target can plan for (`--chip`), and the environment
  // variable that selects one for the process; none: it plans for the machine it runs on.
  virtual std::vector<std::string> chips() const { return {}; }
  virtual std::string chip_variable() const { return ""; }
  // The environment setting ({variable, value}) that runs this target in its simulator on the
  // CPU, hardware or not (`--interpret`); empty: it has none.
  virtual std::pair<std::string, std::string> interpret_setting() const { return {}; }
  // One line on where this target's kernels run here, when that needs saying (the CLI prints
  // it): e.g. that a simulator stands in for the hardware. Empty: nothing to say.
  virtual std::string device_note() const { return ""; }
  virtual std::string emit(const plan::Plan& p) const = 0;
  // The language of this target's ahead-of-time variants: "c++" (built by CMake into a
  // library), "python" (modules), "" (none).
  virtual std::string aot_language() const { return ""; }
  // A variant for an ahead-of-time build, its entry point named `entry` where the language has
  // symbols. `general`: it reads its sizes at run time and serves any shape (ConfigError when
  // the plan cannot, or the target has no such variants). Default: the emitted module as is.
  virtual AotVariant emit_aot(const plan::Plan& p, const std::string& entry, bool general) const {
    (void)entry;
    if (general)
      throw ConfigError(fmt::format("the {} target has no general variants: its code is made for one shape", name()));
    return {emit(p), "run", 0, 1, {}, {}};
  }
  // Whether a general variant keeps a block that covered its whole dim at the tuned shape as
  // the call's whole dim (its fast memory then follows the size), rather than looping the dim
  // in blocks (the default: nothing sized by the shape in fast memory).
  virtual bool aot_keeps_whole_dims() const { return false; }
  // Files the variants of an ahead-of-time build include, {name, contents}.
  virtual std::vector<std::pair<std::string, std::string>> aot_support_files() const { return {}; }
  virtual std::unique_ptr<Executable> compile(const plan::Plan& p) const = 0;
  // What besides the plan decides the compiled code, such as a compiler and flags that a setting
  // can change: the in-process cache of executables keys on it.
  virtual std::string build_identity() const { return ""; }
  // An executable that records when each grid step ran on which thread (`deuteron run
  // --timeline`); the normal one is unchanged. nullptr: this target cannot.
  virtual std::unique_ptr<Executable> compile_traced(const plan::Plan& p) const {
    (void)p;
    return nullptr;
  }
  // How the autotuner times this target's candidates; nullptr: it cannot (defaults are used).
  virtual std::unique_ptr<Harness> harness() const { return nullptr; }
  // The hardware the performance model (model/model.h) runs a plan of this target on; nullopt:
  // this target has no description for it.
  virtual std::optional<model::Hardware> model_hardware(const plan::Plan& p) const {
    (void)p;
    return std::nullopt;
  }
  // Measured once per machine and cached (remeasure: now); nullopt: this target has none.
  virtual std::optional<Roofline> roofline(bool remeasure) const {
    (void)remeasure;
    return std::nullopt;
  }
  // Times one pass of the roofline's copy now, in GB/s (bytes read + written), each call on the
  // same arrays, which the function owns: a run pairs it with its own runs (`deuteron run
  // --paired-copy`). nullptr: this target has none.
  virtual std::function<double()> copy_probe() const { return nullptr; }
};

}  // namespace deuteron::backends
