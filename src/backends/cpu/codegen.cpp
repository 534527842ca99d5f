#include "backends/cpu/codegen.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/cpu/packing.h"
#include "deuteron/error.h"
#include "runtime/env.h"
#include "runtime/text.h"

namespace deuteron::cpu {

namespace {

using ir::OpKind;

// The panels of a shared packed copy that one claim of dt::SharedPack packs.
constexpr const char* kSharedPanels = ", dt::gemm::kPackGroup * group, dt::gemm::kPackGroup * (group + 1)";

const char* ctype(DType t) {
  switch (t) {
    case DType::i32: return "int32_t";
    case DType::i64: return "int64_t";
    case DType::boolean: return "bool";
    default: return "float";  // f32, and bf16/f16 values computed in f32
  }
}

std::string literal(const ir::Constant& c, DType t) {
  if (t == DType::boolean) return c.integer != 0 ? "true" : "false";
  // INT64_MIN has no literal: -9223372036854775808 is the negation of an out-of-range one.
  if (t == DType::i64 && c.integer == INT64_MIN) return "INT64_MIN";
  if (!is_floating(t)) return fmt::format("{}({})", ctype(t), c.integer);
  double x = c.real;
  if (std::isnan(x)) return "dt::nan()";
  if (std::isinf(x)) return x > 0 ? "dt::kInf" : "-dt::kInf";
  std::string s = fmt::format("{:.9g}", x);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s + "f";
}

// Users' names in comments: escaped, so that none can end the line and start code.
std::string shown(const std::string& name) { return runtime::escaped(name); }

// Index arithmetic as a person writes it: no `0 +`, no `+ 0`, no `* 1`.
std::string plus(const std::string& a, const std::string& b) {
  if (a == "0") return b;
  if (b == "0") return a;
  return a + " + " + b;
}
std::string times(const std::string& a, int64_t factor) {
  if (a == "0" || factor == 0) return "0";
  if (factor == 1) return a;
  bool bare = a.find(' ') == std::string::npos;
  return bare ? fmt::format("{} * {}", a, factor) : fmt::format("({}) * {}", a, factor);
}
// The same with a factor that may be a name (a stride read at run time).
std::string times(const std::string& a, const std::string& factor) {
  if (factor.find_first_not_of("0123456789-") == std::string::npos) return times(a, std::stoll(factor));
  if (a == "0") return "0";
  bool bare = a.find(' ') == std::string::npos;
  return bare ? fmt::format("{} * {}", a, factor) : fmt::format("({}) * {}", a, factor);
}
// `base` advanced by `index` elements.
std::string at_index(const std::string& base, const std::string& index) {
  return index == "0" ? base : base + " + " + index;
}

// The tensors whose hl::atomic_adds each thread sums into its own copy (ordered adds): the
// float targets. Integer adds are exact in any order, and stay atomic.
std::vector<int> ordered_targets(const ir::Kernel& k) {
  std::vector<int> out;
  if (!k.ordered_adds) return out;
  for (const ir::Op& op : k.ops)
    if (op.atomic_add && is_floating(k.tensors[size_t(op.tensor)].dtype) &&
        std::find(out.begin(), out.end(), op.tensor) == out.end())
      out.push_back(op.tensor);
  std::sort(out.begin(), out.end());
  return out;
}

class Generator {
 public:
  Generator(const CpuPlan& p, const GenerateOptions& o)
      : p_(p), k_(p.kernel), checks_(index_checks(p)), ordered_(ordered_targets(p.kernel)),
        rt_(o.runtime_sizes), trace_(o.trace), entry_(o.entry.empty() ? entry_name(p) : o.entry) {
    if (rt_) check_runtime_sizes();
    fuse_scan_stores();
  }

  std::string run() {
    header();
    if (trace_) {
      line("// Tracing (deuteron run --timeline): per grid step, its thread, start and end time.");
      line(fmt::format("extern \"C\" {{ double* {}_trace = nullptr; }}", entry_));
      line("struct deuteron_step_trace {");
      line("  double* row;  // thread, start, end");
      line("  ~deuteron_step_trace() { if (row) row[2] = omp_get_wtime(); }  // every way out of the step");
      line("};");
    }
    line(fmt::format("extern \"C\" void {}(void* const* tensors, const dt::Scalar* scalars, char* scratch,", entry_));
    line(rt_ ? "                                long scratch_per_thread, int64_t* status, const int64_t* sizes) {"
             : "                                long scratch_per_thread, int64_t* status) {");
    ++indent_;
    params();
    axis_constants();
    if (rt_) runtime_sizes();
    fill_outputs();
    const ir::Loop& grid = k_.grid_loop();
    if (!ordered_.empty()) line("int team = 1;  // the threads the region got: their copies are summed after it");
    // Chunks of consecutive grid steps (which share resident operand blocks and stream through
    // memory in order) handed out as threads free up, about 8 per thread and smaller at the end
    // (dt::GridQueue), so a thread slowed or descheduled by another process on its core (a
    // shared VM) does not hold the whole kernel back: the others take its remaining chunks.
    // Ordered adds need each thread's grid steps fixed (the same sum on every run): the static
    // schedule.
    if (dynamic_schedule()) {
      const std::string run = shared_run();
      const bool runs = run != "1";
      line(fmt::format("dt::GridQueue grid_steps({}, {}{});  // about 8 chunks a thread{}, smaller at the end",
                       rt_ ? "grid" : std::to_string(p_.grid_size()), p_.threads, runs ? ", " + run : "",
                       runs ? fmt::format(" (whole runs of {} steps that share a packed block while many are left)", run)
                            : ""));
    }
    // Threads of a kernel with matrix products take CPUs of their own (dt::OwnCpu): its steps are
    // long and bound by each core's FMA rate, and with one core busy a thread on it adds half a
    // core (matmul 2048^3: 141-147 -> 115-131 ms). Row kernels are not moved: bound by memory,
    // two threads on one core lose less, and a moved thread that shares its CPU holds up the
    // region's end for the other process's time slice (add 4096^2: 5.5-7.1 -> 8.0-9.0 ms).
    const bool own_cpus = p_.threads > 1 && !p_.gemms.empty();
    if (own_cpus) line("const uint32_t team_region = dt::next_team_region();");
    // Threads out of grid steps wait for the rest at dt::TeamEnd: a short spin (teams that end
    // within it pass the barrier without sleeping in it), then, where OwnCpu moved threads,
    // asleep, so that a thread parked on a busy CPU can be moved onto theirs.
    if (dynamic_schedule())
      line("dt::TeamEnd team_end;  // where threads out of grid steps wait for the rest");
    for (const plan::BlockSpec& s : p_.operands)
      if (p_.staging_of(s).shared)
        line(
            fmt::format("dt::SharedPack shared{}(dt::gemm::pack_groups_of({}));  // {}'s column panels, "
                        "packed by the team",
                        s.op, shared_columns(s), shown(k_.tensors[size_t(s.tensor)].name)));
    line(fmt::format("#pragma omp parallel num_threads({})", p_.threads));
    line("{");
    ++indent_;
    // A thread that starts on a teammate's CPU moves, for the region, to one of its own.
    if (own_cpus) line("dt::OwnCpu own_cpu(team_region, omp_get_thread_num(), omp_get_num_threads());");
    line("char* const fast = scratch + long(omp_get_thread_num()) * scratch_per_thread;");
    scratch_arrays();
    ordered_copies();
    if (!p_.hoisted.empty()) {
      line("// once per thread, before its grid steps: these depend on no grid index");
      for (const plan::Item& it : p_.bodies[size_t(&grid - k_.loops.data())])
        if (!it.is_loop && hoisted(it.group)) emit_group(it.group);
    }
    shared_packs(own_cpus);
    if (dynamic_schedule()) {
      line(own_cpus ? "for (int64_t first = 0, last = 0; own_cpu.settle(), grid_steps.claim(&first, &last);)"
                : "for (int64_t first = 0, last = 0; grid_steps.claim(&first, &last);)");
      line("for (int64_t pid = first; pid < last; ++pid) {");
    } else {
      if (own_cpus) line("own_cpu.settle();");
      line("#pragma omp for schedule(static)");
      line(fmt::format("for (int64_t pid = 0; pid < {}; ++pid) {{", rt_ ? "grid" : std::to_string(p_.grid_size())));
    }
    ++indent_;
    if (trace_) {
      line(fmt::format("deuteron_step_trace step_trace{{{0}_trace ? {0}_trace + 3 * pid : nullptr}};", entry_));
      line("if (step_trace.row) step_trace.row[0] = omp_get_thread_num(), step_trace.row[1] = omp_get_wtime();");
    }
    grid_indices(grid);
    for (const plan::BlockSpec& s : p_.operands)
      if (s.loop == int(&grid - k_.loops.data()) && s.placement == plan::Placement::Staged) emit_block_copy(s, grid, false);
    body(int(&grid - k_.loops.data()));
    --indent_;
    line("}");
    if (!p_.streamed.empty()) line("dt::stream_fence();  // this thread's streaming stores, before the region ends");
    if (own_cpus) {
      // The schedule's own barrier (omp for) or one here: a moved thread goes back only when no
      // teammate still works. Waiting at dt::TeamEnd, a thread lets its moved teammates run on
      // any CPU again once its spin is over.
      if (dynamic_schedule()) {
        line("team_end.arrive_and_wait(own_cpu);");
        line("#pragma omp barrier");
      }
      line("own_cpu.release();");
    } else if (dynamic_schedule()) {
      line("team_end.arrive_and_spin(omp_get_num_threads());");
    }
    --indent_;
    line("}");
    ordered_sums();
    --indent_;
    line("}");
    if (rt_) scratch_function();
    return out_;
  }

  // The copies the team shares (Staging::shared), packed before any thread's grid steps.
  void shared_packs(bool own_cpus) {
    bool any = false;
    for (const plan::BlockSpec& s : p_.operands) {
      if (!p_.staging_of(s).shared) continue;
      if (!any && own_cpus) line("own_cpu.settle();  // on a CPU of its own before it packs");
      any = true;
      emit_packed_copy(s, k_.loops[size_t(s.loop)], true);
    }
    for (const plan::BlockSpec& s : p_.operands)
      if (p_.staging_of(s).shared) line(fmt::format("shared{}.wait();", s.op));
  }

  // A general variant's fast memory per thread at this call's sizes (a sum of whole cache lines).
  std::string fast_bytes() const {
    Bytes end;
    layout(&end);
    return end.text();
  }

  // `<entry>_scratch_per_thread(sizes)`: the scratch_per_thread a general variant takes at
  // those sizes: its fast memory, then its copies of the ordered atomic-add targets.
  void scratch_function() {
    std::string total = fast_bytes();
    for (int t : ordered_) total += fmt::format(" + ({} * 4 + 63) / 64 * 64", elements(t));
    line("");
    line("// The scratch each thread needs at a call's sizes (the caller's scratch_per_thread).");
    line(fmt::format("extern \"C\" long {}_scratch_per_thread(const int64_t* sizes) {{", entry_));
    ++indent_;
    std::set<std::string> words;
    for (size_t i = 0; i < total.size();) {
      size_t j = total.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_", i);
      if (j == i) ++j;
      words.insert(total.substr(i, (j == std::string::npos ? total.size() : j) - i));
      i = j == std::string::npos ? total.size() : j;
    }
    size_t at = 0, read = 0;
    auto read_size = [&](const std::string& name) {
      if (words.count(name)) line(fmt::format("const int64_t {} = sizes[{}];", name, at)), ++read;
      ++at;
    };
    for (size_t a = 0; a < k_.axes.size(); ++a) read_size(extent(int(a)));
    for (size_t t = 0; t < k_.tensors.size(); ++t)
      for (size_t d = 0; d < k_.tensors[t].shape.size(); ++d) read_size(dim(int(t), d));
    if (read == 0) line("(void)sizes;  // the same at every size");
    line(fmt::format("return long({});", total));
    --indent_;
    line("}");
  }

 private:
  // ---- output helpers ----
  void line(const std::string& s) {
    if (s.rfind("#pragma", 0) == 0) {
      out_ += s + "\n";
      return;
    }
    out_ += std::string(size_t(indent_) * 2, ' ') + s + "\n";
  }

  void header() {
    line(fmt::format("// Kernel '{}', generated by Deuteron for the cpu target{}.", shown(k_.name),
                     rt_ ? ": a general variant, for any sizes (read from `sizes` at each call)" : ""));
    std::string config = config_text();
    line(fmt::format("// config: {}{}", config, config != p_.config.dump() ? " (whole dims in one block, at each call's extent)" : ""));
    for (const auto& t : k_.tensors)
      if (rt_)
        line(fmt::format("// {} {}: {}, rank {}, contiguous", t.role == ir::HostRole::Input ? "input " : "output",
                         shown(t.name), dtype_name(t.dtype), t.shape.size()));
      else
        line(fmt::format("// {} {}: {}[{}]", t.role == ir::HostRole::Input ? "input " : "output", shown(t.name),
                         dtype_name(t.dtype), fmt::join(t.shape, ", ")));
    if (rt_) line(fmt::format("// fast memory: {} bytes per thread", fast_bytes()));
    else {
      Bytes end;
      layout(&end);
      if (end.fixed > p_.fast_memory_bytes)  // the caller allocates the plan's figure
        throw std::logic_error(fmt::format("codegen: {} bytes of fast memory laid out, {} planned", end.fixed,
                                           p_.fast_memory_bytes));
      line(fmt::format("// fast memory: {} bytes per thread", p_.fast_memory_bytes));
    }
    line("#include \"deuteron_cpu.h\"");
    if (!p_.gemms.empty()) {
      line("#include \"deuteron_gemm.h\"  // hl::dot: micro-kernel and packing");
      // Packed copies are sized for the planner's panel width, which follows the machine's vector
      // width: code built for a wider one (other flags, another machine) must not run over them.
      line(fmt::format("static_assert({0} % dt::gemm::NR == 0, \"B panels were planned {0} columns wide: build "
                       "this kernel for the vector width it was generated for\");",
                       dot_panel_columns()));
    }
    line("");
    line("#include <omp.h>");
    line("");
  }

  void params() {
    for (size_t i = 0; i < k_.tensors.size(); ++i) {
      const auto& t = k_.tensors[i];
      bool in = t.role == ir::HostRole::Input && !stored_.count(int(i));
      line(fmt::format("{}{}* __restrict {} = static_cast<{}{}*>(tensors[{}]);", in ? "const " : "",
                       storage_ctype(t.dtype), tensor_name(int(i)), in ? "const " : "",
                       storage_ctype(t.dtype), i));
    }
    for (size_t i = 0; i < k_.scalars.size(); ++i)
      line(fmt::format("const {} {} = {}(scalars[{}].{});", ctype(k_.scalars[i].dtype), scalar_name(int(i)),
                       ctype(k_.scalars[i].dtype), i, is_floating(k_.scalars[i].dtype) ? "real" : "integer"));
  }

  // Outputs made by hl::zeros / hl::full in host code, set on every launch.
  void fill_outputs() {
    for (size_t i = 0; i < k_.tensors.size(); ++i) {
      const ir::HostTensor& t = k_.tensors[i];
      if (!t.fill) continue;
      std::vector<std::string> dims;
      for (size_t d = 0; d < t.shape.size(); ++d) dims.push_back(dim(int(i), d));
      std::string n = rt_ ? fmt::format("{}", fmt::join(dims, " * ")) : std::to_string(t.numel());
      DType compute = compute_dtype(t.dtype);
      line(fmt::format("// {} = {}: set before the grid runs", tensor_name(int(i)), t.fill->real == 0 ? "zeros" : "full"));
      line("#pragma omp simd");
      line(fmt::format("for (int64_t i = 0; i < {}; ++i) {}[i] = {};", n, tensor_name(int(i)),
                       stored(literal(*t.fill, compute), compute, t.dtype)));
    }
  }

  // ---- ordered adds ----
  // Where thread t's copy of an ordered target lives: after its fast memory, in its scratch (a
  // general variant computes it from this call's sizes: copy_offsets()).
  std::string copy_offset(int tensor) const {
    if (rt_) return "at_" + copy_name(tensor);
    int64_t off = (p_.fast_memory_bytes + 63) / 64 * 64;
    for (int t : ordered_)
      if (t != tensor) off += (k_.tensors[size_t(t)].numel() * 4 + 63) / 64 * 64;
      else break;
    return std::to_string(off);
  }
  // The elements of a tensor: a number, or in a general variant the product of its dims.
  std::string elements(int tensor) const {
    if (!rt_) return std::to_string(k_.tensors[size_t(tensor)].numel());
    std::vector<std::string> dims;
    for (size_t d = 0; d < k_.tensors[size_t(tensor)].shape.size(); ++d) dims.push_back(dim(tensor, d));
    return dims.empty() ? "1" : fmt::format("{}", fmt::join(dims, " * "));
  }
  // A general variant's copy offsets, after its fast memory (fast_bytes), as scratch_per_thread()
  // lays them out; <entry>_scratch_per_thread counts them.
  void copy_offsets() {
    if (ordered_.empty()) return;
    line("// where this thread's copies of the ordered atomic-add targets start in its scratch");
    std::string at = "fast_bytes";
    for (int t : ordered_) {
      line(fmt::format("const int64_t {} = {};", copy_offset(t), at));
      at = fmt::format("{} + ({} * 4 + 63) / 64 * 64", copy_offset(t), elements(t));
    }
  }
  std::string copy_name(int tensor) const { return "mine_" + tensor_name(tensor); }
  bool ordered(int tensor) const { return std::find(ordered_.begin(), ordered_.end(), tensor) != ordered_.end(); }

