// deuteron aot: the tuned kernels for a list of shapes, written out to be built and run without
// Deuteron (aot.h). This file chooses and emits the variants; aot_writer.cpp writes them.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "aot.h"
#include "autotune/autotune.h"
#include "backends/registry.h"
#include "commands.h"
#include "config/keys.h"
#include "deuteron/error.h"
#include "driver/driver.h"
#include "runtime/text.h"

namespace deuteron::cli {

namespace {

namespace fs = std::filesystem;

struct AotOptions {
  std::string kernels, shapes, dtype = "float32", target = "cpu", out, effort = "quick", name = "deuteron_kernels";
  double time_budget = 0;
  bool no_general = false;  // only the listed shapes: others fail with _NO_VARIANT / LookupError
};

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

std::vector<std::string> split(const std::string& text, const std::string& separators) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t next = text.find_first_of(separators, pos);
    std::string part = text.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    part.erase(0, part.find_first_not_of(" \t\r"));
    part.erase(part.find_last_not_of(" \t\r") + 1);
    if (!part.empty()) out.push_back(part);
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return out;
}

// --shapes: a file, or the list itself. Items are separated by ';' or new lines ('#' starts a
// comment); each is `SHAPE` (for every kernel) or `KERNEL:SHAPE`.
std::map<std::string, std::vector<std::vector<int64_t>>> parse_shapes(const std::string& text,
                                                                      const std::vector<const examples::Entry*>& kernels) {
  std::string list = text;
  std::error_code ec;
  bool from_file = fs::is_regular_file(text, ec);
  if (!from_file && text.find_first_of("/.") != std::string::npos && text.find_first_of(";:\n") == std::string::npos)
    throw ArgumentError(fmt::format("--shapes '{}' is no file and no list of shapes", runtime::escaped(text)), "",
                        "name a file that exists, or list shapes: 'softmax:130x1000;matmul:64x64x64'");
  if (from_file) {
    std::ifstream in(text);
    std::stringstream ss;
    ss << in.rdbuf();
    list.clear();
    for (const std::string& line : split(ss.str(), "\n")) list += line.substr(0, line.find('#')) + "\n";
  }
  std::map<std::string, std::vector<std::vector<int64_t>>> out;
  for (const std::string& item : split(list, ";\n")) {
    size_t colon = item.find(':');
    std::string only = colon == std::string::npos ? "" : item.substr(0, colon);
    std::vector<int64_t> shape = parse_shape(colon == std::string::npos ? item : item.substr(colon + 1));
    bool used = false;
    for (const examples::Entry* e : kernels) {
      if (!only.empty() && only != e->name) continue;
      used = true;
      if (shape.size() != e->shape_names.size()) {
        if (!only.empty() || kernels.size() == 1)
          throw ArgumentError(fmt::format("shape '{}' has {} sizes; kernel '{}' takes {} ({})", item, shape.size(),
                                          e->name, e->shape_names.size(), fmt::join(e->shape_names, ", ")),
                              "", fmt::format("write it as {}:{}", e->name, fmt::join(e->bench_shape, "x")));
        continue;  // a bare shape goes to the kernels of its rank
      }
      auto& list_of = out[e->name];
      if (std::find(list_of.begin(), list_of.end(), shape) == list_of.end()) list_of.push_back(shape);
    }
    if (!used)
      throw ArgumentError(fmt::format("shape '{}' names kernel '{}', which is not among those built", item,
                                      runtime::escaped(only)),
                          "", "name one of the kernels given before --shapes");
  }
  for (const examples::Entry* e : kernels)
    if (out[e->name].empty())
      throw ArgumentError(fmt::format("no shape in --shapes fits kernel '{}' ({} sizes: {})", e->name,
                                      e->shape_names.size(), fmt::join(e->shape_names, ", ")),
                          "", fmt::format("e.g. --shapes '{}:{}'", e->name, fmt::join(e->small_shape, "x")));
  return out;
}

// The output folder exists (made if missing) and takes files; ArgumentError naming why not.
void check_writable(const fs::path& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out))
    throw ArgumentError(fmt::format("cannot make the output folder '{}': {}", runtime::escaped(out.string()),
                                    ec ? ec.message() : "a file of that name is in the way"),
                        "", "pass --out a folder you can write");
  fs::path probe = out / ".deuteron-aot-probe";
  std::ofstream f(probe);
  bool ok = bool(f << "x");
  f.close();
  fs::remove(probe, ec);
  if (!ok)
    throw ArgumentError(fmt::format("cannot write into the output folder '{}'", runtime::escaped(out.string())), "",
                        "pass --out a folder you can write");
}

