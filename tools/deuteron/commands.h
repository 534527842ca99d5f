// The CLI's subcommands, one file per group; main.cpp wires them into one CLI11 app.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace deuteron::cli {

// "8192,2560" (or 8192x2560) -> {8192, 2560}; ArgumentError on anything else.
std::vector<int64_t> parse_shape(const std::string& text);

// run, emit, list, roofline (main.cpp).
void add_core_commands(CLI::App& app);
// tune, cache (tune_commands.cpp, the autotuner's CLI).
void add_tune_commands(CLI::App& app);

}  // namespace deuteron::cli
