// The generated C++ reads like hand-written code, for every catalogue kernel: no `0 +` or
// `+ 0`, no constant declared and never used, comments that name the kernel's source lines
// rather than IR value ids, and <omp.h> rather than a hand-written declaration.
#include <map>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backends/cpu/refine.h"
#include "catalogue.h"
#include "deuteron/deuteron.h"
#include "driver/driver.h"

namespace deuteron {
namespace {

namespace hl = deuteron::hl;

// How often `what` occurs in `text`.
size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string emit_cpu(const examples::Entry& e) {
  auto args = e.inputs(e.small_shape, DType::f32, 1);
  auto s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, args), "cpu");
  return s.backend->emit(driver::lower(s, s.space.default_config()));
}

TEST(GeneratedCode, ReadsLikeHandWrittenCode) {
  const std::regex zero_plus(R"((^|[^\w.])0 \+ )"), plus_zero(R"( \+ 0($|[^\w.]))");
  const std::regex constant(R"(^\s*constexpr int64_t (\w+) =)"), value_id(R"(//.*%\d)");
  for (const examples::Entry& e : examples::catalogue()) {
    std::string src = emit_cpu(e);
    EXPECT_NE(src.find("#include <omp.h>"), std::string::npos) << e.name;
    EXPECT_EQ(src.find("extern \"C\" int omp_"), std::string::npos) << e.name;
    std::istringstream in(src);
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      ++n;
      std::string code = line.substr(0, line.find("//"));
      EXPECT_FALSE(std::regex_search(code, zero_plus)) << e.name << " line " << n << ": " << line;
      EXPECT_FALSE(std::regex_search(code, plus_zero)) << e.name << " line " << n << ": " << line;
      EXPECT_FALSE(std::regex_search(line, value_id)) << e.name << " line " << n << ": " << line;
      std::smatch m;
      if (std::regex_search(line, m, constant)) {
        const std::regex word("\\b" + m[1].str() + "\\b");
        auto uses = std::distance(std::sregex_iterator(src.begin(), src.end(), word), std::sregex_iterator());
        EXPECT_GT(uses, 1) << e.name << ": " << m[1] << " is declared and never used";
      }
    }
    // Group comments name the kernel's source file and line.
    EXPECT_NE(src.find(".cpp:"), std::string::npos) << e.name;
  }
}

driver::Specialized specialize_at(const std::string& kernel, const std::vector<int64_t>& shape) {
  const examples::Entry& e = examples::find(kernel);
  return driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, e.inputs(shape, DType::f32, 1)), "cpu");
}

// A general variant (deuteron aot) reads every size at run time: its source is the same at any
// shape and holds none of the shape's numbers; the one-shape variant is what emit prints.
TEST(GeneratedCode, GeneralVariantReadsItsSizes) {
  const config::Config looped = config::Config::parse(R"({"block_rows":8,"reduce_r0":256})");
  driver::Specialized a = specialize_at("softmax", {1031, 2053}), b = specialize_at("softmax", {1037, 2063});
  backends::AotVariant ga = a.backend->emit_aot(driver::lower(a, driver::complete(a, looped)), "k_general", true);
  backends::AotVariant gb = b.backend->emit_aot(driver::lower(b, driver::complete(b, looped)), "k_general", true);
  EXPECT_EQ(ga.source, gb.source);
  EXPECT_EQ(ga.scratch_per_thread, gb.scratch_per_thread);
  for (const char* number : {"1031", "2053", "1030", "2052", "129"}) EXPECT_EQ(ga.source.find(number), std::string::npos) << number;
  EXPECT_NE(ga.source.find("const int64_t* sizes"), std::string::npos);
  EXPECT_NE(ga.source.find("extern \"C\" void k_general("), std::string::npos);

  plan::Plan p = driver::lower(a, driver::complete(a, looped));
  std::string one = a.backend->emit_aot(p, "k_1031x2053", false).source, printed = a.backend->emit(p);
  EXPECT_EQ(one.replace(one.find("k_1031x2053"), 11, "deuteron_softmax"), printed);
}

