// weft/nn/cuda/gpt.cuh — the GPU twin of nn::gpt<T> (weft/nn/gpt.hpp): the same forward (weighted
// token cross-entropy) and hand-written backward on one CUDA stream, with parameters and gradients
// in two contiguous device buffers laid out by gpt_layout, so optim/cuda/adamw.cuh steps them in
// place. Built from the nn/cuda layer kernels, nn/cuda/attention.cuh and rl/cuda's log-prob
// kernels.
#pragma once

#if !defined(__CUDACC__)
#error "weft/nn/cuda/gpt.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/flash.hpp>  // detail::check_cu_seqlens
#include <weft/core/config.hpp>
#include <weft/core/cuda/for_each.cuh>
#include <weft/core/error.hpp>
#include <weft/core/exec.hpp>
#include <weft/core/math.hpp>  // compute_t
#include <weft/core/memory.hpp>
#include <weft/core/tensor.hpp>
#include <weft/nn/attention.hpp>  // attention_heads
#include <weft/nn/cuda/activation.cuh>
#include <weft/nn/cuda/attention.cuh>
#include <weft/nn/cuda/embedding.cuh>
#include <weft/nn/cuda/linear.cuh>
#include <weft/nn/cuda/norm.cuh>
#include <weft/nn/embedding.hpp>  // detail::check_ids
#include <weft/nn/gpt.hpp>
#include <weft/nn/params.hpp>
#include <weft/rl/cuda/logprobs.cuh>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/nn/cuda/gpt.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda and CUDA::cublas)"
#endif

namespace weft::nn {

namespace kernels {

//! y[i] = a[i] + b[i] in the compute type, rounded once: residual_forward's (and
//! residual_backward's) arithmetic. y may be a or b.
template <class T>
struct residual_add_op {
  T const* a;
  T const* b;
  T* y;
  WEFT_HD void operator()(std::int64_t i) const noexcept {
    using C = compute_t<T>;
    y[i] = static_cast<T>(static_cast<C>(a[i]) + static_cast<C>(b[i]));
  }
};

//! x[i] = value.
template <class T>
struct fill_op {
  T* x;
  T value;
  WEFT_HD void operator()(std::int64_t i) const noexcept { x[i] = value; }
};

}  // namespace kernels

namespace cuda_gpt_detail {

//! A cuBLAS handle owned for the model's lifetime (bound to the model's stream at every call).
class cublas_handle {
 public:
  cublas_handle() { WEFT_NN_CUBLAS_TRY(cublasCreate(&h_)); }
  cublas_handle(cublas_handle const&) = delete;
  cublas_handle& operator=(cublas_handle const&) = delete;
  ~cublas_handle() { (void)cublasDestroy(h_); }
  [[nodiscard]] cublasHandle_t get() const noexcept { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

//! Hands out 256-byte aligned pieces of one device allocation; with a null base it only counts
//! the bytes (the first of the two passes that size and then bind the activations).
struct carver {
  std::byte* base = nullptr;
  std::size_t used = 0;
  template <class U>
  U* take(std::int64_t count) {
    used = (used + 255) / 256 * 256;
    U* p = base != nullptr ? reinterpret_cast<U*>(base + used) : nullptr;
    used += static_cast<std::size_t>(count) * sizeof(U);
    return p;
  }
};

//! Where each parameter of a gpt_layout(config) buffer starts (elements), the model's and the
//! decoder's (nn/cuda/decode.cuh) view of the flat device parameters.
struct gpt_offsets {
  struct block {
    std::size_t ln1_w, ln1_b, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, ln2_w, ln2_b, fc_w, fc_b,
        proj_w, proj_b;
  };
  std::size_t wte = 0, wpe = 0, lnf_w = 0, lnf_b = 0, head = 0;
  std::vector<block> blocks;

  gpt_offsets(gpt_config const& c, param_layout const& layout) {
    auto const at = [&](std::string const& name) { return layout.at(name).offset; };
    wte = at("wte");
    wpe = at("wpe");
    lnf_w = at("lnf.w");
    lnf_b = at("lnf.b");
    head = at("head");
    for (index_t l = 0; l < c.layers; ++l) {
      std::string const p = "h" + std::to_string(l) + ".";
      blocks.push_back(block{at(p + "ln1.w"), at(p + "ln1.b"), at(p + "q.w"), at(p + "q.b"),
                             at(p + "k.w"), at(p + "k.b"), at(p + "v.w"), at(p + "v.b"),
                             at(p + "o.w"), at(p + "o.b"), at(p + "ln2.w"), at(p + "ln2.b"),
                             at(p + "fc.w"), at(p + "fc.b"), at(p + "proj.w"), at(p + "proj.b")});
    }
  }
};

}  // namespace cuda_gpt_detail

//! nn::gpt<T> on one CUDA stream (exec::cuda). The model owns its device parameters and
//! gradients, each one contiguous buffer of layout().size() elements in gpt_layout's order (the
//! offsets of a param_store of that layout), so
//!   optim::kernels::adamw_step(stream, model.layout().infos(), model.params(), model.grads(),
//!                              m, v, options, step, lr)
//! steps it directly. forward() uploads a host gpt_batch (the batch need not outlive the call),
//! returns the weighted loss as nn::gpt<T>::forward does and keeps what backward() needs;
//! backward() ACCUMULATES into the device gradients (zero_grad() between steps). Everything is
//! asynchronous on the stream except forward's return (it waits for the loss) and the host
//! copies (upload_params, download_params, download_grads wait for theirs).
//!
//! Input checks are nn::gpt's, all made on the host before any copy or launch: a bad batch throws
//! and leaves the model as it was (the last forward's state still backs backward()). T is float
//! or double; attention runs in T through nn/cuda/attention.cuh (any head dimension), the loss
//! through rl/cuda/logprobs.cuh.
template <class T>
class cuda_gpt {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::nn::cuda_gpt<T>: T must be float or double");
  using C = compute_t<T>;

