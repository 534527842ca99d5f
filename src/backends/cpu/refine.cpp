#include "backends/cpu/refine.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/cpu/hardware.h"
#include "backends/cpu/packing.h"
#include "backends/cpu/space.h"
#include "deuteron/error.h"

namespace deuteron::cpu {

const char* name(DotRead r) {
  switch (r) {
    case DotRead::InPlace: return "in place";
    case DotRead::Packed: return "packed copy";
    case DotRead::PackInGroup: return "packed by the dot";
  }
  return "?";
}

const Gemm* CpuPlan::gemm_for_op(int op) const {
  for (const Gemm& g : gemms)
    if (g.op == op) return &g;
  return nullptr;
}

const StreamedStore* CpuPlan::streamed_store(int op) const {
  for (const StreamedStore& s : streamed)
    if (s.op == op) return &s;
  return nullptr;
}

std::vector<RowPrefetch> CpuPlan::prefetches_of(const plan::Group& g) const {
  std::vector<RowPrefetch> out;
  for (const RowPrefetch& r : prefetches)
    if (!g.ops.empty() && r.group_op == g.ops.front()) out.push_back(r);
  return out;
}

std::vector<KeptValue> CpuPlan::kept_in(const plan::Group& g) const {
  std::vector<KeptValue> out;
  for (const KeptValue& kv : kept)
    for (int o : g.ops)
      if (kernel.op(o).result == kv.again) out.push_back(kv);
  return out;
}

bool is_row_cumsum(const ir::Kernel& k, const ir::Op& scan) {
  if (scan.kind != ir::OpKind::Scan) return false;
  const ir::Combine& c = k.combines[size_t(scan.combine)];
  const std::vector<int>& dims = k.value(scan.result).dims;
  const int along = k.value(scan.inputs[0]).dims[size_t(scan.dim)];
  int last = -1;  // the value's contiguous dim in its fast-memory array
  for (size_t i = dims.size(); i-- > 0 && last < 0;)
    if (dims[i] != ir::kOne) last = dims[i];
  return ir::combine_binary(k, c) == ir::BinaryFn::Add && is_floating(k.value(scan.result).dtype) &&
         last == along;
}

bool along_f32_row(const ir::Kernel& k, const ir::Op& op, int a) {
  const ir::HostTensor& t = k.tensors[size_t(op.tensor)];
  if (t.dtype != DType::f32 || op.index.empty() || t.strides.back() != 1 || op.atomic_add) return false;
  for (const ir::Index& e : op.index)
    if (e.kind == ir::Index::Kind::Gather || (e.kind == ir::Index::Kind::Scalar && e.value >= 0))
      return false;
  return op.index.back().kind == ir::Index::Kind::Axis && op.index.back().axis == a;
}

std::vector<int> streamable_stores(const ir::Kernel& k) {
  std::vector<int> loop_of = ir::loop_of_ops(k);  // -1: dead
  std::vector<int> accesses(k.tensors.size(), 0);
  for (size_t o = 0; o < k.ops.size(); ++o)
    if (loop_of[o] >= 0 && (k.ops[o].kind == ir::OpKind::Load || k.ops[o].kind == ir::OpKind::Store))
      ++accesses[size_t(k.ops[o].tensor)];
  std::vector<int> out;
  for (size_t o = 0; o < k.ops.size(); ++o) {
    const ir::Op& op = k.ops[o];
    if (loop_of[o] < 0 || op.kind != ir::OpKind::Store || op.atomic_add || op.index.empty()) continue;
    const ir::HostTensor& t = k.tensors[size_t(op.tensor)];
    if (t.role != ir::HostRole::Output || accesses[size_t(op.tensor)] != 1 || t.strides.back() != 1) continue;
    bool plain = std::all_of(op.index.begin(), op.index.end(), [](const ir::Index& e) {
      return e.kind == ir::Index::Kind::Axis && e.offset == 0;
    });
    if (plain) out.push_back(int(o));
  }
  return out;
}

namespace {

std::vector<int> non_one(const std::vector<int>& dims) {
  std::vector<int> out;
  for (int d : dims)
    if (d != ir::kOne) out.push_back(d);
  return out;
}

}  // namespace

int accumulator_store(const ir::Kernel& k, int loop, const ir::Carried& c) {
  const ir::Loop& l = k.loop(loop);
  const ir::Op* init = k.def(c.init);
  const bool zeros = init && init->kind == ir::OpKind::Full && init->axis < 0 && init->number.real == 0.0 &&
                     init->number.integer == 0;
  const std::vector<int> uses = ir::use_counts(k);
  if (!zeros || l.axes.size() != 1 || uses[size_t(c.phi)] != 1 || uses[size_t(c.next)] != 1) return -1;
  // Whether v is computed from the accumulator's final value.
  std::map<ir::ValueId, bool> memo;
  std::function<bool(ir::ValueId)> from_acc = [&](ir::ValueId v) -> bool {
    if (v == c.result) return true;
    if (auto m = memo.find(v); m != memo.end()) return m->second;
    const int def = k.value(v).def_op;
    bool r = false;
    if (def >= 0)
      for (ir::ValueId in : k.op(def).inputs) r = r || from_acc(in);
    return memo[v] = r;
  };
  const std::vector<int> acc_axes = non_one(k.value(c.result).dims);
  for (int o : streamable_stores(k)) {
    const ir::Op& st = k.op(o);
    std::vector<int> axes;
    for (const ir::Index& e : st.index) axes.push_back(e.axis);
    if (k.tensors[size_t(st.tensor)].dtype == DType::f32 && axes == acc_axes && from_acc(st.inputs[0]))
      return o;
  }
  return -1;
}

namespace {

// Bytes of a value's element in the generated code: bf16/f16/i32 are computed as 32-bit.
int64_t cpp_size(DType t) {
  switch (t) {
    case DType::i64: return 8;
    case DType::boolean: return 1;
    default: return 4;
  }
}

int64_t round64(int64_t b) { return (b + 63) / 64 * 64; }

class Refiner {
 public:
  Refiner(const plan::Plan& base, std::optional<config::TargetLimits> limits) : limits_(limits) {
    static_cast<plan::Plan&>(p_) = base;
  }

