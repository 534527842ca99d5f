// The tile language, op by op: each kernel here is checked against plain loops in double
// precision, at ragged shapes and size one, with the default config and a few others.
#include <cmath>
#include <functional>
#include <map>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "backends/cpu/codegen.h"
#include "backends/cpu/refine.h"
#include "config_fit.h"
#include "deuteron/deuteron.h"
#include "driver/driver.h"

namespace deuteron {
namespace {

namespace hl = deuteron::hl;
using Fn = std::function<double(int64_t i, int64_t j)>;

// Runs `k` with `args` and checks output `which` (2-D [m, n]) against `want(i, j)`.
void expect_2d(const KernelBase& k, const std::vector<Arg>& args, const Fn& want, size_t which = 0,
               const std::optional<config::Config>& cfg = std::nullopt, double tol = 1e-5) {
  auto r = api::run(k, args, "cpu", cfg ? cfg : std::optional<config::Config>(config::Config()));
  const Tensor& out = r.outputs.at(which);
  int64_t m = out.size(0), n = out.dim() > 1 ? out.size(1) : 1;
  int bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double got = out.get(i * n + j), exp = want(i, j);
      bool ok = (std::isnan(exp) && std::isnan(got)) || std::abs(got - exp) <= tol + tol * std::abs(exp);
      if (!ok && bad++ < 5)
        ADD_FAILURE() << k.name() << " config " << r.config.dump() << " at (" << i << ", " << j << "): got "
                      << got << ", want " << exp;
    }
}

// A config for kernel `k` at `args`: each named block size clamped to what the space allows.
config::Config sized(const KernelBase& k, const std::vector<Arg>& args, std::map<std::string, int64_t> want) {
  return testing_support::fit(k, args, want);
}

const std::vector<std::vector<int64_t>> kShapes = {{37, 130}, {1, 1}, {64, 128}, {3, 1000}};

TEST(Language, UnaryOps) {
  static const auto k = deuteron::kernel("unary_ops", [](hl::Tensor x) {
    auto a = hl::empty_like(x), b = hl::empty_like(x), c = hl::empty_like(x), d = hl::empty_like(x),
         e = hl::empty_like(x), f = hl::empty_like(x), g = hl::empty_like(x);
    for (auto t : hl::tile(x.sizes())) {
      auto v = x[t];
      a[t] = hl::exp(v) + hl::exp2(v) - hl::log(hl::abs(v) + 0.5f);
      b[t] = hl::sqrt(hl::abs(v)) + hl::rsqrt(hl::abs(v) + 1.0f);
      c[t] = hl::tanh(v) + hl::sigmoid(v);
      d[t] = hl::silu(v) - v;
      e[t] = hl::gelu(v) + hl::gelu(v, "tanh");
      f[t] = hl::erf(v);
      g[t] = -v;
    }
    return std::make_tuple(a, b, c, d, e, f, g);
  });
  for (auto shape : kShapes) {
    Tensor x = Tensor::rand(shape, DType::f32, 3, -4, 4);
    int64_t n = shape[1];
    auto X = [&](int64_t i, int64_t j) { return x.get(i * n + j); };
    std::vector<Fn> want = {
        [&](auto i, auto j) { double v = X(i, j); return std::exp(v) + std::exp2(v) - std::log(std::abs(v) + 0.5); },
        [&](auto i, auto j) { double v = X(i, j); return std::sqrt(std::abs(v)) + 1 / std::sqrt(std::abs(v) + 1); },
        [&](auto i, auto j) { double v = X(i, j); return std::tanh(v) + 1 / (1 + std::exp(-v)); },
        [&](auto i, auto j) { double v = X(i, j); return v / (1 + std::exp(-v)) - v; },
        [&](auto i, auto j) {
          double v = X(i, j);
          return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))) +
                 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        },
        [&](auto i, auto j) { return std::erf(X(i, j)); },
        [&](auto i, auto j) { return -X(i, j); }};
    for (size_t o = 0; o < want.size(); ++o) expect_2d(k, {x}, want[o], o, std::nullopt, 2e-5);
  }
}

