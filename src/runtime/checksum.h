// Checksums of the cached artifacts this process loads or runs: compiled kernels, the tuner's
// runner program, precompiled headers. When one is written, a trailer holding the XXH3-128 of
// its bytes is appended (ELF loaders and GCC ignore bytes past what their headers describe);
// before it is used, the file is opened without following symlinks, its owner and mode are
// checked (runtime/disk_cache.h) and the trailer is checked against its bytes (then it is
// loaded by its path: the cache's folders are private, so no one else can swap it meanwhile). A truncated,
// zeroed or overwritten artifact then reads as damaged, and is rebuilt, instead of crashing
// the process that maps it.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>

namespace deuteron::runtime {

// Appends the checksum trailer to the file at `path` (just written, not yet renamed into
// place) and sets its mode to `mode` exactly. Throws RuntimeError naming the path.
void seal_artifact(const std::filesystem::path& path, mode_t mode);

// What check_artifact found.
struct ArtifactCheck {
  bool exists = false;
  // Why it cannot be used, empty when it can: "is truncated or damaged (its checksum does not
  // match)", "is owned by another user (uid 65534)", "is a symbolic link", ...
  std::string problem;
  bool ok() const { return exists && problem.empty(); }
};
// Checks the artifact at `path` (not following a symlink): owner, mode and checksum.
ArtifactCheck check_artifact(const std::filesystem::path& path);

}  // namespace deuteron::runtime