  CpuPlan run() {
    const config::Config& c = p_.config;
    p_.threads = c.has(kNumThreads) ? int(c.integer(kNumThreads)) : 1;
    if (c.has(kGridGroup)) p_.grid_group = std::max<int64_t>(1, c.integer(kGridGroup));
    if (c.has(kEpilogueSubtiles)) p_.epilogue_subtiles = int(std::max<int64_t>(1, c.integer(kEpilogueSubtiles)));
    p_.staging.assign(p_.operands.size(), Staging{});
    epilogue_axis();
    if (c.has(kStores) && c.text(kStores) == kStoresStream) streamed_stores();
    row_prefetches();
    epilogue_prefetches();
    hoist_invariant_groups();
    keep_recomputed_values();
    for (const plan::Dot& d : p_.dots) p_.gemms.push_back(gemm(d));
    for (Gemm& g : p_.gemms) {
      // A bf16 tensor read packed, or a computed bf16 value (attention's p.to(v.dtype())), whose
      // f32 storage the dot packs as pairs.
      auto bf16_packed = [&](const GemmOperand& x) {
        if (x.load_op < 0) return k().value(x.value).dtype == DType::bf16;
        return x.read != DotRead::InPlace && k().tensors[size_t(k().op(x.load_op).tensor)].dtype == DType::bf16;
      };
      g.bf16_pairs = bf16_packed(g.a) && bf16_packed(g.b);
      for (int r = 0; r < 2 && g.bf16_pairs; ++r) {
        GemmOperand& x = r == 0 ? g.a : g.b;
        if (x.load_op >= 0 || x.read != DotRead::InPlace) continue;
        const std::vector<int>& vd = k().value(x.value).dims;
        int64_t rows = extent_of(vd[vd.size() - 2]), cols = extent_of(vd.back());
        x.read = DotRead::PackInGroup;
        x.pack_elements = r == 0 ? packed_a_elements(rows, cols) : packed_b_elements(rows, cols);
      }
      // A bf16 A block the dot would pack every time it runs is read in place instead when K
      // is contiguous: its 32-bit words are already pairs of K steps (the runtime packs what
      // it cannot read so, panel by panel, and widens it where the CPU has no vdpbf16ps).
      if (g.bf16_pairs && g.a.read == DotRead::PackInGroup && g.a.load_op >= 0) {
        const std::vector<int>& vd = k().value(g.a.value).dims;
        if (vd.back() != ir::kOne && stride_along(k().op(g.a.load_op), vd.back()) == 1) {
          g.a.read = DotRead::InPlace;
          g.a.pack_elements = 0;
        }
      }
    }
    const std::vector<int> loop_of = ir::loop_of_ops(k());
    for (Gemm& g : p_.gemms)
      for (GemmOperand* x : {&g.a, &g.b})
        x->pack_once = x->read == DotRead::PackInGroup && computed_before(*x, g.loop, loop_of);
    accumulate_in_outputs();
    fuse_scan_stores();
    scratch();
    return std::move(p_);
  }

 private:
  const ir::Kernel& k() const { return p_.kernel; }
  bool grid_axis(int axis) const {
    const std::vector<int>& g = k().grid_loop().axes;
    return std::find(g.begin(), g.end(), axis) != g.end();
  }

  // Whether dot operand x is a value computed before loop `loop` starts (outside it and the
  // loops in it: not one it carries), held in one slab per block (no batch dim blocked wider
  // than 1), so that one packing serves all the loop's trips.
  // loop_of: ir::loop_of_ops.
  bool computed_before(const GemmOperand& x, int loop, const std::vector<int>& loop_of) const {
    int def = k().value(x.source).def_op;
    if (x.load_op >= 0 || def < 0 || loop < 0) return false;
    int at = loop_of[size_t(def)];
    for (int l = at; l >= 0; l = k().loop(l).parent)
      if (l == loop) return false;
    const std::vector<int>& vd = k().value(x.value).dims;
    for (size_t i = 0; i + 2 < vd.size(); ++i)
      if (extent_of(vd[i]) != 1) return false;
    return at >= 0;
  }

  // Whether the rows of a tiled store's output tile compete for more L2 ways than a set has.
  // Rows a multiple of 4 KiB apart fall into a few sets only (l2_bytes / l2_ways apart wraps
  // around them); past the ways the tile leaves the L2 between the blocks of K that add to it.
  // It then accumulates in fast memory, compact, and is copied out once. matmul 2048^3 on a
  // Zen 3 (512 KiB of 8-way L2, rows 8 KiB apart: 16 of a 128-row tile per set), two threads,
  // 26 alternating rounds against the output's tile: faster in 21, about 0.97x the time.
  // A tile larger than the L2 leaves it whatever its sets (BLIS's C): no collision to avoid.
  bool tile_rows_collide(const ir::Op& store, const std::vector<int>& axes) const {
    if (axes.size() < 2) return false;
    const int rows_axis = axes[axes.size() - 2], cols_axis = axes.back();
    const int64_t elem = int64_t(dtype_size(k().tensors[size_t(store.tensor)].dtype));
    const int64_t row_bytes = stride_along(store, rows_axis) * elem;
    const int64_t set_span = cpu_info().l2_bytes / std::max<int64_t>(cpu_info().l2_ways, 1);
    if (row_bytes <= 0 || set_span < 64) return false;
    const int64_t rows = std::min(p_.block[size_t(rows_axis)], extent_of(rows_axis));
    const int64_t row_lines = (std::min(p_.block[size_t(cols_axis)], extent_of(cols_axis)) * elem + 63) / 64;
    if (rows * row_lines * 64 > cpu_info().l2_bytes) return false;
    // The sets the rows' first lines fall into, and those their other lines follow into.
    const int64_t first_sets = std::min(set_span / std::gcd(row_bytes, set_span), set_span / 64);
    const int64_t sets = std::min(first_sets * row_lines, set_span / 64);
    return (rows * row_lines + sets - 1) / sets > cpu_info().l2_ways;
  }

