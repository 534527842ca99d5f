#include "runtime/text.h"

#include <fmt/format.h>

namespace deuteron::runtime {

namespace {

bool alnum(unsigned char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string escaped(std::string_view s) {
  std::string out;
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '"': out += "\\\""; break;
      case '\'': out += "\\'"; break;
      default:
        // The backslash too: as \134 the text cannot end in one (a C++ line splice).
        if (c >= 0x20 && c < 0x7f && c != '\\') out += ch;
        else out += fmt::format("\\{:03o}", c);
    }
  }
  return out;
}

std::string identifier(std::string_view s) {
  std::string out;
  for (char c : s) out += alnum(static_cast<unsigned char>(c)) ? c : '_';
  if (out.empty() || (out[0] >= '0' && out[0] <= '9')) out = "_" + out;
  return out;
}

std::string file_stem(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) out += alnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  return out.empty() ? "kernel" : out;
}

std::string encode_field(std::string_view s) {
  std::string out;
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c > 0x20 && c < 0x7f && c != '%') out += ch;
    else out += fmt::format("%{:02X}", c);
  }
  return out;
}

std::optional<std::string> decode_field(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;
    int a = hex_value(s[i + 1]), b = hex_value(s[i + 2]);
    if (a < 0 || b < 0) return std::nullopt;
    out += char(a * 16 + b);
    i += 2;
  }
  return out;
}

}  // namespace deuteron::runtime
