// The on-disk cache shared by all targets: where it lives, crash-safe writes, content hashes.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace deuteron {

// $DEUTERON_CACHE_DIR if set, else $XDG_CACHE_HOME/deuteron, else ~/.cache/deuteron.
// Read from the environment on every call (tests switch it); the directory is created.
std::filesystem::path cache_root();

// Writes `bytes` to a unique temporary file next to `path`, then renames it over `path`, so
// readers (other threads or processes) see either the old file or the whole new one.
// Creates the parent directory. Throws RuntimeError naming the path on failure.
void atomic_write(const std::filesystem::path& path, std::string_view bytes);

// The whole file, or nullopt if it does not exist. Throws RuntimeError if it exists but
// cannot be read.
std::optional<std::string> read_file(const std::filesystem::path& path);

// XXH3-128 of `bytes` as 32 lowercase hex digits (stable across machines and runs).
std::string hash_hex(std::string_view bytes);

// "<pid>-<counter>-<random>": unique among threads and processes, for temporary file names.
std::string unique_suffix();

}  // namespace deuteron