  // Gemm::out_store: a dot whose accumulator starts as zeros and whose final value a plain store
  // writes out, or an epilogue writes over in place (Gemm::out_epilogue), accumulates in the
  // output's tile. Its accumulator then needs no fast memory.
  void accumulate_in_outputs() {
    const std::vector<int> uses = ir::use_counts(k());
    for (Gemm& g : p_.gemms) {
      const ir::Loop& l = k().loop(g.loop);
      const ir::Carried* c = nullptr;
      for (const ir::Carried& x : l.carried)
        if (x.phi == g.acc_phi) c = &x;
      if (!c || g.acc_inline || c->next != k().op(g.op).result) continue;
      const int o = accumulator_store(k(), g.loop, *c);
      if (o < 0 || p_.streamed_store(o)) continue;
      const ir::Op& st = k().op(o);
      const bool plain = st.inputs[0] == c->result && uses[size_t(c->result)] == 1;
      if (!plain && (!epilogue_in_place(l, *c, o) || !too_large_to_keep(c->result))) continue;
      if (tile_rows_collide(st, non_one(k().value(c->result).dims))) {
        g.out_store_collides = o;
        continue;
      }
      g.out_store = o;
      g.out_epilogue = !plain;
      for (ir::ValueId v : {c->phi, c->next, c->result}) p_.materialized[size_t(v)] = false;
      // Nothing is left to prefetch for writing: the micro-kernel writes the tile.
      std::erase_if(p_.prefetches, [&](const RowPrefetch& r) { return r.op == o; });
    }
  }

  // Whether an accumulator's tile is too large to keep compact in fast memory beside the dot's
  // operands: more than half the L2. Only then does an epilogue read it from the output's tile.
  // The epilogue reads the accumulator once more either way, so the output saves only the zero
  // fill, while its rows, far apart, cost more than a compact copy: epilogue_subtiling 1024^3 in
  // tiles of 128 x 64 ran 1.03-1.06x the time (Zen 3, two runs of 200 paired calls). Goto's order
  // (a tile of whole rows of N) needs it.
  bool too_large_to_keep(ir::ValueId acc) const {
    int64_t bytes = int64_t(sizeof(float));
    for (int a : non_one(k().value(acc).dims)) bytes *= std::min(p_.block[size_t(a)], extent_of(a));
    return bytes > cpu_info().l2_bytes / 2;
  }

  // An op whose result element depends only on its inputs' elements at the same place.
  static bool maps_elements(const ir::Op& op) {
    return op.kind == ir::OpKind::Unary || op.kind == ir::OpKind::Binary || op.kind == ir::OpKind::Where ||
           op.kind == ir::OpKind::Cast;
  }

  // Whether store o can write over the output tile that holds the final value of accumulator c
  // (carried around dot loop l) while its epilogue reads it there: o's group, in the body around
  // l, maps over the accumulator's own axes and reads it only through elementwise ops at the
  // same element, none of them after o; no later group or loop of that body reads it.
  bool epilogue_in_place(const ir::Loop& l, const ir::Carried& c, int o) const {
    if (l.parent < 0) return false;
    const std::vector<int> acc_axes = non_one(k().value(c.result).dims);
    bool elementwise = true;
    std::map<ir::ValueId, bool> memo;
    // Whether value v is the accumulator or computed from it inline (not kept in fast memory).
    std::function<bool(ir::ValueId)> from_acc = [&](ir::ValueId v) -> bool {
      if (v == c.result) return true;
      if (p_.materialized[size_t(v)]) return false;
      if (auto m = memo.find(v); m != memo.end()) return m->second;
      const int def = k().value(v).def_op;
      bool r = false;
      if (def >= 0)
        for (ir::ValueId in : k().op(def).inputs) r = from_acc(in) || r;
      if (r)
        elementwise = elementwise && non_one(k().value(v).dims) == acc_axes && maps_elements(k().op(def));
      return memo[v] = r;
    };
    auto reads_acc = [&](int op) {
      bool r = false;
      for (ir::ValueId in : k().op(op).inputs) r = from_acc(in) || r;
      return r;
    };
    const std::vector<int> loop_of = ir::loop_of_ops(k());
    auto inside = [&](int op, int loop) {
      for (int at = loop_of[size_t(op)]; at >= 0; at = k().loop(at).parent)
        if (at == loop) return true;
      return false;
    };
    bool past = false;  // past o's group
    for (const plan::Item& it : p_.bodies[size_t(l.parent)]) {
      if (it.is_loop) {
        if (past)
          for (int op = 0; op < int(k().ops.size()); ++op)
            if (inside(op, it.loop) && reads_acc(op)) return false;
        continue;
      }
      const std::vector<int>& ops = it.group.ops;
      auto at_o = std::find(ops.begin(), ops.end(), o);
      if (past || at_o == ops.end()) {
        if (past && std::any_of(ops.begin(), ops.end(), reads_acc)) return false;
        continue;
      }
      if (non_one(it.group.domain) != acc_axes) return false;
      for (auto op = ops.begin(); op != ops.end(); ++op)
        if (op != at_o && reads_acc(*op) && (op > at_o || !maps_elements(k().op(*op)))) return false;
      if (!reads_acc(o)) return false;
      past = true;
    }
    return past && elementwise;
  }

  // Epilogue sub-tiling applies along the N dim of a dot in a loop directly inside the grid.
  void epilogue_axis() {
    for (const plan::Dot& d : p_.dots) {
      const ir::Loop& l = k().loop(d.loop);
      int n = k().value(k().op(d.op).result).dims.back();
      if (p_.epilogue_axis < 0 && !l.grid && l.parent >= 0 && k().loop(l.parent).grid && n != ir::kOne && grid_axis(n))
        p_.epilogue_axis = n;
    }
  }

  // The tensor stride a load steps by along `axis` (the sum where several dims index it).
  int64_t stride_along(const ir::Op& load, int axis) const {
    int64_t stride = 0;
    for (size_t i = 0; i < load.index.size(); ++i)
      if (load.index[i].kind == ir::Index::Kind::Axis && load.index[i].axis == axis)
        stride += k().tensors[size_t(load.tensor)].strides[i];
    return stride;
  }

  int64_t extent_of(int axis) const { return axis == ir::kOne ? 1 : p_.storage_extent(axis); }

  // The streamable stores whose group runs along their row (the tensor's contiguous last dim
  // is the group's innermost loop), in rows long enough to hold a cache line.
  void streamed_stores() {
    std::vector<int> ok = streamable_stores(k());
    for (const std::vector<plan::Item>& body : p_.bodies)
      for (const plan::Item& it : body) {
        if (it.is_loop || it.group.domain.empty()) continue;
        for (int o : it.group.ops) {
          if (std::find(ok.begin(), ok.end(), o) == ok.end()) continue;
          int row = k().op(o).index.back().axis;
          if (it.group.domain.back() != row || extent_of(row) < 16) continue;
          p_.streamed.push_back({o, row, extent_of(row)});
        }
      }
  }

