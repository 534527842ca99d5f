// Writes deuteron::Tensor::rand's raw bytes to a file, for bench/check_rand.sh, which checks
// that bench/deuteron_rand.py (the inputs the benchmark gives PyTorch and JAX) is bit-exact.
//   rand_dump N SEED LO HI f32|i64 OUT
#include "deuteron/deuteron.h"
#include <cstdio>
#include <cstring>
#include <cstdlib>
using namespace deuteron;
int main(int argc, char** argv) {
  // n seed lo hi dtype(f32|i64) out
  int64_t n = atoll(argv[1]); uint64_t seed = strtoull(argv[2], 0, 10);
  double lo = atof(argv[3]), hi = atof(argv[4]);
  DType dt = std::string(argv[5]) == "i64" ? DType::i64 : DType::f32;
  Tensor t = Tensor::rand({n}, dt, seed, lo, hi);
  FILE* f = fopen(argv[6], "wb"); fwrite(t.data(), 1, t.nbytes(), f); fclose(f);
}
