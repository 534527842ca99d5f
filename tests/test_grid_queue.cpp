// The grid schedule generated CPU kernels run (dt::GridQueue in the runtime header): every step
// handed out exactly once, in chunks of consecutive steps no longer than the cap (whole runs of
// steps that share a packed block while many are left), shrinking to single steps at the end,
// also when threads claim concurrently. And dt::OwnCpu: a thread that finds a teammate on its
// CPU moves to a free one for the region, and back after it.
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "backends/cpu/runtime/deuteron_cpu.h"

namespace {

TEST(GridQueue, ChunksCoverTheGridInOrderAndShrinkAtTheEnd) {
  for (int64_t size : {1, 7, 256, 1001}) {
    dt::GridQueue q(size, 2);
    EXPECT_EQ(q.max_chunk, size >= 16 ? size / 16 : 1) << size;  // about 8 chunks a thread
    std::vector<int64_t> sizes;
    int64_t begin = -1, end = -1, expect = 0;
    while (q.claim(&begin, &end)) {
      ASSERT_EQ(begin, expect) << size;
      ASSERT_GT(end, begin) << size;
      ASSERT_LE(end - begin, q.max_chunk) << size;
      sizes.push_back(end - begin);
      expect = end;
    }
    EXPECT_EQ(expect, size);
    EXPECT_EQ(sizes.back(), 1) << size;  // the last chunk is one step: no thread waits out a long one
    EXPECT_EQ(sizes.front(), q.max_chunk) << size;  // full chunks while much is left
    for (size_t i = 1; i < sizes.size(); ++i) EXPECT_LE(sizes[i], sizes[i - 1]) << size;
  }
  dt::GridQueue empty(0, 2);
  int64_t b = 0, e = 0;
  EXPECT_FALSE(empty.claim(&b, &e));
}

// Runs of steps that share a packed block (epilogue_subtiling: 8 row blocks per column of W):
// while 2 runs a thread are left, every chunk is whole runs, so one thread packs each block;
// the tail still shrinks to single steps.
TEST(GridQueue, ChunksKeepRunsWholeWhileManyAreLeft) {
  for (auto [size, threads, run] : {std::tuple<int64_t, int64_t, int64_t>{64, 2, 8}, {128, 2, 4}, {512, 2, 16},
                                    {12, 2, 2}, {960, 3, 12}}) {
    dt::GridQueue q(size, threads, run);
    ASSERT_EQ(q.run, run) << size;
    int64_t begin = -1, end = -1, expect = 0, last = 0;
    while (q.claim(&begin, &end)) {
      ASSERT_EQ(begin, expect) << size;
      ASSERT_GT(end, begin) << size;
      ASSERT_LE(end - begin, std::max(q.max_chunk, run)) << size;
      if (size - begin >= 2 * threads * run) {
        EXPECT_EQ(begin % run, 0) << size << ": chunk at " << begin;
        EXPECT_EQ((end - begin) % run, 0) << size << ": chunk at " << begin;
      }
      last = end - begin;
      expect = end;
    }
    EXPECT_EQ(expect, size);
    EXPECT_EQ(last, 1) << size;
  }
  // A run longer than 2 chunks would hold a slowed thread's share too long, and one that does
  // not divide the grid is not a run: plain chunks.
  EXPECT_EQ(dt::GridQueue(64, 2, 16).run, 1);
  EXPECT_EQ(dt::GridQueue(60, 2, 8).run, 1);
  EXPECT_EQ(dt::GridQueue(64, 2, 0).run, 1);
}

// Two threads of equal speed taking turns: with runs, each packed block of epilogue_subtiling's
// grid (64 steps, 8 per block) is packed by fewer threads than with plain chunks of 4, where
// both threads pack every block.
TEST(GridQueue, RunsCutTheBlocksTwoThreadsBothPack) {
  auto packs = [](dt::GridQueue q) {
    int64_t key[2] = {-1, -1}, done[2] = {0, 0}, count = 0, b = 0, e = 0;
    for (;;) {
      int t = done[0] <= done[1] ? 0 : 1;  // the thread that frees up first claims next
      if (!q.claim(&b, &e)) break;
      for (int64_t pid = b; pid < e; ++pid)
        if (key[t] != pid / 8) key[t] = pid / 8, ++count;
      done[t] += e - b;
    }
    return count;
  };
  EXPECT_EQ(packs(dt::GridQueue(64, 2)), 16);
  EXPECT_LE(packs(dt::GridQueue(64, 2, 8)), 11);
}

TEST(GridQueue, ConcurrentClaimsHandOutEachStepOnce) {
  const int64_t size = 100003;
  std::vector<int> taken(size_t(size), 0);
  dt::GridQueue q(size, 4);
#pragma omp parallel num_threads(4)
  {
    for (int64_t first = 0, last = 0; q.claim(&first, &last);)
      for (int64_t pid = first; pid < last; ++pid) ++taken[size_t(pid)];  // each step by one thread only
  }
  for (int64_t i = 0; i < size; ++i) ASSERT_EQ(taken[size_t(i)], 1) << "step " << i;
}

// The CPUs this thread may run on.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

TEST(OwnCpu, FreeCpuSkipsTheTakenOnes) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : {1, 3, 4}) CPU_SET(c, &set);
  const int none[1] = {0};
  EXPECT_EQ(dt::detail::free_cpu(set, none, 0), 1);
  const int some[2] = {1, 3};
  EXPECT_EQ(dt::detail::free_cpu(set, some, 2), 4);
  const int all[3] = {4, 1, 3};
  EXPECT_EQ(dt::detail::free_cpu(set, all, 3), -1);
}

