// Worker processes for the autotuner: forked compile workers, spawned runners, process trees
// (stopped, resumed, killed as a whole). Starting, reaping and exit statuses are runtime/process.h.
//
// Two kinds of worker, for a reason: a candidate kernel must run in a process that has never
// run OpenMP code. libgomp keeps its thread pool across fork(), so a parallel region in a
// forked child of a process that already ran one waits forever for pool threads that do not
// exist in the child (verified on the development machine: the child hangs with 2 or 4
// threads, runs with 1). The tuning process may well have run kernels before (that is how the
// first call of a new shape gets here), so candidates run in a freshly exec'd runner program.
// Compile workers only generate code and run the compiler (no OpenMP), so they are forked:
// they need the in-memory kernel IR and plan, which an exec'd process would not have.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace deuteron::autotune::proc {

// A forked child running `body(fd)`, where fd is the write end of a pipe whose read end is
// `fd` here. The child is in its own process group, dies with the parent (PR_SET_PDEATHSIG),
// and leaves with _exit (no atexit handlers, no flushing of the parent's stdio buffers).
struct Forked {
  pid_t pid = -1;
  int fd = -1;  // non-blocking, close-on-exec
};
Forked fork_child(const std::function<void(int fd)>& body);

// A spawned program: its stdin and stdout are one end of a socket pair (`io` here: send with
// MSG_NOSIGNAL, so a dead child cannot kill us with SIGPIPE), its stderr a pipe (`err`), and
// `fd3` (if >= 0) is passed as its descriptor 3. Runs in its own process group.
struct Spawned {
  pid_t pid = -1;
  int io = -1, err = -1;
};
Spawned spawn(const std::vector<std::string>& argv, int fd3);

// The processes below `pid` (children, grandchildren, ...), from /proc.
std::vector<pid_t> descendants(pid_t pid);
// Sends `sig` to `pid` and every process below it. For SIGKILL the process is stopped first
// so it cannot start new children while the tree is walked.
void signal_tree(pid_t pid, int sig);

// Writes all of `text` (false if the peer is gone).
bool write_all(int fd, const std::string& text);

}  // namespace deuteron::autotune::proc
