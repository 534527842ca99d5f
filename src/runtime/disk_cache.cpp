#include "runtime/disk_cache.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <system_error>

#include "deuteron/error.h"

namespace deuteron {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int err) { return std::generic_category().message(err); }

fs::path env_path(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? fs::path(v) : fs::path();
}

}  // namespace

fs::path cache_root() {
  fs::path root = env_path("DEUTERON_CACHE_DIR");
  if (root.empty()) {
    fs::path xdg = env_path("XDG_CACHE_HOME");
    if (!xdg.empty()) {
      root = xdg / "deuteron";
    } else {
      fs::path home = env_path("HOME");
      if (home.empty())
        throw RuntimeError("cannot locate the cache directory: HOME is not set", "",
                           "set DEUTERON_CACHE_DIR to a writable directory");
      root = home / ".cache" / "deuteron";
    }
  }
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec)
    throw RuntimeError("cannot create cache directory " + root.string() + ": " + ec.message(), "",
                       "set DEUTERON_CACHE_DIR to a writable directory");
  return root;
}

std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  // One random draw per process: distinguishes processes whose pids are reused (containers).
  static const uint64_t salt = [] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%ld-%llu-%08llx", long(getpid()),
                (unsigned long long)counter.fetch_add(1), (unsigned long long)(salt & 0xffffffffu));
  return buf;
}

void atomic_write(const fs::path& path, std::string_view bytes) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  if (ec) throw RuntimeError("cannot create directory for " + path.string() + ": " + ec.message());

  // Same directory as the target so rename() is atomic (no cross-device move).
  fs::path tmp = path;
  tmp += ".tmp-" + unique_suffix();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw RuntimeError("cannot write " + tmp.string() + ": " + errno_text(errno));

  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw RuntimeError("cannot write " + path.string() + ": " + errno_text(err));
    }
    p += n;
    left -= size_t(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw RuntimeError("cannot write " + path.string() + ": " + errno_text(err));
  }
}

std::optional<std::string> read_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw RuntimeError("cannot read " + path.string() + ": " + errno_text(errno));
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw RuntimeError("cannot read " + path.string() + ": " + errno_text(err));
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

std::string hash_hex(std::string_view bytes) {
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  // The canonical form is big-endian, so the text does not depend on the host's byte order.
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  static const char* digits = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = digits[c.digest[i] >> 4];
    out[2 * i + 1] = digits[c.digest[i] & 15];
  }
  return out;
}

fs::path resource_dir(std::string_view kind,
                      const std::vector<std::pair<std::string_view, std::string_view>>& files) {
  std::string all;
  for (const auto& [name, text] : files)
    all.append(name).append("\n").append(std::to_string(text.size())).append("\n").append(text);
  fs::path dir = cache_root() / "resources" / (std::string(kind) + "-" + hash_hex(all).substr(0, 16));
  std::error_code ec;
  for (const auto& [name, text] : files)
    if (!fs::exists(dir / name, ec)) atomic_write(dir / name, text);
  return dir;
}

}  // namespace deuteron
