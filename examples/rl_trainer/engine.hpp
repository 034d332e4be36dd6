// examples/rl_trainer/engine.hpp — rl_trainer's single-device model step (--device): one
// microbatch's forward and backward, the accumulation of two halves, gradient clipping and AdamW,
// with the parameters, gradients and optimizer state held where the model runs. The trainer keeps
// the host copies it needs (the parameters after each step, for generation and checkpoints; the
// optimizer state when it saves one) and talks to the engine through this interface only:
//
//   cpu-engine  cpu_engine<T, Comm>: parallel::gpt on groups of one rank, optim::adamw,
//               optim::clip_grad_norm (the default one-rank path's own calls, so a run is bit for
//               bit the one-rank run: the test of the plumbing --device cuda shares)
//   cuda        make_cuda_engine<T> (engine_cuda.cu, compiled by nvcc into rl_trainer_cuda):
//               nn::cuda_gpt<T>, the fused AdamW and the CUB gradient norm of optim/cuda/adamw.cuh
//
// Generation runs where the model does: make_decoder() returns a key/value-cache decoder with its
// sampler over the engine's own parameters (nn::gpt_decoder and rl::sample_tokens on the CPU,
// nn::cuda_gpt_decoder and rl/cuda's sample_tokens on the GPU), which the trainer drives through
// model_decoder, the interface its host decoder has too.
#pragma once

#include <weft/core/error.hpp>
#include <weft/core/random.hpp>
#include <weft/core/tensor.hpp>
#include <weft/nn/decode.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/nn/params.hpp>
#include <weft/optim/adamw.hpp>
#include <weft/optim/clip.hpp>
#include <weft/parallel/gpt.hpp>
#include <weft/rl/sampling.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace weft::examples::rl_trainer {

//! The policy loss of a microbatch's rows (parallel::gpt's and nn::cuda_gpt's token loss): rows
//! (n · seq_len + position), their log-probs, d loss / d logp out; returns the loss.
using token_loss_fn = std::function<double(std::span<std::int64_t const> rows,
                                           std::span<double const> logp, std::span<double> dlogp)>;

//! Incremental decoding with a key/value cache and sampling from it: the trainer's generation
//! runs on the host or on an engine's device behind these calls (weft/nn/decode.hpp's decoder,
//! rl::sample_tokens' draws).
template <class T>
class model_decoder {
 public:
  model_decoder() = default;
  model_decoder(model_decoder const&) = delete;
  model_decoder& operator=(model_decoder const&) = delete;
  virtual ~model_decoder() = default;
  //! Empties the cache for a batch of `rows` rows.
  virtual void reset(index_t rows) = 0;
  //! A new batch whose row r continues current row sources[r]: its cache and its last logits.
  virtual void fork(std::span<index_t const> sources) = 0;
  //! Feeds tokens[r] to row r; the next-token logits stay with the decoder.
  virtual void step(std::span<std::int32_t const> tokens) = 0;
  //! out[r] = rl::sample_tokens' draw from row r's last logits with coin gen.uniform_double(
  //! coins[r]), one coin per row.
  virtual void sample(rng const& gen, std::span<std::uint64_t const> coins,
                      rl::sample_options const& opt, std::span<rl::token_sample> out) = 0;
};

//! The host's decoder: nn::gpt_decoder over a store laid out by gpt_layout (the trainer's
//! replica, or the CPU engine's store), the logits in host memory, rl::sample_tokens.
template <class T>
class host_decoder final : public model_decoder<T> {
 public:
  host_decoder(nn::gpt_config const& c, nn::param_store<T> const& store, index_t max_rows,
               index_t max_len)
      : d_(c, store, max_rows, max_len),
        vocab_(c.vocab),
        logits_(static_cast<std::size_t>(max_rows * c.vocab)) {}
  void reset(index_t rows) override { d_.reset(rows); }
  void fork(std::span<index_t const> sources) override {
    index_t const from = d_.rows();
    d_.fork(sources);  // checks the sources first
    old_.assign(logits_.begin(), logits_.begin() + from * vocab_);
    for (std::size_t r = 0; r < sources.size(); ++r)
      std::copy_n(old_.begin() + sources[r] * vocab_, vocab_,
                  logits_.begin() + static_cast<index_t>(r) * vocab_);
  }
  void step(std::span<std::int32_t const> tokens) override {
    d_.step(tokens, tensor_view<T, 2>(logits_.data(), d_.rows(), vocab_));
  }
  void sample(rng const& gen, std::span<std::uint64_t const> coins, rl::sample_options const& opt,
              std::span<rl::token_sample> out) override {
    WEFT_EXPECTS(d_.length() > 0, "decoder", "a step before sample", "none since reset");
    WEFT_EXPECTS_SHAPE(static_cast<index_t>(coins.size()) == d_.rows(), "coins",
                       ::weft::detail::concat(d_.rows(), " (one per row)"), coins.size());
    rl::sample_tokens(
        std::span<T const>(logits_.data(), static_cast<std::size_t>(d_.rows() * vocab_)), vocab_,
        gen, coins, out, opt);
  }

