#include "runtime/env.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "deuteron/error.h"
#include "runtime/disk_cache.h"

namespace deuteron::runtime {

namespace fs = std::filesystem;

namespace {

const char* value_of(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

[[noreturn]] void bad_value(const char* name, const char* value, const std::string& legal) {
  throw ArgumentError(fmt::format("environment variable {}='{}' is not {}", name, value, legal), "",
                      fmt::format("set {} to {}, or unset it for the default", name, legal));
}

// The integer `v` starts with (nullopt if none, or out of range), and where its digits end.
std::optional<int64_t> leading_integer(const char* v, const char** rest) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  *rest = end;
  if (end == v || errno == ERANGE) return std::nullopt;
  return int64_t(x);
}

}  // namespace

std::optional<int64_t> env_integer(const char* name, int64_t lo, int64_t hi) {
  const char* v = value_of(name);
  if (!v) return std::nullopt;
  const char* rest = nullptr;
  std::optional<int64_t> x = leading_integer(v, &rest);
  if (!x || *rest != '\0' || *x < lo || *x > hi) bad_value(name, v, fmt::format("an integer from {} to {}", lo, hi));
  return x;
}

std::optional<std::string> env_choice(const char* name, const std::vector<std::string>& choices) {
  const char* v = value_of(name);
  if (!v) return std::nullopt;
  for (const std::string& c : choices)
    if (c == v) return c;
  std::string legal;
  for (size_t i = 0; i < choices.size(); ++i)
    legal += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  bad_value(name, v, legal);
}

std::optional<double> env_number(const char* name, double lo, double hi, bool lo_open) {
  const char* v = value_of(name);
  if (!v) return std::nullopt;
  std::string legal = fmt::format("a number {} {} and at most {}", lo_open ? "above" : "from", lo, hi);
  char* end = nullptr;
  double x = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
    bad_value(name, v, legal);
  return x;
}

std::optional<int64_t> env_bytes(const char* name, int64_t lo, int64_t hi) {
  const char* v = value_of(name);
  if (!v) return std::nullopt;
  std::string legal = fmt::format("a byte count from {} to {} (digits, optionally with K, M or G)", lo, hi);
  const char* rest = nullptr;
  std::optional<int64_t> x = leading_integer(v, &rest);
  int shift = 0;
  switch (*rest) {
    case 'k': case 'K': shift = 10; ++rest; break;
    case 'm': case 'M': shift = 20; ++rest; break;
    case 'g': case 'G': shift = 30; ++rest; break;
    default: break;
  }
  if (!x || *x < 0 || *rest != '\0' || *x > (hi >> shift) || (*x << shift) < lo) bad_value(name, v, legal);
  return *x << shift;
}

std::optional<fs::path> temp_dir_if_valid() {
  const char* v = value_of("TMPDIR");
  fs::path dir = v ? fs::path(v) : fs::path("/tmp");
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK | X_OK) != 0) return std::nullopt;
  return dir;
}

fs::path temp_dir() {
  if (std::optional<fs::path> dir = temp_dir_if_valid()) return *dir;
  const char* v = value_of("TMPDIR");
  throw RuntimeError(fmt::format("the temporary directory {} {}", v ? fmt::format("TMPDIR='{}'", v) : "/tmp",
                                 "is not a directory this process can write"),
                     "", "set TMPDIR to a writable directory (or unset it for /tmp)");
}

fs::path make_temp_dir() {
  fs::path dir = temp_dir() / (std::string(kTempDirPrefix) + unique_suffix());
  // A new folder (never one planted under the same name), exactly 0700.
  if (::mkdir(dir.c_str(), 0700) != 0 || ::chmod(dir.c_str(), 0700) != 0)
    throw RuntimeError(fmt::format("cannot create {}: {}", dir.string(), std::strerror(errno)), "",
                       "set TMPDIR to a writable directory (or unset it for /tmp)");
  return dir;
}

void warn(const std::string& text) { std::fprintf(stderr, "deuteron: warning: %s\n", text.c_str()); }

}  // namespace deuteron::runtime