  // The Load ops whose elements group g reads from their tensors: its ops' inputs, through
  // views and the values it computes inline (those not kept in fast memory).
  std::set<int> loads_of(const plan::Group& g) const {
    std::set<int> out;
    std::function<void(ir::ValueId)> visit = [&](ir::ValueId v) {
      v = ir::strip_views(k(), v);
      int def = k().value(v).def_op;
      if (p_.materialized[size_t(v)] || def < 0) return;
      if (k().op(def).kind == ir::OpKind::Load) {
        out.insert(def);
        return;
      }
      for (ir::ValueId in : k().op(def).inputs) visit(in);
    };
    for (int o : g.ops)
      for (ir::ValueId in : k().op(o).inputs) visit(in);
    return out;
  }

  // Whether group g can prefetch the lines of access `op`: plain indices by g's axes, g's
  // innermost axis (not a grid axis: a row within the block) along the tensor's contiguous dim,
  // rows long enough for a chunked loop, and a block small enough to stay cached until used.
  bool prefetchable(const ir::Op& op, const plan::Group& g) const {
    if (g.domain.empty() || op.index.empty() || op.atomic_add) return false;
    const ir::HostTensor& t = k().tensors[size_t(op.tensor)];
    int64_t bytes = dtype_size(t.dtype);
    for (const ir::Index& e : op.index) {
      if (e.kind != ir::Index::Kind::Axis || e.offset != 0 ||
          std::find(g.domain.begin(), g.domain.end(), e.axis) == g.domain.end())
        return false;
      bytes *= extent_of(e.axis);
    }
    int inner = g.domain.back();
    const std::vector<int>& grid = p_.grid_axes;
    return op.index.back().axis == inner && std::find(grid.begin(), grid.end(), inner) == grid.end() &&
           t.strides.back() == 1 && extent_of(inner) >= 128 && bytes <= kPrefetchBlockBytes;
  }

  // Kernels without dots, whose grid step is a sequence of passes over its block (in inner
  // loops over its columns too: softmax_two_pass): see RowPrefetch.
  void row_prefetches() {
    if (!p_.dots.empty() || p_.grid_axes.empty()) return;
    int fast = p_.grid_axes.back();  // consecutive grid steps differ along it
    std::map<int, int> readers;      // tensor -> passes that have read it so far
    std::set<int> prefetched;        // tensors prefetched for the next step
    std::function<void(const std::vector<plan::Item>&)> walk = [&](const std::vector<plan::Item>& body) {
      for (size_t i = 0; i < body.size(); ++i) {
        if (body[i].is_loop) {
          walk(p_.bodies[size_t(body[i].loop)]);
          continue;
        }
        const plan::Group& g = body[i].group;
        std::set<int> seen;  // tensors this pass reads
        for (int l : loads_of(g)) {
          const ir::Op& op = k().op(l);
          bool by_fast = std::any_of(op.index.begin(), op.index.end(),
                                     [&](const ir::Index& e) { return e.kind == ir::Index::Kind::Axis && e.axis == fast; });
          if (readers[op.tensor] == 1 && by_fast && !prefetched.count(op.tensor) && prefetchable(op, g)) {
            p_.prefetches.push_back({g.ops.front(), l, true});
            prefetched.insert(op.tensor);
          }
          // A gather (cross_entropy's label logit) reads a few elements, not the block: the
          // next pass over the rows is still the second read of the block.
          bool gathers = std::any_of(op.index.begin(), op.index.end(),
                                     [](const ir::Index& e) { return e.kind == ir::Index::Kind::Gather; });
          if (!gathers) seen.insert(op.tensor);
        }
        for (int t : seen) ++readers[t];
        for (int o : g.ops) {
          const ir::Op& op = k().op(o);
          if (op.kind != ir::OpKind::Store || p_.streamed_store(o) || !prefetchable(op, g)) continue;
          for (size_t j = i; j-- > 0;)
            if (!body[j].is_loop && body[j].group.domain == g.domain && !body[j].group.ops.empty()) {
              p_.prefetches.push_back({body[j].group.ops.front(), o, false});
              break;
            }
        }
      }
    };
    walk(p_.bodies[size_t(&k().grid_loop() - k().loops.data())]);
  }

  // A dot's epilogue (see RowPrefetch::rows_ahead): the passes over several rows that follow a
  // dot's loop in the grid step, and the tensors they read along a row of the tile at plain indices.
  void epilogue_prefetches() {
    const std::vector<plan::Item>& body = p_.bodies[size_t(&k().grid_loop() - k().loops.data())];
    bool after_dot = false;
    for (const plan::Item& it : body) {
      if (it.is_loop) {
        after_dot = after_dot || std::any_of(p_.dots.begin(), p_.dots.end(),
                                             [&](const plan::Dot& d) { return d.loop == it.loop; });
        continue;
      }
      const plan::Group& g = it.group;
      if (!after_dot || g.domain.size() < 2 || g.ops.empty()) continue;
      int row = g.domain[g.domain.size() - 2], inner = g.domain.back();
      if (!grid_axis(row)) continue;
      for (int l : loads_of(g)) {
        const ir::Op& op = k().op(l);
        const ir::HostTensor& t = k().tensors[size_t(op.tensor)];
        bool plain = std::all_of(op.index.begin(), op.index.end(), [&](const ir::Index& e) {
          return e.kind == ir::Index::Kind::Axis && e.offset == 0;
        });
        if (plain && op.index.size() >= 2 && op.index.back().axis == inner &&
            op.index[op.index.size() - 2].axis == row && t.strides.back() == 1 &&
            extent_of(inner) * dtype_size(t.dtype) >= 256)
          p_.prefetches.push_back({g.ops.front(), l, false, kEpilogueRowsAhead});
      }
    }
  }

