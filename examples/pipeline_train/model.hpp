// pipeline_train/model.hpp — the example's language model, written as a user without a layer
// library would write it: a token embedding, residual MLP blocks and an output layer with softmax
// cross-entropy, each with a hand-written backward split into an input-gradient part (I) and a
// weight-gradient part (W) so that the zero-bubble schedules can run W late; parameters that
// initialise the same whatever the split, plain Adam, and the synthetic next-token task.
#pragma once

#include <weft/core/random.hpp>  // rng, random_uniform: counter-based, keyed by element index

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace pipeline_train {

//! Sizes of the model and of one microbatch. V = vocab, h = hidden, f = ffn, n = tokens.
struct model_config {
  int vocab = 64;   //!< V: a multiple of the ranks, so each holds V/p rows under vocab parallelism
  int hidden = 32;  //!< h: the width of the residual stream (what stages send each other)
  int ffn = 128;    //!< f: the width inside an MLP block
  int blocks = 8;   //!< residual MLP blocks over all stages
  int tokens = 16;  //!< n: tokens per microbatch (one sequence)
  std::uint64_t seed = 2026;
};

inline std::size_t sz(int x) { return static_cast<std::size_t>(x); }

// ---- parameters ---------------------------------------------------------------------------------

// Every tensor has its own random stream, and element k of a shard that starts at global element
// `first` takes the stream's value at first + k: a stage or vocabulary shard initialises exactly
// the slice of the unsplit model it holds, so every schedule (and every p) starts from the same
// model.
enum stream : std::uint64_t { embedding_stream = 1, output_stream = 2, block_streams = 16 };

//! One parameter tensor (or a shard of one) with its gradient and Adam's moments.
struct parameter {
  std::vector<float> value, grad, adam_m, adam_v;

  parameter() = default;
  parameter(model_config const& cfg, std::uint64_t stream_id, std::size_t first, std::size_t count,
            float scale)
      : value(count), grad(count, 0.0f), adam_m(count, 0.0f), adam_v(count, 0.0f) {
    weft::random_uniform<float> const dist(weft::rng(cfg.seed, stream_id), -scale, scale);
    for (std::size_t k = 0; k < count; ++k) value[k] = dist(first + k);
  }
  //! The executor never touches gradient storage: gradients accumulate over the microbatches of
  //! a step, and the caller zeroes them before the next one.
  void zero_grad() { std::fill(grad.begin(), grad.end(), 0.0f); }
};

//! Adam as torch.optim.Adam defines it (no weight decay; eps added after bias-correcting
//! sqrt(v)). Element-wise, so a sharded model steps exactly like the whole one.
struct adam {
  double lr = 5e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;

  //! Step `t` (from 1) of one tensor, from its accumulated gradient.
  void step(parameter& p, int t) const {
    auto const b1 = static_cast<float>(beta1), b2 = static_cast<float>(beta2);
    double const correction1 = 1.0 - std::pow(beta1, t);
    auto const correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
    auto const step_size = static_cast<float>(lr / correction1);
    auto const e = static_cast<float>(eps);
    for (std::size_t k = 0; k < p.value.size(); ++k) {
      float const g = p.grad[k];
      p.adam_m[k] = b1 * p.adam_m[k] + (1.0f - b1) * g;
      p.adam_v[k] = b2 * p.adam_v[k] + (1.0f - b2) * g * g;
      float const denom = std::sqrt(p.adam_v[k]) / correction2_sqrt + e;
      p.value[k] -= step_size * p.adam_m[k] / denom;
    }
  }
};

// ---- layers -------------------------------------------------------------------------------------
// Shapes: x and y are n x h (row t is token t), a and dz are n x f, logits n x V. Weights are
// row-major [out][in]. Gradients are summed token by token in increasing order, and every
// microbatch's W comes after the previous one's (the executor guarantees that per chunk), so a
// parameter's gradient has one summation order whatever the schedule: the pipelined gradients
// equal one device's bit for bit.

//! y = x + W2 tanh(W1 x + b1) + b2: an MLP with a residual connection.
struct mlp_block {
  int h = 0, f = 0;
  parameter w1, b1, w2, b2;  // w1: f x h, w2: h x f

  mlp_block(model_config const& cfg, int index) : h(cfg.hidden), f(cfg.ffn) {
    auto const s = block_streams + 4 * static_cast<std::uint64_t>(index);
    // Uniform(+-sqrt(3/in)) has variance 1/in, so tanh's input stays O(1); W2 starts small so
    // that the residual stream grows slowly through the blocks.
    w1 = parameter(cfg, s, 0, sz(f * h), std::sqrt(3.0f / static_cast<float>(h)));
    b1 = parameter(cfg, s + 1, 0, sz(f), 0.1f);
    w2 = parameter(cfg, s + 2, 0, sz(h * f), 0.5f / std::sqrt(static_cast<float>(f)));
    b2 = parameter(cfg, s + 3, 0, sz(h), 0.1f);
  }

  //! Writes the activations a = tanh(W1 x + b1) (kept for backward) and y.
  void forward(float const* x, int n, float* a, float* y) const {
    for (int t = 0; t < n; ++t) {
      float const* xt = x + t * h;
      float* at = a + t * f;
      for (int j = 0; j < f; ++j) {
        float z = b1.value[sz(j)];
        for (int k = 0; k < h; ++k) z += w1.value[sz(j * h + k)] * xt[k];
        at[j] = std::tanh(z);
      }
      for (int i = 0; i < h; ++i) {
        float acc = b2.value[sz(i)];
        for (int j = 0; j < f; ++j) acc += w2.value[sz(i * f + j)] * at[j];
        y[t * h + i] = xt[i] + acc;
      }
    }
  }

  //! I: from dy (gradient of y) writes dz = (W2^T dy) * (1 - a^2), the gradient of W1 x + b1
  //! that W needs, and dx = dy + W1^T dz.
  void backward_input(float const* a, float const* dy, int n, float* dz, float* dx) const {
    for (int t = 0; t < n; ++t) {
      float const* dyt = dy + t * h;
      float const* at = a + t * f;
      float* dzt = dz + t * f;
      for (int j = 0; j < f; ++j) {
        float acc = 0.0f;
        for (int i = 0; i < h; ++i) acc += w2.value[sz(i * f + j)] * dyt[i];
        dzt[j] = acc * (1.0f - at[j] * at[j]);
      }
      for (int k = 0; k < h; ++k) {
        float acc = dyt[k];
        for (int j = 0; j < f; ++j) acc += w1.value[sz(j * h + k)] * dzt[j];
        dx[t * h + k] = acc;
      }
    }
  }

  //! W: adds this microbatch's parameter gradients (x, a, dy and dz as forward and I left them).
  void backward_weight(float const* x, float const* a, float const* dy, float const* dz, int n) {
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < h; ++i) {
        float const d = dy[t * h + i];
        for (int j = 0; j < f; ++j) w2.grad[sz(i * f + j)] += d * a[t * f + j];
        b2.grad[sz(i)] += d;
      }
      for (int j = 0; j < f; ++j) {
        float const d = dz[t * f + j];
        for (int k = 0; k < h; ++k) w1.grad[sz(j * h + k)] += d * x[t * h + k];
        b1.grad[sz(j)] += d;
      }
    }
  }
};

