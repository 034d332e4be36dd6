// weft/nn/decode.hpp — incremental decoding of nn::gpt with a key/value cache: rows of a batch
// advance one token per step in lockstep (every row at the same position: prompts of one length,
// finished rows keep stepping and the caller ignores their tokens), each step costs one new
// position per row instead of the whole prefix, and prompts prefilled once, one row each, can be
// forked into their samples' rows (fork). The logits equal nn::gpt::forward's at the same positions
// to rounding (the same layer functions; attention over the cache is a plain softmax in
// compute_t<T>).
#pragma once

#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/tensor.hpp>
#include <weft/nn/activation.hpp>
#include <weft/nn/detail/decode_attention.hpp>
#include <weft/nn/embedding.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/nn/linear.hpp>
#include <weft/nn/norm.hpp>
#include <weft/nn/params.hpp>
#include <weft/nn/residual.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::nn {

//! A decoder over a param_store laid out by gpt_layout(config), read at every step (so an
//! optimizer step between generations is seen; the store must outlive the decoder). Holds the
//! keys and values of up to `max_rows` rows × `max_len` positions (<= context) per layer.
template <class T>
class gpt_decoder {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::nn::gpt_decoder<T>: T must be float or double");
  using C = compute_t<T>;

 public:
  gpt_decoder(gpt_config const& config, param_store<T> const& store, index_t max_rows,
              index_t max_len)
      : c_(config), store_(&store), max_rows_(max_rows), max_len_(max_len) {
    validate(c_);
    auto const want = gpt_layout(c_);
    WEFT_EXPECTS_SHAPE(store.layout().size() == want.size(), "store",
                       ::weft::detail::concat(want.size(), " parameters (gpt_layout(config))"),
                       store.layout().size());
    WEFT_EXPECTS(max_rows >= 1, "max_rows", ">= 1", max_rows);
    WEFT_EXPECTS(max_len >= 1 && max_len <= c_.context, "max_len",
                 ::weft::detail::concat("in [1, context = ", c_.context, "]"), max_len);
    index_t const kvd = c_.kv() * c_.head_dim();
    cache_k_.resize(static_cast<std::size_t>(c_.layers * max_rows * max_len * kvd));
    cache_v_.resize(cache_k_.size());
  }

  [[nodiscard]] gpt_config const& config() const noexcept { return c_; }
  [[nodiscard]] index_t rows() const noexcept { return rows_; }
  //! Positions cached so far: the next step's position.
  [[nodiscard]] index_t length() const noexcept { return len_; }

  //! Empties the cache for a batch of `rows` rows.
  void reset(index_t rows) {
    WEFT_EXPECTS(rows >= 1 && rows <= max_rows_, "rows",
                 ::weft::detail::concat("in [1, max_rows = ", max_rows_, "]"), rows);
    len_ = 0;
    resize(rows);
  }

  //! A new batch of sources.size() rows whose row r continues current row sources[r] (its cached
  //! keys and values; length() unchanged): prompts prefilled once, one row each, then shared by
  //! their samples. The caller replicates the last step's logits the same way.
  void fork(std::span<index_t const> sources) {
    auto const rows = static_cast<index_t>(sources.size());
    WEFT_EXPECTS(rows >= 1 && rows <= max_rows_, "sources.size()",
                 ::weft::detail::concat("in [1, max_rows = ", max_rows_, "]"), rows);
    for (std::size_t r = 0; r < sources.size(); ++r)
      WEFT_EXPECTS(sources[r] >= 0 && sources[r] < rows_,
                   ::weft::detail::concat("sources[", r, "]"),
                   ::weft::detail::concat("a current row in [0, ", rows_, ")"), sources[r]);
    index_t const kvd = c_.kv() * c_.head_dim();
    auto const span = static_cast<std::ptrdiff_t>(len_ * kvd);
    for (auto* cache : {&cache_k_, &cache_v_}) {
      // The current rows first, so that a row may be both a source and a destination.
      std::vector<T> old(static_cast<std::size_t>(c_.layers * rows_ * len_ * kvd));
      for (index_t l = 0; l < c_.layers; ++l)
        for (index_t r = 0; r < rows_; ++r)
          std::copy_n(cache->begin() + static_cast<std::ptrdiff_t>(slot(l, r, 0)), span,
                      old.begin() + (l * rows_ + r) * span);
      for (index_t l = 0; l < c_.layers; ++l)
        for (index_t r = 0; r < rows; ++r)
          std::copy_n(old.begin() + (l * rows_ + sources[static_cast<std::size_t>(r)]) * span, span,
                      cache->begin() + static_cast<std::ptrdiff_t>(slot(l, r, 0)));
    }
    resize(rows);
  }