  // See CpuPlan::hoisted. An op depends on no grid index when its dims hold no grid axis, its
  // inputs depend on none, and, for a load, it reads a tensor the kernel never writes at indices
  // no grid axis drives. Ops in inner loops, carried values, dots, scans and stores count as
  // depending on the grid (they are never hoisted).
  void hoist_invariant_groups() {
    const ir::Kernel& kk = k();
    const ir::Loop& grid = kk.grid_loop();
    std::set<int> written;
    for (const ir::Op& op : kk.ops)
      if (op.kind == ir::OpKind::Store) written.insert(op.tensor);
    std::vector<bool> invariant(kk.values.size(), false);
    auto op_invariant = [&](const ir::Op& op) {
      switch (op.kind) {
        case ir::OpKind::Dot:
        case ir::OpKind::Scan:
        case ir::OpKind::Store:
          return false;
        case ir::OpKind::TileIndex:
        case ir::OpKind::TileBegin:
        case ir::OpKind::TileEnd:
        case ir::OpKind::TileSize:
          if (grid_axis(op.axis)) return false;
          break;
        case ir::OpKind::Load:
          if (written.count(op.tensor)) return false;
          for (const ir::Index& e : op.index)
            if (e.kind == ir::Index::Kind::Axis ? grid_axis(e.axis) : e.value >= 0 && !invariant[size_t(e.value)]) return false;
          break;
        default: break;
      }
      for (ir::ValueId in : op.inputs)
        if (!invariant[size_t(in)]) return false;
      const std::vector<int>& dims = kk.value(op.result).dims;
      return std::none_of(dims.begin(), dims.end(), [&](int a) { return grid_axis(a); });
    };
    for (const ir::Stmt& st : grid.body)
      if (st.kind == ir::Stmt::Kind::Op) {
        const ir::Op& op = kk.op(st.id);
        if (op.result >= 0) invariant[size_t(op.result)] = op_invariant(op);
      }
    for (const plan::Item& it : p_.bodies[size_t(&grid - kk.loops.data())]) {
      if (it.is_loop || it.group.ops.empty()) continue;
      bool all = std::all_of(it.group.ops.begin(), it.group.ops.end(), [&](int o) {
        const ir::Op& op = kk.op(o);
        return op.result >= 0 && invariant[size_t(op.result)];
      });
      if (all) p_.hoisted.push_back(it.group.ops.front());
    }
  }

  // Whether inner loop l runs its one axis in one trip: from 0 to the extent, in one block.
  bool one_trip(int l) const {
    const ir::Loop& loop = k().loop(l);
    if (loop.grid || loop.axes.size() != 1) return false;
    int a = loop.axes[0];
    int64_t extent = k().axis(a).extent;
    return loop.begin[0].value < 0 && loop.begin[0].constant == 0 && loop.end[0].value < 0 &&
           loop.end[0].constant == extent && p_.block[size_t(a)] >= extent;
  }

  // What same_computation found: the row values that must match, and whether the value is worth
  // keeping (a transcendental function: a load or an add is as cheap to redo as to read).
  struct Match {
    std::vector<std::pair<ir::ValueId, ir::ValueId>> keys;
    bool costly = false;
  };
  static bool costly(ir::UnaryFn f) {
    using U = ir::UnaryFn;
    for (U c : {U::Exp, U::Exp2, U::Log, U::Tanh, U::Sigmoid, U::Silu, U::GeluTanh, U::GeluErf, U::Erf,
                U::Sin, U::Cos, U::Log1p, U::Expm1})
      if (f == c) return true;
    return false;
  }

  // Whether value a, computed by a pass along row axis a1, and value b, by a later pass along a2,
  // are the same computation: the same ops on the same elements of tensors the kernel never
  // writes, with a1 renamed a2, down to row values both read from fast memory (the keys). A key
  // of the earlier pass is one its own op wrote (no loop's carried value, no staged copy), so it
  // still holds what that pass read.
  bool same_computation(ir::ValueId a, ir::ValueId b, int a1, int a2, const std::set<int>& written,
                        Match& m) const {
    a = ir::strip_views(k(), a);
    b = ir::strip_views(k(), b);
    const ir::Value& va = k().value(a);
    const ir::Value& vb = k().value(b);
    std::vector<int> dims = va.dims;
    std::replace(dims.begin(), dims.end(), a1, a2);
    if (va.dtype != vb.dtype || dims != vb.dims) return false;
    if (a == b) return true;  // one value defined before both passes
    bool read_a = p_.materialized[size_t(a)] || va.def_op < 0,
         read_b = p_.materialized[size_t(b)] || vb.def_op < 0;
    if (read_a || read_b) {
      if (!read_a || !read_b || va.def_op < 0 || std::count(va.dims.begin(), va.dims.end(), a1)) return false;
      ir::OpKind kind = k().op(va.def_op).kind;
      if (kind == ir::OpKind::Load || kind == ir::OpKind::Dot || kind == ir::OpKind::Scan) return false;
      m.keys.emplace_back(a, b);
      return true;
    }
    const ir::Op& x = k().op(va.def_op);
    const ir::Op& y = k().op(vb.def_op);
    if (x.kind != y.kind || x.inputs.size() != y.inputs.size()) return false;
    switch (x.kind) {
      case ir::OpKind::Load:
        if (x.tensor != y.tensor || written.count(x.tensor) || x.index.size() != y.index.size()) return false;
        for (size_t i = 0; i < x.index.size(); ++i) {
          const ir::Index &ex = x.index[i], &ey = y.index[i];
          bool axes = ex.kind == ir::Index::Kind::Axis && ey.kind == ir::Index::Kind::Axis &&
                      (ex.axis == a1 ? a2 : ex.axis) == ey.axis && ex.offset == ey.offset;
          bool constants = ex.kind == ir::Index::Kind::Scalar && ey.kind == ir::Index::Kind::Scalar &&
                           ex.value < 0 && ey.value < 0 && ex.constant == ey.constant;
          if (!axes && !constants) return false;
        }
        break;
      case ir::OpKind::Unary:
        // exp of a non-positive argument takes a cheaper form: both must take the same one.
        if (x.unary != y.unary || ir::nonpositive(k(), x.inputs[0]) != ir::nonpositive(k(), y.inputs[0]))
          return false;
        m.costly = m.costly || costly(x.unary);
        break;
      case ir::OpKind::Binary:
        if (x.binary != y.binary) return false;
        break;
      case ir::OpKind::Full:
        if (x.axis >= 0 || y.axis >= 0 || !(x.number == y.number)) return false;
        break;
      case ir::OpKind::Cast:
      case ir::OpKind::Where: break;
      default: return false;
    }
    for (size_t i = 0; i < x.inputs.size(); ++i)
      if (!same_computation(x.inputs[i], y.inputs[i], a1, a2, written, m)) return false;
    return true;
  }

