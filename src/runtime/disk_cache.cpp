#include "runtime/disk_cache.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string_view>
#include <vector>
#include <system_error>

#include <fmt/format.h>

#include "deuteron/error.h"
#include "runtime/env.h"

namespace deuteron {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int err) { return std::generic_category().message(err); }

fs::path env_path(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? fs::path(v) : fs::path();
}

const char* kMarkerText =
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file marks a cache folder of Deuteron (https://bford.info/cachedir/).\n"
    "# `deuteron cache clear --all` removes only what Deuteron wrote here.\n";

// Names Deuteron writes at the top of its cache (see cache_clear in the CLI for the rest).
bool layout_name(const std::string& name) {
  return name == kCacheMarker || name == "cpu" || name == "pallas" || name == "autotune" || name == "resources" ||
         (name.rfind("roofline-", 0) == 0 && name.size() > 14 && name.substr(name.size() - 5) == ".json") ||
         name.find(".tmp-") != std::string::npos;
}

// Marks `root` as Deuteron's when nothing else is in it (new, empty, or only Deuteron's own
// layout: a cache from before the marker), so that `cache clear --all` never takes a folder
// that merely happens to be DEUTERON_CACHE_DIR for one.
void mark(const fs::path& root) {
  std::error_code ec;
  if (fs::exists(root / kCacheMarker, ec)) return;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (!layout_name(e.path().filename().string())) return;
  atomic_write(root / kCacheMarker, kMarkerText);
}

// The pid in a temporary name "...<tag><pid>-<counter>-<random>", or 0.
pid_t owner_pid(const std::string& name, const std::string& tag) {
  size_t at = name.rfind(tag);
  if (at == std::string::npos) return 0;
  const char* p = name.c_str() + at + tag.size();
  char* end = nullptr;
  long pid = std::strtol(p, &end, 10);
  return end != p && *end == '-' && pid > 0 ? pid_t(pid) : 0;
}

bool dead(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// Removes the temporary files and folders in `dir` (and two levels below) whose writer has
// died (a SIGKILL between writing and renaming them).
void sweep(const fs::path& dir, const std::string& tag, int depth) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (pid_t pid = owner_pid(name, tag); pid > 0) {
      struct stat st;
      if (::lstat(e.path().c_str(), &st) == 0 && st.st_uid == geteuid() && dead(pid)) fs::remove_all(e.path(), ec);
    } else if (depth > 0 && e.is_directory(ec) && !e.is_symlink(ec)) {
      sweep(e.path(), tag, depth - 1);
    }
  }
}

// Once per process and cache folder: the marker, and the leftovers of dead processes (in
// the cache, and the pallas runner's folders in the temporary directory).
void first_use(const fs::path& root) {
  static std::mutex mu;
  static std::set<std::string> done;
  {
    std::lock_guard lock(mu);
    if (!done.insert(root.string()).second) return;
  }
  mark(root);
  sweep(root, ".tmp-", 2);
  if (std::optional<fs::path> tmp = runtime::temp_dir_if_valid()) sweep(*tmp, runtime::kTempDirPrefix, 0);
}

}  // namespace

void make_private_dirs(const fs::path& dir) {
  fs::path at;
  for (const fs::path& part : dir) {
    at /= part;
    if (::mkdir(at.c_str(), 0700) == 0) {
      // mkdir's mode passes through the umask; the folder must be exactly 0700.
      if (::chmod(at.c_str(), 0700) != 0)
        throw RuntimeError(fmt::format("cannot set the mode of {}: {}", at.string(), errno_text(errno)));
    } else if (errno != EEXIST) {
      throw RuntimeError(fmt::format("cannot create directory {}: {}", at.string(), errno_text(errno)));
    }
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw RuntimeError(fmt::format("cannot create directory {}: a file of that name is in the way", dir.string()));
}

std::string ownership_problem(const struct stat& st) {
  if (st.st_uid != geteuid() && st.st_uid != 0)
    return fmt::format("is owned by another user (uid {})", st.st_uid);
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return fmt::format("is writable by others (mode {:04o})", st.st_mode & 07777);
  return "";
}

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
  try {
    make_private_dirs(root);
  } catch (const RuntimeError& e) {
    throw RuntimeError(fmt::format("cannot create the cache directory {}: {}", root.string(), e.message()), "",
                       "set DEUTERON_CACHE_DIR to a writable directory");
  }
  struct stat st;
  if (::stat(root.c_str(), &st) != 0)
    throw RuntimeError(fmt::format("cannot read the cache directory {}: {}", root.string(), errno_text(errno)));
  if (std::string problem = ownership_problem(st); !problem.empty())
    throw RuntimeError(fmt::format("the cache directory {} {}: whoever can write it could plant code that Deuteron "
                                   "would run",
                                   root.string(), problem),
                       "", fmt::format("make it yours and private (chmod 700 {}), or set DEUTERON_CACHE_DIR to a "
                                       "folder of your own (README: sharing a cache)",
                                       root.string()));
  first_use(root);
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

void atomic_write(const fs::path& path, std::string_view bytes, mode_t mode) {
  try {
    if (path.has_parent_path()) make_private_dirs(path.parent_path());
  } catch (const RuntimeError& e) {
    throw RuntimeError(fmt::format("cannot write {}: {}", path.string(), e.message()));
  }

  // Same directory as the target so rename() is atomic (no cross-device move).
  fs::path tmp = path;
  tmp += ".tmp-" + unique_suffix();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
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
  // The mode exactly, whatever the umask took away from open's.
  if (::fchmod(fd, mode) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw RuntimeError("cannot write " + path.string() + ": " + errno_text(err));
  }
}

namespace {

// Reads all of `fd` (closing it); nullopt and `*err` on failure.
std::optional<std::string> read_all(int fd, int* err) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = errno;
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

}  // namespace

std::optional<std::string> read_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw RuntimeError("cannot read " + path.string() + ": " + errno_text(errno));
  }
  int err = 0;
  std::optional<std::string> out = read_all(fd, &err);
  if (!out) throw RuntimeError("cannot read " + path.string() + ": " + errno_text(err));
  return out;
}

