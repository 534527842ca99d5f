#include "backends/cpu/space.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <set>

#include <fmt/format.h>

#include "backends/cpu/hardware.h"
#include "backends/cpu/packing.h"
#include "backends/cpu/refine.h"
#include "config/keys.h"

namespace deuteron::cpu {

namespace {

using config::Json;
using config::Tunable;

std::vector<int> dot_ops(const ir::Kernel& k) {
  std::vector<int> out;
  for (size_t o = 0; o < k.ops.size(); ++o)
    if (k.ops[o].kind == ir::OpKind::Dot) out.push_back(int(o));
  return out;
}

// Epilogue sub-tiling: the ops after a dot's loop run over sub-tiles of its N block, when that
// N dim is a grid tile and nothing after the loop reduces over it.
bool has_subtilable_epilogue(const ir::Kernel& k) {
  const ir::Loop& grid = k.grid_loop();
  std::vector<int> loop_of = ir::loop_of_ops(k);
  for (int d : dot_ops(k)) {
    int n = k.value(k.op(d).result).dims.back();
    if (n == ir::kOne || k.axis(n).kind != ir::AxisKind::Tile ||
        std::find(grid.axes.begin(), grid.axes.end(), n) == grid.axes.end())
      continue;
    int dot_loop = loop_of[size_t(d)];
    if (dot_loop < 0 || k.loop(dot_loop).grid || k.loop(dot_loop).parent < 0 || !k.loop(k.loop(dot_loop).parent).grid)
      continue;
    bool legal = true, after = false;
    for (const ir::Stmt& st : grid.body) {
      if (st.kind == ir::Stmt::Kind::Loop) {
        after = after || st.id == dot_loop;
        continue;
      }
      const ir::Op& o = k.op(st.id);
      if (after && o.kind == ir::OpKind::Reduce && k.value(o.inputs[0]).dims[size_t(o.dim)] == n) legal = false;
    }
    if (legal && after) return true;
  }
  return false;
}

// The block size a default config gives `axis` (its extent when it is not tiled).
int64_t default_block(const ir::Kernel& k, const config::ConfigSpace& space, int axis) {
  if (axis == ir::kOne) return 1;
  const ir::Axis& ax = k.axis(axis);
  if (ax.kind != ir::AxisKind::Tile) return ax.extent;
  const ir::BlockParam& bp = k.block_params[size_t(ax.block_param)];
  return bp.fixed ? bp.fixed : space.default_config().integer(bp.name);
}

// Bytes of the packed copy of a dot operand resident over its inner loop (every block of the
// loop's extent), at the default blocks.
int64_t resident_bytes_of(const ir::Kernel& k, const config::ConfigSpace& space, const config::OperandTunable& o) {
  const ir::Loop& loop = k.loop(o.loop);
  const auto& vd = k.value(k.op(o.dot).inputs[size_t(o.operand)]).dims;
  int64_t rows = 1, cols = 1, batch = 1;
  for (size_t i = 0; i < vd.size(); ++i) {
    int64_t e = vd[i] == loop.axes.front() ? k.axis(vd[i]).extent : default_block(k, space, vd[i]);
    if (i + 1 == vd.size()) cols = e;
    else if (i + 2 == vd.size()) rows = e;
    else batch *= e;
  }
  return 4 * batch * (o.operand == 0 ? packed_a_elements(rows, cols) : packed_b_elements(rows, cols));
}

// A B operand that its loop runs along K (matmul's y[k, n]) is packed once and reused across
// every M block of its column panel while it stays resident; that needs all of K for one N
// block in half the fast memory (the other half: A's panels in flight, C's block). So N's
// default block is halved, down to the micro-kernel's panel width (dot_panel_columns()), until it fits:
// 2048 x 64 floats (512 KiB) with a 1 MiB L2, 2048 x 128 with 2 MiB. Measured on the 2-core
// Zen 5 EPYC (1 MiB L2), matmul 2048^3 f32: blocks 128/128/512 with y streamed 40.0 ms,
// 128/64/512 with y resident 35.5 ms (chrt -f 1, 2 threads).
void fit_resident_b(const ir::Kernel& k, const config::TargetLimits& limits, config::ConfigSpace& space) {
  for (const config::OperandTunable& o : config::operand_tunables(k)) {
    if (o.operand != 1) continue;
    const auto& vd = k.value(k.op(o.dot).inputs[1]).dims;
    if (vd.size() < 2 || vd[vd.size() - 2] != k.loop(o.loop).axes.front() || vd.back() == ir::kOne) continue;
    const ir::Axis& n = k.axis(vd.back());
    if (n.kind != ir::AxisKind::Tile || k.block_params[size_t(n.block_param)].fixed) continue;
    const std::string& name = k.block_params[size_t(n.block_param)].name;
    const config::Tunable* t = space.find(name);
    const int64_t was = space.default_config().integer(name);
    int64_t block = was;
    while (block > dot_panel_columns() && resident_bytes_of(k, space, o) > limits.fast_memory_bytes / 2 && t &&
           std::count(t->values.begin(), t->values.end(), config::Json(block / 2))) {
      block /= 2;
      space.set_default_value(name, block);
    }
    if (resident_bytes_of(k, space, o) > limits.fast_memory_bytes / 2) space.set_default_value(name, was);  // no use
  }
}

// A B operand read in place is swept once per A panel of the M block, so its K block (all of
// the N block's columns) should stay in the L2 between sweeps, beside the C block and A's rows:
// K's default block is halved until it takes at most a quarter of the fast memory (the L2),
// down to 64. matmul_layernorm 1024^3 on the session-12 Xeon (2 MiB L2; the N block is y's
// whole 1024-float rows), y in place, M block 128, 3 alternating rounds, ms: K block 512 (2 MiB
// of y) 10.96-11.84, 256 5.77-6.55, 128 5.77-5.94, 64 5.71-5.76; the former default (M 64, K
// 128, y streamed) 6.73-6.97.
void fit_in_place_b(const ir::Kernel& k, const config::TargetLimits& limits, const config::OperandTunable& o,
                    config::ConfigSpace& space) {
  const auto& vd = k.value(k.op(o.dot).inputs[1]).dims;
  int ka = k.loop(o.loop).axes.front();
  if (vd.size() < 2 || vd[vd.size() - 2] != ka || k.axis(ka).kind != ir::AxisKind::Tile) return;
  const ir::BlockParam& bp = k.block_params[size_t(k.axis(ka).block_param)];
  const config::Tunable* t = space.find(bp.name);
  if (bp.fixed || !t) return;
  int64_t columns = default_block(k, space, vd.back());
  int64_t block = space.default_config().integer(bp.name);
  while (block > 64 && block * columns * 4 > limits.fast_memory_bytes / 4 &&
         std::count(t->values.begin(), t->values.end(), Json(block / 2))) {
    block /= 2;
    space.set_default_value(bp.name, block);
  }
}

// The default strategy of a tensor a dot reads in an inner loop. A B operand is resident
// (packed once per grid step, kept while its grid block repeats) while that fits half the fast
// memory, else read in place when it is f32 with contiguous rows (not parts of rows 4 KiB apart),
// else streamed; an A operand is read in place when f32 (the micro-kernel broadcasts it from any
// layout) or bf16 (its words are pairs for vdpbf16ps, else the runtime widens it panel by
// panel), else streamed (packed and widened block by block).
std::string operand_default(const ir::Kernel& k, const config::ConfigSpace& space, const config::OperandTunable& o,
                            const config::TargetLimits& limits, int64_t& resident_bytes) {
  const ir::Op& load = k.op(o.load);
  const auto& vd = k.value(k.op(o.dot).inputs[size_t(o.operand)]).dims;
  DType dtype = k.tensors[size_t(load.tensor)].dtype;
  bool f32 = dtype == DType::f32;
  // In place needs contiguous rows, and a block whose rows do not all land in the same cache
  // sets: with a row stride that is a multiple of 4 KiB, a block of part of each row is read as
  // short runs that share sets and start a new page each, so it is streamed (packed). A block
  // of whole rows is one contiguous run and read in place: its packed copy would be made again
  // for every grid step. Measured on the session-11 Xeon (2 MiB L2), 3 alternating rounds:
  // matmul_layernorm 1024^3 (y's 1024-float rows whole) y streamed 8.70 ms, in place 7.49;
  // matmul 1024x8192x1024 (blocks of 128 of y's 1024 columns) streamed 58.6, in place 97.3.
  bool unit_cols = false;
  int64_t row_stride = 0;
  for (size_t i = 0; i < load.index.size(); ++i) {
    if (load.index[i].kind != ir::Index::Kind::Axis) continue;
    if (load.index[i].axis == vd.back()) unit_cols = k.tensors[size_t(load.tensor)].strides[i] == 1;
    if (load.index[i].axis == vd[vd.size() - 2]) row_stride = k.tensors[size_t(load.tensor)].strides[i];
  }
  bool whole_rows = default_block(k, space, vd.back()) >= row_stride;
  bool aliased = o.operand == 1 && unit_cols && row_stride * 4 % 4096 == 0 && !whole_rows;
  int64_t bytes = resident_bytes_of(k, space, o);
  if (o.operand == 1 && resident_bytes + bytes <= limits.fast_memory_bytes / 2) {
    resident_bytes += bytes;
    return config::keys::kResident;
  }
  // A B the dot packs anyway (columns not contiguous: attention's kᵀ) that the fastest grid
  // axis does not select is packed once for each run of grid steps that share it and kept in
  // the L3 (Refiner::scratch), not packed again for every grid step. Its packing buffer (one
  // block, at most a quarter of the L2) becomes that copy's block in the L2; every thread's
  // copy takes at most half the L3.
  // Attention [1, 8, 2048, 128] on a Zen 3, 30 in-process pairs: 0.978x the time, causal 0.986x.
  const std::vector<int>& grid = k.grid_loop().axes;
  bool selected_by_fastest = std::any_of(load.index.begin(), load.index.end(), [&](const ir::Index& e) {
    return e.kind == ir::Index::Kind::Axis && !grid.empty() && e.axis == grid.back();
  });
  const int64_t l3 = cpu_info().l3_bytes;
  const int loop_axis = k.loop(o.loop).axes.front();
  const int64_t block = std::max<int64_t>(default_block(k, space, loop_axis), 1);
  const int64_t blocks =
      std::count(vd.begin(), vd.end(), loop_axis) ? (k.axis(loop_axis).extent + block - 1) / block : 1;
  if (o.operand == 1 && f32 && !unit_cols && !selected_by_fastest &&
      bytes / blocks <= limits.fast_memory_bytes / 4 && bytes * std::max(limits.cores, 1) <= l3 / 2)
    return config::keys::kResident;
  if (o.operand == 0 ? !f32 && dtype != DType::bf16 : (f32 && aliased)) return config::keys::kStream;  // f16 A, or B rows 4 KiB apart
  return config::keys::kInPlace;  // read in place, or packed by the dot where it must be
}

// The largest value of a block tunable at most `want` (its smallest when none is).
Json at_most(const Tunable& t, int64_t want) {
  Json best = t.values.front();
  for (const Json& v : t.values)
    if (v.is_number_integer() && v.get<int64_t>() <= want) best = v;
  return best;
}

// Without dots or whole dims, a block takes whole contiguous rows up to 4096 elements (16 KiB of f32), and
// the grid's other tile axes proportionally fewer rows: the target-neutral default (512 per
// row) cuts a row into several short runs, each a restart of the hardware prefetcher.
// softmax_two_pass 4096x4096 ran 4.58 ms in blocks of 4 x 4096 against 5.67 in 32 x 256, add
// 2.84 in 4 x 4096 against 2.99 in 32 x 512 (chrt -f 1, 2 threads, medians of 5 rounds).
void whole_row_defaults(const ir::Kernel& k, config::ConfigSpace& space) {
  constexpr int64_t kRowElements = 4096;
  for (const ir::Axis& ax : k.axes)
    if (ax.kind == ir::AxisKind::Reduction) return;  // the rows are already whole
  std::set<int> innermost;  // params whose axis indexes the last dim of an access
  for (const ir::Op& op : k.ops)
    if ((op.kind == ir::OpKind::Load || op.kind == ir::OpKind::Store) && !op.index.empty() &&
        op.index.back().kind == ir::Index::Kind::Axis && k.axis(op.index.back().axis).kind == ir::AxisKind::Tile)
      innermost.insert(k.axis(op.index.back().axis).block_param);
  int64_t factor = 1;
  for (int p : innermost) {
    const config::Tunable* t = p >= 0 ? space.find(k.block_params[size_t(p)].name) : nullptr;
    if (!t || k.block_params[size_t(p)].reduction) continue;
    int64_t now = space.default_config().integer(t->name), extent = 1;
    for (const ir::Axis& ax : k.axes)
      if (ax.block_param == p) extent = std::max(extent, ax.extent);
    int64_t want = at_most(*t, std::min<int64_t>(kRowElements, int64_t(std::bit_ceil(uint64_t(extent))))).get<int64_t>();
    if (want <= now) continue;
    factor = std::max(factor, want / now);
    space.set_default_value(t->name, want);
  }
  if (factor == 1) return;
  for (int a : k.grid_loop().axes) {
    int p = k.axis(a).block_param;
    const config::Tunable* t = p >= 0 ? space.find(k.block_params[size_t(p)].name) : nullptr;
    if (!t || innermost.count(p) || k.block_params[size_t(p)].reduction) continue;
    int64_t now = space.default_config().integer(t->name);
    space.set_default_value(t->name, at_most(*t, std::max(now / factor, std::min<int64_t>(now, 2))));
  }
}

// Row kernels (no dots; loads along a whole dim: softmax, layer_norm, rms_norm, cross_entropy;
// or a tensor loaded by two loops over its rows: softmax_two_pass, welford) read each block in
// several passes, and prefetch the next block's rows while the later passes run on cached ones
// (RowPrefetch): a block of as few rows as fill kRowBlockBytes of the widest such row stays in
// L1 over its passes. welford 65536x512 ran 3.65 ms in 8 rows against 4.91 in 32 (its default
// before), softmax_two_pass 4096x4096 2.63 in 1 row against 2.68 in 4. Softmax 8192x2560 ran 2.64 ms in blocks of one row
// against 2.97 in 4 (the default before) and 2.88 in 8, layer_norm 8192x4096 (streamed) 3.43
// against 4.52 in 4 and 4.68 in 8 (chrt -f 1, 2 threads, medians of 3 rounds). The other grid
// axes (batch_softmax's batch) take one block each.
void row_kernel_defaults(const ir::Kernel& k, config::ConfigSpace& space) {
  constexpr int64_t kRowBlockBytes = 16 * 1024;
  std::map<int, int> loads;  // tensor -> its load ops: two or more read its rows in two passes
  for (const ir::Op& op : k.ops)
    if (op.kind == ir::OpKind::Load) ++loads[op.tensor];
  int64_t row_bytes = 0;
  for (const ir::Op& op : k.ops)
    if (op.kind == ir::OpKind::Load && !op.index.empty() && op.index.back().kind == ir::Index::Kind::Axis &&
        (k.axis(op.index.back().axis).kind == ir::AxisKind::Reduction || loads[op.tensor] > 1))
      row_bytes = std::max(row_bytes, k.axis(op.index.back().axis).extent * int64_t(dtype_size(k.tensors[size_t(op.tensor)].dtype)));
  if (row_bytes == 0) return;
  const std::vector<int>& grid = k.grid_loop().axes;
  for (size_t i = 0; i < grid.size(); ++i) {
    int p = k.axis(grid[i]).block_param;
    const config::Tunable* t = p >= 0 ? space.find(k.block_params[size_t(p)].name) : nullptr;
    if (!t || k.block_params[size_t(p)].reduction) continue;
    int64_t want = i + 1 == grid.size() ? std::max<int64_t>(1, kRowBlockBytes / row_bytes) : 1;
    Json best = t->values.front();
    for (const Json& v : t->values)
      if (v.is_number_integer() && v.get<int64_t>() <= want) best = v;
    space.set_default_value(t->name, best);
  }
}

// Goto's loop order (BLIS, OpenBLAS), for a kernel of one dot whose B its loop reads along K:
// a grid block of 128 rows of A and all of N. Each block of K of A is packed into the L2
// (stream) and swept against every B panel, and B is packed once by the team (resident, and
// shared: no grid index selects it) into the L3. A then crosses memory once, where narrow N
// blocks read it once per block of N: matmul 2048^3 in the default's 32 columns read 1 GiB of A
// on a Zen 3 and lost to XLA whenever other tenants used memory. A candidate the tuner times
// beside the default, not the default: which wins depends on the machine's caches.
void suggest_goto_order(const ir::Kernel& k, const config::TargetLimits& limits, config::ConfigSpace& space) {
  std::vector<int> dots = dot_ops(k);
  if (dots.size() != 1) return;
  std::string a_name, b_name;
  int loop = -1;
  bool f32 = true;  // a bf16 B is packed as pairs and not shared: matmul 301x203x517 needed 1169 KiB
  for (const config::OperandTunable& o : config::operand_tunables(k))
    if (o.dot == dots[0]) {
      (o.operand == 0 ? a_name : b_name) = o.name, loop = o.loop;
      f32 = f32 && k.tensors[size_t(k.op(o.load).tensor)].dtype == DType::f32;
    }
  if (a_name.empty() || b_name.empty() || !f32 || k.loop(loop).parent < 0 ||
      !k.loop(k.loop(loop).parent).grid)
    return;
  const auto& ad = k.value(k.op(dots[0]).inputs[0]).dims;
  const auto& bd = k.value(k.op(dots[0]).inputs[1]).dims;
  const int m = ad[ad.size() - 2], n = bd.back(), kk = k.loop(loop).axes.front();
  for (size_t i = 0; i + 2 < bd.size(); ++i)
    if (bd[i] != ir::kOne) return;  // a B per batch (bmm): a grid index selects it
  config::Config c = space.default_config();
  // A tiled axis's block: at most `want`; an axis read whole needs none.
  auto set_block = [&](int axis, int64_t want) {
    if (axis == ir::kOne || k.axis(axis).kind != ir::AxisKind::Tile) return true;
    const ir::BlockParam& bp = k.block_params[size_t(k.axis(axis).block_param)];
    const Tunable* t = bp.fixed ? nullptr : space.find(bp.name);
    if (!t || t->values.empty()) return false;
    c.set(bp.name, at_most(*t, want));
    return true;
  };
  const int64_t k_extent = k.axis(kk).extent, n_extent = n == ir::kOne ? 1 : k.axis(n).extent;
  const int64_t l3 = cpu_info().l3_bytes;
  if (4 * packed_b_elements(k_extent, n_extent) > l3 / 2) return;  // Refiner::scratch's share
  // Only where the product may accumulate in the output's rows (Gemm::out_store), which a store
  // writes as they are or an elementwise epilogue writes over in place (Gemm::out_epilogue): a
  // tile of whole rows of N is larger than fast memory.
  const ir::Loop& l = k.loop(loop);
  bool in_output = false;
  for (const ir::Carried& x : l.carried)
    in_output = in_output || (x.next == k.op(dots[0]).result && accumulator_store(k, loop, x) >= 0);
  if (!in_output) return;
  // K's block: an A block of 128 rows takes a quarter of the L2 (256 with 512 KiB).
  int64_t block_k = 16;
  while (block_k * 2 <= k_extent && 128 * block_k * 2 * 4 <= limits.fast_memory_bytes / 4) block_k *= 2;
  // N whole: its largest block, which covers the dim.
  if (!set_block(n, INT64_MAX) || !set_block(m, 128) || !set_block(kk, block_k)) return;
  c.set(a_name, config::keys::kStream);
  c.set(b_name, config::keys::kResident);
  // The tile accumulates in the output, which streaming stores would bypass (an output past the
  // L3 defaults to them: matmul 65536 x 1024 x 256).
  if (space.find(kStores)) c.set(kStores, kStoresCached);
  space.suggest(c);
}

}  // namespace

void extend_space(const ir::Kernel& k, const config::TargetLimits& limits, config::ConfigSpace& space) {
  const ir::Loop& grid = k.grid_loop();
  bool dots = !dot_ops(k).empty();
  if (dots && grid.axes.size() > 1) {
    Tunable t;
    t.name = kGridGroup;
    t.kind = Tunable::Kind::Count;
    t.help = "grid traversal: blocks of the second-fastest grid axis visited before the fastest "
             "one steps (1 = row-major; more keeps a block of the operand shared along it in cache)";
    t.values = {1, 2, 4, 8};
    space.add(t, 1);
  }
  if (has_subtilable_epilogue(k)) {
    Tunable t;
    t.name = kEpilogueSubtiles;
    t.kind = Tunable::Kind::Count;
    t.help = "the ops after the dot's loop run over this many sub-tiles of its N block";
    t.values = {1, 2, 4};
    space.add(t, 1);
  }

  if (!dots) whole_row_defaults(k, space);
  // Not with atomic adds of rows (rms_norm_bwd's grad_w): each block adds its share, so a block
  // of one row adds a whole row for every row (rms_norm_bwd 8192x4096: 7.76 ms in 1 row, 5.44 in
  // 4). Adds of single elements (cross_entropy's loss) cost a block next to nothing: its
  // 4096x32000 ran 13.2 ms in 1 row (13.4 in 2) against 19.2 in 4, 18.6 in 8 and 23.6 in 512,
  // the default before (blocks past kPrefetchBlockBytes do not prefetch; chrt -f 1, medians).
  bool row_atomics = std::any_of(k.ops.begin(), k.ops.end(), [](const ir::Op& op) {
    return op.atomic_add && std::any_of(op.index.begin(), op.index.end(),
                                        [](const ir::Index& e) { return e.kind != ir::Index::Kind::Scalar; });
  });
  if (!dots && !row_atomics) row_kernel_defaults(k, space);

  if (std::vector<int> streamable = streamable_stores(k); !streamable.empty()) {
    Tunable t;
    t.name = kStores;
    t.help = "outputs the kernel never reads: cached (plain stores, each line read into the cache "
             "first) or stream (non-temporal stores of whole lines, past the cache)";
    t.values = {kStoresCached, kStoresStream};
    // Streamed by default when the outputs are larger than the last-level cache, which they
    // would leave anyway (same config, chrt -f 1: add 4096x4096 2.18 -> 1.93 ms, softmax
    // 8192x2560 3.80 -> 3.37, layer_norm 8192x4096 5.30 -> 3.86); cached below, where the
    // next kernel may still find them there. The tuner measures both.
    int64_t out_bytes = 0;
    for (int o : streamable) {
      const ir::HostTensor& x = k.tensors[size_t(k.ops[size_t(o)].tensor)];
      out_bytes += x.numel() * dtype_size(x.dtype);
    }
    int64_t cache = cpu_info().l3_bytes;
    space.add(t, out_bytes > cache ? kStoresStream : kStoresCached);
  }

  fit_resident_b(k, limits, space);
  int64_t resident_bytes = 0;
  int last_loop = -1;
  for (const config::OperandTunable& o : config::operand_tunables(k)) {
    if (o.loop != last_loop) resident_bytes = 0;  // each loop's operands share half the budget
    last_loop = o.loop;
    std::string strategy = operand_default(k, space, o, limits, resident_bytes);
    space.set_default_value(o.name, strategy);
    if (o.operand == 1 && strategy == config::keys::kInPlace) fit_in_place_b(k, limits, o, space);
  }

  Tunable threads;
  threads.name = kNumThreads;
  threads.kind = Tunable::Kind::Count;
  threads.help = "threads running the grid in parallel";
  for (int c = 1; c <= std::max(limits.cores, 1); ++c) threads.values.push_back(c);
  // Small problems run on one thread: waking a team costs more than they take.
  int64_t per_block = 1;  // elements one grid point touches: whole dims or inner loops
  for (const ir::Axis& ax : k.axes)
    if (ax.kind == ir::AxisKind::Reduction) per_block = std::max(per_block, ax.extent);
  for (const ir::Loop& l : k.loops)
    if (!l.grid)
      for (int a : l.axes) per_block = std::max(per_block, k.axis(a).extent);
  int64_t work = per_block;
  for (int a : grid.axes) work *= std::max<int64_t>(k.axis(a).extent, 1);
  space.add(threads, work < (int64_t(1) << 17) ? 1 : std::max(limits.cores, 1));
  suggest_goto_order(k, limits, space);
}

}  // namespace deuteron::cpu