  //! Feeds tokens[r] to row r at position length(), caches its keys and values, and writes the
  //! next-token logits of every row to `logits` [rows, vocab].
  void step(std::span<std::int32_t const> tokens, tensor_view<T, 2> logits) {
    WEFT_EXPECTS(rows_ > 0, "decoder", "reset(rows) before step", "no rows");
    WEFT_EXPECTS_SHAPE(static_cast<index_t>(tokens.size()) == rows_, "tokens",
                       ::weft::detail::concat(rows_, " (one per row)"), tokens.size());
    WEFT_EXPECTS_SHAPE(logits.extent(0) == rows_ && logits.extent(1) == c_.vocab, "logits",
                       ::weft::detail::concat("[", rows_, ", ", c_.vocab, "]"),
                       ::weft::detail::concat("[", logits.extent(0), ", ", logits.extent(1), "]"));
    WEFT_EXPECTS(len_ < max_len_, "position", ::weft::detail::concat("< max_len = ", max_len_),
                 len_);
    for (std::size_t r = 0; r < tokens.size(); ++r)
      WEFT_EXPECTS(tokens[r] >= 0 && tokens[r] < c_.vocab,
                   ::weft::detail::concat("tokens[", r, "]"),
                   ::weft::detail::concat("in [0, ", c_.vocab, ")"), tokens[r]);
    index_t const d = c_.d_model;
    std::fill(pos_.begin(), pos_.end(), static_cast<std::int32_t>(len_));
    embedding_forward(tokens, p2("wte"), rows_of(x_, d));
    embedding_forward(std::span<std::int32_t const>(pos_), p2("wpe"), rows_of(mid_, d));
    residual_forward(rows_of(x_, d), rows_of(mid_, d), rows_of(x_, d));
    for (index_t l = 0; l < c_.layers; ++l) block(l);
    layer_norm_forward(rows_of(x_, d), p1("lnf.w"), p1("lnf.b"), rows_of(ln_, d), vec(mean_),
                       vec(rstd_), c_.ln_eps);
    linear_forward(rows_of(ln_, d), p2("head"), no_bias<T>(), logits);
    ++len_;
  }

 private:
  void resize(index_t rows) {
    rows_ = rows;
    index_t const d = c_.d_model, kvd = c_.kv() * c_.head_dim(), h = c_.hidden();
    auto n = [&](index_t w) { return static_cast<std::size_t>(rows * w); };
    for (auto* b : {&x_, &ln_, &q_, &o_, &att_, &mid_}) b->resize(n(d));
    k_.resize(n(kvd));
    v_.resize(n(kvd));
    fc_.resize(n(h));
    act_.resize(n(h));
    mean_.resize(n(1));
    rstd_.resize(n(1));
    pos_.resize(n(1));
  }

  [[nodiscard]] std::size_t slot(index_t layer, index_t row, index_t pos) const noexcept {
    index_t const kvd = c_.kv() * c_.head_dim();
    return static_cast<std::size_t>(((layer * max_rows_ + row) * max_len_ + pos) * kvd);
  }

