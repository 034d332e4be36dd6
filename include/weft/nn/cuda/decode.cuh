// weft/nn/cuda/decode.cuh — the GPU twin of nn::gpt_decoder<T> (weft/nn/decode.hpp): incremental
// decoding with a key/value cache in device memory, over device parameters laid out by
// gpt_layout (nn::cuda_gpt's, read at every step, so an optimizer step between generations is
// seen). The same contract as the CPU decoder: rows advance one token per step in lockstep,
// prompts prefilled once, one row each, are forked into their samples' rows, and each step writes
// the next-token logits of every row. Built from the nn/cuda layer kernels (cuBLAS linears,
// LayerNorm, GELU, embeddings); the attention of a row's new query over its cache is
// detail::decode_attention_head, the function the CPU decoder runs, one thread per (row, head).
//
// That attention kernel is the reference decoder's, sized for the trainer's short rows (a thread
// walks a row's cached positions twice, the keys then the values): it is not a paged or split-K
// flash-decoding kernel, and long contexts want one.
#pragma once

#if !defined(__CUDACC__)
#error "weft/nn/cuda/decode.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/cuda/for_each.cuh>
#include <weft/core/error.hpp>
#include <weft/core/exec.hpp>
#include <weft/core/math.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/tensor.hpp>
#include <weft/nn/cuda/activation.cuh>
#include <weft/nn/cuda/embedding.cuh>
#include <weft/nn/cuda/gpt.cuh>  // cuda_gpt, cuda_gpt_detail::cublas_handle, residual_add_op
#include <weft/nn/cuda/linear.cuh>
#include <weft/nn/cuda/norm.cuh>
#include <weft/nn/detail/decode_attention.hpp>
#include <weft/nn/detail/decode_ops.hpp>
#include <weft/nn/gpt.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace weft::nn {

//! nn::gpt_decoder<T> on one CUDA stream. The decoder reads `params` (device memory,
//! gpt_layout(config).size() elements in its order, e.g. cuda_gpt::params()) at every step: they
//! must outlive it, and whatever updates them must be ordered before the step, e.g. by running on
//! the decoder's stream (the constructor from a cuda_gpt takes the model's). It holds the keys and
//! values of up to `max_rows` rows × `max_len` positions (<= context) per layer, and every
//! activation for max_rows rows, allocated once.
//!
//! Arguments are checked on the host before any copy or launch (the CPU decoder's checks, the
//! same messages): a refused call leaves the decoder as it was. step() with host logits waits for
//! them; with device logits it returns once the tokens are copied (the caller may reuse their
//! buffer) and the rest runs asynchronously on the stream. T is float or double.
template <class T>
class cuda_gpt_decoder {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::nn::cuda_gpt_decoder<T>: T must be float or double");
  using C = compute_t<T>;
  template <class U>
  using dvec = tensor<U, 1, cuda_space>;

 public:
  cuda_gpt_decoder(gpt_config const& config, T const* params, index_t max_rows, index_t max_len,
                   exec::cuda ex = {})
      : c_(checked(config, params, max_rows, max_len)),
        params_(params),
        max_rows_(max_rows),
        max_len_(max_len),
        ex_(ex),
        off_(c_, gpt_layout(c_)) {
    index_t const d = c_.d_model, kvd = kv_width(), h = c_.hidden(), rows = max_rows_;
    auto const cache = c_.layers * max_rows_ * max_len_ * kvd;
    cache_k_ = make<T>(cache);
    cache_v_ = make<T>(cache);
    for (auto* b : {&x_, &ln_, &q_, &o_, &att_, &mid_}) *b = make<T>(rows * d);
    k_ = make<T>(rows * kvd);
    v_ = make<T>(rows * kvd);
    fc_ = make<T>(rows * h);
    act_ = make<T>(rows * h);
    logits_ = make<T>(rows * c_.vocab);
    mean_ = make<C>(rows);
    rstd_ = make<C>(rows);
    scores_ = make<C>(rows * c_.heads * max_len_);
    acc_ = make<C>(rows * c_.heads * c_.head_dim());
    tokens_ = make<std::int32_t>(rows);
    positions_ = make<std::int32_t>(rows);
    sources_ = make<std::int64_t>(rows);
  }

  //! The decoder of `model`'s parameters, on its stream.
  cuda_gpt_decoder(cuda_gpt<T> const& model, index_t max_rows, index_t max_len)
      : cuda_gpt_decoder(model.config(), model.params(), max_rows, max_len, model.executor()) {}

