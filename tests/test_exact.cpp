// Results that must be exact, not merely close: each kernel a factory makes runs its own code,
// integer arithmetic wraps as in PyTorch, integer constants keep every bit, and adds at
// gathered indices (scatter-add) land where the indices say.
#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "deuteron/deuteron.h"
#include "driver/driver.h"

namespace deuteron {
namespace {

namespace hl = deuteron::hl;

// Kernels for the tests below never tune: the default config is enough, and fast.
KernelOptions untuned() {
  KernelOptions o;
  o.effort = "none";
  return o;
}

// ---- kernels made by a factory --------------------------------------------------------------

// Every kernel this makes is defined on the same source line, with the same name.
auto make_scale(double s) {
  return deuteron::kernel("scale_by", [s](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto t : hl::tile(x.sizes())) out[t] = x[t] * s;
    return out;
  }, untuned());
}

TEST(Exact, KernelsFromOneFactoryLineRunTheirOwnCode) {
  auto twice = make_scale(2.0);
  auto thrice = make_scale(3.0);
  for (std::vector<int64_t> shape : {std::vector<int64_t>{37}, {1}}) {
    Tensor x = Tensor::rand(shape, DType::f32, 1);
    Tensor a = twice(x), b = thrice(x), c = twice(x);
    for (int64_t i = 0; i < x.numel(); ++i) {
      EXPECT_EQ(a.get(i), float(x.get(i) * 2.0)) << i;
      EXPECT_EQ(b.get(i), float(x.get(i) * 3.0)) << i;
      EXPECT_EQ(c.get(i), float(x.get(i) * 2.0)) << i;
    }
    // Through the driver (what the CLI and the tuner use) as well.
    auto r = driver::run(thrice, {x}, "cpu", config::Config());
    EXPECT_EQ(r.outputs[0].get(0), float(x.get(0) * 3.0));
  }
}

// Kernels that differ only in where a constant slice starts: their IR must differ too (it
// printed both as `:`), or they would share one compiled kernel.
auto make_window(int64_t start) {
  return deuteron::kernel("window", [start](hl::Tensor x) {
    auto out = hl::empty({x.size(0), 3});
    for (auto t : hl::tile(x.size(0))) out[{t, hl::all}] = x[{t, hl::slice(start, start + 3)}];
    return out;
  }, untuned());
}

TEST(Exact, KernelsDifferingInASliceOffsetRunTheirOwnCode) {
  auto first = make_window(0), second = make_window(2);
  Tensor x = Tensor::rand({5, 6}, DType::f32, 2);
  Tensor a = first(x), b = second(x);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(a.get(i * 3 + j), x.get(i * 6 + j)) << i << ", " << j;
      EXPECT_EQ(b.get(i * 3 + j), x.get(i * 6 + j + 2)) << i << ", " << j;
    }
  auto s = driver::specialize(second, frontend::describe_args(second, {x}), "cpu");
  EXPECT_NE(ir::print(s.ir).find("load arg0[t0, 2:5]"), std::string::npos) << ir::print(s.ir);
}

}  // namespace
}  // namespace deuteron
