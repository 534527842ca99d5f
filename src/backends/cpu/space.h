// The cpu target's part of the config space: its own tunables (threads, grid traversal,
// epilogue sub-tiles) and defaults that suit its micro-kernel, and the keys it reads back.
#pragma once

#include "config/config.h"
#include "ir/ir.h"

namespace deuteron::cpu {

inline constexpr const char* kNumThreads = "num_threads";
inline constexpr const char* kGridGroup = "grid_group";
inline constexpr const char* kEpilogueSubtiles = "epilogue_subtiles";
// How outputs are written: through the cache (plain stores) or past it (streaming stores).
inline constexpr const char* kStores = "stores";
inline constexpr const char* kStoresCached = "cached";
inline constexpr const char* kStoresStream = "stream";

void extend_space(const ir::Kernel& k, const config::TargetLimits& limits, config::ConfigSpace& space);

}  // namespace deuteron::cpu
