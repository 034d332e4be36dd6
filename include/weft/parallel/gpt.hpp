// weft/parallel/gpt.hpp — nn::gpt sharded over a tensor-parallel group (Megatron's layout:
// vocabulary-parallel embedding and output layer, column-parallel Q/K/V and MLP-in, row-parallel
// attention-out and MLP-out, optional sequence parallelism around the norms and residuals) and a
// context-parallel group (each sequence split in zigzag chunks, attention by ring attention).
// Its loss and gradients are nn::gpt's on the whole batch; data parallelism is the caller's
// gradient reduction over the data group (dp × cp), see reduce_gpt_grads. The parameters' split
// (gpt_parallelism, gpt_shard_layout, gpt_init_shard, gpt_load_shard) is gpt_shard.hpp's.
#pragma once

#include <weft/attention/ring.hpp>
#include <weft/attention/sharding.hpp>
#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/random.hpp>
#include <weft/core/tensor.hpp>
#include <weft/nn/activation.hpp>
#include <weft/nn/attention.hpp>
#include <weft/nn/embedding.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/nn/linear.hpp>
#include <weft/nn/norm.hpp>
#include <weft/nn/params.hpp>
#include <weft/nn/residual.hpp>
#include <weft/optim/param.hpp>
#include <weft/parallel/gpt_shard.hpp>
#include <weft/parallel/linear.hpp>
#include <weft/parallel/mappings.hpp>
#include <weft/parallel/sharding.hpp>
#include <weft/parallel/vocab.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::parallel {

//! A data-parallel rank's batch: `tokens` and `targets` [sequences × seq_len], row-major, the same
//! on every tp and cp rank; sequence n is rows [n·seq_len, (n+1)·seq_len) at positions 0..seq_len-1
//! (nn::gpt_batch with cu_seqlens {0, S, 2S, ...}); target -1 means no loss at that token.
struct gpt_sequences {
  std::span<std::int32_t const> tokens;
  std::span<std::int32_t const> targets;
  index_t seq_len = 0;
};

//! nn::gpt over a tensor-parallel group `tp` and a context-parallel group `cp` (a group of size 1
//! for either means none). The store is laid out by gpt_shard_layout(config, parallelism) with
//! parallelism's tp, tp_rank, cp and cp_rank those of the groups. forward() and backward() are
//! collective over tp (all-reduce / all-gather / reduce-scatter) and cp (ring attention's
//! point-to-point); every rank of both calls them in the same order with the same batch.
//!
//! Rows: cp rank s holds, of every sequence, the tokens seq_layout::zigzag(cp, S) gives it, in
//! that order (its c = S/cp rows of sequence 0, then of sequence 1, ...): N = sequences·c rows.
//! Under sequence parallelism tp rank r holds rows [r·N/tp, (r+1)·N/tp) of those between the
//! tensor-parallel layers.
//!
//! After backward() a rank's gradients are partial sums: call reduce_gpt_grads (or sum the
//! sequence-parallel ones over tp and reduce all over the data group dp × cp yourself) before the
//! optimizer. Activations are T (float or double), statistics compute_t<T>.
template <class T, comm::CollectiveIn<host_space> TP, comm::PointToPointIn<host_space> CP>
class gpt {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::parallel::gpt<T>: T must be float or double");
  using C = compute_t<T>;

 public:
  gpt(nn::gpt_config const& config, bool sequence_parallel, TP& tp, CP& cp,
      nn::param_store<T>& store)
      : gpt(config, gpt_parallelism{tp.size(), tp.rank(), sequence_parallel, cp.size(), cp.rank()},
            tp, cp, store) {}

  //! One pipeline stage of the model (parallelism.pp > 1; see forward_stage): parallelism's tp,
  //! tp_rank, cp and cp_rank must be those of the groups, and the store laid out by
  //! gpt_shard_layout(config, parallelism), which holds this stage's parameters only.
  gpt(nn::gpt_config const& config, gpt_parallelism const& parallelism, TP& tp, CP& cp,
      nn::param_store<T>& store)
      : c_(config),
        p_(parallelism),
        tp_(&tp),
        cp_(&cp),
        store_(&store),
        shard_(rl::vocab_shard::even(config.vocab, tp.size(), tp.rank())) {
    WEFT_EXPECTS(p_.tp == tp.size() && p_.tp_rank == tp.rank(), "parallelism.tp, tp_rank",
                 ::weft::detail::concat(tp.size(), ", ", tp.rank(), " (the tp group's)"),
                 ::weft::detail::concat(p_.tp, ", ", p_.tp_rank));
    WEFT_EXPECTS(p_.cp == cp.size() && p_.cp_rank == cp.rank(), "parallelism.cp, cp_rank",
                 ::weft::detail::concat(cp.size(), ", ", cp.rank(), " (the cp group's)"),
                 ::weft::detail::concat(p_.cp, ", ", p_.cp_rank));
    nn::detail::expect_layout(store.layout(), gpt_shard_layout(c_, p_),
                              "gpt_shard_layout(config, parallelism)");
    layers_ = gpt_stage_layers(c_.layers, p_.pp, p_.pp_rank);
  }

  [[nodiscard]] nn::gpt_config const& config() const noexcept { return c_; }
  [[nodiscard]] gpt_parallelism const& parallelism() const noexcept { return p_; }
  [[nodiscard]] rl::vocab_shard const& vocab_shard() const noexcept { return shard_; }

  //! The rows of the last forward: global token index (n·S + position) of each local row.
  [[nodiscard]] std::span<std::int64_t const> rows() const noexcept { return global_rows_; }

