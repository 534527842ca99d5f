// The on-disk cache shared by all targets: where it lives, who may write it, crash-safe
// writes, content hashes.
//
// The cache holds code this process will run (compiled kernels, the tuner's runner), so it is
// trusted only while no one else can write it: its folders are created 0700 and its files
// 0600 (0700 for programs) whatever the umask, and a file is read or loaded only when it is a
// regular file (not a symlink) owned by this user or root and writable by no one else.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deuteron {

// $DEUTERON_CACHE_DIR if set, else $XDG_CACHE_HOME/deuteron, else ~/.cache/deuteron.
// Read from the environment on every call (tests switch it); the directory is created (0700,
// with any missing parents). Throws RuntimeError when it cannot be created, or when it is
// owned by another user or writable by group or others (anyone who can write it could plant
// a kernel that this process would run). The first use in a process also marks a new cache
// as Deuteron's (kCacheMarker) and sweeps temporary files left by processes that died.
std::filesystem::path cache_root();

// The file that marks a folder as a Deuteron cache (a CACHEDIR.TAG, which backup tools skip);
// `cache clear --all` removes nothing from a folder without it.
inline constexpr const char* kCacheMarker = "CACHEDIR.TAG";

// Creates `dir` and its missing parents with mode 0700, whatever the umask. Throws
// RuntimeError naming the path on failure.
void make_private_dirs(const std::filesystem::path& dir);

// Why a cache file or folder with status `st` cannot be trusted, "" when it can: it must be
// owned by this user (or root) and writable by no one else.
std::string ownership_problem(const struct stat& st);

// Writes `bytes` to a unique temporary file next to `path`, then renames it over `path`, so
// readers (other threads or processes) see either the old file or the whole new one. The file
// gets `mode` exactly; a missing parent directory is created 0700. Throws RuntimeError naming
// the path on failure.
void atomic_write(const std::filesystem::path& path, std::string_view bytes, mode_t mode = 0600);

// The whole file, or nullopt if it does not exist. Throws RuntimeError if it exists but
// cannot be read.
std::optional<std::string> read_file(const std::filesystem::path& path);

// A directory cache_root()/resources/<kind>-<hash> holding `files` (name, contents): files the
// library carries (a target's runtime headers, its Python runner) for programs it starts to
// read. Named by the contents' hash, so processes carrying the same files share one copy and a
// different build never sees stale ones. Written on first use; a file found different from
// what it should hold (damaged, modified, or not trusted) is written again, with a warning.
std::filesystem::path resource_dir(std::string_view kind,
                                   const std::vector<std::pair<std::string_view, std::string_view>>& files);

// A file of the cache: its bytes when it exists and can be trusted (see the top of this
// file); nullopt when it does not exist, or cannot be trusted or read, and then `problem` says
// why (it stays empty for a file that does not exist).
std::optional<std::string> read_cache_file(const std::filesystem::path& path, std::string* problem);

// XXH3-128 of `bytes` as 32 lowercase hex digits (stable across machines and runs).
std::string hash_hex(std::string_view bytes);

// "<pid>-<counter>-<random>": unique among threads and processes, for temporary file names.
// Files and folders named "<anything>.tmp-<unique_suffix()>" in the cache (and private
// temporary folders, runtime/env.h) belong to that pid: once it has died, cache_root() sweeps
// them.
std::string unique_suffix();

// What clear_cache did.
struct ClearReport {
  int removed = 0;                              // files
  uint64_t bytes = 0;                           // their size
  std::vector<std::string> failed;              // "<path>: <why>" for each removal that failed
  std::vector<std::filesystem::path> kept;      // files Deuteron did not write, left alone
};

// Removes from the cache at `root` what Deuteron wrote there, known by its layout and file
// names: the tuned configs (autotune/<kernel>/*.json, .log, .lock) and, with `everything`,
// the compiled kernels, precompiled headers, pallas modules, the tuner's runner and the
// roofline too. Anything else (and every symlink) is kept and listed. Throws RuntimeError when
// `root` holds no kCacheMarker: then it is not known to be a Deuteron cache at all.
ClearReport clear_cache(const std::filesystem::path& root, bool everything);

}  // namespace deuteron
