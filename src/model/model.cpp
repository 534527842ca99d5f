#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "ir/ops.h"
#include "plan/reduce_loops.h"

namespace deuteron::model {

const char* name(Bound b) {
  switch (b) {
    case Bound::Compute: return "compute";
    case Bound::Memory: return "memory";
    case Bound::StepOverhead: return "step overhead";
    case Bound::Bubble: return "pipeline bubble";
  }
  return "compute";
}

namespace {

bool transcendental(ir::UnaryFn f) {
  switch (f) {
    case ir::UnaryFn::Exp:
    case ir::UnaryFn::Exp2:
    case ir::UnaryFn::Log:
    case ir::UnaryFn::Sqrt:
    case ir::UnaryFn::Rsqrt:
    case ir::UnaryFn::Tanh:
    case ir::UnaryFn::Sigmoid:
    case ir::UnaryFn::Silu:
    case ir::UnaryFn::GeluTanh:
    case ir::UnaryFn::GeluErf:
    case ir::UnaryFn::Erf:
    case ir::UnaryFn::Sin:
    case ir::UnaryFn::Cos:
    case ir::UnaryFn::Log1p:
    case ir::UnaryFn::Expm1: return true;
    case ir::UnaryFn::Floor:
    case ir::UnaryFn::Ceil:
    case ir::UnaryFn::Round:
    case ir::UnaryFn::BitcastI32:
    case ir::UnaryFn::BitcastF32:
    case ir::UnaryFn::Neg:
    case ir::UnaryFn::Abs:
    case ir::UnaryFn::Not: return false;
  }
  return false;
}

// Work of one step of a loop body, per lane. `product_passes`: result elements of block
// products times their passes over the accumulator (Hardware::product_pass_steps).
struct Work {
  double matrix = 0, vector = 0, transcendental = 0, bytes = 0, product_passes = 0;
  void add(const Work& w, double times) {
    matrix += w.matrix * times;
    product_passes += w.product_passes * times;
    vector += w.vector * times;
    transcendental += w.transcendental * times;
    bytes += w.bytes * times;
  }
};

// A block copy the simulation places on the memory lane.
struct Transfer {
  int operand = 0;      // index into Schedule::operands
  double seconds = 0;   // one block at the core's share of the bandwidth
  int lookahead = 1;    // blocks it may be fetched ahead (its buffers)
  int64_t period = 1;   // grid level: steps between two changes of its block
  bool streams = false; // inner loop: fetched by the hardware's prefetch, which runs ahead of the loop
};

// An inner loop of the grid body, per trip.
struct InnerRun {
  int index = -1;  // in Plan::inner_loops
  int64_t trips = 1;
  double seconds = 0;  // one trip's compute
  std::vector<Transfer> copies, stores;
};

// Compute-lane time by cause, and the two lanes' clocks.
struct Clocks {
  double mem = 0, comp = 0;
  double compute = 0, step = 0, bubble = 0, wait = 0;
};

// The two lanes of one core; events of steps below `record` are kept.
class Lanes {
 public:
  Lanes(bool overlaps, int64_t record, std::vector<Event>* out) : overlaps_(overlaps), record_(record), out_(out) {}

  // A copy or write-back for `step`, issued during step `issued`, no earlier than `earliest`;
  // returns its end.
  double copy(Event::Kind kind, int operand, int64_t step, int64_t trip, int loop, double earliest, double seconds,
              int64_t issued) {
    double& clock = overlaps_ ? c_.mem : c_.comp;
    double start = std::max(clock, earliest);
    if (!overlaps_) c_.wait += start - clock + seconds;  // one lane: the copy holds up compute
    clock = start + seconds;
    if (issued < record_) out_->push_back({Event::Lane::Memory, kind, operand, step, trip, loop, 1, start, clock});
    return clock;
  }

  // Work on the compute lane once `ready`; the wait before it is a bubble or a memory wait.
  double work(Event::Kind kind, int64_t step, int64_t trip, int loop, double ready, double seconds, bool bubble,
              int64_t trips = 1) {
    double start = std::max(c_.comp, ready);
    if (start > c_.comp) {
      (bubble ? c_.bubble : c_.wait) += start - c_.comp;
      if (step < record_)
        out_->push_back({Event::Lane::Compute, bubble ? Event::Kind::Bubble : Event::Kind::Wait, -1, step, trip, loop,
                         1, c_.comp, start});
    }
    c_.comp = start + seconds;
    (kind == Event::Kind::Step ? c_.step : c_.compute) += seconds;
    if (step < record_ && seconds > 0)
      out_->push_back({Event::Lane::Compute, kind, -1, step, trip, loop, trips, start, c_.comp});
    return start;
  }