  // Each thread adds into its own zeroed copy of an ordered target...
  void ordered_copies() {
    if (!ordered_.empty()) line("if (omp_get_thread_num() == 0) team = omp_get_num_threads();");
    for (int t : ordered_) {
      line(fmt::format("float* const {} = reinterpret_cast<float*>(fast + {});  // this thread's adds into {}, "
                       "summed in thread order after the grid",
                       copy_name(t), copy_offset(t), tensor_name(t)));
      line("#pragma omp simd");
      line(fmt::format("for (int64_t i = 0; i < {}; ++i) {}[i] = 0.0f;", elements(t), copy_name(t)));
    }
  }
  // ... and after the parallel region the copies are added in thread order: with the static
  // schedule, the same sum on every run. Serially, after the region's own join: another
  // barrier inside it costs a scheduling quantum whenever a thread is descheduled (a busy
  // machine), which measured more than the sums (a few thousand adds).
  void ordered_sums() {
    for (int t : ordered_) {
      line(fmt::format("// {} += every thread's copy, in thread order", tensor_name(t)));
      line(fmt::format("for (int64_t i = 0; i < {}; ++i) {{", elements(t)));
      ++indent_;
      line(fmt::format("float sum = {}[i];", tensor_name(t)));
      line("for (int th = 0; th < team; ++th)");
      line(fmt::format("  sum += reinterpret_cast<const float*>(scratch + long(th) * scratch_per_thread + {})[i];",
                       copy_offset(t)));
      line(fmt::format("{}[i] = sum;", tensor_name(t)));
      --indent_;
      line("}");
    }
  }

  // Expression `v` (of dtype `from`) converted for storing into a tensor of dtype `to`.
  std::string stored(const std::string& v, DType from, DType to) const {
    if (to == DType::bf16) return fmt::format("dt::f32_to_bf16(float({}))", v);
    if (to == DType::f16) return fmt::format("dt::f32_to_f16(float({}))", v);
    return convert(v, from, to);
  }

  // A whole dim in one block in a general variant (a scan's): its block is its extent at each
  // call, read at run time like the extent (runtime_sizes).
  bool runtime_block(size_t a) const {
    return rt_ && k_.axes[a].kind != ir::AxisKind::Tile && p_.persistent[a];
  }

  // The config for the header: a general variant's runtime blocks are not numbers of it (each
  // call's extent), so they are left out.
  std::string config_text() const {
    config::Config c = p_.config;
    for (size_t a = 0; a < k_.axes.size(); ++a)
      if (runtime_block(a) && k_.axes[a].block_param >= 0) c.erase(k_.block_params[size_t(k_.axes[a].block_param)].name);
    return c.dump();
  }

  void axis_constants() {
    for (size_t a = 0; a < k_.axes.size(); ++a) {
      const ir::Axis& ax = k_.axes[a];
      if (runtime_block(a)) continue;  // runtime_sizes() reads it
      line(fmt::format("constexpr int64_t B_{} = {};  // block of {} ({})", ax.name, p_.block[a],
                       ax.kind == ir::AxisKind::Tile ? "tiled dim" : "whole dim",
                       rt_ ? "any size" : fmt::format("{} elements", ax.extent)));
      if (rt_) continue;  // runtime_sizes() reads them
      if (ax.kind != ir::AxisKind::Tile) {
        line(fmt::format("constexpr int64_t o_{} = 0;", ax.name));
        line(fmt::format("constexpr int64_t n_{} = {};", ax.name, ax.extent));
      }
    }
  }

  // ---- general variants (GenerateOptions::runtime_sizes) ----
  // What a general variant cannot express: anything whose size in fast memory, or whose
  // bounds, follow the shape. (A size kept in fast memory also shows as a difference between
  // the sources at two shapes, which the ahead-of-time build checks.)
  void check_runtime_sizes() const {
    auto refuse = [&](const std::string& what) {
      throw ConfigError(fmt::format("kernel '{}': a general variant (any sizes) cannot {}", k_.name, what), "",
                        "choose a config that streams or reads in place and loops over reductions");
    };
    for (const plan::BlockSpec& s : p_.operands)
      if (s.placement == plan::Placement::Resident)
        refuse(fmt::format("keep {} resident: its copy spans a whole dim", k_.tensors[size_t(s.tensor)].name));
    for (const ir::HostTensor& t : k_.tensors)
      for (size_t d = t.shape.size(); d-- > 0;) {
        int64_t want = d + 1 == t.shape.size() ? 1 : t.strides[d + 1] * t.shape[d + 1];
        if (t.strides[d] != want) refuse(fmt::format("take {} with strides: it reads contiguous tensors", t.name));
      }
    const ir::Loop& grid = k_.grid_loop();
    for (size_t i = 0; i < grid.axes.size(); ++i)
      if (grid.begin[i].constant != 0 || grid.end[i].constant != k_.axes[size_t(grid.axes[i])].extent)
        refuse("run a grid over part of a dim");
  }

  // A size that follows the shape: its number, or in a general variant the name it was read
  // into from `sizes`.
  std::string extent(int a) const {
    return rt_ ? "E_" + axis(a) : std::to_string(k_.axes[size_t(a)].extent);
  }
  std::string dim(int t, size_t d) const {
    return rt_ ? fmt::format("{}_dim{}", tensor_name(t), d) : std::to_string(k_.tensors[size_t(t)].shape[d]);
  }
  std::string stride(int t, size_t d) const {
    const ir::HostTensor& x = k_.tensors[size_t(t)];
    if (!rt_ || d + 1 == x.shape.size()) return std::to_string(x.strides[d]);  // contiguous: the last is 1
    return fmt::format("{}_stride{}", tensor_name(t), d);
  }
  std::string grid_blocks(size_t i) const {
    return rt_ ? "G_" + axis(p_.grid_axes[i]) : std::to_string(p_.grid_blocks[i]);
  }

  // A general variant's sizes: `sizes` holds every axis' extent, then each tensor's dims, then
  // its strides. Names no line uses are dropped afterwards (drop_unused_constants).
  void runtime_sizes() {
    line("// this call's sizes: the extent of every axis, then each tensor's dims and strides");
    size_t at = 0;
    for (size_t a = 0; a < k_.axes.size(); ++a) {
      const ir::Axis& ax = k_.axes[a];
      line(fmt::format("const int64_t E_{} = sizes[{}];", ax.name, at++));
      if (ax.kind != ir::AxisKind::Tile) {
        line(fmt::format("constexpr int64_t o_{} = 0;", ax.name));
        line(fmt::format("const int64_t n_{0} = E_{0};", ax.name));
      }
      if (runtime_block(a)) line(fmt::format("const int64_t B_{0} = E_{0};  // block of {0} (the whole dim)", ax.name));
    }
    for (size_t t = 0; t < k_.tensors.size(); ++t)
      for (size_t d = 0; d < k_.tensors[t].shape.size(); ++d)
        line(fmt::format("const int64_t {} = sizes[{}];", dim(int(t), d), at++));
    for (size_t t = 0; t < k_.tensors.size(); ++t)
      for (size_t d = 0; d < k_.tensors[t].shape.size(); ++d, ++at)
        if (d + 1 < k_.tensors[t].shape.size()) line(fmt::format("const int64_t {} = sizes[{}];", stride(int(t), d), at));
    std::vector<std::string> blocks;
    for (size_t i = 0; i < p_.grid_axes.size(); ++i) {
      const std::string& n = axis(p_.grid_axes[i]);
      line(fmt::format("const int64_t G_{0} = (E_{0} + B_{0} - 1) / B_{0};  // blocks along {0}", n));
      blocks.push_back("G_" + n);
    }
    line(fmt::format("const int64_t grid = {};", blocks.empty() ? "1" : fmt::format("{}", fmt::join(blocks, " * "))));
    if (!ordered_.empty()) line(fmt::format("const int64_t fast_bytes = {};  // this thread's fast memory", fast_bytes()));
    copy_offsets();
  }

  // Consecutive grid steps that keep every reused operand block (the product of the grid's
  // blocks along the axes faster than the fastest one a block is keyed by), so the schedule can
  // hand each block's steps to one thread: "1" where none is kept, or grouped order reorders them.
  std::string shared_run() const {
    const int na = int(p_.grid_axes.size());
    int fastest_key = -1;
    for (const plan::BlockSpec& s : p_.operands) {
      if (!s.reuse || s.placement == plan::Placement::InPlace) continue;
      for (int a : s.reuse_axes)
        fastest_key = std::max(fastest_key, int(std::find(p_.grid_axes.begin(), p_.grid_axes.end(), a) - p_.grid_axes.begin()));
    }
    const bool grouped = p_.grid_group > 1 && na >= 2 && p_.grid_blocks[size_t(na - 2)] > 1;
    if (fastest_key < 0 || (grouped && fastest_key + 2 >= na)) return "1";
    std::string run;
    int64_t known = 1;
    for (int i = fastest_key + 1; i < na; ++i) {
      if (rt_) run = run.empty() ? grid_blocks(size_t(i)) : fmt::format("{} * {}", run, grid_blocks(size_t(i)));
      else known *= p_.grid_blocks[size_t(i)];
    }
    return rt_ ? (run.empty() ? "1" : run) : std::to_string(known);
  }

  // Whether the grid loop hands out chunks dynamically (see run()). $DEUTERON_CPU_SCHEDULE=static
  // keeps every kernel on the static schedule, to measure what the dynamic one costs or gains.
  bool dynamic_schedule() const {
    static const bool dynamic = runtime::env_choice("DEUTERON_CPU_SCHEDULE", {"dynamic", "static"}) != "static";
    return p_.threads > 1 && ordered_.empty() && dynamic;
  }

  // ---- fast memory ----
  // A count of elements or bytes: a number times the whole dims a general variant sizes at run
  // time (E_<axis>), and a sum of such terms, each rounded to whole cache lines.
  struct Count {
    int64_t n = 1;
    std::vector<std::string> dims;
    std::string text() const {
      std::vector<std::string> f = dims;
      if (n != 1 || f.empty()) f.push_back(std::to_string(n));
      return fmt::format("{}", fmt::join(f, " * "));
    }
  };
  // Bytes of a value's element in fast memory (bf16, f16 and i32 are computed as 32-bit).
  static int64_t element_bytes(DType t) { return t == DType::i64 ? 8 : t == DType::boolean ? 1 : 4; }
  static Count product(Count a, const Count& b) {
    a.n *= b.n;
    a.dims.insert(a.dims.end(), b.dims.begin(), b.dims.end());
    return a;
  }
  // Rounded up to a multiple of `to` (a packed panel's rows or columns).
  static Count rounded_up(const Count& c, int64_t to) {
    if (c.dims.empty()) return {(c.n + to - 1) / to * to, {}};
    return {1, {fmt::format("(({} + {}) / {} * {})", c.text(), to - 1, to, to)}};
  }
  struct Bytes {
    int64_t fixed = 0;
    std::vector<std::string> terms;
    void add_lines(const Count& c) {
      if (c.dims.empty()) fixed += (c.n + 63) / 64 * 64;
      else terms.push_back(fmt::format("({} + 63) / 64 * 64", c.text()));
    }
    std::string text() const {
      std::vector<std::string> t = terms;
      if (fixed || t.empty()) t.push_back(std::to_string(fixed));
      return fmt::format("{}", fmt::join(t, " + "));
    }
  };
  // A whole dim whose extent a general variant reads at run time, so its arrays are sized then.
  bool runtime_whole(int a) const { return rt_ && k_.axes[size_t(a)].kind == ir::AxisKind::Reduction; }
  Count storage_count(ir::ValueId v, int a) const {
    Count c;
    if (runtime_whole(a) && !resident_axis(v, a)) c.dims.push_back("E_" + axis(a));
    else c.n = storage_extent(v, a);
    return c;
  }
  Count value_count(ir::ValueId v) const {
    Count c;
    for (int d : k_.value(v).dims)
      if (d != ir::kOne) c = product(c, storage_count(v, d));
    return c;
  }
  // Bytes of a staged operand's copy: its block, as many times as it has buffers; in the
  // micro-kernel's packed layout for a dot's operand. A general variant sizes a whole dim's
  // block from the call's sizes.
  Count staged_bytes(const plan::BlockSpec& s) const {
    const Staging& st = p_.staging_of(s);
    ir::ValueId v = k_.ops[size_t(s.op)].result;
    Count c;
    if (st.dot >= 0) {
      ir::ValueId operand = k_.ops[size_t(st.dot)].inputs[size_t(st.dot_operand)];
      const auto& od = k_.value(operand).dims;
      c = product(slab2d(operand, st.dot_operand), {4, {}});
      for (size_t i = 0; i + 2 < od.size(); ++i) c = product(c, extent_count(od[i]));
    } else {
      c = product(value_count(v), {element_bytes(k_.value(v).dtype), {}});
    }
    if (s.placement == plan::Placement::Staged) c.n *= s.buffers;
    return c;
  }

  // Where each fast-memory array starts: the materialized values, the dots' packed operands,
  // then the streamed stores' row buffers; and the end, the fast memory a thread needs.
  struct Slot {
    ir::ValueId value = -1;  // or a dot's packed operand:
    const Gemm* gemm = nullptr;
    int operand = 0;
    std::string offset;
    const StreamedStore* streamed = nullptr;  // or a streamed store's row buffer
  };
  std::vector<Slot> layout(Bytes* end) const {
    std::vector<Slot> out;
    Bytes at;
    for (size_t v = 0; v < k_.values.size(); ++v) {
      if (!p_.materialized[v] || alias_.count(int(v)) || unstored_.count(int(v))) continue;
      const ir::Value& val = k_.values[v];
      Count bytes = product(value_count(int(v)), {element_bytes(val.dtype), {}});
      const plan::BlockSpec* spec = staged_spec(int(v));
      out.push_back({int(v), nullptr, 0, at.text()});
      // Staged operands count their prefetched blocks in the budget; those live in the cache.
      // (Only a general variant's arrays have dims sized at run time.)
      if (spec && !bytes.dims.empty()) bytes = staged_bytes(*spec);
      else if (spec) bytes.n = std::max(bytes.n, p_.staging_of(*spec).fast_bytes);
      at.add_lines(bytes);
    }
    for (const Gemm& d : p_.gemms)
      for (int r = 0; r < 2; ++r) {
        const GemmOperand& x = r == 0 ? d.a : d.b;
        if (!x.pack_elements) continue;
        out.push_back({-1, &d, r, at.text()});
        at.add_lines(product(slab2d(x.value, r), {4, {}}));  // x.pack_elements floats, at this call's sizes
      }
    for (const StreamedStore& st : p_.streamed) {
      Count bytes;  // a row of the axis' block, or of the whole dim a general variant reads
      if (runtime_whole(st.axis)) bytes.dims.push_back("E_" + axis(st.axis));
      else bytes.n = st.elements;
      bytes.n *= dtype_size(k_.tensors[size_t(k_.op(st.op).tensor)].dtype);
      out.push_back({-1, nullptr, 0, at.text(), &st});
      at.add_lines(bytes);
    }
    *end = at;
    return out;
  }

  void scratch_arrays() {
    Bytes end;
    for (const Slot& slot : layout(&end)) {
      if (slot.streamed) {
        if (fused_.count(slot.streamed->op)) continue;  // a scan writes it, streaming itself
        const ir::Op& op = k_.op(slot.streamed->op);
        const char* type = storage_ctype(k_.tensors[size_t(op.tensor)].dtype);
        line(fmt::format("{}* const {} = reinterpret_cast<{}*>({});  // a row of {} for {}'s streaming stores ({})", type,
                         row_buffer(op), type, at_index("fast", slot.offset), axis(slot.streamed->axis),
                         shown(k_.tensors[size_t(op.tensor)].name), at(op.loc)));
        continue;
      }
      if (slot.gemm) {
        const Gemm& d = *slot.gemm;
        line(fmt::format("float* const pack{}_{} = reinterpret_cast<float*>({});  // operand {} of the dot at {}, packed by it",
                         d.op, slot.operand == 0 ? "a" : "b", at_index("fast", slot.offset), slot.operand == 0 ? "a" : "b",
                         at(k_.op(d.op).loc)));
        continue;
      }
      ir::ValueId v = slot.value;
      const ir::Value& val = k_.values[size_t(v)];
      std::vector<std::string> dims;
      for (int d : val.dims)
        if (d != ir::kOne) dims.push_back(storage_count(v, d).text());
      const plan::BlockSpec* spec = staged_spec(v);
      std::string what = !spec ? kept_note(v)
                         : spec->placement == plan::Placement::Resident
                             ? ", resident operand"
                             : fmt::format(", staged operand, {} blocks ahead", spec->buffers - 1);
      // Booleans are kept as bytes: GCC does not vectorise loads of `bool` (no vector type).
      const char* elem = val.dtype == DType::boolean ? "uint8_t" : ctype(val.dtype);
      const bool shared = spec && p_.staging_of(*spec).shared;
      if (shared) what = ", resident operand the team shares, in thread 0's scratch";
      line(fmt::format("{}* const m{} = reinterpret_cast<{}*>({});  // {} [{}]{}", elem, v, elem,
                       at_index(shared ? "scratch" : "fast", slot.offset), at_value(v),
                       fmt::join(dims, " x "), what));
    }
    for (const plan::BlockSpec& s : p_.operands)
      if (s.reuse && s.placement != plan::Placement::InPlace && !p_.staging_of(s).shared)
        line(fmt::format("int64_t tag{} = -1;  // grid block whose {} is in m{} (-1: none yet)", s.op,
                         shown(k_.tensors[size_t(s.tensor)].name), k_.ops[size_t(s.op)].result));
  }

