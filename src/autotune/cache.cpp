#include "autotune/cache.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "deuteron/error.h"
#include "runtime/disk_cache.h"
#include "runtime/json.h"
#include "runtime/text.h"

#ifndef DEUTERON_VERSION
#define DEUTERON_VERSION "unknown"
#endif

namespace deuteron::autotune {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr int kFormat = 1;

Json key_json(const CacheKey& k) {
  return Json{{"kernel", k.kernel},   {"source_hash", k.source_hash}, {"key", k.spec_key},
              {"target", k.target},   {"hardware", k.hardware},      {"version", k.version},
              {"shapes", k.shapes}};
}

double shape_distance(const CacheKey& a, const CacheKey& b) {
  if (a.shapes.size() != b.shapes.size()) return -1;
  double d = 0;
  for (size_t i = 0; i < a.shapes.size(); ++i) {
    if (a.shapes[i].size() != b.shapes[i].size()) return -1;
    for (size_t j = 0; j < a.shapes[i].size(); ++j)
      d += std::fabs(std::log2(double(std::max<int64_t>(a.shapes[i][j], 1))) -
                     std::log2(double(std::max<int64_t>(b.shapes[i][j], 1))));
  }
  return d;
}

}  // namespace

std::string now_text() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string CacheKey::id() const {
  return hash_hex(fmt::format("deuteron-autotune v{}\n{}\n{}\n{}\n{}\n{}\n{}", kFormat, kernel,
                              source_hash, spec_key, target, hardware, version));
}
fs::path CacheKey::dir() const { return cache_root() / "autotune" / runtime::file_stem(kernel); }
fs::path CacheKey::path() const { return dir() / (id() + ".json"); }
fs::path CacheKey::log_path() const { return dir() / (id() + ".log"); }
fs::path CacheKey::lock_path() const { return dir() / (id() + ".lock"); }

CacheKey make_key(const driver::Specialized& s, const std::string& hardware) {
  CacheKey k;
  k.kernel = s.kernel->name();
  k.source_hash = s.ir_hash;
  k.spec_key = s.key;
  k.target = s.backend->name();
  k.hardware = hardware;
  k.version = DEUTERON_VERSION;
  for (const auto& a : s.args) k.shapes.push_back(a.is_tensor ? a.shape : std::vector<int64_t>{});
  return k;
}

std::string entry_text(const CacheEntry& e) {
  Json j = key_json(e.key);
  j["format"] = kFormat;
  j["config"] = e.config.to_json();
  j["time_s"] = e.time_s;
  j["default_time_s"] = e.default_time_s;
  j["info"] = e.info;
  j["checksum"] = hash_hex(j.dump());
  return j.dump(2) + "\n";
}

std::optional<CacheEntry> parse_entry(const std::string& text, std::string* problem) {
  auto bad = [&](const std::string& why) -> std::optional<CacheEntry> {
    if (problem) *problem = why;
    return std::nullopt;
  };
  std::string problem_text;
  std::optional<Json> parsed = runtime::parse_json(text, &problem_text);
  if (!parsed) return bad("the file " + problem_text);
  Json j = std::move(*parsed);
  if (!j.is_object() || !j.contains("checksum") || !j["checksum"].is_string())
    return bad("no checksum");
  std::string sum = j["checksum"];
  j.erase("checksum");
  if (hash_hex(j.dump()) != sum) return bad("checksum mismatch (the file was modified or damaged)");
  try {
    if (j.at("format").get<int>() != kFormat)
      return bad(fmt::format("format {} (this version reads {})", j.at("format").get<int>(), kFormat));
    CacheEntry e;
    e.key.kernel = j.at("kernel");
    e.key.source_hash = j.at("source_hash");
    e.key.spec_key = j.at("key");
    e.key.target = j.at("target");
    e.key.hardware = j.at("hardware");
    e.key.version = j.at("version");
    e.key.shapes = j.at("shapes").get<std::vector<std::vector<int64_t>>>();
    if (!j.at("config").is_object()) return bad("config is not an object");
    e.config = config::Config::parse(j.at("config").dump());
    e.time_s = j.at("time_s");
    e.default_time_s = j.at("default_time_s");
    e.info = j.value("info", Json::object());
    if (!e.info.is_object()) return bad("info is not an object");
    // What the tuner reads from info: a null (how NaN is written) or a wrong type is corrupt.
    for (const char* key : {"others_cores", "created_unix", "tried"})
      if (e.info.contains(key) && !runtime::finite_number(e.info, key)) return bad(fmt::format("info.{} is not a number", key));
    for (const char* key : {"effort", "search"})
      if (e.info.contains(key) && !e.info[key].is_string()) return bad(fmt::format("info.{} is not a string", key));
    return e;
  } catch (const std::exception& ex) {
    return bad(fmt::format("missing or malformed field: {}", ex.what()));
  }
}