  //! A loss on the log-probabilities of the targets, for objectives other than cross-entropy (a
  //! policy-gradient loss): called by the last stage's forward with this rank's rows (their
  //! global token indices, as rows()) and logp[k] = log softmax(logits_k)[target_k] (0 where the
  //! target is -1), all computed over the whole vocabulary across tp; returns the loss and writes
  //! dlogp[k] = d loss / d logp[k] (read only where the target is >= 0), which seeds backward. It
  //! is called on every tp rank with the same values. The token weight of forward is then unused.
  using token_loss_fn = std::function<double(
      std::span<std::int64_t const> rows, std::span<double const> logp, std::span<double> dlogp)>;

  //! Sets the token loss of the following forwards (empty: the weighted cross-entropy).
  void set_token_loss(token_loss_fn fn) { token_loss_ = std::move(fn); }

  //! The blocks this rank's pipeline stage holds (all of them without pipeline parallelism).
  [[nodiscard]] gpt_layer_range layers() const noexcept { return layers_; }

  //! Elements of the activation a pipeline stage sends to the next (and of its gradient) for a
  //! microbatch of `sequences` sequences of `seq_len` tokens: this rank's rows (sequences ·
  //! seq_len / cp, divided by tp under sequence parallelism) × d_model, in forward's row order.
  [[nodiscard]] std::size_t boundary_size(index_t sequences, index_t seq_len) const noexcept {
    index_t const rows = sequences * seq_len / p_.cp / (p_.sequence_parallel ? p_.tp : 1);
    return static_cast<std::size_t>(rows * c_.d_model);
  }
  //! Under vocab_pipeline: the elements of the first stage's input (the token embeddings) and of
  //! the last stage's output (the final norm's), the vocabulary passes' n x d_model: all of the
  //! rank's N rows, under sequence parallelism too. There the first stage keeps its token slice
  //! and writes the all-gathered slices' gradient to `din`; the last all-gathers the final norm's
  //! slices and takes its slice of `dout`. Neither gradient is a reduce-scatter: every tp rank's
  //! gpt_vocab_shard sees the same N rows and has already summed their gradients over tp (IF's
  //! and T's all-reduces), so `dout` and the embeddings' gradient are whole on every tp rank.
  [[nodiscard]] std::size_t vocab_boundary_size(index_t sequences, index_t seq_len) const noexcept {
    return static_cast<std::size_t>(sequences * seq_len / p_.cp * c_.d_model);
  }

  //! Σ token_weight · CE over THIS rank's rows with a target (the same on every tp rank; sum it
  //! over cp and dp for the batch's loss). token_weight 0 means 1 / (targets in `b`), the mean
  //! over this data-parallel rank's batch; a data-parallel step passes 1 / (targets over all dp
  //! ranks). The whole model only (pp = 1; a pipeline stage runs forward_stage).
  double forward(gpt_sequences const& b, double token_weight = 0.0) {
    WEFT_EXPECTS(p_.pp == 1, "parallelism.pp", "1 for forward() (a pipeline stage: forward_stage)",
                 p_.pp);
    WEFT_EXPECTS(!p_.vocab_pipeline, "parallelism.vocab_pipeline",
                 "false for forward() (the embedding and head are gpt_vocab_shard's: "
                 "forward_stage)",
                 "true");
    prepare(b, token_weight > 0.0 ? token_weight : mean_weight(b));
    return run_forward({}, {});
  }

  //! One pipeline stage's forward of microbatch `b` (every stage is given the same sequences:
  //! the first reads the tokens, the last the targets, all the shapes). The first stage embeds
  //! the tokens (under vocab_pipeline it reads their embeddings from `in`, vocab_boundary_size
  //! elements), the others read the previous stage's activation from `in` (boundary_size
  //! elements); every stage runs its blocks; the last returns Σ token_weight · CE over this rank's
  //! rows (token_weight taken as is: the pipeline's loss weight), the others write their output
  //! activation to `out` (boundary_size elements) and return 0. `in` must stay unchanged until
  //! backward_stage returns; the model holds one microbatch's activations (one instance per
  //! microbatch in flight, over the same store: see gpt_pipeline_stage).
  double forward_stage(gpt_sequences const& b, double token_weight, std::span<T const> in,
                       std::span<T> out) {
    expect_no_pending("forward_stage");
    prepare(b, token_weight);
    bool const vp = p_.vocab_pipeline;
    if (!p_.first_stage() || vp) expect_boundary(in.size(), p_.first_stage(), "in");
    if (!p_.last_stage() || vp) expect_boundary(out.size(), p_.last_stage(), "out");
    return run_forward(in, out);
  }

  //! Accumulates this rank's part of the gradient of the last forward_stage's weighted loss: the
  //! last stage seeds it from the loss, the others read the gradient of their output from `dout`;
  //! every stage but the first writes the gradient of its input to `din` (boundary_size each;
  //! under vocab_pipeline the last stage reads `dout` and the first writes `din` too, both
  //! vocab_boundary_size).
  void backward_stage(std::span<T const> dout, std::span<T> din) {
    if (!defer_) expect_no_pending("backward_stage");
    bool const vp = p_.vocab_pipeline;
    if (!p_.last_stage() || vp) expect_boundary(dout.size(), p_.last_stage(), "dout");
    if (!p_.first_stage() || vp) expect_boundary(din.size(), p_.first_stage(), "din");
    run_backward(dout, din);
  }