  const Clocks& clocks() const { return c_; }
  double now() const { return c_.comp; }

 private:
  bool overlaps_;
  int64_t record_;
  std::vector<Event>* out_;
  Clocks c_;
};

// Arrival times of the last `n` blocks of a transfer, by block number.
struct Ring {
  std::vector<double> at;
  explicit Ring(int n = 1) : at(size_t(std::max(n, 1)), 0.0) {}
  double& operator[](int64_t block) { return at[size_t(block % int64_t(at.size()))]; }
};

class Model {
 public:
  Model(const plan::Plan& p, const Hardware& hw) : p_(p), k_(p.kernel), hw_(hw) {}

  Schedule run(int64_t record) {
    Schedule out;
    build(out);
    int64_t cores = std::max(hw_.cores, 1);
    int64_t steps = (p_.grid_size() + cores - 1) / cores;
    out.steps_per_core = steps;
    out.steps = std::min(record, steps);

    // The window simulated event by event: every step of a small grid, else whole periods of
    // the slowest-changing operand (twice, the second for the steady state), within a budget.
    int64_t period = 1;
    for (const Transfer& t : inputs_) period = std::max(period, t.period < steps ? t.period : 1);
    for (const Transfer& t : stores_) period = std::max(period, t.period < steps ? t.period : 1);
    double per_step = double(2 + inputs_.size() + stores_.size());
    for (const InnerRun& r : inner_)
      per_step += r.copies.empty() && r.stores.empty() ? 1 : double(r.trips) * double(1 + r.copies.size() + r.stores.size());
    int64_t budget = std::max<int64_t>(16, int64_t(kEventBudget / per_step));
    int64_t window = steps, half = steps;
    if (steps > budget) {
      if (2 * period <= budget) {
        int64_t periods = std::max<int64_t>(1, std::min(budget / (2 * period), (16 + 2 * period - 1) / (2 * period)));
        window = 2 * period * periods;
      } else {
        window = budget;
      }
      half = window / 2;
    }
    window = std::max(window, record < steps ? record : int64_t(0));
    window = std::min(window, steps);
    half = std::min(half, window);
    out.simulated_steps = window;

    Lanes lanes(hw_.overlaps_copies, record, &out.events);
    Clocks at_half;
    simulate(lanes, window, steps, half, at_half);
    const Clocks& end = lanes.clocks();

    // The steady state's cost per step, by cause, extrapolated over the steps not simulated;
    // blocks that change less often than the window sees are added as copies.
    Prediction& m = out.prediction;
    double rest = double(steps - window), span = double(window - half);
    auto steady = [&](double Clocks::*part) { return span > 0 ? (end.*part - at_half.*part) / span * rest : 0.0; };
    double missed = 0;
    for (const std::vector<Transfer>* list : {&inputs_, &stores_})
      for (const Transfer& t : *list)
        if (t.period > half && t.period < steps) missed += double((steps - 1) / t.period - (window - 1) / t.period) * t.seconds;
    double tail = std::max(end.mem - end.comp, 0.0);  // the last write-backs after the compute
    m.compute_seconds = end.compute + steady(&Clocks::compute);
    m.overhead_seconds = end.step + steady(&Clocks::step);
    m.bubble_seconds = end.bubble + steady(&Clocks::bubble);
    m.memory_seconds = end.wait + tail + steady(&Clocks::wait) + missed;
    m.seconds = m.compute_seconds + m.memory_seconds + m.overhead_seconds + m.bubble_seconds;
    totals(m);
    return out;
  }

 private:
  static constexpr double kEventBudget = 2e5;  // events per prediction (about a millisecond)

  std::vector<Transfer> inputs_, stores_;  // grid level, resident operands among the inputs
  std::vector<InnerRun> inner_;
  double own_seconds_ = 0;  // the grid body's own work per step