// Thread 1 of a team of two, on the CPU thread 0 noted in the same region: it moves to another
// allowed CPU for the region, and release() gives it back every CPU it had. A thread alone on
// its CPU, thread 0, and notes of an earlier region move nothing. Run in a thread of its own so
// that the test process keeps its affinity whatever happens.
TEST(OwnCpu, ASecondThreadOnATeammatesCpuMovesForTheRegion) {
  std::vector<int> before = allowed_cpus();
  if (before.size() < 2) GTEST_SKIP() << "one CPU allowed: there is nowhere to move to";
  const int a = before[0], b = before[1];
  std::thread([&] {
    const uint32_t region = dt::next_team_region();
    dt::OwnCpu first(region, 0, 2);
    first.settle_on(a);  // thread 0 never moves, whoever shares its CPU
    EXPECT_EQ(allowed_cpus(), before);

    dt::OwnCpu alone(region, 1, 2);
    alone.settle_on(b);  // not a teammate's CPU
    EXPECT_EQ(allowed_cpus(), before);

    dt::OwnCpu second(region, 1, 2);
    second.settle_on(a);  // thread 0 noted a
    EXPECT_EQ(allowed_cpus(), std::vector<int>{b});
    EXPECT_EQ(sched_getcpu(), b);
    second.release();
    EXPECT_EQ(allowed_cpus(), before);

    // Thread 0's note is of an older region now: nothing to avoid.
    dt::OwnCpu later(dt::next_team_region(), 1, 2);
    later.settle_on(a);
    EXPECT_EQ(allowed_cpus(), before);
  }).join();
}

// dt::TeamEnd: no thread of a team returns before the last one arrives, whether it waited
// spinning (arrivals within kTeamSpinNs) or asleep (a teammate 30 ms late), and for teams of 1
// to 4. A thread that waits longer than the spin lets a teammate that moved (OwnCpu) run on all
// the CPUs it had again, as a parked teammate must be free to be moved onto the waiter's CPU.
TEST(TeamEnd, NoThreadLeavesBeforeTheLastArrives) {
  using clock = std::chrono::steady_clock;
  for (int team : {1, 2, 3, 4})
    for (int late_ms : {0, 30}) {
      const uint32_t region = dt::next_team_region();
      dt::TeamEnd end;
      std::vector<clock::time_point> arrived(static_cast<size_t>(team)), left(static_cast<size_t>(team));
      std::vector<std::thread> threads;
      for (int t = 0; t < team; ++t)
        threads.emplace_back([&, t] {
          dt::OwnCpu own(region, t, team);
          if (t == team - 1) std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
          arrived[size_t(t)] = clock::now();
          end.arrive_and_wait(own);
          left[size_t(t)] = clock::now();
        });
      for (std::thread& th : threads) th.join();
      const clock::time_point last = *std::max_element(arrived.begin(), arrived.end());
      for (int t = 0; t < team; ++t) EXPECT_GE(left[size_t(t)], last) << "team " << team << ", thread " << t;
    }
}