// Two probe shapes for the general variants: every size larger than any block the tuned
// shapes' spaces offer and not a multiple of one, each parameter moving by its own amount
// between the two, so a size follows at most one parameter.
std::pair<std::vector<int64_t>, std::vector<int64_t>> probe_shapes(const std::vector<std::vector<int64_t>>& shapes) {
  int64_t largest = 256;
  for (const auto& s : shapes)
    for (int64_t v : s) largest = std::max(largest, v);
  int64_t p = 1;
  while (p < largest) p *= 2;
  std::vector<int64_t> a, b;
  for (size_t i = 0; i < shapes.front().size(); ++i) {
    a.push_back(p + 1 + 2 * int64_t(i));
    b.push_back(a.back() + 2 * int64_t(i + 1));
  }
  return {a, b};
}

aot::Size size_of(int64_t at_a, int64_t at_b, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (at_a == at_b) return {-1, at_a};
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] == at_a && b[i] == at_b) return {int(i), 0};
  return {-2, 0};  // follows no single parameter
}

// The whole dims a block product reads (an operand's or its result's): the plan keeps each in
// one block, so a general variant does too, its packed layout sized from the call's sizes.
std::set<int> dot_whole_dims(const ir::Kernel& k) {
  std::set<int> out;
  for (const ir::Op& op : k.ops) {
    if (op.kind != ir::OpKind::Dot) continue;
    for (ir::ValueId v : {op.inputs[0], op.inputs[1], op.result})
      for (int d : k.value(v).dims)
        if (d != ir::kOne && k.axes[size_t(d)].kind == ir::AxisKind::Reduction) out.insert(d);
  }
  return out;
}

// A config that is legal for any size, made from a tuned one: operands stream instead of
// staying resident, and whole-dim reductions loop over blocks (keeping nothing the size of a
// dim in fast memory), except those a block product reads, which stay one block (the largest
// the space offers, above the probe's dim; the general variant's block is the call's dim). The
// space is the probe shape's, so every size in it is below the dims.
// A whole dim whose space offers no block below it (a scan's dim: one block) stays whole: its
// block is left out of the config, so that each shape completes it to its own extent, and a
// general variant reads it at run time (fast memory sized from the call's sizes).
// A target that keeps whole dims (Backend::aot_keeps_whole_dims) instead gets each reduction
// block that covered its dim at the tuned shape (`tuned`) as the probe space's largest, which
// covers the probe's dim too (the call's whole dim), and its tiled blocks raised to what its
// rules allow at the probe shape (Backend::adjust_default), so at any size.
config::Config generalize(const driver::Specialized& probe, config::Config c, const driver::Specialized& tuned) {
  bool keep_whole = probe.backend->aot_keeps_whole_dims();
  std::set<int> dot_whole = dot_whole_dims(probe.ir);
  std::vector<std::string> whole;
  for (const config::Tunable& t : probe.space.tunables()) {
    if (!c.has(t.name) || c.values().at(t.name) != config::keys::kResident) continue;
    bool streams = std::find(t.values.begin(), t.values.end(), config::keys::kStream) != t.values.end();
    c.set(t.name, streams ? config::keys::kStream : config::keys::kInPlace);
  }
  for (size_t a = 0; a < probe.ir.axes.size(); ++a) {
    const ir::Axis& ax = probe.ir.axes[a];
    if (ax.kind == ir::AxisKind::Tile || ax.block_param < 0) continue;
    const std::string& name = probe.ir.block_params[size_t(ax.block_param)].name;
    const config::Tunable* t = probe.space.find(name);
    if (!t) continue;
    int64_t largest = -1;  // the space's largest block: it covers the probe's whole dim
    for (const auto& v : t->values)
      if (v.is_number_integer()) largest = std::max(largest, v.get<int64_t>());
    if (dot_whole.count(int(a))) {
      if (largest >= ax.extent) c.set(name, largest);
      continue;
    }
    // The largest block below the dim and at most the tuned one, else the smallest below the dim.
    int64_t now = c.has(name) ? c.integer(name) : probe.space.default_config().integer(name), pick = -1, least = -1;
    if (keep_whole && a < tuned.ir.axes.size() && now >= tuned.ir.axes[a].extent && largest >= ax.extent) {
      c.set(name, largest);
      continue;
    }
    for (const auto& v : t->values) {
      if (!v.is_number_integer() || v.get<int64_t>() >= ax.extent) continue;
      int64_t b = v.get<int64_t>();
      if (b <= now) pick = std::max(pick, b);
      least = least < 0 ? b : std::min(least, b);
    }
    if (pick > 0 || least > 0) c.set(name, pick > 0 ? pick : least);
    else c.erase(name), whole.push_back(name);
  }
  config::Config g = driver::complete(probe, c);
  if (keep_whole) {  // the tiled blocks only: the reductions' are chosen above
    config::Config raised = probe.backend->adjust_default(probe.space, g, probe.ir);
    for (const ir::BlockParam& bp : probe.ir.block_params)
      if (!bp.reduction && raised.has(bp.name)) g.set(bp.name, raised.values().at(bp.name));
  }
  for (const std::string& name : whole) g.erase(name);
  return g;
}

