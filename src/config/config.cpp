#include "config/config.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/keys.h"
#include "deuteron/error.h"
#include "runtime/json.h"

namespace deuteron::config {

Config Config::parse(const std::string& text) {
  std::string problem;
  std::optional<Json> parsed = runtime::parse_json(text, &problem);
  if (!parsed)
    throw ConfigError(fmt::format("config {}", problem), "",
                      R"(write it as a JSON object, e.g. {"block_t0": 4})");
  Json j = std::move(*parsed);
  if (!j.is_object())
    throw ConfigError(fmt::format("config must be a JSON object, got: {}", text), "",
                      R"(write it as a JSON object, e.g. {"block_t0": 4})");
  std::map<std::string, Json> values;
  for (auto& [k, v] : j.items()) values[k] = v;
  return Config(values);
}

int64_t Config::integer(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || !it->second.is_number_integer())
    throw ConfigError(fmt::format("config has no integer '{}'", name));
  return it->second.get<int64_t>();
}

std::string Config::text(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || !it->second.is_string())
    throw ConfigError(fmt::format("config has no string '{}'", name));
  return it->second.get<std::string>();
}

Json Config::to_json() const {
  Json j = Json::object();
  for (auto& [k, v] : values_) j[k] = v;
  return j;
}

std::string Config::dump() const { return to_json().dump(); }

namespace {

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

std::vector<Json> powers(int64_t lo, int64_t hi) {
  std::vector<Json> v;
  for (int64_t p = next_pow2(std::max<int64_t>(lo, 1)); p <= hi; p <<= 1) v.push_back(p);
  if (v.empty()) v.push_back(next_pow2(hi));
  return v;
}

Json pick(const std::vector<Json>& values, int64_t want) {
  Json best = values.front();
  for (const Json& v : values)
    if (v.get<int64_t>() <= want) best = v;
  return best;
}

}  // namespace