// `stores: stream` writes each output row from a buffer in scratch with dt::stream_store, and
// fences before the parallel region ends; `cached` stores in place. The default streams only
// outputs larger than the last-level cache: not 32 KB (any x86 L3 holds it), but 1 GB.
TEST(GeneratedCode, StreamingStoresGoThroughARowBuffer) {
  driver::Specialized s = specialize_at("softmax", {8, 1000});
  ASSERT_NE(s.space.find("stores"), nullptr);
  EXPECT_EQ(s.space.default_config().text("stores"), "cached");
  const KernelBase& softmax = *examples::find("softmax").kernel;  // 1 GB, never touched
  driver::Specialized big =
      driver::specialize(softmax, frontend::describe_args(softmax, {Tensor::empty({262144, 1024}, DType::f32)}), "cpu");
  EXPECT_EQ(big.space.default_config().text("stores"), "stream");
  config::Config c = s.space.default_config();
  c.set("stores", "cached");
  std::string cached = s.backend->emit(driver::lower(s, c));
  c.set("stores", "stream");
  std::string streamed = s.backend->emit(driver::lower(s, c));
  EXPECT_EQ(cached.find("stream_store"), std::string::npos);
  // A 1000-wide row streams out in pieces of dt::kStreamChunk, each at the buffer's start.
  EXPECT_NE(streamed.find("s_r0 += dt::kStreamChunk"), std::string::npos) << streamed;
  EXPECT_NE(streamed.find("row_out0[i_r0 - s_r0] = "), std::string::npos) << streamed;
  EXPECT_NE(streamed.find(" + s_r0, row_out0, e_r0 - s_r0);"), std::string::npos) << streamed;
  EXPECT_NE(streamed.find("dt::stream_store(out0 + "), std::string::npos) << streamed;
  EXPECT_NE(streamed.find("dt::stream_fence();"), std::string::npos) << streamed;
  EXPECT_EQ(streamed, s.backend->emit(driver::lower(s, c)));  // byte-identical when emitted again
}

// A row kernel's pass that reads its block a second time (from cache) prefetches into L2 the rows the
// next grid step reads first, one cache line per chunk, guarded so that no prefetch goes past
// the tensor's last row; the pass before the one that stores prefetches the store's lines for
// writing (not when the store streams past the cache, nor when a block is too large to stay
// cached).
TEST(GeneratedCode, RowPassesPrefetchTheNextBlockAndTheirStores) {
  driver::Specialized s = specialize_at("softmax", {130, 1000});
  config::Config c = config::Config::parse(R"({"block_rows":4,"reduce_r0":1024,"stores":"cached"})");
  std::string src = s.backend->emit(driver::lower(s, driver::complete(s, c)));
  const std::string next = "if ((o_rows + B_rows + i_rows) < 130) __builtin_prefetch(&x[((o_rows + B_rows + i_rows)) * 1000 + i_r0], 0, 2);";
  const std::string write = "__builtin_prefetch(&out0[((o_rows + i_rows)) * 1000 + i_r0], 1, 3);";
  EXPECT_EQ(count(src, next), 1u) << src;
  EXPECT_EQ(count(src, write), 1u) << src;
  EXPECT_EQ(count(src, "__builtin_prefetch"), 2u) << src;
  // Both in the exp-and-sum pass (the second chunk loop), one per 64-byte line of the chunk.
  size_t first_chunks = src.find("c_r0 += dt::kReduceChunk"), second_chunks = src.find("c_r0 += dt::kReduceChunk", first_chunks + 1);
  ASSERT_NE(second_chunks, std::string::npos) << src;
  EXPECT_GT(src.find(next), second_chunks) << src;
  EXPECT_LT(src.find(next), src.find("dt::exp_nonpositive_chunk(")) << src;
  EXPECT_NE(src.find("i_r0 < c_r0 + dt::kReduceChunk; i_r0 += 16)"), std::string::npos) << src;
  EXPECT_EQ(src, s.backend->emit(driver::lower(s, driver::complete(s, c))));  // byte-identical

  c.set("stores", "stream");
  std::string streamed = s.backend->emit(driver::lower(s, driver::complete(s, c)));
  EXPECT_EQ(count(streamed, next), 1u) << streamed;
  EXPECT_EQ(streamed.find("__builtin_prefetch(&out0"), std::string::npos) << streamed;

  c = config::Config::parse(R"({"block_rows":128,"reduce_r0":1024,"stores":"cached"})");  // 500 KiB blocks
  std::string large = s.backend->emit(driver::lower(s, driver::complete(s, c)));
  EXPECT_EQ(large.find("__builtin_prefetch"), std::string::npos) << large;

  // rms_norm's normalising pass has no reduction: it runs in chunks for its prefetch.
  driver::Specialized r = specialize_at("rms_norm", {130, 1000});
  c = config::Config::parse(R"({"block_rows":2,"reduce_r0":1024,"stores":"cached"})");
  std::string rms = r.backend->emit(driver::lower(r, driver::complete(r, c)));
  EXPECT_EQ(count(rms, "if ((o_rows + B_rows + i_rows) < 130) __builtin_prefetch(&x["), 1u) << rms;
  EXPECT_EQ(count(rms, "__builtin_prefetch(&out0[((o_rows + i_rows)) * 1000 + i_r0], 1, 3);"), 1u) << rms;
  EXPECT_EQ(count(rms, "c_r0 += dt::kReduceChunk"), 2u) << rms;

  // cross_entropy reads one logit per row (the label's, a gather) between its max pass and its
  // exp pass: the exp pass still reads the block a second time, so it prefetches the next rows.
  // Its loss is a one-element atomic add, which leaves it the row kernels' default (16 KiB of
  // rows: 4 of 1000 floats; rms_norm_bwd adds whole rows of grad_w per block, keeps larger ones).
  driver::Specialized ce = specialize_at("cross_entropy", {130, 1000});
  EXPECT_EQ(ce.space.default_config().integer("block_rows"), 4) << ce.space.default_config().dump();
  c = config::Config::parse(R"({"block_rows":2,"reduce_r0":256,"reduce_r1":1024})");
  std::string ce_src = ce.backend->emit(driver::lower(ce, driver::complete(ce, c)));
  EXPECT_EQ(count(ce_src, "if ((o_rows + B_rows + i_rows) < 130) __builtin_prefetch(&logits[((o_rows + B_rows + i_rows)) * 1000 + i_r1], 0, 2);"), 1u) << ce_src;
  driver::Specialized bwd = specialize_at("rms_norm_bwd", {130, 1000});
  EXPECT_GT(bwd.space.default_config().integer("block_rows"), 4) << bwd.space.default_config().dump();

  // A general variant guards with the row count it reads at run time.
  driver::Specialized a = specialize_at("softmax", {1031, 2053}), b = specialize_at("softmax", {1037, 2063});
  c = config::Config::parse(R"({"block_rows":1,"reduce_r0":4096,"stores":"cached"})");
  backends::AotVariant ga = a.backend->emit_aot(driver::lower(a, driver::complete(a, c)), "k_general", true);
  backends::AotVariant gb = b.backend->emit_aot(driver::lower(b, driver::complete(b, c)), "k_general", true);
  EXPECT_EQ(ga.source, gb.source);
  EXPECT_NE(ga.source.find("if ((o_rows + B_rows + i_rows) < E_rows) __builtin_prefetch(&x["), std::string::npos) << ga.source;
}

