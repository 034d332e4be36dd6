// weft/pipeline/detail/vocab_ops.hpp — the executor's work on the vocabulary buffers of a
// step_plan (section 2.5): each collective (RE, BX, C0, C1, BE) as a task that runs where the
// collectives run (the rank's thread, or its progress thread under step_options::vocab_overlap),
// BX's packing and C0's loss on the rank's thread; and whether a channel may be driven from a
// second thread.
#pragma once

#include <weft/pipeline/step.hpp>

#include <weft/comm/concepts.hpp>
#include <weft/core/dtype.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/vocab_stats.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <span>
#include <type_traits>

namespace weft::pipeline::detail {

//! The vocabulary buffers' operations, in the plan's vocabulary type (f32 or f64); a friend of
//! step_plan.
struct vocab_ops {
  //! C0's collectives (combine_vocab_stats over the pipeline ranks): the maxima into max_, the
  //! rest of the statistics in place.
  template <class F, class VC>
  static void c0_combine(step_plan& plan, VC& vc, int i, step_options const& opt) {
    auto const ui = static_cast<std::size_t>(i);
    std::size_t const n = plan.tokens_[ui];
    std::size_t const count = plan.buffers_[static_cast<std::size_t>(plan.stats_[ui])].layout.count;
    combine_vocab_stats(vc, std::span<F>(plan.elements<F>(plan.stats_[ui]), count),
                        std::span<F>(plan.elements<F>(plan.max_[ui]), n), n,
                        plan.vocab_ == vocab_variant::one_barrier ? plan.hidden_ : 0, opt.p2p);
  }

  //! C0's loss on the last stage's rank, once c0_combine has run: the loss, the per-token
  //! loss-gradient weights g (the loss weight for the cross-entropy, -d loss / d logp for a
  //! step_options::token_loss) and (one barrier) the output gradient g (G / s - H). Runs on the
  //! rank's thread, in microbatch order. An exception from the token loss is caught into
  //! `loss_failure` (the caller reports it as a stage failure: on every rank, naming C0), and it
  //! returns 0.
  template <class F>
  static double c0_loss(step_plan& plan, int i, double weight, step_options const& opt,
                        std::exception_ptr& loss_failure) {
    auto const ui = static_cast<std::size_t>(i);
    std::size_t const n = plan.tokens_[ui], h = plan.hidden_;
    bool const one = plan.vocab_ == vocab_variant::one_barrier;
    F const* st = plan.elements<F>(plan.stats_[ui]);
    F const* mx = plan.elements<F>(plan.max_[ui]);
    double loss = 0.0;
    bool const custom = static_cast<bool>(opt.token_loss);
    if (custom) {
      plan.logp_.resize(n);
      plan.dlogp_.assign(n, 0.0);
      for (std::size_t t = 0; t < n; ++t)
        plan.logp_[t] = static_cast<double>(st[2 * n + t]) - static_cast<double>(mx[t]) -
                        std::log(static_cast<double>(st[n + t]));
      try {
        loss =
            opt.token_loss(i, std::span<double const>(plan.logp_), std::span<double>(plan.dlogp_));
      } catch (...) {
        loss_failure = std::current_exception();
        return 0.0;
      }
    }
    F* g = plan.elements<F>(plan.g_[ui]);
    F* dout = plan.elements<F>(plan.dout_[ui]);
    for (std::size_t t = 0; t < n; ++t) {
      double const s = st[n + t];
      double const gt = custom ? -plan.dlogp_[t] : weight;
      if (!custom)
        loss += std::log(s) - (static_cast<double>(st[2 * n + t]) - static_cast<double>(mx[t]));
      g[t] = static_cast<F>(gt);
      if (one)
        for (std::size_t k = 0; k < h; ++k)
          dout[t * h + k] =
              static_cast<F>(gt * (static_cast<double>(st[3 * n + t * h + k]) / s -
                                   static_cast<double>(st[3 * n + n * h + t * h + k])));
    }
    return custom ? loss : weight * loss;
  }

  //! BX:i's root buffer on the last stage's rank: [X_i | g_{i-1}] (X alone for i = 0, g alone for
  //! i = m).
  static void pack_output(step_plan& plan, int i) {
    auto pack = [&]<class F>(std::type_identity<F>) {
      auto const mb = static_cast<std::size_t>(i);
      F* out = plan.elements<F>(plan.bx_[mb]);
      std::size_t x = 0;
      if (i < plan.microbatches_) {
        x = plan.tokens_[mb] * plan.hidden_;
        F const* src = plan.elements<F>(plan.x_[mb]);
        std::copy(src, src + x, out);
      }
      if (i > 0) {
        F const* g = plan.elements<F>(plan.g_[mb - 1]);
        std::copy(g, g + plan.tokens_[mb - 1], out + x);
      }
    };
    if (plan.vocab_type_ == dtype::f64)
      pack(std::type_identity<double>{});
    else
      pack(std::type_identity<float>{});
  }

  //! Collective (tag, i) on `vc` as a task (it refers to plan, vc and opt, which outlive it).
  template <class VC>
  static std::function<void()> task(step_plan& plan, VC& vc, collective_kind tag, int i,
                                    step_options const& opt) {
    auto const mb = static_cast<std::size_t>(i);
    // RE and C1 sum a buffer over the pipeline ranks; BX and BE broadcast one from `root`.
    auto sum = [&plan, &vc, &opt](int b) -> std::function<void()> {
      return [&plan, &vc, &opt, b] {
        auto const v = plan.view(b);
        vc.all_reduce(v, v, comm::reduce_kind::sum, opt.p2p).wait();
      };
    };
    auto broadcast = [&plan, &vc, &opt](int b, int root) -> std::function<void()> {
      return [&plan, &vc, &opt, b, root] {
        auto const v = plan.view(b);
        vc.broadcast(v, v, root, opt.p2p).wait();
      };
    };
    switch (tag) {
      case collective_kind::reduce_input: return sum(plan.re_[mb]);
      case collective_kind::broadcast_output: return broadcast(plan.bx_[mb], plan.last_rank_);
      case collective_kind::c0:
        return [&plan, &vc, &opt, i] {
          if (plan.vocab_type_ == dtype::f64)
            c0_combine<double>(plan, vc, i, opt);
          else
            c0_combine<float>(plan, vc, i, opt);
        };
      case collective_kind::c1: return sum(plan.dout_[mb]);
      case collective_kind::broadcast_input: return broadcast(plan.be_[mb], 0);
      case collective_kind::none: break;
    }
    return [] {};
  }
};

//! Whether `c` may be called from one thread while another thread of the process calls another
//! communicator: a channel's `allows_concurrent_calls()` where it has one, else true.
template <class C>
bool allows_concurrent_calls(C const& c) {
  if constexpr (requires {
                  { c.allows_concurrent_calls() } -> std::convertible_to<bool>;
                })
    return c.allows_concurrent_calls();
  else
    return true;
}

}  // namespace weft::pipeline::detail