  //! backward_stage in two parts, as the zero-bubble schedules split it: backward_input_stage
  //! computes the input gradient (`din`, as backward_stage) and keeps what the weight gradients
  //! need (a copy of each layer's output gradient; the activations stay the model's until the
  //! next forward); backward_weight_stage then accumulates every weight gradient into the store.
  //! Together they make backward_stage's gradients bit for bit (the same calls on the same
  //! values). All of the backward's collectives run in backward_input_stage, none in
  //! backward_weight_stage. invalid_argument_error for backward_weight_stage without a pending
  //! backward_input_stage, and for a forward_stage or another backward while one is pending.
  void backward_input_stage(std::span<T const> dout, std::span<T> din) {
    expect_no_pending("backward_input_stage");
    defer_ = true;
    try {
      backward_stage(dout, din);
    } catch (...) {
      defer_ = false;
      deferred_.clear();
      throw;
    }
    defer_ = false;
    pending_ = true;
  }
  void backward_weight_stage() {
    WEFT_EXPECTS(pending_, "backward_weight_stage", "a backward_input_stage before it",
                 "none pending");
    pending_ = false;
    auto work = std::move(deferred_);
    deferred_.clear();
    for (auto& f : work) f();
  }

  //! Accumulates this rank's part of the gradient of the last forward's weighted loss.
  void backward() {
    WEFT_EXPECTS(p_.pp == 1, "parallelism.pp",
                 "1 for backward() (a pipeline stage: backward_stage)", p_.pp);
    run_backward({}, {});
  }

 private:
  // A boundary buffer of the loaded microbatch: boundary_size, or vocab_boundary_size where
  // `vocab_end` (the first stage's input or the last stage's output under vocab_pipeline).
  void expect_boundary(std::size_t got, bool vocab_end, char const* what) const {
    bool const v = vocab_end && p_.vocab_pipeline;
    auto const want = static_cast<std::size_t>((v ? n_ : m_) * c_.d_model);
    WEFT_EXPECTS_SHAPE(got == want, what,
                       ::weft::detail::concat(want, v ? " elements (vocab_boundary_size)"
                                                      : " elements (boundary_size)"),
                       got);
  }

  void expect_no_pending(char const* call) const {
    WEFT_EXPECTS(!pending_, call, "no pending weight gradients (backward_weight_stage first)",
                 "a backward_input_stage without its backward_weight_stage");
  }

  // A weight-gradient computation `f(scratch)`: now, or while backward_input_stage defers them,
  // later on `saved`, a copy of `scratch` (a buffer the rest of the backward overwrites).
  template <class F>
  void weight_grad(std::vector<T>& scratch, std::vector<T>& saved, F f) {
    if (!defer_) {
      f(scratch);
      return;
    }
    saved.assign(scratch.begin(), scratch.end());
    deferred_.emplace_back([f = std::move(f), &saved]() mutable { f(saved); });
  }

  double run_forward(std::span<T const> in, std::span<T> out) {
    index_t const d = c_.d_model;
    bool const sp = p_.sequence_parallel;
    auto x0 = rows_of(x_[0], d);
    if (p_.first_stage()) {
      // Embeddings. Under SP the vocabulary-parallel lookup is reduce-scattered straight to the
      // token slices and each rank adds the positions of its own rows. Under vocab_pipeline the
      // token embeddings arrive in `in` (gpt_vocab_shard's, summed over tp and the pipeline).
      if (p_.vocab_pipeline) {  // all N rows; under SP this rank's slice of them
        auto const first = sp ? static_cast<std::size_t>(p_.tp_rank * m_ * d) : std::size_t{0};
        std::copy_n(in.begin() + static_cast<std::ptrdiff_t>(first), m_ * d, x0.data_handle());
      } else if (sp) {
        vocab_parallel_embedding_forward_sp(*tp_, std::span<std::int32_t const>(tokens_), shard_,
                                            p2("wte"), x0);
      } else {
        vocab_parallel_embedding_forward(*tp_, std::span<std::int32_t const>(tokens_), shard_,
                                         p2("wte"), x0);
      }
      nn::embedding_forward(slice_positions(), p2("wpe"), rows_of(tmp_m_, d));
      nn::residual_forward(x0, rows_of(tmp_m_, d), x0);
    } else {
      std::copy(in.begin(), in.end(), x_[0].begin());
    }
    for (index_t l = 0; l < layers_.size(); ++l) block_forward(l);
    auto& last = x_[static_cast<std::size_t>(layers_.size())];
    if (!p_.last_stage()) {
      std::copy(last.begin(), last.end(), out.begin());
      return 0.0;
    }
    nn::layer_norm_forward(rows_of(last, d), p1("lnf.w"), p1("lnf.b"), rows_of(lnf_, d),
                           vec(lnf_mean_), vec(lnf_rstd_), c_.ln_eps);
    if (p_.vocab_pipeline) {  // the output layer is gpt_vocab_shard's: all N rows
      if (sp)
        gather_from_sp_forward(*tp_, tensor_view<T const, 2>(rows_of(lnf_, d)),
                               tensor_view<T, 2>(out.data(), n_, d));
      else
        std::copy(lnf_.begin(), lnf_.end(), out.begin());
      return 0.0;
    }
    index_t const vs = shard_.size;
    if (sp) {
      vocab_parallel_output_forward_sp(*tp_, rows_of(lnf_, d), p2("head"), rows_of(lnf_total_, d),
                                       rows_of(logits_, vs));
    } else {
      vocab_parallel_output_forward(*tp_, rows_of(lnf_, d), p2("head"), rows_of(logits_, vs));
    }
    rl::logprob_options opt;
    opt.ignore_index = -1;
    std::vector<C> losses(static_cast<std::size_t>(n_));
    vocab_parallel_cross_entropy_forward(*tp_, rows_of(logits_, vs), shard_,
                                         std::span<std::int32_t const>(targets_),
                                         std::span<C>(losses), std::span<C>(ce_lse_), opt);
    if (token_loss_) {
      tl_logp_.assign(losses.size(), 0.0);
      tl_dlogp_.assign(losses.size(), 0.0);
      for (std::size_t k = 0; k < losses.size(); ++k)
        if (targets_[k] >= 0) tl_logp_[k] = -static_cast<double>(losses[k]);
      return token_loss_(std::span<std::int64_t const>(global_rows_),
                         std::span<double const>(tl_logp_), std::span<double>(tl_dlogp_));
    }
    tl_dlogp_.clear();
    double sum = 0.0;
    for (std::size_t k = 0; k < losses.size(); ++k)
      if (targets_[k] >= 0) sum += weight_ * static_cast<double>(losses[k]);
    return sum;
  }

