// The CLI's subcommands, one file per group; main.cpp wires them into one CLI11 app.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "autotune/autotune.h"
#include "catalogue.h"
#include "driver/driver.h"
#include "frontend/tracer.h"

namespace deuteron::cli {

// "8192,2560" (or 8192x2560) -> {8192, 2560}; ArgumentError on anything else.
std::vector<int64_t> parse_shape(const std::string& text);

// The shape to run kernel `e` at: --shape when given (ArgumentError unless it has the
// kernel's rank), else --shapes small|bench (default bench; small on the pallas target).
std::vector<int64_t> pick_shape(const examples::Entry& e, const std::optional<std::string>& shape,
                                const std::string& shapes, const std::string& target);

// The dtype named `name`, if kernel `e` runs in it (ArgumentError listing its dtypes otherwise).
DType pick_dtype(const examples::Entry& e, const std::string& name);

// --chip: the hardware generation `target` plans for, set through the target's own variable
// (ArgumentError for an unknown chip, or a target without chips).
void select_chip(const std::string& target, const std::string& chip);

// The argument specs (shapes, dtypes, strides) of kernel `e` at `shape` without making its
// inputs: each tensor dim is matched to the shape parameter it follows, found from the inputs
// at two small probe shapes. Emitting or modelling a kernel at a shape that does not fit in
// memory needs no memory. ArgumentError for a dim that follows no single parameter.
std::vector<frontend::ArgSpec> arg_specs(const examples::Entry& e, const std::vector<int64_t>& shape, DType dt);

// The tuner's options for kernel `e` on `args`: its reference and tolerances judge candidates.
autotune::TuneOptions tune_options(const examples::Entry& e, const std::vector<Arg>& args);

// Checks that an option's number is finite and in [lo, hi] (CLI11's Range lets NaN through).
CLI::Validator finite_range(double lo, double hi);

// run, emit, list, roofline (main.cpp).
void add_core_commands(CLI::App& app);
// tune, cache (tune_commands.cpp, the autotuner's CLI).
void add_tune_commands(CLI::App& app);
// model (model_command.cpp: the performance model's predictions).
void add_model_commands(CLI::App& app);
// aot (aot_command.cpp: ahead-of-time builds).
void add_aot_commands(CLI::App& app);

// deuteron run --timeline: runs the kernel of `s` with `config` on `bound` once more, compiled
// to record each grid step's thread and times, and draws the first `steps` steps of each
// thread beside the model's prediction for the same plan into the PNG at `path`. Throws
// ArgumentError for a target that cannot record its steps.
void write_run_timeline(const std::string& path, int steps, const std::string& what, const driver::Specialized& s,
                        const config::Config& config, const driver::Bound& bound);

}  // namespace deuteron::cli
