// User mistakes, in a kernel's source, in its arguments and in its config: each raises the
// right deuteron error, which points at the line of the mistake, and none crashes the process.
//
// Kernels here record the line of their mistake as they are traced (the statement before the
// mistake), so no test hard-codes a line number.
#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "api/api.h"
#include "catalogue.h"
#include "deuteron/deuteron.h"

namespace hl = deuteron::hl;

namespace deuteron {
namespace {

int mistake_line = 0;
#define THE_MISTAKE_IS_ON_THE_NEXT_LINE() (mistake_line = __LINE__ + 1)

std::string type_name(const std::type_info& t) {
  std::unique_ptr<char, decltype(&std::free)> name(abi::__cxa_demangle(t.name(), nullptr, nullptr, nullptr),
                                                   &std::free);
  return name ? name.get() : t.name();
}

// The error `f` throws, which must be an E (a failure is recorded otherwise).
template <typename E, typename F>
std::optional<E> error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << type_name(typeid(E)) << ", got " << type_name(typeid(e)) << ":\n"
                  << e.what();
    return std::nullopt;
  }
  ADD_FAILURE() << "expected " << type_name(typeid(E)) << ", but nothing was thrown";
  return std::nullopt;
}

testing::AssertionResult mentions(const std::optional<Error>& e, const std::string& text) {
  if (!e) return testing::AssertionFailure() << "no error";
  if (std::string(e->what()).find(text) == std::string::npos)
    return testing::AssertionFailure() << "'" << text << "' is not in:\n" << e->what();
  return testing::AssertionSuccess();
}

// The error points at this file's `line`: in where(), and so in what().
testing::AssertionResult points_at(const std::optional<Error>& e, int line) {
  if (!e) return testing::AssertionFailure() << "no error";
  std::string here = fmt::format("test_kernel_errors.cpp:{}", line);
  if (e->where() != here)
    return testing::AssertionFailure() << "points at '" << e->where() << "', not " << here << ":\n" << e->what();
  return mentions(e, "at " + here);
}

const Tensor x57 = Tensor::rand({5, 7}, DType::f32, 1);
const Tensor w7 = Tensor::rand({7}, DType::f32, 2);

// ---- mistakes in the kernel source -------------------------------------------------------------

TEST(KernelErrors, PointwiseOpOnBlocksThatDoNotBroadcast) {
  auto k = deuteron::kernel("mismatch", [](hl::Tensor x, hl::Tensor w) {
    auto out = hl::empty_like(x);
    for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) {
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[{tm, tn}] = x[{tm, tn}] + w[tm];  // [tm, tn] + [tm]: w should be indexed by tn
    }
    return out;
  });
  auto e = error_of<KernelError>([&] { k(x57, w7); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "shape mismatch"));
}

// Shape errors say what the user indexed with (tiles by name, whole dims by their length), not
// the internal block parameters ("reduce_r0 vs reduce_r1").
TEST(KernelErrors, ShapeMismatchesNameTheUsersDims) {
  auto k = deuteron::kernel("mismatch_whole", [](hl::Tensor x, hl::Tensor y) {
    auto out = hl::empty_like(x);
    for (auto tm : hl::tile(x.size(0))) {
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[{tm, hl::all}] = x[{tm, hl::all}] + y[{tm, hl::all}];  // 7 columns + 3 columns
    }
    return out;
  });
  auto e = error_of<KernelError>([&] { k(x57, Tensor::rand({5, 3}, DType::f32, 3)); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "[t0, 7] and [t0, 3] do not broadcast (a whole dim or slice of 7 vs a whole dim or slice of 3)"));
  EXPECT_FALSE(mentions(e, "reduce_"));
}

TEST(KernelErrors, PointwiseMismatchPointsAtTheOpNotTheOperands) {
  auto k = deuteron::kernel("mismatch_split", [](hl::Tensor x, hl::Tensor w) {
    auto out = hl::empty_like(x);
    for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) {
      auto a = x[{tm, tn}];
      auto b = w[tm];
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      auto c = a * b;
      out[{tm, tn}] = c;
    }
    return out;
  });
  auto e = error_of<KernelError>([&] { k(x57, w7); });
  EXPECT_TRUE(points_at(e, mistake_line));
}

