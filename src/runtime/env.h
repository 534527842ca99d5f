// The process's environment, validated: variables that configure Deuteron (a value that does
// not parse is an error naming the variable and its legal values, never a silent default), the
// temporary directory, and warnings on stderr.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace deuteron::runtime {

// $name as an integer in [lo, hi]; nullopt when unset or empty. Throws ArgumentError naming
// the variable, its value and the legal range otherwise ("abc", "1.5", out of range).
std::optional<int64_t> env_integer(const char* name, int64_t lo, int64_t hi);
// $name as a finite number in [lo, hi] (lo excluded when `lo_open`); nullopt when unset or
// empty. Throws ArgumentError like env_integer.
std::optional<double> env_number(const char* name, double lo, double hi, bool lo_open = false);
// $name as a byte count in [lo, hi]: digits with an optional K, M or G suffix (powers of 1024).
std::optional<int64_t> env_bytes(const char* name, int64_t lo, int64_t hi);

// $name as one of `choices`; nullopt when unset or empty. Throws ArgumentError like env_integer,
// naming the legal values.
std::optional<std::string> env_choice(const char* name, const std::vector<std::string>& choices);

// The directory for temporary files: $TMPDIR if set, else /tmp. Throws RuntimeError naming
// TMPDIR when it is not a directory this process can write.
std::filesystem::path temp_dir();
// The same, or nullopt instead of the error.
std::optional<std::filesystem::path> temp_dir_if_valid();
// Private temporary folders are temp_dir()/<kTempDirPrefix><unique_suffix()>, created 0700;
// cache_root() sweeps those whose process has died.
inline constexpr const char* kTempDirPrefix = "deuteron-tmp-";
std::filesystem::path make_temp_dir();

// Prints "deuteron: warning: <text>" on stderr.
void warn(const std::string& text);

}  // namespace deuteron::runtime