TEST(Language, BinaryWhereCompareAndBroadcast) {
  // x[m, n] op y[m, n], with a row vector b[n] and a column vector c[m] broadcast in.
  static const auto k = deuteron::kernel("binary_ops", [](hl::Tensor x, hl::Tensor y, hl::Tensor b, hl::Tensor c) {
    auto out = hl::empty_like(x), mx = hl::empty_like(x), cmp = hl::empty_like(x, DType::boolean);
    for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) {
      auto v = x[{tm, tn}], w = y[{tm, tn}];
      auto col = c[{tm}].unsqueeze(1);
      out[{tm, tn}] = hl::where(v > w, v * w, v - w) / (hl::abs(b[{tn}]) + 1.0f) + col;
      mx[{tm, tn}] = hl::maximum(v, w) * 2 - hl::minimum(v, 0.0f);
      cmp[{tm, tn}] = (v >= w) && !(v == 0.0f);
    }
    return std::make_tuple(out, mx, cmp);
  });
  for (auto shape : kShapes) {
    int64_t m = shape[0], n = shape[1];
    Tensor x = Tensor::rand(shape, DType::f32, 1), y = Tensor::rand(shape, DType::f32, 2);
    Tensor b = Tensor::rand({n}, DType::f32, 3), c = Tensor::rand({m}, DType::f32, 4);
    auto X = [&](int64_t i, int64_t j) { return x.get(i * n + j); };
    auto Y = [&](int64_t i, int64_t j) { return y.get(i * n + j); };
    expect_2d(k, {x, y, b, c}, [&](auto i, auto j) {
      double v = X(i, j), w = Y(i, j);
      return (v > w ? v * w : v - w) / (std::abs(b.get(j)) + 1) + c.get(i);
    }, 0);
    expect_2d(k, {x, y, b, c}, [&](auto i, auto j) { return std::max(X(i, j), Y(i, j)) * 2 - std::min(X(i, j), 0.0); }, 1);
    expect_2d(k, {x, y, b, c}, [&](auto i, auto j) { return double(X(i, j) >= Y(i, j) && X(i, j) != 0); }, 2);
  }
}

// A value that depends on no grid index (the sum of all of w) is computed once per thread before
// the grid steps; the row sums, which depend on the grid, stay in the steps. Both give the same
// answer on one thread and on two, whatever the blocks.
static const auto grid_invariant = deuteron::kernel(
    "grid_invariant",
    [](hl::Tensor x, hl::Tensor w) {
      auto out = hl::empty_like(x);
      for (auto tm : hl::tile(x.size(0), {.name = "rows"})) {
        auto total = w[{hl::all}].sum(0);  // the same in every grid step
        auto row = x[{tm, hl::all}];
        out[{tm, hl::all}] = row * total - row.sum(1, true);
      }
      return out;
    },
    {.arg_names = {"x", "w"}});

TEST(Language, GridInvariantValuesRunOncePerThread) {
  for (auto shape : kShapes) {
    int64_t m = shape[0], n = shape[1];
    Tensor x = Tensor::rand(shape, DType::f32, 7, -2, 2), w = Tensor::rand({n}, DType::f32, 8, -1, 1);
    double total = 0;
    for (int64_t j = 0; j < n; ++j) total += w.get(j);
    std::vector<double> rows(size_t(m), 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) rows[size_t(i)] += x.get(i * n + j);
    auto want = [&](int64_t i, int64_t j) { return x.get(i * n + j) * total - rows[size_t(i)]; };
    expect_2d(grid_invariant, {x, w}, want, 0, std::nullopt, 1e-4);
    for (int64_t threads : {1, 2}) {
      config::Config c = sized(grid_invariant, {x, w}, {{"block_rows", 4}});
      c.set("num_threads", threads);
      expect_2d(grid_invariant, {x, w}, want, 0, c, 1e-4);
    }
  }
  std::vector<Arg> args = {Tensor::rand({37, 130}, DType::f32, 7), Tensor::rand({130}, DType::f32, 8)};
  driver::Specialized s = driver::specialize(grid_invariant, frontend::describe_args(grid_invariant, args), "cpu");
  std::string src = s.backend->emit(driver::lower(s, s.space.default_config()));
  size_t once = src.find("// once per thread, before its grid steps"), steps = src.find("for (int64_t pid");
  ASSERT_NE(once, std::string::npos) << src;
  ASSERT_NE(steps, std::string::npos) << src;
  EXPECT_LT(once, steps);
  EXPECT_NE(src.find("w[", once), std::string::npos);
  EXPECT_LT(src.find("w["), steps) << "w's sum is read in the grid steps:\n" << src;
  EXPECT_GT(src.find("x["), steps) << "x's rows are read before the grid steps:\n" << src;
}

