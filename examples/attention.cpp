// Flash attention: softmax(q kᵀ / sqrt(D)) v per (batch, head), with an online softmax over
// key/value blocks, so the S x S score matrix is never materialised. A causal variant skips
// the key blocks after the query block (a dynamic inner-loop bound) and masks the diagonal.
#include <cmath>

#include "catalogue.h"
#include "reference_util.h"

namespace hl = deuteron::hl;

namespace deuteron::examples {

namespace {

// The body both variants share. Scores are kept in the log2 domain (q is scaled by
// log2(e) / sqrt(D) once per query block) so the softmax uses exp2. D is counted on the device
// (hl::count), not taken from the traced shape: a general variant of an ahead-of-time build
// then scales by the head dim of the call, not of the shape it was generated at. The scaled q
// and p are cast to the inputs' dtype (as FlashAttention casts p to v's): with bf16 inputs both
// products then multiply bf16 operands, which the CPU target runs on vdpbf16ps or AMX tiles.
// Scaling the scores instead would round q once less, but costs f32 a pass over every block
// of scores (2% of attention's time on a Zen 4); the scaled q's rounding moves a score by
// about 2^-9 of its size, as the rounding of q's own bf16 input does.
template <bool Causal>
hl::Tensor flash_attention(hl::Tensor q, hl::Tensor k, hl::Tensor v) {
  int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3), skv = k.size(2);
  auto out = hl::empty_like(q);
  for (auto [tb, th, tq] : hl::tile({b, h, s}, {"batch", "head", "q"})) {
    auto qb = q[{tb, th, tq, hl::all}];
    qb = (qb * (hl::rsqrt(hl::count(qb, 3)) * 1.4426950408889634)).to(q.dtype());
    auto m_i = hl::full({tb, th, tq}, -INFINITY);
    auto l_i = hl::zeros({tb, th, tq});
    auto acc = hl::zeros({tb, th, tq, d});
    for (auto tkv : Causal ? hl::tile(0, tq.end(), {.name = "kv"}) : hl::tile(skv, {.name = "kv"})) {
      auto qk = hl::dot(qb, k[{tb, th, tkv, hl::all}].transpose(2, 3));  // [tb, th, tq, tkv]
      if constexpr (Causal)  // keys after the query: only in the diagonal block
        qk = hl::where(tkv.index().unsqueeze(0) > tq.index().unsqueeze(1), -INFINITY, qk);
      auto m_new = hl::maximum(m_i, qk.amax(3));
      // While a query has seen only -inf scores (masked keys), exponents are taken against 0:
      // exp2(-inf - -inf) would be NaN, exp2(-inf - 0) is the 0 wanted.
      auto shift = hl::where(m_new == -INFINITY, 0.0f, m_new);
      auto p = hl::exp2(qk - shift.unsqueeze(3));
      auto l_ij = p.sum(3);
      auto alpha = hl::exp2(m_i - shift);
      l_i = l_i * alpha + l_ij;
      acc = hl::dot(p.to(v.dtype()), v[{tb, th, tkv, hl::all}], acc * alpha.unsqueeze(3));
      m_i = m_new;
    }
    out[{tb, th, tq, hl::all}] = (acc / l_i.unsqueeze(3)).to(out.dtype());
  }
  return out;
}

}  // namespace

static const auto attention = deuteron::kernel("attention", [](hl::Tensor q, hl::Tensor k, hl::Tensor v) {
  return flash_attention<false>(q, k, v);
}, {.arg_names = {"q", "k", "v"}});

static const auto attention_causal = deuteron::kernel(
    "attention_causal", [](hl::Tensor q, hl::Tensor k, hl::Tensor v) { return flash_attention<true>(q, k, v); },
    {.arg_names = {"q", "k", "v"}});

// softmax(q kᵀ / sqrt(D)) v in double precision, row by row.
static std::vector<Tensor> attention_reference(const std::vector<Arg>& args, bool causal) {
  const Tensor& q = tensor_arg(args, 0);
  auto qd = to_doubles(q), kd = to_doubles(tensor_arg(args, 1)), vd = to_doubles(tensor_arg(args, 2));
  int64_t bh = q.size(0) * q.size(1), s = q.size(2), d = q.size(3), skv = tensor_arg(args, 1).size(2);
  std::vector<double> out(qd.size()), p(static_cast<size_t>(skv));
  double scale = 1.0 / std::sqrt(double(d));
  for (int64_t g = 0; g < bh; ++g)
    for (int64_t i = 0; i < s; ++i) {
      const double* qi = qd.data() + (g * s + i) * d;
      int64_t n = causal ? std::min(i + 1, skv) : skv;
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double* kj = kd.data() + (g * skv + j) * d;
        double dotp = 0;
        for (int64_t c = 0; c < d; ++c) dotp += qi[c] * kj[c];
        p[size_t(j)] = dotp * scale;
        mx = std::max(mx, p[size_t(j)]);
      }
      for (int64_t j = 0; j < n; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
      double* oi = out.data() + (g * s + i) * d;
      for (int64_t c = 0; c < d; ++c) oi[c] = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double* vj = vd.data() + (g * skv + j) * d;
        for (int64_t c = 0; c < d; ++c) oi[c] += p[size_t(j)] / sum * vj[c];
      }
    }
  return {from_doubles(out, q.sizes(), q.dtype())};
}

static std::vector<Arg> attention_inputs(const std::vector<int64_t>& s, DType dt, uint64_t seed) {
  return {Tensor::rand(s, dt, seed), Tensor::rand(s, dt, seed + 1), Tensor::rand(s, dt, seed + 2)};
}
static double attention_bytes(const std::vector<int64_t>& s, DType dt) {
  return 4.0 * double(s[0] * s[1] * s[2] * s[3]) * dtype_size(dt);
}

static Registrar r_attention{Entry{
    .name = "attention",
    .summary = "q, k, v[B, H, S, D] -> softmax(q kᵀ / sqrt(D)) v, flash style (online softmax over key blocks)",
    .kernel = &attention,
    .bench_shape = {1, 8, 2048, 128},
    .small_shape = {2, 3, 130, 40},
    .shape_names = {"B", "H", "S", "D"},
    .inputs = attention_inputs,
    .reference = [](const std::vector<Arg>& args) { return attention_reference(args, false); },
    .bytes = attention_bytes,
    // two products of 2·S·S·D flops per (batch, head)
    .flops = [](const std::vector<int64_t>& s) { return 4.0 * double(s[0] * s[1]) * double(s[2] * s[2] * s[3]); },
    .compute_bound = true,
}};

static Registrar r_attention_causal{Entry{
    .name = "attention_causal",
    .summary = "q, k, v[B, H, S, D] -> causal attention, key blocks after the query block skipped",
    .kernel = &attention_causal,
    .bench_shape = {1, 8, 2048, 128},
    .small_shape = {2, 3, 130, 40},
    .shape_names = {"B", "H", "S", "D"},
    .inputs = attention_inputs,
    .reference = [](const std::vector<Arg>& args) { return attention_reference(args, true); },
    .bytes = attention_bytes,
    // the products over the unmasked half
    .flops = [](const std::vector<int64_t>& s) { return 2.0 * double(s[0] * s[1]) * double(s[2] * s[2] * s[3]); },
    .compute_bound = true,
}};

}  // namespace deuteron::examples