  // See KeptValue: passes in sibling inner loops of one trip each, over rows of the same
  // length. In each later pass, the largest values first.
  void keep_recomputed_values() {
    std::set<int> written;
    for (const ir::Op& op : k().ops)
      if (op.kind == ir::OpKind::Store) written.insert(op.tensor);
    auto computes = [&](const ir::Op& op) { return op.result >= 0 && op.kind != ir::OpKind::Reduce; };
    for (const std::vector<plan::Item>& body : p_.bodies)
      for (size_t i = 0; i < body.size(); ++i) {
        if (!body[i].is_loop || !one_trip(body[i].loop)) continue;
        int a1 = k().loop(body[i].loop).axes[0];
        for (size_t j = i + 1; j < body.size(); ++j) {
          if (!body[j].is_loop || !one_trip(body[j].loop)) continue;
          int a2 = k().loop(body[j].loop).axes[0];
          if (k().axis(a1).extent != k().axis(a2).extent) continue;
          for (const plan::Item& later : p_.bodies[size_t(body[j].loop)]) {
            const plan::Group& g2 = later.group;
            if (later.is_loop || g2.domain.empty() || g2.domain.back() != a2) continue;
            std::set<int> covered;  // ops of values already taken from an earlier pass
            for (auto o2 = g2.ops.rbegin(); o2 != g2.ops.rend(); ++o2) {
              const ir::Op& y = k().op(*o2);
              if (!computes(y) || covered.count(*o2)) continue;
              for (const plan::Item& earlier : p_.bodies[size_t(body[i].loop)]) {
                const plan::Group& g1 = earlier.group;
                std::vector<int> domain = g1.domain;
                std::replace(domain.begin(), domain.end(), a1, a2);
                if (earlier.is_loop || g1.domain.empty() || g1.domain.back() != a1 || domain != g2.domain)
                  continue;
                const ir::Op* kept = nullptr;
                Match m;
                for (int o1 : g1.ops) {
                  const ir::Op& x = k().op(o1);
                  m = Match{};
                  if (computes(x) && same_computation(x.result, y.result, a1, a2, written, m) && m.costly) {
                    kept = &x;
                    break;
                  }
                }
                if (!kept) continue;
                p_.materialized[size_t(kept->result)] = true;
                p_.kept.push_back({kept->result, y.result, a1, a2, m.keys});
                std::function<void(ir::ValueId)> cover = [&](ir::ValueId v) {
                  int def = k().value(ir::strip_views(k(), v)).def_op;
                  if (def < 0 || !covered.insert(def).second) return;
                  for (ir::ValueId in : k().op(def).inputs) cover(in);
                };
                cover(y.result);
                break;
              }
            }
          }
        }
      }
  }

  // A copy of a load may be skipped when the grid indices it depends on repeat.
  void set_reuse(plan::BlockSpec& s) {
    const ir::Op& lop = k().op(s.op);
    std::vector<int> axes;
    bool ok = true;
    for (const ir::Index& e : lop.index) {
      if (e.kind == ir::Index::Kind::Axis) {
        if (k().axis(e.axis).kind != ir::AxisKind::Tile) continue;
        if (s.placement == plan::Placement::Resident && k().axis(e.axis).loop == s.loop) continue;
        if (grid_axis(e.axis)) axes.push_back(e.axis);
        else ok = false;
      } else if (e.kind == ir::Index::Kind::Scalar) {
        if (e.value < 0) continue;
        const ir::Op* def = k().def(e.value);
        if (def && def->kind == ir::OpKind::TileBegin && grid_axis(def->axis)) axes.push_back(def->axis);
        else ok = false;
      } else {
        ok = false;
      }
    }
    s.reuse = ok;
    if (ok) s.reuse_axes = axes;
  }

  // How each operand of a dot reaches the micro-kernel: read in place, from a packed staged or
  // resident copy, or packed by the dot.
  Gemm gemm(const plan::Dot& d) {
    Gemm g;
    g.op = d.op;
    g.loop = d.loop;
    g.acc_phi = d.acc_phi;
    g.acc_inline = d.acc_inline;
    std::vector<int> uses = ir::use_counts(k());
    for (int r = 0; r < 2; ++r) {
      GemmOperand& x = r == 0 ? g.a : g.b;
      static_cast<plan::DotOperand&>(x) = r == 0 ? d.a : d.b;
      std::vector<ir::ValueId> path;
      ir::dot_operand_source(k(), x.value, &path);
      bool exclusive = true;
      for (ir::ValueId v : path) exclusive = exclusive && uses[size_t(v)] == 1;
      const std::vector<int>& vd = k().value(x.value).dims;
      int rows = vd[vd.size() - 2], cols = vd.back();
      plan::BlockSpec* spec = nullptr;
      if (x.load_op >= 0)
        for (plan::BlockSpec& s : p_.operands)
          if (s.op == x.load_op) spec = &s;
      DType elem = x.load_op >= 0 ? k().tensors[size_t(k().op(x.load_op).tensor)].dtype : DType::f32;
      // B needs its N dim contiguous to be read in place.
      auto unit_cols = [&](bool from_tensor) {
        if (r == 0 || cols == ir::kOne) return true;
        if (from_tensor) return stride_along(k().op(x.load_op), cols) == 1;
        std::vector<int> sd = non_one(k().value(x.source).dims);
        return !sd.empty() && sd.back() == cols;
      };
      if (spec && spec->placement != plan::Placement::InPlace && exclusive) {
        const ir::Loop& l = k().loop(spec->loop);
        if (spec->placement == plan::Placement::Resident &&
            (l.axes.size() != 1 || l.begin[0].value >= 0 || l.begin[0].constant != 0)) {
          restage(*spec);  // blocks of a packed resident copy start at 0
        }
        x.read = DotRead::Packed;
      } else if (spec && spec->placement != plan::Placement::InPlace) {
        x.read = unit_cols(false) ? DotRead::InPlace : DotRead::PackInGroup;  // a plain staged copy
      } else if (x.load_op >= 0) {
        if (elem == DType::f32 && unit_cols(true)) x.read = DotRead::InPlace;
        else if (exclusive && spec && spec->loop != d.loop) {
          // Loop-invariant for the dot: pack once per iteration of the load's own loop.
          restage(*spec);
          x.read = DotRead::Packed;
        } else {
          x.read = DotRead::PackInGroup;
        }
      } else {
        x.read = unit_cols(false) ? DotRead::InPlace : DotRead::PackInGroup;
      }
      int64_t slab = r == 0 ? packed_a_elements(extent_of(rows), extent_of(cols))
                            : packed_b_elements(extent_of(rows), extent_of(cols));
      if (x.read == DotRead::PackInGroup) x.pack_elements = slab;
      if (x.read == DotRead::Packed) {
        for (size_t i = 0; i + 2 < vd.size(); ++i) slab *= extent_of(vd[i]);
        Staging& st = p_.staging[size_t(spec - p_.operands.data())];
        st.dot = d.op;
        st.dot_operand = r;
        st.slab_elements = slab;
        int64_t blocks = 1;
        if (spec->placement == plan::Placement::Resident) {
          int a = k().loop(spec->loop).axes[0];
          if (std::find(vd.begin(), vd.end(), a) != vd.end())
            blocks = (k().axis(a).extent + p_.block[size_t(a)] - 1) / p_.block[size_t(a)];
        }
        st.fast_bytes = slab * blocks * 4 * (spec->placement == plan::Placement::Staged ? spec->buffers : 1);
        if (spec->placement == plan::Placement::Resident || k().loop(spec->loop).grid) set_reuse(*spec);
      }
    }
    return g;
  }