  // ", kept for the pass over n_out" for a value an earlier pass keeps (KeptValue).
  std::string kept_note(ir::ValueId v) const {
    for (const KeptValue& kv : p_.kept)
      if (kv.kept == v && !rt_) return fmt::format(", kept for the pass over {}", axis(kv.again_axis));
    return "";
  }

  // The staging spec of a Load result, if it is staged or resident.
  const plan::BlockSpec* staged_spec(ir::ValueId v) const {
    int def = k_.value(v).def_op;
    if (def < 0 || k_.ops[size_t(def)].kind != OpKind::Load) return nullptr;
    const plan::BlockSpec* s = p_.spec_for_op(def);
    return s && s->placement != plan::Placement::InPlace ? s : nullptr;
  }
  bool resident_axis(ir::ValueId v, int axis) const {
    const plan::BlockSpec* s = staged_spec(v);
    if (!s || s->placement != plan::Placement::Resident) return false;
    const auto& axes = k_.loops[size_t(s->loop)].axes;
    return std::find(axes.begin(), axes.end(), axis) != axes.end();
  }
  // Elements of value v's fast-memory array along `axis`.
  int64_t storage_extent(ir::ValueId v, int axis) const {
    return resident_axis(v, axis) ? k_.axes[size_t(axis)].extent : p_.storage_extent(axis);
  }

  std::string tensor_name(int t) const { return runtime::identifier(k_.tensors[size_t(t)].name); }
  std::string row_buffer(const ir::Op& store) const { return "row_" + tensor_name(store.tensor); }
  std::string scalar_name(int s) const { return "s_" + runtime::identifier(k_.scalars[size_t(s)].name); }
  const std::string& axis(int a) const { return k_.axes[size_t(a)].name; }

  // Where in the user's kernel something comes from, for comments: "layer_norm.cpp:24".
  static std::string at(const std::source_location& loc) {
    std::string file = loc.file_name();
    return shown(fmt::format("{}:{}", file.substr(file.find_last_of('/') + 1), loc.line()));
  }
  std::string at_value(ir::ValueId v) const {
    if (const ir::Op* def = k_.def(v)) return at(def->loc);
    for (const ir::Loop& l : k_.loops)  // a loop-carried value: its loop's line
      for (const ir::Carried& c : l.carried)
        if (c.phi == v || c.result == v) return at(l.loc);
    return "?";
  }
  // The lines of a group's ops, in order and once each: "layer_norm.cpp:24, 25, 27".
  std::string at_ops(const std::vector<int>& ops) const {
    std::vector<std::string> seen;
    for (int o : ops) {
      std::string w = at(k_.op(o).loc);
      if (std::find(seen.begin(), seen.end(), w) == seen.end()) seen.push_back(w);
    }
    return fmt::format("{}", fmt::join(seen, ", "));
  }

  // Where grid axis `a` ends.
  std::string grid_end(int a) const {
    const ir::Loop& grid = k_.grid_loop();
    size_t li = size_t(std::find(grid.axes.begin(), grid.axes.end(), a) - grid.axes.begin());
    return rt_ ? extent(a) : std::to_string(grid.end[li].constant);
  }

  void grid_indices(const ir::Loop& grid) {
    line("// this block's position in the grid (fastest axis last)");
    std::string rest = "pid";
    size_t na = p_.grid_axes.size();
    bool grouped = p_.grid_group > 1 && na >= 2 && p_.grid_blocks[na - 2] > 1;
    if (grouped) {
      // Groups of grid_group blocks along the second-fastest axis: consecutive steps walk down
      // a group before moving along the fastest axis, so a block of an operand indexed by the
      // fastest axis is reused grid_group times in a row.
      int64_t g = p_.grid_group;
      std::string nf = grid_blocks(na - 1), ns = grid_blocks(na - 2);
      std::string plane = rt_ ? fmt::format("({} * {})", nf, ns) : std::to_string(p_.grid_blocks[na - 1] * p_.grid_blocks[na - 2]);
      std::string group = rt_ ? fmt::format("({} * {})", g, nf) : std::to_string(g * p_.grid_blocks[na - 1]);
      const std::string &f = axis(p_.grid_axes[na - 1]), &sl = axis(p_.grid_axes[na - 2]);
      line(fmt::format("const int64_t plane = pid % {}, first = plane / {} * {};", plane, group, g));
      line(fmt::format("const int64_t group_rows = {} - first < {} ? {} - first : {};", ns, g, ns, g));
      line(fmt::format("const int64_t b_{} = first + plane % {} % group_rows;", sl, group));
      line(fmt::format("const int64_t b_{} = plane % {} / group_rows;", f, group));
      rest = fmt::format("(pid / {})", plane);
    }
    for (size_t i = p_.grid_axes.size(); i-- > 0;) {
      int a = p_.grid_axes[i];
      const std::string& n = axis(a);
      if (grouped && i + 2 >= na) {
        // set above
      } else if (i == 0) {
        line(fmt::format("const int64_t b_{} = {};", n, rest));
      } else {
        line(fmt::format("const int64_t b_{} = {} % {};", n, rest, grid_blocks(i)));
        rest = fmt::format("({} / {})", rest, grid_blocks(i));
      }
      size_t li = size_t(std::find(grid.axes.begin(), grid.axes.end(), a) - grid.axes.begin());
      int64_t begin = grid.begin[li].constant;
      std::string end = grid_end(a);
      line(begin ? fmt::format("const int64_t o_{} = {} + b_{} * B_{};", n, begin, n, n)
                 : fmt::format("const int64_t o_{} = b_{} * B_{};", n, n, n));
      line(fmt::format("const int64_t n_{} = B_{} < {} - o_{} ? B_{} : {} - o_{};", n, n, end, n, n, end, n));
    }
  }

  // ---- values ----
  ir::ValueId source(ir::ValueId v) const { return ir::strip_views(k_, v); }

  std::string storage_index(ir::ValueId v) const {
    v = storage_value(v);
    std::string idx;
    Count stride;
    const auto& dims = k_.value(v).dims;
    for (size_t i = dims.size(); i-- > 0;) {
      int d = dims[i];
      if (d == ir::kOne) continue;
      // Resident operands span the loop's whole extent: index them globally.
      std::string var = resident_axis(v, d) ? plus("o_" + axis(d), ivar(d)) : ivar(d);
      idx = plus(stride.dims.empty() ? times(var, stride.n) : times(var, stride.text()), idx.empty() ? "0" : idx);
      Count x = storage_count(v, d);
      stride.n *= x.n;
      stride.dims.insert(stride.dims.end(), x.dims.begin(), x.dims.end());
    }
    return idx.empty() ? "0" : idx;
  }

  ir::ValueId storage_value(ir::ValueId v) const {
    auto it = alias_.find(v);
    return it == alias_.end() ? v : it->second;
  }

  // Global element index along axis `a` for tensor addressing.
  std::string global_index(int a) const {
    if (k_.axes[size_t(a)].kind != ir::AxisKind::Tile) return ivar(a);
    if (ivar(a) == "0") return block_origin(a);
    return fmt::format("({} + {})", origin_of(a), ivar(a));
  }
  // The first global index of a tile axis in the current block: o_<axis>, or what replaces it.
  std::string origin_of(int a) const {
    auto o = origin_.find(a);
    return o == origin_.end() ? "o_" + k_.axes[size_t(a)].name : o->second;
  }
  // The same as an operand (a replacement is an expression).
  std::string block_origin(int a) const { return origin_.count(a) ? "(" + origin_of(a) + ")" : origin_of(a); }
  // The loop variable of an axis inside a block ("i_t0"), or what replaces it (a dot's base
  // addresses put 0 there).
  std::string ivar(int a) const {
    auto it = ivar_.find(a);
    return it == ivar_.end() ? "i_" + k_.axes[size_t(a)].name : it->second;
  }

  std::string address(const ir::Op& op) {
    std::vector<std::string> terms;
    for (size_t d = 0; d < op.index.size(); ++d) {
      const ir::Index& e = op.index[d];
      std::string i;
      if (e.kind == ir::Index::Kind::Axis) {
        i = global_index(e.axis);
        if (e.offset) i = fmt::format("({} + {})", i, e.offset);
      } else if (e.kind == ir::Index::Kind::Scalar && e.value < 0) {
        i = fmt::format("{}", e.constant);
      } else {  // computed by the kernel: checked
        i = fmt::format("dt::checked_index(int64_t({}), {}, status, {})", value(e.value), dim(op.tensor, d),
                        check_number(int(&op - k_.ops.data()), int(d)));
      }
      std::string term = times(i, stride(op.tensor, d));
      if (term != "0") terms.push_back(term);
    }
    return terms.empty() ? "0" : fmt::format("{}", fmt::join(terms, " + "));
  }

  int check_number(int op, int dim) const {
    for (size_t c = 0; c < checks_.size(); ++c)
      if (checks_[c].op == op && checks_[c].dim == dim) return int(c);
    throw std::logic_error(fmt::format("codegen: no index check for op {} dim {}", op, dim));
  }

  std::string load_expr(const ir::Op& op) {
    const ir::HostTensor& t = k_.tensors[size_t(op.tensor)];
    std::string e = fmt::format("{}[{}]", tensor_name(op.tensor), address(op));
    if (t.dtype == DType::bf16) return fmt::format("dt::bf16_to_f32({})", e);
    if (t.dtype == DType::f16) return fmt::format("dt::f16_to_f32({})", e);
    return e;
  }

  std::string convert(const std::string& e, DType from, DType to) const {
    if (to == DType::bf16) return fmt::format("dt::bf16_to_f32(dt::f32_to_bf16(float({})))", e);
    if (to == DType::f16) return fmt::format("dt::f16_to_f32(dt::f32_to_f16(float({})))", e);
    if (to == DType::boolean && from != DType::boolean) return fmt::format("({} != 0)", e);
    if (std::string(ctype(from)) == ctype(to)) return e;
    return fmt::format("{}({})", ctype(to), e);
  }

  // The element of value v at the current loop position, as an expression.
  std::string value(ir::ValueId v) {
    v = source(v);
    if (auto f = fixed_.find(v); f != fixed_.end()) return f->second;
    auto memo = scalars_.find(v);
    if (memo != scalars_.end()) return memo->second;
    if (p_.materialized[size_t(v)]) return fmt::format("m{}[{}]", storage_value(v), storage_index(v));
    if (const ir::Op* tile = output_tile(storage_value(v))) {  // read once, before the store writes over it
      std::string name = fmt::format("v{}", v);
      line(fmt::format("const float {} = {};  // the accumulator, in the output's tile", name,
                       load_expr(*tile)));
      return scalars_[v] = name;
    }
    int def = k_.value(v).def_op;
    if (def < 0) throw std::logic_error(fmt::format("codegen: value %{} is not available", v));
    return compute(k_.ops[size_t(def)]);
  }

  // Emits the op at the current position (innermost loop or straight-line) and returns the
  // name of its scalar.
  std::string compute(const ir::Op& op) {
    const ir::Value& r = k_.value(op.result);
    std::string e;
    auto in = [&](int i) { return value(op.inputs[size_t(i)]); };
    auto in_as = [&](int i, DType t) { return convert(in(i), k_.value(op.inputs[size_t(i)]).dtype, t); };
    switch (op.kind) {
      case OpKind::Load: e = load_expr(op); break;
      case OpKind::Full:  // a whole dim's extent (op.axis) is read at run time in a general variant
        e = rt_ && op.axis >= 0 ? convert(extent(op.axis), DType::i64, r.dtype) : literal(op.number, r.dtype);
        break;
      case OpKind::ScalarArg: e = scalar_name(op.scalar); break;
      case OpKind::TileIndex: e = global_index(op.axis); break;
      case OpKind::TileBegin: e = fmt::format("o_{}", axis(op.axis)); break;
      case OpKind::TileEnd: e = fmt::format("(o_{} + n_{})", axis(op.axis), axis(op.axis)); break;
      case OpKind::TileSize: e = fmt::format("B_{}", axis(op.axis)); break;
      case OpKind::Cast: e = convert(in(0), k_.value(op.inputs[0]).dtype, r.dtype); break;
      case OpKind::Where:
        e = fmt::format("dt::where<{}>({}, {}, {})", ctype(r.dtype), in(0), in_as(1, r.dtype), in_as(2, r.dtype));
        break;
      case OpKind::Unary: {
        if (auto c = chunk_exp_.find(op.result); c != chunk_exp_.end()) {  // silu, gelu_tanh
          e = fmt::format("dt::x_sigmoid_from({}, {})", in(0), c->second);
          break;
        }
        // Only the exponentials have a cheaper form for arguments known not to be positive.
        const bool exp = op.unary == ir::UnaryFn::Exp || op.unary == ir::UnaryFn::Exp2;
        e = unary(op, in_as(0, ir::operand_dtype(op.unary, k_.value(op.inputs[0]).dtype)), r.dtype,
                  exp && ir::nonpositive(k_, op.inputs[0]));
        break;
      }
      case OpKind::Binary: {
        DType t = ir::operand_dtype(op.binary, promote(k_.value(op.inputs[0]).dtype, k_.value(op.inputs[1]).dtype));
        auto r = op.binary == ir::BinaryFn::Div ? reciprocal_.find(source(op.inputs[1])) : reciprocal_.end();
        e = r != reciprocal_.end() ? fmt::format("({} * {})", in_as(0, t), r->second)
                                   : binary(op.binary, in_as(0, t), in_as(1, t), t);
        break;
      }
      default:
        throw std::logic_error(fmt::format("codegen: op {} cannot be computed here", ir::name(op.kind)));
    }
    std::string name = fmt::format("v{}", op.result);
    line(fmt::format("const {} {} = {};", ctype(r.dtype), name, e));
    scalars_[op.result] = name;
    return name;
  }

  static bool is_integer(DType t) { return t == DType::i32 || t == DType::i64; }
  bool uses_axis(ir::ValueId v, int a) const {
    const std::vector<int>& d = k_.value(v).dims;
    return std::find(d.begin(), d.end(), a) != d.end();
  }

  // `nonpositive`: x <= 0 by construction (x - max x), which allows a cheaper exponential.
  static std::string unary(const ir::Op& op, const std::string& x, DType op_dtype, bool nonpositive) {
    switch (op.unary) {
      case ir::UnaryFn::Neg: return is_integer(op_dtype) ? fmt::format("dt::wrapping_neg({})", x) : fmt::format("(-{})", x);
      case ir::UnaryFn::Not: return fmt::format("(!{})", x);
      case ir::UnaryFn::Exp: return fmt::format("dt::exp{}({})", nonpositive ? "_nonpositive" : "", x);
      case ir::UnaryFn::Exp2: return fmt::format("dt::exp2{}({})", nonpositive ? "_nonpositive" : "", x);
      case ir::UnaryFn::Log: return fmt::format("dt::log({})", x);
      case ir::UnaryFn::Sqrt: return fmt::format("dt::sqrt({})", x);
      case ir::UnaryFn::Rsqrt: return fmt::format("dt::rsqrt({})", x);
      case ir::UnaryFn::Tanh: return fmt::format("dt::tanh({})", x);
      case ir::UnaryFn::Sigmoid: return fmt::format("dt::sigmoid({})", x);
      case ir::UnaryFn::Silu: return fmt::format("dt::silu({})", x);
      case ir::UnaryFn::GeluTanh: return fmt::format("dt::gelu_tanh({})", x);
      case ir::UnaryFn::GeluErf: return fmt::format("dt::gelu_erf({})", x);
      case ir::UnaryFn::Erf: return fmt::format("dt::erf({})", x);
      case ir::UnaryFn::Abs:
        return is_floating(op_dtype) ? fmt::format("dt::abs({})", x) : fmt::format("dt::wrapping_abs({})", x);
      case ir::UnaryFn::Sin: return fmt::format("dt::sin({})", x);
      case ir::UnaryFn::Cos: return fmt::format("dt::cos({})", x);
      case ir::UnaryFn::Log1p: return fmt::format("dt::log1p({})", x);
      case ir::UnaryFn::Expm1: return fmt::format("dt::expm1({})", x);
      case ir::UnaryFn::Floor: return fmt::format("dt::floor({})", x);
      case ir::UnaryFn::Ceil: return fmt::format("dt::ceil({})", x);
      case ir::UnaryFn::Round: return fmt::format("dt::round({})", x);
      case ir::UnaryFn::BitcastI32: return fmt::format("dt::bitcast_i32({})", x);
      case ir::UnaryFn::BitcastF32: return fmt::format("dt::bitcast_f32({})", x);
    }
    return x;
  }