  void run_backward(std::span<T const> dout, std::span<T> din) {
    index_t const d = c_.d_model;
    bool const sp = p_.sequence_parallel;
    auto& dx = g_.dx;
    if (p_.last_stage() && p_.vocab_pipeline) {  // dout: all N rows (this slice's under SP)
      auto const first = sp ? static_cast<std::size_t>(p_.tp_rank * m_ * d) : std::size_t{0};
      std::copy_n(dout.begin() + static_cast<std::ptrdiff_t>(first), m_ * d, g_.dln.begin());
      final_norm_backward();
    } else if (p_.last_stage()) {
      head_backward();
    } else {
      std::copy(dout.begin(), dout.end(), dx.begin());
    }
    for (index_t l = layers_.size() - 1; l >= 0; --l) block_backward(l, dx);
    if (!p_.first_stage()) {
      std::copy(dx.begin(), dx.end(), din.begin());
      return;
    }
    if (p_.vocab_pipeline && sp) {  // the N rows' gradient: the slices all-gathered
      gather_from_sp_forward(*tp_, tensor_view<T const, 2>(rows_of(dx, d)),
                             tensor_view<T, 2>(din.data(), n_, d));
    } else if (p_.vocab_pipeline) {
      std::copy(dx.begin(), dx.end(), din.begin());
    }
    auto const tokens = std::span<std::int32_t const>(tokens_);
    if (p_.vocab_pipeline) {
      // The token embeddings' gradient is din, gpt_vocab_shard's: only the positions here.
    } else if (sp && !defer_) {
      vocab_parallel_embedding_backward_sp(*tp_, tokens, shard_, rows_of(dx, d), g2("wte"));
    } else if (sp) {
      // The same two steps, the all-gather (collective) now and the scatter-add deferred.
      reduce_scatter_to_sp_backward(*tp_, tensor_view<T const, 2>(rows_of(dx, d)),
                                    rows_of(g_.full, d));
      weight_grad(g_.full, w_.wte, [this, tokens, d](std::vector<T>& full) {
        vocab_parallel_embedding_backward(tokens, shard_, rows_of(full, d), g2("wte"));
      });
    } else {
      weight_grad(dx, w_.wte, [this, tokens, d](std::vector<T>& g) {
        vocab_parallel_embedding_backward(tokens, shard_, rows_of(g, d), g2("wte"));
      });
    }
    weight_grad(dx, w_.wpe, [this, d](std::vector<T>& g) {
      nn::embedding_backward(slice_positions(), rows_of(g, d), g2("wpe"));
    });
  }

  // The last stage's backward from the loss to d(last block's output) in g_.dx.
  void head_backward() {
    index_t const d = c_.d_model, vs = shard_.size;
    bool const sp = p_.sequence_parallel;
    rl::logprob_options opt;
    opt.ignore_index = -1;
    std::vector<C> dloss(static_cast<std::size_t>(n_));
    // d loss / d CE_k: the token weight, or -d loss / d logp_k under a token loss (CE = -logp).
    bool const custom = !tl_dlogp_.empty();
    for (std::size_t k = 0; k < dloss.size(); ++k)
      dloss[k] = targets_[k] < 0 ? C(0)
                 : custom        ? static_cast<C>(-tl_dlogp_[k])
                                 : static_cast<C>(weight_);
    auto& dlogits = g_.dlogits;
    vocab_parallel_cross_entropy_backward(
        rows_of(logits_, vs), shard_, std::span<std::int32_t const>(targets_),
        std::span<C const>(ce_lse_), std::span<C const>(dloss), rows_of(dlogits, vs), opt);
    auto& dln = g_.dln;
    if (sp) {
      vocab_parallel_output_backward_input_sp(*tp_, rows_of(dlogits, vs), p2("head"),
                                              rows_of(dln, d));
    } else {
      vocab_parallel_output_backward_input(*tp_, rows_of(dlogits, vs), p2("head"), rows_of(dln, d));
    }
    weight_grad(dlogits, w_.dlogits, [this, d, vs, sp](std::vector<T>& g) {
      vocab_parallel_output_backward_weight(
          rows_of(g, vs), sp ? rows_of(lnf_total_, d) : rows_of(lnf_, d), g2("head"));
    });
    final_norm_backward();
  }

  // From d(final norm's output) in g_.dln to d(last block's output) in g_.dx.
  void final_norm_backward() {
    index_t const d = c_.d_model;
    auto& dln = g_.dln;
    auto& dx = g_.dx;
    auto& last = x_[static_cast<std::size_t>(layers_.size())];
    nn::layer_norm_backward_input(rows_of(dln, d), rows_of(last, d), p1("lnf.w"), vec(lnf_mean_),
                                  vec(lnf_rstd_), rows_of(dx, d));
    weight_grad(dln, w_.dlnf, [this, d, &last](std::vector<T>& g) {
      nn::layer_norm_backward_weight(rows_of(g, d), rows_of(last, d), vec(lnf_mean_),
                                     vec(lnf_rstd_), g1("lnf.w"), g1("lnf.b"));
    });
  }

  struct layer_acts {
    // ln1, x_mid, ln2 [m, d] (m: the rank's token slice under SP, else N); ln1_total and
    // ln2_total [N, d] (the gathered norm outputs under SP; unused otherwise); q [N, d/tp],
    // k, v [N, kvd/tp], o [N, d/tp]; fc, act [N, h/tp].
    std::vector<T> ln1, ln1_total, q, k, v, o, x_mid, ln2, ln2_total, fc, act;
    std::vector<C> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, lse;
  };

