// The tuning cache: the best config per (kernel source hash, specialisation key, target,
// hardware fingerprint, Deuteron version), one JSON file per entry under
// cache_root()/autotune/<kernel>/<id>.json, with the log of the tuning run beside it
// (<id>.log). Entries carry a checksum; one that is corrupt or truncated is reported (once per
// process) and re-tuned. Writers go through atomic_write, so concurrent writers are safe and
// readers see a whole entry or none.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "driver/driver.h"

namespace deuteron::autotune {

struct CacheKey {
  std::string kernel;       // the kernel's name
  std::string source_hash;  // ir::fingerprint of the IR after the passes: moving the kernel keeps it
  std::string spec_key;     // shapes, dtypes, layout of the arguments
  std::string target;
  std::string hardware;     // the harness's fingerprint
  std::string version;      // DEUTERON_VERSION
  std::vector<std::vector<int64_t>> shapes;  // per argument (empty for scalars): warm starts

  std::string id() const;  // 32 hex digits over every field above but `shapes`
  std::filesystem::path dir() const;  // cache_root()/autotune/<kernel>
  std::filesystem::path path() const;  // <dir>/<id>.json
  std::filesystem::path log_path() const;  // <dir>/<id>.log
  std::filesystem::path lock_path() const;  // <dir>/<id>.lock
};

CacheKey make_key(const driver::Specialized& s, const std::string& hardware);

struct CacheEntry {
  CacheKey key;
  config::Config config;
  double time_s = 0;          // the best config's median
  double default_time_s = 0;  // the default config's median, same run (0 if it failed)
  nlohmann::json info = nlohmann::json::object();  // effort, search, counts, created, ...
};

// The entry for `key`: nullopt when there is none or it cannot be used; then `problem` (if
// given) says why for an entry that exists but is corrupt, truncated or for another key.
std::optional<CacheEntry> read_entry(const CacheKey& key, std::string* problem = nullptr);
void write_entry(const CacheEntry& e);

// Every entry file (or those of one kernel), usable or not.
struct ListedEntry {
  std::filesystem::path path;
  std::optional<CacheEntry> entry;
  std::string problem;  // why `entry` is empty
};
std::vector<ListedEntry> list_entries(const std::string& kernel = "");

// Entries of the same kernel name, target, hardware and version for other specialisations,
// closest shapes first (for warm starts).
std::vector<CacheEntry> related_entries(const CacheKey& key);

// Fits a config from another specialisation into `space`: tunables it lacks take their
// default, values not in the list take the nearest one (block sizes by ratio).
config::Config fit_into(const config::ConfigSpace& space, const config::Config& c);

// The time now as an entry's "created" field (UTC, ISO 8601).
std::string now_text();

// Parses an entry file's text; nullopt with `problem` set when it is corrupt.
std::optional<CacheEntry> parse_entry(const std::string& text, std::string* problem);
std::string entry_text(const CacheEntry& e);  // with its checksum

}  // namespace deuteron::autotune