TEST(KernelErrors, MoreIndicesThanDims) {
  auto k = deuteron::kernel("too_many_indices", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) {
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[{tm, tn}] = x[{tm, tn, 0}];
    }
    return out;
  });
  auto e = error_of<KernelError>([&] { k(x57); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "rank mismatch"));
}

TEST(KernelErrors, InnerTileUsedAfterItsLoop) {
  auto k = deuteron::kernel("inner_tile_escapes", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto tm : hl::tile(x.size(0))) {
      hl::Tile last;
      for (auto tn : hl::tile(x.size(1))) {
        out[{tm, tn}] = x[{tm, tn}];
        last = tn;
      }
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[{tm, last}] = x[{tm, last}] * 2.0;
    }
    return out;
  });
  auto e = error_of<KernelError>([&] { k(x57); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "outside its loop"));
}

TEST(KernelErrors, GridTileUsedAfterTheGrid) {
  auto attr = deuteron::kernel("grid_tile_escapes", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    hl::Tile saved;
    for (auto tm : hl::tile(x.size(0))) {
      out[{tm, hl::all}] = x[{tm, hl::all}];
      saved = tm;
    }
    THE_MISTAKE_IS_ON_THE_NEXT_LINE();
    auto first = saved.begin();
    return out;
  });
  auto e = error_of<KernelError>([&] { attr(x57); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "outside its loop"));

  auto read = deuteron::kernel("grid_tile_escapes_read", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    hl::Tile saved;
    for (auto tm : hl::tile(x.size(0))) {
      out[{tm, hl::all}] = x[{tm, hl::all}];
      saved = tm;
    }
    THE_MISTAKE_IS_ON_THE_NEXT_LINE();
    out[{saved, hl::all}] = x[{saved, hl::all}];
    return out;
  });
  e = error_of<KernelError>([&] { read(x57); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "outside a tile loop"));
}

TEST(KernelErrors, BlockValueUsedAfterTheGrid) {
  auto k = deuteron::kernel("value_escapes_grid", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    hl::Tensor v;
    for (auto tile : hl::tile(out.sizes())) {
      v = x[tile];
      out[tile] = v;
    }
    THE_MISTAKE_IS_ON_THE_NEXT_LINE();
    auto twice = v * 2.0;
    return out;
  });
  auto e = error_of<KernelError>([&] { k(x57); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "inside a tile loop"));
}

// A value first assigned inside an inner loop (not carried: it had no value before the loop)
// and used after it is an error at the use.
TEST(KernelErrors, BlockValueFirstAssignedInAnInnerLoopUsedAfterIt) {
  auto k = deuteron::kernel("value_escapes_inner", [](hl::Tensor x) {
    auto out = hl::empty({x.size(0)}, DType::f32);
    for (auto tm : hl::tile(x.size(0))) {
      hl::Tensor row_sum;
      for (auto tn : hl::tile(x.size(1))) row_sum = x[{tm, tn}].sum(1);
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[tm] = row_sum;
    }
    return out;
  });
  auto e = error_of<KernelError>([&] { k(x57); });
  EXPECT_TRUE(points_at(e, mistake_line));
}

TEST(KernelErrors, StoreOfTheWrongShape) {
  auto k = deuteron::kernel("store_whole_row_into_tile", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) {
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[{tm, tn}] = x[{tm, hl::all}];
    }
    return out;
  });
  auto e = error_of<KernelError>([&] { k(x57); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "store"));
}

// The error of a kernel summing x into one element with hl::atomic_add, into the output
// `make_total` creates.
template <typename MakeTotal>
std::optional<KernelError> atomic_total_error(const char* name, MakeTotal make_total) {
  auto k = deuteron::kernel(name, [make_total](hl::Tensor x) {
    auto total = make_total();
    for (auto tm : hl::tile(x.size(0))) {
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      hl::atomic_add(total, {0}, x[{tm, hl::all}].sum(1).sum(0));
    }
    return total;
  });
  return error_of<KernelError>([&] { k(x57); });
}

