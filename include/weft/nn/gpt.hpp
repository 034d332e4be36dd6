// weft/nn/gpt.hpp — a GPT-2 style decoder composed from weft's layers on one device: token and
// learned position embeddings, pre-LayerNorm blocks (causal GQA attention over packed documents,
// a tanh-GELU MLP), a final LayerNorm and an untied output head, with the mean token
// cross-entropy and a hand-written backward. Parameters and gradients live in one param_store.
#pragma once

#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/tensor.hpp>
#include <weft/nn/activation.hpp>
#include <weft/nn/attention.hpp>
#include <weft/nn/cross_entropy.hpp>
#include <weft/nn/embedding.hpp>
#include <weft/nn/linear.hpp>
#include <weft/nn/norm.hpp>
#include <weft/nn/params.hpp>
#include <weft/nn/residual.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::nn {

//! The shape of a GPT: `vocab` tokens, positions [0, context), `layers` blocks of width d_model
//! with `heads` query heads and `kv_heads` key/value heads (0: as many as heads) of
//! d_model / heads each, an MLP d_model → mlp_hidden → d_model (0: 4·d_model), LayerNorm eps.
struct gpt_config {
  index_t vocab = 0;
  index_t context = 0;
  index_t d_model = 0;
  index_t heads = 1;
  index_t kv_heads = 0;
  index_t layers = 1;
  index_t mlp_hidden = 0;
  double ln_eps = 1e-5;

  [[nodiscard]] index_t kv() const noexcept { return kv_heads > 0 ? kv_heads : heads; }
  [[nodiscard]] index_t head_dim() const noexcept { return heads > 0 ? d_model / heads : 0; }
  [[nodiscard]] index_t hidden() const noexcept {
    return mlp_hidden > 0 ? mlp_hidden : 4 * d_model;
  }
};

//! Throws invalid_argument_error naming the first field out of range.
inline void validate(gpt_config const& c) {
  WEFT_EXPECTS(c.vocab > 0, "gpt_config::vocab", "> 0", c.vocab);
  WEFT_EXPECTS(c.context > 0, "gpt_config::context", "> 0", c.context);
  WEFT_EXPECTS(c.heads > 0, "gpt_config::heads", "> 0", c.heads);
  WEFT_EXPECTS(c.d_model > 0 && c.d_model % c.heads == 0, "gpt_config::d_model",
               ::weft::detail::concat("a positive multiple of heads = ", c.heads), c.d_model);
  WEFT_EXPECTS(c.kv_heads >= 0 && c.heads % c.kv() == 0, "gpt_config::kv_heads",
               ::weft::detail::concat("0 or a divisor of heads = ", c.heads), c.kv_heads);
  WEFT_EXPECTS(c.layers > 0, "gpt_config::layers", "> 0", c.layers);
  WEFT_EXPECTS(c.mlp_hidden >= 0, "gpt_config::mlp_hidden", ">= 0", c.mlp_hidden);
  WEFT_EXPECTS(c.ln_eps > 0.0, "gpt_config::ln_eps", "> 0", c.ln_eps);
}

//! The parameters of a GPT in definition order: "wte" [V, d], "wpe" [context, d], per layer l
//! "h<l>.ln1.w", "h<l>.ln1.b", "h<l>.q.w" [d, d], "h<l>.q.b", "h<l>.k.w" [kv·hd, d], "h<l>.k.b",
//! "h<l>.v.w", "h<l>.v.b", "h<l>.o.w" [d, d], "h<l>.o.b", "h<l>.ln2.w", "h<l>.ln2.b", "h<l>.fc.w"
//! [hidden, d], "h<l>.fc.b", "h<l>.proj.w" [d, hidden], "h<l>.proj.b"; then "lnf.w", "lnf.b",
//! "head" [V, d] (no bias). Biases and norm parameters do not decay (nanoGPT's rule).
inline param_layout gpt_layout(gpt_config const& c) {
  validate(c);
  param_layout lay;
  index_t const d = c.d_model, kvd = c.kv() * c.head_dim(), h = c.hidden();
  auto matrix = [&](std::string const& name, index_t rows, index_t cols) {
    lay.add(name, {rows, cols});
  };
  auto vector = [&](std::string const& name, index_t n) {
    optim::param_info info;
    info.decay = false;
    lay.add(name, {n}, info);
  };
  matrix("wte", c.vocab, d);
  matrix("wpe", c.context, d);
  for (index_t l = 0; l < c.layers; ++l) {
    std::string const p = "h" + std::to_string(l) + ".";
    vector(p + "ln1.w", d);
    vector(p + "ln1.b", d);
    matrix(p + "q.w", d, d);
    vector(p + "q.b", d);
    matrix(p + "k.w", kvd, d);
    vector(p + "k.b", kvd);
    matrix(p + "v.w", kvd, d);
    vector(p + "v.b", kvd);
    matrix(p + "o.w", d, d);
    vector(p + "o.b", d);
    vector(p + "ln2.w", d);
    vector(p + "ln2.b", d);
    matrix(p + "fc.w", h, d);
    vector(p + "fc.b", h);
    matrix(p + "proj.w", d, h);
    vector(p + "proj.b", d);
  }
  vector("lnf.w", d);
  vector("lnf.b", d);
  matrix("head", c.vocab, d);
  return lay;
}