// Streaming stores and chunked row reductions in a general variant: the same source at any
// shape (no probe extent decides either), the row buffer laid out in its fast memory.
TEST(GeneratedCode, GeneralVariantStreamsAndChunks) {
  const config::Config c = config::Config::parse(R"({"block_rows":8,"reduce_r0":256,"stores":"stream"})");
  driver::Specialized a = specialize_at("softmax", {1031, 2053}), b = specialize_at("softmax", {1037, 2063});
  backends::AotVariant ga = a.backend->emit_aot(driver::lower(a, driver::complete(a, c)), "k_general", true);
  backends::AotVariant gb = b.backend->emit_aot(driver::lower(b, driver::complete(b, c)), "k_general", true);
  EXPECT_EQ(ga.source, gb.source);
  EXPECT_NE(ga.source.find("dt::stream_store(out0 + "), std::string::npos) << ga.source;
  EXPECT_NE(ga.source.find("row_out0 = reinterpret_cast<float*>(fast + "), std::string::npos) << ga.source;
  EXPECT_NE(ga.source.find("c_r0 += dt::kReduceChunk"), std::string::npos) << ga.source;
  for (const char* number : {"1031", "2053"}) EXPECT_EQ(ga.source.find(number), std::string::npos) << number;
}

// softmax_two_pass's three exps take dt::exp_nonpositive: the first pass's (x minus the
// -inf-guarded running max), the rescale's and the output pass's (x minus the first pass's
// running max over the whole row, ir::at_most's loop case). A max over half the row bounds
// nothing.
TEST(GeneratedCode, ExpAfterARunningMaxOverTheWholeRow) {
  driver::Specialized two = specialize_at("softmax_two_pass", {130, 1000});
  std::string two_src = two.backend->emit(driver::lower(two, two.space.default_config()));
  EXPECT_NE(two_src.find("dt::exp_nonpositive("), std::string::npos) << two_src;
  EXPECT_EQ(two_src.find("dt::exp("), std::string::npos) << two_src;
  // The same two passes, but the first one's loop stops at half the row.
  static const auto half = deuteron::kernel("half_row_max", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto tm : hl::tile(x.size(0))) {
      auto mi = hl::full({tm}, -INFINITY);
      for (auto tn : hl::tile(x.size(1) / 2)) mi = hl::maximum(mi, x[{tm, tn}].amax(1));
      for (auto tn : hl::tile(x.size(1))) out[{tm, tn}] = hl::exp(x[{tm, tn}] - mi.unsqueeze(1));
    }
    return out;
  });
  std::vector<Arg> args = {Tensor::rand({64, 100}, DType::f32, 1)};
  driver::Specialized s = driver::specialize(half, frontend::describe_args(half, args), "cpu");
  std::string src = s.backend->emit(driver::lower(s, s.space.default_config()));
  EXPECT_NE(src.find("dt::exp("), std::string::npos) << src;
  EXPECT_EQ(src.find("dt::exp_nonpositive("), std::string::npos) << src;
}

// A row kernel's code at [130, 1000] in its default config with one row per block and plain
// (cached) stores, so that no machine's cache sizes change which loops the passes get.
std::string emit_one_row_blocks(const std::string& kernel) {
  driver::Specialized s = specialize_at(kernel, {130, 1000});
  config::Config c = s.space.default_config();
  c.set("block_rows", 1);
  c.set("stores", "cached");
  return s.backend->emit(driver::lower(s, c));
}