  // Looped reductions (a whole dim reduced in blocks): the ops each pass over the dim's blocks
  // runs.
  struct ReducePass {
    std::vector<int> ops;
  };
  std::vector<ReducePass> passes_;
  std::set<int> in_pass_;  // ops that run inside a pass (block by block)
  bool revisits_fit_ = true;  // the row blocks a step's passes revisit stay in fast memory

  double copy_seconds(const plan::BlockSpec& s) const {
    double share = hw_.memory_bytes_per_s / std::max(hw_.cores, 1);  // all cores copy at once
    double runs = segments(s) * step_bytes(s) / block_bytes(s);
    return (share > 0 ? step_bytes(s) / share : 0) + runs * hw_.segment_seconds;
  }

  // Contiguous runs of memory in one block of `s`: its dims from the last inward that cover the
  // whole tensor dim form one run with the first that does not.
  double segments(const plan::BlockSpec& s) const {
    const std::vector<int64_t>& shape = k_.tensors[size_t(s.tensor)].shape;
    double runs = 1;
    size_t d = s.block_shape.size();
    while (d > 0 && s.block_shape[d - 1] >= shape[d - 1]) --d;
    if (d > 0) --d;  // the first partial dim continues the run
    for (size_t i = 0; i < d; ++i) runs *= double(std::max<int64_t>(s.block_shape[i], 1));
    return runs;
  }
  double work_seconds(const Work& w) const {
    return seconds(hw_.matrix_flops, w.matrix + 2 * hw_.product_pass_steps * w.product_passes) +
           seconds(hw_.vector_flops, w.vector) +
           seconds(hw_.transcendental_rate, w.transcendental);
  }
  int operand_of(Schedule& out, const plan::BlockSpec& s) const {
    const std::string& n = k_.tensors[size_t(s.tensor)].name;
    auto it = std::find(out.operands.begin(), out.operands.end(), n);
    if (it != out.operands.end()) return int(it - out.operands.begin());
    out.operands.push_back(n);
    return int(out.operands.size()) - 1;
  }

  // What moves and computes per step, per transfer and per inner loop.
  void build(Schedule& out) {
    find_passes();
    int grid = k_.grid_loop_id();
    int grid_lookahead = hw_.overlaps_copies ? 2 : 1;  // the grid pipeline double-buffers
    for (size_t i = 0; i < p_.operands.size(); ++i) {
      const plan::BlockSpec& s = p_.operands[i];
      if (s.first != int(i)) continue;
      bool grid_level = s.loop == grid, resident = s.placement == plan::Placement::Resident;
      if (!grid_level && !resident) continue;
      Transfer t{operand_of(out, s), copy_seconds(s), grid_lookahead, period(s)};
      if (resident) t.lookahead = std::clamp(inner_loop(s.loop).buffers, 1, 2);
      (s.store ? stores_ : inputs_).push_back(t);
    }
    own_seconds_ = work_seconds(grid_work());
    for (const ir::Stmt& st : k_.grid_loop().body) {
      if (st.kind != ir::Stmt::Kind::Loop) continue;
      InnerRun r;
      const plan::InnerLoop& il = inner_loop(st.id);
      r.index = int(&il - p_.inner_loops.data());
      r.trips = std::max<int64_t>(1, int64_t(trips_of(st.id)));
      r.seconds = work_seconds(body_work(st.id));
      for (size_t i = 0; i < p_.operands.size(); ++i) {
        const plan::BlockSpec& s = p_.operands[i];
        if (s.loop != st.id || s.first != int(i) || s.placement == plan::Placement::Resident) continue;
        Transfer t{operand_of(out, s), copy_seconds(s), 1, 1};
        if (s.placement == plan::Placement::Staged) t.lookahead = std::max(s.buffers, 1);
        else t.lookahead = hw_.prefetches_in_place ? 2 : std::clamp(il.buffers, 1, 2);
        t.streams = s.placement == plan::Placement::InPlace && hw_.prefetches_in_place;
        (s.store ? r.stores : r.copies).push_back(t);
      }
      inner_.push_back(r);
    }
  }

  const plan::InnerLoop& inner_loop(int loop) const {
    for (const plan::InnerLoop& il : p_.inner_loops)
      if (il.loop == loop) return il;
    static const plan::InnerLoop none;
    return none;
  }

