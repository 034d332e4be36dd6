// weft/rl/kl.hpp — KL estimators k1 / k2 / k3 (and the straight-through k1+ / k3+) with their
// gradients, as a loss term or a reward penalty; the entropy bonus; PPO's clipped value loss.
// Per-token math is WEFT_HD functors; the batch functions add their gradient into the caller's.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/rl/token_layout.hpp>

#include <cuda/std/cmath>
#include <cuda/std/limits>

#include <algorithm>
#include <limits>
#include <span>
#include <string_view>

namespace weft::rl {

//! KL estimators of x = l - l_ref (Schulman's k1, k2, k3; verl kl_penalty modes):
//! - k1  (`kl`):          x,                        d/dl = 1
//! - abs:                 |x|,                      d/dl = sign(x)
//! - k2  (`mse`):         x^2 / 2,                  d/dl = x
//! - k3  (`low_var_kl`):  e^{-x} + x - 1,           d/dl = 1 - e^{-x}; -x clamped to [-20, 20]
//!                        before exp and the value clamped to [-10, 10], gradient 0 where clamped
//! - k1_plus, k3_plus:    value of k1 / k3, gradient of k2 (straight-through)
//! On samples from pi: E[grad k2] = grad KL(pi||ref) (unbiased reverse KL), E[grad k3] =
//! grad KL(ref||pi) (forward KL!), E[grad k1] = 0. Use k2 or k3_plus as a loss term for the
//! reverse KL, or k3 times the ratio (kl_is_corrected) when samples come from pi_old.
//! A token with l = l_ref = -inf (probability 0 under both policies, e.g. a fully -inf logit row)
//! has no x; it contributes nothing: value 0, gradient 0 (k3 would otherwise give NaN).
enum class kl_kind : unsigned char { k1, abs, k2, k3, k1_plus, k3_plus };

constexpr std::string_view to_string(kl_kind k) noexcept {
  switch (k) {
    case kl_kind::k1: return "k1";
    case kl_kind::abs: return "abs";
    case kl_kind::k2: return "k2";
    case kl_kind::k3: return "k3";
    case kl_kind::k1_plus: return "k1+";
    case kl_kind::k3_plus: return "k3+";
  }
  return "unknown";
}

template <class T>
struct kl_value {
  T value;
  T grad;  // d value / d l
};

template <class T>
struct kl_token {
  kl_kind kind;

  WEFT_HD kl_value<T> operator()(T logp, T ref_logp) const noexcept {
    if (logp == -cuda::std::numeric_limits<T>::infinity() && ref_logp == logp) return {T(0), T(0)};
    T const x = logp - ref_logp;
    switch (kind) {
      case kl_kind::k1: return {x, T(1)};
      case kl_kind::abs: return {x < T(0) ? -x : x, x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0))};
      case kl_kind::k2: return {x * x / T(2), x};
      case kl_kind::k1_plus: return {x, x};
      case kl_kind::k3:
      case kl_kind::k3_plus: {
        T const nx = -x;
        bool const exp_clamped = nx > T(20) || nx < T(-20);
        T const nxc = nx > T(20) ? T(20) : (nx < T(-20) ? T(-20) : nx);
        T const e = cuda::std::exp(nxc);
        T const v = e - nxc - T(1);
        bool const val_clamped = v > T(10) || v < T(-10);
        T const vc = v > T(10) ? T(10) : (v < T(-10) ? T(-10) : v);
        if (kind == kl_kind::k3_plus) return {vc, x};
        return {vc, exp_clamped || val_clamped ? T(0) : T(1) - e};
      }
    }
    return {T(0), T(0)};
  }
};

namespace detail {
template <class T, class M>
void kl_penalty_impl(kl_kind kind, std::span<T const> logp, std::span<T const> ref_logp,
                     std::span<M const> mask, std::span<T> value, std::span<T> grad = {}) {
  WEFT_EXPECTS_SHAPE(ref_logp.size() == logp.size(), "ref_logp", logp.size(), ref_logp.size());
  WEFT_EXPECTS_SHAPE(mask.size() == logp.size(), "mask", logp.size(), mask.size());
  WEFT_EXPECTS_SHAPE(value.size() == logp.size(), "value", logp.size(), value.size());
  if (!grad.empty())
    WEFT_EXPECTS_SHAPE(grad.size() == logp.size(), "grad", logp.size(), grad.size());
  kl_token<T> const fn{kind};
  for (std::size_t k = 0; k < logp.size(); ++k) {
    bool const v = detail::valid(mask[k]);
    auto const r = v ? fn(logp[k], ref_logp[k]) : kl_value<T>{T(0), T(0)};
    value[k] = r.value;
    if (!grad.empty()) grad[k] = r.grad;
  }
}
}  // namespace detail

