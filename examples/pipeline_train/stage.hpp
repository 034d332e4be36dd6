// pipeline_train/stage.hpp — the model cut for the pipeline executor: `model_stage`, one rank's
// stages (a weft::pipeline::Stage: the blocks of each of its chunks, the embedding on stage 0 and
// the output layer with the loss on the last stage), and `vocab_shard`, this rank's V/p rows of
// the embedding and the output layer for the vocabulary-balanced schedules (a VocabShard).
#pragma once

#include "model.hpp"

#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/stage.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <optional>
#include <vector>

namespace pipeline_train {

namespace pl = weft::pipeline;

//! One rank's share of the model: for each chunk it holds (one, or two for interleaved and ZBV),
//! the blocks of its global stage; with `vocab_parallel` false, stage 0 also holds the embedding
//! and the last stage the output layer and the loss. Under vocabulary parallelism both live in
//! vocab_shard, stage 0 receives the summed embedding and the last stage sends its output to the
//! output layer: every stage then sends and receives n x h.
class model_stage {
 public:
  using stage_concept = pl::stage_tag;

  model_stage(model_config const& cfg, pl::schedule const& sched, int rank, bool vocab_parallel)
      : cfg_(cfg),
        stages_(sched.num_stages()),
        vocab_parallel_(vocab_parallel),
        logits_(sz(cfg.vocab)),
        dy_(activation_count()),
        dx_(activation_count()) {
    chunks_.resize(sz(sched.num_chunks()));
    for (int s = 0; s < stages_; ++s) {
      if (sched.stage_to_rank(s) != rank) continue;
      auto& ch = chunks_[sz(sched.chunk_of(s))];
      ch.stage = s;
      // Blocks [s B / S, (s + 1) B / S): the same model whatever the number of stages S.
      for (int b = s * cfg.blocks / stages_; b < (s + 1) * cfg.blocks / stages_; ++b)
        ch.blocks.emplace_back(cfg, b);
      if (!vocab_parallel && s == 0)
        ch.embedding = parameter(cfg, embedding_stream, 0, sz(cfg.vocab * cfg.hidden), 1.0f);
      if (!vocab_parallel && s == stages_ - 1)
        ch.output = parameter(cfg, output_stream, 0, sz(cfg.vocab * cfg.hidden),
                              std::sqrt(3.0f / static_cast<float>(cfg.hidden)));
    }
  }

  //! The step's data (stage 0 reads the ids, the last stage the targets).
  void set_batch(batch const* b) { batch_ = b; }

  //! Everything the optimizer steps and the caller zeroes.
  std::vector<parameter*> parameters() {
    std::vector<parameter*> out;
    for (auto& ch : chunks_) {
      if (ch.embedding) out.push_back(&*ch.embedding);
      for (auto& b : ch.blocks)
        for (auto* p : {&b.w1, &b.b1, &b.w2, &b.b2}) out.push_back(p);
      if (ch.output) out.push_back(&*ch.output);
    }
    return out;
  }

  // What crosses a stage boundary is the residual stream of the microbatch's n tokens; stage 0
  // reads token ids of its own and the last stage ends in the loss, unless the vocabulary layers
  // are sharded apart (then both are n x h, as stage.hpp's VocabShard requires).
  pl::message_layout input_layout(pl::stage_call const& c) const {
    bool const none = c.first_stage() && !vocab_parallel_;
    return {none ? 0 : activation_count(), weft::dtype::f32};
  }
  pl::message_layout output_layout(pl::stage_call const& c) const {
    bool const none = c.last_stage() && !vocab_parallel_;
    return {none ? 0 : activation_count(), weft::dtype::f32};
  }

  //! Allocates every stash slot up front: with the scratch buffers sized in the constructor, a
  //! step allocates nothing.
  void reserve_slots(int chunk, int slots) {
    auto& ch = chunks_[sz(chunk)];
    std::size_t const nb = ch.blocks.size(), nh = activation_count(),
                      nf = sz(cfg_.tokens * cfg_.ffn);
    ch.slots.resize(sz(slots));
    for (auto& st : ch.slots) {
      st.x.assign((nb + 1) * nh, 0.0f);
      st.a.assign(nb * nf, 0.0f);
      st.dy.assign(nb * nh, 0.0f);
      st.dz.assign(nb * nf, 0.0f);
      st.dembed.assign(ch.embedding ? nh : 0, 0.0f);
      st.dlogits.assign(ch.output ? sz(cfg_.tokens * cfg_.vocab) : 0, 0.0f);
    }
  }