// The block parameters of the whole dims a block product reads (dot_whole_dims).
std::set<std::string> whole_block_params(const ir::Kernel& k) {
  std::set<std::string> out;
  for (int a : dot_whole_dims(k))
    if (k.axes[size_t(a)].block_param >= 0) out.insert(k.block_params[size_t(k.axes[size_t(a)].block_param)].name);
  return out;
}

// A general variant's fast memory follows the call's whole dims, so its blocks are made to fit
// where it will mostly run: near the tuned shape it comes from (not at the probe shapes, whose
// whole dims are longer than any tuned shape's). While the generalised config, with the tuned
// shape's whole-dim blocks, needs more fast memory there than the target has, its largest tile
// block is halved.
config::Config fit_near(const driver::Specialized& tuned, const config::Config& tuned_config, config::Config g) {
  std::set<std::string> whole = whole_block_params(tuned.ir);
  for (;;) {
    config::Config here = g;
    for (const std::string& name : whole)
      if (tuned_config.has(name)) here.set(name, tuned_config.integer(name));
    try {
      driver::lower(tuned, here);
      return g;
    } catch (const FastMemoryError&) {  // too large at the tuned shape: halve below
    } catch (const ConfigError&) {
      return g;  // illegal there for another reason (a reduction block above its dim): the probes decide
    }
    std::string largest;
    for (const ir::Axis& ax : tuned.ir.axes) {
      if (ax.kind != ir::AxisKind::Tile || ax.block_param < 0) continue;
      const std::string& name = tuned.ir.block_params[size_t(ax.block_param)].name;
      if (g.has(name) && g.integer(name) > 1 && (largest.empty() || g.integer(name) > g.integer(largest))) largest = name;
    }
    if (largest.empty()) return g;
    g.set(largest, g.integer(largest) / 2);
  }
}

// The first line where two sources differ, for the reason a kernel has no general variant.
std::string first_difference(const std::string& a, const std::string& b) {
  std::vector<std::string> la = split(a, "\n"), lb = split(b, "\n");
  for (size_t i = 0; i < std::max(la.size(), lb.size()); ++i) {
    std::string x = i < la.size() ? la[i] : "", y = i < lb.size() ? lb[i] : "";
    if (x != y) return fmt::format("'{}' against '{}'", runtime::escaped(x), runtime::escaped(y));
  }
  return "the scratch it needs";
}

config::Config tuned_config(const examples::Entry& e, const driver::Specialized& s, const std::vector<Arg>& args,
                            const AotOptions& o, std::string* origin) {
  if (std::optional<config::Config> pinned = driver::pinned_config(s)) {
    *origin = "pinned";
    return *pinned;
  }
  if (o.effort != "none" && autotune::can_tune(o.target) && !s.backend->simulated()) {
    autotune::TuneOptions t = tune_options(e, args);
    t.effort = o.effort;
    t.time_budget_s = o.time_budget;
    autotune::TuneResult r = autotune::tune(s, t);
    *origin = r.from_cache ? "cache" : "tuned";
    return r.best;
  }
  // A simulator's timings only inform (and effort none tunes nothing): the cache, else the default.
  if (std::optional<config::Config> c = autotune::cached(s)) {
    *origin = "cache";
    return *c;
  }
  *origin = "default";
  return s.space.default_config();
}

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("{}", fmt::join(s, "x")); }

