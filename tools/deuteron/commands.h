// The CLI's subcommands, one file per group; main.cpp wires them into one CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace deuteron::cli {

// run, emit, list, roofline (main.cpp).
void add_core_commands(CLI::App& app);
// tune, cache (tune_commands.cpp, the autotuner's CLI).
void add_tune_commands(CLI::App& app);

}  // namespace deuteron::cli