//! GPT-2's initialisation: matrices normal(0, 0.02), the two output projections of each block
//! ("o.w", "proj.w") normal(0, 0.02/sqrt(2·layers)), biases 0, LayerNorm gains 1. Each parameter
//! draws from rng(seed, its init_stream), so a shard initialised with nn::init_normal and the
//! same seed holds the same numbers.
template <class T>
void gpt_init(param_store<T>& store, gpt_config const& c, std::uint64_t seed) {
  double const std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  for (auto const& e : store.layout().entries()) {
    std::string_view const n = e.name;
    auto ends_with = [&](std::string_view s) {
      return n.size() >= s.size() && n.substr(n.size() - s.size()) == s;
    };
    if (ends_with("ln1.w") || ends_with("ln2.w") || n == "lnf.w")
      store.init_constant(n, 1.0);
    else if (e.shape.size() == 1)
      store.init_constant(n, 0.0);
    else
      store.init_normal(n, seed, 0.0, ends_with("o.w") || ends_with("proj.w") ? proj_std : std);
  }
}

//! A batch of packed documents: token ids, their positions (< context) and next-token targets
//! (-1: no loss at that row), all of length T, and cu_seqlens ({0, ..., T}: document n is rows
//! [cu_seqlens[n], cu_seqlens[n+1]); attention stays inside a document).
struct gpt_batch {
  std::span<std::int32_t const> tokens;
  std::span<std::int32_t const> positions;
  std::span<std::int32_t const> targets;
  std::span<std::int64_t const> cu_seqlens;
};

namespace detail {
//! The batch checks every GPT front end makes (nn::gpt, nn::cuda_gpt): positions and targets as
//! many as the t tokens, each target -1 (ignored) or a token of the vocabulary.
inline void check_gpt_batch(gpt_config const& c, gpt_batch const& b, index_t t) {
  WEFT_EXPECTS_SHAPE(static_cast<index_t>(b.positions.size()) == t, "positions",
                     ::weft::detail::concat(t, " (as tokens)"), b.positions.size());
  WEFT_EXPECTS_SHAPE(static_cast<index_t>(b.targets.size()) == t, "targets",
                     ::weft::detail::concat(t, " (as tokens)"), b.targets.size());
  for (std::size_t i = 0; i < b.targets.size(); ++i)
    WEFT_EXPECTS(b.targets[i] >= -1 && b.targets[i] < c.vocab,
                 ::weft::detail::concat("targets[", i, "]"),
                 ::weft::detail::concat("-1 (ignored) or in [0, ", c.vocab, ")"), b.targets[i]);
}
}  // namespace detail

//! The model over a param_store laid out by gpt_layout (the store must outlive it). forward()
//! keeps what backward() needs; backward() ACCUMULATES into the store's gradients (zero them with
//! zero_grad between steps). T is float or double; activations are T, norm statistics and the
//! attention lse compute_t<T>.
template <class T>
class gpt {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::nn::gpt<T>: T must be float or double");
  using C = compute_t<T>;

 public:
  gpt(gpt_config const& config, param_store<T>& store) : c_(config), store_(&store) {
    validate(c_);
    detail::expect_layout(store.layout(), gpt_layout(c_), "gpt_layout(config)");
  }

  [[nodiscard]] gpt_config const& config() const noexcept { return c_; }