// A chunked row reduction reads the values it takes from fast memory that stay the same along
// the row (layer_norm's centre and deviation scale) into scalars before its loops: beside a
// store to fast memory, GCC left such a chunk loop scalar with the load inside it (softmax,
// one row per block, 9x slower).
TEST(GeneratedCode, ChunkedReductionHoistsRowInvariants) {
  std::string src = emit_one_row_blocks("layer_norm");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(src, m, std::regex(R"(const float (h\d+) = m\d+\[i_rows\];\n\s*const float h\d+ = m\d+\[i_rows\];\n\s*const int64_t chunks_r0)")))
      << src;
  size_t loops = size_t(m.position(0)), end = src.find("for (int64_t j = 0; j < dt::kReduceChunk; ++j) acc", loops);
  ASSERT_NE(end, std::string::npos) << src;
  std::string chunk_and_rest = src.substr(loops, end - loops);  // the chunk loop and the rest of the row
  EXPECT_NE(chunk_and_rest.find("(v0 - " + m[1].str() + ")"), std::string::npos) << chunk_and_rest;  // x - centre
  EXPECT_FALSE(std::regex_search(chunk_and_rest, std::regex(R"(- m\d+\[)"))) << chunk_and_rest;
}

// A pass without a reduction hoists its row invariants too: softmax_two_pass's output pass
// (one row per block) reads the row's max and sum before its simd loop, not in it, which GCC
// left scalar beside the store to the output ("latch block not empty": 27 ms against 5.7).
// Its division by the sum multiplies by the sum's reciprocal where that is a normal float, in
// a first copy of the loop, and divides in a second. (Both copies come twice: the first pair
// reads the exponentials the sum's pass kept, the second computes them; see below.)
TEST(GeneratedCode, PlainPassHoistsRowInvariants) {
  std::string src = emit_one_row_blocks("softmax_two_pass");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      src, m,
      std::regex(
          R"(const float (h\d+) = m\d+\[i_rows\];\n\s*const float (h\d+) = m\d+\[i_rows\];\n\s*const float (r\d+) = 1.0f / \2;\n)")))
      << src;
  size_t again =
      src.find("} else {  // the pass over n took other row values: compute again", size_t(m.position(0)));
  ASSERT_NE(again, std::string::npos) << src;
  size_t at = src.find("if (dt::is_normal(" + m[3].str() + ")) {", again);
  ASSERT_NE(at, std::string::npos) << src;
  ASSERT_TRUE(std::regex_search(
      src.substr(at),
      std::regex(R"(^if \(dt::is_normal\(r\d+\)\) \{.*\n#pragma omp simd\n\s*for \(int64_t i_n_out = 0;)")))
      << src.substr(at);
  std::string loop = src.substr(at, src.find("out0[", at) - at);
  EXPECT_NE(loop.find("- " + m[1].str() + ")"), std::string::npos) << loop;  // x - max
  EXPECT_NE(loop.find("* " + m[3].str() + ")"), std::string::npos) << loop;  // e * (1 / sum)
  EXPECT_FALSE(std::regex_search(loop, std::regex(R"([-/*] m\d+\[)"))) << loop;
  size_t other = src.find("} else {", at);
  ASSERT_NE(other, std::string::npos) << src;
  std::string divided = src.substr(other, src.find("out0[", other) - other);
  EXPECT_NE(divided.find("/ " + m[2].str() + ")"), std::string::npos) << divided;  // e / sum
}

// softmax_two_pass's sum pass computes exp(x - max) along the row, and its output pass the
// same again. Where each pass covers the row in one trip, the sum's pass keeps the values in
// fast memory and the output pass reads them, if the max it subtracts has the bits of the one
// the sum's pass subtracted (that pass turns a max of -inf into 0); else it computes them.
// Where the sum's loop takes more than one trip, its values are of other maxes: nothing is kept.
TEST(GeneratedCode, OutputPassReadsTheSumPassExponentials) {
  std::string src = emit_one_row_blocks("softmax_two_pass");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      src, m,
      std::regex(
          R"(const float (v\d+) = dt::exp_nonpositive\(v\d+\);\n\s*(m\d+)\[i_rows \* 1024 \+ i_n\] = \1;)")))
      << src;
  const std::string kept = m[2].str();
  std::smatch key;
  ASSERT_TRUE(std::regex_search(
      src, key,
      std::regex(
          R"(if \(dt::same_bits\((h\d+), (m\d+)\[i_rows\]\)\) \{  // softmax\.cpp:\d+ \(v\d+\): as the pass over n computed and kept it\n)")))
      << src;
  size_t at = size_t(key.position(0)),
         other = src.find("} else {  // the pass over n took other row values: compute again", at);
  ASSERT_NE(other, std::string::npos) << src;
  std::string reading = src.substr(at, other - at);
  EXPECT_NE(reading.find("(" + kept + "[i_rows * 1024 + i_n_out] * r"), std::string::npos) << reading;
  EXPECT_NE(reading.find("(" + kept + "[i_rows * 1024 + i_n_out] / h"), std::string::npos) << reading;
  EXPECT_EQ(reading.find("exp"), std::string::npos) << reading;
  EXPECT_EQ(reading.find("x["), std::string::npos) << reading;
  EXPECT_NE(src.substr(other).find("dt::exp_nonpositive("), std::string::npos) << src.substr(other);

  driver::Specialized s = specialize_at("softmax_two_pass", {130, 1000});
  config::Config c = s.space.default_config();
  c.set("block_rows", 1);
  c.set("block_n", 256);  // four trips of the sum's loop
  std::string looped = s.backend->emit(driver::lower(s, c));
  ASSERT_NE(looped.find("constexpr int64_t B_n = 256;"), std::string::npos) << looped;
  EXPECT_EQ(looped.find("same_bits"), std::string::npos) << looped;
  EXPECT_EQ(looped.find("kept"), std::string::npos) << looped;
}