  // 1 / (targets in b): forward()'s default weight.
  static double mean_weight(gpt_sequences const& b) {
    index_t counted = 0;
    for (auto t : b.targets) counted += t >= 0 ? 1 : 0;
    return counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0;
  }

  void prepare(gpt_sequences const& b, double token_weight) {
    index_t const s = b.seq_len;
    WEFT_EXPECTS_SHAPE(s > 0 && s <= c_.context, "seq_len",
                       ::weft::detail::concat("in [1, context = ", c_.context, "]"), s);
    auto const total = static_cast<index_t>(b.tokens.size());
    WEFT_EXPECTS_SHAPE(total % s == 0, "tokens",
                       ::weft::detail::concat("a multiple of seq_len = ", s, " elements"), total);
    WEFT_EXPECTS_SHAPE(static_cast<index_t>(b.targets.size()) == total, "targets",
                       ::weft::detail::concat(total, " elements (as tokens)"), b.targets.size());
    if (p_.cp > 1)
      WEFT_EXPECTS_SHAPE(s % (2 * p_.cp) == 0, "seq_len",
                         ::weft::detail::concat("a multiple of 2 * cp = ", 2 * p_.cp,
                                                " (two zigzag chunks per cp rank)"),
                         s);
    index_t const seqs = total / s, c = s / p_.cp;
    n_ = seqs * c;
    if (p_.sequence_parallel)
      WEFT_EXPECTS_SHAPE(n_ % p_.tp == 0, "tokens",
                         ::weft::detail::concat("sequences * seq_len / cp a multiple of tp = ",
                                                p_.tp, " under sequence parallelism"),
                         ::weft::detail::concat(seqs, " * ", s, " / ", p_.cp, " = ", n_));
    m_ = p_.sequence_parallel ? n_ / p_.tp : n_;
    for (index_t k = 0; k < total; ++k) {
      WEFT_EXPECTS(b.tokens[static_cast<std::size_t>(k)] >= 0 &&
                       b.tokens[static_cast<std::size_t>(k)] < c_.vocab,
                   ::weft::detail::concat("tokens[", k, "]"),
                   ::weft::detail::concat("in [0, ", c_.vocab, ")"),
                   b.tokens[static_cast<std::size_t>(k)]);
      WEFT_EXPECTS(b.targets[static_cast<std::size_t>(k)] >= -1 &&
                       b.targets[static_cast<std::size_t>(k)] < c_.vocab,
                   ::weft::detail::concat("targets[", k, "]"),
                   ::weft::detail::concat("-1 (ignored) or in [0, ", c_.vocab, ")"),
                   b.targets[static_cast<std::size_t>(k)]);
    }
    weight_ = token_weight;
    // This cp rank's rows, sequence by sequence.
    seq_ = s;
    seqs_ = seqs;
    tokens_.resize(static_cast<std::size_t>(n_));
    targets_.resize(tokens_.size());
    positions_.resize(tokens_.size());
    global_rows_.resize(tokens_.size());
    detail::for_each_cp_row(seqs, s, p_, [&](std::size_t row, std::size_t src, index_t pos) {
      tokens_[row] = b.tokens[src];
      targets_[row] = b.targets[src];
      positions_[row] = static_cast<std::int32_t>(pos);
      global_rows_[row] = static_cast<std::int64_t>(src);
    });
    cu_seqlens_.resize(static_cast<std::size_t>(seqs + 1));
    for (index_t n = 0; n <= seqs; ++n) cu_seqlens_[static_cast<std::size_t>(n)] = n * c;
    allocate();
  }

  void allocate() {
    auto const n = [&](index_t rows, index_t w) { return static_cast<std::size_t>(rows * w); };
    index_t const d = c_.d_model, tp = p_.tp;
    index_t const dl = d / tp, kvl = c_.kv() * c_.head_dim() / tp, hl = c_.hidden() / tp;
    bool const sp = p_.sequence_parallel;
    bool const last = p_.last_stage();
    x_.resize(static_cast<std::size_t>(layers_.size() + 1));
    for (auto& x : x_) x.resize(n(m_, d));
    tmp_m_.resize(n(m_, d));
    acts_.resize(static_cast<std::size_t>(layers_.size()));
    w_.layers.resize(acts_.size());
    for (auto& a : acts_) {
      a.ln1.resize(n(m_, d));
      a.ln1_total.resize(sp ? n(n_, d) : 0);
      a.q.resize(n(n_, dl));
      a.k.resize(n(n_, kvl));
      a.v.resize(n(n_, kvl));
      a.o.resize(n(n_, dl));
      a.x_mid.resize(n(m_, d));
      a.ln2.resize(n(m_, d));
      a.ln2_total.resize(sp ? n(n_, d) : 0);
      a.fc.resize(n(n_, hl));
      a.act.resize(n(n_, hl));
      a.ln1_mean.resize(n(m_, 1));
      a.ln1_rstd.resize(n(m_, 1));
      a.ln2_mean.resize(n(m_, 1));
      a.ln2_rstd.resize(n(m_, 1));
      a.lse.resize(n(n_, c_.heads / tp));
    }
    lnf_.resize(last ? n(m_, d) : 0);
    lnf_total_.resize(last && sp ? n(n_, d) : 0);
    lnf_mean_.resize(last ? n(m_, 1) : 0);
    lnf_rstd_.resize(last ? n(m_, 1) : 0);
    bool const head = last && !p_.vocab_pipeline;
    logits_.resize(head ? n(n_, shard_.size) : 0);
    ce_lse_.resize(head ? n(n_, 1) : 0);
    g_.dlogits.resize(logits_.size());
    for (auto* b : {&g_.dln, &g_.dx, &g_.dmid, &g_.tmp}) b->resize(n(m_, d));
    for (auto* b : {&g_.full, &g_.part, &g_.total}) b->resize(n(n_, d));
    g_.dact.resize(n(n_, hl));
    g_.dfc.resize(n(n_, hl));
    g_.dout.resize(n(n_, dl));
    g_.dq.resize(n(n_, dl));
    g_.dk.resize(n(n_, kvl));
    g_.dv.resize(n(n_, kvl));
  }

