#include "runtime/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

extern char** environ;

namespace deuteron::runtime {

double monotonic_seconds() {
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

std::string ExitStatus::describe() const {
  if (exited) return fmt::format("exit status {}", code);
  const char* what = strsignal(signal);
  return fmt::format("killed by {} ({})", signal_name(signal), what ? what : "?");
}

namespace {

// The supervisor: the forked process between the host and the program it starts. It leads the
// program's process group and dies with it, mirroring its exit status; and when the host dies
// (SIGHUP, its parent-death signal) it terminates the whole group: SIGTERM first, so that g++
// removes its temporary files, then SIGKILL for whatever is left (cc1plus, as). Only
// async-signal-safe calls here: the host may have other threads, frozen mid-call by fork.
[[noreturn]] void supervise(pid_t host, char* const* argv, bool search_path, const posix_spawn_file_actions_t* fa,
                            const posix_spawnattr_t* attr, int report) {
  sigset_t all, watched;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);  // signals are taken with sigtimedwait below
  signal(SIGCHLD, SIG_DFL);                 // the host may ignore it, which would reap for us
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGHUP);
  pid_t child = -1;
  int err = getppid() != host ? ECHILD  // the host died before prctl took effect
            : search_path     ? posix_spawnp(&child, argv[0], fa, attr, argv, environ)
                              : posix_spawn(&child, argv[0], fa, attr, argv, environ);
  (void)!::write(report, &err, sizeof err);
  // Every descriptor the host had (its other children's pipes among them) is the program's
  // business now, not ours: end of file on a pipe must mean the program is done.
  if (::close_range(0, ~0U, 0) != 0)
    for (int fd = 0; fd < 1024; ++fd) ::close(fd);
  if (err != 0) _exit(127);

  sigemptyset(&watched);
  for (int sig : {SIGCHLD, SIGHUP, SIGTERM, SIGINT, SIGQUIT}) sigaddset(&watched, sig);
  timespec forever = {1 << 30, 0};
  for (;;) {
    int status = 0;
    if (::waitpid(child, &status, WNOHANG) == child) {
      if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
      int sig = WTERMSIG(status);
      rlimit no_core = {0, 0};
      setrlimit(RLIMIT_CORE, &no_core);
      signal(sig, SIG_DFL);
      sigprocmask(SIG_UNBLOCK, &all, nullptr);
      ::kill(getpid(), sig);
      _exit(128 + sig);
    }
    int sig = sigtimedwait(&watched, nullptr, &forever);
    if (sig == SIGHUP) break;
    if (sig == SIGTERM || sig == SIGINT || sig == SIGQUIT) ::kill(child, sig);
  }
  ::kill(0, SIGTERM);
  sigemptyset(&watched);
  sigaddset(&watched, SIGCHLD);
  timespec grace = {2, 0};
  double until = monotonic_seconds() + 2;
  int status = 0;
  while (::waitpid(child, &status, WNOHANG) != child && monotonic_seconds() < until)
    sigtimedwait(&watched, nullptr, &grace);
  ::kill(0, SIGKILL);
  _exit(137);
}

}  // namespace

int spawn_process(const std::vector<std::string>& argv, const SpawnOptions& options, pid_t* pid) {
  if (argv.empty()) return EINVAL;
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  bool stdin_given = false;
  for (auto [here, there] : options.descriptors) stdin_given |= there == 0;
  if (!stdin_given) posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  for (auto [here, there] : options.descriptors) posix_spawn_file_actions_adddup2(&fa, here, there);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  if (options.close_from >= 0) posix_spawn_file_actions_addclosefrom_np(&fa, options.close_from);
#endif
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  // The host may ignore or handle these (a tuner ignores SIGPIPE, a test harness traps
  // crashes); the child must see them as a fresh process would.
  for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGCHLD, SIGHUP, SIGQUIT})
    sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  int report[2] = {-1, -1};
  pid_t sup = -1;
  int err = pipe2(report, O_CLOEXEC) == 0 ? 0 : errno;
  if (err == 0) {
    pid_t host = getpid();
    sup = fork();
    if (sup == 0) supervise(host, cargv.data(), options.search_path, &fa, &attr, report[1]);
    if (sup < 0) err = errno;
    ::close(report[1]);
  }
  if (sup > 0) {
    setpgid(sup, sup);  // also here: no race with a kill of the group right after fork
    // The supervisor says whether the program started (an errno, 0 when it did).
    int started = 0;
    ssize_t n;
    while ((n = ::read(report[0], &started, sizeof started)) < 0 && errno == EINTR) {
    }
    err = n == ssize_t(sizeof started) ? started : ECHILD;
    if (err != 0) {
      ExitStatus ignored;
      reap(sup, &ignored, true);
    }
  }
  if (report[0] >= 0) ::close(report[0]);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (err == 0) *pid = sup;
  return err;
}

bool reap(pid_t pid, ExitStatus* exit, bool block) {
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, block ? 0 : WNOHANG);
    if (r == 0) return false;
    if (r < 0) {
      if (errno == EINTR) continue;
      // ECHILD: someone else reaped it (a host that ignores SIGCHLD). Nothing more to know.
      *exit = ExitStatus{true, 0, 0};
      return true;
    }
    break;
  }
  if (WIFEXITED(status)) *exit = ExitStatus{true, WEXITSTATUS(status), 0};
  else *exit = ExitStatus{false, 0, WIFSIGNALED(status) ? WTERMSIG(status) : 0};
  return true;
}

Captured run_captured(const std::vector<std::string>& argv, double timeout_s, const CaptureOptions& options) {
  Captured res;
  // O_CLOEXEC: children spawned concurrently by other threads must not inherit these pipes,
  // or we would never see end of file.
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || (!options.merge_output && pipe2(err, O_CLOEXEC) != 0)) {
    res.spawn_error = errno;
    for (int fd : {out[0], out[1]})
      if (fd >= 0) ::close(fd);
    return res;
  }
  SpawnOptions so;
  so.search_path = options.search_path;
  so.descriptors = {{out[1], 1}, {options.merge_output ? out[1] : err[1], 2}};
  pid_t pid = -1;
  res.spawn_error = spawn_process(argv, so, &pid);
  for (int fd : {out[1], err[1]})
    if (fd >= 0) ::close(fd);
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  if (res.spawn_error != 0) {
    for (auto& p : fds)
      if (p.fd >= 0) ::close(p.fd);
    return res;
  }
  std::string* sinks[2] = {&res.out, &res.err};
  int open = options.merge_output ? 1 : 2;
  const double deadline = monotonic_seconds() + timeout_s;
  char buf[8192];
  while (open > 0) {
    double left = deadline - monotonic_seconds();
    if (left <= 0) {
      res.timed_out = true;
      ::kill(-pid, SIGKILL);
      break;
    }
    int r = ::poll(fds, 2, int(std::min(left * 1000.0, 1e9)) + 1);
    if (r <= 0) continue;  // EINTR, or the deadline: re-checked at the loop head
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {  // end of file: every process holding the pipe has exited
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
        continue;
      }
      if (sinks[i]->size() < options.max_output) sinks[i]->append(buf, size_t(n));
    }
  }
  for (auto& p : fds)
    if (p.fd >= 0) ::close(p.fd);
  reap(pid, &res.exit, true);
  return res;
}

}  // namespace deuteron::runtime