// Two threads of a kernel with matrix products each settle on a CPU of their own before every
// chunk of grid steps (dt::OwnCpu), and a moved thread goes back only after a barrier that every
// thread reaches when its work is done, having waited at the team's end (dt::TeamEnd, shared by
// the team). Row kernels, and one thread, leave the threads alone.
TEST(GeneratedCode, ThreadsOfAProductTakeCpusOfTheirOwn) {
  auto emit_threads = [](const std::string& kernel, const std::vector<int64_t>& shape, int threads) {
    driver::Specialized s = specialize_at(kernel, shape);
    config::Config c = s.space.default_config();
    c.set("num_threads", threads);
    return s.backend->emit(driver::lower(s, c));
  };
  std::string src = emit_threads("matmul", {100, 70, 130}, 2);
  size_t made = src.find("dt::OwnCpu own_cpu(team_region, omp_get_thread_num(), omp_get_num_threads());");
  size_t settle = src.find("own_cpu.settle(), grid_steps.claim(&first, &last);");
  size_t barrier =
      src.find("team_end.arrive_and_wait(own_cpu);\n#pragma omp barrier\n    own_cpu.release();");
  ASSERT_NE(made, std::string::npos) << src;
  ASSERT_NE(settle, std::string::npos) << src;
  ASSERT_NE(barrier, std::string::npos) << src;
  EXPECT_LT(src.find("const uint32_t team_region = dt::next_team_region();"), src.find("#pragma omp parallel"));
  EXPECT_LT(src.find("dt::TeamEnd team_end;"), src.find("#pragma omp parallel"));
  EXPECT_LT(made, settle);
  EXPECT_LT(settle, barrier);
  EXPECT_EQ(emit_threads("matmul", {100, 70, 130}, 1).find("OwnCpu"), std::string::npos);
  EXPECT_EQ(emit_threads("softmax", {130, 1000}, 2).find("OwnCpu"), std::string::npos);
}

// The grid's schedule keeps the steps that share a packed B panel (the row blocks of one column
// block) together: matmul's default order walks 4 blocks of 32 rows per column block.
TEST(GeneratedCode, ScheduleKeepsAPackedPanelsStepsTogether) {
  driver::Specialized s = specialize_at("matmul", {128, 256, 512});
  config::Config c = s.space.default_config();
  c.set("num_threads", 2);
  c.set("block_m", 32);
  c.set("block_n", 64);
  c.set("block_k", 256);
  c.set("inner_k_y", "resident");
  c.set("grid_order", config::Json::array({1, 0}));
  c.set("grid_group", 1);  // plain row-major order, whatever the machine's default
  std::string src = s.backend->emit(driver::lower(s, c));
  EXPECT_NE(src.find("dt::GridQueue grid_steps(32, 2, 4);"), std::string::npos) << src;
  c.set("inner_k_y", "in_place");  // nothing packed per column: plain chunks
  src = s.backend->emit(driver::lower(s, c));
  EXPECT_NE(src.find("dt::GridQueue grid_steps(32, 2);"), std::string::npos) << src;
}

// An A read in place whose block moves with the dot's loop (x[tm, tk] over k) reads new rows
// from memory on every trip, so its panels prefetch the next one (AView::ahead); attention's
// q[tq, :] stays the same over the kv loop and its scores come from fast memory, so neither does.
TEST(GeneratedCode, AnAOperandFromMemoryPrefetchesItsNextPanel) {
  driver::Specialized mm = specialize_at("matmul", {100, 70, 130});
  config::Config c = mm.space.default_config();  // blocks pinned: the defaults follow the L2
  c.set("block_m", 32);
  c.set("block_n", 64);
  c.set("block_k", 32);
  c.set("inner_k_x", "in_place");
  std::string src = mm.backend->emit(driver::lower(mm, c));
  EXPECT_NE(src.find("dt::gemm::a_in_place(x + o_m * 70 + o_k, 70, 1, true)"), std::string::npos) << src;
  driver::Specialized at = specialize_at("attention", {1, 2, 100, 32});
  src = at.backend->emit(driver::lower(at, at.space.default_config()));
  ASSERT_NE(src.find("dt::gemm::gemm("), std::string::npos) << src;
  EXPECT_EQ(src.find(", true),\n"), std::string::npos) << src;
}

