// An independent Philox4x32-10 for the tests, written from the published algorithm (Salmon,
// Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC'11) and checked against
// Random123's known-answer vectors (Philox.ReferenceMatchesRandom123), never from the
// generated code. Deuteron's convention on top of it: key = the seed's two words (lo, hi),
// counter = (offset lo, offset hi, 0, 0); rand is the first word's top 24 bits times 2^-24,
// randn Box-Muller on the first two words, randint the first word as int32.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace deuteron::testing_support {

using Words = std::array<uint32_t, 4>;

inline Words philox4x32_10(Words ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kMul[2] = {0xD2511F53u, 0xCD9E8D57u};  // Random123's PHILOX_M4x32_0/1
  constexpr uint32_t kWeyl[2] = {0x9E3779B9u, 0xBB67AE85u};  // PHILOX_W32_0/1
  for (int r = 0; r < 10; ++r) {
    if (r) {
      key[0] += kWeyl[0];
      key[1] += kWeyl[1];
    }
    uint64_t p0 = uint64_t(kMul[0]) * ctr[0], p1 = uint64_t(kMul[1]) * ctr[2];
    uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0), hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
  }
  return ctr;
}

inline Words philox_of(int64_t seed, int64_t offset) {
  uint64_t s = uint64_t(seed), o = uint64_t(offset);
  return philox4x32_10({uint32_t(o & 0xffffffffu), uint32_t(o >> 32), 0, 0},
                       {uint32_t(s & 0xffffffffu), uint32_t(s >> 32)});
}
inline double rand_reference(int64_t seed, int64_t offset) { return std::ldexp(double(philox_of(seed, offset)[0] >> 8), -24); }
inline int32_t randint_reference(int64_t seed, int64_t offset) { return int32_t(philox_of(seed, offset)[0]); }
inline double randn_reference(int64_t seed, int64_t offset) {
  Words w = philox_of(seed, offset);
  double u1 = std::ldexp(double((w[0] >> 8) + 1), -24), u2 = std::ldexp(double(w[1] >> 8), -24);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace deuteron::testing_support