  // Steps 0 .. window-1 of the `steps` a core runs; the clocks after step `half` - 1 go to
  // `at_half`.
  void simulate(Lanes& lanes, int64_t window, int64_t steps, int64_t half, Clocks& at_half) const {
    using K = Event::Kind;
    auto changes = [](const Transfer& t, int64_t s) { return s % t.period == 0; };
    std::vector<Ring> arrived, written;
    for (const Transfer& t : inputs_) arrived.emplace_back(t.lookahead);
    for (size_t i = 0; i < stores_.size(); ++i) written.emplace_back(hw_.overlaps_copies ? 2 : 1);
    auto fetch = [&](size_t i, int64_t s, double earliest, int64_t issued) {
      const Transfer& t = inputs_[i];
      if (s < steps && changes(t, s))
        arrived[i][s / t.period] = lanes.copy(K::Copy, t.operand, s, -1, -1, earliest, t.seconds, issued);
    };
    // The prologue: blocks fetched ahead before the first step.
    for (size_t i = 0; i < inputs_.size(); ++i)
      for (int64_t s = 0; s + 1 < inputs_[i].lookahead; ++s) fetch(i, s, 0, 0);
    if (half == 0) at_half = lanes.clocks();
    for (int64_t s = 0; s < window; ++s) {
      // Single-buffered blocks are fetched once the previous step's compute is done.
      for (size_t i = 0; i < inputs_.size(); ++i)
        if (inputs_[i].lookahead == 1) fetch(i, s, lanes.now(), s);
      double ready = 0;
      for (size_t i = 0; i < inputs_.size(); ++i)
        if (changes(inputs_[i], s)) ready = std::max(ready, arrived[i][s / inputs_[i].period]);
      for (size_t i = 0; i < stores_.size(); ++i)  // an output buffer is free once written back
        if (changes(stores_[i], s)) ready = std::max(ready, written[i][s / stores_[i].period]);
      double start = lanes.work(K::Step, s, -1, -1, ready, hw_.step_seconds, false);
      for (size_t i = 0; i < inputs_.size(); ++i)
        if (inputs_[i].lookahead > 1) fetch(i, s + inputs_[i].lookahead - 1, start, s);
      for (const InnerRun& r : inner_) run_inner(lanes, r, s, hw_.trip_seconds);
      lanes.work(K::Compute, s, -1, -1, lanes.now(), own_seconds_, false);
      for (size_t i = 0; i < stores_.size(); ++i) {
        const Transfer& t = stores_[i];
        if ((s + 1) % t.period == 0 || s + 1 == steps)
          written[i][s / t.period] = lanes.copy(K::WriteBack, t.operand, s, -1, -1, lanes.now(), t.seconds, s);
      }
      if (s + 1 == half) at_half = lanes.clocks();
    }
  }

  // One run of an inner loop in grid step `s`: its copies start with the loop (the first trip
  // waits for them), then run as many trips ahead as their buffers allow.
  static void run_inner(Lanes& lanes, const InnerRun& r, int64_t s, double trip_seconds) {
    using K = Event::Kind;
    if (r.copies.empty() && r.stores.empty()) {  // resident or no memory: back-to-back trips
      lanes.work(K::Step, s, 0, r.index, lanes.now(), double(r.trips) * trip_seconds, false, r.trips);
      lanes.work(K::Compute, s, 0, r.index, lanes.now(), double(r.trips) * r.seconds, false, r.trips);
      return;
    }
    std::vector<Ring> arrived;
    for (const Transfer& t : r.copies) arrived.emplace_back(t.lookahead);
    auto fetch = [&](size_t c, int64_t j, double earliest) {
      if (j < r.trips)
        arrived[c][j] = lanes.copy(K::Copy, r.copies[c].operand, s, j, r.index, earliest, r.copies[c].seconds, s);
    };
    double begin = lanes.now();
    int most = 1;
    for (const Transfer& t : r.copies) most = std::max(most, t.lookahead);
    // A prefetched stream does not wait for the loop: its first blocks come as soon as the
    // memory lane is free (no bubble unless memory is behind).
    for (int64_t j = 0; j + 1 < most; ++j)
      for (size_t c = 0; c < r.copies.size(); ++c)
        if (j + 1 < r.copies[c].lookahead) fetch(c, j, r.copies[c].streams ? 0.0 : begin);
    for (int64_t j = 0; j < r.trips; ++j) {
      for (size_t c = 0; c < r.copies.size(); ++c)
        if (r.copies[c].lookahead == 1) fetch(c, j, lanes.now());
      double ready = 0;
      for (size_t c = 0; c < r.copies.size(); ++c) ready = std::max(ready, arrived[c][j]);
      lanes.work(K::Step, s, j, r.index, lanes.now(), trip_seconds, false);
      double start = lanes.work(K::Compute, s, j, r.index, ready, r.seconds, j == 0);
      for (size_t c = 0; c < r.copies.size(); ++c)
        if (r.copies[c].lookahead > 1) fetch(c, j + r.copies[c].lookahead - 1, start);
      for (const Transfer& t : r.stores) lanes.copy(K::WriteBack, t.operand, s, j, r.index, lanes.now(), t.seconds, s);
    }
  }