// A dot's epilogue prefetches the rows of the tensors it reads a few rows ahead, where its block
// has them (RowPrefetch::rows_ahead): epilogue_subtiling's residual, not its bias (one row for
// every row of the tile) nor anything of matmul_layernorm's (its epilogue reads the accumulator).
TEST(GeneratedCode, AnEpiloguePrefetchesItsRowsAhead) {
  driver::Specialized s = specialize_at("epilogue_subtiling", {100, 70, 130});
  config::Config c = s.space.default_config();  // blocks pinned: the defaults follow the L2
  c.set("block_m", 32);
  c.set("block_n", 64);  // 256 bytes of f32: the shortest row that is prefetched
  c.set("block_k", 32);
  c.set("epilogue_subtiles", 1);
  std::string src = s.backend->emit(driver::lower(s, c));
  std::string guard = fmt::format("if (i_m + {} < n_m) {{", cpu::kEpilogueRowsAhead);
  size_t at = src.find(guard);
  ASSERT_NE(at, std::string::npos) << src;
  EXPECT_NE(
      src.find(fmt::format("__builtin_prefetch(&residual[((o_m + i_m + {})) * 130 + (o_n + i_n)], 0, 3);",
                           cpu::kEpilogueRowsAhead),
               at),
      std::string::npos)
      << src;
  EXPECT_EQ(src.find("__builtin_prefetch(&bias"), std::string::npos) << src;
  EXPECT_LT(at, src.find("dt::gelu_erf")) << "before the row's loop";
  driver::Specialized ln = specialize_at("matmul_layernorm", {100, 70, 130});
  src = ln.backend->emit(driver::lower(ln, ln.space.default_config()));
  EXPECT_EQ(src.find("rows ahead"), std::string::npos) << src;
  EXPECT_EQ(src.find("ahead\n"), std::string::npos) << src;
}

// Without dots or whole dims, the cpu target's default blocks take whole contiguous rows (up
// to 4096 elements) and proportionally fewer rows; row kernels (whole dims) as few rows as fill
// 16 KiB.
TEST(GeneratedCode, DefaultBlocksTakeWholeRows) {
  auto defaults = [](const std::string& name, const std::vector<int64_t>& shape) {
    return specialize_at(name, shape).space.default_config();
  };
  config::Config add = defaults("add", {4096, 4096});
  EXPECT_EQ(add.integer("block_t1"), 4096);
  EXPECT_EQ(add.integer("block_t0"), 4);
  EXPECT_EQ(defaults("add", {130, 1000}).integer("block_t1"), 1024);  // a ragged row in one block
  EXPECT_EQ(defaults("add", {1, 1}).integer("block_t1"), 1);
  config::Config two_pass = defaults("softmax_two_pass", {4096, 4096});
  EXPECT_EQ(two_pass.integer("block_n"), 4096);
  EXPECT_EQ(two_pass.integer("block_n_out"), 4096);
  EXPECT_EQ(two_pass.integer("block_rows"), 1);  // x read by two loops: 16 KiB of rows
  EXPECT_EQ(defaults("welford", {65536, 512}).integer("block_rows"), 8);
  // Row kernels (whole dims) take as few rows as fill 16 KiB.
  EXPECT_EQ(defaults("rms_norm", {8192, 4096}).integer("block_rows"), 1);
  EXPECT_EQ(defaults("softmax", {130, 1000}).integer("block_rows"), 4);  // 4000-byte rows
  config::Config batch = defaults("batch_softmax", {4, 1024, 4096});
  EXPECT_EQ(batch.integer("block_batch"), 1);
  EXPECT_EQ(batch.integer("block_rows"), 1);
  EXPECT_EQ(defaults("rms_norm_bwd", {8192, 4096}).integer("block_rows"), 512);  // atomic adds: unchanged
}

// Block products over a whole dim (attention's head dim, matmul_layernorm's N) keep it in one
// block; a general variant lays the micro-kernel's packed operands out from the call's sizes, so
// its source is the same at shapes of other D or N and holds none of their numbers.
TEST(GeneratedCode, GeneralVariantSizesWholeDimProducts) {
  struct Case {
    const char* kernel;
    std::vector<int64_t> a, b;
    const char* config;
  };
  for (const Case& c : {Case{"attention", {1, 2, 261, 263}, {1, 2, 267, 271},
                             R"({"block_q":32,"block_kv":64,"inner_kv_k":"stream","inner_kv_v":"stream","reduce_r0":512})"},
                        Case{"attention_causal", {1, 2, 261, 263}, {1, 2, 267, 271},
                             R"({"block_q":32,"block_kv":64,"inner_kv_k":"stream","inner_kv_v":"stream","reduce_r0":512})"},
                        Case{"matmul_layernorm", {259, 261, 263}, {265, 269, 271},
                             R"({"block_m":8,"block_k":32,"inner_k_x":"in_place","inner_k_y":"stream","reduce_r0":512})"}}) {
    driver::Specialized a = specialize_at(c.kernel, c.a), b = specialize_at(c.kernel, c.b);
    const config::Config config = config::Config::parse(c.config);
    backends::AotVariant ga = a.backend->emit_aot(driver::lower(a, driver::complete(a, config)), "k_general", true);
    backends::AotVariant gb = b.backend->emit_aot(driver::lower(b, driver::complete(b, config)), "k_general", true);
    EXPECT_EQ(ga.source, gb.source) << c.kernel;
    for (int64_t n : c.a)  // (the batch and head sizes, 1 and 2, are not told from other numbers)
      if (n > 2) {
        EXPECT_EQ(ga.source.find(std::to_string(n)), std::string::npos) << c.kernel << ": " << n;
      }
    EXPECT_NE(ga.source.find("dt::gemm::gemm("), std::string::npos) << c.kernel;
    EXPECT_EQ(ga.scratch_function, "k_general_scratch_per_thread") << c.kernel;
  }
}

