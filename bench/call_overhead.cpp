// The cost of one call of a small kernel from C++: the catalogue's softmax on a [1, 128] float32
// tensor, called as a program calls it (arguments described, its executable found, the output
// allocated, the kernel run), and the kernel's executable alone. bench/call_overhead.py runs
// this beside the same call from Python.
//   deuteron_call_overhead [CALLS_PER_ROUND [ROUNDS]]   prints one JSON line, medians in µs
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "api/api.h"
#include "catalogue.h"

using namespace deuteron;

template <typename F>
double median_us(int calls, int rounds, F&& f) {
  std::vector<double> per_call;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) f();
    per_call.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

int main(int argc, char** argv) {
  int calls = argc > 1 ? std::atoi(argv[1]) : 2000, rounds = argc > 2 ? std::atoi(argv[2]) : 21;
  const KernelBase& softmax = *examples::find("softmax").kernel;
  std::vector<Arg> args{Tensor::rand({1, 128}, DType::f32, 1)};
  softmax.run(args);  // the first call compiles (or loads) its executable
  api::RunResult r = api::run(softmax, args, "cpu");
  double call = median_us(calls, rounds, [&] { softmax.run(args); });
  double kernel = median_us(calls, rounds, [&] { r.exe->run(r.bound.tensors, r.bound.scalars); });
  std::printf("{\"call_us\": %.3f, \"kernel_us\": %.3f, \"calls\": %d, \"rounds\": %d}\n", call, kernel, calls, rounds);
}