  cuda_gpt_decoder(cuda_gpt_decoder const&) = delete;
  cuda_gpt_decoder& operator=(cuda_gpt_decoder const&) = delete;

  [[nodiscard]] gpt_config const& config() const noexcept { return c_; }
  [[nodiscard]] exec::cuda executor() const noexcept { return ex_; }
  [[nodiscard]] index_t rows() const noexcept { return rows_; }
  //! Positions cached so far: the next step's position.
  [[nodiscard]] index_t length() const noexcept { return len_; }

  //! Empties the cache for a batch of `rows` rows.
  void reset(index_t rows) {
    WEFT_EXPECTS(rows >= 1 && rows <= max_rows_, "rows",
                 ::weft::detail::concat("in [1, max_rows = ", max_rows_, "]"), rows);
    len_ = 0;
    rows_ = rows;
  }

  //! A new batch of sources.size() rows whose row r continues current row sources[r] (its cached
  //! keys and values, and its last logits; length() unchanged), as nn::gpt_decoder::fork.
  void fork(std::span<index_t const> sources) {
    auto const rows = static_cast<index_t>(sources.size());
    WEFT_EXPECTS(rows >= 1 && rows <= max_rows_, "sources.size()",
                 ::weft::detail::concat("in [1, max_rows = ", max_rows_, "]"), rows);
    for (std::size_t r = 0; r < sources.size(); ++r)
      WEFT_EXPECTS(sources[r] >= 0 && sources[r] < rows_,
                   ::weft::detail::concat("sources[", r, "]"),
                   ::weft::detail::concat("a current row in [0, ", rows_, ")"), sources[r]);
    index_t const span = len_ * kv_width();
    if (span > 0) {
      cudaStream_t const s = ex_.stream;
      // The current rows' prefixes first, packed, so that a row may be source and destination.
      index_t const packed = c_.layers * rows_ * span;
      index_t const scratch = std::max(packed, rows_ * c_.vocab);
      if (scratch > static_cast<index_t>(fork_.size())) {
        fork_ = dvec<T>{};  // free first
        fork_ = make<T>(scratch);
      }
      static_assert(sizeof(index_t) == sizeof(std::int64_t));
      WEFT_CUDA_TRY(cudaMemcpyAsync(sources_.data(), sources.data(), sources.size_bytes(),
                                    cudaMemcpyHostToDevice, s));
      index_t const slot_stride = max_len_ * kv_width();
      for (T* cache : {cache_k_.data(), cache_v_.data()}) {
        ::weft::detail::launch_for_each_index(
            s, packed,
            kernels::decode_fork_op<T>{cache, fork_.data(), nullptr, rows_, rows_, span, max_rows_,
                                       slot_stride, false});
        ::weft::detail::launch_for_each_index(
            s, c_.layers * rows * span,
            kernels::decode_fork_op<T>{cache, fork_.data(), sources_.data(), rows, rows_, span,
                                       max_rows_, slot_stride, true});
      }
      // The last step's logits follow their rows too (one "layer" of rows of vocab elements).
      index_t const v = c_.vocab;
      ::weft::detail::launch_for_each_index(
          s, rows_ * v,
          kernels::decode_fork_op<T>{logits_.data(), fork_.data(), nullptr, rows_, rows_, v,
                                     max_rows_, v, false});
      ::weft::detail::launch_for_each_index(
          s, rows * v,
          kernels::decode_fork_op<T>{logits_.data(), fork_.data(), sources_.data(), rows, rows_, v,
                                     max_rows_, v, true});
      // sources (host memory, pinned or not) may change after the return: wait for the copy.
      ex_.synchronize();
    }
    rows_ = rows;
  }

  //! Feeds tokens[r] to row r at position length() and caches its keys and values; the next-token
  //! logits of every row stay in logits(). Returns once the tokens are copied; the rest runs
  //! asynchronously on the stream.
  void step(std::span<std::int32_t const> tokens) {
    check_step(tokens, rows_, c_.vocab);
    run(tokens);
    ++len_;
  }

  //! The last step's next-token logits [rows(), vocab] in device memory (a fork after a step moves
  //! row r's to hold its source's), valid while length() > 0, until the next step or fork; read
  //! them on the stream.
  [[nodiscard]] tensor_view<T const, 2, cuda_space> logits() const noexcept {
    return tensor_view<T const, 2, cuda_space>(logits_.data(), rows_, c_.vocab);
  }