  static std::string binary(ir::BinaryFn f, const std::string& a, const std::string& b, DType t) {
    if (is_integer(t) && (f == ir::BinaryFn::Add || f == ir::BinaryFn::Sub || f == ir::BinaryFn::Mul))
      return fmt::format("dt::wrapping_{}({}, {})", ir::name(f), a, b);
    switch (f) {
      case ir::BinaryFn::Add: return fmt::format("({} + {})", a, b);
      case ir::BinaryFn::Sub: return fmt::format("({} - {})", a, b);
      case ir::BinaryFn::Mul: return fmt::format("({} * {})", a, b);
      case ir::BinaryFn::Div: return fmt::format("({} / {})", a, b);
      case ir::BinaryFn::Max:
        return is_floating(t) ? fmt::format("dt::maximum({}, {})", a, b) : fmt::format("({0} > {1} ? {0} : {1})", a, b);
      case ir::BinaryFn::Min:
        return is_floating(t) ? fmt::format("dt::minimum({}, {})", a, b) : fmt::format("({0} < {1} ? {0} : {1})", a, b);
      case ir::BinaryFn::Eq: return fmt::format("({} == {})", a, b);
      case ir::BinaryFn::Ne: return fmt::format("({} != {})", a, b);
      case ir::BinaryFn::Lt: return fmt::format("({} < {})", a, b);
      case ir::BinaryFn::Le: return fmt::format("({} <= {})", a, b);
      case ir::BinaryFn::Gt: return fmt::format("({} > {})", a, b);
      case ir::BinaryFn::Ge: return fmt::format("({} >= {})", a, b);
      case ir::BinaryFn::And: return fmt::format("({} && {})", a, b);
      case ir::BinaryFn::Or: return fmt::format("({} || {})", a, b);
      case ir::BinaryFn::Pow: return fmt::format("dt::pow({}, {})", a, b);
      case ir::BinaryFn::BitAnd: return fmt::format("({} & {})", a, b);
      case ir::BinaryFn::BitOr: return fmt::format("({} | {})", a, b);
      case ir::BinaryFn::BitXor: return fmt::format("({} ^ {})", a, b);
      case ir::BinaryFn::Shl: return fmt::format("dt::shl({}, {})", a, b);
      case ir::BinaryFn::Shr: return fmt::format("dt::shr({}, {})", a, b);
      case ir::BinaryFn::Mod: return fmt::format("dt::remainder({}, {})", a, b);
      case ir::BinaryFn::FloorDiv: return fmt::format("dt::floor_divide({}, {})", a, b);
      case ir::BinaryFn::Rand: return fmt::format("dt::rand({}, {})", a, b);
      case ir::BinaryFn::Randn: return fmt::format("dt::randn({}, {})", a, b);
      case ir::BinaryFn::RandInt: return fmt::format("dt::randint({}, {})", a, b);
    }
    return a;
  }

  std::string identity(ir::ReduceFn f, DType t) const {
    bool fl = is_floating(t), i32 = t == DType::i32;
    switch (f) {
      case ir::ReduceFn::Sum: return fl ? "0.0f" : "0";
      case ir::ReduceFn::Max: return fl ? "-dt::kInf" : i32 ? "INT32_MIN" : "INT64_MIN";
      case ir::ReduceFn::Min: return fl ? "dt::kInf" : i32 ? "INT32_MAX" : "INT64_MAX";
    }
    return "0";
  }

  // A float max or min in a scalar accumulator: the simd max/min reductions drop NaNs, so a
  // flag records whether one was seen (torch.amax propagates NaN, as hl::maximum does).
  bool tracks_nan(const ir::Op& op) const {
    return op.reduce != ir::ReduceFn::Sum && is_floating(k_.value(op.result).dtype);
  }

  // An integer sum accumulates in a scalar as uint64_t: it wraps, and so does the simd
  // reduction combining the lanes.
  static const char* accumulator_type(ir::ReduceFn f, DType t) {
    return f == ir::ReduceFn::Sum && is_integer(t) ? "uint64_t" : ctype(t);
  }

  // Folds `x` into `acc`, an element of the result (of dtype t) or a scalar accumulator.
  std::string combine(ir::ReduceFn f, const std::string& acc, const std::string& x, DType t, bool scalar) const {
    switch (f) {
      case ir::ReduceFn::Sum:
        if (!is_integer(t)) return fmt::format("{0} = {0} + {1};", acc, x);
        if (scalar) return fmt::format("{0} = {0} + uint64_t({1});", acc, x);
        return fmt::format("{0} = dt::wrapping_add({0}, {1});", acc, x);
      case ir::ReduceFn::Max:
        if (!scalar && is_floating(t)) return fmt::format("{0} = dt::maximum({0}, {1});", acc, x);
        return fmt::format("{0} = {1} > {0} ? {1} : {0};", acc, x);
      case ir::ReduceFn::Min:
        if (!scalar && is_floating(t)) return fmt::format("{0} = dt::minimum({0}, {1});", acc, x);
        return fmt::format("{0} = {1} < {0} ? {1} : {0};", acc, x);
    }
    return "";
  }

  // ---- loop nests ----
  // Opens `for` loops over `domain`; the innermost gets `pragma` (may be empty).
  void open_nest(const std::vector<int>& domain, const std::string& inner_pragma,
                 const std::function<void(size_t)>& before_level) {
    for (size_t i = 0; i < domain.size(); ++i) {
      before_level(i);
      const std::string& n = axis(domain[i]);
      auto r = range_.find(domain[i]);
      // A dim of one element: no loop (a nest of trivial loops keeps GCC from vectorising the
      // innermost one, reductions in particular).
      bool one = r == range_.end() && !whole_.count(domain[i]) && p_.storage_extent(domain[i]) == 1;
      if (i + 1 == domain.size() && !inner_pragma.empty() && !one) line(inner_pragma);
      if (r != range_.end()) line(fmt::format("for (int64_t i_{0} = {1}; i_{0} < {2}; ++i_{0}) {{", n, r->second.first, r->second.second));
      else if (one) line(fmt::format("{{ constexpr int64_t i_{} = 0;", n));
      else line(fmt::format("for (int64_t i_{0} = 0; i_{0} < n_{0}; ++i_{0}) {{", n));
      ++indent_;
    }
    before_level(domain.size());
  }
  void close_nest(const std::vector<int>& domain, const std::function<void(size_t)>& after_level) {
    for (size_t i = domain.size(); i-- > 0;) {
      --indent_;
      line("}");
      after_level(i);
    }
  }

  // A group whose ops are all stores made by the op that computes their value (fused_).
  bool all_fused(const plan::Group& g) const {
    return std::all_of(g.ops.begin(), g.ops.end(), [&](int o) { return fused_.count(o); });
  }

  // A where() in g that selects by a diagonal mask over two axes of its nest (causal attention's
  // kv > q), where the mask's value is worth testing away per block: its index arithmetic runs
  // in int64 lanes (four a vector with AVX2), which made the masked max 5% of causal attention's
  // time, though only the blocks on the diagonal mask anything.
  const plan::DiagonalMask* versioned_mask(const plan::Group& g) const {
    auto plain_axis = [&](int a) {
      return std::find(g.domain.begin(), g.domain.end(), a) != g.domain.end() && !range_.count(a) &&
             (whole_.count(a) || p_.storage_extent(a) > 1);
    };
    for (int o : g.ops) {
      const ir::Op& op = k_.ops[size_t(o)];
      if (op.kind != OpKind::Where) continue;
      ir::ValueId cond = ir::strip_views(k_, op.inputs[0]);
      for (const plan::DiagonalMask& m : p_.diagonal_masks)
        if (m.cond == cond && plain_axis(m.row) && plain_axis(m.col)) return &m;
    }
    return nullptr;
  }

  void emit_group(const plan::Group& g) {
    if (all_fused(g)) return;
    if (g.ops.size() == 1 && k_.ops[size_t(g.ops[0])].kind == OpKind::Dot) {
      emit_dot(*p_.gemm_for_op(g.ops[0]));
      return;
    }
    if (g.ops.size() == 1 && k_.ops[size_t(g.ops[0])].kind == OpKind::Scan) {
      emit_scan(k_.ops[size_t(g.ops[0])], g.domain);
      return;
    }
    if (const plan::DiagonalMask* m = versioned_mask(g)) {
      // The block's largest col - row is its last column's index less its first row's.
      const std::string &row = axis(m->row), &col = axis(m->col);
      line(fmt::format("if ({} + n_{} - 1 - {} <= {}) {{  // {}: {} - {} > {} nowhere in this block",
                       block_origin(m->col), col, block_origin(m->row), m->t, at(k_.def(m->cond)->loc), col,
                       row, m->t));
      ++indent_;
      fixed_[m->cond] = "false";
      emit_loop_nest(g);
      fixed_.erase(m->cond);
      --indent_;
      line("} else {");
      ++indent_;
      emit_loop_nest(g);
      --indent_;
      line("}");
      return;
    }
    emit_loop_nest(g);
  }

  // A group of elementwise ops and reductions as one loop nest over its domain.
  void emit_loop_nest(const plan::Group& g) {
    scalars_.clear();
    const std::vector<int>& dom = g.domain;
    int inner = dom.empty() ? -2 : dom.back();
    // Reductions over the innermost axis accumulate in scalars (vectorised with a simd
    // reduction); others accumulate in their fast-memory result.
    std::vector<const ir::Op*> scalar_red, array_red;
    for (int o : g.ops) {
      const ir::Op& op = k_.ops[size_t(o)];
      if (op.kind != OpKind::Reduce) continue;
      int rd = k_.value(op.inputs[0]).dims[size_t(op.dim)];
      if (rd == ir::kOne) continue;
      (rd == inner ? scalar_red : array_red).push_back(&op);
    }
    line(fmt::format("// {} over [{}]", at_ops(g.ops), [&] {
      std::vector<std::string> d;
      for (int a : dom) d.push_back(axis(a));
      return fmt::format("{}", fmt::join(d, ", "));
    }()));
    line("{");
    ++indent_;
    for (const ir::Op* op : array_red) {
      const ir::Value& r = k_.value(op->result);
      line(fmt::format("for (int64_t j = 0; j < {}; ++j) m{}[j] = {};", value_count(op->result).text(),
                       op->result, identity(op->reduce, r.dtype)));
    }
    std::string pragma;
    // Atomic adds, and adds at gathered indices, may hit one address from several lanes: no
    // simd for their loops. (An ordered add at the block's own indices is a plain store.)
    bool atomic = std::any_of(g.ops.begin(), g.ops.end(), [&](int o) {
      const ir::Op& op = k_.ops[size_t(o)];
      bool gathered = std::any_of(op.index.begin(), op.index.end(),
                                  [](const ir::Index& e) { return e.kind == ir::Index::Kind::Gather; });
      return op.atomic_add && (!ordered(op.tensor) || gathered);
    });
    if (!dom.empty() && !atomic) {
      pragma = "#pragma omp simd";
      for (const ir::Op* op : scalar_red) {
        pragma += fmt::format(" reduction({}:acc{})", reduce_clause(op->reduce), op->result);
        if (tracks_nan(*op)) pragma += fmt::format(" reduction(|:nan{})", op->result);
      }
    }
    std::vector<const StreamedStore*> streamed;
    for (int o : g.ops)
      if (const StreamedStore* st = p_.streamed_store(o)) streamed.push_back(st);
    // A reduction along the innermost loop in one simd accumulator is one dependent add per
    // vector: latency-bound at a quarter of the rate the data comes from L1. Long enough rows
    // accumulate in chunks of dt::kReduceChunk lanes instead (four vectors: four independent
    // chains), then the rest of the row, then fold the chunk's lanes.
    // A general variant chunks every whole dim it reads at run time (the code holds for any
    // length; the probe shapes' extents must not decide it).
    // A pass that prefetches (RowPrefetch) runs in chunks (or pieces) too: each prefetches its lines.
    std::vector<RowPrefetch> prefetches, ahead;  // ahead: issued before each row, not in its chunks
    for (const RowPrefetch& r : p_.prefetches_of(g)) (r.rows_ahead > 0 ? ahead : prefetches).push_back(r);
    bool chunked = !pragma.empty() && (!scalar_red.empty() || (!prefetches.empty() && streamed.empty())) &&
                   !range_.count(inner) && (runtime_whole(inner) || p_.storage_extent(inner) >= 128);
    // Rows that stream out go in pieces of dt::kStreamChunk: computing a whole row into its
    // buffer and then streaming it stops the loads while the stores drain, and the other way
    // round (add 4096x4096: 2.7 ms, slower than plain stores; in pieces 1.9 ms).
    bool stream_chunked = !chunked && !pragma.empty() && !streamed.empty() && !range_.count(inner) &&
                          (runtime_whole(inner) || p_.storage_extent(inner) > 256);
    bool split = chunked || stream_chunked;
    if (!split) prefetches.clear();
    // Divisions by a value the innermost loop holds fixed multiply by its reciprocal, in a
    // second version of the loop that runs where that reciprocal is a normal float (loops of
    // 64 and more: shorter ones gain too little for the second copy).
    bool long_loop = !pragma.empty() && !range_.count(inner) && (runtime_whole(inner) || p_.storage_extent(inner) >= 64);
    const std::vector<ir::ValueId> reads = invariant_reads(g, inner);
    std::vector<ir::ValueId> divisors = long_loop ? invariant_divisors(g, reads) : std::vector<ir::ValueId>{};
    bool versioned = !divisors.empty();
    // Activations whose exponentials run a chunk at a time (emit_lanes): in pieces of streamed
    // rows, or in a loop of their own.
    std::vector<const ir::Op*> activations;
    if (!chunked && !pragma.empty() && scalar_red.empty() && !range_.count(inner) &&
        (runtime_whole(inner) || p_.storage_extent(inner) >= 128))
      for (const ir::Op* op : chunk_exponentials(g, inner, {}))
        if (sigmoid_activation(op->unary)) activations.push_back(op);
    bool act_chunked = !activations.empty() && !stream_chunked && !versioned;
    bool own_inner =
        split || versioned || act_chunked;  // the innermost loop is opened here, not by open_nest
    std::vector<int> outer(dom.begin(), dom.end() - (own_inner ? 1 : 0));
    std::map<ir::ValueId, std::string> hoisted;  // read before the innermost loop(s), last of all
    auto declare = [&](size_t level) {
      if (level + 1 != dom.size() && !(own_inner && level == outer.size())) return;
      for (const ir::Op* op : scalar_red) {
        const char* type = accumulator_type(op->reduce, k_.value(op->result).dtype);
        line(fmt::format("{} acc{} = {};", type, op->result, identity(op->reduce, k_.value(op->result).dtype)));
        if (tracks_nan(*op)) line(fmt::format("int32_t nan{} = 0;", op->result));
        if (chunked) line(fmt::format("{} part{}[dt::kReduceChunk];  // lane j of every chunk", type, op->result));
        // NaN flags per lane too: a reduction clause would fold them across the vector per chunk.
        if (chunked && tracks_nan(*op)) line(fmt::format("int32_t nanpart{}[dt::kReduceChunk];", op->result));
      }
      if (chunked && !scalar_red.empty()) {
        line("for (int64_t j = 0; j < dt::kReduceChunk; ++j) {");
        for (const ir::Op* op : scalar_red) {
          line(fmt::format("  part{}[j] = {};", op->result, identity(op->reduce, k_.value(op->result).dtype)));
          if (tracks_nan(*op)) line(fmt::format("  nanpart{}[j] = 0;", op->result));
        }
        line("}");
      }
      hoisted = hoist_invariants(reads);
      for (ir::ValueId v : divisors) line(fmt::format("const float r{0} = 1.0f / h{0};", v));
      for (const RowPrefetch& r : ahead) emit_rows_ahead_prefetch(r, dom[dom.size() - 2], inner);
    };
    open_nest(outer, own_inner ? "" : pragma, declare);
    auto emit_inner = [&] {
      if (chunked) {
        const std::string& n = axis(inner);
        line(fmt::format("const int64_t chunks_{0} = n_{0} - n_{0} % dt::kReduceChunk;", n));
        line(fmt::format("for (int64_t c_{0} = 0; c_{0} < chunks_{0}; c_{0} += dt::kReduceChunk) {{", n));
        ++indent_;
        for (const RowPrefetch& r : prefetches) emit_row_prefetch(r, inner, "c_" + n, fmt::format("c_{} + dt::kReduceChunk", n));
        const std::string lane = fmt::format("i_{0} - c_{0}", n);
        const std::string chunk_loop =
            fmt::format("for (int64_t i_{0} = c_{0}; i_{0} < c_{0} + dt::kReduceChunk; ++i_{0}) {{", n);
        // The chunk's exponentials first, each in one call on a chunk of arguments (see
        // dt::exp_nonpositive_chunk); the loop below reads their values.
        std::map<ir::ValueId, std::string> known = hoisted;
        std::vector<const ir::Op*> exps = chunk_exponentials(g, inner, known);
        emit_chunk_exponentials(exps, lane, chunk_loop, known);
        const std::set<int> skipped = skip_;
        if (!exps.empty()) {
          std::set<ir::ValueId> read;
          for (const auto& kv : known) read.insert(kv.first);
          skip_ = ops_only_for(g, read);
        }
        scalars_ = known;
        line("#pragma omp simd");
        line(chunk_loop);
        ++indent_;
        emit_body(g, inner, lane);
        --indent_;
        line("}");
        skip_ = skipped;
        chunk_exp_.clear();
        --indent_;
        line("}");
        scalars_ = hoisted;
        line(pragma);
        line(fmt::format("for (int64_t i_{0} = chunks_{0}; i_{0} < n_{0}; ++i_{0}) {{", n));
        ++indent_;
        emit_body(g, inner, "");
        --indent_;
        line("}");
        for (const ir::Op* op : scalar_red) {
          line(fmt::format("#pragma omp simd reduction({}:acc{})", reduce_clause(op->reduce), op->result));
          line(fmt::format("for (int64_t j = 0; j < dt::kReduceChunk; ++j) {}",
                           combine(op->reduce, fmt::format("acc{}", op->result), fmt::format("part{}[j]", op->result),
                                   k_.value(op->result).dtype, true)));
          if (tracks_nan(*op))
            line(fmt::format("for (int64_t j = 0; j < dt::kReduceChunk; ++j) nan{0} |= nanpart{0}[j];", op->result));
        }
      } else if (stream_chunked) {
        const std::string& n = axis(inner);
        line(fmt::format("for (int64_t s_{0} = 0; s_{0} < n_{0}; s_{0} += dt::kStreamChunk) {{", n));
        ++indent_;
        line(fmt::format("const int64_t e_{0} = s_{0} + dt::kStreamChunk < n_{0} ? s_{0} + dt::kStreamChunk : n_{0};", n));
        for (const RowPrefetch& r : prefetches) emit_row_prefetch(r, inner, "s_" + n, "e_" + n);
        stream_piece_ = "s_" + n;
        emit_lanes(g, inner, pragma, "s_" + n, "e_" + n, hoisted, activations);
        range_[inner] = {"s_" + n, "e_" + n};
        for (const StreamedStore* st : streamed) emit_stream_row(*st);
        range_.erase(inner);
        stream_piece_.clear();
        --indent_;
        line("}");
      } else if (act_chunked) {
        line("{");
        ++indent_;
        emit_lanes(g, inner, pragma, "0", "n_" + axis(inner), hoisted, activations);
        --indent_;
        line("}");
      } else if (versioned) {
        open_nest({inner}, pragma, [](size_t) {});
        scalars_ = hoisted;
        emit_body(g, inner, "");
        close_nest({inner}, [](size_t) {});
      } else {
        scalars_ = hoisted;
        emit_body(g, inner, "");
      }
    };
    auto emit_versions = [&] {
      if (versioned) {
        std::vector<std::string> normal, names;
        for (ir::ValueId v : divisors) {
          normal.push_back(fmt::format("dt::is_normal(r{})", v));
          names.push_back(fmt::format("r{}", v));
        }
        // x * (1 / h) is within 1.5 ulp of x / h (as PyTorch's CPU softmax normalises) where
        // 1 / h is a normal float; a vector division costs several multiplies (softmax 7%).
        line(fmt::format("if ({}) {{  // divide by multiplying with {}", fmt::join(normal, " && "),
                         fmt::join(names, ", ")));
        ++indent_;
        for (ir::ValueId v : divisors) reciprocal_[v] = fmt::format("r{}", v);
        emit_inner();
        reciprocal_.clear();
        --indent_;
        line(fmt::format("}} else {{  // {} is 0, subnormal, infinite or NaN: divide",
                         fmt::join(names, " or ")));
        ++indent_;
        emit_inner();
        --indent_;
        line("}");
      } else {
        emit_inner();
      }
    };
    // Values an earlier pass kept (KeptValue): read where its keys match, else computed again.
    // (A general variant's loops may take several trips: there every value is computed.)
    std::vector<KeptValue> kept = rt_ ? std::vector<KeptValue>{} : p_.kept_in(g);
    if (!kept.empty()) {
      scalars_ = hoisted;
      std::vector<std::string> same, what;
      for (const KeptValue& kv : kept) {
        for (auto [a, b] : kv.keys) same.push_back(fmt::format("dt::same_bits({}, {})", value(b), value(a)));
        what.push_back(fmt::format("{} (v{})", at(k_.def(kv.again)->loc), kv.again));
      }
      const std::string& earlier = axis(kept.front().kept_axis);
      if (!same.empty())
        line(fmt::format("if ({}) {{  // {}: as the pass over {} computed and kept {}",
                         fmt::join(same, " && "), fmt::join(what, ", "), earlier,
                         kept.size() == 1 ? "it" : "them"));
      if (!same.empty()) ++indent_;
      for (const KeptValue& kv : kept) {
        ivar_[kv.kept_axis] = ivar(kv.again_axis);
        hoisted[kv.again] = fmt::format("m{}[{}]", storage_value(kv.kept), storage_index(kv.kept));
        ivar_.erase(kv.kept_axis);
      }
      std::set<ir::ValueId> read;
      for (const KeptValue& kv : kept) read.insert(kv.again);
      skip_ = ops_only_for(g, read);
      emit_versions();
      skip_.clear();
      for (const KeptValue& kv : kept) hoisted.erase(kv.again);
      if (!same.empty()) {
        --indent_;
        line(fmt::format("}} else {{  // the pass over {} took other row values: compute again", earlier));
        ++indent_;
        emit_versions();
        --indent_;
        line("}");
      }
    } else {
      emit_versions();
    }
    auto finish = [&](size_t level) {
      if (level + 1 != dom.size() && !(own_inner && level == outer.size())) return;
      for (const ir::Op* op : scalar_red) {
        DType t = k_.value(op->result).dtype;
        std::string acc = fmt::format("acc{}", op->result);
        if (accumulator_type(op->reduce, t) != std::string(ctype(t))) acc = fmt::format("{}({})", ctype(t), acc);
        if (tracks_nan(*op)) acc = fmt::format("nan{} ? dt::nan() : {}", op->result, acc);
        line(fmt::format("m{}[{}] = {};", op->result, storage_index(op->result), acc));
      }
      if (!stream_chunked)
        for (const StreamedStore* st : streamed) emit_stream_row(*st);
    };
    if (own_inner) finish(outer.size());
    close_nest(outer, finish);
    --indent_;
    line("}");
    scalars_.clear();
  }