std::optional<std::string> read_cache_file(const fs::path& path, std::string* problem) {
  problem->clear();
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno != ENOENT) *problem = errno == ELOOP ? "it is a symbolic link" : "it cannot be read: " + errno_text(errno);
    return std::nullopt;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    *problem = "it is not a regular file";
    return std::nullopt;
  }
  if (std::string why = ownership_problem(st); !why.empty()) {
    ::close(fd);
    *problem = "it " + why;
    return std::nullopt;
  }
  int err = 0;
  std::optional<std::string> out = read_all(fd, &err);
  if (!out) *problem = "it cannot be read: " + errno_text(err);
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
  // Checked on every use: programs include or run these files (the compiler, the Python runner).
  for (const auto& [name, text] : files) {
    std::string problem;
    std::optional<std::string> kept = read_cache_file(dir / name, &problem);
    if (kept == text) continue;
    if (kept || !problem.empty())
      runtime::warn(fmt::format("{} {}; writing it again", (dir / name).string(),
                                problem.empty() ? "was modified or damaged" : problem));
    atomic_write(dir / name, text);
  }
  return dir;
}

namespace {

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Whether Deuteron writes a file at `rel` (relative to the cache root), and whether clearing
// takes it: tuned configs always, everything else only with `everything`.
bool clearable(const fs::path& rel, bool everything) {
  std::vector<std::string> p;
  for (const fs::path& part : rel) p.push_back(part.string());
  const std::string& name = p.back();
  bool tmp = name.find(".tmp-") != std::string::npos;
  if (p.size() == 3 && p[0] == "autotune" && p[1] != "bin")
    return tmp || ends_with(name, ".json") || ends_with(name, ".log") || ends_with(name, ".lock");
  if (!everything) return false;
  if (p.size() == 1) return tmp || (name.rfind("roofline-", 0) == 0 && ends_with(name, ".json"));
  if (p.size() == 2 && p[0] == "cpu") return tmp || ends_with(name, ".so") || ends_with(name, ".cpp");
  if (p.size() == 3 && p[0] == "cpu") return p[1].rfind("pch-", 0) == 0;  // a header and its .gch
  if (p.size() == 2 && p[0] == "pallas") return tmp || ends_with(name, ".py");
  if (p.size() == 3 && p[0] == "pallas" && p[1] == "__pycache__") return ends_with(name, ".pyc");
  if (p.size() == 3 && p[0] == "autotune" && p[1] == "bin") return tmp || name.rfind("deuteron-runner-", 0) == 0;
  if (p.size() == 3 && p[0] == "resources") return true;  // the library's own files, by content hash
  return false;
}

// Folders of Deuteron's layout, removed by clearing once empty.
bool layout_dir(const fs::path& rel) {
  std::vector<std::string> p;
  for (const fs::path& part : rel) p.push_back(part.string());
  if (p.size() == 1) return p[0] == "cpu" || p[0] == "pallas" || p[0] == "autotune" || p[0] == "resources";
  return p.size() == 2 && ((p[0] == "cpu" && p[1].rfind("pch-", 0) == 0) || (p[0] == "pallas" && p[1] == "__pycache__") ||
                           p[0] == "autotune" || p[0] == "resources");
}

// Clears the files below root/rel (never through a symlink), then each folder left empty.
void clear_below(const fs::path& root, const fs::path& rel, bool everything, ClearReport* r) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root / rel, ec)) {
    fs::path sub = rel / e.path().filename();
    if (e.is_symlink(ec)) {
      r->kept.push_back(e.path());
    } else if (e.is_directory(ec)) {
      clear_below(root, sub, everything, r);
      if (!layout_dir(sub)) continue;
      if (::rmdir(e.path().c_str()) != 0 && errno != ENOTEMPTY && errno != EEXIST)
        r->failed.push_back(fmt::format("{}: {}", e.path().string(), errno_text(errno)));
    } else if (clearable(sub, everything)) {
      uint64_t size = e.is_regular_file(ec) ? e.file_size(ec) : 0;
      if (::unlink(e.path().c_str()) == 0) {
        ++r->removed;
        r->bytes += size;
      } else if (errno != ENOENT) {
        r->failed.push_back(fmt::format("{}: {}", e.path().string(), errno_text(errno)));
      }
    } else if (!clearable(sub, true) && sub != kCacheMarker) {
      r->kept.push_back(e.path());  // not Deuteron's (a file of its own but out of scope is just left)
    }
  }
}

}  // namespace

ClearReport clear_cache(const fs::path& root, bool everything) {
  std::error_code ec;
  if (!fs::exists(root / kCacheMarker, ec))
    throw RuntimeError(fmt::format("{} holds no {}: it is not known to be a Deuteron cache, so nothing was removed",
                                   root.string(), kCacheMarker),
                       "", "check DEUTERON_CACHE_DIR; remove a cache without the marker by hand");
  ClearReport r;
  clear_below(root, everything ? fs::path() : fs::path("autotune"), everything, &r);
  return r;
}

}  // namespace deuteron