 public:
  //! Device parameters and gradients for `config`, both zero; validate(config) first (throws
  //! invalid_argument_error naming the field).
  explicit cuda_gpt(gpt_config const& config, exec::cuda ex = {})
      : c_(config), layout_(gpt_layout(config)), off_(c_, layout_), ex_(ex) {
    auto const n = static_cast<index_t>(layout_.size());
    params_ = tensor<T, 1, cuda_space>(std::array<index_t, 1>{n});
    grads_ = tensor<T, 1, cuda_space>(std::array<index_t, 1>{n});
    WEFT_CUDA_TRY(cudaMemsetAsync(params_.data(), 0, params_.size_bytes(), ex_.stream));
    WEFT_CUDA_TRY(cudaMemsetAsync(grads_.data(), 0, grads_.size_bytes(), ex_.stream));
    ex_.synchronize();
  }

  cuda_gpt(cuda_gpt const&) = delete;
  cuda_gpt& operator=(cuda_gpt const&) = delete;

  [[nodiscard]] gpt_config const& config() const noexcept { return c_; }
  [[nodiscard]] param_layout const& layout() const noexcept { return layout_; }
  [[nodiscard]] exec::cuda executor() const noexcept { return ex_; }
  //! Elements in each of the device buffers (layout().size()).
  [[nodiscard]] std::size_t size() const noexcept { return layout_.size(); }
  //! The device parameters and gradients, flat, in gpt_layout's order.
  [[nodiscard]] T* params() noexcept { return params_.data(); }
  [[nodiscard]] T const* params() const noexcept { return params_.data(); }
  [[nodiscard]] T* grads() noexcept { return grads_.data(); }
  [[nodiscard]] T const* grads() const noexcept { return grads_.data(); }