ConfigSpace ConfigSpace::derive(const ir::Kernel& k, const TargetLimits& limits) {
  ConfigSpace s;
  std::map<std::string, Json> d;
  const ir::Loop& grid = k.grid_loop();

  // Elements per grid row that do not depend on the grid block (whole dims read per block).
  int64_t row = 1;
  for (const ir::Axis& ax : k.axes)
    if (ax.kind == ir::AxisKind::Reduction) row = std::max(row, ax.extent);

  // Default block sizes: contiguous (innermost) axes get up to 512 elements, the other grid
  // axes enough rows to fill about 16K elements per block with whatever else the block spans.
  // A param is "innermost" when its axis indexes the last dim of some tensor access.
  std::map<int, bool> innermost_param;
  for (const ir::Op& op : k.ops) {
    if ((op.kind != ir::OpKind::Load && op.kind != ir::OpKind::Store) || op.index.empty()) continue;
    const ir::Index& last = op.index.back();
    if (last.kind == ir::Index::Kind::Axis && k.axes[size_t(last.axis)].kind == ir::AxisKind::Tile)
      innermost_param[k.axes[size_t(last.axis)].block_param] = true;
  }
  int64_t inner_elems = 1;
  for (size_t p = 0; p < k.block_params.size(); ++p) {
    const ir::BlockParam& bp = k.block_params[p];
    if (bp.reduction || !innermost_param[int(p)]) continue;
    int64_t extent = 1;
    for (const ir::Axis& ax : k.axes)
      if (ax.block_param == int(p)) extent = std::max(extent, ax.extent);
    inner_elems = std::max(inner_elems, std::min<int64_t>(512, next_pow2(extent)));
  }
  for (size_t p = 0; p < k.block_params.size(); ++p) {
    const ir::BlockParam& bp = k.block_params[p];
    if (bp.fixed) continue;
    Tunable t;
    t.name = bp.name;
    t.kind = Tunable::Kind::BlockSize;
    int64_t extent = 1;
    for (const ir::Axis& ax : k.axes)
      if (ax.block_param == int(p)) extent = std::max(extent, ax.extent);
    if (bp.reduction) {
      // Whole dimension in one block (persistent), or looped in blocks of a few sizes.
      for (int64_t div = 16; div >= 2; div /= 2)
        if (bp.max / div >= bp.min && bp.max / div >= 16) t.values.push_back(bp.max / div);
      t.values.push_back(bp.max);
      t.help = fmt::format("block of a whole dimension: {} = persistent (one block), smaller = looped",
                           bp.max);
      // Persistent unless a block of rows would crowd the fast memory.
      d[t.name] = bp.max * 4 * 8 <= limits.fast_memory_bytes ? Json(bp.max) : t.values.front();
    } else {
      t.values = powers(bp.min, bp.max);
      t.help = "block size of a tiled dimension";
      int64_t want = innermost_param[int(p)] ? 512 : std::max<int64_t>(1, 16384 / (row * inner_elems));
      d[t.name] = pick(t.values, std::min(want, next_pow2(extent)));
    }
    s.tunables_.push_back(t);
  }

  // Dots: block sizes that suit the micro-kernel (6 x 64 register tiles, K steps of a few
  // hundred), batch dims one at a time, and the whole of any whole dim a dot reads (the
  // micro-kernel takes it in one block). M and N blocks of 128; K blocks of 512; a dim that is
  // N of one product and K of the next (attention's key blocks) 256.
  std::vector<const ir::Op*> dots;
  for (const ir::Op& op : k.ops)
    if (op.kind == ir::OpKind::Dot) dots.push_back(&op);
  {
    enum Role { Batch = 1, M = 2, N = 4, K = 8 };
    std::map<int, int> roles;  // axis -> roles
    auto role = [&](int axis, int r) {
      if (axis != ir::kOne) roles[axis] |= r;
    };
    for (const ir::Op* op : dots) {
      const auto& a = k.value(op->inputs[0]).dims;
      const auto& r = k.value(op->result).dims;
      for (size_t i = 0; i + 2 < r.size(); ++i) role(r[i], Batch);
      for (size_t i = 0; i + 2 < a.size(); ++i) role(a[i], Batch);
      role(r[r.size() - 2], M);
      role(r.back(), N);
      role(a.back(), K);
    }
    for (auto [axis, rs] : roles) {
      int p = k.axes[size_t(axis)].block_param;
      if (p < 0) continue;
      const ir::BlockParam& bp = k.block_params[size_t(p)];
      if (bp.reduction) {  // a whole dim read by a dot stays whole
        for (auto& t : s.tunables_)
          if (t.name == bp.name) t.values = {Json(bp.max)};
        d[bp.name] = bp.max;
        continue;
      }
      if (bp.fixed) continue;
      int64_t want = (rs & Batch) ? 1 : (rs & M) ? 128 : (rs & N) && (rs & K) ? 256 : (rs & N) ? 128 : 512;
      for (auto& t : s.tunables_)
        if (t.name == bp.name) d[bp.name] = pick(t.values, want);
    }
  }

  // A whole dim a scan runs along stays whole: its running value does not cross blocks.
  for (const ir::Op& op : k.ops) {
    if (op.kind != ir::OpKind::Scan) continue;
    int axis = k.value(op.inputs[0]).dims[size_t(op.dim)];
    int p = axis == ir::kOne ? -1 : k.axes[size_t(axis)].block_param;
    if (p < 0 || !k.block_params[size_t(p)].reduction || k.block_params[size_t(p)].fixed) continue;
    const ir::BlockParam& bp = k.block_params[size_t(p)];
    for (auto& t : s.tunables_)
      if (t.name == bp.name) {
        t.values = {Json(bp.max)};
        t.help = fmt::format("the whole dim in one block: the scan at {} runs along it, and a scan's running value "
                             "is not carried from one block to the next", format_location(op.loc));
      }
    d[bp.name] = bp.max;
  }

  // Keep at least a few grid blocks per core so the parallel loop balances.
  auto blocks = [&] {
    int64_t n = 1;
    for (int a : grid.axes) {
      const ir::Axis& ax = k.axes[size_t(a)];
      const ir::BlockParam& bp = k.block_params[size_t(ax.block_param)];
      int64_t b = bp.fixed ? bp.fixed : d[bp.name].get<int64_t>();
      n *= (ax.extent + b - 1) / b;
    }
    return n;
  };
  for (int a : grid.axes) {
    const ir::BlockParam& bp = k.block_params[size_t(k.axes[size_t(a)].block_param)];
    if (bp.fixed) continue;
    while (blocks() < 4 * limits.cores && d[bp.name].get<int64_t>() > bp.min &&
           d[bp.name].get<int64_t>() > 1)
      d[bp.name] = d[bp.name].get<int64_t>() / 2;
  }

  if (grid.axes.size() > 1) {
    Tunable t;
    t.name = keys::kGridOrder;
    t.help = "order of the grid axes, fastest-varying last";
    std::vector<int> perm(grid.axes.size());
    std::iota(perm.begin(), perm.end(), 0);
    do t.values.push_back(perm);
    while (std::next_permutation(perm.begin(), perm.end()));
    d[t.name] = t.values.front();
    s.tunables_.push_back(t);
  }

  // Inner (device) loops that read tensors: how their operand blocks reach fast memory.
  for (size_t l = 0; l < k.loops.size(); ++l) {
    const ir::Loop& loop = k.loops[l];
    if (loop.grid) continue;
    bool reads = false;
    for (const ir::Stmt& st : loop.body)
      if (st.kind == ir::Stmt::Kind::Op && k.ops[size_t(st.id)].kind == ir::OpKind::Load) reads = true;
    if (!reads) continue;
    std::string axis = k.axes[size_t(loop.axes.front())].name;
    Tunable strat;
    strat.name = keys::inner_loop(axis);
    strat.help = "operand blocks of this loop: in_place (read where they are), stream (stage "
                 "each block into scratch), resident (stage the whole loop's extent once)";
    strat.values = {keys::kInPlace, keys::kStream, keys::kResident};
    d[strat.name] = keys::kInPlace;
    s.tunables_.push_back(strat);
    Tunable buf;
    buf.name = keys::buffers(axis);
    buf.kind = Tunable::Kind::Count;
    buf.help = "stream: blocks staged ahead (1 = no prefetch, 2 = double buffering)";
    buf.values = {1, 2, 3};
    d[buf.name] = 2;
    s.tunables_.push_back(buf);
    // Each tensor a dot reads in this loop may take its own strategy; by default it follows the
    // loop's, and a target may choose better defaults (the cpu target does, for its
    // micro-kernel).
    for (const OperandTunable& o : operand_tunables(k))
      if (o.loop == int(l)) {
        Tunable own;
        own.name = o.name;
        own.follows = strat.name;
        own.help = fmt::format("operand {} of a dot in this loop: {} (as {}), {}, {} or {}",
                               o.operand == 0 ? "a" : "b", keys::kFollowLoop, strat.name, keys::kInPlace,
                               keys::kStream, keys::kResident);
        own.values = {keys::kFollowLoop, keys::kInPlace, keys::kStream, keys::kResident};
        d[own.name] = keys::kFollowLoop;
        s.tunables_.push_back(own);
      }
  }
  // Grid order: the dot's M dim fastest, so consecutive grid steps share the B operand's block
  // (kept resident) and walk down A.
  if (!dots.empty() && grid.axes.size() > 1) {
    int m = k.value(dots.front()->result).dims[k.value(dots.front()->result).dims.size() - 2];
    auto it = std::find(grid.axes.begin(), grid.axes.end(), m);
    if (it != grid.axes.end()) {
      std::vector<int> perm;
      for (size_t i = 0; i < grid.axes.size(); ++i)
        if (grid.axes[i] != m) perm.push_back(int(i));
      perm.push_back(int(it - grid.axes.begin()));
      d[keys::kGridOrder] = perm;
    }
  }

  s.default_ = Config(d);
  return s;
}