// arrive_and_spin (row kernels): the last thread to arrive gets true; a thread whose teammate
// is later than the spin goes on (to the region's barrier) after spinning, with false.
TEST(TeamEnd, ASpinEndsWhenAllArriveOrItsTimeIsUp) {
  using clock = std::chrono::steady_clock;
  {
    dt::TeamEnd end;
    const clock::time_point t0 = clock::now();
    EXPECT_FALSE(end.arrive_and_spin(2));  // the teammate never comes
    EXPECT_GE(clock::now() - t0, std::chrono::nanoseconds(dt::kTeamSpinNs));
    EXPECT_TRUE(end.arrive_and_spin(2));  // the second arrival
  }
  {
    dt::TeamEnd end;
    EXPECT_TRUE(end.arrive_and_spin(1));  // a team of one ends with its arrival
  }
}

TEST(TeamEnd, AWaiterFreesAMovedTeammate) {
  std::vector<int> before = allowed_cpus();
  if (before.size() < 2) GTEST_SKIP() << "one CPU allowed: there is nowhere to move to";
  const uint32_t region = dt::next_team_region();
  dt::TeamEnd end;
  std::atomic<int> stage{0};
  std::vector<int> moved_to, freed_to;
  std::thread mover([&] {
    dt::OwnCpu own(region, 1, 2);
    while (stage.load() < 1) std::this_thread::yield();
    own.settle_on(before[0]);  // thread 0 noted it: this one moves
    moved_to = allowed_cpus();
    stage = 2;
    while (stage.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    freed_to = allowed_cpus();  // the waiter let it run anywhere again
    end.arrive_and_wait(own);
    own.release();
  });
  dt::OwnCpu waiter(region, 0, 2);
  std::thread first([&] {
    waiter.settle_on(before[0]);
    stage = 1;
    while (stage.load() < 2) std::this_thread::yield();
    std::thread timer([&] {  // the spin is over long before: then stage 3
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      stage = 3;
    });
    end.arrive_and_wait(waiter);
    timer.join();
  });
  first.join();
  mover.join();
  EXPECT_EQ(moved_to.size(), 1u);
  EXPECT_NE(moved_to, std::vector<int>{before[0]});
  EXPECT_EQ(freed_to, before);
}

// dt::SharedPack: the team packs every piece of a shared copy exactly once, and no thread
// passes wait() before every piece is packed, also when a teammate is slow with its piece or
// starts after the others have claimed them all.
TEST(SharedPack, EveryPieceOnceAndNoThreadReadsBeforeAllArePacked) {
  for (int team : {1, 2, 3, 4})
    for (int64_t pieces : {1, 5, 64})
      for (int slow_ms : {0, 20}) {
        dt::SharedPack pack(pieces);
        std::vector<std::atomic<int>> packs(static_cast<size_t>(pieces));
        std::vector<int64_t> missing_at_wait(static_cast<size_t>(team), -1);
        std::vector<std::thread> threads;
        std::atomic<bool> first_claimed{false};
        for (int t = 0; t < team; ++t)
          threads.emplace_back([&, t] {
            // Thread 0 claims first and is slow with that piece: its teammates wait for it.
            if (t > 0)
              while (!first_claimed.load()) std::this_thread::yield();
            bool slow = t == 0 && slow_ms > 0;
            for (int64_t piece = 0; pack.claim(&piece); pack.packed(), slow = false) {
              first_claimed = true;
              if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
              packs[size_t(piece)].fetch_add(1);
            }
            pack.wait();
            int64_t missing = 0;
            for (const std::atomic<int>& n : packs) missing += n.load() == 0;
            missing_at_wait[size_t(t)] = missing;
          });
        for (std::thread& th : threads) th.join();
        for (int64_t i = 0; i < pieces; ++i)
          EXPECT_EQ(packs[size_t(i)].load(), 1) << "team " << team << ", piece " << i << " of " << pieces;
        for (int t = 0; t < team; ++t)
          EXPECT_EQ(missing_at_wait[size_t(t)], 0)
              << "team " << team << ", thread " << t << ", slow " << slow_ms;
      }
  // A thread that starts after the others packed everything packs nothing and does not wait.
  dt::SharedPack pack(3);
  for (int64_t piece = 0; pack.claim(&piece); pack.packed()) {
  }
  int64_t late = -1;
  EXPECT_FALSE(pack.claim(&late));
  pack.wait();
}

}  // namespace
