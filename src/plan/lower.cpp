// plan::lower: the IR and a config through the lowering steps, in order. Each step is in its
// own file (steps.h says which); DEUTERON_DUMP_PLAN=1 prints the plan after every step.
#include <cstdlib>
#include <iostream>

#include <fmt/format.h>

#include "plan/steps.h"

namespace deuteron::plan {

Plan lower(const ir::Kernel& k, const config::Config& c, const std::string& target) {
  Lowering l{.p = {},
             .k = k,
             .loop_of = ir::loop_of_ops(k),
             .uses = ir::use_counts(k),
             .index_arithmetic = index_arithmetic_values(k),
             .absorbed = {},
             .absorbed_values = {}};
  l.p.target = target;
  l.p.kernel = k;
  l.p.config = c;
  const char* dump = std::getenv("DEUTERON_DUMP_PLAN");
  bool dumping = dump && *dump && std::string(dump) != "0";
  struct Step {
    const char* name;
    void (*run)(Lowering&);
  };
  static constexpr Step kSteps[] = {
      {"choose_blocks", choose_blocks},
      {"lay_out_grid", lay_out_grid},
      {"find_dots", find_dots},
      {"find_triangles", find_triangles},
      {"group_bodies", group_bodies},
      {"choose_inner_loops", choose_inner_loops},
      {"build_block_specs", build_block_specs},
      {"place_values", place_values},
      {"mark_computed", mark_computed},
  };
  for (const Step& s : kSteps) {
    s.run(l);
    if (dumping) std::cerr << fmt::format("--- plan of '{}' after {} ---\n{}", k.name, s.name, print(l.p));
  }
  return std::move(l.p);
}

}  // namespace deuteron::plan