// A scan's dim is one block: a general variant takes that block as each call's extent. In f32 the
// cumsum reads x and writes out0 directly (no fast memory); in bf16 it scans rows in fast memory
// that the scratch function sizes from the call's row length. Either way the source is the same
// at two shapes and holds none of their numbers (the block left out of the config, as
// `deuteron aot` leaves it). Stores are pinned to cached: streaming ones would stage rows in fast
// memory, and their default follows the L3's size (8.5 MB of output streams past an 8 MiB L3).
TEST(GeneratedCode, GeneralVariantOfAScanReadsItsRowLength) {
  const examples::Entry& e = examples::find("cumsum");
  for (DType dt : {DType::f32, DType::bf16}) {
    auto emit = [&](std::vector<int64_t> shape) {
      driver::Specialized s = driver::specialize(*e.kernel, frontend::describe_args(*e.kernel, e.inputs(shape, dt, 1)), "cpu");
      config::Config c = driver::complete(s, config::Config::parse(R"({"block_rows":8,"stores":"cached"})"));
      return s.backend->emit_aot(driver::lower(s, c), "k_general", true);
    };
    backends::AotVariant a = emit({1031, 2053}), b = emit({1037, 2063});
    EXPECT_EQ(a.source, b.source) << dtype_name(dt);
    for (const char* number : {"1031", "2053", "4096"}) EXPECT_EQ(a.source.find(number), std::string::npos) << number << a.source;
    if (dt == DType::f32) {  // 8 rows at a time from x, the rows' stride read at run time
      EXPECT_NE(a.source.find("dt::cumsum_rows_f32_in_double(x + "), std::string::npos) << a.source;
      EXPECT_NE(a.source.find("// fast memory: 0 bytes per thread"), std::string::npos) << a.source;
    } else {  // widened into fast memory row by row first, then scanned there
      EXPECT_NE(a.source.find("dt::cumsum_f32_in_double("), std::string::npos) << a.source;
      EXPECT_NE(a.source.find("return long((E_r0 * 32 + 63) / 64 * 64);"), std::string::npos) << a.source;
    }
  }
}

// What a general variant cannot hold is a ConfigError naming it: a copy spanning a whole dim.
TEST(GeneratedCode, GeneralVariantRefusesResidentOperands) {
  driver::Specialized s = specialize_at("matmul", {130, 67, 100});
  config::Config c = driver::complete(s, config::Config::parse(R"({"inner_k":"in_place","inner_k_y":"resident"})"));
  try {
    s.backend->emit_aot(driver::lower(s, c), "k", true);
    FAIL() << "a resident operand was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(e.message().find("keep y resident"), std::string::npos) << e.message();
  }
}

