#include "runtime/checksum.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "deuteron/error.h"
#include "runtime/disk_cache.h"

namespace deuteron::runtime {

namespace fs = std::filesystem;

namespace {

// "\n<tag><32 hex digits>\n" closes every sealed artifact.
constexpr std::string_view kTag = "deuteron-checksum xxh3-128 ";
constexpr size_t kTrailerSize = 1 + kTag.size() + 32 + 1;

std::string trailer(std::string_view bytes) { return fmt::format("\n{}{}\n", kTag, hash_hex(bytes)); }

// Whether `bytes` ends in the trailer of what precedes it.
bool intact(std::string_view bytes) {
  if (bytes.size() < kTrailerSize) return false;
  std::string_view body = bytes.substr(0, bytes.size() - kTrailerSize);
  return bytes.substr(body.size()) == trailer(body);
}

// All of an open file's bytes (read from offset 0, the descriptor stays open).
std::optional<std::string> read_whole(int fd) {
  std::string out;
  char buf[1 << 16];
  for (off_t at = 0;;) {
    ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) return out;
    out.append(buf, size_t(n));
    at += n;
  }
}

}  // namespace

void seal_artifact(const fs::path& path, mode_t mode) {
  int fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
  std::optional<std::string> bytes = fd >= 0 ? read_whole(fd) : std::nullopt;
  bool ok = bytes.has_value();
  if (ok) {
    std::string t = trailer(*bytes);
    ok = ::write(fd, t.data(), t.size()) == ssize_t(t.size()) && ::fchmod(fd, mode) == 0;
  }
  int err = errno;
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  if (!ok) throw RuntimeError(fmt::format("cannot write {}: {}", path.string(), std::strerror(err)));
}

ArtifactCheck check_artifact(const fs::path& path) {
  ArtifactCheck c;
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    c.exists = errno != ENOENT;
    c.problem = errno == ELOOP ? "is a symbolic link" : fmt::format("cannot be read ({})", std::strerror(errno));
    return c;
  }
  c.exists = true;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    c.problem = "is not a regular file";
  } else if (std::string why = ownership_problem(st); !why.empty()) {
    c.problem = why;
  } else if (std::optional<std::string> bytes = read_whole(fd); !bytes) {
    c.problem = "cannot be read";
  } else if (!intact(*bytes)) {
    c.problem = "is truncated or damaged (its checksum does not match)";
  }
  ::close(fd);
  return c;
}

}  // namespace deuteron::runtime