  // The whole kernel's work and traffic, what bounds it and its share of the peak.
  void totals(Prediction& out) const {
    double grid = double(p_.grid_size());
    Work step = grid_work();
    for (const ir::Stmt& s : k_.grid_loop().body) {
      if (s.kind != ir::Stmt::Kind::Loop) continue;
      step.add(body_work(s.id), trips_of(s.id));
      step.bytes += resident_bytes(s.id);
    }
    step.bytes += grid_bytes();
    out.flops = grid * (step.matrix + step.vector + step.transcendental);
    out.bytes = grid * step.bytes;
    double parts[] = {out.compute_seconds, out.memory_seconds, out.overhead_seconds, out.bubble_seconds};
    out.bound = Bound(std::max_element(parts, parts + 4) - parts);
    double peak_flops = hw_.cores * (step.matrix > 0 ? hw_.matrix_flops : hw_.vector_flops);
    if (out.seconds > 0)
      out.peak_fraction = out.bound == Bound::Compute
                              ? (peak_flops > 0 ? out.flops / out.seconds / peak_flops : 0)
                              : (hw_.memory_bytes_per_s > 0 ? out.bytes / out.seconds / hw_.memory_bytes_per_s : 0);
  }

 private:
  const plan::Plan& p_;
  const ir::Kernel& k_;
  const Hardware& hw_;

  static double seconds(double rate, double work) { return rate > 0 ? work / rate : 0; }

  // Blocks an inner loop runs per grid step: a loop ending on the device half of them.
  double trips_of(int loop) const {
    const ir::Loop& l = k_.loop(loop);
    int axis = l.axes.front();
    double span = double(std::max<int64_t>(k_.axis(axis).extent - l.begin.front().constant, 1));
    double trips = std::ceil(span / double(p_.block[size_t(axis)]));
    return l.end.front().value >= 0 ? std::max(1.0, std::ceil(trips / 2)) : trips;
  }

  double block_bytes(const plan::BlockSpec& s) const {
    double elements = 1;
    for (int64_t b : s.block_shape) elements *= double(b);
    if (s.placement == plan::Placement::Resident && s.elements > 0) elements = double(s.elements);
    double size = dtype_size(k_.tensors[size_t(s.tensor)].dtype);
    if (hw_.line_bytes > 0 && !s.block_shape.empty() && s.block_shape.back() > 0) {
      // A row shorter than a line (or not a whole number of them) moves its whole lines.
      double row = double(s.block_shape.back()) * size;
      elements *= std::ceil(row / hw_.line_bytes) * hw_.line_bytes / row;
    }
    return elements * size;
  }

  // How much a value's last dim is padded to whole vectors (1 when it fills them).
  double lane_padding(ir::ValueId v) const {
    const std::vector<int>& dims = k_.value(v).dims;
    if (hw_.vector_lanes <= 1 || dims.empty() || dims.back() == ir::kOne) return 1;
    double inner = double(p_.storage_extent(dims.back()));
    return std::ceil(inner / hw_.vector_lanes) * hw_.vector_lanes / inner;
  }