// exp(x - max x) never sees a positive argument: the generator calls the cheaper
// dt::exp_nonpositive there, and plain dt::exp wherever that is not known from the kernel.
TEST(GeneratedCode, ExpOfXMinusItsMaxUsesTheNonPositiveExp) {
  namespace hl = deuteron::hl;
  auto code = [](const KernelBase& k, const std::vector<Arg>& args) {
    auto s = driver::specialize(k, frontend::describe_args(k, args), "cpu");
    return s.backend->emit(driver::lower(s, s.space.default_config()));
  };
  const Tensor x = Tensor::rand({5, 37}, DType::f32, 1), y = Tensor::rand({5, 37}, DType::f32, 2);
  auto rows = [](auto body) {
    return deuteron::kernel("exp_args", [body](hl::Tensor a, hl::Tensor b) {
      auto out = hl::empty_like(a);
      for (auto tm : hl::tile(a.size(0))) out[{tm, hl::all}] = body(a[{tm, hl::all}], b[{tm, hl::all}]);
      return out;
    });
  };
  auto guarded = rows([](hl::Tensor a, hl::Tensor) {  // the online softmax's -inf guard
    auto m = a.amax(1, true);
    return hl::exp(a - hl::where(m == -INFINITY, 0.0f, m));
  });
  EXPECT_EQ(count(code(guarded, {x, y}), "dt::exp_nonpositive("), 1u);
  auto max_of_both = rows([](hl::Tensor a, hl::Tensor b) { return hl::exp2(a - hl::maximum(b, a.amax(1, true))); });
  EXPECT_EQ(count(code(max_of_both, {x, y}), "dt::exp2_nonpositive("), 1u);
  // Not known: the max of another tensor, the wrong order, a where without the guard.
  auto other = rows([](hl::Tensor a, hl::Tensor b) { return hl::exp(a - b.amax(1, true)); });
  auto reversed = rows([](hl::Tensor a, hl::Tensor) { return hl::exp(a.amax(1, true) - a); });
  auto unguarded = rows([](hl::Tensor a, hl::Tensor) {
    auto m = a.amax(1, true);
    return hl::exp(a - hl::where(m > 0.5f, 0.0f, m));
  });
  for (const std::string& src : {code(other, {x, y}), code(reversed, {x, y}), code(unguarded, {x, y})}) {
    EXPECT_EQ(count(src, "_nonpositive("), 0u) << src;
    EXPECT_EQ(count(src, "dt::exp("), 1u) << src;
  }
  // The catalogue: softmax's exponent, and both of flash attention's (scores and rescale). An
  // exponent inside a chunked row reduction runs a chunk at a time (dt::exp_nonpositive_chunk on
  // the chunk's arguments), and on lanes in the rest of the row.
  const std::string softmax = emit_cpu(examples::find("softmax"));
  EXPECT_EQ(count(softmax, "dt::exp_nonpositive("), 1u);
  EXPECT_EQ(count(softmax, "dt::exp_nonpositive_chunk("), 1u);
  const std::string attention = emit_cpu(examples::find("attention"));
  EXPECT_EQ(count(attention, "dt::exp2_nonpositive("), 2u);
  EXPECT_EQ(count(attention, "dt::exp2_nonpositive_chunk("), 1u);
}

// silu and gelu_tanh along a long row: whole chunks compute their exponentials in one call each
// (dt::exp_nonpositive_chunk on the arguments -|g(x)|) and the activation from them
// (dt::x_sigmoid_from); the rest of the row runs the lane function.
TEST(GeneratedCode, ActivationsRunTheirExponentialsAChunkAtATime) {
  for (auto [kernel, act] : {std::pair{"swiglu", "silu"}, std::pair{"geglu", "gelu_tanh"}}) {
    const std::string src = emit_cpu(examples::find(kernel));
    EXPECT_EQ(count(src, fmt::format("dt::{}_exp_arg(", act)), 1u) << src;
    EXPECT_EQ(count(src, "dt::exp_nonpositive_chunk("), 1u) << src;
    EXPECT_EQ(count(src, "dt::x_sigmoid_from("), 1u) << src;
    EXPECT_EQ(count(src, fmt::format("dt::{}(", act)), 1u) << src;
    EXPECT_LT(src.find("dt::exp_nonpositive_chunk("), src.find(fmt::format("dt::{}(", act))) << src;
  }
}

// A where between a constant and a value in fast memory, under a mask kept in fast memory,
// must vectorise: both arms are evaluated as dt::where's arguments (no conditional load), and
// the mask is stored as bytes (GCC has no vector type for `bool`). Causal attention's masked
// max ran scalar before (27.4 -> 22.9 ms at its bench shape). Its mask compares tile indices
// only: it is computed where the where needs it, never kept (a pass over the block saved).
TEST(GeneratedCode, MasksAreBytesAndWhereEvaluatesBothArms) {
  namespace hl = deuteron::hl;
  static const auto masked = deuteron::kernel("masked_row_softmax", [](hl::Tensor x) {
    auto out = hl::empty_like(x);
    for (auto tm : hl::tile(x.size(0))) {
      auto row = x[{tm, hl::all}];
      auto keep = row > 0.25f;  // data: kept between the passes before and after the max
      auto s = hl::where(keep, row, -INFINITY);
      auto e = hl::exp(s - s.amax(1, true));
      out[{tm, hl::all}] = hl::where(keep, e / e.sum(1, true), 0.0f);
    }
    return out;
  });
  Tensor x = Tensor::rand({64, 300}, DType::f32, 1);
  auto s = driver::specialize(masked, frontend::describe_args(masked, {x}), "cpu");
  const std::string src = s.backend->emit(driver::lower(s, s.space.default_config()));
  EXPECT_NE(src.find("dt::where<float>("), std::string::npos) << src;
  EXPECT_EQ(src.find("bool* const m"), std::string::npos) << src;
  EXPECT_NE(src.find("uint8_t* const m"), std::string::npos) << src;
  const std::string causal = emit_cpu(examples::find("attention_causal"));
  EXPECT_NE(causal.find("dt::where<float>("), std::string::npos);
  EXPECT_EQ(causal.find(" ? -dt::kInf"), std::string::npos);
  EXPECT_EQ(causal.find("uint8_t* const m"), std::string::npos) << causal;
  EXPECT_NE(causal.find("const bool v"), std::string::npos) << causal;  // the comparison, in the loop
}

}  // namespace
}  // namespace deuteron