  void block(index_t l) {
    index_t const d = c_.d_model, kvd = c_.kv() * c_.head_dim(), h = c_.hidden();
    std::string const p = "h" + std::to_string(l) + ".";
    layer_norm_forward(rows_of(x_, d), p1(p + "ln1.w"), p1(p + "ln1.b"), rows_of(ln_, d),
                       vec(mean_), vec(rstd_), c_.ln_eps);
    linear_forward(rows_of(ln_, d), p2(p + "q.w"), p1(p + "q.b"), rows_of(q_, d));
    linear_forward(rows_of(ln_, d), p2(p + "k.w"), p1(p + "k.b"), rows_of(k_, kvd));
    linear_forward(rows_of(ln_, d), p2(p + "v.w"), p1(p + "v.b"), rows_of(v_, kvd));
    for (index_t r = 0; r < rows_; ++r) {
      auto const at = static_cast<std::ptrdiff_t>(slot(l, r, len_));
      auto const from = static_cast<std::ptrdiff_t>(r * kvd);
      std::copy(k_.begin() + from, k_.begin() + from + kvd, cache_k_.begin() + at);
      std::copy(v_.begin() + from, v_.begin() + from + kvd, cache_v_.begin() + at);
    }
    attend(l);
    linear_forward(rows_of(att_, d), p2(p + "o.w"), p1(p + "o.b"), rows_of(o_, d));
    residual_forward(rows_of(x_, d), rows_of(o_, d), rows_of(mid_, d));
    layer_norm_forward(rows_of(mid_, d), p1(p + "ln2.w"), p1(p + "ln2.b"), rows_of(ln_, d),
                       vec(mean_), vec(rstd_), c_.ln_eps);
    linear_forward(rows_of(ln_, d), p2(p + "fc.w"), p1(p + "fc.b"), rows_of(fc_, h));
    gelu_forward(rows_of(fc_, h), rows_of(act_, h));
    linear_forward(rows_of(act_, h), p2(p + "proj.w"), p1(p + "proj.b"), rows_of(o_, d));
    residual_forward(rows_of(mid_, d), rows_of(o_, d), rows_of(x_, d));
  }

  // Softmax attention of each row's new query over its cached positions [0, len_]
  // (detail::decode_attention_head, the code nn::cuda_gpt_decoder's kernel runs).
  void attend(index_t l) {
    index_t const hd = c_.head_dim(), heads = c_.heads, group = c_.heads / c_.kv();
    index_t const kvd = c_.kv() * hd;
    C const scale = C(1) / std::sqrt(static_cast<C>(hd));
    scores_.resize(static_cast<std::size_t>(len_ + 1));
    acc_.resize(static_cast<std::size_t>(hd));
    for (index_t r = 0; r < rows_; ++r)
      for (index_t hh = 0; hh < heads; ++hh) {
        index_t const g = hh / group;
        detail::decode_attention_head(
            q_.data() + r * c_.d_model + hh * hd, cache_k_.data() + slot(l, r, 0) + g * hd,
            cache_v_.data() + slot(l, r, 0) + g * hd, len_ + 1, kvd, hd, scale, scores_.data(),
            acc_.data(), att_.data() + r * c_.d_model + hh * hd);
      }
  }

  template <class U>
  static tensor_view<U, 2> rows_of(std::vector<U>& v, index_t width) {
    return tensor_view<U, 2>(v.data(), static_cast<index_t>(v.size()) / width, width);
  }
  template <class U>
  static tensor_view<U, 1> vec(std::vector<U>& v) {
    return tensor_view<U, 1>(v.data(), static_cast<index_t>(v.size()));
  }
  tensor_view<T const, 2> p2(std::string const& n) const { return store_->template param<2>(n); }
  tensor_view<T const, 1> p1(std::string const& n) const { return store_->template param<1>(n); }

  gpt_config c_;
  param_store<T> const* store_;
  index_t max_rows_, max_len_;
  index_t rows_ = 0, len_ = 0;
  std::vector<T> cache_k_, cache_v_;
  std::vector<T> x_, ln_, q_, k_, v_, att_, o_, mid_, fc_, act_;
  std::vector<C> mean_, rstd_, scores_, acc_;
  std::vector<std::int32_t> pos_;
};

}  // namespace weft::nn