//! Per-token estimator values (and d/dl into `grad` if non-empty) for every token; masked tokens 0.
template <FlatArray LR, FlatArray RR, FlatArray MR, MutableFlatArray VR,
          MutableFlatArray GR = std::span<flat_value_t<VR>>>
void kl_penalty(kl_kind kind, LR&& logp, RR&& ref_logp, MR&& mask, VR&& value, GR&& grad = GR{}) {
  detail::kl_penalty_impl(kind, as_flat_const(logp, "logp"), as_flat_const(ref_logp, "ref_logp"),
                          as_flat_const(mask, "mask"), as_flat(value, "value"),
                          as_flat(grad, "grad"));
}

namespace detail {
template <class T, class M>
double kl_loss_impl(kl_kind kind, double coef, std::span<T const> logp, std::span<T const> ref_logp,
                    std::span<M const> mask, std::span<T const> weights, std::span<T> dlogp) {
  WEFT_EXPECTS_SHAPE(ref_logp.size() == logp.size(), "ref_logp", logp.size(), ref_logp.size());
  WEFT_EXPECTS_SHAPE(mask.size() == logp.size(), "mask", logp.size(), mask.size());
  WEFT_EXPECTS_SHAPE(weights.size() == logp.size(), "weights", logp.size(), weights.size());
  WEFT_EXPECTS_SHAPE(dlogp.size() == logp.size(), "dlogp", logp.size(), dlogp.size());
  kl_token<T> const fn{kind};
  double sum = 0;
  for (std::size_t k = 0; k < logp.size(); ++k) {
    if (!detail::valid(mask[k])) continue;
    auto const r = fn(logp[k], ref_logp[k]);
    sum += static_cast<double>(weights[k]) * static_cast<double>(r.value);
    dlogp[k] += static_cast<T>(coef) * weights[k] * r.grad;
  }
  return coef * sum;
}
}  // namespace detail

//! KL as a loss term: returns coef * sum_t w_t k(l_t, l_ref_t) and adds coef * w_t k'(l_t) to
//! dlogp. `weights` come from aggregation_weights (token-mean in verl and TRL).
template <FlatArray LR, FlatArray RR, FlatArray MR, FlatArray WR, MutableFlatArray DR>
double kl_loss(kl_kind kind, double coef, LR&& logp, RR&& ref_logp, MR&& mask, WR&& weights,
               DR&& dlogp) {
  return detail::kl_loss_impl(kind, coef, as_flat_const(logp, "logp"),
                              as_flat_const(ref_logp, "ref_logp"), as_flat_const(mask, "mask"),
                              as_flat_const(weights, "weights"), as_flat(dlogp, "dlogp"));
}

namespace detail {
template <class T, class M>
double kl_is_corrected_loss_impl(double coef, std::span<T const> logp, std::span<T const> old_logp,
                                 std::span<T const> ref_logp, std::span<M const> mask,
                                 std::span<T const> weights, std::span<T> dlogp) {
  WEFT_EXPECTS_SHAPE(old_logp.size() == logp.size(), "old_logp", logp.size(), old_logp.size());
  WEFT_EXPECTS_SHAPE(ref_logp.size() == logp.size(), "ref_logp", logp.size(), ref_logp.size());
  WEFT_EXPECTS_SHAPE(mask.size() == logp.size(), "mask", logp.size(), mask.size());
  WEFT_EXPECTS_SHAPE(weights.size() == logp.size(), "weights", logp.size(), weights.size());
  WEFT_EXPECTS_SHAPE(dlogp.size() == logp.size(), "dlogp", logp.size(), dlogp.size());
  kl_token<T> const fn{kl_kind::k3};
  double sum = 0;
  for (std::size_t k = 0; k < logp.size(); ++k) {
    if (!detail::valid(mask[k])) continue;
    if (logp[k] == -std::numeric_limits<T>::infinity() && old_logp[k] == logp[k]) continue;
    T const d = logp[k] - old_logp[k];
    bool const r_clamped = d < T(-20) || d > T(20);
    T const r = cuda::std::exp(d < T(-20) ? T(-20) : (d > T(20) ? T(20) : d));
    auto const kv = fn(logp[k], ref_logp[k]);
    sum += static_cast<double>(weights[k]) * static_cast<double>(r * kv.value);
    dlogp[k] +=
        static_cast<T>(coef) * weights[k] * ((r_clamped ? T(0) : r * kv.value) + r * kv.grad);
  }
  return coef * sum;
}
}  // namespace detail