  //! The loss weighted per target token by `token_weight` (default: 1 / the number of targets,
  //! i.e. the mean token cross-entropy); returns Σ weight·CE over the batch's target rows. The
  //! same weight seeds backward(), so a data-parallel or pipelined step passes 1/global_tokens.
  double forward(gpt_batch const& b, double token_weight = 0.0) {
    index_t const t = static_cast<index_t>(b.tokens.size());
    check_batch(b, t);
    index_t counted = 0;
    for (auto v : b.targets) counted += v >= 0 ? 1 : 0;
    weight_ = token_weight > 0.0 ? token_weight
                                 : (counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0);
    batch_ = b;
    t_ = t;
    allocate(t);
    index_t const d = c_.d_model;
    // Embeddings: x0 = wte[tokens] + wpe[positions].
    embedding_forward(b.tokens, p2("wte"), rows(x_[0], d));
    embedding_forward(b.positions, p2("wpe"), rows(tmp_d_, d));
    residual_forward(rows(x_[0], d), rows(tmp_d_, d), rows(x_[0], d));
    for (index_t l = 0; l < c_.layers; ++l) block_forward(l);
    auto& last = x_[static_cast<std::size_t>(c_.layers)];
    layer_norm_forward(rows(last, d), p1("lnf.w"), p1("lnf.b"), rows(lnf_, d), vec(lnf_mean_),
                       vec(lnf_rstd_), c_.ln_eps);
    linear_forward(rows(lnf_, d), p2("head"), no_bias<T>(), rows(logits_, c_.vocab));
    return cross_entropy_forward(rows(logits_, c_.vocab), b.targets, weight_, vec(ce_lse_));
  }

  //! Logits [T, V] of the last forward.
  [[nodiscard]] tensor_view<T const, 2> logits() const noexcept {
    return tensor_view<T const, 2>(logits_.data(), t_, c_.vocab);
  }

  //! Accumulates the gradient of the last forward's weighted loss into the store's gradients.
  void backward() {
    index_t const d = c_.d_model, v = c_.vocab;
    auto& dlogits = g_.dlogits;
    cross_entropy_backward(rows(logits_, v), batch_.targets, weight_, vec(ce_lse_),
                           rows(dlogits, v));
    auto& dln = g_.dln;
    auto& dx = g_.dx;
    linear_backward_input(rows(dlogits, v), p2("head"), rows(dln, d));
    linear_backward_weight(rows(dlogits, v), rows(lnf_, d), g2("head"), no_bias_grad<T>());
    auto& last = x_[static_cast<std::size_t>(c_.layers)];
    layer_norm_backward_input(rows(dln, d), rows(last, d), p1("lnf.w"), vec(lnf_mean_),
                              vec(lnf_rstd_), rows(dx, d));
    layer_norm_backward_weight(rows(dln, d), rows(last, d), vec(lnf_mean_), vec(lnf_rstd_),
                               g1("lnf.w"), g1("lnf.b"));
    for (index_t l = c_.layers - 1; l >= 0; --l) block_backward(l, dx);
    embedding_backward(batch_.tokens, rows(dx, d), g2("wte"));
    embedding_backward(batch_.positions, rows(dx, d), g2("wpe"));
  }

 private:
  struct layer_acts {
    std::vector<T> ln1, q, k, v, o, x_mid, ln2, fc, act;
    std::vector<C> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, lse;
  };

  void check_batch(gpt_batch const& b, index_t t) const { detail::check_gpt_batch(c_, b, t); }

  void allocate(index_t t) {
    auto const n = [&](index_t w) { return static_cast<std::size_t>(t * w); };
    index_t const d = c_.d_model, kvd = c_.kv() * c_.head_dim(), h = c_.hidden();
    x_.resize(static_cast<std::size_t>(c_.layers + 1));
    for (auto& x : x_) x.resize(n(d));
    tmp_d_.resize(n(d));
    acts_.resize(static_cast<std::size_t>(c_.layers));
    for (auto& a : acts_) {
      a.ln1.resize(n(d));
      a.q.resize(n(d));
      a.k.resize(n(kvd));
      a.v.resize(n(kvd));
      a.o.resize(n(d));
      a.x_mid.resize(n(d));
      a.ln2.resize(n(d));
      a.fc.resize(n(h));
      a.act.resize(n(h));
      a.ln1_mean.resize(n(1));
      a.ln1_rstd.resize(n(1));
      a.ln2_mean.resize(n(1));
      a.ln2_rstd.resize(n(1));
      a.lse.resize(n(c_.heads));
    }
    lnf_.resize(n(d));
    lnf_mean_.resize(n(1));
    lnf_rstd_.resize(n(1));
    logits_.resize(n(c_.vocab));
    ce_lse_.resize(n(1));
    g_.dlogits.resize(n(c_.vocab));
    for (auto* b : {&g_.dln, &g_.dx, &g_.dmid, &g_.tmp, &g_.dout, &g_.dq}) b->resize(n(d));
    g_.dact.resize(n(h));
    g_.dfc.resize(n(h));
    g_.dk.resize(n(kvd));
    g_.dv.resize(n(kvd));
  }

