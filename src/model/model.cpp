#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "ir/ops.h"

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

// Work of one step of a loop body, per lane.
struct Work {
  double matrix = 0, vector = 0, transcendental = 0, bytes = 0;
  void add(const Work& w, double times) {
    matrix += w.matrix * times;
    vector += w.vector * times;
    transcendental += w.transcendental * times;
    bytes += w.bytes * times;
  }
};

class Model {
 public:
  Model(const plan::Plan& p, const Hardware& hw) : p_(p), k_(p.kernel), hw_(hw) {}

  Prediction run() {
    double grid = double(p_.grid_size());
    Work step = body_work(k_.grid_loop_id());
    double bubble_bytes = 0;
    for (const ir::Stmt& s : k_.grid_loop().body) {
      if (s.kind != ir::Stmt::Kind::Loop) continue;
      double trips = trips_of(s.id);
      step.add(body_work(s.id), trips);
      step.bytes += resident_bytes(s.id);
      bubble_bytes += first_staged_bytes(s.id);
    }
    step.bytes += grid_bytes();

    double share = hw_.memory_bytes_per_s / std::max(hw_.cores, 1);  // all cores copy at once
    double memory = share > 0 ? step.bytes / share : 0;
    double compute = seconds(hw_.matrix_flops, step.matrix) + seconds(hw_.vector_flops, step.vector) +
                     seconds(hw_.transcendental_rate, step.transcendental);
    double steps = std::ceil(grid / std::max(hw_.cores, 1));

    Prediction out;
    if (hw_.overlaps_copies) {
      (compute >= memory ? out.compute_seconds : out.memory_seconds) = steps * std::max(compute, memory);
    } else {
      out.compute_seconds = steps * compute;
      out.memory_seconds = steps * memory;
    }
    out.overhead_seconds = steps * hw_.step_seconds;
    out.bubble_seconds = share > 0 ? steps * bubble_bytes / share : 0;
    out.seconds = out.compute_seconds + out.memory_seconds + out.overhead_seconds + out.bubble_seconds;
    out.flops = grid * (step.matrix + step.vector + step.transcendental);
    out.bytes = grid * step.bytes;
    double parts[] = {out.compute_seconds, out.memory_seconds, out.overhead_seconds, out.bubble_seconds};
    out.bound = Bound(std::max_element(parts, parts + 4) - parts);
    double peak_flops = hw_.cores * (step.matrix > 0 ? hw_.matrix_flops : hw_.vector_flops);
    if (out.seconds > 0)
      out.peak_fraction = out.bound == Bound::Compute
                              ? (peak_flops > 0 ? out.flops / out.seconds / peak_flops : 0)
                              : (hw_.memory_bytes_per_s > 0 ? out.bytes / out.seconds / hw_.memory_bytes_per_s : 0);
    return out;
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
    return elements * dtype_size(k_.tensors[size_t(s.tensor)].dtype);
  }

  // How often the block of `s` changes along the grid: 1 when it changes every step, 1/n when
  // the fastest grid axis its index follows changes every n steps, 1/grid when it never does.
  double refetch_fraction(const plan::BlockSpec& s) const {
    std::set<int> follows;
    for (const plan::IndexTerm& t : s.index_map) {
      if (t.kind == plan::IndexTerm::Kind::Block && t.grid) follows.insert(t.axis);
      if (t.kind == plan::IndexTerm::Kind::Scalar && t.grid_axis >= 0) follows.insert(t.grid_axis);
    }
    double inner_steps = 1;  // steps between two changes of the fastest followed axis
    for (size_t i = p_.grid_axes.size(); i-- > 0;) {
      if (follows.count(p_.grid_axes[i])) return 1.0 / inner_steps;
      inner_steps *= double(p_.grid_blocks[i]);
    }
    return 1.0 / inner_steps;
  }

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
                    [this](const plan::BlockSpec& s) { return refetch_fraction(s); });
  }

  // A resident operand: its loop's whole extent, fetched when its outer block changes.
  double resident_bytes(int loop) const {
    return bytes_of(loop, [](const plan::BlockSpec& s) { return s.placement == plan::Placement::Resident; },
                    [this](const plan::BlockSpec& s) { return refetch_fraction(s); });
  }

  // What a streaming loop waits for before its first trip.
  double first_staged_bytes(int loop) const {
    return bytes_of(loop, [](const plan::BlockSpec& s) { return s.placement == plan::Placement::Staged && !s.store; },
                    [](const plan::BlockSpec&) { return 1.0; });
  }

  // One pass over a loop's own statements (not its nested loops).
  Work body_work(int loop) const {
    Work w;
    for (const ir::Stmt& st : k_.loop(loop).body) {
      if (st.kind != ir::Stmt::Kind::Op) continue;
      const ir::Op& op = k_.op(st.id);
      if (op.kind == ir::OpKind::Load || op.kind == ir::OpKind::Store) {
        const plan::BlockSpec* s = p_.spec_for_op(st.id);
        bool grid_level = loop == k_.grid_loop_id();
        if (s && !grid_level && s->placement != plan::Placement::Resident && s->first == int(s - p_.operands.data()))
          w.bytes += block_bytes(*s);
        continue;
      }
      if (op.result < 0 || !p_.computed[size_t(op.result)]) continue;
      double elements = double(p_.block_elements(op.result));
      switch (op.kind) {
        case ir::OpKind::Dot: {
          int contracted = k_.value(op.inputs[0]).dims.back();
          double kdim = contracted == ir::kOne ? 1 : double(p_.storage_extent(contracted));
          w.matrix += 2 * elements * kdim;
          break;
        }
        case ir::OpKind::Unary:
          (transcendental(op.unary) ? w.transcendental : w.vector) += elements;
          break;
        case ir::OpKind::Reduce: w.vector += double(p_.block_elements(op.inputs[0])); break;
        case ir::OpKind::Binary:
        case ir::OpKind::Where:
        case ir::OpKind::Cast: w.vector += elements; break;
        default: break;  // views, constants, indices: free
      }
    }
    return w;
  }
};

}  // namespace

Prediction predict(const plan::Plan& p, const Hardware& hw) { return Model(p, hw).run(); }

}  // namespace deuteron::model