 private:
  nn::gpt_decoder<T> d_;
  index_t vocab_;
  std::vector<T> logits_, old_;
};

//! A model step on one device. Parameters, gradients and AdamW's moments are laid out by
//! nn::gpt_layout(config) (parallel::gpt_shard_layout of one rank: the same order).
template <class T>
class model_engine {
 public:
  model_engine() = default;
  model_engine(model_engine const&) = delete;
  model_engine& operator=(model_engine const&) = delete;
  virtual ~model_engine() = default;

  //! Where the model runs, for the run's header line.
  [[nodiscard]] virtual std::string where() const = 0;
  //! Copies host parameters in / the engine's parameters out (params.size() == the layout's).
  virtual void set_params(std::span<T const> params) = 0;
  virtual void get_params(std::span<T> params) = 0;
  //! The AdamW state the following steps continue from, and its copy back into a host
  //! optimizer (its load_state: the host optimizer then steps on bit for bit as the engine would).
  virtual void set_optimizer(optim::adamw_options const& options, std::span<T const> m,
                             std::span<T const> v, std::int64_t steps) = 0;
  virtual void get_optimizer(optim::adamw<T>& into) = 0;
  virtual void zero_grad() = 0;
  //! Copies the gradients out and in (a data-parallel all-reduce on the host between the two).
  virtual void get_grads(std::span<T> grads) = 0;
  virtual void set_grads(std::span<T const> grads) = 0;
  //! Forward and backward of one microbatch of whole sequences (gradients accumulate): the
  //! cross-entropy weighted by token_weight per target token, or `loss` where it is set.
  virtual double forward_backward(parallel::gpt_sequences const& batch, double token_weight,
                                  token_loss_fn const& loss) = 0;
  //! stash = gradients, gradients = 0; then gradients = stash + gradients (two halves summed as
  //! two data-parallel ranks sum theirs).
  virtual void stash_grads() = 0;
  virtual void add_stash() = 0;
  //! torch's clip_grad_norm_ over every gradient; returns the norm before clipping.
  virtual double clip_grad_norm(double max_norm) = 0;
  //! One AdamW step at `lr` (invalid_argument_error before set_optimizer).
  virtual void adamw_step(double lr) = 0;
  //! Where the gradients live when they are device memory (a data-parallel all-reduce over NCCL
  //! sums them in place, on `stream`, a cudaStream_t); none (data null) on the CPU.
  struct device_grads_view {
    T* data = nullptr;
    std::size_t count = 0;
    int device = -1;
    void* stream = nullptr;
  };
  [[nodiscard]] virtual device_grads_view device_grads() { return {}; }
  //! A decoder of up to max_rows rows × max_len positions over the engine's parameters, read at
  //! every step (the engine must outlive it).
  [[nodiscard]] virtual std::unique_ptr<model_decoder<T>> make_decoder(index_t max_rows,
                                                                       index_t max_len) = 0;
};