TEST(KernelErrors, AtomicAddIntoAnUninitialisedOutput) {
  auto e = atomic_total_error("atomic_add_into_empty", [] { return hl::empty({1}); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "hl::empty leaves uninitialised"));
  EXPECT_TRUE(mentions(e, "hl::zeros"));
}

TEST(KernelErrors, AtomicAddIntoBFloat16) {
  auto e = atomic_total_error("atomic_add_into_bf16", [] { return hl::zeros({1}, DType::bf16); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "atomic adds are f32, int32 or int64"));
}

TEST(KernelErrors, AtomicAddInHostCode) {
  auto k = deuteron::kernel("atomic_add_in_host_code", [](hl::Tensor x) {
    auto total = hl::zeros({1});
    hl::Tensor partial;
    for (auto tm : hl::tile(x.size(0))) total[{0}] = x[{tm, hl::all}].sum(1).sum(0);
    THE_MISTAKE_IS_ON_THE_NEXT_LINE();
    hl::atomic_add(total, {0}, partial);
    return total;
  });
  auto e = error_of<KernelError>([&] { k(x57); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "inside a tile loop"));
}

TEST(KernelErrors, StoreOfTheWrongRank) {
  auto k = deuteron::kernel("store_2d_into_1d", [](hl::Tensor x) {
    auto out = hl::empty({x.size(0)}, DType::f32);
    for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) {
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[tm] = x[{tm, tn}] * 2.0;
    }
    return out;
  });
  auto e = error_of<KernelError>([&] { k(x57); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "storing a block of shape"));
}

// A bad store is reported at the store's line, not where the stored value was computed.
TEST(KernelErrors, StoreErrorPointsAtTheStoreNotTheValue) {
  auto k = deuteron::kernel("store_split", [](hl::Tensor x) {
    auto out = hl::empty({x.size(0)}, DType::f32);
    for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) {
      auto doubled = x[{tm, tn}] * 2.0;
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[tm] = doubled;
    }
    return out;
  });
  auto e = error_of<KernelError>([&] { k(x57); });
  EXPECT_TRUE(points_at(e, mistake_line));
}

TEST(KernelErrors, BlockSizeThatIsNotAPowerOfTwo) {
  auto k = deuteron::kernel("block_size_3", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    THE_MISTAKE_IS_ON_THE_NEXT_LINE();
    for (auto tm : hl::tile(x.size(0), {.block_size = 3})) out[{tm, hl::all}] = x[{tm, hl::all}];
    return out;
  });
  auto e = error_of<KernelError>([&] { k(x57); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "power of two"));
}

TEST(KernelErrors, LanguageOpOutsideAKernel) {
  hl::Tensor nothing;
  THE_MISTAKE_IS_ON_THE_NEXT_LINE();
  auto e = error_of<KernelError>([&] { hl::exp(nothing); });
  EXPECT_TRUE(points_at(e, mistake_line));
}

// ---- mistakes in the arguments at call time ----------------------------------------------------

// A kernel written for 2-D x, called with 1-D x: reported where the kernel indexes it.
TEST(KernelErrors, TensorOfTheWrongRank) {
  auto k = deuteron::kernel("row_sums", [](hl::Tensor x) {
    auto out = hl::empty({x.size(0)}, DType::f32);
    for (auto tm : hl::tile(x.size(0))) {
      THE_MISTAKE_IS_ON_THE_NEXT_LINE();
      out[tm] = x[{tm, hl::all}].sum(1);
    }
    return out;
  });
  auto e = error_of<KernelError>([&] { k(w7); });
  EXPECT_TRUE(points_at(e, mistake_line));
  EXPECT_TRUE(mentions(e, "rank mismatch"));

  // The catalogue's softmax does the same.
  const auto& softmax = examples::find("softmax");
  e = error_of<KernelError>([&] { softmax.kernel->run({w7}); });
  EXPECT_TRUE(mentions(e, "softmax.cpp:"));
  EXPECT_TRUE(mentions(e, "rank mismatch"));
}