  // A block product's result elements, its last two dims padded to the matrix unit's tile.
  double matrix_tiles(ir::ValueId v) const {
    const std::vector<int>& dims = k_.value(v).dims;
    auto extent = [&](int d) { return d == ir::kOne ? 1.0 : double(p_.storage_extent(d)); };
    auto padded = [](double n, int tile) { return tile > 1 ? std::ceil(n / tile) * tile : n; };
    double n = 1;
    for (size_t i = 0; i < dims.size(); ++i) {
      double e = extent(dims[i]);
      if (i + 1 == dims.size()) e = padded(e, hw_.matrix_tile_cols);
      else if (i + 2 == dims.size()) e = padded(e, hw_.matrix_tile_rows);
      n *= e;
    }
    return n;
  }

  // Grid steps between two changes of the block of `s`: 1 when it changes every step, n when
  // the fastest grid axis its index follows changes every n steps, the grid when it never does.
  int64_t period(const plan::BlockSpec& s) const {
    std::set<int> follows;
    for (const plan::IndexTerm& t : s.index_map) {
      if (t.kind == plan::IndexTerm::Kind::Block && t.grid) follows.insert(t.axis);
      if (t.kind == plan::IndexTerm::Kind::Scalar && t.grid_axis >= 0) follows.insert(t.grid_axis);
    }
    int64_t inner_steps = 1;  // steps between two changes of the fastest followed axis
    for (size_t i = p_.grid_axes.size(); i-- > 0;) {
      if (follows.count(p_.grid_axes[i])) return inner_steps;
      inner_steps *= p_.grid_blocks[i];
    }
    return inner_steps;
  }
  double refetch_fraction(const plan::BlockSpec& s) const { return 1.0 / double(period(s)); }

  // Bytes of the distinct blocks of `loop` (each once) that `pick` selects, each weighted by
  // `weight` (how often it moves per grid step).
  template <typename Pick, typename Weight>
  double bytes_of(int loop, Pick pick, Weight weight) const {
    double bytes = 0;
    for (size_t i = 0; i < p_.operands.size(); ++i) {
      const plan::BlockSpec& s = p_.operands[i];
      if (s.loop == loop && s.first == int(i) && pick(s)) bytes += block_bytes(s) * weight(s);
    }
    return bytes;
  }

  double grid_bytes() const {
    return bytes_of(k_.grid_loop_id(), [](const plan::BlockSpec&) { return true; },
                    [this](const plan::BlockSpec& s) { return refetch_fraction(s) * step_bytes(s) / block_bytes(s); });
  }

  // The passes of looped reductions and the ops they run block by block, as the generators
  // write them (plan::walk_reduce_loop): a value a pass needs over the dim is recomputed in it.
  void find_passes() {
    plan::ReduceLoops rls = plan::find_reduce_loops(p_);
    std::set<ir::ValueId> emitted;
    double revisited = 0;
    for (const plan::ReduceLoop& rl : rls.loops) {
      ReducePass pass;
      plan::walk_reduce_loop(p_, rl, false, emitted, [](const ir::Op&) {}, [&](const ir::Op& op, bool inside) {
        if (!inside) return;
        int id = int(&op - k_.ops.data());
        pass.ops.push_back(id);
        in_pass_.insert(id);
      });
      passes_.push_back(std::move(pass));
    }
    for (size_t i = 0; i < p_.operands.size(); ++i)
      if (p_.operands[i].first == int(i) && looped_blocks(p_.operands[i]) > 1) revisited += step_bytes_once(p_.operands[i]);
    revisits_fit_ = hw_.fast_memory_bytes <= 0 || revisited <= hw_.fast_memory_bytes;
  }

  // Blocks of a looped reduction's dim that one grid step's access covers (1 when none).
  int64_t looped_blocks(const plan::BlockSpec& s) const {
    int64_t n = 1;
    for (const plan::IndexTerm& t : s.index_map)
      if (t.kind == plan::IndexTerm::Kind::Looped) {
        int64_t extent = k_.axis(t.axis).extent, block = std::max<int64_t>(p_.block[size_t(t.axis)], 1);
        n *= (extent + block - 1) / block;
      }
    return n;
  }
  // A grid-level access over a looped dim moves its whole row of blocks per step.
  double step_bytes_once(const plan::BlockSpec& s) const { return block_bytes(s) * double(looped_blocks(s)); }
  // ... once, or once per pass that reads it when the revisited rows do not stay in fast memory.
  double step_bytes(const plan::BlockSpec& s) const {
    double bytes = step_bytes_once(s);
    if (revisits_fit_ || s.store || looped_blocks(s) == 1) return bytes;
    int readers = 0;
    for (const ReducePass& pass : passes_)
      readers += std::any_of(pass.ops.begin(), pass.ops.end(), [&](int o) {
        const plan::BlockSpec* t = p_.spec_for_op(o);
        return t && t->first == s.first;
      });
    return bytes * std::max(readers, 1);
  }

