// Steps 1 and 2: the block size of every axis, which axes end in a partial block, each
// reduction's strategy, and the grid.
#include <algorithm>

#include <fmt/format.h>

#include "config/keys.h"
#include "deuteron/error.h"
#include "plan/steps.h"

namespace deuteron::plan {

void choose_blocks(Lowering& l) {
  const ir::Kernel& k = l.k;
  const config::Config& c = l.p.config;
  Plan& p = l.p;
  p.block.resize(k.axes.size());
  p.persistent.assign(k.axes.size(), false);
  p.partial.assign(k.axes.size(), false);
  for (size_t a = 0; a < k.axes.size(); ++a) {
    const ir::Axis& ax = k.axes[a];
    if (ax.kind == ir::AxisKind::Fixed) {
      p.block[a] = ax.extent;
      p.persistent[a] = true;
      continue;
    }
    const ir::BlockParam& bp = k.block_params[size_t(ax.block_param)];
    int64_t b = bp.fixed ? bp.fixed : c.integer(bp.name);
    if (b < 1 || (b & (b - 1)))
      throw ConfigError(fmt::format("block size {} = {} is not a positive power of two", bp.name, b));
    if (ax.kind == ir::AxisKind::Reduction) {
      p.persistent[a] = b >= ax.extent;
      p.block[a] = p.persistent[a] ? ax.extent : b;
      p.partial[a] = ax.extent % p.block[a] != 0;
      continue;
    }
    p.block[a] = b;
    // A tile loop with device-computed bounds may end anywhere.
    const ir::Loop& loop = k.loop(ax.loop);
    size_t i = size_t(std::find(loop.axes.begin(), loop.axes.end(), int(a)) - loop.axes.begin());
    const ir::Bound& begin = loop.begin[i];
    int64_t span = std::max<int64_t>(ax.extent - begin.constant, 0);  // indices run below the extent
    p.partial[a] = begin.value >= 0 || loop.end[i].value >= 0 || span % b != 0;
  }
  for (size_t o = 0; o < k.ops.size(); ++o) {
    const ir::Op& op = k.ops[o];
    if (op.kind != ir::OpKind::Reduce || l.loop_of[o] < 0) continue;
    int axis = k.value(op.inputs[0]).dims[size_t(op.dim)];
    if (axis == ir::kOne) continue;
    p.reductions.push_back({int(o), axis, bool(p.persistent[size_t(axis)]), p.block[size_t(axis)]});
  }
  // A scan's running value does not cross blocks: the dim it runs along is one block.
  for (size_t o = 0; o < k.ops.size(); ++o) {
    const ir::Op& op = k.ops[o];
    if (op.kind != ir::OpKind::Scan || l.loop_of[o] < 0) continue;
    int axis = k.value(op.inputs[0]).dims[size_t(op.dim)];
    if (axis == ir::kOne || p.persistent[size_t(axis)]) continue;
    const ir::BlockParam& bp = k.block_params[size_t(k.axes[size_t(axis)].block_param)];
    throw ConfigError(fmt::format("{} = {} splits dim {} ({} elements) into blocks, but a scan runs along it, and a "
                                  "scan's running value is not carried from one block to the next",
                                  bp.name, p.block[size_t(axis)], k.axes[size_t(axis)].name, k.axes[size_t(axis)].extent),
                      format_location(op.loc), fmt::format("set {} to {} (the whole dim in one block)", bp.name, bp.max));
  }
}

void lay_out_grid(Lowering& l) {
  const ir::Kernel& k = l.k;
  Plan& p = l.p;
  const ir::Loop& grid = k.grid_loop();
  std::vector<int> order(grid.axes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  if (p.config.has(config::keys::kGridOrder))
    order = p.config.values().at(config::keys::kGridOrder).get<std::vector<int>>();
  for (int i : order) {
    int a = grid.axes[size_t(i)];
    int64_t extent = k.axis(a).extent - grid.begin[size_t(i)].constant;
    p.grid_axes.push_back(a);
    p.grid_blocks.push_back((std::max<int64_t>(extent, 0) + p.block[size_t(a)] - 1) / p.block[size_t(a)]);
  }
}

}  // namespace deuteron::plan