  //! Copies a host store's parameters to the device (and waits). shape_error unless the store
  //! is laid out by gpt_layout(config()).
  void upload_params(param_store<T> const& store) {
    check_store(store);
    WEFT_CUDA_TRY(cudaMemcpyAsync(params_.data(), store.params().data(), params_.size_bytes(),
                                  cudaMemcpyHostToDevice, ex_.stream));
    ex_.synchronize();
  }
  //! Copies the device parameters into a host store's parameters (after the stream's work).
  void download_params(param_store<T>& store) const {
    check_store(store);
    WEFT_CUDA_TRY(cudaMemcpyAsync(store.params().data(), params_.data(), params_.size_bytes(),
                                  cudaMemcpyDeviceToHost, ex_.stream));
    ex_.synchronize();
  }
  //! Copies the device gradients into a host store's gradients (after the stream's work).
  void download_grads(param_store<T>& store) const {
    check_store(store);
    WEFT_CUDA_TRY(cudaMemcpyAsync(store.grads().data(), grads_.data(), grads_.size_bytes(),
                                  cudaMemcpyDeviceToHost, ex_.stream));
    ex_.synchronize();
  }

  //! Sets every device gradient to 0 (asynchronous).
  void zero_grad() {
    WEFT_CUDA_TRY(cudaMemsetAsync(grads_.data(), 0, grads_.size_bytes(), ex_.stream));
  }

  //! A loss over the target rows' log-probabilities in place of the weighted cross-entropy (as
  //! parallel::gpt's): called by forward() on the host with rows (the batch's row of each token,
  //! 0 .. tokens - 1), logp (log p(target) of each row, 0 where the target is ignored) and dlogp
  //! (zeros, as many), it returns the loss and writes d loss / d logp of each row, which backward()
  //! then propagates (rows with an ignored target take none). The logp values come from the
  //! device (one copy of tokens() values each way per forward). An empty function restores the
  //! weighted cross-entropy.
  using token_loss_fn = std::function<double(
      std::span<std::int64_t const> rows, std::span<double const> logp, std::span<double> dlogp)>;
  void set_token_loss(token_loss_fn fn) { token_loss_ = std::move(fn); }