  // A copy the micro-kernel needs packed one block at a time: staged with one buffer, its value
  // kept in fast memory.
  void restage(plan::BlockSpec& s) {
    s.placement = plan::Placement::Staged;
    s.buffers = 1;
    s.elements = p_.block_elements(k().op(s.op).result);
    ir::ValueId v = k().op(s.op).result;
    p_.materialized[size_t(v)] = true;
    p_.recomputed[size_t(v)] = false;
  }

  // Scratch per thread: values kept between groups, staged copies, the dots' packing buffers.
  // CpuPlan::scan_stores.
  void fuse_scan_stores() {
    std::vector<int> uses = ir::use_counts(k());
    for (const std::vector<plan::Item>& items : p_.bodies)
      for (size_t i = 0; i + 1 < items.size(); ++i) {
        const plan::Group& g = items[i].group;
        if (items[i].is_loop || items[i + 1].is_loop || g.ops.size() != 1) continue;
        const ir::Op& op = k().op(g.ops[0]);
        if (!is_row_cumsum(k(), op) || uses[size_t(op.result)] != 1) continue;
        int along = k().value(op.inputs[0]).dims[size_t(op.dim)];
        const std::vector<int>& next = items[i + 1].group.ops;
        int store = -1;
        for (int o : next) {
          const ir::Op& s = k().op(o);
          if (s.kind == ir::OpKind::Store && s.inputs.back() == op.result && along_f32_row(k(), s, along))
            store = o;
        }
        // Stored row by row before the next group runs: nothing in the kernel may read that tensor
        // (the block's other rows, in the row the scan reads, would see it early), and no other op
        // of the next group write it.
        int target = store < 0 ? -1 : k().op(store).tensor;
        ir::walk(k(), [&](const ir::Stmt& st, int) {
          if (st.kind != ir::Stmt::Kind::Op || k().op(st.id).tensor != target) return;
          const ir::OpKind kind = k().op(st.id).kind;
          bool writes_next =
              kind == ir::OpKind::Store && st.id != store && std::count(next.begin(), next.end(), st.id);
          if (kind == ir::OpKind::Load || writes_next) store = -1;
        });
        if (store >= 0) p_.scan_stores[g.ops[0]] = store;
      }
  }

  void scratch() {
    std::vector<bool> staged(k().values.size(), false);  // counted with their block spec, or not kept
    for (const auto& [scan, store] : p_.scan_stores)
      staged[size_t(k().op(scan).result)] = true;  // in the output
    for (size_t i = 0; i < p_.operands.size(); ++i) {
      const plan::BlockSpec& s = p_.operands[i];
      if (s.placement == plan::Placement::InPlace) continue;
      staged[size_t(k().op(s.op).result)] = true;
      Staging& st = p_.staging[i];
      if (st.dot < 0) st.fast_bytes = s.elements * cpp_size(k().value(k().op(s.op).result).dtype) * s.buffers;
    }
    int64_t bytes = 0;
    for (size_t v = 0; v < k().values.size(); ++v)
      if (p_.materialized[v] && !staged[v])
        bytes += round64(p_.block_elements(ir::ValueId(v)) * cpp_size(k().values[v].dtype));
    for (const Staging& st : p_.staging) bytes += round64(st.fast_bytes);
    for (const Gemm& g : p_.gemms) {
      bytes += round64(g.a.pack_elements * 4) + round64(g.b.pack_elements * 4);
      ir::ValueId r = k().op(g.op).result;
      if (g.acc_phi >= 0 && p_.materialized[size_t(r)])  // shares its accumulator's storage
        bytes -= round64(p_.block_elements(r) * cpp_size(k().value(r).dtype));
    }
    for (const StreamedStore& s : p_.streamed) bytes += round64(s.elements * dtype_size(k().tensors[size_t(k().op(s.op).tensor)].dtype));
    if (limits_ && bytes > limits_->fast_memory_bytes && !p_.kept.empty()) {
      // Kept values are an optimisation: without them the config may fit.
      for (const KeptValue& kv : p_.kept) p_.materialized[size_t(kv.kept)] = false;
      p_.kept.clear();
      scratch();
      return;
    }
    p_.fast_memory_bytes = bytes;
    // A resident packed copy that no grid index selects (matmul_layernorm's y[k, all]: every grid
    // step reads all of it) is packed once by the whole team before the grid steps, and all its
    // threads read that one copy (Staging::shared). The micro-kernel works on one packed column
    // panel of it at a time, which must fit the L2 with the rest; the whole copy may take half
    // of the last-level cache.
    int64_t l3_share = cpu_info().l3_bytes / 2;
    // Grid axes of one block (a dot's whole N in one grid block) select nothing either.
    auto one_block = [&](int a) { return p_.block[size_t(a)] >= k().axis(a).extent; };
    for (size_t i = 0; i < p_.operands.size(); ++i) {
      const plan::BlockSpec& s = p_.operands[i];
      Staging& st = p_.staging[i];
      if (s.placement != plan::Placement::Resident || st.dot < 0 || st.dot_operand != 1 || !s.reuse ||
          !std::all_of(s.reuse_axes.begin(), s.reuse_axes.end(), one_block) || st.fast_bytes > l3_share)
        continue;
      const std::vector<int>& vd = k().value(k().op(s.op).result).dims;
      int64_t panel = round64(packed_b_elements(k().axis(vd[vd.size() - 2]).extent, dot_panel_columns()) * 4);
      if (panel >= st.fast_bytes) continue;
      bytes -= round64(st.fast_bytes) - panel;
      p_.l3_resident_bytes += round64(st.fast_bytes);
      st.shared = true;
    }
    // A resident packed b that grid indices select (attention's kᵀ for a head, which each of the
    // head's query blocks reads whole) is packed by each thread when those indices change
    // (BlockSpec::reuse) and read one block of the loop at a time: that block's panels must fit
    // the L2 with the rest, and every thread's whole copy together half of the last-level cache.
    // Packing it once per head instead of once per query block saved attention's transposes.
    for (size_t i = 0; i < p_.operands.size(); ++i) {
      const plan::BlockSpec& s = p_.operands[i];
      const Staging& st = p_.staging[i];
      int64_t block = round64(st.slab_elements * 4);
      if (s.placement != plan::Placement::Resident || st.dot < 0 || st.dot_operand != 1 || !s.reuse ||
          st.shared || block >= round64(st.fast_bytes) ||
          (p_.l3_per_thread_bytes + round64(st.fast_bytes)) * p_.threads + p_.l3_resident_bytes > l3_share)
        continue;
      bytes -= round64(st.fast_bytes) - block;
      p_.l3_per_thread_bytes += round64(st.fast_bytes);
    }
    if (!limits_) return;
    p_.fast_memory_budget = limits_->fast_memory_bytes;
    if (bytes > limits_->fast_memory_bytes)
      throw FastMemoryError(fmt::format("config {} needs {} KiB of fast memory per thread; the cpu target has {} KiB",
                                    p_.config.dump(), (bytes + 1023) / 1024, limits_->fast_memory_bytes / 1024),
                        format_location(k().loc), "use smaller blocks, a looped reduction, or the in_place strategy");
  }

