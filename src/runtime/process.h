// Child processes, for everything that runs another program: the C++ compiler, the Pallas
// runner, the autotuner's runners. A child starts in its own process group (so a timeout can
// kill the whole tree it started), with an empty signal mask and default signal dispositions,
// whatever the host process set up. It dies with the host: a small forked supervisor leads
// the group, starts the program, exits as it exits (same code, same signal), and when the
// thread that started it dies (even by SIGKILL) terminates the whole group, g++'s cc1plus
// and as included.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace deuteron::runtime {

double monotonic_seconds();

// "SIGSEGV", "SIGKILL", ... ("signal 42" for unknown numbers).
std::string signal_name(int sig);

// How a child process ended.
struct ExitStatus {
  bool exited = false;  // normal exit (code valid); else killed by `signal`
  int code = 0;
  int signal = 0;
  bool success() const { return exited && code == 0; }
  std::string describe() const;  // "exit status 2", "killed by SIGSEGV (Segmentation fault)"
};

struct SpawnOptions {
  bool search_path = false;  // look argv[0] up in $PATH
  // (descriptor here, descriptor in the child) pairs installed with dup2; stdin is /dev/null
  // unless one of them targets descriptor 0.
  std::vector<std::pair<int, int>> descriptors;
  // Descriptors from this one up are closed in the child (the host may have opened some
  // without O_CLOEXEC); -1 leaves them.
  int close_from = -1;
};

// Starts argv. Returns 0 and the child's pid (its supervisor's, which stands for it: signals,
// exit status, process group), or the errno of the failure. The calling thread must outlive
// the child (it waits for it, as run_captured does).
int spawn_process(const std::vector<std::string>& argv, const SpawnOptions& options, pid_t* pid);

// Waits for `pid`; non-blocking unless `block`. Returns false while it is still running.
bool reap(pid_t pid, ExitStatus* exit, bool block);

struct CaptureOptions {
  bool search_path = false;
  bool merge_output = false;         // stderr into `out`, interleaved as written
  size_t max_output = size_t(1) << 20;  // per stream; a runaway child must not eat memory
};
struct Captured {
  int spawn_error = 0;  // errno when the program could not be started (nothing else is set)
  ExitStatus exit;
  bool timed_out = false;  // then its process group was killed
  std::string out, err;
};
// Runs argv to completion, stdin from /dev/null, capturing its output; after timeout_s kills
// its process group.
Captured run_captured(const std::vector<std::string>& argv, double timeout_s, const CaptureOptions& options = {});

}  // namespace deuteron::runtime