  //! nn::gpt<T>::forward on the device: Σ weight·CE over the batch's target rows, weight =
  //! token_weight if > 0, else 1 / the number of targets (the mean); under a token loss
  //! (set_token_loss), that loss (token_weight unused). Throws as nn::gpt does
  //! (shape_error for positions/targets of another length; invalid_argument_error naming
  //! targets[k], tokens[k], positions[k] or cu_seqlens) before any copy or launch. Waits for the
  //! stream to read the loss.
  double forward(gpt_batch const& b, double token_weight = 0.0) {
    auto const t = static_cast<index_t>(b.tokens.size());
    check_batch(b, t);
    index_t counted = 0;
    for (auto v : b.targets) counted += v >= 0 ? 1 : 0;
    double const weight = token_weight > 0.0
                              ? token_weight
                              : (counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0);
    auto const documents = static_cast<index_t>(b.cu_seqlens.size()) - 1;
    ready_ = false;         // from here on the last forward's state may be overwritten
    reserve(t, documents);  // may reallocate
    bind(t, documents);
    t_ = t;
    documents_ = documents;
    weight_ = weight;
    custom_ = static_cast<bool>(token_loss_);
    if (t == 0) {
      // No rows: the token loss is still called (with empty spans), as parallel::gpt calls it.
      double const loss = custom_ ? token_loss_(std::span<std::int64_t const>(),
                                                std::span<double const>(), std::span<double>())
                                  : 0.0;
      ready_ = true;
      return loss;
    }
    cudaStream_t const s = ex_.stream;
    auto const copy = [&](auto* dst, auto const& src) {
      WEFT_CUDA_TRY(cudaMemcpyAsync(dst, src.data(), src.size_bytes(), cudaMemcpyHostToDevice, s));
    };
    copy(a_.tokens, b.tokens);
    copy(a_.positions, b.positions);
    copy(a_.targets, b.targets);
    copy(a_.cu, b.cu_seqlens);
    index_t const d = c_.d_model, v = c_.vocab;
    // Embeddings: x0 = wte[tokens] + wpe[positions].
    kernels::embedding_forward(s, a_.tokens, t, p(off_.wte), v, d, a_.x[0]);
    kernels::embedding_forward(s, a_.positions, t, p(off_.wpe), c_.context, d, a_.tmp_d);
    add(a_.x[0], a_.tmp_d, a_.x[0], t * d);
    for (index_t l = 0; l < c_.layers; ++l) block_forward(l);
    T const* last = a_.x[static_cast<std::size_t>(c_.layers)];
    kernels::layer_norm_forward(s, last, p(off_.lnf_w), p(off_.lnf_b), a_.lnf, a_.lnf_mean,
                                a_.lnf_rstd, t, d, c_.ln_eps);
    kernels::linear_forward(blas_.get(), s, a_.lnf, p(off_.head), static_cast<T const*>(nullptr),
                            a_.logits, t, d, v);
    rl::kernels::log_prob_forward(s, static_cast<T const*>(a_.logits), v,
                                  static_cast<std::int32_t const*>(a_.targets), t, ce_options(),
                                  a_.ce_logp, a_.ce_entropy, a_.ce_lse);
    // The loss as the CPU sums it: in double, in token order, over counted rows.
    host_logp_.resize(static_cast<std::size_t>(t));
    WEFT_CUDA_TRY(cudaMemcpyAsync(host_logp_.data(), a_.ce_logp, host_logp_.size() * sizeof(C),
                                  cudaMemcpyDeviceToHost, s));
    ex_.synchronize();
    if (custom_) {
      auto const n = static_cast<std::size_t>(t);
      tl_rows_.resize(n);
      std::iota(tl_rows_.begin(), tl_rows_.end(), std::int64_t{0});
      tl_logp_.assign(n, 0.0);
      tl_dlogp_.assign(n, 0.0);
      for (std::size_t k = 0; k < n; ++k)
        if (b.targets[k] >= 0) tl_logp_[k] = static_cast<double>(host_logp_[k]);
      double const loss =
          token_loss_(std::span<std::int64_t const>(tl_rows_), std::span<double const>(tl_logp_),
                      std::span<double>(tl_dlogp_));
      // The rows' d loss / d logp, the backward's seed (0 where the target is ignored).
      for (std::size_t k = 0; k < n; ++k)
        host_logp_[k] = b.targets[k] >= 0 ? static_cast<C>(tl_dlogp_[k]) : C(0);
      WEFT_CUDA_TRY(cudaMemcpyAsync(a_.ce_dlogp, host_logp_.data(), n * sizeof(C),
                                    cudaMemcpyHostToDevice, s));
      ex_.synchronize();  // host_logp_ is the source: the next forward overwrites it
      ready_ = true;
      return loss;
    }
    double loss = 0.0;
    for (std::size_t k = 0; k < b.targets.size(); ++k)
      if (b.targets[k] >= 0) loss += weight * -static_cast<double>(host_logp_[k]);
    ready_ = true;
    return loss;
  }

  //! Rows of the last forward.
  [[nodiscard]] index_t tokens() const noexcept { return t_; }
  //! Logits [tokens(), vocab] of the last forward (device memory).
  [[nodiscard]] tensor_view<T const, 2, cuda_space> logits() const noexcept {
    return tensor_view<T const, 2, cuda_space>(a_.logits, t_, c_.vocab);
  }