aot::Kernel plan_kernel(const examples::Entry& e, const std::vector<std::vector<int64_t>>& shapes, DType dt,
                        const AotOptions& o, const backends::Backend& backend) {
  aot::Kernel k;
  k.name = e.name;
  k.ident = runtime::identifier(e.name);
  k.shape_names = e.shape_names;
  auto [pa, pb] = probe_shapes(shapes);
  driver::Specialized sa = driver::specialize(*e.kernel, arg_specs(e, pa, dt), o.target);
  driver::Specialized sb = driver::specialize(*e.kernel, arg_specs(e, pb, dt), o.target);
  std::set<std::string> names;
  for (size_t t = 0; t < sa.ir.tensors.size(); ++t) {
    const ir::HostTensor& x = sa.ir.tensors[t];
    aot::TensorArg arg{runtime::identifier(x.name), x.role == ir::HostRole::Output, x.dtype, {}};
    if (!names.insert(arg.name).second) arg.name += fmt::format("_{}", t);
    for (size_t d = 0; d < x.shape.size(); ++d) {
      aot::Size s = size_of(x.shape[d], sb.ir.tensors[t].shape[d], pa, pb);
      if (s.param == -2)
        throw ArgumentError(fmt::format("kernel '{}': dim {} of {} follows no single shape parameter ({}), so its "
                                        "entry point cannot take the parameters as sizes",
                                        e.name, d, x.name, fmt::join(e.shape_names, ", ")));
      arg.dims.push_back(s);
    }
    k.tensors.push_back(arg);
  }
  for (const ir::ScalarParam& sp : sa.ir.scalars) {
    k.scalars.push_back(runtime::identifier(sp.name));
    k.scalar_integer.push_back(!is_floating(sp.dtype));
  }
  for (size_t a = 0; a < sa.ir.axes.size(); ++a) {
    k.axes.push_back(size_of(sa.ir.axes[a].extent, sb.ir.axes[a].extent, pa, pb));
    if (k.axes.back().param == -2)
      k.no_general = fmt::format("the extent of its axis {} follows no single shape parameter", sa.ir.axes[a].name);
  }

  if (o.no_general) k.no_general = "built with --no-general: only the listed shapes";
  std::vector<driver::Specialized> at_tuned;  // per tuned shape
  for (const std::vector<int64_t>& shape : shapes) {
    std::vector<Arg> args = e.inputs(shape, dt, 1);
    driver::Specialized& s = at_tuned.emplace_back(driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), o.target));
    std::string origin;
    config::Config c = tuned_config(e, s, args, o, &origin);
    std::string entry = fmt::format("{}_{}_{}", o.name, k.ident, shape_text(shape));
    aot::Variant v{shape, c.dump(), fmt::format("{}_{}.{}", k.ident, shape_text(shape), backend.aot_language() == "c++" ? "cpp" : "py"),
                   backend.emit_aot(driver::lower(s, c), entry, false), -1};
    std::cerr << fmt::format("deuteron aot: {} [{}]: {} config {}\n", e.name, fmt::join(shape, ", "), origin, v.config);
    k.tuned.push_back(std::move(v));
  }

  // One general variant per distinct config the tuned ones generalise to; the tuned shape
  // nearest an unbuilt one (aot_writer.cpp: log-size distance) picks which.
  if (!k.no_general.empty()) return k;
  std::string ext = backend.aot_language() == "c++" ? "cpp" : "py";
  // At the probes the fast memory is not checked: fit_near checked it where the variant runs.
  driver::Specialized ua = sa, ub = sb;
  ua.limits.fast_memory_bytes = ub.limits.fast_memory_bytes = int64_t(1) << 50;
  for (aot::Variant& t : k.tuned) {
    try {
      const driver::Specialized& near = at_tuned[size_t(&t - k.tuned.data())];
      config::Config tuned = config::Config::parse(t.config);
      config::Config g = fit_near(near, tuned, generalize(sa, tuned, near));
      for (size_t i = 0; i < k.general.size(); ++i)
        if (k.general[i].config == g.dump()) t.general = int(i);
      if (t.general >= 0) continue;
      std::string entry = fmt::format("{}_{}_general{}", o.name, k.ident, k.general.size());
      backends::AotVariant at_a = backend.emit_aot(driver::lower(ua, driver::complete(ua, g)), entry, true);
      backends::AotVariant at_b = backend.emit_aot(driver::lower(ub, driver::complete(ub, g)), entry, true);
      // Whatever still follows the shape shows as a difference between the two: then this
      // config has no general variant.
      if (at_a.source != at_b.source || at_a.scratch_per_thread != at_b.scratch_per_thread || at_a.threads != at_b.threads)
        throw ConfigError(fmt::format("its code still depends on the shape: {}", first_difference(at_a.source, at_b.source)));
      t.general = int(k.general.size());
      k.general.push_back({t.shape, g.dump(), fmt::format("{}_general{}.{}", k.ident, k.general.size(), ext), at_a, -1});
      std::cerr << fmt::format("deuteron aot: {}: general variant {} (from [{}]): {}\n", e.name, t.general,
                               fmt::join(t.shape, ", "), g.dump());
    } catch (const ConfigError& err) {
      std::cerr << fmt::format("deuteron aot: {}: no general variant from [{}]: {}\n", e.name, fmt::join(t.shape, ", "),
                               err.message());
      if (k.no_general.empty()) k.no_general = err.message();
    }
  }
  if (!k.general.empty()) {
    k.no_general.clear();
    for (aot::Variant& t : k.tuned)  // a tuned shape whose config did not generalise borrows one that did
      if (t.general < 0) t.general = 0;
  }
  return k;
}