// Row reductions with and without keepdim, persistent and looped.
static const auto row_stats = deuteron::kernel("row_stats", [](hl::Tensor x) {
  int64_t m = x.size(0);
  auto sum = hl::empty({m}), mx = hl::empty({m}), mn = hl::empty({m}), mean = hl::empty({m}),
       centered = hl::empty_like(x);
  for (auto tm : hl::tile(m)) {
    auto row = x[{tm, hl::all}];
    sum[{tm}] = row.sum(1);
    mx[{tm}] = hl::amax(row, -1);
    mn[{tm}] = row.amin(1);
    mean[{tm}] = row.mean(1);
    centered[{tm, hl::all}] = row - row.mean(1, true);
  }
  return std::make_tuple(sum, mx, mn, mean, centered);
});

TEST(Language, RowReductionsPersistentAndLooped) {
  for (auto shape : kShapes) {
    int64_t n = shape[1];
    Tensor x = Tensor::rand(shape, DType::f32, 5, -2, 2);
    auto X = [&](int64_t i, int64_t j) { return x.get(i * n + j); };
    auto fold = [&](int64_t i, double init, auto f) {
      double a = init;
      for (int64_t j = 0; j < n; ++j) a = f(a, X(i, j));
      return a;
    };
    auto sum = [&](int64_t i) { return fold(i, 0.0, [](double a, double b) { return a + b; }); };
    for (const char* cfg : {"{}", R"({"reduce_r0": 16, "block_t0": 2})"}) {
      std::optional<config::Config> c;
      auto s = driver::specialize(row_stats, frontend::describe_args(row_stats, {x}), "cpu");
      config::Config parsed = config::Config::parse(cfg);
      if (parsed.has("reduce_r0")) {  // pick the smallest looped block the space offers
        auto t = std::find_if(s.space.tunables().begin(), s.space.tunables().end(),
                              [](auto& t) { return t.name == "reduce_r0"; });
        if (t->values.size() < 2) continue;  // the dim is too small to loop over
        parsed.set("reduce_r0", t->values.front());
      }
      c = parsed;
      expect_2d(row_stats, {x}, [&](auto i, auto) { return sum(i); }, 0, c, 1e-4);
      expect_2d(row_stats, {x}, [&](auto i, auto) { return fold(i, -INFINITY, [](double a, double b) { return std::max(a, b); }); }, 1, c);
      expect_2d(row_stats, {x}, [&](auto i, auto) { return fold(i, INFINITY, [](double a, double b) { return std::min(a, b); }); }, 2, c);
      expect_2d(row_stats, {x}, [&](auto i, auto) { return sum(i) / double(n); }, 3, c, 1e-4);
      expect_2d(row_stats, {x}, [&](auto i, auto j) { return X(i, j) - sum(i) / double(n); }, 4, c, 1e-4);
    }
  }
}

