// examples/rl_trainer/engine_cuda.cu — rl_trainer's model step on a GPU (--device cuda): the
// model_engine of engine.hpp over nn::cuda_gpt<T> (forward, the policy loss's seed, backward),
// the fused AdamW and the CUB gradient norm of optim/cuda/adamw.cuh, all on one stream of CUDA
// device `rank` mod the device count; generation through nn::cuda_gpt_decoder over the same
// device parameters, sampling with rl/cuda's sample_tokens (coins keyed as on every layout). The
// host sees the parameters once per optimizer step (for checkpoints and the run's result), each
// microbatch's log-probs (the policy loss is computed on the host, as on every other layout) and
// each decoding step's draws.
#include "rl_trainer/engine.hpp"

#include "common/cli.hpp"

#include <weft/core/error.hpp>
#include <weft/core/exec.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/tensor.hpp>
#include <weft/nn/cuda/decode.cuh>
#include <weft/nn/cuda/gpt.cuh>
#include <weft/optim/cuda/adamw.cuh>
#include <weft/rl/cuda/sampling.cuh>

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace weft::examples::rl_trainer {
namespace {

template <class T>
using device_vector = tensor<T, 1, cuda_space>;

template <class T>
device_vector<T> device_zeros(std::size_t n, cudaStream_t s) {
  device_vector<T> d(std::array<index_t, 1>{static_cast<index_t>(n)});
  WEFT_CUDA_TRY(cudaMemsetAsync(d.data(), 0, d.size_bytes(), s));
  return d;
}

//! The GPU's decoder: nn::cuda_gpt_decoder over the engine's device parameters, on its stream;
//! a draw is rl/cuda's sample_tokens on the decoder's device logits, and only the rows' coins go
//! in and their draws (token, log-prob, entropy) come back.
template <class T>
class cuda_decoder final : public model_decoder<T> {
 public:
  cuda_decoder(nn::cuda_gpt<T> const& model, index_t max_rows, index_t max_len)
      : d_(model, max_rows, max_len),
        coins_(std::array<index_t, 1>{max_rows}),
        out_(std::array<index_t, 1>{max_rows * static_cast<index_t>(sizeof(rl::token_sample))}) {}
  void reset(index_t rows) override { d_.reset(rows); }
  void fork(std::span<index_t const> sources) override { d_.fork(sources); }
  void step(std::span<std::int32_t const> tokens) override { d_.step(tokens); }
  void sample(rng const& gen, std::span<std::uint64_t const> coins, rl::sample_options const& opt,
              std::span<rl::token_sample> out) override {
    index_t const rows = d_.rows();
    WEFT_EXPECTS(d_.length() > 0, "decoder", "a step before sample", "none since reset");
    (void)rl::detail::sampling_inverse_temperature(d_.config().vocab, opt);  // refuse first
    WEFT_EXPECTS_SHAPE(static_cast<index_t>(coins.size()) == rows, "coins",
                       ::weft::detail::concat(rows, " (one per row)"), coins.size());
    WEFT_EXPECTS_SHAPE(static_cast<index_t>(out.size()) == rows, "out",
                       ::weft::detail::concat(rows, " (one per row)"), out.size());
    cudaStream_t const s = d_.executor().stream;
    auto* const drawn = reinterpret_cast<rl::token_sample*>(out_.data());
    if (!opt.greedy)
      WEFT_CUDA_TRY(cudaMemcpyAsync(coins_.data(), coins.data(), coins.size_bytes(),
                                    cudaMemcpyHostToDevice, s));
    rl::kernels::sample_tokens(s, d_.logits().data_handle(), rows, d_.config().vocab, gen,
                               static_cast<std::uint64_t const*>(coins_.data()), drawn, opt);
    WEFT_CUDA_TRY(cudaMemcpyAsync(out.data(), drawn, out.size_bytes(), cudaMemcpyDeviceToHost, s));
    WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  }

 private:
  nn::cuda_gpt_decoder<T> d_;
  tensor<std::uint64_t, 1, cuda_space> coins_;
  tensor<std::byte, 1, cuda_space> out_;  // max_rows token_samples
};

template <class T>
class cuda_engine final : public model_engine<T> {
 public:
  cuda_engine(nn::gpt_config const& c, std::string where, int device)
      : gpt_(c), where_(std::move(where)), n_(gpt_.size()), device_(device) {
    cudaStream_t const s = gpt_.executor().stream;
    m_ = device_zeros<T>(n_, s);
    v_ = device_zeros<T>(n_, s);
    stash_ = device_zeros<T>(n_, s);
    temp_bytes_ = optim::kernels::grad_norm_squared_temp_bytes<T>(static_cast<std::int64_t>(n_));
    temp_ = device_zeros<std::byte>(temp_bytes_ > 0 ? temp_bytes_ : 1, s);
    norm_sq_ = device_zeros<double>(1, s);
    gpt_.executor().synchronize();
  }

  [[nodiscard]] std::string where() const override { return where_; }

  void set_params(std::span<T const> params) override {
    check_size("params", params.size());
    copy(gpt_.params(), params.data(), cudaMemcpyHostToDevice);
  }
  void get_params(std::span<T> params) override {
    check_size("params", params.size());
    copy(params.data(), gpt_.params(), cudaMemcpyDeviceToHost);
  }
  void set_optimizer(optim::adamw_options const& options, std::span<T const> m,
                     std::span<T const> v, std::int64_t steps) override {
    optim::validate(options);
    check_size("m", m.size());
    check_size("v", v.size());
    WEFT_EXPECTS(steps >= 0, "steps", ">= 0", steps);
    copy(m_.data(), m.data(), cudaMemcpyHostToDevice);
    copy(v_.data(), v.data(), cudaMemcpyHostToDevice);
    options_ = options;
    steps_ = steps;
    has_optimizer_ = true;
  }
  void get_optimizer(optim::adamw<T>& into) override {
    WEFT_EXPECTS(has_optimizer_, "optimizer", "set_optimizer() first", "none");
    std::vector<T> m(n_), v(n_);
    copy(m.data(), m_.data(), cudaMemcpyDeviceToHost);
    copy(v.data(), v_.data(), cudaMemcpyDeviceToHost);
    into.load_state(m, v, steps_);
  }
  void zero_grad() override { gpt_.zero_grad(); }
  void get_grads(std::span<T> grads) override {
    check_size("grads", grads.size());
    copy(grads.data(), gpt_.grads(), cudaMemcpyDeviceToHost);
  }
  void set_grads(std::span<T const> grads) override {
    check_size("grads", grads.size());
    copy(gpt_.grads(), grads.data(), cudaMemcpyHostToDevice);
  }

  double forward_backward(parallel::gpt_sequences const& batch, double token_weight,
                          token_loss_fn const& loss) override {
    auto const t = static_cast<index_t>(batch.tokens.size());
    WEFT_EXPECTS(batch.seq_len > 0 && t % batch.seq_len == 0, "batch.seq_len",
                 ::weft::detail::concat("a positive divisor of the ", t, " tokens"), batch.seq_len);
    // Each sequence its own document, positions 0 .. seq_len - 1 (parallel::gpt's batch of one
    // rank).
    positions_.resize(static_cast<std::size_t>(t));
    for (index_t k = 0; k < t; ++k)
      positions_[static_cast<std::size_t>(k)] = static_cast<std::int32_t>(k % batch.seq_len);
    cu_.resize(static_cast<std::size_t>(t / batch.seq_len + 1));
    for (std::size_t n = 0; n < cu_.size(); ++n)
      cu_[n] = static_cast<std::int64_t>(n) * batch.seq_len;
    gpt_.set_token_loss(loss);
    double const l =
        gpt_.forward(nn::gpt_batch{batch.tokens, positions_, batch.targets, cu_}, token_weight);
    gpt_.backward();
    gpt_.set_token_loss({});  // `loss` may refer to the caller's frame
    return l;
  }

  void stash_grads() override {
    WEFT_CUDA_TRY(cudaMemcpyAsync(stash_.data(), gpt_.grads(), n_ * sizeof(T),
                                  cudaMemcpyDeviceToDevice, gpt_.executor().stream));
    gpt_.zero_grad();
  }
  void add_stash() override {
    ::weft::detail::launch_for_each_index(
        gpt_.executor().stream, static_cast<std::int64_t>(n_),
        nn::kernels::residual_add_op<T>{stash_.data(), gpt_.grads(), gpt_.grads()});
  }
  double clip_grad_norm(double max_norm) override {
    return optim::kernels::clip_grad_norm(gpt_.executor().stream, gpt_.grads(),
                                          static_cast<std::int64_t>(n_), max_norm, temp_.data(),
                                          temp_bytes_, norm_sq_.data());
  }
  void adamw_step(double lr) override {
    WEFT_EXPECTS(has_optimizer_, "optimizer", "set_optimizer() first", "none");
    auto const infos = gpt_.layout().infos();
    optim::kernels::adamw_step(gpt_.executor().stream, std::span<optim::param_info const>(infos),
                               gpt_.params(), static_cast<T const*>(gpt_.grads()), m_.data(),
                               v_.data(), options_, steps_ + 1, lr);
    ++steps_;  // after the launch: a refused step leaves the count as it was
  }
  typename model_engine<T>::device_grads_view device_grads() override {
    return {gpt_.grads(), n_, device_, static_cast<void*>(gpt_.executor().stream)};
  }
  std::unique_ptr<model_decoder<T>> make_decoder(index_t max_rows, index_t max_len) override {
    return std::make_unique<cuda_decoder<T>>(gpt_, max_rows, max_len);
  }

 private:
  void check_size(char const* what, std::size_t n) const {
    WEFT_EXPECTS_SHAPE(n == n_, what, ::weft::detail::concat(n_, " elements (the layout's)"), n);
  }
  //! n_ elements between host and device memory, waiting for them (and the stream's work before).
  void copy(T* dst, T const* src, cudaMemcpyKind kind) {
    cudaStream_t const s = gpt_.executor().stream;
    WEFT_CUDA_TRY(cudaMemcpyAsync(dst, src, n_ * sizeof(T), kind, s));
    WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  }

  nn::cuda_gpt<T> gpt_;
  std::string where_;
  std::size_t n_;
  int device_;
  device_vector<T> m_, v_, stash_;
  device_vector<std::byte> temp_;
  device_vector<double> norm_sq_;
  std::size_t temp_bytes_ = 0;
  optim::adamw_options options_{};
  std::int64_t steps_ = 0;
  bool has_optimizer_ = false;
  std::vector<std::int32_t> positions_;
  std::vector<std::int64_t> cu_;
};

}  // namespace

template <class T>
std::unique_ptr<model_engine<T>> make_cuda_engine(nn::gpt_config const& config, int rank) {
  int count = 0;
  cudaError_t const e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    throw bad_argument{
        std::string("argument `--device`: expected a CUDA device, actual ") +
        (e != cudaSuccess ? std::string("none (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")"
                          : std::string("none"))};
  WEFT_EXPECTS(rank >= 0, "rank", ">= 0", rank);
  int const device = rank % count;
  WEFT_CUDA_TRY(cudaSetDevice(device));  // this thread's (rank's) device from here on
  cudaDeviceProp prop{};
  WEFT_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  std::string where = "CUDA device " + std::to_string(device) + " of " + std::to_string(count) +
                      " (" + prop.name + ", sm_" + std::to_string(prop.major) +
                      std::to_string(prop.minor) + ")";
  return std::make_unique<cuda_engine<T>>(config, std::move(where), device);
}

template std::unique_ptr<model_engine<float>> make_cuda_engine<float>(nn::gpt_config const&, int);
template std::unique_ptr<model_engine<double>> make_cuda_engine<double>(nn::gpt_config const&, int);

}  // namespace weft::examples::rl_trainer