  // In a chunk [begin, end) of a pass's row (RowPrefetch): one prefetch per cache line of the
  // chunk, of a load's row at the next grid step (that row, when the next step has it), of a
  // load's row some rows ahead in this block, or of a store's row at this one, for writing.
  void emit_row_prefetch(const RowPrefetch& r, int inner, const std::string& begin, const std::string& end) {
    const ir::Op& op = k_.op(r.op);
    const std::string& n = axis(inner);
    int fast = p_.grid_axes.back();
    const std::string& f = axis(fast);
    std::string guard;
    if (r.next_step) {
      origin_[fast] = fmt::format("o_{0} + B_{0}", f);
      guard = fmt::format("if ({} < {}) ", global_index(fast), grid_end(fast));
    }
    int64_t per_line = 64 / dtype_size(k_.tensors[size_t(op.tensor)].dtype);
    std::string what = r.next_step    ? "the next grid step's row, into L2"
                       : r.rows_ahead ? fmt::format("the row {} ahead", r.rows_ahead)
                                      : std::string("this row, for writing");
    line(fmt::format("for (int64_t i_{} = {}; i_{} < {}; i_{} += {})  // {}", n, begin, n, end, n, per_line,
                     what));
    // The next step's row goes into L2 (prefetcht1): in L1 it would evict the rows this step
    // still reads, and L1's own prefetcher brings it in as the next step reads it in order.
    bool write = !r.next_step && !r.rows_ahead;
    line(fmt::format("  {}__builtin_prefetch(&{}[{}], {}, {});", guard, tensor_name(op.tensor), address(op),
                     write ? 1 : 0, r.next_step ? 2 : 3));
    origin_.erase(fast);
  }

  // Before a pass's row `row` (RowPrefetch::rows_ahead): the load's row that many rows ahead,
  // where this block has it.
  void emit_rows_ahead_prefetch(const RowPrefetch& r, int row, int inner) {
    const std::string& m = axis(row);
    auto it = range_.find(inner);
    line(fmt::format("if (i_{0} + {1} < n_{0}) {{", m, r.rows_ahead));
    ++indent_;
    ivar_[row] = fmt::format("i_{} + {}", m, r.rows_ahead);
    emit_row_prefetch(r, inner, it == range_.end() ? "0" : it->second.first,
                      it == range_.end() ? "n_" + axis(inner) : it->second.second);
    ivar_.erase(row);
    --indent_;
    line("}");
  }

  // Reads `reads` (invariant_reads) into named scalars before a group's innermost loop. GCC
  // leaves the loop scalar when such a load sits beside the group's stores to fast memory
  // (softmax with one row per block ran 9x slower) or to a tensor ("latch block not empty": softmax_two_pass's output pass, one row
  // per block, 27 ms against 5.7 vectorised).
  std::map<ir::ValueId, std::string> hoist_invariants(const std::vector<ir::ValueId>& reads) {
    std::map<ir::ValueId, std::string> out;
    for (ir::ValueId v : reads) {
      out[v] = fmt::format("h{}", v);
      line(fmt::format("const {} h{} = m{}[{}];", ctype(k_.value(v).dtype), v, storage_value(v), storage_index(v)));
    }
    return out;
  }
  // The fast-memory values group g takes that stay the same along `inner` (a row's max) and
  // that it does not write.
  std::vector<ir::ValueId> invariant_reads(const plan::Group& g, int inner) const {
    std::set<ir::ValueId> written;
    for (int o : g.ops)
      if (k_.ops[size_t(o)].result >= 0) written.insert(storage_value(k_.ops[size_t(o)].result));
    std::vector<ir::ValueId> out;
    for (int o : g.ops)
      for (ir::ValueId in : k_.ops[size_t(o)].inputs) {
        ir::ValueId v = source(in);
        if (std::find(out.begin(), out.end(), v) != out.end() || !p_.materialized[size_t(v)] ||
            written.count(storage_value(v)) || uses_axis(v, inner))
          continue;
        out.push_back(v);
      }
    return out;
  }
  // The invariant reads of group g (above) that divide float32 values in it.
  std::vector<ir::ValueId> invariant_divisors(const plan::Group& g, const std::vector<ir::ValueId>& reads) const {
    std::vector<ir::ValueId> out;
    for (int o : g.ops) {
      const ir::Op& op = k_.ops[size_t(o)];
      if (op.kind != OpKind::Binary || op.binary != ir::BinaryFn::Div || fused_.count(o)) continue;
      ir::ValueId d = source(op.inputs[1]);
      DType t = ir::operand_dtype(op.binary, promote(k_.value(op.inputs[0]).dtype, k_.value(op.inputs[1]).dtype));
      if (t == DType::f32 && k_.value(d).dtype == DType::f32 &&
          std::find(reads.begin(), reads.end(), d) != reads.end() &&
          std::find(out.begin(), out.end(), d) == out.end())
        out.push_back(d);
    }
    return out;
  }

  // x * sigmoid(g(x)): an exponential of -|g(x)| and a finish from it (dt::x_sigmoid_from).
  static bool sigmoid_activation(ir::UnaryFn f) {
    return f == ir::UnaryFn::Silu || f == ir::UnaryFn::GeluTanh;
  }

  // The exponentials of group g that run a chunk at a time (dt::exp_nonpositive_chunk): f32 exp
  // or exp2 of an argument known not to be positive that varies along the innermost loop, and
  // that a loop of its own can compute (`known`: the values there, read).
  // Also silu and gelu_tanh of f32, whose exponential's argument -|g(x)| (see
  // dt::x_sigmoid_from) is computed so.
  std::vector<const ir::Op*> chunk_exponentials(const plan::Group& g, int inner,
                                                std::map<ir::ValueId, std::string> known) const {
    std::vector<const ir::Op*> out;
    for (int o : g.ops) {
      const ir::Op& op = k_.ops[size_t(o)];
      if (op.kind != OpKind::Unary) continue;
      const bool exp = op.unary == ir::UnaryFn::Exp || op.unary == ir::UnaryFn::Exp2;
      const bool act = sigmoid_activation(op.unary);
      if (!exp && !act) continue;
      if (fused_.count(o) || skip_.count(o) || known.count(op.result)) continue;
      if (k_.value(op.result).dtype != DType::f32 || k_.value(op.inputs[0]).dtype != DType::f32) continue;
      if ((exp && !ir::nonpositive(k_, op.inputs[0])) || !uses_axis(op.result, inner)) continue;
      if (!computable_apart(op.inputs[0], g, known)) continue;
      out.push_back(&op);
      if (exp) known[op.result] = "";  // an activation's value is computed in the loop, not read
    }
    return out;
  }

  // Group g's innermost loop over [begin, end), `pragma` on it. With `activations` (silu and
  // gelu_tanh whose arguments it can compute apart), whole chunks of dt::kReduceChunk lanes run
  // first, their activations' exponentials in one call each (a table-driven exponential that
  // lane code cannot express: geglu 0.77x the time, swiglu 0.84x), then the rest lane by lane.
  void emit_lanes(const plan::Group& g, int inner, const std::string& pragma, const std::string& begin,
                  const std::string& end, const std::map<ir::ValueId, std::string>& hoisted,
                  const std::vector<const ir::Op*>& activations) {
    const std::string& n = axis(inner);
    std::string from = begin;
    if (!activations.empty()) {
      line(fmt::format("int64_t c_{0} = {1};", n, begin));
      line(fmt::format("for (; c_{0} + dt::kReduceChunk <= {1}; c_{0} += dt::kReduceChunk) {{", n, end));
      ++indent_;
      const std::string lane = fmt::format("i_{0} - c_{0}", n);
      const std::string chunk_loop =
          fmt::format("for (int64_t i_{0} = c_{0}; i_{0} < c_{0} + dt::kReduceChunk; ++i_{0}) {{", n);
      std::map<ir::ValueId, std::string> known = hoisted;
      emit_chunk_exponentials(activations, lane, chunk_loop, known);
      scalars_ = hoisted;
      line(pragma);
      line(chunk_loop);
      ++indent_;
      emit_body(g, inner, "");
      --indent_;
      line("}");
      chunk_exp_.clear();
      --indent_;
      line("}");
      from = "c_" + n;
    }
    scalars_ = hoisted;
    line(pragma);
    line(fmt::format("for (int64_t i_{0} = {1}; i_{0} < {2}; ++i_{0}) {{", n, from, end));
    ++indent_;
    emit_body(g, inner, "");
    --indent_;
    line("}");
  }

  // For one chunk of lanes (`lane`: a lane's index in it; `chunk_loop`: the loop over it), each
  // op's exponential's arguments into a buffer, then their exponentials in one call (see
  // dt::exp_nonpositive_chunk): an exponential's value is then read from it (`known`), an
  // activation's computed from it (chunk_exp_).
  void emit_chunk_exponentials(const std::vector<const ir::Op*>& ops, const std::string& lane,
                               const std::string& chunk_loop, std::map<ir::ValueId, std::string>& known) {
    for (const ir::Op* e : ops) {
      const bool exp2 = e->unary == ir::UnaryFn::Exp2;
      const bool act = sigmoid_activation(e->unary);
      line(
          fmt::format("alignas(64) float e{}[dt::kReduceChunk];  // {}: the chunk's arguments, then their {}",
                      e->result, at(e->loc),
                      act    ? std::string("exp, for ") + ir::name(e->unary)
                      : exp2 ? "exp2"
                             : "exp"));
      scalars_ = known;
      line("#pragma omp simd");
      line(chunk_loop);
      ++indent_;
      std::string argument = value(e->inputs[0]);
      if (act) argument = fmt::format("dt::{}_exp_arg({})", ir::name(e->unary), argument);
      line(fmt::format("e{}[{}] = {};", e->result, lane, argument));
      --indent_;
      line("}");
      line(fmt::format("dt::{}_nonpositive_chunk(e{});", exp2 ? "exp2" : "exp", e->result));
      (act ? chunk_exp_ : known)[e->result] = fmt::format("e{}[{}]", e->result, lane);
    }
  }