TEST(Language, ReductionOverTiledDimWithPartialBlocks) {
  // Column sums of x[m, n]: one grid block per column block, an inner loop over row blocks.
  static const auto k = deuteron::kernel("column_sums", [](hl::Tensor x) {
    int64_t m = x.size(0), n = x.size(1);
    auto out = hl::empty({n});
    for (auto tn : hl::tile(n)) {
      auto acc = hl::zeros({tn});
      for (auto tm : hl::tile(m)) acc = acc + x[{tm, tn}].sum(0);
      out[{tn}] = acc;
    }
    return out;
  });
  for (auto shape : kShapes) {
    int64_t m = shape[0], n = shape[1];
    Tensor x = Tensor::rand(shape, DType::f32, 6);
    auto r = api::run(k, {x}, "cpu", sized(k, {x}, {{"block_t0", 8}, {"block_t1", 16}}));
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t i = 0; i < m; ++i) s += x.get(i * n + j);
      EXPECT_NEAR(r.outputs[0].get(j), s, 1e-4) << j;
    }
  }
}

TEST(Language, ViewsTransposeExpandReshape) {
  static const auto k = deuteron::kernel("views", [](hl::Tensor x) {
    int64_t m = x.size(0), n = x.size(1);
    auto t = hl::empty({n, m}), e = hl::empty({m, n});
    for (auto [tm, tn] : hl::tile({m, n})) {
      auto v = x[{tm, tn}];
      t[{tn, tm}] = v.transpose(0, 1) * 2;
      auto col = v.amax(1).reshape({tm, 1}).expand({tm, tn});
      e[{tm, tn}] = col.permute({0, 1}) + v.unsqueeze(0).squeeze(0);
    }
    return std::make_tuple(t, e);
  });
  for (auto shape : kShapes) {
    int64_t n = shape[1];
    Tensor x = Tensor::rand(shape, DType::f32, 7);
    auto X = [&](int64_t i, int64_t j) { return x.get(i * n + j); };
    expect_2d(k, {x}, [&](auto i, auto j) { return 2 * X(j, i); }, 0);
    // The row max here is over the block's columns only: with one column block it is the row's.
    expect_2d(k, {x}, [&](auto i, auto j) {
      double mx = -INFINITY;
      for (int64_t q = 0; q < n; ++q) mx = std::max(mx, X(i, q));
      return mx + X(i, j);
    }, 1, sized(k, {x}, {{"block_t1", int64_t(1) << 40}}));
  }
}

TEST(Language, IntegerBoolAndHalfDtypes) {
  static const auto k = deuteron::kernel("dtypes", [](hl::Tensor a, hl::Tensor b, hl::Tensor h) {
    auto sum = hl::empty_like(a, DType::i64), pos = hl::empty_like(a, DType::boolean), half = hl::empty_like(h),
         rows = hl::empty({a.size(0)}, DType::i64);
    for (auto tm : hl::tile(a.size(0))) {
      auto va = a[{tm, hl::all}], vb = b[{tm, hl::all}];
      sum[{tm, hl::all}] = va.to(DType::i64) + vb;
      pos[{tm, hl::all}] = va > 0;
      rows[{tm}] = (va > 0).sum(1);
      half[{tm, hl::all}] = h[{tm, hl::all}] * 2.0f;
    }
    return std::make_tuple(sum, pos, half, rows);
  });
  for (auto shape : kShapes) {
    int64_t n = shape[1];
    Tensor a = Tensor::rand(shape, DType::i32, 8, -50, 50), b = Tensor::rand(shape, DType::i64, 9, -1000, 1000);
    Tensor h = Tensor::rand(shape, DType::f16, 10);
    std::vector<Arg> args = {a, b, h};
    expect_2d(k, args, [&](auto i, auto j) { return a.get(i * n + j) + b.get(i * n + j); }, 0, std::nullopt, 0);
    expect_2d(k, args, [&](auto i, auto j) { return double(a.get(i * n + j) > 0); }, 1, std::nullopt, 0);
    expect_2d(k, args, [&](auto i, auto j) { return 2 * h.get(i * n + j); }, 2, std::nullopt, 1e-3);
    expect_2d(k, args, [&](auto i, auto) {
      int64_t c = 0;
      for (int64_t j = 0; j < n; ++j) c += a.get(i * n + j) > 0;
      return double(c);
    }, 3, std::nullopt, 0);
  }
}