  //! Feeds tokens[r] to row r at position length(), caches its keys and values, and writes the
  //! next-token logits of every row to host `logits` [rows, vocab] (waits for them).
  void step(std::span<std::int32_t const> tokens, tensor_view<T, 2> logits) {
    check_step(tokens, logits.extent(0), logits.extent(1));
    run(tokens);
    WEFT_CUDA_TRY(cudaMemcpyAsync(logits.data_handle(), logits_.data(),
                                  static_cast<std::size_t>(rows_ * c_.vocab) * sizeof(T),
                                  cudaMemcpyDeviceToHost, ex_.stream));
    ex_.synchronize();
    ++len_;
  }

  //! The same into device `logits` [rows, vocab], asynchronously on the stream.
  void step(std::span<std::int32_t const> tokens, tensor_view<T, 2, cuda_space> logits) {
    check_step(tokens, logits.extent(0), logits.extent(1));
    run(tokens);
    WEFT_CUDA_TRY(cudaMemcpyAsync(logits.data_handle(), logits_.data(),
                                  static_cast<std::size_t>(rows_ * c_.vocab) * sizeof(T),
                                  cudaMemcpyDeviceToDevice, ex_.stream));
    ++len_;
  }

 private:
  // The constructor's checks, before any member (the cuBLAS handle, device memory) is made.
  static gpt_config const& checked(gpt_config const& c, T const* params, index_t max_rows,
                                   index_t max_len) {
    validate(c);
    WEFT_EXPECTS(params != nullptr, "params", "device parameters (gpt_layout(config))", "null");
    WEFT_EXPECTS(max_rows >= 1, "max_rows", ">= 1", max_rows);
    WEFT_EXPECTS(max_len >= 1 && max_len <= c.context, "max_len",
                 ::weft::detail::concat("in [1, context = ", c.context, "]"), max_len);
    return c;
  }

  template <class U>
  static dvec<U> make(index_t n) {
    return dvec<U>(std::array<index_t, 1>{n > 0 ? n : 1});
  }
  [[nodiscard]] index_t kv_width() const noexcept { return c_.kv() * c_.head_dim(); }
  [[nodiscard]] T const* p(std::size_t offset) const noexcept { return params_ + offset; }

  void check_step(std::span<std::int32_t const> tokens, index_t logit_rows,
                  index_t logit_cols) const {
    WEFT_EXPECTS(rows_ > 0, "decoder", "reset(rows) before step", "no rows");
    WEFT_EXPECTS_SHAPE(static_cast<index_t>(tokens.size()) == rows_, "tokens",
                       ::weft::detail::concat(rows_, " (one per row)"), tokens.size());
    WEFT_EXPECTS_SHAPE(logit_rows == rows_ && logit_cols == c_.vocab, "logits",
                       ::weft::detail::concat("[", rows_, ", ", c_.vocab, "]"),
                       ::weft::detail::concat("[", logit_rows, ", ", logit_cols, "]"));
    WEFT_EXPECTS(len_ < max_len_, "position", ::weft::detail::concat("< max_len = ", max_len_),
                 len_);
    for (std::size_t r = 0; r < tokens.size(); ++r)
      WEFT_EXPECTS(tokens[r] >= 0 && tokens[r] < c_.vocab,
                   ::weft::detail::concat("tokens[", r, "]"),
                   ::weft::detail::concat("in [0, ", c_.vocab, ")"), tokens[r]);
  }

  // The step's kernels into logits_ (len_ unchanged).
  void run(std::span<std::int32_t const> tokens) {
    cudaStream_t const s = ex_.stream;
    index_t const d = c_.d_model, rows = rows_;
    // Through a pageable copy: cudaMemcpyAsync has read a pageable source when it returns, while
    // from pinned memory it would read the caller's buffer later (the caller may refill it).
    host_tokens_.assign(tokens.begin(), tokens.end());
    WEFT_CUDA_TRY(cudaMemcpyAsync(tokens_.data(), host_tokens_.data(), tokens.size_bytes(),
                                  cudaMemcpyHostToDevice, s));
    ::weft::detail::launch_for_each_index(
        s, rows,
        kernels::fill_op<std::int32_t>{positions_.data(), static_cast<std::int32_t>(len_)});
    kernels::embedding_forward(s, static_cast<std::int32_t const*>(tokens_.data()), rows,
                               p(off_.wte), c_.vocab, d, x_.data());
    kernels::embedding_forward(s, static_cast<std::int32_t const*>(positions_.data()), rows,
                               p(off_.wpe), c_.context, d, mid_.data());
    add(x_.data(), mid_.data(), x_.data(), rows * d);
    for (index_t l = 0; l < c_.layers; ++l) block(l);
    kernels::layer_norm_forward(s, static_cast<T const*>(x_.data()), p(off_.lnf_w), p(off_.lnf_b),
                                ln_.data(), mean_.data(), rstd_.data(), rows, d, c_.ln_eps);
    kernels::linear_forward(blas_.get(), s, static_cast<T const*>(ln_.data()), p(off_.head),
                            static_cast<T const*>(nullptr), logits_.data(), rows, d, c_.vocab);
  }