  // Whether value v can be computed ahead of group g's loop body: from `known` values, values
  // earlier groups stored, and element ops, but no value g itself stores and no load of a
  // tensor g writes.
  bool computable_apart(ir::ValueId v, const plan::Group& g,
                        const std::map<ir::ValueId, std::string>& known) const {
    v = source(v);
    if (known.count(v)) return true;
    int def = k_.value(v).def_op;
    if (def < 0) return false;
    bool in_g = std::find(g.ops.begin(), g.ops.end(), def) != g.ops.end();
    if (p_.materialized[size_t(v)]) return !in_g;
    const ir::Op& d = k_.ops[size_t(def)];
    switch (d.kind) {
      case OpKind::Load:
        for (int o : g.ops)
          if (k_.ops[size_t(o)].kind == OpKind::Store && k_.ops[size_t(o)].tensor == d.tensor) return false;
        break;
      case OpKind::Full:
      case OpKind::ScalarArg:
      case OpKind::TileIndex:
      case OpKind::TileBegin:
      case OpKind::TileEnd:
      case OpKind::TileSize:
      case OpKind::Cast:
      case OpKind::Where:
      case OpKind::Unary:
      case OpKind::Binary: break;
      default: return false;
    }
    for (ir::ValueId in : d.inputs)
      if (!computable_apart(in, g, known)) return false;
    return true;
  }

  // The ops of group g that only compute values it reads instead (`read`: those the passes that
  // kept them hold, or a chunk's exponentials): nothing else in g, no store and no later group
  // needs their results.
  std::set<int> ops_only_for(const plan::Group& g, const std::set<ir::ValueId>& read) const {
    std::set<ir::ValueId> needed;
    std::set<int> out;
    for (auto o = g.ops.rbegin(); o != g.ops.rend(); ++o) {
      const ir::Op& op = k_.ops[size_t(*o)];
      bool root = op.result < 0 || op.kind == OpKind::Reduce || p_.materialized[size_t(op.result)];
      if (!root && !needed.count(op.result)) {
        out.insert(*o);
        continue;
      }
      if (read.count(op.result)) continue;  // read, not computed: its inputs are not needed for it
      std::function<void(ir::ValueId)> need = [&](ir::ValueId v) {
        v = source(v);
        if (!needed.insert(v).second || p_.materialized[size_t(v)]) return;
        int def = k_.value(v).def_op;
        if (def >= 0 &&
            std::find(g.ops.begin(), g.ops.end(), def) == g.ops.end())  // computed inline where used
          for (ir::ValueId in : k_.ops[size_t(def)].inputs) need(in);
      };
      for (ir::ValueId in : op.inputs) need(in);
    }
    return out;
  }

  // The statements of group g's innermost loop body; reductions along `inner` fold into their
  // scalar accumulator, or with `part` (a lane index) into that lane of their chunk.
  void emit_body(const plan::Group& g, int inner, const std::string& part) {
    for (int o : g.ops) {
      const ir::Op& op = k_.ops[size_t(o)];
      if (fused_.count(o)) continue;  // stored by the op it follows (emit_simd_cumsum)
      if (skip_.count(o)) continue;   // only needed for a value read from an earlier pass
      if (op.kind == OpKind::Store) {
        const ir::HostTensor& t = k_.tensors[size_t(op.tensor)];
        std::string e = stored(value(op.inputs.back()), k_.value(op.inputs.back()).dtype, t.dtype);
        // The address may compute values (a scatter's index): before the pragma, which must
        // precede the update statement itself.
        std::string at = address(op);
        if (const StreamedStore* st = p_.streamed_store(o)) {
          // A piece of a row goes to the buffer's start: indexed by its place in the whole row,
          // the buffer and the inputs share their address bits and stores stall loads (add
          // 4096x4096: 2.35 -> 1.85 ms).
          std::string i = stream_piece_.empty() ? ivar(st->axis) : ivar(st->axis) + " - " + stream_piece_;
          line(fmt::format("{}[{}] = {};", row_buffer(op), i, e));
        } else if (op.atomic_add && ordered(op.tensor)) {
          line(fmt::format("{}[{}] += {};", copy_name(op.tensor), at, e));
        } else {
          if (op.atomic_add) line("#pragma omp atomic update");
          line(fmt::format("{}[{}] {}= {};", tensor_name(op.tensor), at, op.atomic_add ? "+" : "", e));
        }
      } else if (op.kind == OpKind::Reduce) {
        int rd = k_.value(op.inputs[0]).dims[size_t(op.dim)];
        std::string x = convert(value(op.inputs[0]), k_.value(op.inputs[0]).dtype, k_.value(op.result).dtype);
        if (rd == ir::kOne) {
          line(fmt::format("m{}[{}] = {};", op.result, storage_index(op.result), x));
        } else if (rd == inner) {
          std::string acc = part.empty() ? fmt::format("acc{}", op.result) : fmt::format("part{}[{}]", op.result, part);
          line(combine(op.reduce, acc, x, k_.value(op.result).dtype, true));
          if (tracks_nan(op))
            line(part.empty() ? fmt::format("nan{0} |= {1} != {1};", op.result, x)
                              : fmt::format("nanpart{0}[{2}] |= {1} != {1};", op.result, x, part));
        } else {
          line(combine(op.reduce, fmt::format("m{}[{}]", op.result, storage_index(op.result)), x,
                       k_.value(op.result).dtype, false));
        }
      } else if (fixed_.count(op.result)) {
        continue;  // known for this whole block (versioned_mask)
      } else {
        auto read = scalars_.find(op.result);  // a value an earlier pass kept (KeptValue)
        std::string s = read != scalars_.end() ? read->second : compute(op);
        if (p_.materialized[size_t(op.result)])
          line(fmt::format("m{}[{}] = {};", storage_value(op.result), storage_index(op.result), s));
      }
    }
  }

  // A scan: the other dims' loops outside, then one sequential loop along the scanned dim
  // carrying the running value through the combine function's ops (inlined). It is not
  // vectorised along the scanned dim (each element needs the one before); the compiler may
  // vectorise nothing here, so a scan costs about one combine per element and cycle. A float
  // cumsum along its array's contiguous dim is the exception: emit_simd_cumsum.
  void emit_scan(const ir::Op& op, const std::vector<int>& domain) {
    scalars_.clear();
    const ir::Combine& c = k_.combines[size_t(op.combine)];
    const ir::Value& r = k_.value(op.result);
    int sa = k_.value(op.inputs[0]).dims[size_t(op.dim)];
    const std::string& n = axis(sa);
    std::vector<int> outer;
    for (int a : domain)
      if (a != sa) outer.push_back(a);
    // A float cumsum accumulates in double, as torch's CPU cumsum of f32 does: each output is
    // the exact prefix sum rounded once, not N roundings in f32 (bf16 and f16, computed in f32,
    // too: more exact than torch's f32 accumulation for them).
    bool wide = ir::combine_binary(k_, c) == ir::BinaryFn::Add && is_floating(r.dtype);
    if (simd_cumsum(op)) {
      emit_simd_cumsum(op, sa, outer);
      return;
    }
    line(fmt::format("// {}: {} along {}{} (sequential)", at(op.loc), ir::scan_name(k_, c), n, op.reverse ? ", reversed" : ""));
    line("{");
    ++indent_;
    open_nest(outer, "", [](size_t) {});
    line(fmt::format("{} acc{}{{}};", wide ? "double" : ctype(r.dtype), op.result));
    if (op.reverse) line(fmt::format("for (int64_t i_{0} = n_{0} - 1; i_{0} >= 0; --i_{0}) {{", n));
    else line(fmt::format("for (int64_t i_{0} = 0; i_{0} < n_{0}; ++i_{0}) {{", n));
    ++indent_;
    std::string acc = fmt::format("acc{}", op.result);
    std::string x = convert(value(op.inputs[0]), k_.value(op.inputs[0]).dtype, r.dtype);
    line(fmt::format("if (i_{} == {}) {{", n, op.reverse ? fmt::format("n_{} - 1", n) : "0"));
    line(fmt::format("  {} = {};", acc, x));
    line("} else {");
    ++indent_;
    if (wide) {
      line(fmt::format("{0} = {0} + double({1});", acc, x));
    } else {
      scalars_[c.a] = acc;
      scalars_[c.b] = x;
      for (int o : c.ops) compute(k_.ops[size_t(o)]);
      line(fmt::format("{} = {};", acc, value(c.result)));
    }
    --indent_;
    line("}");
    line(fmt::format("m{}[{}] = {};", storage_value(op.result), storage_index(op.result), wide ? fmt::format("float({})", acc) : acc));
    --indent_;
    line("}");
    close_nest(outer, [](size_t) {});
    --indent_;
    line("}");
    scalars_.clear();
  }

  // Writes the row a streamed store computed into its buffer out to the tensor.
  void emit_stream_row(const StreamedStore& st) {
    const ir::Op& op = k_.op(st.op);
    auto r = range_.find(st.axis);
    std::string first = r == range_.end() ? "0" : r->second.first;
    std::string count = r == range_.end() ? "n_" + axis(st.axis) : fmt::format("{} - {}", r->second.second, first);
    ivar_[st.axis] = first;
    std::string at = address(op);
    ivar_.erase(st.axis);
    std::string buffer = stream_piece_.empty() ? at_index(row_buffer(op), first) : row_buffer(op);
    line(fmt::format("dt::stream_store({}, {}, {});", at_index(tensor_name(op.tensor), at), buffer, count));
  }

  static const char* reduce_clause(ir::ReduceFn f) {
    return f == ir::ReduceFn::Sum ? "+" : f == ir::ReduceFn::Max ? "max" : "min";
  }

  // A float cumsum along its result's contiguous dim: emit_simd_cumsum.
  bool simd_cumsum(const ir::Op& op) const { return is_row_cumsum(k_, op); }

  // Whether axis `a` is the last dim of value v's fast-memory array (its elements along `a` are
  // consecutive).
  bool contiguous_along(ir::ValueId v, int a) const {
    const std::vector<int>& dims = k_.value(v).dims;
    for (size_t i = dims.size(); i-- > 0;)
      if (dims[i] != ir::kOne) return dims[i] == a;
    return false;
  }

  // Where value v's row along axis `a` starts, when its elements there are consecutive f32s: an
  // f32 tensor read in place (a load at the block's own indices, its last dim `a` with stride 1)
  // or a fast-memory array (materialized); empty otherwise.
  std::string row_of(ir::ValueId v, int a) {
    v = source(v);
    if (k_.value(v).dtype != DType::f32) return "";
    ivar_[a] = "0";  // the row's first element
    std::string row;
    if (p_.materialized[size_t(v)]) {
      if (contiguous_along(v, a)) row = at_index(fmt::format("m{}", storage_value(v)), storage_index(v));
    } else if (const ir::Op* def = k_.def(v); def && def->kind == OpKind::Load) {
      if (row_in_tensor(*def, a)) row = at_index(tensor_name(def->tensor), address(*def));
    }
    ivar_.erase(a);
    return row;
  }
  // Whether open_nest makes a loop over axis a (not a dim of one element).
  bool loops_over(int a) const { return range_.count(a) || whole_.count(a) || p_.storage_extent(a) != 1; }
  // How far apart in elements the rows that row_of(v, .) finds are along axis a (outside the
  // row): "" where it has no such row, or the row does not move along a.
  std::string row_stride(ir::ValueId v, int a) {
    v = source(v);
    if (k_.value(v).dtype != DType::f32) return "";
    std::string st;
    if (p_.materialized[size_t(v)]) st = storage_stride(v, a);
    else if (const ir::Op* def = k_.def(v); def && def->kind == OpKind::Load) st = tensor_stride(*def, a);
    return st == "0" ? "" : st;
  }
  bool row_in_tensor(const ir::Op& op, int a) const { return along_f32_row(k_, op, a); }

  // A float cumsum along its array's contiguous dim, a row at a time, by dt::cumsum_f32_in_double
  // (SIMD prefix sums in double; deuteron_cpu.h says in which order it adds). It reads the row
  // where it is (an f32 tensor in place, or fast memory), or first writes the scanned values
  // into its destination; and where the plan found the next group storing the result
  // into an f32 tensor's rows, it writes there, so that the row crosses memory once (the store's
  // group then skips it). Into fast memory and out again in a separate pass measured 6.0 ms
  // against 2.8 ms at [8192, 2560]: the scan's chain and the copy's memory traffic do not
  // overlap across passes.
  void emit_simd_cumsum(const ir::Op& op, int sa, const std::vector<int>& outer) {
    const std::string& n = axis(sa);
    ir::ValueId res = op.result;
    auto fused = fused_store_.find(int(&op - k_.ops.data()));
    const ir::Op* store = fused == fused_store_.end() ? nullptr : &k_.ops[size_t(fused->second)];
    // The rows along the nest's last axis go 8 at a time to dt::cumsum_rows_f32_in_double where
    // the row read and the row written each move by a fixed stride along it.
    const int ra = outer.empty() ? -1 : outer.back();
    std::string src_rs, dst_rs;
    if (ra >= 0 && loops_over(ra)) {
      src_rs = row_stride(op.inputs[0], ra);
      dst_rs = store ? tensor_stride(*store, ra) : storage_stride(res, ra);
      if (dst_rs == "0") dst_rs.clear();
    }
    ivar_[sa] = "0";  // the row's first element
    std::string dst = store ? at_index(tensor_name(store->tensor), address(*store))
                            : at_index(fmt::format("m{}", storage_value(res)), storage_index(res));
    ivar_.erase(sa);
    std::string src = row_of(op.inputs[0], sa);
    const bool grouped = !src.empty() && !src_rs.empty() && !dst_rs.empty();
    line(fmt::format("// {}: cumsum along {}{} (in double, {} at a time){}", at(op.loc), n,
                     op.reverse ? ", reversed" : "", grouped ? "8 rows" : "SIMD prefix sums, a row",
                     store ? fmt::format(", into {}", tensor_name(store->tensor)) : ""));
    line("{");
    ++indent_;
    const std::vector<int> nest(outer.begin(), grouped ? outer.end() - 1 : outer.end());
    open_nest(nest, "", [](size_t) {});
    if (grouped) {
      const std::string& r = axis(ra);
      auto range = range_.find(ra);
      const std::string lo = range == range_.end() ? "0" : range->second.first;
      std::string hi = range == range_.end() ? "n_" + r : range->second.second;
      if (hi.find(' ') != std::string::npos) hi = "(" + hi + ")";
      line(fmt::format("for (int64_t i_{0} = {1}; i_{0} < {2}; i_{0} += 8) {{", r, lo, hi));
      const bool stream = store && p_.streamed_store(int(store - k_.ops.data()));
      line(fmt::format(
          "  dt::cumsum_rows_f32_in_double({}, {}, {}, {}, {} - i_{} < 8 ? {} - i_{} : 8, n_{}, {}{});", src,
          src_rs, dst, dst_rs, hi, r, hi, r, n, op.reverse ? "true" : "false",
          stream ? ", /*stream=*/true" : ""));
      line("}");
      close_nest(nest, [](size_t) {});
      --indent_;
      line("}");
      scalars_.clear();
      return;
    }
    if (src.empty()) {  // the scanned values are computed: into the destination first
      line("#pragma omp simd");
      line(fmt::format("for (int64_t i_{0} = 0; i_{0} < n_{0}; ++i_{0}) {{", n));
      ++indent_;
      std::string x = convert(value(op.inputs[0]), k_.value(op.inputs[0]).dtype, k_.value(res).dtype);
      line(fmt::format("{}[i_{}] = {};", dst.find(' ') == std::string::npos ? dst : "(" + dst + ")", n, x));
      --indent_;
      line("}");
      src = dst;
    }
    line(fmt::format("dt::cumsum_f32_in_double({}, {}, n_{}, {});", src, dst, n, op.reverse ? "true" : "false"));
    close_nest(nest, [](size_t) {});
    --indent_;
    line("}");
    scalars_.clear();
  }

  // The stores emit_simd_cumsum makes itself (CpuPlan::scan_stores): the results they store
  // need no fast memory.
  void fuse_scan_stores() {
    for (const auto& [scan, store] : p_.scan_stores) {
      fused_store_[scan] = store;
      fused_.insert(store);
      unstored_.insert(k_.op(scan).result);
    }
  }

  // Copies `from` (an expression per element) into the fast-memory array of `to`.
  void emit_copy(ir::ValueId to, ir::ValueId from, const char* why) {
    scalars_.clear();
    std::vector<int> dom;
    for (int d : k_.value(to).dims)
      if (d != ir::kOne) dom.push_back(d);
    line(fmt::format("// {}", why));
    line("{");
    ++indent_;
    open_nest(dom, dom.empty() ? "" : "#pragma omp simd", [](size_t) {});
    std::string v = value(from);
    line(fmt::format("m{}[{}] = {};", storage_value(to), storage_index(to), v));
    close_nest(dom, [](size_t) {});
    --indent_;
    line("}");
    scalars_.clear();
  }