  //! Accumulates the gradient of the last forward's weighted loss into the device gradients
  //! (asynchronous). invalid_argument_error if no forward has completed since construction or
  //! since a forward that failed part-way.
  void backward() {
    WEFT_EXPECTS(ready_, "forward", "a completed forward() before backward()", "none");
    index_t const t = t_, d = c_.d_model, v = c_.vocab;
    if (t == 0) return;
    cudaStream_t const s = ex_.stream;
    cublasHandle_t const h = blas_.get();
    // d(weight·CE)/dlogits: rl's gradient of g_logp·logp with g_logp = −weight (0 where ignored);
    // under a token loss, forward() has put its d loss / d logp there.
    if (!custom_)
      ::weft::detail::launch_for_each_index(s, t, kernels::fill_op<C>{a_.ce_dlogp, C(-weight_)});
    rl::kernels::log_prob_backward(
        s, static_cast<T const*>(a_.logits), v, static_cast<std::int32_t const*>(a_.targets), t,
        ce_options(), static_cast<C const*>(a_.ce_lse), static_cast<C const*>(a_.ce_entropy),
        static_cast<C const*>(a_.ce_dlogp), static_cast<C const*>(nullptr), a_.dlogits);
    kernels::linear_backward_input(h, s, a_.dlogits, p(off_.head), a_.dln, t, d, v);
    kernels::linear_backward_weight(h, s, a_.dlogits, a_.lnf, g(off_.head),
                                    static_cast<T*>(nullptr), t, d, v);
    T const* last = a_.x[static_cast<std::size_t>(c_.layers)];
    kernels::layer_norm_backward_input(s, a_.dln, last, p(off_.lnf_w), a_.lnf_mean, a_.lnf_rstd,
                                       a_.dx, t, d);
    kernels::layer_norm_backward_weight(s, a_.dln, last, a_.lnf_mean, a_.lnf_rstd, g(off_.lnf_w),
                                        g(off_.lnf_b), t, d);
    for (index_t l = c_.layers - 1; l >= 0; --l) block_backward(l);
    kernels::embedding_backward(s, a_.tokens, t, a_.dx, g(off_.wte), v, d);
    kernels::embedding_backward(s, a_.positions, t, a_.dx, g(off_.wpe), c_.context, d);
  }

 private:
  struct layer_acts {
    T *ln1, *q, *k, *v, *o, *x_mid, *ln2, *fc, *act;
    C *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
  };
  //! Device pointers into the activation arena, rebound by every forward.
  struct activations {
    std::int32_t *tokens, *positions, *targets;
    std::int64_t* cu;
    std::vector<T*> x;
    std::vector<layer_acts> layers;
    T *tmp_d, *lnf, *logits;
    C *lnf_mean, *lnf_rstd, *ce_logp, *ce_entropy, *ce_lse, *ce_dlogp, *dsum;
    T *dlogits, *dln, *dx, *dmid, *tmp, *dout, *dq, *dact, *dfc, *dk, *dv;
  };

  //! The store's layout must be gpt_layout(config()): the same parameters, names, shapes and
  //! offsets (equal totals alone could be another config's).
  template <class Store>
  void check_store(Store const& store) const {
    ::weft::nn::detail::expect_layout(store.layout(), layout_, "gpt_layout(config)");
  }

  //! nn::gpt's checks, plus the ones its layers make on the way (ids in range, cu_seqlens), all
  //! before anything is copied or launched.
  void check_batch(gpt_batch const& b, index_t t) const {
    nn::detail::check_gpt_batch(c_, b, t);
    nn::detail::check_ids(b.tokens, c_.vocab, "tokens");
    nn::detail::check_ids(b.positions, c_.context, "positions");
    ::weft::attention::detail::check_cu_seqlens(b.cu_seqlens, t, "cu_seqlens");
  }

