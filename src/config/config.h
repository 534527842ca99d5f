// The config space of a kernel, derived from its IR, and configs (points in it).
//
// A config is a flat JSON object of named choices, e.g.
//   {"block_t0": 4, "reduce_r0": 4096, "num_threads": 2}
// Block sizes are named after the IR's block params; other tunables after the loop they
// affect. Every name comes from the IR, never from a per-kernel table.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ir/ir.h"

namespace deuteron::config {

using Json = nlohmann::json;

// One tunable: a name and its legal values (in order, so neighbours are meaningful).
struct Tunable {
  enum class Kind { BlockSize, Choice, Count };
  std::string name;
  Kind kind = Kind::Choice;
  std::vector<Json> values;
  std::string help;  // what it controls, for `deuteron tune --help-space` and logs
  // A per-operand choice that defers to this loop-level tunable: a config that sets the
  // loop-level one but not this one gets keys::kFollowLoop here.
  std::string follows;
};

// A tensor read by a dot inside an inner loop, which may take its own strategy.
struct OperandTunable {
  std::string name;  // keys::operand(loop axis, tensor)
  int loop = -1;
  int dot = -1;      // the dot op
  int operand = 0;   // 0 = a, 1 = b
  int load = -1;     // the load op
};
std::vector<OperandTunable> operand_tunables(const ir::Kernel& k);

class Config {
 public:
  Config() = default;
  explicit Config(std::map<std::string, Json> values) : values_(std::move(values)) {}
  // Parses a JSON object; throws ConfigError with the parse position on bad text.
  static Config parse(const std::string& text);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  int64_t integer(const std::string& name) const;
  std::string text(const std::string& name) const;
  void set(const std::string& name, Json value) { values_[name] = std::move(value); }
  void erase(const std::string& name) { values_.erase(name); }
  const std::map<std::string, Json>& values() const { return values_; }

  Json to_json() const;
  std::string dump() const;  // compact, keys sorted: stable, usable as a key
  bool operator==(const Config& o) const { return values_ == o.values_; }
  bool operator<(const Config& o) const { return dump() < o.dump(); }

 private:
  std::map<std::string, Json> values_;
};

// Machine facts the space needs: how many cores, how much fast memory per core.
struct TargetLimits {
  int cores = 1;
  int64_t fast_memory_bytes = 1 << 20;
};

class ConfigSpace {
 public:
  // Derives the space from the IR.
  static ConfigSpace derive(const ir::Kernel& k, const TargetLimits& limits);

  const std::vector<Tunable>& tunables() const { return tunables_; }
  // A config that is valid for every shape, with heuristic block sizes.
  Config default_config() const { return default_; }
  // Replaces the default (the driver shrinks it when the target's plan says it does not fit).
  void set_default(const Config& c);
  // For targets extending the space with their own tunables (Backend::extend_space).
  void add(Tunable t, Json default_value);
  void set_default_value(const std::string& name, Json value);
  // For targets whose code does not depend on a tunable: drops it (and its default value).
  void remove(const std::string& name);
  // Configs the target proposes beside the default (Backend::extend_space), complete: the tuner
  // times them right after it. suggest() completes c and drops a copy of one already there.
  const std::vector<Config>& suggestions() const { return suggestions_; }
  void suggest(const Config& c);
  const Tunable* find(const std::string& name) const;
  // Checks names and values; a missing tunable takes its default. Throws ConfigError naming
  // the tunable, the bad value and the legal ones.
  Config complete(const Config& c) const;
  // Number of points (saturating at 2^62).
  int64_t size() const;
  Config random(std::mt19937_64& rng) const;
  // Configs that differ from `c` in one tunable by one step.
  std::vector<Config> neighbours(const Config& c) const;
  // Position of each tunable's value in its list (for search algorithms).
  std::vector<int> encode(const Config& c) const;
  Config decode(const std::vector<int>& positions) const;
  std::string describe() const;

 private:
  std::vector<Tunable> tunables_;
  Config default_;
  std::vector<Config> suggestions_;
};

}  // namespace deuteron::config