//! The engine on the CPU: the trainer's one-rank calls behind the engine interface. tp, cp and
//! model_group are groups of one rank (the trainer's, when only dp may exceed 1).
template <class T, class Comm>
class cpu_engine final : public model_engine<T> {
 public:
  cpu_engine(nn::gpt_config const& c, parallel::gpt_parallelism const& p, Comm& tp, Comm& cp,
             Comm& model_group)
      : c_(c), store_(parallel::gpt_shard_layout(c, p)), model_group_(&model_group) {
    WEFT_EXPECTS(tp.size() == 1 && cp.size() == 1 && model_group.size() == 1, "layout",
                 "one rank (dp = pp = tp = cp = 1)",
                 ::weft::detail::concat("tp ", tp.size(), ", cp ", cp.size(), ", pp x tp ",
                                        model_group.size()));
    model_.emplace(c, p, tp, cp, store_);
  }

  [[nodiscard]] std::string where() const override { return "the CPU (parallel::gpt, one rank)"; }
  void set_params(std::span<T const> params) override {
    check_size("params", params.size());
    std::copy(params.begin(), params.end(), store_.params().begin());
  }
  void get_params(std::span<T> params) override {
    check_size("params", params.size());
    std::copy(store_.params().begin(), store_.params().end(), params.begin());
  }
  void set_optimizer(optim::adamw_options const& options, std::span<T const> m,
                     std::span<T const> v, std::int64_t steps) override {
    opt_.emplace(store_.layout().infos(), options);
    opt_->load_state(m, v, steps);
  }
  void get_optimizer(optim::adamw<T>& into) override {
    WEFT_EXPECTS(opt_.has_value(), "optimizer", "set_optimizer() first", "none");
    into.load_state(opt_->m(), opt_->v(), opt_->steps());
  }
  void zero_grad() override { store_.zero_grad(); }
  void get_grads(std::span<T> grads) override {
    check_size("grads", grads.size());
    std::copy(store_.grads().begin(), store_.grads().end(), grads.begin());
  }
  void set_grads(std::span<T const> grads) override {
    check_size("grads", grads.size());
    std::copy(grads.begin(), grads.end(), store_.grads().begin());
  }
  double forward_backward(parallel::gpt_sequences const& batch, double token_weight,
                          token_loss_fn const& loss) override {
    model_->set_token_loss(loss);
    double const l = model_->forward(batch, token_weight);
    model_->backward();
    model_->set_token_loss({});  // `loss` may refer to the caller's frame
    return l;
  }
  void stash_grads() override {
    stash_.assign(store_.grads().begin(), store_.grads().end());
    store_.zero_grad();
  }
  void add_stash() override {
    auto g = store_.grads();
    check_size("stash", stash_.size());
    for (std::size_t k = 0; k < g.size(); ++k) g[k] = stash_[k] + g[k];
  }
  double clip_grad_norm(double max_norm) override {
    return optim::clip_grad_norm(*model_group_, store_.layout().infos(), store_.grads(), 0,
                                 max_norm);
  }
  void adamw_step(double lr) override {
    WEFT_EXPECTS(opt_.has_value(), "optimizer", "set_optimizer() first", "none");
    opt_->step(store_.params(), store_.grads(), lr);
  }
  std::unique_ptr<model_decoder<T>> make_decoder(index_t max_rows, index_t max_len) override {
    return std::make_unique<host_decoder<T>>(c_, store_, max_rows, max_len);
  }

 private:
  void check_size(char const* what, std::size_t n) const {
    WEFT_EXPECTS_SHAPE(n == store_.params().size(), what,
                       ::weft::detail::concat(store_.params().size(), " elements (the layout's)"),
                       n);
  }

  nn::gpt_config c_;
  nn::param_store<T> store_;
  Comm* model_group_;
  std::optional<parallel::gpt<T, Comm, Comm>> model_;
  std::optional<optim::adamw<T>> opt_;
  std::vector<T> stash_;
};

#if WEFT_TRAINER_CUDA
//! The engine on CUDA device `rank` mod the device count (engine_cuda.cu), made current for the
//! calling thread: bad_argument naming --device where no device answers. T is float or double.
template <class T>
std::unique_ptr<model_engine<T>> make_cuda_engine(nn::gpt_config const& config, int rank);
extern template std::unique_ptr<model_engine<float>> make_cuda_engine<float>(nn::gpt_config const&,
                                                                             int);
extern template std::unique_ptr<model_engine<double>> make_cuda_engine<double>(
    nn::gpt_config const&, int);
#endif

}  // namespace weft::examples::rl_trainer
