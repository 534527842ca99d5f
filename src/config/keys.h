// The names of the config keys, written once: the space derives them, the plan and the targets
// read them through these functions, so no key is ever assembled from strings in two places.
#pragma once

#include <string>

namespace deuteron::config::keys {

// Order of the grid axes, fastest-varying last (a permutation of the grid loop's axes).
inline constexpr const char* kGridOrder = "grid_order";

// The strategy of the inner loop over `axis`: in_place, stream or resident.
inline std::string inner_loop(const std::string& axis) { return "inner_" + axis; }
// Blocks staged ahead by a streamed inner loop over `axis`.
inline std::string buffers(const std::string& axis) { return "buffers_" + axis; }
// The strategy of one tensor read in the inner loop over `axis`; kFollowLoop defers to the loop.
inline std::string operand(const std::string& axis, const std::string& tensor) {
  return "inner_" + axis + "_" + tensor;
}
inline constexpr const char* kFollowLoop = "loop";

// The strategy values, as configs spell them.
inline constexpr const char* kInPlace = "in_place";
inline constexpr const char* kStream = "stream";
inline constexpr const char* kResident = "resident";

}  // namespace deuteron::config::keys
