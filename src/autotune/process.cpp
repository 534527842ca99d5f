#include "autotune/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
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

extern char** environ;

namespace deuteron::autotune::proc {

namespace {

std::string errno_text(int err) { return std::generic_category().message(err); }

}  // namespace

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGABRT: return "SIGABRT";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGPIPE: return "SIGPIPE";
    case SIGXCPU: return "SIGXCPU";
    case SIGTRAP: return "SIGTRAP";
    case SIGSYS: return "SIGSYS";
    default: return fmt::format("signal {}", sig);
  }
}

std::string Exit::describe() const {
  if (exited) return fmt::format("exit status {}", code);
  const char* what = strsignal(signal);
  return fmt::format("killed by {} ({})", signal_name(signal), what ? what : "?");
}

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
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, sv[1], 0);
  posix_spawn_file_actions_adddup2(&fa, sv[1], 1);
  posix_spawn_file_actions_adddup2(&fa, errp[1], 2);
  if (fd3 >= 0) posix_spawn_file_actions_adddup2(&fa, fd3, 3);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // Descriptors the host process opened without O_CLOEXEC stay out of the runner.
  posix_spawn_file_actions_addclosefrom_np(&fa, fd3 >= 0 ? 4 : 3);
#endif
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGCHLD})
    sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  int err = posix_spawn(&pid, cargv[0], &fa, &attr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
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

bool reap(pid_t pid, Exit* exit, bool block) {
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, block ? 0 : WNOHANG);
    if (r == 0) return false;
    if (r < 0) {
      if (errno == EINTR) continue;
      // ECHILD: someone else reaped it (a host that ignores SIGCHLD). Nothing more to know.
      *exit = Exit{true, 0, 0};
      return true;
    }
    break;
  }
  if (WIFEXITED(status)) {
    *exit = Exit{true, WEXITSTATUS(status), 0};
  } else {
    *exit = Exit{false, 0, WIFSIGNALED(status) ? WTERMSIG(status) : 0};
  }
  return true;
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

Result run(const std::vector<std::string>& argv, double timeout_s) {
  Spawned sp = spawn(argv, -1);
  ::shutdown(sp.io, SHUT_WR);  // stdin: immediate end of file
  Result r;
  double deadline = now() + timeout_s;
  int fds[2] = {sp.io, sp.err};
  bool open[2] = {true, true};
  char buf[8192];
  while (open[0] || open[1]) {
    double left = deadline - now();
    if (left <= 0) {
      r.timed_out = true;
      signal_tree(sp.pid, SIGKILL);
      break;
    }
    pollfd p[2] = {{open[0] ? fds[0] : -1, POLLIN, 0}, {open[1] ? fds[1] : -1, POLLIN, 0}};
    int n = ::poll(p, 2, int(left * 1000) + 1);
    if (n < 0 && errno == EINTR) continue;
    for (int i = 0; i < 2; ++i) {
      if (!open[i] || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t k = ::read(fds[i], buf, sizeof buf);
      if (k > 0) {
        if (r.output.size() < (1 << 20)) r.output.append(buf, size_t(k));
      } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
        open[i] = false;
      }
    }
  }
  ::close(fds[0]);
  ::close(fds[1]);
  reap(sp.pid, &r.exit, true);
  return r;
}

}  // namespace deuteron::autotune::proc