TEST(KernelErrors, CrossEntropyLabelsOfTheWrongRank) {
  const auto& ce = examples::find("cross_entropy");
  Tensor labels = Tensor::rand({5, 1}, DType::i64, 3, 0, 7);
  auto e = error_of<ArgumentError>([&] { ce.kernel->run({x57, labels, int64_t(-100)}); });
  EXPECT_TRUE(mentions(e, "cross_entropy.cpp:"));
  EXPECT_TRUE(mentions(e, "labels must be 1-D"));
}

// A kernel states what its arguments must be with hl::expect in its host code.
TEST(KernelErrors, CrossEntropyLabelsOfTheWrongDtype) {
  const auto& ce = examples::find("cross_entropy");
  Tensor labels = Tensor::rand({5}, DType::f32, 3, 0, 7);
  auto e = error_of<ArgumentError>([&] { ce.kernel->run({x57, labels, int64_t(-100)}); });
  EXPECT_TRUE(mentions(e, "labels must be int64"));
  EXPECT_TRUE(mentions(e, "cross_entropy.cpp:"));
}

TEST(KernelErrors, WrongNumberOfArguments) {
  const auto& softmax = examples::find("softmax");
  auto e = error_of<ArgumentError>([&] { softmax.kernel->run({x57, x57}); });
  EXPECT_TRUE(mentions(e, "takes 1 arguments, got 2"));
  EXPECT_TRUE(mentions(e, "softmax.cpp:"));
}

TEST(KernelErrors, NumberWhereATensorIsExpected) {
  auto k = deuteron::kernel("needs_tensor", [](hl::Tensor x) {
    THE_MISTAKE_IS_ON_THE_NEXT_LINE();
    auto out = hl::empty_like(x);
    for (auto tile : hl::tile(out.sizes())) out[tile] = x[tile];
    return out;
  });
  auto e = error_of<KernelError>([&] { k(2.0); });
  EXPECT_TRUE(points_at(e, mistake_line));
}

// Labels outside [0, V): the gather's index check fails the launch with the value and the dim,
// for too large and negative labels, instead of reading outside the logits.
TEST(KernelErrors, CrossEntropyLabelOutOfRange) {
  const auto& ce = examples::find("cross_entropy");
  Tensor logits = Tensor::rand({5, 7}, DType::f32, 3);
  for (int64_t bad : {7, 1000, -1}) {
    Tensor labels = Tensor::rand({5}, DType::i64, 4, 0.0, 7.0);
    labels.set(3, double(bad));
    auto e = error_of<RuntimeError>([&] { api::run(*ce.kernel, {logits, labels, int64_t(-100)}, "cpu", config::Config()); });
    EXPECT_TRUE(mentions(e, fmt::format("index {} is out of range for dim 1", bad)));
    EXPECT_TRUE(mentions(e, "(size 7)"));
    EXPECT_TRUE(mentions(e, "cross_entropy.cpp"));
  }
  // The same compiled kernel runs on with valid labels.
  Tensor labels = Tensor::rand({5}, DType::i64, 4, 0.0, 7.0);
  auto r = api::run(*ce.kernel, {logits, labels, int64_t(-100)}, "cpu", config::Config());
  EXPECT_TRUE(allclose(r.outputs[0], ce.reference({logits, labels, int64_t(-100)})[0], 1e-5, 1e-5).close);
}

// ---- mistakes in configs -----------------------------------------------------------------------

// The same copy kernel with a config pinned in its definition.
auto copy_with_config(const std::string& config) {
  return deuteron::kernel(
      "copy_pinned",
      [](hl::Tensor x) {
        auto out = hl::empty_like(x);
        for (auto tile : hl::tile(out.sizes())) out[tile] = x[tile];
        return out;
      },
      {.config = config});
}

TEST(KernelErrors, PinnedConfigWithAnIllegalBlockSize) {
  auto k = copy_with_config(R"({"block_t0": 3})");
  auto e = error_of<ConfigError>([&] { k(x57); });
  EXPECT_TRUE(mentions(e, "'block_t0'"));
  EXPECT_TRUE(mentions(e, "3"));
  EXPECT_TRUE(mentions(e, "legal values: 1, 2, 4, 8"));  // dim 0 has 5 elements
}

