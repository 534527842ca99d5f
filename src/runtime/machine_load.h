// How busy the machine is: timings taken while other processes ran (a tuning run, a roofline)
// may be off, and are kept on disk only for a while.
#pragma once

namespace deuteron::runtime {

// CPU seconds used so far by the whole machine (/proc/stat) and by this process with the
// children it has reaped, and when that was read. Two samples tell how busy other processes kept
// the machine in between: timings taken then (a tuning run, a roofline) may be off.
struct CpuUse {
  double machine_s = 0, own_s = 0, wall_s = 0;
};
CpuUse cpu_use();
// Cores other processes kept busy, on average, between two samples (0 where /proc is missing).
double others_cores(const CpuUse& from, const CpuUse& to);

// Seconds since the epoch, for stamping measurements kept on disk.
double unix_now();
// Whether a kept measurement (a tuned config, a roofline) taken at `measured_at` should be taken
// again: one disturbed by other processes is kept for an hour (the machine is often busy for a
// while, and measuring costs seconds to minutes), then measured again.
bool measure_again(bool disturbed, double measured_at);

}  // namespace deuteron::runtime