int cmd_aot(const AotOptions& o, const std::string& command) {
  if (!is_identifier(o.name))
    throw ArgumentError(fmt::format("--name '{}' is not a C identifier", runtime::escaped(o.name)), "",
                        "the library and its functions are named after it: use letters, digits and _");
  const backends::Backend& backend = backends::get(o.target);
  if (backend.aot_language().empty())
    throw ArgumentError(fmt::format("the {} target writes no ahead-of-time builds", o.target));
  std::vector<const examples::Entry*> entries;
  for (const std::string& name : split(o.kernels, ",")) {
    const examples::Entry* e = &examples::find(name);
    if (std::find(entries.begin(), entries.end(), e) != entries.end())
      throw ArgumentError(fmt::format("kernel '{}' is given twice", name));
    entries.push_back(e);
  }
  if (entries.empty()) throw ArgumentError("no kernel given", "", "e.g. deuteron aot softmax,matmul --shapes ...");
  auto shapes = parse_shapes(o.shapes, entries);
  DType dt = parse_dtype(o.dtype);
  for (const examples::Entry* e : entries) pick_dtype(*e, o.dtype);
  fs::path out(o.out);
  check_writable(out);

  aot::Build b{o.name, o.target, backend.aot_language(), dt, command, backend.aot_support_files(), {}};
  for (const examples::Entry* e : entries) b.kernels.push_back(plan_kernel(*e, shapes[e->name], dt, o, backend));
  aot::write(b, out);
  for (const aot::Kernel& k : b.kernels)
    fmt::print("{}: {} tuned variant{}, {}\n", k.name, k.tuned.size(), k.tuned.size() == 1 ? "" : "s",
               k.general.empty() ? "no general variant (" + k.no_general + ")"
                                 : fmt::format("{} general variant{} for other shapes", k.general.size(),
                                               k.general.size() == 1 ? "" : "s"));
  fmt::print("written to {}\n", out.string());
  return 0;
}

}  // namespace

void add_aot_commands(CLI::App& app) {
  static AotOptions o;
  static std::vector<std::string> words;
  CLI::App* c = app.add_subcommand(
      "aot", "ahead-of-time build: tuned kernels for a list of shapes, with entry points that dispatch by shape, "
             "to build and run without Deuteron");
  c->add_option("kernels", o.kernels, "kernel names, comma-separated (see `deuteron list`)")->required();
  c->add_option("--shapes", o.shapes,
                "a file or a list of shapes separated by ';' or lines, each SHAPE or KERNEL:SHAPE (e.g. "
                "'softmax:130x1000;matmul:64x64x64')")
      ->required();
  c->add_option("--dtype", o.dtype, "float32 (default), bfloat16, ...");
  c->add_option("--target", o.target, "cpu (default: C++, a header and a CMakeLists.txt), pallas or triton (Python modules)");
  c->add_option("--out", o.out, "the folder to write")->required();
  c->add_option("--name", o.name, "the library's name and its functions' prefix (default deuteron_kernels)");
  c->add_option("--effort", o.effort, "tuning effort per shape: quick (default), full, or none (the cache, else the default)")
      ->check(CLI::IsMember({"none", "quick", "full"}));
  c->add_option("--time-budget", o.time_budget, "seconds of tuning per shape at most (default: from --effort)")
      ->check(finite_range(0.1, 86400));
  c->add_flag("--no-general", o.no_general,
              "build the listed shapes only, no general variant: a call at another shape fails with _NO_VARIANT "
              "(LookupError in Python) naming this command");
  c->callback([] {
    std::string command = fmt::format("deuteron aot {} --shapes {} --dtype {} --target {} --effort {} --name {}{}",
                                      o.kernels, o.shapes, o.dtype, o.target, o.effort, o.name,
                                      o.no_general ? " --no-general" : "");
    std::exit(cmd_aot(o, runtime::escaped(command)));
  });
}

}  // namespace deuteron::cli
