#include "backends/python/source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cmath>

#include "runtime/text.h"

namespace deuteron::python {

std::string identifier(const std::string& name, const std::set<std::string>& taken) {
  static const std::set<std::string> keywords = {
      "False", "None",   "True",     "and",   "as",   "assert", "async",  "await",  "break",
      "class", "continue", "def",    "del",   "elif", "else",   "except", "finally", "for",
      "from",  "global", "if",       "import", "in",  "is",     "lambda", "nonlocal", "not",
      "or",    "pass",   "raise",    "return", "try", "while",  "with",   "yield",  "match",
      "case",  "type"};
  std::string out = runtime::identifier(name);
  if (keywords.count(out) || taken.count(out)) out += "_";
  return out;
}

std::string float_literal(double x, const std::string& inf, const std::string& nan) {
  if (std::isnan(x)) return nan;
  if (std::isinf(x)) return x > 0 ? inf : "-" + inf;
  std::string s = fmt::format("{}", x);  // the shortest text that reads back as the same double
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string tuple(const std::vector<std::string>& items) {
  if (items.size() == 1) return "(" + items[0] + ",)";
  return fmt::format("({})", fmt::join(items, ", "));
}

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string human_bytes(int64_t bytes) {
  if (bytes >= 1024 * 1024) return fmt::format("{:.1f} MiB", double(bytes) / (1024.0 * 1024.0));
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", double(bytes) / 1024.0);
  return fmt::format("{} bytes", bytes);
}

std::string helper_call(ir::BinaryFn f, const std::string& a, const std::string& b, DType operands) {
  using ir::BinaryFn;
  switch (f) {
    case BinaryFn::Shl: return fmt::format("_shl({}, {}, {})", a, b, 8 * dtype_size(operands));
    case BinaryFn::Shr: return fmt::format("_shr({}, {}, {})", a, b, 8 * dtype_size(operands));
    case BinaryFn::Mod: return fmt::format("_remainder({}, {})", a, b);
    case BinaryFn::FloorDiv: return fmt::format("_floor_divide({}, {})", a, b);
    case BinaryFn::Rand: return fmt::format("_rand({}, {})", a, b);
    case BinaryFn::Randn: return fmt::format("_randn({}, {})", a, b);
    case BinaryFn::RandInt: return fmt::format("_randint({}, {})", a, b);
    default: return "";
  }
}

}  // namespace deuteron::python