  void block(index_t l) {
    auto const& o = off_.blocks[static_cast<std::size_t>(l)];
    cudaStream_t const s = ex_.stream;
    cublasHandle_t const h = blas_.get();
    index_t const d = c_.d_model, kvd = kv_width(), hid = c_.hidden(), rows = rows_;
    index_t const hd = c_.head_dim(), row_stride = max_len_ * kvd;
    T* const layer_k = cache_k_.data() + l * max_rows_ * row_stride;
    T* const layer_v = cache_v_.data() + l * max_rows_ * row_stride;
    kernels::layer_norm_forward(s, static_cast<T const*>(x_.data()), p(o.ln1_w), p(o.ln1_b),
                                ln_.data(), mean_.data(), rstd_.data(), rows, d, c_.ln_eps);
    T const* ln = ln_.data();
    kernels::linear_forward(h, s, ln, p(o.q_w), p(o.q_b), q_.data(), rows, d, d);
    kernels::linear_forward(h, s, ln, p(o.k_w), p(o.k_b), k_.data(), rows, d, kvd);
    kernels::linear_forward(h, s, ln, p(o.v_w), p(o.v_b), v_.data(), rows, d, kvd);
    ::weft::detail::launch_for_each_index(
        s, rows * kvd,
        kernels::decode_cache_write_op<T>{k_.data(), v_.data(), layer_k, layer_v, kvd, row_stride,
                                          len_});
    C const scale = C(1) / std::sqrt(static_cast<C>(hd));
    ::weft::detail::launch_for_each_index(
        s, rows * c_.heads,
        kernels::decode_attention_op<T>{q_.data(), layer_k, layer_v, att_.data(), scores_.data(),
                                        acc_.data(), c_.heads, c_.heads / c_.kv(), hd, kvd,
                                        row_stride, max_len_, len_ + 1, scale});
    kernels::linear_forward(h, s, static_cast<T const*>(att_.data()), p(o.o_w), p(o.o_b), o_.data(),
                            rows, d, d);
    add(x_.data(), o_.data(), mid_.data(), rows * d);
    kernels::layer_norm_forward(s, static_cast<T const*>(mid_.data()), p(o.ln2_w), p(o.ln2_b),
                                ln_.data(), mean_.data(), rstd_.data(), rows, d, c_.ln_eps);
    kernels::linear_forward(h, s, ln, p(o.fc_w), p(o.fc_b), fc_.data(), rows, d, hid);
    kernels::gelu_forward(s, static_cast<T const*>(fc_.data()), act_.data(), rows * hid);
    kernels::linear_forward(h, s, static_cast<T const*>(act_.data()), p(o.proj_w), p(o.proj_b),
                            o_.data(), rows, hid, d);
    add(mid_.data(), o_.data(), x_.data(), rows * d);
  }

  void add(T const* a, T const* b, T* y, index_t n) const {
    ::weft::detail::launch_for_each_index(ex_.stream, n, kernels::residual_add_op<T>{a, b, y});
  }

  gpt_config c_;
  T const* params_;
  index_t max_rows_, max_len_;
  exec::cuda ex_;
  index_t rows_ = 0, len_ = 0;
  cuda_gpt_detail::gpt_offsets off_;
  cuda_gpt_detail::cublas_handle blas_;
  dvec<T> cache_k_, cache_v_, fork_, x_, ln_, q_, k_, v_, att_, o_, mid_, fc_, act_, logits_;
  dvec<C> mean_, rstd_, scores_, acc_;
  dvec<std::int32_t> tokens_, positions_;
  dvec<std::int64_t> sources_;
  std::vector<std::int32_t> host_tokens_;
};

}  // namespace weft::nn