std::optional<CacheEntry> read_entry(const CacheKey& key, std::string* problem) {
  std::string why;
  std::optional<std::string> text = read_cache_file(key.path(), &why);
  if (!text) {
    if (problem) *problem = why;
    return std::nullopt;
  }
  auto e = parse_entry(*text, problem);
  if (!e) return std::nullopt;
  if (e->key.id() != key.id()) {
    if (problem) *problem = "the entry belongs to another key";
    return std::nullopt;
  }
  return e;
}

void write_entry(const CacheEntry& e) { atomic_write(e.key.path(), entry_text(e)); }

std::vector<ListedEntry> list_entries(const std::string& kernel) {
  std::vector<ListedEntry> out;
  fs::path root = cache_root() / "autotune";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  std::vector<fs::path> dirs;
  if (!kernel.empty()) {
    dirs.push_back(root / runtime::file_stem(kernel));
  } else {
    for (auto& d : fs::directory_iterator(root, ec))
      if (d.is_directory() && d.path().filename() != "bin") dirs.push_back(d.path());
  }
  for (const fs::path& d : dirs) {
    if (!fs::is_directory(d, ec)) continue;
    for (auto& f : fs::directory_iterator(d, ec)) {
      if (f.path().extension() != ".json") continue;
      ListedEntry le;
      le.path = f.path();
      if (auto text = read_cache_file(f.path(), &le.problem)) le.entry = parse_entry(*text, &le.problem);
      if (le.entry && le.entry->key.id() != f.path().stem().string()) {
        le.entry.reset();
        le.problem = "the file name does not match the entry's key";
      }
      if (le.entry && !kernel.empty() && le.entry->key.kernel != kernel) continue;
      out.push_back(std::move(le));
    }
  }
  std::sort(out.begin(), out.end(), [](const ListedEntry& a, const ListedEntry& b) { return a.path < b.path; });
  return out;
}

std::vector<CacheEntry> related_entries(const CacheKey& key) {
  std::vector<std::pair<double, CacheEntry>> found;
  for (ListedEntry& le : list_entries(key.kernel)) {
    if (!le.entry) continue;
    const CacheKey& k = le.entry->key;
    if (k.target != key.target || k.hardware != key.hardware || k.version != key.version) continue;
    if (k.id() == key.id()) continue;
    double d = shape_distance(k, key);
    if (d < 0) continue;
    found.push_back({d, std::move(*le.entry)});
  }
  std::stable_sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::vector<CacheEntry> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

config::Config fit_into(const config::ConfigSpace& space, const config::Config& c) {
  config::Config out = space.default_config();
  for (const config::Tunable& t : space.tunables()) {
    auto it = c.values().find(t.name);
    if (it == c.values().end()) continue;
    const Json& v = it->second;
    if (std::find(t.values.begin(), t.values.end(), v) != t.values.end()) {
      out.set(t.name, v);
      continue;
    }
    if (!v.is_number()) continue;
    double want = v.get<double>();
    double best = 1e300;
    for (const Json& x : t.values) {
      if (!x.is_number()) continue;
      double have = x.get<double>();
      double d = (want > 0 && have > 0) ? std::fabs(std::log2(want) - std::log2(have)) : std::fabs(want - have);
      if (d < best) {
        best = d;
        out.set(t.name, x);
      }
    }
  }
  return out;
}

}  // namespace deuteron::autotune