  //! The positions of the rows this rank holds between the tensor-parallel layers.
  [[nodiscard]] std::span<std::int32_t const> slice_positions() const noexcept {
    std::span<std::int32_t const> all(positions_);
    return p_.sequence_parallel ? all.subspan(static_cast<std::size_t>(p_.tp_rank * m_),
                                              static_cast<std::size_t>(m_))
                                : all;
  }

  // The GEMM input of the column-parallel layers after `ln` [m, d]: ln itself, or under SP the
  // all-gather of the slices into `total` [N, d].
  tensor_view<T, 2> column_input(std::vector<T>& ln, std::vector<T>& total) {
    index_t const d = c_.d_model;
    if (!p_.sequence_parallel) return rows_of(ln, d);
    gather_from_sp_forward(*tp_, tensor_view<T const, 2>(rows_of(ln, d)), rows_of(total, d));
    return rows_of(total, d);
  }

  // dx [N, d], the column-parallel layers' partial input gradient, back to the norm's rows: one
  // SUM all-reduce (dln = dx, [N, d]) or under SP one reduce-scatter into dln [m, d].
  void column_input_backward(std::vector<T>& full, std::vector<T>& dln) {
    index_t const d = c_.d_model;
    if (p_.sequence_parallel) {
      gather_from_sp_backward(*tp_, tensor_view<T const, 2>(rows_of(full, d)), rows_of(dln, d));
    } else {
      copy_to_tp_backward(*tp_, rows_of(full, d));
      std::copy(full.begin(), full.end(), dln.begin());
    }
  }

  // Row-parallel forward into y [m, d] (all-reduce, or reduce-scatter under SP).
  template <class X>
  void row_forward(X const& x, std::string const& w, std::string const& b, std::vector<T>& y) {
    index_t const d = c_.d_model;
    if (p_.sequence_parallel) {
      row_parallel_forward_sp(*tp_, x, p2(w), p1(b), rows_of(y, d));
    } else {
      row_parallel_forward(*tp_, x, p2(w), p1(b), rows_of(y, d));
    }
  }

  // Row-parallel backward from dy [m, d]: dx [N, in/tp] and the weight gradients.
  template <class X, class DX>
  void row_backward(std::vector<T>& dy, X const& x, std::string const& w, std::string const& b,
                    DX const& dx, std::vector<T>& saved) {
    index_t const d = c_.d_model;
    auto weight = [this, x, w, b, d](std::vector<T>& g) {
      row_parallel_backward_weight(rows_of(g, d), x, g2(w), g1(b));
    };
    if (p_.sequence_parallel) {
      auto& total = g_.total;
      row_parallel_backward_input_sp(*tp_, tensor_view<T const, 2>(rows_of(dy, d)), p2(w),
                                     rows_of(total, d), dx);
      weight_grad(total, saved, weight);
    } else {
      row_parallel_backward_input(*tp_, rows_of(dy, d), p2(w), dx);
      weight_grad(dy, saved, weight);
    }
  }

  void attention_forward(layer_acts& a) {
    auto const h = local_heads();
    index_t const dl = h.heads * h.head_dim, kvl = h.kv_heads * h.head_dim;
    tensor_view<C, 2> const lse(a.lse.data(), h.heads, n_);
    if (p_.cp == 1) {
      nn::causal_attention_forward(rows_of(a.q, dl), rows_of(a.k, kvl), rows_of(a.v, kvl),
                                   rows_of(a.o, dl), lse,
                                   std::span<std::int64_t const>(cu_seqlens_), h);
      return;
    }
    index_t const c = seq_ / p_.cp;
    attention::attention_options opt;
    opt.causal = attention::causal_mode::top_left;
    attention::ring_forward(*cp_, attention::seq_layout::zigzag(p_.cp, seq_), bshd(a.q, c, h.heads),
                            bshd(a.k, c, h.kv_heads), bshd(a.v, c, h.kv_heads),
                            bshd(a.o, c, h.heads), bhs(a.lse, c, h.heads), opt);
  }

  void attention_backward(layer_acts& a, std::vector<T>& dout, std::vector<T>& dq,
                          std::vector<T>& dk, std::vector<T>& dv) {
    auto const h = local_heads();
    index_t const dl = h.heads * h.head_dim, kvl = h.kv_heads * h.head_dim;
    if (p_.cp == 1) {
      nn::causal_attention_backward(
          rows_of(a.q, dl), rows_of(a.k, kvl), rows_of(a.v, kvl), rows_of(a.o, dl),
          tensor_view<C, 2>(a.lse.data(), h.heads, n_), rows_of(dout, dl), rows_of(dq, dl),
          rows_of(dk, kvl), rows_of(dv, kvl), std::span<std::int64_t const>(cu_seqlens_), h);
      return;
    }
    index_t const c = seq_ / p_.cp;
    attention::attention_options opt;
    opt.causal = attention::causal_mode::top_left;
    attention::ring_backward(*cp_, attention::seq_layout::zigzag(p_.cp, seq_),
                             bshd(a.q, c, h.heads), bshd(a.k, c, h.kv_heads),
                             bshd(a.v, c, h.kv_heads), bshd(a.o, c, h.heads),
                             bhs(a.lse, c, h.heads), bshd(dout, c, h.heads), bshd(dq, c, h.heads),
                             bshd(dk, c, h.kv_heads), bshd(dv, c, h.kv_heads), opt);
  }