//! DeepSeek-V3.2 / TRL `use_bias_correction_kl`: coef * sum w r k3 with r = exp(l - l_old) the
//! differentiable ratio. d(r k3)/dl = r k3 + r (1 - e^{-x}) = r (l - l_ref) pointwise (x = l -
//! l_ref), so on samples from pi_old its expectation is the reverse-KL gradient. Where a clamp is
//! active the clamped factor contributes no derivative. A token with l = l_old = -inf (no ratio)
//! adds nothing, as in policy_loss.
template <FlatArray LR, FlatArray OR, FlatArray RR, FlatArray MR, FlatArray WR, MutableFlatArray DR>
double kl_is_corrected_loss(double coef, LR&& logp, OR&& old_logp, RR&& ref_logp, MR&& mask,
                            WR&& weights, DR&& dlogp) {
  return detail::kl_is_corrected_loss_impl(
      coef, as_flat_const(logp, "logp"), as_flat_const(old_logp, "old_logp"),
      as_flat_const(ref_logp, "ref_logp"), as_flat_const(mask, "mask"),
      as_flat_const(weights, "weights"), as_flat(dlogp, "dlogp"));
}

namespace detail {
template <class T, class M>
void apply_kl_penalty_impl(kl_kind kind, double beta, std::span<T const> old_logp,
                           std::span<T const> ref_logp, std::span<M const> mask,
                           std::span<T> rewards) {
  WEFT_EXPECTS_SHAPE(ref_logp.size() == old_logp.size(), "ref_logp", old_logp.size(),
                     ref_logp.size());
  WEFT_EXPECTS_SHAPE(mask.size() == old_logp.size(), "mask", old_logp.size(), mask.size());
  WEFT_EXPECTS_SHAPE(rewards.size() == old_logp.size(), "rewards", old_logp.size(), rewards.size());
  kl_token<T> const fn{kind};
  for (std::size_t k = 0; k < rewards.size(); ++k)
    if (detail::valid(mask[k]))
      rewards[k] -= static_cast<T>(beta) * fn(old_logp[k], ref_logp[k]).value;
}
}  // namespace detail

//! KL in the reward (verl apply_kl_penalty): rewards_t -= beta * k(l_old_t, l_ref_t) on valid
//! tokens.
template <FlatArray OR, FlatArray RR, FlatArray MR, MutableFlatArray WR>
void apply_kl_penalty(kl_kind kind, double beta, OR&& old_logp, RR&& ref_logp, MR&& mask,
                      WR&& rewards) {
  detail::apply_kl_penalty_impl(kind, beta, as_flat_const(old_logp, "old_logp"),
                                as_flat_const(ref_logp, "ref_logp"), as_flat_const(mask, "mask"),
                                as_flat(rewards, "rewards"));
}

namespace detail {
template <class T, class M>
double entropy_bonus_impl(double coef, std::span<T const> entropy, std::span<M const> mask,
                          std::span<T const> weights, std::span<T> d_entropy) {
  WEFT_EXPECTS_SHAPE(mask.size() == entropy.size(), "mask", entropy.size(), mask.size());
  WEFT_EXPECTS_SHAPE(weights.size() == entropy.size(), "weights", entropy.size(), weights.size());
  WEFT_EXPECTS_SHAPE(d_entropy.size() == entropy.size(), "d_entropy", entropy.size(),
                     d_entropy.size());
  double sum = 0;
  for (std::size_t k = 0; k < entropy.size(); ++k) {
    bool const v = detail::valid(mask[k]);
    if (v) sum += static_cast<double>(weights[k]) * static_cast<double>(entropy[k]);
    d_entropy[k] = v ? static_cast<T>(-coef) * weights[k] : T(0);
  }
  return -coef * sum;
}
}  // namespace detail