void ConfigSpace::set_default(const Config& c) { default_ = complete(c); }

Config ConfigSpace::complete(const Config& c) const {
  Config out = default_;
  for (auto& [name, value] : c.values()) {
    auto it = std::find_if(tunables_.begin(), tunables_.end(),
                           [&](const Tunable& t) { return t.name == name; });
    if (it == tunables_.end()) {
      std::vector<std::string> names;
      for (auto& t : tunables_) names.push_back(t.name);
      throw ConfigError(fmt::format("config names '{}', which this kernel does not have", name), "",
                        fmt::format("its tunables are: {}", fmt::join(names, ", ")));
    }
    // Of the same kind, too: 4.0 equals 4 in JSON, but a block size is an integer.
    auto same = [&](const Json& v) { return v == value && v.is_number_integer() == value.is_number_integer(); };
    if (std::none_of(it->values.begin(), it->values.end(), same)) {
      std::vector<std::string> legal;
      for (auto& v : it->values) legal.push_back(v.dump());
      throw ConfigError(fmt::format("illegal value {} for '{}' ({})", value.dump(), name, it->help),
                        "", fmt::format("legal values: {}", fmt::join(legal, ", ")));
    }
    out.set(name, value);
  }
  // A loop-level choice applies to every operand of the loop the caller did not set itself.
  for (const Tunable& t : tunables_)
    if (!t.follows.empty() && c.has(t.follows) && !c.has(t.name)) out.set(t.name, keys::kFollowLoop);
  return out;
}

