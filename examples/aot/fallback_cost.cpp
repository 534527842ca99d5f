// What the fallback costs: shapes that one build (aot_fallback) was not made for run its
// general variants; a second build (aot_tuned) was tuned for exactly those shapes. Both run
// each shape in interleaved rounds (the machine may be shared: each round times both within
// milliseconds); printed are the medians per call and the ratio of the medians, with the
// spread of the per-round ratios.
//
//   fallback_cost [KERNEL]   (examples/aot/README.md says how the two builds are made; KERNEL: only its shapes)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "aot_fallback.h"
#include "aot_tuned.h"

namespace {

double seconds_per_call(const std::function<int()>& call) {
  using clock = std::chrono::steady_clock;
  int n = 0;
  auto start = clock::now();
  do {
    if (call() != 0) return -1;
    ++n;
  } while (clock::now() - start < std::chrono::milliseconds(30));
  return std::chrono::duration<double>(clock::now() - start).count() / n;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void compare(const std::string& what, const char* general, const char* tuned, const std::function<int()>& fallback_call,
             const std::function<int()>& tuned_call) {
  std::vector<double> f, t, ratio;
  fallback_call(), tuned_call();  // warm up
  for (int round = 0; round < 15; ++round) {
    f.push_back(seconds_per_call(fallback_call));
    t.push_back(seconds_per_call(tuned_call));
    ratio.push_back(f.back() / t.back());
  }
  std::sort(ratio.begin(), ratio.end());
  std::printf("%-22s general %-28s %9.3f ms   tuned %-30s %9.3f ms   general/tuned %.2fx (rounds %.2f-%.2f)\n",
              what.c_str(), general ? general : "?", median(f) * 1e3, tuned ? tuned : "?", median(t) * 1e3,
              median(f) / median(t), ratio.front(), ratio.back());
}

std::vector<float> random_values(size_t n) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  auto wanted = [&](const std::string& kernel) { return argc < 2 || kernel == argv[1]; };
  const int64_t softmax_shapes[][2] = {{500, 1500}, {2048, 300}, {37, 4096}};
  for (const auto& s : softmax_shapes) {
    if (!wanted("softmax")) break;
    std::vector<float> x = random_values(size_t(s[0] * s[1])), out(x.size());
    compare("softmax " + std::to_string(s[0]) + "x" + std::to_string(s[1]), aot_fallback_softmax_variant(s[0], s[1]),
            aot_tuned_softmax_variant(s[0], s[1]),
            [&] { return aot_fallback_softmax(x.data(), out.data(), s[0], s[1]); },
            [&] { return aot_tuned_softmax(x.data(), out.data(), s[0], s[1]); });
  }
  const int64_t matmul_shapes[][3] = {{256, 256, 256}, {100, 500, 60}, {777, 128, 301}};
  for (const auto& s : matmul_shapes) {
    if (!wanted("matmul")) break;
    std::vector<float> x = random_values(size_t(s[0] * s[1])), y = random_values(size_t(s[1] * s[2])),
                       out(size_t(s[0] * s[2]));
    compare("matmul " + std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]),
            aot_fallback_matmul_variant(s[0], s[1], s[2]), aot_tuned_matmul_variant(s[0], s[1], s[2]),
            [&] { return aot_fallback_matmul(x.data(), y.data(), out.data(), s[0], s[1], s[2]); },
            [&] { return aot_tuned_matmul(x.data(), y.data(), out.data(), s[0], s[1], s[2]); });
  }
  // layer_norm: a general variant since its mean's 1/n is read at run time.
  for (const auto& s : softmax_shapes) {
    if (!wanted("layer_norm")) break;
    std::vector<float> x = random_values(size_t(s[0] * s[1])), w = random_values(size_t(s[1])),
                       b = random_values(size_t(s[1])), out(x.size());
    compare("layer_norm " + std::to_string(s[0]) + "x" + std::to_string(s[1]), aot_fallback_layer_norm_variant(s[0], s[1]),
            aot_tuned_layer_norm_variant(s[0], s[1]),
            [&] { return aot_fallback_layer_norm(x.data(), w.data(), b.data(), out.data(), 1e-5, s[0], s[1]); },
            [&] { return aot_tuned_layer_norm(x.data(), w.data(), b.data(), out.data(), 1e-5, s[0], s[1]); });
  }
  // attention: a general variant since its packed layout over the head dim D is sized at run
  // time (and 1/sqrt(D) read from it); shapes of other S, D and batch than the built one.
  const int64_t attention_shapes[][4] = {{1, 8, 200, 64}, {1, 4, 512, 80}, {2, 8, 333, 48}};
  for (const auto& s : attention_shapes) {
    if (!wanted("attention")) break;
    std::vector<float> q = random_values(size_t(s[0] * s[1] * s[2] * s[3])), k = q, v = q, out(q.size());
    std::string name = "attention " + std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]) +
                       "x" + std::to_string(s[3]);
    compare(name, aot_fallback_attention_variant(s[0], s[1], s[2], s[3]), aot_tuned_attention_variant(s[0], s[1], s[2], s[3]),
            [&] { return aot_fallback_attention(q.data(), k.data(), v.data(), out.data(), s[0], s[1], s[2], s[3]); },
            [&] { return aot_tuned_attention(q.data(), k.data(), v.data(), out.data(), s[0], s[1], s[2], s[3]); });
  }
  return 0;
}