//! y = x W^T: one token's logits over the `rows` rows of `w` (rows x h), which are the whole
//! output layer on the last stage or a vocabulary shard's rows; both use this one loop.
inline void logits_of(float const* x, std::vector<float> const& w, int rows, int h, float* y) {
  for (int v = 0; v < rows; ++v) {
    float acc = 0.0f;
    for (int k = 0; k < h; ++k) acc += w[sz(v * h + k)] * x[k];
    y[v] = acc;
  }
}

// ---- the task -----------------------------------------------------------------------------------

//! One step's data: per microbatch, n input ids and the n next tokens to predict.
struct batch {
  std::vector<std::vector<int>> ids, targets;
};

//! The corpus: one fixed random ordering of the vocabulary, repeated (so every token has one
//! fixed successor, a bigram table a per-token model can learn exactly: the loss falls from about
//! log V towards 0). A step's microbatches are consecutive windows of n tokens from an offset
//! keyed by the step, so one step sees min(m n, V) distinct tokens and the loss falls smoothly;
//! the model reads x_t and predicts x_{t+1}. Every rank builds the same batch on its own, as
//! data loaders do.
inline batch make_batch(model_config const& cfg, int step, int microbatches) {
  weft::rng const order_rng(cfg.seed, 100), offset_rng(cfg.seed, 101);
  auto const v = static_cast<std::uint32_t>(cfg.vocab);
  std::vector<int> order(sz(cfg.vocab));
  std::iota(order.begin(), order.end(), 0);
  for (std::uint32_t i = v - 1; i > 0; --i)  // Fisher-Yates: a random permutation
    std::swap(order[i], order[order_rng.uniform_int(i, i + 1)]);
  auto const offset = static_cast<int>(offset_rng.uniform_int(static_cast<std::uint64_t>(step), v));
  batch b;
  for (int mb = 0; mb < microbatches; ++mb) {
    std::vector<int> ids, targets;
    for (int t = 0; t < cfg.tokens; ++t) {
      int const pos = offset + mb * cfg.tokens + t;
      ids.push_back(order[sz(pos % cfg.vocab)]);
      targets.push_back(order[sz((pos + 1) % cfg.vocab)]);
    }
    b.ids.push_back(std::move(ids));
    b.targets.push_back(std::move(targets));
  }
  return b;
}

}  // namespace pipeline_train
