#include "runtime/machine_load.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "runtime/process.h"

namespace deuteron::runtime {

CpuUse cpu_use() {
  CpuUse u;
  u.wall_s = monotonic_seconds();
  const double tick = double(sysconf(_SC_CLK_TCK));
  if (std::FILE* f = std::fopen("/proc/stat", "r")) {
    // "cpu  user nice system idle iowait irq softirq steal ...": busy is all but idle and iowait.
    unsigned long long v[8] = {};
    if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                    &v[6], &v[7]) == 8)
      u.machine_s = double(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tick;
    std::fclose(f);
  }
  if (std::FILE* f = std::fopen("/proc/self/stat", "r")) {
    // Fields 14-17: utime stime cutime cstime, after "pid (comm) state" (comm may hold spaces).
    char buf[1024];
    size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    std::fclose(f);
    if (const char* p = std::strrchr(buf, ')')) {
      unsigned long long t[4] = {};
      if (std::sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu", &t[0], &t[1],
                      &t[2], &t[3]) == 4)
        u.own_s = double(t[0] + t[1] + t[2] + t[3]) / tick;
    }
  }
  return u;
}

double unix_now() { return double(std::time(nullptr)); }

bool measure_again(bool disturbed, double measured_at) { return disturbed && unix_now() - measured_at > 3600; }

double others_cores(const CpuUse& from, const CpuUse& to) {
  double wall = to.wall_s - from.wall_s;
  if (wall <= 0 || from.machine_s <= 0 || to.machine_s <= 0) return 0;
  return std::max(0.0, ((to.machine_s - from.machine_s) - (to.own_s - from.own_s)) / wall);
}

}  // namespace deuteron::runtime