  void block_forward(index_t l) {
    auto& a = acts_[static_cast<std::size_t>(l)];
    auto& x = x_[static_cast<std::size_t>(l)];
    auto& y = x_[static_cast<std::size_t>(l + 1)];
    index_t const d = c_.d_model, kvd = c_.kv() * c_.head_dim(), h = c_.hidden();
    std::string const p = "h" + std::to_string(l) + ".";
    layer_norm_forward(rows(x, d), p1(p + "ln1.w"), p1(p + "ln1.b"), rows(a.ln1, d),
                       vec(a.ln1_mean), vec(a.ln1_rstd), c_.ln_eps);
    linear_forward(rows(a.ln1, d), p2(p + "q.w"), p1(p + "q.b"), rows(a.q, d));
    linear_forward(rows(a.ln1, d), p2(p + "k.w"), p1(p + "k.b"), rows(a.k, kvd));
    linear_forward(rows(a.ln1, d), p2(p + "v.w"), p1(p + "v.b"), rows(a.v, kvd));
    causal_attention_forward(rows(a.q, d), rows(a.k, kvd), rows(a.v, kvd), rows(a.o, d),
                             tensor_view<C, 2>(a.lse.data(), c_.heads, t_), batch_.cu_seqlens,
                             heads());
    linear_forward(rows(a.o, d), p2(p + "o.w"), p1(p + "o.b"), rows(tmp_d_, d));
    residual_forward(rows(x, d), rows(tmp_d_, d), rows(a.x_mid, d));
    layer_norm_forward(rows(a.x_mid, d), p1(p + "ln2.w"), p1(p + "ln2.b"), rows(a.ln2, d),
                       vec(a.ln2_mean), vec(a.ln2_rstd), c_.ln_eps);
    linear_forward(rows(a.ln2, d), p2(p + "fc.w"), p1(p + "fc.b"), rows(a.fc, h));
    gelu_forward(rows(a.fc, h), rows(a.act, h));
    linear_forward(rows(a.act, h), p2(p + "proj.w"), p1(p + "proj.b"), rows(tmp_d_, d));
    residual_forward(rows(a.x_mid, d), rows(tmp_d_, d), rows(y, d));
  }