TEST(Language, ScalarsGridSlicesGatherIndices) {
  static const auto k = deuteron::kernel("indexing", [](hl::Tensor x, hl::Tensor idx, hl::Scalar alpha, hl::Scalar shift) {
    int64_t m = x.size(0), n = x.size(1);
    auto scaled = hl::empty({m, 3}), picked = hl::empty({m}), pos = hl::empty({m, n});
    for (auto i : hl::grid(m)) {
      scaled[{i, hl::all}] = x[{i, hl::slice(1, 4)}] * alpha + shift;
      picked[{i}] = x[{i, idx[{i}]}];
      pos[{i, hl::all}] = (hl::arange(n) + i.begin() * n).to(DType::f32);
    }
    return std::make_tuple(scaled, picked, pos);
  });
  for (auto shape : std::vector<std::vector<int64_t>>{{37, 130}, {1, 5}, {3, 1000}}) {
    int64_t m = shape[0], n = shape[1];
    Tensor x = Tensor::rand(shape, DType::f32, 11);
    Tensor idx = Tensor::rand({m}, DType::i64, 12, 0, double(n));
    std::vector<Arg> args = {x, idx, 1.5, int64_t(3)};
    expect_2d(k, args, [&](auto i, auto j) { return x.get(i * n + j + 1) * 1.5 + 3; }, 0);
    expect_2d(k, args, [&](auto i, auto) { return x.get(i * n + int64_t(idx.get(i))); }, 1);
    expect_2d(k, args, [&](auto i, auto j) { return double(i * n + j); }, 2, std::nullopt, 0);
  }
}

TEST(Language, TileAttributesAndSharedBlockSize) {
  static const auto k = deuteron::kernel("tile_attrs", [](hl::Tensor x) {
    int64_t m = x.size(0), n = x.size(1);
    auto out = hl::empty({m, n}), sizes = hl::empty({m});
    auto bs = hl::register_block_size(1, 64);
    for (auto tm : hl::tile(m, {.shared = bs})) {
      for (auto tn : hl::tile(n, {.shared = bs})) {
        out[{tm, tn}] = (tm.index().unsqueeze(1) * n + tn.index()).to(DType::f32) + x[{tm, tn}] * 0.0f;
      }
      sizes[{tm}] = hl::zeros({tm}) + (tm.end() - tm.begin()).to(DType::f32) + tm.block_size().to(DType::f32) * 0.0f;
    }
    return std::make_tuple(out, sizes);
  });
  for (auto shape : kShapes) {
    int64_t m = shape[0], n = shape[1];
    Tensor x = Tensor::rand(shape, DType::f32, 13);
    expect_2d(k, {x}, [&](auto i, auto j) { return double(i * n + j); }, 0, std::nullopt, 0);
    for (int64_t b : {1, 8, 64}) {
      auto cfg = sized(k, {x}, {{"block_size_0", b}});
      int64_t bs = cfg.integer("block_size_0");
      expect_2d(k, {x}, [&](auto i, auto) { return double(std::min(bs, m - i / bs * bs)); }, 1, cfg, 0);
    }
  }
}