  // Local block l of this stage (global block layers_.first + l).
  void block_forward(index_t l) {
    auto& a = acts_[static_cast<std::size_t>(l)];
    auto& x = x_[static_cast<std::size_t>(l)];
    auto& y = x_[static_cast<std::size_t>(l + 1)];
    index_t const d = c_.d_model, tp = p_.tp;
    index_t const dl = d / tp, kvl = c_.kv() * c_.head_dim() / tp, hl = c_.hidden() / tp;
    std::string const p = "h" + std::to_string(layers_.first + l) + ".";
    nn::layer_norm_forward(rows_of(x, d), p1(p + "ln1.w"), p1(p + "ln1.b"), rows_of(a.ln1, d),
                           vec(a.ln1_mean), vec(a.ln1_rstd), c_.ln_eps);
    auto const in1 = column_input(a.ln1, a.ln1_total);
    column_parallel_forward(*tp_, in1, p2(p + "q.w"), p1(p + "q.b"), rows_of(a.q, dl));
    column_parallel_forward(*tp_, in1, p2(p + "k.w"), p1(p + "k.b"), rows_of(a.k, kvl));
    column_parallel_forward(*tp_, in1, p2(p + "v.w"), p1(p + "v.b"), rows_of(a.v, kvl));
    attention_forward(a);
    row_forward(rows_of(a.o, dl), p + "o.w", p + "o.b", tmp_m_);
    nn::residual_forward(rows_of(x, d), rows_of(tmp_m_, d), rows_of(a.x_mid, d));
    nn::layer_norm_forward(rows_of(a.x_mid, d), p1(p + "ln2.w"), p1(p + "ln2.b"), rows_of(a.ln2, d),
                           vec(a.ln2_mean), vec(a.ln2_rstd), c_.ln_eps);
    auto const in2 = column_input(a.ln2, a.ln2_total);
    column_parallel_forward(*tp_, in2, p2(p + "fc.w"), p1(p + "fc.b"), rows_of(a.fc, hl));
    nn::gelu_forward(rows_of(a.fc, hl), rows_of(a.act, hl));
    row_forward(rows_of(a.act, hl), p + "proj.w", p + "proj.b", tmp_m_);
    nn::residual_forward(rows_of(a.x_mid, d), rows_of(tmp_m_, d), rows_of(y, d));
  }

  //! dx [m, d] holds d(block output) on entry and d(block input) on return.
  void block_backward(index_t l, std::vector<T>& dx) {
    auto& a = acts_[static_cast<std::size_t>(l)];
    auto& x = x_[static_cast<std::size_t>(l)];
    index_t const d = c_.d_model, tp = p_.tp;
    index_t const dl = d / tp, kvl = c_.kv() * c_.head_dim() / tp, hl = c_.hidden() / tp;
    bool const sp = p_.sequence_parallel;
    std::string const p = "h" + std::to_string(layers_.first + l) + ".";
    // Scratch kept across steps; every buffer is overwritten before it is read.
    auto& dact = g_.dact;
    auto& dfc = g_.dfc;
    auto& full = g_.full;
    auto& dln = g_.dln;
    auto& dmid = g_.dmid;
    auto& tmp = g_.tmp;
    auto& saved = w_.layers[static_cast<std::size_t>(l)];
    // MLP: y = x_mid + proj(gelu(fc(ln2(x_mid)))).
    row_backward(dx, rows_of(a.act, hl), p + "proj.w", p + "proj.b", rows_of(dact, hl), saved.proj);
    nn::gelu_backward(rows_of(a.fc, hl), rows_of(dact, hl), rows_of(dfc, hl));
    nn::linear_backward_input(rows_of(dfc, hl), p2(p + "fc.w"), rows_of(full, d));
    column_input_backward(full, dln);
    auto const in2 = sp ? rows_of(a.ln2_total, d) : rows_of(a.ln2, d);
    weight_grad(dfc, saved.fc, [this, in2, hl, p](std::vector<T>& g) {
      column_parallel_backward_weight(rows_of(g, hl), in2, g2(p + "fc.w"), g1(p + "fc.b"));
    });
    nn::layer_norm_backward_input(rows_of(dln, d), rows_of(a.x_mid, d), p1(p + "ln2.w"),
                                  vec(a.ln2_mean), vec(a.ln2_rstd), rows_of(tmp, d));
    weight_grad(dln, saved.ln2, [this, &a, d, p](std::vector<T>& g) {
      nn::layer_norm_backward_weight(rows_of(g, d), rows_of(a.x_mid, d), vec(a.ln2_mean),
                                     vec(a.ln2_rstd), g1(p + "ln2.w"), g1(p + "ln2.b"));
    });
    nn::residual_backward(rows_of(dx, d), rows_of(tmp, d), rows_of(dmid, d));
    // Attention: x_mid = x + o(attn(q(ln1 x), k(ln1 x), v(ln1 x))).
    auto& dout = g_.dout;
    auto& dq = g_.dq;
    auto& dk = g_.dk;
    auto& dv = g_.dv;
    row_backward(dmid, rows_of(a.o, dl), p + "o.w", p + "o.b", rows_of(dout, dl), saved.o);
    attention_backward(a, dout, dq, dk, dv);
    // The three column-parallel input gradients are summed locally, then reduced once.
    auto& part = g_.part;
    nn::linear_backward_input(rows_of(dq, dl), p2(p + "q.w"), rows_of(full, d));
    nn::linear_backward_input(rows_of(dk, kvl), p2(p + "k.w"), rows_of(part, d));
    nn::residual_forward(rows_of(full, d), rows_of(part, d), rows_of(full, d));
    nn::linear_backward_input(rows_of(dv, kvl), p2(p + "v.w"), rows_of(part, d));
    nn::residual_forward(rows_of(full, d), rows_of(part, d), rows_of(full, d));
    column_input_backward(full, dln);
    auto const in1 = sp ? rows_of(a.ln1_total, d) : rows_of(a.ln1, d);
    weight_grad(dq, saved.q, [this, in1, dl, p](std::vector<T>& g) {
      column_parallel_backward_weight(rows_of(g, dl), in1, g2(p + "q.w"), g1(p + "q.b"));
    });
    weight_grad(dk, saved.k, [this, in1, kvl, p](std::vector<T>& g) {
      column_parallel_backward_weight(rows_of(g, kvl), in1, g2(p + "k.w"), g1(p + "k.b"));
    });
    weight_grad(dv, saved.v, [this, in1, kvl, p](std::vector<T>& g) {
      column_parallel_backward_weight(rows_of(g, kvl), in1, g2(p + "v.w"), g1(p + "v.b"));
    });
    nn::layer_norm_backward_input(rows_of(dln, d), rows_of(x, d), p1(p + "ln1.w"), vec(a.ln1_mean),
                                  vec(a.ln1_rstd), rows_of(tmp, d));
    weight_grad(dln, saved.ln1, [this, &a, &x, d, p](std::vector<T>& g) {
      nn::layer_norm_backward_weight(rows_of(g, d), rows_of(x, d), vec(a.ln1_mean), vec(a.ln1_rstd),
                                     g1(p + "ln1.w"), g1(p + "ln1.b"));
    });
    nn::residual_backward(rows_of(dmid, d), rows_of(tmp, d), rows_of(dx, d));
  }