  //! Lays out every activation of a forward over t rows and `documents` documents in the arena
  //! (or, with a null base, only counts its bytes); returns the bytes.
  std::size_t layout_arena(activations& a, std::byte* base, index_t t, index_t documents) const {
    cuda_gpt_detail::carver cv{base};
    index_t const d = c_.d_model, kvd = c_.kv() * c_.head_dim(), hid = c_.hidden(), v = c_.vocab,
                  hq = c_.heads;
    a.tokens = cv.take<std::int32_t>(t);
    a.positions = cv.take<std::int32_t>(t);
    a.targets = cv.take<std::int32_t>(t);
    a.cu = cv.take<std::int64_t>(documents + 1);
    a.x.assign(static_cast<std::size_t>(c_.layers + 1), nullptr);
    for (auto& x : a.x) x = cv.take<T>(t * d);
    a.layers.assign(static_cast<std::size_t>(c_.layers), layer_acts{});
    for (auto& la : a.layers) {
      la.ln1 = cv.take<T>(t * d);
      la.q = cv.take<T>(t * d);
      la.k = cv.take<T>(t * kvd);
      la.v = cv.take<T>(t * kvd);
      la.o = cv.take<T>(t * d);
      la.x_mid = cv.take<T>(t * d);
      la.ln2 = cv.take<T>(t * d);
      la.fc = cv.take<T>(t * hid);
      la.act = cv.take<T>(t * hid);
      la.ln1_mean = cv.take<C>(t);
      la.ln1_rstd = cv.take<C>(t);
      la.ln2_mean = cv.take<C>(t);
      la.ln2_rstd = cv.take<C>(t);
      la.lse = cv.take<C>(hq * t);
    }
    a.tmp_d = cv.take<T>(t * d);
    a.lnf = cv.take<T>(t * d);
    a.logits = cv.take<T>(t * v);
    a.lnf_mean = cv.take<C>(t);
    a.lnf_rstd = cv.take<C>(t);
    a.ce_logp = cv.take<C>(t);
    a.ce_entropy = cv.take<C>(t);
    a.ce_lse = cv.take<C>(t);
    a.ce_dlogp = cv.take<C>(t);
    a.dsum = cv.take<C>(hq * t);
    a.dlogits = cv.take<T>(t * v);
    for (T** q : {&a.dln, &a.dx, &a.dmid, &a.tmp, &a.dout, &a.dq}) *q = cv.take<T>(t * d);
    a.dact = cv.take<T>(t * hid);
    a.dfc = cv.take<T>(t * hid);
    a.dk = cv.take<T>(t * kvd);
    a.dv = cv.take<T>(t * kvd);
    return cv.used;
  }

  //! Grows the arena for t rows and `documents` documents; a step that fits allocates nothing.
  void reserve(index_t t, index_t documents) {
    activations count{};
    auto const need = static_cast<index_t>(layout_arena(count, nullptr, t, documents));
    if (need <= static_cast<index_t>(arena_.size())) return;
    arena_ = tensor<std::byte, 1, cuda_space>{};  // free first: the peak stays one arena
    arena_ = tensor<std::byte, 1, cuda_space>(std::array<index_t, 1>{need});
  }
  void bind(index_t t, index_t documents) { (void)layout_arena(a_, arena_.data(), t, documents); }