// Dims and block sizes the user names: configs, the IR and generated code use those names.
TEST(Language, NamedDimsAndBlockSizes) {
  static const auto k = deuteron::kernel("named_dims", [](hl::Tensor x) {
    int64_t m = x.size(0), n = x.size(1);
    auto out = hl::empty({m, n}), rows = hl::empty({m});
    auto bs = hl::register_block_size(1, 64, "block_k");
    for (auto tm : hl::tile(m, {.name = "rows"})) {
      rows[{tm}] = tm.index().to(DType::f32);
      for (auto tn : hl::tile(n, {.shared = bs, .name = "cols"})) out[{tm, tn}] = x[{tm, tn}] * 2.0f;
    }
    return std::make_tuple(out, rows);
  });
  static const auto k2 = deuteron::kernel("named_dims_2d", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)}, {"m", "n"})) out[{tm, tn}] = x[{tm, tn}] + 1.0f;
    return out;
  });
  Tensor x = Tensor::rand({37, 5}, DType::f32, 13);
  auto names_of = [&](const KernelBase& kernel) {
    auto s = driver::specialize(kernel, frontend::describe_args(kernel, {x}), "cpu");
    std::vector<std::string> names;
    for (const auto& t : s.space.tunables()) names.push_back(t.name);
    return std::make_pair(names, s.backend->emit(driver::lower(s, s.space.default_config())));
  };
  auto [names, src] = names_of(k);
  for (const char* want : {"block_rows", "block_k", "inner_cols"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  EXPECT_NE(src.find("B_rows"), std::string::npos);
  EXPECT_NE(src.find("o_cols"), std::string::npos);
  auto [names2, src2] = names_of(k2);
  for (const char* want : {"block_m", "block_n"})
    EXPECT_NE(std::find(names2.begin(), names2.end(), want), names2.end()) << want;
  for (int64_t b : {1, 8, 64}) {
    auto cfg = sized(k, {x}, {{"block_rows", b}, {"block_k", b}});
    expect_2d(k, {x}, [&](auto i, auto j) { return 2.0 * x.get(i * 5 + j); }, 0, cfg, 0);
    expect_2d(k, {x}, [&](auto i, auto) { return double(i); }, 1, cfg, 0);
    expect_2d(k2, {x}, [&](auto i, auto j) { return x.get(i * 5 + j) + 1.0; }, 0, sized(k2, {x}, {{"block_m", b}}), 0);
  }
}

TEST(Language, BadDimNamesAreKernelErrors) {
  auto error_of = [](auto&& body) -> std::string {
    static int n = 0;
    auto k = deuteron::kernel(fmt::format("bad_names_{}", n++), body);
    try {
      driver::specialize(k, frontend::describe_args(k, {Tensor::rand({8, 8}, DType::f32, 1)}), "cpu");
    } catch (const KernelError& e) {
      return e.what();
    }
    return "";
  };
  std::string e = error_of([](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto t : hl::tile(x.size(0), {.name = "a b"})) out[{t, hl::all}] = x[{t, hl::all}];
    return out;
  });
  EXPECT_NE(e.find("is not an identifier"), std::string::npos) << e;
  e = error_of([](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto [a, b] : hl::tile({x.size(0), x.size(1)}, {"m", "m"})) out[{a, b}] = x[{a, b}];
    return out;
  });
  EXPECT_NE(e.find("'m' is taken"), std::string::npos) << e;
  e = error_of([](hl::Tensor x) {
    auto out = hl::empty_like(x);
    hl::register_block_size(1, 8, "block_m");
    for (auto [a, b] : hl::tile({x.size(0), x.size(1)}, {"m", "n"})) out[{a, b}] = x[{a, b}];
    return out;
  });
  EXPECT_NE(e.find("'m' is taken"), std::string::npos) << e;
}

TEST(Language, NonContiguousInput) {
  static const auto k = deuteron::kernel("scale", [](hl::Tensor x) {
    auto out = hl::empty(x.sizes());
    for (auto t : hl::tile(x.sizes())) out[t] = x[t] * 3.0f;
    return out;
  });
  // A transposed view of a [7, 5] buffer: logical shape [5, 7], strides [1, 5].
  Tensor base = Tensor::rand({7, 5}, DType::f32, 14);
  Tensor xt = Tensor::borrow(base.data(), {5, 7}, DType::f32, {1, 5});
  expect_2d(k, {xt}, [&](auto i, auto j) { return 3 * base.get(j * 5 + i); });
}