  double forward(pl::stage_call const& c, weft::comm::buffer_view in, weft::comm::buffer_view out) {
    auto& ch = chunks_[sz(c.chunk)];
    auto& st = ch.slots[sz(c.slot)];
    int const n = cfg_.tokens, h = cfg_.hidden;
    std::size_t const nh = activation_count(), nf = sz(n * cfg_.ffn);
    if (ch.embedding) {
      auto const& ids = batch_->ids[sz(c.microbatch)];
      for (int t = 0; t < n; ++t)
        std::copy_n(ch.embedding->value.data() + ids[sz(t)] * h, h, st.x.data() + t * h);
    } else {
      // The executor keeps `in` alive until our backward, but a copy keeps the stash
      // self-contained.
      std::memcpy(st.x.data(), in.data, in.bytes());
    }
    for (std::size_t l = 0; l < ch.blocks.size(); ++l)
      ch.blocks[l].forward(st.x.data() + l * nh, n, st.a.data() + l * nf,
                           st.x.data() + (l + 1) * nh);
    float const* y = st.x.data() + ch.blocks.size() * nh;
    if (!ch.output) {
      std::memcpy(out.data, y, out.bytes());
      return 0.0;
    }
    // The last stage: summed token cross-entropy, weighted by the executor's loss weight (1/N for
    // the token mean over the whole step) before anything flows backward.
    double loss = 0.0;
    auto& logits = logits_;
    auto const& targets = batch_->targets[sz(c.microbatch)];
    for (int t = 0; t < n; ++t) {
      logits_of(y + t * h, ch.output->value, cfg_.vocab, h, logits.data());
      float const mx = *std::max_element(logits.begin(), logits.end());
      float s = 0.0f;
      for (float v : logits) s += std::exp(v - mx);
      loss += std::log(static_cast<double>(s)) -
              (static_cast<double>(logits[sz(targets[sz(t)])]) - static_cast<double>(mx));
    }
    return c.loss_weight * loss;
  }

  void backward_input(pl::stage_call const& c, weft::comm::buffer_view dout,
                      weft::comm::buffer_view din) {
    auto& ch = chunks_[sz(c.chunk)];
    auto& st = ch.slots[sz(c.slot)];
    int const n = cfg_.tokens, h = cfg_.hidden;
    std::size_t const nb = ch.blocks.size(), nh = activation_count(), nf = sz(n * cfg_.ffn);
    // dy: the gradient of this stage's output, from the loss here or from the next stage.
    auto& dy = dy_;
    auto& dx = dx_;
    if (ch.output) {
      // d(w sum_t loss_t)/d logit_tv = w (softmax_tv - [v == target_t]), seeded with the loss
      // weight; kept in the slot for W, and dy = dlogits W.
      auto const g = static_cast<float>(c.loss_weight);
      float const* y = st.x.data() + nb * nh;
      auto const& targets = batch_->targets[sz(c.microbatch)];
      auto const& w = ch.output->value;
      for (int t = 0; t < n; ++t) {
        float* d = st.dlogits.data() + t * cfg_.vocab;
        logits_of(y + t * h, w, cfg_.vocab, h, d);
        float const mx = *std::max_element(d, d + cfg_.vocab);
        float s = 0.0f;
        for (int v = 0; v < cfg_.vocab; ++v) s += std::exp(d[v] - mx);
        for (int v = 0; v < cfg_.vocab; ++v)
          d[v] = g * (std::exp(d[v] - mx) / s - (v == targets[sz(t)] ? 1.0f : 0.0f));
        for (int k = 0; k < h; ++k) {
          float acc = 0.0f;
          for (int v = 0; v < cfg_.vocab; ++v) acc += d[v] * w[sz(v * h + k)];
          dy[sz(t * h + k)] = acc;
        }
      }
    } else {
      std::memcpy(dy.data(), dout.data, dout.bytes());
    }
    for (std::size_t l = nb; l-- > 0;) {
      std::copy(dy.begin(), dy.end(), st.dy.begin() + static_cast<std::ptrdiff_t>(l * nh));
      ch.blocks[l].backward_input(st.a.data() + l * nf, dy.data(), n, st.dz.data() + l * nf,
                                  dx.data());
      std::swap(dy, dx);
    }
    if (ch.embedding)
      std::copy(dy.begin(), dy.end(), st.dembed.begin());  // the embedding's W scatters it
    else
      std::memcpy(din.data, dy.data(), din.bytes());
  }