  //! dx holds d(block output) on entry and d(block input) on return.
  void block_backward(index_t l, std::vector<T>& dx) {
    auto& a = acts_[static_cast<std::size_t>(l)];
    auto& x = x_[static_cast<std::size_t>(l)];
    index_t const d = c_.d_model, kvd = c_.kv() * c_.head_dim(), h = c_.hidden();
    std::string const p = "h" + std::to_string(l) + ".";
    // Scratch kept across steps (every buffer is overwritten before it is read): a step allocates
    // nothing, so it neither page-faults nor zeroes fresh memory.
    auto& dact = g_.dact;
    auto& dfc = g_.dfc;
    auto& dln = g_.dln;
    auto& dmid = g_.dmid;
    auto& tmp = g_.tmp;
    // MLP: y = x_mid + proj(gelu(fc(ln2(x_mid)))).
    linear_backward_input(rows(dx, d), p2(p + "proj.w"), rows(dact, h));
    linear_backward_weight(rows(dx, d), rows(a.act, h), g2(p + "proj.w"), g1(p + "proj.b"));
    gelu_backward(rows(a.fc, h), rows(dact, h), rows(dfc, h));
    linear_backward_input(rows(dfc, h), p2(p + "fc.w"), rows(dln, d));
    linear_backward_weight(rows(dfc, h), rows(a.ln2, d), g2(p + "fc.w"), g1(p + "fc.b"));
    layer_norm_backward_input(rows(dln, d), rows(a.x_mid, d), p1(p + "ln2.w"), vec(a.ln2_mean),
                              vec(a.ln2_rstd), rows(tmp, d));
    layer_norm_backward_weight(rows(dln, d), rows(a.x_mid, d), vec(a.ln2_mean), vec(a.ln2_rstd),
                               g1(p + "ln2.w"), g1(p + "ln2.b"));
    residual_backward(rows(dx, d), rows(tmp, d), rows(dmid, d));
    // Attention: x_mid = x + o.w(attn(q(ln1 x), k(ln1 x), v(ln1 x))).
    auto& dout = g_.dout;
    auto& dq = g_.dq;
    auto& dk = g_.dk;
    auto& dv = g_.dv;
    linear_backward_input(rows(dmid, d), p2(p + "o.w"), rows(dout, d));
    linear_backward_weight(rows(dmid, d), rows(a.o, d), g2(p + "o.w"), g1(p + "o.b"));
    causal_attention_backward(rows(a.q, d), rows(a.k, kvd), rows(a.v, kvd), rows(a.o, d),
                              tensor_view<C, 2>(a.lse.data(), c_.heads, t_), rows(dout, d),
                              rows(dq, d), rows(dk, kvd), rows(dv, kvd), batch_.cu_seqlens,
                              heads());
    linear_backward_input(rows(dq, d), p2(p + "q.w"), rows(dln, d));
    linear_backward_input(rows(dk, kvd), p2(p + "k.w"), rows(tmp, d));
    residual_forward(rows(dln, d), rows(tmp, d), rows(dln, d));
    linear_backward_input(rows(dv, kvd), p2(p + "v.w"), rows(tmp, d));
    residual_forward(rows(dln, d), rows(tmp, d), rows(dln, d));
    linear_backward_weight(rows(dq, d), rows(a.ln1, d), g2(p + "q.w"), g1(p + "q.b"));
    linear_backward_weight(rows(dk, kvd), rows(a.ln1, d), g2(p + "k.w"), g1(p + "k.b"));
    linear_backward_weight(rows(dv, kvd), rows(a.ln1, d), g2(p + "v.w"), g1(p + "v.b"));
    layer_norm_backward_input(rows(dln, d), rows(x, d), p1(p + "ln1.w"), vec(a.ln1_mean),
                              vec(a.ln1_rstd), rows(tmp, d));
    layer_norm_backward_weight(rows(dln, d), rows(x, d), vec(a.ln1_mean), vec(a.ln1_rstd),
                               g1(p + "ln1.w"), g1(p + "ln1.b"));
    residual_backward(rows(dmid, d), rows(tmp, d), rows(dx, d));
  }

  [[nodiscard]] attention_heads heads() const noexcept {
    return {c_.heads, c_.kv(), c_.head_dim(), 0.0};
  }
  template <class U>
  tensor_view<U, 2> rows(std::vector<U>& v, index_t width) const {
    return tensor_view<U, 2>(v.data(), static_cast<index_t>(v.size()) / width, width);
  }
  template <class U>
  static tensor_view<U, 1> vec(std::vector<U>& v) {
    return tensor_view<U, 1>(v.data(), static_cast<index_t>(v.size()));
  }
  tensor_view<T const, 2> p2(std::string const& n) const {
    return std::as_const(*store_).template param<2>(n);
  }
  tensor_view<T const, 1> p1(std::string const& n) const {
    return std::as_const(*store_).template param<1>(n);
  }
  tensor_view<T, 2> g2(std::string const& n) { return store_->template grad<2>(n); }
  tensor_view<T, 1> g1(std::string const& n) { return store_->template grad<1>(n); }

  gpt_config c_;
  param_store<T>* store_;
  gpt_batch batch_{};
  index_t t_ = 0;
  double weight_ = 0.0;
  std::vector<std::vector<T>> x_;
  std::vector<T> tmp_d_, lnf_, logits_;
  std::vector<C> lnf_mean_, lnf_rstd_, ce_lse_;
  std::vector<layer_acts> acts_;
  struct {
    std::vector<T> dlogits, dln, dx, dact, dfc, dmid, tmp, dout, dq, dk, dv;
  } g_;
};

}  // namespace weft::nn