TEST(KernelErrors, GivenConfigWithAnIllegalBlockSize) {
  const auto& add = examples::find("add");
  auto e = error_of<ConfigError>([&] {
    api::run(*add.kernel, {x57, x57}, "cpu", config::Config::parse(R"({"block_t1": 6})"));
  });
  EXPECT_TRUE(mentions(e, "'block_t1'"));
  EXPECT_TRUE(mentions(e, "legal values"));
}

TEST(KernelErrors, PinnedConfigWithAnUnknownKey) {
  auto k = copy_with_config(R"({"block_q": 4})");
  auto e = error_of<ConfigError>([&] { k(x57); });
  EXPECT_TRUE(mentions(e, "'block_q'"));
  EXPECT_TRUE(mentions(e, "block_t0"));  // the hint lists the tunables there are
}

TEST(KernelErrors, PinnedConfigThatIsNotJson) {
  auto k = copy_with_config(R"({"block_t0": 4)");
  auto e = error_of<ConfigError>([&] { k(x57); });
  EXPECT_TRUE(mentions(e, "not valid JSON"));
}

TEST(KernelErrors, PinnedConfigThatIsNotAnObject) {
  auto k = copy_with_config("[4]");
  auto e = error_of<ConfigError>([&] { k(x57); });
  EXPECT_TRUE(mentions(e, "JSON object"));
}

// Blocks larger than the CPU's fast memory (L2 per thread, at most a few MiB on any x86 part):
// a FastMemoryError, the ConfigError `deuteron aot` tells apart, saying how much and what to do.
TEST(KernelErrors, ConfigThatDoesNotFitFastMemory) {
  const auto& softmax = examples::find("softmax");
  Tensor x = Tensor::zeros({8, int64_t(1) << 20}, DType::f32);  // 4 MiB rows, 8 per block: 32 MiB
  auto e = error_of<FastMemoryError>([&] {
    api::run(*softmax.kernel, {x}, "cpu", config::Config::parse(R"({"block_rows": 8, "reduce_r0": 1048576})"));
  });
  EXPECT_TRUE(mentions(e, "of fast memory per thread"));
  EXPECT_TRUE(e && e->hint().find("smaller blocks") != std::string::npos);
}

// A bad pinned config names the kernel it belongs to and where the kernel was defined.
TEST(KernelErrors, PinnedConfigErrorNamesTheKernel) {
  THE_MISTAKE_IS_ON_THE_NEXT_LINE();
  auto k = copy_with_config(R"({"block_t0": 3})");
  auto e = error_of<ConfigError>([&] { k(x57); });
  EXPECT_TRUE(mentions(e, "copy_pinned"));
  EXPECT_FALSE(e && e->where().empty());
}

// ---- after an error ----------------------------------------------------------------------------

// A failed trace leaves nothing behind: the same kernel object still fails the same way, and
// other kernels trace and run normally.
TEST(KernelErrors, TracingRecoversAfterAnError) {
  auto bad = deuteron::kernel("bad_then_good", [](hl::Tensor x, hl::Tensor w) {
    auto out = hl::empty_like(x);
    for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) out[{tm, tn}] = x[{tm, tn}] + w[tm];
    return out;
  });
  auto good = deuteron::kernel("good_after_bad", [](hl::Tensor x, hl::Tensor w) {
    auto out = hl::empty_like(x);
    for (auto [tm, tn] : hl::tile({x.size(0), x.size(1)})) out[{tm, tn}] = x[{tm, tn}] + w[tn];
    return out;
  });
  for (int i = 0; i < 2; ++i) error_of<KernelError>([&] { bad(x57, w7); });
  Tensor out = good(x57, w7);
  for (int64_t i = 0; i < 35; ++i) EXPECT_FLOAT_EQ(float(out.get(i)), float(x57.get(i) + w7.get(i % 7)));
}

}  // namespace
}  // namespace deuteron