  // Stages an operand into fast memory: a streamed one's block for this iteration (prefetching
  // the next ones), or a resident one's whole extent in the loop, once before the loop.
  void emit_block_copy(const plan::BlockSpec& s, const ir::Loop& l, bool resident) {
    if (p_.staging_of(s).shared) {
      line(fmt::format("// {}: packed by the team before its grid steps",
                       shown(k_.tensors[size_t(s.tensor)].name)));
      return;
    }
    if (p_.staging_of(s).dot >= 0) {
      emit_packed_copy(s, l, resident);
      return;
    }
    const ir::Op& op = k_.ops[size_t(s.op)];
    ir::ValueId v = op.result;
    scalars_.clear();
    std::vector<int> dom;
    for (int d : k_.value(v).dims)
      if (d != ir::kOne) dom.push_back(d);
    std::string name = shown(k_.tensors[size_t(op.tensor)].name);
    line(resident ? fmt::format("// stage all of {} this loop reads into fast memory, once", name)
                  : fmt::format("// stage this block of {} into fast memory", name));
    line("{");
    ++indent_;
    if (resident)
      for (int a : l.axes) {  // the loop's axes span their whole extent here
        line(fmt::format("const int64_t o_{0} = 0, n_{0} = {1};", axis(a), k_.axes[size_t(a)].extent));
        whole_.insert(a);
      }
    open_nest(dom, dom.empty() ? "" : "#pragma omp simd", [](size_t) {});
    line(fmt::format("m{}[{}] = {};", v, storage_index(v), load_expr(op)));
    close_nest(dom, [](size_t) {});
    if (resident) whole_.clear();
    else emit_prefetch(s, l, dom);
    --indent_;
    line("}");
    scalars_.clear();
  }

  // Prefetches the blocks the next `buffers - 1` iterations of the loop will stage.
  void emit_prefetch(const plan::BlockSpec& s, const ir::Loop& l, const std::vector<int>& dom) {
    const ir::Op& op = k_.ops[size_t(s.op)];
    if (s.buffers > 1 && !dom.empty() && !l.grid) {
      // Prefetch the blocks the next iterations will stage, one cache line at a time.
      int a = l.axes.front();
      std::vector<int> outer(dom.begin(), dom.end() - 1);
      open_nest(outer, "", [](size_t) {});
      int inner = dom.back();
      line(fmt::format("for (int64_t i_{0} = 0; i_{0} < n_{0}; i_{0} += 16) {{", axis(inner)));
      ++indent_;
      for (int ahead = 1; ahead < s.buffers; ++ahead) {
        line("{");
        ++indent_;
        line(fmt::format("const int64_t o_{0}_next = o_{0} + {1} * B_{0};", axis(a), ahead));
        std::string addr = address(op);
        // Re-point the loop's axis at the block `ahead` iterations on.
        std::string from = fmt::format("(o_{} + i_{})", axis(a), axis(a));
        std::string to = fmt::format("(o_{}_next + i_{})", axis(a), axis(a));
        for (size_t pos = addr.find(from); pos != std::string::npos; pos = addr.find(from, pos + to.size()))
          addr.replace(pos, from.size(), to);
        // Into L2 (prefetcht1): a whole next block brought into L1 would evict the current one.
        line(fmt::format("__builtin_prefetch(&{}[{}], 0, 2);", tensor_name(op.tensor), addr));
        --indent_;
        line("}");
      }
      --indent_;
      line("}");
      close_nest(outer, [](size_t) {});
    }
  }

  // ---- dots ----
  static const char* elem_of(DType t) {
    return t == DType::bf16 ? "dt::gemm::BF16" : t == DType::f16 ? "dt::gemm::F16" : "dt::gemm::F32";
  }
  std::string count(int a) const { return a == ir::kOne ? "1" : "n_" + axis(a); }
  // A dot operand's extent along an axis (its block, or a whole dim): a number, or in a general
  // variant a whole dim's E_<axis>, so the packed layout follows the call's sizes.
  Count extent_count(int a) const {
    if (a != ir::kOne && runtime_whole(a)) {
      if (!p_.persistent[size_t(a)]) throw std::logic_error("codegen: a dot over a looped dim");  // the plan refuses it
      return {1, {"E_" + axis(a)}};
    }
    return {a == ir::kOne ? 1 : p_.storage_extent(a), {}};
  }
  std::string extent_of(int a) const { return extent_count(a).text(); }
  // Elements between neighbours along `axis` in a tensor read by `op` (0 if it does not vary).
  std::string tensor_stride(const ir::Op& op, int a) const {
    int64_t st = 0;
    std::vector<std::string> named;
    for (size_t i = 0; i < op.index.size(); ++i)
      if (a != ir::kOne && op.index[i].kind == ir::Index::Kind::Axis && op.index[i].axis == a) {
        st += k_.tensors[size_t(op.tensor)].strides[i];
        named.push_back(stride(op.tensor, i));
      }
    if (!rt_ || named.empty()) return std::to_string(st);
    return named.size() == 1 ? named[0] : fmt::format("({})", fmt::join(named, " + "));
  }
  // The same for a value's array in fast memory.
  std::string storage_stride(ir::ValueId v, int a) const {
    ir::ValueId sv = storage_value(v);
    Count st;
    const auto& dims = k_.value(sv).dims;
    for (size_t i = dims.size(); i-- > 0;) {
      if (dims[i] == ir::kOne) continue;
      if (dims[i] == a) return st.text();
      st = product(st, storage_count(sv, dims[i]));
    }
    return "0";
  }
  // Where an operand's data starts at the current position, its rows and cols at 0.
  struct Src {
    std::string ptr, elem;
    std::string rs, cs;
  };
  Src tensor_src(const ir::Op& load, int rows, int cols) {
    for (int a : {rows, cols})
      if (a != ir::kOne) ivar_[a] = "0";
    Src s{at_index(tensor_name(load.tensor), address(load)),
          elem_of(k_.tensors[size_t(load.tensor)].dtype), tensor_stride(load, rows), tensor_stride(load, cols)};
    ivar_.clear();
    return s;
  }
  Src memory_src(ir::ValueId v, int rows, int cols) {
    for (int a : {rows, cols})
      if (a != ir::kOne) ivar_[a] = "0";
    Src s{at_index(fmt::format("m{}", storage_value(v)), storage_index(v)), "dt::gemm::F32",
          storage_stride(v, rows), storage_stride(v, cols)};
    ivar_.clear();
    return s;
  }
  // Floats of one packed 2-D slab of operand r (0 = a, 1 = b) of value `operand`: A in panels of
  // kDotMR rows, B in panels of dot_panel_columns() (packed_a_elements, packed_b_elements).
  Count slab2d(ir::ValueId operand, int r) const {
    const auto& d = k_.value(operand).dims;
    int rows = d[d.size() - 2], cols = d.back();
    return r == 0 ? product(rounded_up(extent_count(rows), kDotMR), extent_count(cols))
                  : product(extent_count(rows), rounded_up(extent_count(cols), dot_panel_columns()));
  }
  // Packs operand r's block (at the current position, batch dims at i_*) into `dst`; `pairs`:
  // as bf16 pairs where the CPU multiplies them (pack_*_pairs).
  // `panels`: ", first, end" to pack only those column panels of a b operand.
  void pack_call(const ir::Op& load, ir::ValueId operand, int r, const std::string& dst, bool pairs,
                 const std::string& panels = "") {
    const auto& d = k_.value(operand).dims;
    int rows = d[d.size() - 2], cols = d.back();
    Src src = tensor_src(load, rows, cols);
    std::string kstride = extent_of(r == 0 ? cols : rows);
    line(fmt::format("dt::gemm::pack_{}{}<{}>({}, {}, {}, {}, {}, {}, {}{});", r == 0 ? "a" : "b",
                     pairs ? "_pairs" : "", src.elem, src.ptr, src.rs, src.cs, count(rows), count(cols),
                     kstride, dst, panels));
  }
  // The columns of one packed slab of a shared copy (the pieces its team packs are their panels,
  // each over every block of the loop): a block of the loop's axis where the loop runs along
  // the columns.
  std::string shared_columns(const plan::BlockSpec& s) const {
    const Staging& st = p_.staging_of(s);
    const int cols = k_.value(k_.ops[size_t(st.dot)].inputs[size_t(st.dot_operand)]).dims.back();
    if (cols == k_.loops[size_t(s.loop)].axes.front()) return "B_" + axis(cols);
    return std::find(p_.grid_axes.begin(), p_.grid_axes.end(), cols) != p_.grid_axes.end() ? extent(cols)
                                                                                           : count(cols);
  }
  // A shared copy is packed outside the grid steps: the grid axes its operand uses (those of
  // one block, Staging::shared) are declared as their one block there.
  void one_block_grid_axes(const plan::BlockSpec& s) {
    for (int a : s.reuse_axes)
      line(fmt::format("const int64_t o_{0} = 0, n_{0} = {1};  // {0}: one grid block, the whole dim",
                       axis(a), extent(a)));
  }
  // Linear index of the operand's batch position (its non-one batch dims, at i_*) in slabs.
  std::string batch_slab(ir::ValueId operand) const {
    const auto& d = k_.value(operand).dims;
    std::string idx;
    for (size_t i = 0; i + 2 < d.size(); ++i) {
      if (d[i] == ir::kOne) continue;
      idx = idx.empty() ? "i_" + axis(d[i]) : plus(times(idx, extent_of(d[i])), "i_" + axis(d[i]));
    }
    return idx;
  }
  std::string reuse_key(const plan::BlockSpec& s) const {
    std::string key;
    for (int a : s.reuse_axes) {
      size_t i = size_t(std::find(p_.grid_axes.begin(), p_.grid_axes.end(), a) - p_.grid_axes.begin());
      key = key.empty() ? "b_" + axis(a) : fmt::format("({}) * {} + b_{}", key, p_.grid_blocks[i], axis(a));
    }
    return key.empty() ? "0" : key;
  }

  // Packs a dot operand's block (staged: this iteration's; resident: every block of the loop)
  // into fast memory in the micro-kernel's layout. A shared copy (Staging::shared) is packed
  // before the grid steps, a column panel at a time as the team claims them.
  void emit_packed_copy(const plan::BlockSpec& s, const ir::Loop& l, bool resident) {
    const ir::Op& load = k_.ops[size_t(s.op)];
    const Staging& st = p_.staging_of(s);
    const ir::Op& dop = k_.ops[size_t(st.dot)];
    ir::ValueId operand = dop.inputs[size_t(st.dot_operand)];
    ir::ValueId v = load.result;
    scalars_.clear();
    const std::string name = shown(k_.tensors[size_t(load.tensor)].name);
    if (st.shared) {
      line(fmt::format(
          "// pack every block of the loop of {} as operand b of the dot at {}, once for the team: each",
          name, at(dop.loc)));
      line("// thread packs the groups of column panels it claims, then waits for the rest (dt::SharedPack)");
      line(fmt::format("for (int64_t group = 0; shared{}.claim(&group); shared{}.packed()) {{", s.op, s.op));
    } else {
      line(fmt::format("// pack {} {} of {} into fast memory as operand {} of the dot at {}",
                       resident ? "every block" : "this block",
                       l.grid     ? "(for this grid step)"
                       : resident ? "of the loop"
                                  : "(stream)",
                       name, st.dot_operand == 0 ? "a" : "b", at(dop.loc)));
      line("{");
    }
    ++indent_;
    if (st.shared) one_block_grid_axes(s);
    if (s.reuse && !st.shared) {
      line(fmt::format("const int64_t key = {};", reuse_key(s)));
      line(fmt::format("if (tag{} != key) {{  // not already packed by this thread's previous grid step", s.op));
      ++indent_;
      line(fmt::format("tag{} = key;", s.op));
    }
    const auto& od = k_.value(operand).dims;
    std::string dst = fmt::format("m{}", v);
    int la = l.axes.front();
    bool blocks = resident && std::find(od.begin(), od.end(), la) != od.end();
    if (blocks) {
      const std::string& n = axis(la);
      line(fmt::format("for (int64_t o_{0} = 0, blk_{0} = 0; o_{0} < {1}; o_{0} += B_{0}, ++blk_{0}) {{", n,
                       k_.axes[size_t(la)].extent));
      ++indent_;
      line(fmt::format("const int64_t n_{0} = B_{0} < {1} - o_{0} ? B_{0} : {1} - o_{0};", n, k_.axes[size_t(la)].extent));
      dst = fmt::format("{} + blk_{} * {}", dst, n, st.slab_elements);
    }
    std::vector<int> batch;
    for (size_t i = 0; i + 2 < od.size(); ++i)
      if (od[i] != ir::kOne) batch.push_back(od[i]);
    open_nest(batch, "", [](size_t) {});
    std::string b = batch_slab(operand);
    pack_call(load, operand, st.dot_operand,
              b.empty() ? dst : fmt::format("{} + ({}) * {}", dst, b, slab2d(operand, st.dot_operand).text()),
              p_.gemm_for_op(st.dot)->bf16_pairs, st.shared ? kSharedPanels : "");
    close_nest(batch, [](size_t) {});
    if (blocks) {
      --indent_;
      line("}");
    }
    if (s.reuse && !st.shared) {
      --indent_;
      line("}");
    }
    if (!resident) {
      std::vector<int> dom;
      for (int d : k_.value(v).dims)
        if (d != ir::kOne) dom.push_back(d);
      emit_prefetch(s, l, dom);
    }
    --indent_;
    line("}");
    scalars_.clear();
  }

  // Whether `phi` is the accumulator of a dot that accumulates in its output's tile.
  bool in_output(ir::ValueId phi) const {
    return std::any_of(p_.gemms.begin(), p_.gemms.end(),
                       [&](const Gemm& d) { return d.out_store >= 0 && d.acc_phi == phi; });
  }
  // The store whose output tile holds accumulator `phi` for its epilogue to read (Gemm::out_epilogue).
  const ir::Op* output_tile(ir::ValueId phi) const {
    for (const Gemm& d : p_.gemms)
      if (d.out_epilogue && d.acc_phi == phi) return &k_.ops[size_t(d.out_store)];
    return nullptr;
  }
  // Whether load `op` reads a different block on each trip of loop `loop`: an index follows one of its axes.
  bool moves_with(const ir::Op& op, int loop) const {
    const std::vector<int>& axes = k_.loops[size_t(loop)].axes;
    return std::any_of(op.index.begin(), op.index.end(), [&](const ir::Index& e) {
      return e.kind == ir::Index::Kind::Axis && std::find(axes.begin(), axes.end(), e.axis) != axes.end();
    });
  }
  // Whether a one-axis loop runs at least one block: bounds known here, not read at run time.
  bool surely_runs(const ir::Loop& l) const {
    return !rt_ && l.begin[0].value < 0 && l.end[0].value < 0 && l.begin[0].constant < l.end[0].constant;
  }

