#include "deuteron/error.h"

namespace deuteron {

namespace {

// The full multi-line text what() returns, so an uncaught error still tells the whole story.
std::string compose(const std::string& message, const std::string& where, const std::string& hint) {
  std::string out = "error: " + message;
  if (!where.empty()) out += "\n  at " + where;
  if (!hint.empty()) out += "\n  hint: " + hint;
  return out;
}

}  // namespace

Error::Error(const std::string& what, const std::string& where, const std::string& hint)
    : std::runtime_error(compose(what, where, hint)), message_(what), where_(where), hint_(hint) {}

std::string format_location(const std::source_location& loc) {
  std::string_view file = loc.file_name();
  // Strip both separators: paths may come from a Windows-built compiler as well.
  if (auto slash = file.find_last_of("/\\"); slash != std::string_view::npos)
    file.remove_prefix(slash + 1);
  return std::string(file) + ":" + std::to_string(loc.line());
}

}  // namespace deuteron