  void backward_weight(pl::stage_call const& c) {
    auto& ch = chunks_[sz(c.chunk)];
    auto& st = ch.slots[sz(c.slot)];
    int const n = cfg_.tokens, h = cfg_.hidden;
    std::size_t const nb = ch.blocks.size(), nh = activation_count(), nf = sz(n * cfg_.ffn);
    for (std::size_t l = 0; l < nb; ++l)
      ch.blocks[l].backward_weight(st.x.data() + l * nh, st.a.data() + l * nf,
                                   st.dy.data() + l * nh, st.dz.data() + l * nf, n);
    if (ch.output) {
      float const* y = st.x.data() + nb * nh;
      for (int t = 0; t < n; ++t)
        for (int v = 0; v < cfg_.vocab; ++v) {
          float const d = st.dlogits[sz(t * cfg_.vocab + v)];
          for (int k = 0; k < h; ++k) ch.output->grad[sz(v * h + k)] += d * y[t * h + k];
        }
    }
    if (ch.embedding) {
      auto const& ids = batch_->ids[sz(c.microbatch)];
      for (int t = 0; t < n; ++t)
        for (int k = 0; k < h; ++k)
          ch.embedding->grad[sz(ids[sz(t)] * h + k)] += st.dembed[sz(t * h + k)];
    }
  }

 private:
  //! What forward keeps for backward (x, a), and what I keeps for W (dy, dz, dembed, dlogits).
  struct stash {
    std::vector<float> x;        //!< (blocks + 1) x n x h: each block's input, then the output
    std::vector<float> a;        //!< blocks x n x f: tanh activations
    std::vector<float> dy;       //!< blocks x n x h: gradient of each block's output
    std::vector<float> dz;       //!< blocks x n x f: gradient of each block's pre-activation
    std::vector<float> dembed;   //!< n x h on stage 0: gradient of the embedding's output
    std::vector<float> dlogits;  //!< n x V on the last stage: gradient of the logits
  };
  struct chunk_state {
    int stage = -1;
    std::optional<parameter> embedding;  //!< V x h, plain stage 0
    std::vector<mlp_block> blocks;
    std::optional<parameter> output;  //!< V x h, plain last stage
    std::vector<stash> slots;
  };

  std::size_t activation_count() const { return sz(cfg_.tokens * cfg_.hidden); }

  model_config cfg_;
  int stages_ = 0;
  bool vocab_parallel_ = false;
  std::vector<chunk_state> chunks_;
  // Scratch for one call at a time: the executor calls a rank's stage from one thread.
  std::vector<float> logits_, dy_, dx_;
  batch const* batch_ = nullptr;
};
static_assert(pl::Stage<model_stage>);

//! Rows [lo, hi) = [r V/p, (r+1) V/p) of the embedding and of the output layer on rank r, with
//! the passes the vocabulary-balanced schedules run on every rank (stage.hpp's VocabShard): IF
//! and IB for the embedding, S and T for the output layer. The executor combines the shards'
//! softmax statistics (C0) and computes the loss; the shard never sees the other rows.
class vocab_shard {
 public:
  using vocab_concept = pl::vocab_tag;

  vocab_shard(model_config const& cfg, int rank, int ranks)
      : cfg_(cfg),
        lo_(rank * cfg.vocab / ranks),
        hi_((rank + 1) * cfg.vocab / ranks),
        y_(sz(hi_ - lo_)) {
    auto const h = sz(cfg.hidden), first = sz(lo_) * h, count = sz(hi_ - lo_) * h;
    // The same streams and global element indices as the unsharded tables in model_stage.
    embedding_ = parameter(cfg, embedding_stream, first, count, 1.0f);
    output_ = parameter(cfg, output_stream, first, count,
                        std::sqrt(3.0f / static_cast<float>(cfg.hidden)));
  }

  void set_batch(batch const* b) { batch_ = b; }
  std::vector<parameter*> parameters() { return {&embedding_, &output_}; }

  std::size_t tokens(pl::stage_call const&) const { return sz(cfg_.tokens); }
  std::size_t hidden() const { return sz(cfg_.hidden); }

  //! IF: the embedding rows of the ids this shard owns, zeros elsewhere (RE sums the shards).
  void input_forward(pl::stage_call const& c, weft::comm::buffer_view partial) {
    auto* out = static_cast<float*>(partial.data);
    auto const& ids = batch_->ids[sz(c.microbatch)];
    int const h = cfg_.hidden;
    for (int t = 0; t < cfg_.tokens; ++t) {
      int const id = ids[sz(t)];
      for (int k = 0; k < h; ++k)
        out[t * h + k] = owns(id) ? embedding_.value[sz((id - lo_) * h + k)] : 0.0f;
    }
  }

