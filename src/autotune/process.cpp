#include "autotune/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include "deuteron/error.h"
#include "runtime/process.h"

namespace deuteron::autotune::proc {

namespace {

std::string errno_text(int err) { return std::generic_category().message(err); }

}  // namespace

Forked fork_child(const std::function<void(int fd)>& body) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    throw RuntimeError(fmt::format("cannot create a pipe for a worker process: {}", errno_text(errno)));
  pid_t parent = getpid();
  // Buffered output would be written twice (by us and by the child) if it were flushed there;
  // the child leaves with _exit, so this is belt and braces.
  fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw RuntimeError(fmt::format("cannot fork a worker process: {}", errno_text(err)), "",
                       "the machine may be out of processes or memory");
  }
  if (pid == 0) {
    ::close(fds[0]);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(111);  // the parent died before prctl took effect
    signal(SIGPIPE, SIG_DFL);
    try {
      body(fds[1]);
    } catch (...) {
      _exit(112);
    }
    _exit(0);
  }
  ::close(fds[1]);
  setpgid(pid, pid);  // also here: no race with a kill of the group right after fork
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return {pid, fds[0]};
}

Spawned spawn(const std::vector<std::string>& argv, int fd3) {
  if (argv.empty()) throw RuntimeError("spawn: empty command");
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw RuntimeError(fmt::format("cannot create a socket pair for a runner: {}", errno_text(errno)));
  int errp[2];
  if (pipe2(errp, O_CLOEXEC) != 0) {
    int err = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    throw RuntimeError(fmt::format("cannot create a pipe for a runner: {}", errno_text(err)));
  }
  runtime::SpawnOptions so;
  so.descriptors = {{sv[1], 0}, {sv[1], 1}, {errp[1], 2}};
  if (fd3 >= 0) so.descriptors.push_back({fd3, 3});
  so.close_from = fd3 >= 0 ? 4 : 3;
  pid_t pid = -1;
  int err = runtime::spawn_process(argv, so, &pid);
  ::close(sv[1]);
  ::close(errp[1]);
  if (err != 0) {
    ::close(sv[0]);
    ::close(errp[0]);
    throw RuntimeError(fmt::format("cannot start {}: {}", argv[0], errno_text(err)));
  }
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  fcntl(errp[0], F_SETFL, fcntl(errp[0], F_GETFL) | O_NONBLOCK);
  return {pid, sv[0], errp[0]};
}

std::vector<pid_t> descendants(pid_t root) {
  std::multimap<pid_t, pid_t> children;  // ppid -> pid
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      long pid = std::strtol(e->d_name, &end, 10);
      if (!end || *end || pid <= 0) continue;
      std::ifstream f(fmt::format("/proc/{}/stat", pid));
      std::string text;
      std::getline(f, text);
      // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
      size_t close = text.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(text.substr(close + 1));
      std::string state;
      long ppid = 0;
      rest >> state >> ppid;
      children.emplace(pid_t(ppid), pid_t(pid));
    }
    closedir(d);
  }
  std::vector<pid_t> out, todo = {root};
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    auto [lo, hi] = children.equal_range(p);
    for (auto it = lo; it != hi; ++it) {
      out.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  return out;
}

void signal_tree(pid_t pid, int sig) {
  if (pid <= 0) return;
  if (sig == SIGKILL) ::kill(pid, SIGSTOP);
  for (pid_t d : descendants(pid)) {
    if (sig == SIGKILL) ::kill(d, SIGSTOP);
    ::kill(d, sig);
  }
  ::kill(pid, sig);
  if (sig == SIGKILL) ::kill(-pid, SIGKILL);  // its own process group, whatever is left in it
}

bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 1000);
        continue;
      }
      return false;
    }
    done += size_t(n);
  }
  return true;
}

}  // namespace deuteron::autotune::proc
