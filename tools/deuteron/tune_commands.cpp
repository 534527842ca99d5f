#include "commands.h"

namespace deuteron::cli {

void add_tune_commands(CLI::App& app) { (void)app; }

}  // namespace deuteron::cli