  CpuPlan p_;
  std::optional<config::TargetLimits> limits_;
};

}  // namespace

CpuPlan refine(const plan::Plan& p, const config::TargetLimits& limits) { return Refiner(p, limits).run(); }
CpuPlan refine(const plan::Plan& p) { return Refiner(p, std::nullopt).run(); }

std::string describe(const CpuPlan& p) {
  const ir::Kernel& k = p.kernel;
  std::string out = fmt::format("  cpu: {} threads, {} bytes of scratch per thread (L2 budget {})\n", p.threads,
                                p.fast_memory_bytes, p.fast_memory_budget);
  for (size_t i = 0; i < p.operands.size(); ++i) {
    const Staging& st = p.staging[i];
    if (st.dot < 0) continue;
    out += fmt::format("    {} packed for operand {} of the dot at line {}\n",
                       k.tensors[size_t(p.operands[i].tensor)].name, st.dot_operand == 0 ? "a" : "b",
                       k.op(st.dot).loc.line());
  }
  for (const Gemm& g : p.gemms) {
    auto operand = [&](const GemmOperand& x) {
      std::string what = x.load_op >= 0 ? k.tensors[size_t(k.op(x.load_op).tensor)].name
                                         : fmt::format("%{} (fast memory)", x.source);
      return fmt::format("{} {}{}", what, name(x.read), x.pack_once ? " on its loop's first trip" : "");
    };
    out += fmt::format("    micro-kernel for the dot at line {}: a = {}, b = {}{}\n", k.op(g.op).loc.line(),
                       operand(g.a), operand(g.b),
                       g.bf16_pairs ? ", both packed as bf16 (pairs of K steps for vdpbf16ps where the CPU has it)" : "");
  }
  if (p.l3_resident_bytes > 0)
    out += fmt::format(
        "    {} KiB of the scratch: resident copies every grid step reads whole, packed by the team before "
        "its grid steps, one copy all threads read, kept in the L3 (one column panel at a time in the L2)\n",
        (p.l3_resident_bytes + 1023) / 1024);
  if (p.l3_per_thread_bytes > 0)
    out += fmt::format(
        "    {} KiB of each thread's scratch: resident copies packed when the grid indices that select them "
        "change, kept in the L3 (one block of their loop at a time in the L2)\n",
        (p.l3_per_thread_bytes + 1023) / 1024);
  for (int o : p.hoisted)
    out += fmt::format("    the group of line {} runs once per thread, before the grid steps: it depends on no grid index\n",
                       k.op(o).loc.line());
  if (p.grid_group > 1) out += fmt::format("    grid traversal in groups of {}\n", p.grid_group);
  if (p.epilogue_subtiles > 1 && p.epilogue_axis >= 0)
    out += fmt::format("    epilogue in {} sub-tiles along {}\n", p.epilogue_subtiles, k.axis(p.epilogue_axis).name);
  for (const Gemm& g : p.gemms)
    if (g.out_store >= 0)
      out += fmt::format(
          "    the dot at line {} accumulates in {}'s tile (no fast-memory copy to store, no zero fill){}\n",
          k.op(g.op).loc.line(), k.tensors[size_t(k.op(g.out_store).tensor)].name,
          g.out_epilogue ? "; the epilogue reads it there and writes over it" : "");
    else if (g.out_store_collides >= 0)
      out += fmt::format(
          "    the dot at line {} accumulates in fast memory: the rows of {}'s tile fall into too few L2 "
          "sets\n",
          k.op(g.op).loc.line(), k.tensors[size_t(k.op(g.out_store_collides).tensor)].name);
  for (const StreamedStore& s : p.streamed)
    out += fmt::format("    {} written with streaming stores, a row of {} {} at a time (line {})\n",
                       k.tensors[size_t(k.op(s.op).tensor)].name, s.elements, k.axis(s.axis).name, k.op(s.op).loc.line());
  for (const RowPrefetch& r : p.prefetches)
    out += fmt::format("    {} prefetched {} by the pass of line {}\n",
                       k.tensors[size_t(k.op(r.op).tensor)].name,
                       r.next_step    ? "for the next grid step"
                       : r.rows_ahead ? fmt::format("{} rows ahead", r.rows_ahead)
                                      : std::string("for writing"),
                       k.op(r.group_op).loc.line());
  for (const KeptValue& kv : p.kept)
    out += fmt::format(
        "    %{} kept by the pass over {} (line {}) for the pass over {}, which computes it again as %{} "
        "(line {})\n",
        kv.kept, k.axis(kv.kept_axis).name, k.def(kv.kept)->loc.line(), k.axis(kv.again_axis).name, kv.again,
        k.def(kv.again)->loc.line());
  return out;
}

}  // namespace deuteron::cpu