// hl::atomic_add: every block of rows adds its column sums into one output; hl::zeros and
// hl::full in host code make outputs set before the grid runs, on every launch.
TEST(Language, AtomicAddAcrossGridSteps) {
  static const auto k = deuteron::kernel("column_sums_atomic", [](hl::Tensor x) {
    auto sums = hl::zeros({x.size(1)});
    auto count = hl::zeros({1}, DType::i64);
    auto marked = hl::full({x.size(0)}, 7.5);  // only every row block's first row is stored
    for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) {
      hl::atomic_add(sums, {tn}, x[{tm, tn}].sum(0));
      hl::atomic_add(count, {0}, hl::full({tm, tn}, 1.0, DType::i64).sum(1).sum(0));
      marked[{tm.begin()}] = x[{tm.begin(), 0}];
    }
    return std::make_tuple(sums, count, marked);
  });
  for (auto s : kShapes) {
    Tensor x = Tensor::rand(s, DType::f32, 31);
    for (auto cfg : {config::Config(), sized(k, {x}, {{"block_t0", 8}, {"block_t1", 16}})}) {
      cfg.set("num_threads", 2);
      // Twice through the same compiled kernel: a second launch must not add onto the first.
      for (int launch = 0; launch < 2; ++launch) {
        auto r = api::run(k, {x}, "cpu", cfg);
        for (int64_t j = 0; j < s[1]; ++j) {
          double want = 0;
          for (int64_t i = 0; i < s[0]; ++i) want += x.get(i * s[1] + j);
          EXPECT_NEAR(r.outputs[0].get(j), want, 1e-5 * (1 + std::abs(want))) << "column " << j << " " << r.config.dump();
        }
        EXPECT_EQ(r.outputs[1].get(0), double(s[0] * s[1])) << r.config.dump();
        int64_t bm = r.config.has("block_t0") ? r.config.integer("block_t0") : s[0];
        for (int64_t i = 0; i < s[0]; ++i) {
          if (i % bm != 0) {
            EXPECT_EQ(r.outputs[2].get(i), 7.5) << "row " << i << " " << r.config.dump();
          }
        }
      }
    }
  }
}

TEST(Language, GeneratedCodeIsStableAndNamed) {
  Tensor x = Tensor::rand({100, 300}, DType::f32, 15);
  auto emit = [&] {
    auto s = driver::specialize(row_stats, frontend::describe_args(row_stats, {x}), "cpu");
    auto p = driver::lower(s, s.space.default_config());
    return std::make_pair(cpu::generate(cpu::refine(p)), p.config.dump());
  };
  auto [a, cfg] = emit();
  auto [b, cfg2] = emit();
  EXPECT_EQ(a, b);
  EXPECT_NE(a.find("deuteron_row_stats"), std::string::npos);
  EXPECT_NE(a.find("// config: " + cfg), std::string::npos);
}

TEST(Language, IrAndPlanPrint) {
  Tensor x = Tensor::rand({100, 300}, DType::f32, 15);
  auto s = driver::specialize(row_stats, frontend::describe_args(row_stats, {x}), "cpu");
  std::string ir = ir::print(s.ir);
  EXPECT_NE(ir.find("kernel row_stats"), std::string::npos);
  EXPECT_NE(ir.find("grid t0 in [0, 100)"), std::string::npos);
  EXPECT_NE(ir.find("amax"), std::string::npos);
  EXPECT_NE(ir.find("test_language.cpp:"), std::string::npos);
  std::string plan = plan::print(driver::lower(s, s.space.default_config()));
  EXPECT_NE(plan.find("block specs"), std::string::npos);
  EXPECT_NE(plan.find("fast memory"), std::string::npos);
}

TEST(Language, ConfigJsonRoundTrip) {
  Tensor x = Tensor::rand({100, 300}, DType::f32, 15);
  auto s = driver::specialize(row_stats, frontend::describe_args(row_stats, {x}), "cpu");
  std::mt19937_64 rng(1);
  for (int i = 0; i < 10; ++i) {
    config::Config c = s.space.random(rng);
    EXPECT_EQ(config::Config::parse(c.dump()), c);
    EXPECT_EQ(s.space.decode(s.space.encode(c)), c);
  }
}

}  // namespace
}  // namespace deuteron