  void block_forward(index_t l) {
    auto const& o = off_.blocks[static_cast<std::size_t>(l)];
    auto const& a = a_.layers[static_cast<std::size_t>(l)];
    T const* x = a_.x[static_cast<std::size_t>(l)];
    T* y = a_.x[static_cast<std::size_t>(l + 1)];
    index_t const t = t_, d = c_.d_model, kvd = c_.kv() * c_.head_dim(), hid = c_.hidden();
    cudaStream_t const s = ex_.stream;
    cublasHandle_t const h = blas_.get();
    kernels::layer_norm_forward(s, x, p(o.ln1_w), p(o.ln1_b), a.ln1, a.ln1_mean, a.ln1_rstd, t, d,
                                c_.ln_eps);
    kernels::linear_forward(h, s, static_cast<T const*>(a.ln1), p(o.q_w), p(o.q_b), a.q, t, d, d);
    kernels::linear_forward(h, s, static_cast<T const*>(a.ln1), p(o.k_w), p(o.k_b), a.k, t, d, kvd);
    kernels::linear_forward(h, s, static_cast<T const*>(a.ln1), p(o.v_w), p(o.v_b), a.v, t, d, kvd);
    kernels::causal_attention_forward(
        s, static_cast<T const*>(a.q), static_cast<T const*>(a.k), static_cast<T const*>(a.v), a.o,
        a.lse, static_cast<std::int64_t const*>(a_.cu), documents_, t, heads());
    kernels::linear_forward(h, s, static_cast<T const*>(a.o), p(o.o_w), p(o.o_b), a_.tmp_d, t, d,
                            d);
    add(x, a_.tmp_d, a.x_mid, t * d);
    kernels::layer_norm_forward(s, static_cast<T const*>(a.x_mid), p(o.ln2_w), p(o.ln2_b), a.ln2,
                                a.ln2_mean, a.ln2_rstd, t, d, c_.ln_eps);
    kernels::linear_forward(h, s, static_cast<T const*>(a.ln2), p(o.fc_w), p(o.fc_b), a.fc, t, d,
                            hid);
    kernels::gelu_forward(s, static_cast<T const*>(a.fc), a.act, t * hid);
    kernels::linear_forward(h, s, static_cast<T const*>(a.act), p(o.proj_w), p(o.proj_b), a_.tmp_d,
                            t, hid, d);
    add(a.x_mid, a_.tmp_d, y, t * d);
  }

  //! a_.dx holds d(block output) on entry and d(block input) on return (nn::gpt's order).
  void block_backward(index_t l) {
    auto const& o = off_.blocks[static_cast<std::size_t>(l)];
    auto const& a = a_.layers[static_cast<std::size_t>(l)];
    T const* x = a_.x[static_cast<std::size_t>(l)];
    index_t const t = t_, d = c_.d_model, kvd = c_.kv() * c_.head_dim(), hid = c_.hidden();
    cudaStream_t const s = ex_.stream;
    cublasHandle_t const h = blas_.get();
    T* dx = a_.dx;
    // MLP: y = x_mid + proj(gelu(fc(ln2(x_mid)))).
    kernels::linear_backward_input(h, s, static_cast<T const*>(dx), p(o.proj_w), a_.dact, t, hid,
                                   d);
    kernels::linear_backward_weight(h, s, static_cast<T const*>(dx), static_cast<T const*>(a.act),
                                    g(o.proj_w), g(o.proj_b), t, hid, d);
    kernels::gelu_backward(s, static_cast<T const*>(a.fc), static_cast<T const*>(a_.dact), a_.dfc,
                           t * hid);
    kernels::linear_backward_input(h, s, static_cast<T const*>(a_.dfc), p(o.fc_w), a_.dln, t, d,
                                   hid);
    kernels::linear_backward_weight(h, s, static_cast<T const*>(a_.dfc),
                                    static_cast<T const*>(a.ln2), g(o.fc_w), g(o.fc_b), t, d, hid);
    kernels::layer_norm_backward_input(
        s, static_cast<T const*>(a_.dln), static_cast<T const*>(a.x_mid), p(o.ln2_w),
        static_cast<C const*>(a.ln2_mean), static_cast<C const*>(a.ln2_rstd), a_.tmp, t, d);
    kernels::layer_norm_backward_weight(
        s, static_cast<T const*>(a_.dln), static_cast<T const*>(a.x_mid),
        static_cast<C const*>(a.ln2_mean), static_cast<C const*>(a.ln2_rstd), g(o.ln2_w),
        g(o.ln2_b), t, d);
    add(dx, a_.tmp, a_.dmid, t * d);
    // Attention: x_mid = x + o.w(attn(q(ln1 x), k(ln1 x), v(ln1 x))).
    kernels::linear_backward_input(h, s, static_cast<T const*>(a_.dmid), p(o.o_w), a_.dout, t, d,
                                   d);
    kernels::linear_backward_weight(h, s, static_cast<T const*>(a_.dmid),
                                    static_cast<T const*>(a.o), g(o.o_w), g(o.o_b), t, d, d);
    kernels::causal_attention_backward(
        s, static_cast<T const*>(a.q), static_cast<T const*>(a.k), static_cast<T const*>(a.v),
        static_cast<T const*>(a.o), static_cast<C const*>(a.lse), static_cast<T const*>(a_.dout),
        a_.dq, a_.dk, a_.dv, a_.dsum, static_cast<std::int64_t const*>(a_.cu), documents_, t,
        heads());
    kernels::linear_backward_input(h, s, static_cast<T const*>(a_.dq), p(o.q_w), a_.dln, t, d, d);
    kernels::linear_backward_input(h, s, static_cast<T const*>(a_.dk), p(o.k_w), a_.tmp, t, d, kvd);
    add(a_.dln, a_.tmp, a_.dln, t * d);
    kernels::linear_backward_input(h, s, static_cast<T const*>(a_.dv), p(o.v_w), a_.tmp, t, d, kvd);
    add(a_.dln, a_.tmp, a_.dln, t * d);
    kernels::linear_backward_weight(h, s, static_cast<T const*>(a_.dq),
                                    static_cast<T const*>(a.ln1), g(o.q_w), g(o.q_b), t, d, d);
    kernels::linear_backward_weight(h, s, static_cast<T const*>(a_.dk),
                                    static_cast<T const*>(a.ln1), g(o.k_w), g(o.k_b), t, d, kvd);
    kernels::linear_backward_weight(h, s, static_cast<T const*>(a_.dv),
                                    static_cast<T const*>(a.ln1), g(o.v_w), g(o.v_b), t, d, kvd);
    kernels::layer_norm_backward_input(s, static_cast<T const*>(a_.dln), x, p(o.ln1_w),
                                       static_cast<C const*>(a.ln1_mean),
                                       static_cast<C const*>(a.ln1_rstd), a_.tmp, t, d);
    kernels::layer_norm_backward_weight(
        s, static_cast<T const*>(a_.dln), x, static_cast<C const*>(a.ln1_mean),
        static_cast<C const*>(a.ln1_rstd), g(o.ln1_w), g(o.ln1_b), t, d);
    add(a_.dmid, a_.tmp, dx, t * d);
  }

