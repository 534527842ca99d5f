// JSON read from files and users (configs, cache entries, the roofline), validated: parsing
// never throws nlohmann's exceptions at the caller nor recurses without bound (a config nested
// 60,000 levels deep overflows the stack in nlohmann's recursive copy), and numbers are taken
// only when they are finite (nlohmann writes NaN as null).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace deuteron::runtime {

// How deeply arrays and objects may nest in what parse_json accepts.
inline constexpr int kMaxJsonDepth = 64;

// The JSON value in `text`; nullopt with `problem` set when it cannot be parsed, worded to
// follow the thing's name: "is not valid JSON: ...", "nests arrays or objects deeper than 64
// levels", "holds a number out of range (...)", "is empty".
std::optional<nlohmann::json> parse_json(std::string_view text, std::string* problem);

// j[key] when `j` is an object holding a finite number there; nullopt otherwise.
std::optional<double> finite_number(const nlohmann::json& j, const char* key);

}  // namespace deuteron::runtime