  //! IB: `grad` is stage 0's input gradient (BE); scatter-add it into the owned rows.
  void input_backward(pl::stage_call const& c, weft::comm::buffer_view grad) {
    auto const* g = static_cast<float const*>(grad.data);
    auto const& ids = batch_->ids[sz(c.microbatch)];
    int const h = cfg_.hidden;
    for (int t = 0; t < cfg_.tokens; ++t) {
      int const id = ids[sz(t)];
      if (!owns(id)) continue;
      for (int k = 0; k < h; ++k) embedding_.grad[sz((id - lo_) * h + k)] += g[t * h + k];
    }
  }

  //! S: per token, this shard's max logit, sum of exp(logit - max), the target's logit where
  //! owned (0 elsewhere) and, for the one-barrier schedule, G = sum_v exp(y_v - max) W_v and
  //! H = W_target (0 where not owned), from which C0 builds the input gradient G/s - H.
  void output_forward(pl::stage_call const& c, weft::comm::buffer_view xv,
                      weft::comm::buffer_view stats) {
    auto const* x = static_cast<float const*>(xv.data);
    auto* st = static_cast<float*>(stats.data);
    auto const& targets = batch_->targets[sz(c.microbatch)];
    int const n = cfg_.tokens, h = cfg_.hidden, rows = hi_ - lo_;
    bool const one_barrier = stats.count == sz(3 * n + 2 * n * h);
    auto& y = y_;
    for (int t = 0; t < n; ++t) {
      logits_of(x + t * h, output_.value, rows, h, y.data());
      float const mx = *std::max_element(y.begin(), y.end());
      float s = 0.0f;
      for (float v : y) s += std::exp(v - mx);
      int const target = targets[sz(t)];
      st[t] = mx;
      st[n + t] = s;
      st[2 * n + t] = owns(target) ? y[sz(target - lo_)] : 0.0f;
      if (!one_barrier) continue;
      float* gt = st + 3 * n + t * h;
      float* ht = st + 3 * n + n * h + t * h;
      for (int k = 0; k < h; ++k) {
        float acc = 0.0f;
        for (int v = 0; v < rows; ++v)
          acc += std::exp(y[sz(v)] - mx) * output_.value[sz(v * h + k)];
        gt[k] = acc;
        ht[k] = owns(target) ? output_.value[sz((target - lo_) * h + k)] : 0.0f;
      }
    }
  }

  //! T: with the global max and sum of exponentials, adds sum_t g_t (softmax_tv - onehot_tv) x_t
  //! to the owned rows' gradient; for the two-barrier schedule also writes this shard's part of
  //! the input gradient, dx_t = g_t sum_v (softmax_tv - onehot_tv) W_v (C1 sums the shards).
  void output_backward(pl::stage_call const& c, weft::comm::buffer_view xv,
                       weft::comm::buffer_view gv, weft::comm::buffer_view maxv,
                       weft::comm::buffer_view sumv, weft::comm::buffer_view dxv) {
    auto const* x = static_cast<float const*>(xv.data);
    auto const* g = static_cast<float const*>(gv.data);
    auto const* mx = static_cast<float const*>(maxv.data);
    auto const* sum = static_cast<float const*>(sumv.data);
    auto* dx = dxv.empty() ? nullptr : static_cast<float*>(dxv.data);
    auto const& targets = batch_->targets[sz(c.microbatch)];
    int const n = cfg_.tokens, h = cfg_.hidden, rows = hi_ - lo_;
    auto& y = y_;
    for (int t = 0; t < n; ++t) {
      logits_of(x + t * h, output_.value, rows, h, y.data());
      if (dx != nullptr) std::fill_n(dx + t * h, h, 0.0f);
      for (int v = 0; v < rows; ++v) {
        float const d = g[t] * (std::exp(y[sz(v)] - mx[t]) / sum[t] -
                                (v + lo_ == targets[sz(t)] ? 1.0f : 0.0f));
        for (int k = 0; k < h; ++k) {
          output_.grad[sz(v * h + k)] += d * x[t * h + k];
          if (dx != nullptr) dx[t * h + k] += d * output_.value[sz(v * h + k)];
        }
      }
    }
  }

 private:
  bool owns(int id) const { return id >= lo_ && id < hi_; }

  model_config cfg_;
  int lo_ = 0, hi_ = 0;
  parameter embedding_, output_;  // rows [lo, hi), row-major (hi - lo) x h
  std::vector<float> y_;          // one token's logits over the shard
  batch const* batch_ = nullptr;
};
static_assert(pl::VocabShard<vocab_shard>);

}  // namespace pipeline_train
