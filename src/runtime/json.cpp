#include "runtime/json.h"

#include <cmath>

#include <fmt/format.h>

namespace deuteron::runtime {

namespace {

// The deepest nesting of brackets outside strings (a scan, so that depth is known before
// anything recursive sees the text).
int nesting(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

std::optional<nlohmann::json> parse_json(std::string_view text, std::string* problem) {
  if (nesting(text) > kMaxJsonDepth) {
    *problem = fmt::format("nests arrays or objects deeper than {} levels", kMaxJsonDepth);
    return std::nullopt;
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::out_of_range& e) {
    *problem = fmt::format("holds a number out of range ({})", e.what());
  } catch (const nlohmann::json::exception& e) {
    *problem = text.empty() ? "is empty" : fmt::format("is not valid JSON: {}", e.what());
  }
  return std::nullopt;
}

std::optional<double> finite_number(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number() || !std::isfinite(it->get<double>())) return std::nullopt;
  return it->get<double>();
}

}  // namespace deuteron::runtime