//! Entropy bonus: returns -coef * sum_t w_t H_t and writes the upstream gradient dH_t = -coef w_t
//! (0 on masked tokens) for log_prob_backward. Aggregate entropy with token-mean weights (verl
//! issue #3986: seq-mean-token-sum-norm makes it meaningless).
template <FlatArray HR, FlatArray MR, FlatArray WR, MutableFlatArray DR>
double entropy_bonus(double coef, HR&& entropy, MR&& mask, WR&& weights, DR&& d_entropy) {
  return detail::entropy_bonus_impl(coef, as_flat_const(entropy, "entropy"),
                                    as_flat_const(mask, "mask"), as_flat_const(weights, "weights"),
                                    as_flat(d_entropy, "d_entropy"));
}

template <class T>
struct value_token {
  T clip;  // c_v (verl critic.cliprange_value 0.5)

  struct result {
    T loss;        // 0.5 * max((v - R)^2, (vclip - R)^2)
    T grad;        // d loss / d v
    bool clipped;  // the clipped branch won strictly
  };
  WEFT_HD result operator()(T v, T v_old, T ret) const noexcept {
    T const lo = v_old - clip;
    T const hi = v_old + clip;
    T const vc = v < lo ? lo : (v > hi ? hi : v);
    T const e1 = (v - ret) * (v - ret);
    T const e2 = (vc - ret) * (vc - ret);
    bool const clipped = e2 > e1;
    // When the clipped branch wins, v lies outside [lo, hi] (else vc == v), so d/dv = 0.
    return {T(0.5) * (clipped ? e2 : e1), clipped ? T(0) : v - ret, clipped};
  }
};

struct value_loss_result {
  double loss = 0;
  double tokens = 0;
  double clipped = 0;  // vf_clipfrac = clipped / tokens
};

namespace detail {
template <class T, class M>
value_loss_result value_loss_impl(double clip, std::span<T const> values,
                                  std::span<T const> old_values, std::span<T const> returns,
                                  std::span<M const> mask, std::span<T const> weights,
                                  std::span<T> dvalues) {
  WEFT_EXPECTS(clip >= 0, "clip", ">= 0", clip);
  WEFT_EXPECTS_SHAPE(old_values.size() == values.size(), "old_values", values.size(),
                     old_values.size());
  WEFT_EXPECTS_SHAPE(returns.size() == values.size(), "returns", values.size(), returns.size());
  WEFT_EXPECTS_SHAPE(mask.size() == values.size(), "mask", values.size(), mask.size());
  WEFT_EXPECTS_SHAPE(weights.size() == values.size(), "weights", values.size(), weights.size());
  WEFT_EXPECTS_SHAPE(dvalues.size() == values.size(), "dvalues", values.size(), dvalues.size());
  value_token<T> const fn{static_cast<T>(clip)};
  value_loss_result res;
  for (std::size_t k = 0; k < values.size(); ++k) {
    if (!detail::valid(mask[k])) {
      dvalues[k] = T(0);
      continue;
    }
    auto const r = fn(values[k], old_values[k], returns[k]);
    res.loss += static_cast<double>(weights[k]) * static_cast<double>(r.loss);
    res.tokens += 1;
    res.clipped += r.clipped ? 1 : 0;
    dvalues[k] = weights[k] * r.grad;
  }
  return res;
}
}  // namespace detail

//! PPO clipped value loss 0.5 * sum w max((v-R)^2, (clip(v, v_old +- c) - R)^2) (with verl PR
//! #2016's 1/2); writes dvalues = w (v - R) where the unclipped branch wins, else 0.
template <FlatArray VR, FlatArray OR, FlatArray RR, FlatArray MR, FlatArray WR, MutableFlatArray DR>
value_loss_result value_loss(double clip, VR&& values, OR&& old_values, RR&& returns, MR&& mask,
                             WR&& weights, DR&& dvalues) {
  return detail::value_loss_impl(clip, as_flat_const(values, "values"),
                                 as_flat_const(old_values, "old_values"),
                                 as_flat_const(returns, "returns"), as_flat_const(mask, "mask"),
                                 as_flat_const(weights, "weights"), as_flat(dvalues, "dvalues"));
}

}  // namespace weft::rl