  [[nodiscard]] nn::attention_heads local_heads() const noexcept {
    return {c_.heads / p_.tp, c_.kv() / p_.tp, c_.head_dim(), 0.0};
  }
  template <class U>
  static tensor_view<U, 2> rows_of(std::vector<U>& v, index_t width) {
    return tensor_view<U, 2>(v.data(), static_cast<index_t>(v.size()) / width, width);
  }
  template <class U>
  static tensor_view<U, 1> vec(std::vector<U>& v) {
    return tensor_view<U, 1>(v.data(), static_cast<index_t>(v.size()));
  }
  // [sequences, c, heads, head_dim] over rows [sequences·c, heads·head_dim].
  tensor_view<T, 4> bshd(std::vector<T>& v, index_t c, index_t heads) const {
    return tensor_view<T, 4>(v.data(), seqs_, c, heads, c_.head_dim());
  }
  // [sequences, heads, c] lse: the ring layout. (The cp = 1 path uses [heads, N] over the same
  // buffer.)
  tensor_view<C, 3> bhs(std::vector<C>& v, index_t c, index_t heads) const {
    return tensor_view<C, 3>(v.data(), seqs_, heads, c);
  }
  tensor_view<T const, 2> p2(std::string const& n) const {
    return std::as_const(*store_).template param<2>(n);
  }
  tensor_view<T const, 1> p1(std::string const& n) const {
    return std::as_const(*store_).template param<1>(n);
  }
  tensor_view<T, 2> g2(std::string const& n) { return store_->template grad<2>(n); }
  tensor_view<T, 1> g1(std::string const& n) { return store_->template grad<1>(n); }

  nn::gpt_config c_;
  gpt_parallelism p_;
  TP* tp_;
  CP* cp_;
  nn::param_store<T>* store_;
  rl::vocab_shard shard_;
  double weight_ = 0.0;
  gpt_layer_range layers_;
  token_loss_fn token_loss_;
  std::vector<double> tl_logp_, tl_dlogp_;
  index_t seq_ = 0, seqs_ = 0, n_ = 0, m_ = 0;
  std::vector<std::int32_t> tokens_, targets_, positions_;
  std::vector<std::int64_t> global_rows_, cu_seqlens_;
  std::vector<std::vector<T>> x_;
  std::vector<T> tmp_m_, lnf_, lnf_total_, logits_;
  std::vector<C> lnf_mean_, lnf_rstd_, ce_lse_;
  std::vector<layer_acts> acts_;
  struct {
    std::vector<T> dlogits, dln, dx, dact, dfc, full, part, total, dmid, tmp, dout, dq, dk, dv;
  } g_;
  // backward_input_stage's copies of the output gradients the weight gradients read (each
  // layer's, the head's, the embeddings'), kept until backward_weight_stage; sized on first use.
  struct layer_saved {
    std::vector<T> proj, fc, ln2, o, q, k, v, ln1;
  };
  struct {
    std::vector<layer_saved> layers;
    std::vector<T> dlogits, dlnf, wte, wpe;
  } w_;
  std::vector<std::function<void()>> deferred_;
  bool defer_ = false;    // inside backward_input_stage: weight gradients go to deferred_
  bool pending_ = false;  // deferred_ waits for backward_weight_stage
};

//! The step's gradient from every rank's partial one, in place: the sequence-parallel parameters'
//! gradients summed over `tp` (nothing without SP), then every gradient summed over `data`, the
//! group of the ranks holding the same shard (dp × cp; the device_mesh's flattened {"dp", "cp"}
//! group, or either axis alone). Collective over both. For overlap with backward use grad_sync
//! over `data` instead of the second part.
template <comm::CollectiveIn<host_space> TP, comm::CollectiveIn<host_space> DATA, class T>
void reduce_gpt_grads(TP& tp, DATA& data, nn::param_store<T>& store) {
  auto const infos = store.layout().infos();
  sum_sequence_parallel_grads(tp, std::span<optim::param_info const>(infos), store.grads());
  if (data.size() > 1) comm::all_reduce(data, store.grads(), comm::reduce_kind::sum).wait();
}

}  // namespace weft::parallel