void ConfigSpace::add(Tunable t, Json default_value) {
  default_.set(t.name, std::move(default_value));
  tunables_.push_back(std::move(t));
}

void ConfigSpace::set_default_value(const std::string& name, Json value) {
  if (!find(name)) throw ConfigError(fmt::format("the config space has no tunable '{}'", name));
  default_.set(name, std::move(value));
}

void ConfigSpace::suggest(const Config& c) {
  Config full = complete(c);
  if (full != default_ && std::find(suggestions_.begin(), suggestions_.end(), full) == suggestions_.end())
    suggestions_.push_back(std::move(full));
}

void ConfigSpace::remove(const std::string& name) {
  std::erase_if(tunables_, [&](const Tunable& t) { return t.name == name; });
  default_.erase(name);
}

const Tunable* ConfigSpace::find(const std::string& name) const {
  for (const Tunable& t : tunables_)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<OperandTunable> operand_tunables(const ir::Kernel& k) {
  std::vector<OperandTunable> out;
  std::vector<int> loop_of = ir::loop_of_ops(k);
  for (size_t l = 0; l < k.loops.size(); ++l) {
    if (k.loops[l].grid) continue;
    const std::string& axis = k.axes[size_t(k.loops[l].axes.front())].name;
    for (size_t o = 0; o < k.ops.size(); ++o) {
      const ir::Op& op = k.ops[o];
      if (op.kind != ir::OpKind::Dot) continue;
      for (int r = 0; r < 2; ++r) {
        int def = k.value(ir::dot_operand_source(k, op.inputs[size_t(r)])).def_op;
        if (def < 0 || k.ops[size_t(def)].kind != ir::OpKind::Load || loop_of[size_t(def)] != int(l)) continue;
        std::string name = keys::operand(axis, k.tensors[size_t(k.ops[size_t(def)].tensor)].name);
        bool seen = std::any_of(out.begin(), out.end(), [&](const OperandTunable& t) { return t.name == name; });
        if (!seen) out.push_back({name, int(l), int(o), r, def});
      }
    }
  }
  return out;
}

int64_t ConfigSpace::size() const {
  int64_t n = 1;
  for (auto& t : tunables_) {
    if (n > (int64_t(1) << 62) / int64_t(t.values.size())) return int64_t(1) << 62;
    n *= int64_t(t.values.size());
  }
  return n;
}

Config ConfigSpace::random(std::mt19937_64& rng) const {
  Config c;
  for (auto& t : tunables_) c.set(t.name, t.values[rng() % t.values.size()]);
  return c;
}

std::vector<int> ConfigSpace::encode(const Config& c) const {
  std::vector<int> pos;
  Config full = complete(c);
  for (auto& t : tunables_) {
    auto it = std::find(t.values.begin(), t.values.end(), full.values().at(t.name));
    pos.push_back(int(it - t.values.begin()));
  }
  return pos;
}

Config ConfigSpace::decode(const std::vector<int>& pos) const {
  Config c;
  for (size_t i = 0; i < tunables_.size(); ++i) {
    const auto& vals = tunables_[i].values;
    int p = std::clamp(pos.at(i), 0, int(vals.size()) - 1);
    c.set(tunables_[i].name, vals[size_t(p)]);
  }
  return c;
}

std::vector<Config> ConfigSpace::neighbours(const Config& c) const {
  std::vector<Config> out;
  std::vector<int> pos = encode(c);
  for (size_t i = 0; i < tunables_.size(); ++i)
    for (int step : {-1, 1}) {
      int p = pos[i] + step;
      if (p < 0 || p >= int(tunables_[i].values.size())) continue;
      auto q = pos;
      q[i] = p;
      out.push_back(decode(q));
    }
  return out;
}

std::string ConfigSpace::describe() const {
  std::string out;
  for (auto& t : tunables_) {
    std::vector<std::string> v;
    for (auto& x : t.values) v.push_back(x.dump());
    out += fmt::format("  {}: {}  # {}\n", t.name, fmt::join(v, " | "), t.help);
  }
  for (const Config& c : suggestions_) out += fmt::format("  suggested by the target: {}\n", c.dump());
  return out;
}

}  // namespace deuteron::config