  // One grid step's own work: its body, and each looped reduction's pass over the whole dim
  // (a value over the dim counts its whole extent, Plan::block_elements).
  Work grid_work() const {
    Work w = body_work(k_.grid_loop_id());
    for (const ReducePass& pass : passes_)
      for (int o : pass.ops) add_op_work(w, k_.op(o));
    return w;
  }

  // A resident operand: its loop's whole extent, fetched when its outer block changes.
  double resident_bytes(int loop) const {
    return bytes_of(loop, [](const plan::BlockSpec& s) { return s.placement == plan::Placement::Resident; },
                    [this](const plan::BlockSpec& s) { return refetch_fraction(s); });
  }

  // One pass over a loop's own statements (not its nested loops, nor the grid loop's looped
  // reduction passes: grid_work adds those).
  Work body_work(int loop) const {
    Work w;
    bool grid_level = loop == k_.grid_loop_id();
    for (const ir::Stmt& st : k_.loop(loop).body) {
      if (st.kind != ir::Stmt::Kind::Op || (grid_level && in_pass_.count(st.id))) continue;
      const ir::Op& op = k_.op(st.id);
      if (op.kind == ir::OpKind::Load || op.kind == ir::OpKind::Store) {
        const plan::BlockSpec* s = p_.spec_for_op(st.id);
        if (s && !grid_level && s->placement != plan::Placement::Resident && s->first == int(s - p_.operands.data()))
          w.bytes += block_bytes(*s);
        continue;
      }
      add_op_work(w, op);
    }
    return w;
  }

  // The matrix, vector and transcendental work of one computed op on its block.
  void add_op_work(Work& w, const ir::Op& op) const {
    if (op.result < 0 || !p_.computed[size_t(op.result)]) return;
    double elements = double(p_.block_elements(op.result)) * lane_padding(op.result);
    switch (op.kind) {
      case ir::OpKind::Dot: {
        int contracted = k_.value(op.inputs[0]).dims.back();
        double kdim = contracted == ir::kOne ? 1 : double(p_.storage_extent(contracted));
        w.matrix += 2 * matrix_tiles(op.result) * kdim;
        if (hw_.product_pass_steps > 0)
          w.product_passes += matrix_tiles(op.result) *
                              (hw_.product_k_chunk > 0 ? std::ceil(kdim / double(hw_.product_k_chunk)) : 1.0);
        break;
      }
      case ir::OpKind::Unary:
        (transcendental(op.unary) ? w.transcendental : w.vector) += elements;
        break;
      case ir::OpKind::Reduce:
        w.vector += double(p_.block_elements(op.inputs[0])) * lane_padding(op.inputs[0]);
        break;
      case ir::OpKind::Binary:
      case ir::OpKind::Where:
      case ir::OpKind::Cast: w.vector += elements; break;
      case ir::OpKind::Scan:  // its combine's ops once per element (a sequential scan's count)
        w.vector += elements * double(std::max<size_t>(k_.combines[size_t(op.combine)].ops.size(), 1));
        break;
      default: break;  // loads, stores, views, constants, indices: free
    }
  }
};

}  // namespace

const char* name(Event::Kind k) {
  switch (k) {
    case Event::Kind::Copy: return "copy";
    case Event::Kind::WriteBack: return "write-back";
    case Event::Kind::Compute: return "compute";
    case Event::Kind::Step: return "step";
    case Event::Kind::Wait: return "wait";
    case Event::Kind::Bubble: return "bubble";
  }
  return "compute";
}

Prediction predict(const plan::Plan& p, const Hardware& hw) { return Model(p, hw).run(0).prediction; }

Schedule schedule(const plan::Plan& p, const Hardware& hw, int64_t steps) { return Model(p, hw).run(steps); }

}  // namespace deuteron::model
