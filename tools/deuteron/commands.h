// The CLI's subcommands, one file per group; main.cpp wires them into one CLI11 app.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "catalogue.h"

namespace deuteron::cli {

// "8192,2560" (or 8192x2560) -> {8192, 2560}; ArgumentError on anything else.
std::vector<int64_t> parse_shape(const std::string& text);

// The shape to run kernel `e` at: --shape when given (ArgumentError unless it has the
// kernel's rank), else --shapes small|bench (default bench; small on the pallas target).
std::vector<int64_t> pick_shape(const examples::Entry& e, const std::optional<std::string>& shape,
                                const std::string& shapes, const std::string& target);

// Checks that an option's number is finite and in [lo, hi] (CLI11's Range lets NaN through).
CLI::Validator finite_range(double lo, double hi);

// run, emit, list, roofline (main.cpp).
void add_core_commands(CLI::App& app);
// tune, cache (tune_commands.cpp, the autotuner's CLI).
void add_tune_commands(CLI::App& app);

}  // namespace deuteron::cli