  //! y = a + b over n elements (y may be a or b).
  void add(T const* a, T const* b, T* y, index_t n) const {
    ::weft::detail::launch_for_each_index(ex_.stream, n, kernels::residual_add_op<T>{a, b, y});
  }

  [[nodiscard]] attention_heads heads() const noexcept {
    return {c_.heads, c_.kv(), c_.head_dim(), 0.0};
  }
  //! The loss's log-prob options: targets are -1 (ignored) or a class, at temperature 1.
  [[nodiscard]] static rl::logprob_options ce_options() noexcept {
    rl::logprob_options o;
    o.temperature = 1.0;
    o.ignore_index = -1;
    return o;
  }
  [[nodiscard]] T const* p(std::size_t offset) const noexcept { return params_.data() + offset; }
  [[nodiscard]] T* g(std::size_t offset) noexcept { return grads_.data() + offset; }

  gpt_config c_;
  param_layout layout_;
  cuda_gpt_detail::gpt_offsets off_;
  exec::cuda ex_;
  cuda_gpt_detail::cublas_handle blas_;
  tensor<T, 1, cuda_space> params_;
  tensor<T, 1, cuda_space> grads_;
  tensor<std::byte, 1, cuda_space> arena_;
  activations a_{};
  std::vector<C> host_logp_;
  index_t t_ = 0;
  index_t documents_ = 0;
  double weight_ = 0.0;
  bool ready_ = false;
  bool custom_ = false;  // the last forward ran token_loss_
  token_loss_fn token_loss_;
  std::vector<std::int64_t> tl_rows_;
  std::vector<double> tl_logp_, tl_dlogp_;
};

}  // namespace weft::nn