  // A dot group: C (+)= A B per batch position, by the micro-kernel library. `no_blocks`: for a dot that
  // accumulates in its output's tile (Gemm::out_store), before its loop, the tile's zeros where the loop runs
  // no block.
  void emit_dot(const Gemm& d, bool no_blocks = false) {
    const ir::Op& op = k_.ops[size_t(d.op)];
    ir::ValueId r = op.result;
    const auto& rd = k_.value(r).dims;
    int m = rd[rd.size() - 2], n = rd.back();
    int kx = k_.value(op.inputs[0]).dims.back();
    const std::string& kaxis = axis(k_.loops[size_t(d.loop)].axes.front());
    scalars_.clear();
    if (no_blocks) {
      line(fmt::format("// {}: the loop runs no block of {}: the output's tile is the accumulator's zeros",
                       at(op.loc), kaxis));
      line(fmt::format("if (begin_{0} >= end_{0}) {{", kaxis));
    } else {
      line(fmt::format("// {}: a @ b{}: [{} x {}] @ [{} x {}] per block, f32 accumulation{}", at(op.loc),
                       op.inputs.size() > 2 ? " + acc" : "", m == ir::kOne ? "1" : axis(m),
                       kx == ir::kOne ? "1" : axis(kx), kx == ir::kOne ? "1" : axis(kx),
                       n == ir::kOne ? "1" : axis(n), d.out_store >= 0 ? ", in the output's tile" : ""));
      line("{");
    }
    ++indent_;
    bool accumulate = op.inputs.size() > 2;
    if (!no_blocks && accumulate && !(d.acc_phi >= 0 && op.inputs[2] == d.acc_phi))
      emit_copy(r, op.inputs[2], d.acc_phi >= 0 ? "the accumulator operand, computed in place" : "the accumulator operand");
    std::vector<int> batch;
    for (size_t i = 0; i + 2 < rd.size(); ++i)
      if (rd[i] != ir::kOne) batch.push_back(rd[i]);
    open_nest(batch, "", [](size_t) {});
    std::string views[2] = {"dt::gemm::AView{}", "dt::gemm::BView{}"};
    for (int x = 0; x < 2 && !no_blocks; ++x) {
      const GemmOperand& o = x == 0 ? d.a : d.b;
      const auto& od = k_.value(o.value).dims;
      int rows = od[od.size() - 2], cols = od.back();
      std::string kstride = extent_of(x == 0 ? cols : rows);
      const char* role = x == 0 ? "a" : "b";
      if (o.read == DotRead::Packed) {
        const plan::BlockSpec* s = p_.spec_for_op(o.load_op);
        std::string ptr = fmt::format("m{}", k_.ops[size_t(o.load_op)].result);
        if (s->placement == plan::Placement::Resident) {
          int la = k_.loops[size_t(s->loop)].axes.front();
          if (std::find(od.begin(), od.end(), la) != od.end())
            ptr += fmt::format(" + o_{0} / B_{0} * {1}", axis(la), p_.staging_of(*s).slab_elements);
        }
        std::string b = batch_slab(o.value);
        if (!b.empty()) ptr += fmt::format(" + ({}) * {}", b, slab2d(o.value, x).text());
        views[x] = fmt::format("dt::gemm::{}_packed{}({}, {})", role, d.bf16_pairs ? "_pairs" : "", ptr, kstride);
      } else if (o.read == DotRead::PackInGroup) {
        std::string buf = fmt::format("pack{}_{}", d.op, role);
        if (o.load_op >= 0) {
          pack_call(k_.ops[size_t(o.load_op)], o.value, x, buf, d.bf16_pairs);
        } else {
          // A computed value, from its f32 storage (rounded to bf16 pairs where the dot multiplies
          // them); one computed before the loop, on its first trip only (GemmOperand::pack_once).
          Src src = memory_src(o.source, rows, cols);
          std::string call = fmt::format("dt::gemm::pack_{}{}<dt::gemm::F32>({}, {}, {}, {}, {}, {}, {});", role,
                                         d.bf16_pairs ? "_pairs" : "", src.ptr, src.rs, src.cs, count(rows), count(cols),
                                         kstride, buf);
          if (o.pack_once) {
            std::vector<std::string> first;
            for (int a : k_.loops[size_t(d.loop)].axes) first.push_back(fmt::format("o_{0} == begin_{0}", axis(a)));
            call = fmt::format("if ({}) {}", fmt::join(first, " && "), call);
          }
          line(call);
        }
        views[x] = fmt::format("dt::gemm::{}_packed{}({}, {})", role, d.bf16_pairs ? "_pairs" : "", buf, kstride);
      } else {
        Src src = o.load_op >= 0 ? tensor_src(k_.ops[size_t(o.load_op)], rows, cols) : memory_src(o.source, rows, cols);
        // bf16 A in place: refine left it unpacked for the pair micro-kernel (Gemm::bf16_pairs).
        bool bf16 = x == 0 && o.load_op >= 0 && k_.tensors[size_t(k_.ops[size_t(o.load_op)].tensor)].dtype == DType::bf16;
        // An A whose block moves with the loop reads new rows from memory on every trip: its
        // panels prefetch the next one (AView::ahead).
        bool ahead = x == 0 && !bf16 && o.load_op >= 0 && moves_with(k_.ops[size_t(o.load_op)], d.loop);
        views[x] = x == 0 ? fmt::format("dt::gemm::a_in_place{}({}, {}, {}{})", bf16 ? "_bf16" : "", src.ptr,
                                        src.rs, src.cs, ahead ? ", true" : "")
                          : fmt::format("dt::gemm::b_in_place({}, {})", src.ptr, src.rs);
      }
    }
    std::string c, ldc, acc = accumulate ? "true" : "false";
    if (d.out_store >= 0) {
      Src out = tensor_src(k_.ops[size_t(d.out_store)], m, n);
      c = out.ptr;
      ldc = m == ir::kOne ? "0" : out.rs;
      acc = no_blocks ? "false" : fmt::format("o_{0} != begin_{0}", kaxis);  // the first block overwrites
    } else {
      for (int a : {m, n})
        if (a != ir::kOne) ivar_[a] = "0";
      c = at_index(fmt::format("m{}", storage_value(r)), storage_index(r));
      ldc = m == ir::kOne ? "0" : storage_stride(r, m);
      ivar_.clear();
    }
    std::string triangle = no_blocks || d.bf16_pairs ? "" : triangle_arg(*p_.dot_for_op(d.op), m, n, kx);
    line(fmt::format("dt::gemm::gemm({}, {}, {},", count(m), count(n), no_blocks ? "0" : count(kx)));
    line(fmt::format("               {},", views[0]));
    line(fmt::format("               {},", views[1]));
    line(fmt::format("               {}, {}, {}{});", c, ldc, acc, triangle));
    close_nest(batch, [](size_t) {});
    --indent_;
    line("}");
    scalars_.clear();
  }

  // The gemm's dt::gemm::Triangle argument for a causal product (plan::Dot::c_unused_above,
  // a_zero_above), its diagonals moved into the block's own indices, with a comment line for
  // each (emitted here, before the call); empty when it has none.
  std::string triangle_arg(const plan::Dot& pd, int m, int n, int kx) {
    auto local = [&](int64_t t, int col) {
      line(fmt::format("// causal: {} where {} - {} > {}",
                       col == n ? "C's tiles left out" : "a's zeros not multiplied", axis(col), axis(m), t));
      std::string diff = fmt::format("o_{} - o_{}", axis(m), axis(col));
      return t == 0 ? diff : fmt::format("{} {} {}", diff, t < 0 ? '-' : '+', t < 0 ? -t : t);
    };
    std::string c = "dt::gemm::kNoTriangle", a = c;
    if (pd.c_unused_above != plan::Dot::kNoTriangle) c = local(pd.c_unused_above, n);
    if (pd.a_zero_above != plan::Dot::kNoTriangle) a = local(pd.a_zero_above, kx);
    if (c == a) return "";
    return fmt::format(", dt::gemm::Triangle{{{}, {}}}", c, a);
  }

  // An inner loop's bound along `axis`: a constant, or computed on the device. A general
  // variant runs over the whole dim, whatever its size.
  std::string bound(const ir::Bound& b, int axis_id, bool is_end) {
    if (b.value < 0 && rt_) {
      if (b.constant == (is_end ? k_.axes[size_t(axis_id)].extent : 0)) return is_end ? extent(axis_id) : "0";
      throw ConfigError(fmt::format("kernel '{}': a general variant (any sizes) cannot run an inner loop over part of dim {}",
                                    k_.name, axis(axis_id)));
    }
    if (b.value < 0) return fmt::format("{}", b.constant);
    scalars_.clear();
    const ir::Op& op = k_.ops[size_t(k_.value(b.value).def_op)];
    if (op.kind == OpKind::TileBegin) return fmt::format("o_{}", axis(op.axis));
    if (op.kind == OpKind::TileEnd) return fmt::format("(o_{} + n_{})", axis(op.axis), axis(op.axis));
    return value(b.value);  // computed by the enclosing body (read from a tensor, arithmetic)
  }

  // Whether a group after a dot's loop may run in sub-tiles of the dot's N block: it maps
  // over that axis and reduces nothing (a reduction would need the whole block).
  bool subtile_eligible(const plan::Group& g) const {
    if (std::find(g.domain.begin(), g.domain.end(), p_.epilogue_axis) == g.domain.end()) return false;
    for (int o : g.ops)
      if (k_.ops[size_t(o)].kind == OpKind::Reduce || k_.ops[size_t(o)].kind == OpKind::Dot ||
          k_.ops[size_t(o)].kind == OpKind::Scan)
        return false;
    return true;
  }

  // Runs groups [first, last) of a body once per sub-tile of the epilogue axis.
  void emit_subtiled(const std::vector<plan::Item>& items, size_t first, size_t last) {
    int a = p_.epilogue_axis;
    const std::string& n = axis(a);
    int64_t sub = (p_.block[size_t(a)] + p_.epilogue_subtiles - 1) / p_.epilogue_subtiles;
    sub = std::max<int64_t>(16, (sub + 15) / 16 * 16);
    line(fmt::format("// epilogue in sub-tiles of {} along {}", sub, n));
    line(fmt::format("for (int64_t s_{0} = 0; s_{0} < n_{0}; s_{0} += {1}) {{", n, sub));
    ++indent_;
    line(fmt::format("const int64_t e_{0} = s_{0} + {1} < n_{0} ? s_{0} + {1} : n_{0};", n, sub));
    range_[a] = {"s_" + n, "e_" + n};
    for (size_t i = first; i < last; ++i) emit_group(items[i].group);
    range_.erase(a);
    --indent_;
    line("}");
  }

  bool hoisted(const plan::Group& g) const {
    return !g.ops.empty() && std::find(p_.hoisted.begin(), p_.hoisted.end(), g.ops.front()) != p_.hoisted.end();
  }

  void body(int loop_id) {
    const std::vector<plan::Item>& items = p_.bodies[size_t(loop_id)];
    bool after_dot = false;
    for (size_t ii = 0; ii < items.size(); ++ii) {
      const plan::Item& it = items[ii];
      if (!it.is_loop && hoisted(it.group)) continue;  // run before the grid steps
      if (!it.is_loop && all_fused(it.group)) continue;
      if (!it.is_loop) {
        if (after_dot && subtile_eligible(it.group)) {
          size_t last = ii;
          while (last < items.size() && !items[last].is_loop && subtile_eligible(items[last].group)) ++last;
          emit_subtiled(items, ii, last);
          ii = last - 1;
          continue;
        }
        emit_group(it.group);
        continue;
      }
      if (p_.epilogue_subtiles > 1 && p_.epilogue_axis >= 0)
        for (const Gemm& d : p_.gemms) after_dot = after_dot || d.loop == it.loop;
      const ir::Loop& l = k_.loops[size_t(it.loop)];
      for (const ir::Carried& c : l.carried) alias_[c.result] = c.phi;
      std::vector<std::string> names;
      for (int a : l.axes) names.push_back(axis(a));
      line(fmt::format("// {}: inner loop over {}", at(l.loc), fmt::join(names, ", ")));
      line("{");
      ++indent_;
      for (const ir::Carried& c : l.carried)
        if (!in_output(c.phi))
          emit_copy(
              c.phi, c.init,
              fmt::format("the value carried around {} starts as {}'s", at(l.loc), at_value(c.init)).c_str());
      for (const plan::BlockSpec& s : p_.operands)
        if (s.loop == it.loop && s.placement == plan::Placement::Resident) emit_block_copy(s, l, true);
      for (size_t i = 0; i < l.axes.size(); ++i) {
        const std::string& n = axis(l.axes[i]);
        line(fmt::format("const int64_t begin_{} = {}, end_{} = {};", n, bound(l.begin[i], l.axes[i], false), n,
                         bound(l.end[i], l.axes[i], true)));
      }
      for (const Gemm& d : p_.gemms)
        if (d.loop == it.loop && d.out_store >= 0 && !surely_runs(l)) emit_dot(d, true);
      for (size_t i = 0; i < l.axes.size(); ++i) {
        const std::string& n = axis(l.axes[i]);
        line(fmt::format("for (int64_t o_{0} = begin_{0}; o_{0} < end_{0}; o_{0} += B_{0}) {{", n));
        ++indent_;
        line(fmt::format("const int64_t n_{0} = B_{0} < end_{0} - o_{0} ? B_{0} : end_{0} - o_{0};", n));
      }
      for (const plan::BlockSpec& s : p_.operands)
        if (s.loop == it.loop && s.placement == plan::Placement::Staged) emit_block_copy(s, l, false);
      body(it.loop);
      for (const ir::Carried& c : l.carried)
        if (storage_value(source(c.next)) != c.phi) emit_copy(c.phi, c.next, fmt::format("{}'s value for the next iteration", at_value(c.next)).c_str());
      for (size_t i = 0; i < l.axes.size(); ++i) {
        --indent_;
        line("}");
      }
      --indent_;
      line("}");
    }
  }

 public:
  void prepare() {
    std::function<void(const std::vector<ir::Stmt>&)> walk = [&](const std::vector<ir::Stmt>& b) {
      for (const auto& s : b) {
        if (s.kind == ir::Stmt::Kind::Loop) {
          for (const ir::Carried& c : k_.loops[size_t(s.id)].carried) alias_[c.result] = c.phi;
          walk(k_.loops[size_t(s.id)].body);
        } else if (k_.ops[size_t(s.id)].kind == OpKind::Store) {
          stored_.insert(k_.ops[size_t(s.id)].tensor);
        }
      }
    };
    walk(k_.top);
    for (const Gemm& d : p_.gemms) {
      if (d.acc_phi >= 0) alias_[k_.ops[size_t(d.op)].result] = d.acc_phi;
      if (d.out_store >= 0 && !d.out_epilogue) fused_.insert(d.out_store);  // the dot writes the tile
    }
  }

 private:
  const CpuPlan& p_;
  const ir::Kernel& k_;
  const std::vector<IndexCheck> checks_;
  const std::vector<int> ordered_;  // tensors whose atomic adds are summed in a fixed order
  const bool rt_;                   // a general variant: sizes read at run time
  const bool trace_;                // time each grid step (GenerateOptions::trace)
  const std::string entry_;
  std::string out_;
  int indent_ = 0;
  std::map<ir::ValueId, std::string> scalars_;  // values computed as scalars in this group
  std::map<ir::ValueId, std::string> fixed_;    // values constant over the block being emitted
  std::map<ir::ValueId, ir::ValueId> alias_;  // loop results share their phi's storage
  std::set<int> stored_;
  std::map<int, std::string> ivar_;  // axis -> replacement of its loop variable
  std::map<int, std::string> origin_;  // grid axis -> what replaces its block origin o_<axis> (a sum)
  std::map<int, int> fused_store_;  // scan op -> the store op it makes (fuse_scan_stores)
  std::set<int> fused_;  // those store ops: their groups skip them
  std::set<int> skip_;   // ops of the group being emitted that ops_only_for found
  std::set<ir::ValueId> unstored_;  // the scans' results they store: not kept in fast memory
  std::set<int> whole_;  // axes spanning their whole extent here (a resident copy)
  std::map<int, std::pair<std::string, std::string>> range_;  // axis -> [lo, hi) of its block loop
  std::string stream_piece_;  // the first element of the piece of a row streaming out, if any
  std::map<ir::ValueId, std::string> reciprocal_;  // divisors whose reciprocal multiplies instead
  // Activations whose exponential a chunk buffer holds: the lane's element of it.
  std::map<ir::ValueId, std::string> chunk_exp_;
};

}  // namespace

std::string entry_name(const plan::Plan& p) { return "deuteron_" + runtime::identifier(p.kernel.name); }

std::vector<IndexCheck> index_checks(const plan::Plan& p) {
  std::vector<IndexCheck> out;
  for (size_t o = 0; o < p.kernel.ops.size(); ++o) {
    const ir::Op& op = p.kernel.ops[o];
    if (op.kind != OpKind::Load && op.kind != OpKind::Store) continue;
    for (size_t d = 0; d < op.index.size(); ++d) {
      const ir::Index& e = op.index[d];
      if (e.kind == ir::Index::Kind::Axis || e.value < 0) continue;
      const ir::HostTensor& t = p.kernel.tensors[size_t(op.tensor)];
      out.push_back({int(o), int(d), t.shape[d],
                     fmt::format("dim {} of {} (size {}), in a {} of kernel '{}' indexed with values it computed", d,
                                 t.name, t.shape[d], op.kind == OpKind::Load ? "read" : "write", p.kernel.name),
                     format_location(op.loc)});
    }
  }
  return out;
}

namespace {

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Drops `constexpr int64_t NAME = ...;` lines whose NAME occurs nowhere else: the generator
// declares every axis' constants, and a reader should not have to wonder what an unused one is.
std::string drop_unused_constants(const std::string& source) {
  static const std::string kDecl = "constexpr int64_t ", kRead = "const int64_t ";
  std::map<std::string, int> words;
  for (size_t i = 0; i < source.size();) {
    if (!is_word_char(source[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < source.size() && is_word_char(source[j])) ++j;
    ++words[source.substr(i, j - i)];
    i = j;
  }
  std::string out;
  for (size_t start = 0; start < source.size();) {
    size_t end = source.find('\n', start);
    if (end == std::string::npos) end = source.size();
    std::string line = source.substr(start, end - start);
    start = end + 1;
    size_t decl = line.find(kDecl);
    if (decl != std::string::npos && line.find_first_not_of(' ') == decl) {
      size_t name_at = decl + kDecl.size();
      std::string name = line.substr(name_at, line.find(' ', name_at) - name_at);
      if (words[name] == 1) continue;
    }
    // A general variant's size read from `sizes` (or copied from an extent) that nothing uses.
    size_t read = line.find(kRead);
    bool size = line.find("= sizes[") != std::string::npos || line.find("= E_") != std::string::npos;
    if (read != std::string::npos && line.find_first_not_of(' ') == read && size) {
      size_t name_at = read + kRead.size();
      std::string name = line.substr(name_at, line.find(' ', name_at) - name_at);
      if (words[name] == 1) continue;
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace


int64_t scratch_per_thread(const plan::Plan& p) {
  int64_t bytes = (p.fast_memory_bytes + 63) / 64 * 64;
  for (int t : ordered_targets(p.kernel)) bytes += (p.kernel.tensors[size_t(t)].numel() * 4 + 63) / 64 * 64;
  return bytes;
}

std::string generate(const CpuPlan& p, const GenerateOptions& o) {
  Generator g(p, o);
  g.prepare();
  return drop_unused_constants(g.run());
}

}  // namespace deuteron::cpu
