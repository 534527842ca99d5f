// The on-disk cache shared by all targets: where it lives, crash-safe writes, content hashes.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// A directory cache_root()/resources/<kind>-<hash> holding `files` (name, contents): files the
// library carries (a target's runtime headers, its Python runner) for programs it starts to
// read. Named by the contents' hash, so processes carrying the same files share one copy and a
// different build never sees stale ones. Written on first use, never rewritten.
std::filesystem::path resource_dir(std::string_view kind,
                                   const std::vector<std::pair<std::string_view, std::string_view>>& files);

// XXH3-128 of `bytes` as 32 lowercase hex digits (stable across machines and runs).
std::string hash_hex(std::string_view bytes);

// "<pid>-<counter>-<random>": unique among threads and processes, for temporary file names.
std::string unique_suffix();

}  // namespace deuteron
