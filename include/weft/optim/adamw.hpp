// weft/optim/adamw.hpp — AdamW exactly as torch's `_single_tensor_adamw` writes it (torch.optim
// .AdamW on CPU tensors, foreach=False, fused=False, amsgrad=False, maximize=False): decoupled
// weight decay, bias correction on both moments, ε added after the square root.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>  // index_t
#include <weft/optim/param.hpp>

#include <cuda/std/cmath>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>  // _mm_sqrt_pd, _mm_sqrt_ps
#endif

namespace weft::optim {

//! torch.optim.AdamW's hyper-parameters and defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
//! weight_decay 1e-2). Valid: lr >= 0, 0 <= beta1 < 1, 0 <= beta2 < 1, eps >= 0,
//! weight_decay >= 0 (NaN is never valid).
struct adamw_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

//! Throws invalid_argument_error naming the first option out of range, its range and its value.
inline void validate(adamw_options const& o) {
  WEFT_EXPECTS(o.lr >= 0.0, "adamw_options::lr", ">= 0", o.lr);
  WEFT_EXPECTS(o.beta1 >= 0.0 && o.beta1 < 1.0, "adamw_options::beta1", "in [0, 1)", o.beta1);
  WEFT_EXPECTS(o.beta2 >= 0.0 && o.beta2 < 1.0, "adamw_options::beta2", "in [0, 1)", o.beta2);
  WEFT_EXPECTS(o.eps >= 0.0, "adamw_options::eps", ">= 0", o.eps);
  WEFT_EXPECTS(o.weight_decay >= 0.0, "adamw_options::weight_decay", ">= 0", o.weight_decay);
}

namespace detail {

//! The step's scalars, computed in double as torch computes them in Python, then rounded once to
//! the storage type T, as torch's CPU kernels round a Python scalar to a float tensor's type.
template <class T>
struct adamw_scalars {
  T decay;        // 1 - lr·λ (1 for a parameter that does not decay)
  T w1;           // 1 - β1, lerp_'s weight
  bool w1_small;  // lerp_'s branch: |w| < 0.5
  T beta2;        // β2
  T w2;           // 1 - β2, addcmul_'s value
  T bc2_sqrt;     // sqrt(1 - β2^t)
  T eps;          // ε
  T neg_step;     // -lr / (1 - β1^t), addcdiv_'s value
};

//! The per-element update (steps 1-5 of adamw below), shared by the CPU loops and the CUDA kernel
//! (optim/cuda/adamw.cuh). SmallWeight is lerp_'s branch (s.w1_small).
template <class T, bool SmallWeight>
struct adamw_element {
  adamw_scalars<T> s;
  //! 2. m ← lerp(m, g, 1 − β1): torch's Lerp.h picks the form by |weight| < 0.5.
  WEFT_HD WEFT_FORCEINLINE T lerp(T m, T g) const noexcept {
    return SmallWeight ? m + s.w1 * (g - m) : g - (g - m) * (T(1) - s.w1);
  }
  //! Steps 1-3: θ ← θ(1 − lr·λ), m ← lerp(m, g), v ← β2 v + (1 − β2) g².
  WEFT_HD WEFT_FORCEINLINE void moments(T& p, T g, T& m, T& v) const noexcept {
    p = p * s.decay;
    m = lerp(m, g);
    v = v * s.beta2 + s.w2 * g * g;
  }
  //! Steps 4-5 from root = sqrt(v): θ + (−lr/(1 − β1^t))·m / (root/sqrt(1 − β2^t) + ε).
  WEFT_HD WEFT_FORCEINLINE T apply(T p, T m, T root) const noexcept {
    T const denom = root / s.bc2_sqrt + s.eps;
    return p + s.neg_step * m / denom;
  }
  //! Steps 1-5 on one element.
  WEFT_HD WEFT_FORCEINLINE void operator()(T& p, T g, T& m, T& v) const noexcept {
    moments(p, g, m, v);
    p = apply(p, m, ::cuda::std::sqrt(v));
  }
};

//! The step's scalars for step count t (t >= 1) at learning rate lr; decay is 1 − lr·λ (the
//! caller sets 1 for a parameter that does not decay).
template <class T>
adamw_scalars<T> make_adamw_scalars(adamw_options const& o, std::int64_t step, double lr) {
  auto const t = static_cast<double>(step);
  double const b1 = o.beta1, b2 = o.beta2;
  double const bias_correction1 = 1.0 - std::pow(b1, t);
  double const bias_correction2 = 1.0 - std::pow(b2, t);
  double const w1 = 1.0 - b1;
  adamw_scalars<T> s{};
  s.w1 = static_cast<T>(w1);
  s.w1_small = std::abs(w1) < 0.5;
  s.beta2 = static_cast<T>(b2);
  s.w2 = static_cast<T>(1.0 - b2);
  s.bc2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  s.eps = static_cast<T>(o.eps);
  s.neg_step = static_cast<T>(-(lr / bias_correction1));
  s.decay = static_cast<T>(1.0 - lr * o.weight_decay);
  return s;
}

//! sqrt of a block of 16 values in place. GCC keeps errno semantics for sqrt at -O2 (a negative
//! argument must set EDOM), so a loop calling std::sqrt has a compare and a libm call on a slow
//! path and does not vectorise (nor does GCC 12 honour optimize("no-math-errno") per function).
//! On x86-64 the block uses the SSE2 sqrt instructions, which round exactly as sqrtsd/sqrtss do;
//! elsewhere it is a plain loop.
template <class T>
WEFT_FORCEINLINE void sqrt_block16(T* x) {
#if defined(__SSE2__) && !defined(__CUDACC__)
  if constexpr (std::is_same_v<T, double>) {
    for (int k = 0; k < 16; k += 2) _mm_storeu_pd(x + k, _mm_sqrt_pd(_mm_loadu_pd(x + k)));
  } else {
    for (int k = 0; k < 16; k += 4) _mm_storeu_ps(x + k, _mm_sqrt_ps(_mm_loadu_ps(x + k)));
  }
#else
  for (int k = 0; k < 16; ++k) x[k] = std::sqrt(x[k]);
#endif
}

//! One segment [0, n) of the update, in blocks of 16: steps 1-3 (a loop GCC vectorises at -O2),
//! the block's 16 square roots, steps 4-5 (vectorised too), then a scalar tail. The expressions
//! are torch's kernels' (aten/src/ATen/native/cpu: mul_, lerp_ (Lerp.h), mul_ then addcmul_
//! (`self + value * t1 * t2`), sqrt, div, add_, addcdiv_ (`self + value * t1 / t2`)) in the
//! same order and the same association.
template <class T, bool SmallWeight>
void adamw_segment(T* p, T const* g, T* m, T* v, index_t n, adamw_scalars<T> const s) {
  adamw_element<T, SmallWeight> const f{s};
  constexpr index_t B = 16;
  alignas(64) T root[B];
  index_t j0 = 0;
  for (; j0 + B <= n; j0 += B) {
    T* const pb = p + j0;
    T const* const gb = g + j0;
    T* const mb = m + j0;
    T* const vb = v + j0;
    WEFT_IVDEP
    for (index_t j = 0; j < B; ++j) {
      T pj = pb[j], mj = mb[j], vj = vb[j];
      f.moments(pj, gb[j], mj, vj);  // 1-3.
      pb[j] = pj;
      mb[j] = mj;
      vb[j] = vj;
      root[j] = vj;
    }
    sqrt_block16(root);
    WEFT_IVDEP
    for (index_t j = 0; j < B; ++j) pb[j] = f.apply(pb[j], mb[j], root[j]);  // 4-5.
  }
  for (index_t j = j0; j < n; ++j) f(p[j], g[j], m[j], v[j]);
}

}  // namespace detail

//! AdamW's state (m, v and the step count t) over one contiguous range of parameters, described
//! by a span of param_info (for the per-parameter `decay` flag) or by a size (one parameter that
//! decays). T is float or double.
//!
//! step(params, grads, lr) performs, with t incremented first (t = 1 on the first step), for
//! every element, in this order (torch's `_single_tensor_adamw`):
//!   1. θ ← θ·(1 − lr·λ)                       (skipped where param_info::decay is false)
//!   2. m ← lerp(m, g, 1 − β1)                 = m + (1 − β1)(g − m)
//!   3. v ← v·β2 + (1 − β2)·g·g
//!   4. denom = sqrt(v) / sqrt(1 − β2^t) + ε
//!   5. θ ← θ + (−lr/(1 − β1^t))·m / denom
//! Not the folded form lr·sqrt(1 − β2^t)/(1 − β1^t)·m/(sqrt(v) + ε), which amounts to
//! ε·sqrt(1 − β2^t) and differs from torch for small gradients (at t = 1, g = 1e-9 the update per
//! lr is 0.0909 in torch's form and 0.00315 in the folded one).
//!
//! Precision: the scalars (1 − lr·λ, 1 − β1, β2, 1 − β2, sqrt(1 − β2^t), ε, −lr/(1 − β1^t)) are
//! computed in double and rounded once to T; the element-wise arithmetic is in T. For T = float
//! that is what torch does for float32 tensors on CPU, so the result equals torch's operation by
//! operation, provided the compiler does not contract a·b + c into an FMA (none does on the
//! baseline x86-64 target; with -mfma and GCC's default -ffp-contract=fast steps 3 and 5 may be
//! contracted, which changes results by about one rounding). For T = double it is torch's float64
//! update: the path the golden values check.
template <class T>
class adamw {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::optim::adamw: T must be float or double");

 public:
  //! State for `params` (counts in buffer order; their sum is the buffer's size); m = v = 0, t = 0.
  adamw(std::span<param_info const> params, adamw_options const& options) : options_(options) {
    validate(options_);
    std::size_t offset = 0;
    for (auto const& p : params) {
      if (p.count == 0) continue;
      if (!segments_.empty() && segments_.back().decay == p.decay)
        segments_.back().count += p.count;
      else
        segments_.push_back({offset, p.count, p.decay});
      offset += p.count;
    }
    m_.assign(offset, T(0));
    v_.assign(offset, T(0));
  }

  //! State for `size` elements that all decay.
  adamw(std::size_t size, adamw_options const& options)
      : adamw(std::span<param_info const>(std::vector<param_info>{param_info{size}}), options) {}

  [[nodiscard]] adamw_options const& options() const noexcept { return options_; }
  [[nodiscard]] std::size_t size() const noexcept { return m_.size(); }
  //! Steps taken so far (torch's `state["step"]`).
  [[nodiscard]] std::int64_t steps() const noexcept { return t_; }
  //! First and second moments (torch's `exp_avg`, `exp_avg_sq`).
  [[nodiscard]] std::span<T const> m() const noexcept { return m_; }
  [[nodiscard]] std::span<T const> v() const noexcept { return v_; }

  //! Restores a state saved from m(), v() and steps() (a checkpoint): the following steps then
  //! equal those of the optimizer it was saved from, bit for bit. shape_error for moments of
  //! another size, invalid_argument_error for a negative step count, before anything changes.
  void load_state(std::span<T const> m, std::span<T const> v, std::int64_t steps) {
    WEFT_EXPECTS_SHAPE(m.size() == m_.size(), "m",
                       ::weft::detail::concat(m_.size(), " elements (the optimizer's size)"),
                       ::weft::detail::concat(m.size(), " elements"));
    WEFT_EXPECTS_SHAPE(v.size() == v_.size(), "v",
                       ::weft::detail::concat(v_.size(), " elements (the optimizer's size)"),
                       ::weft::detail::concat(v.size(), " elements"));
    WEFT_EXPECTS(steps >= 0, "steps", ">= 0", steps);
    std::copy(m.begin(), m.end(), m_.begin());
    std::copy(v.begin(), v.end(), v_.begin());
    t_ = steps;
  }

  //! One step at learning rate `lr` (a schedule's value; lr >= 0). params and grads have size()
  //! elements; shape_error otherwise, before anything changes.
  void step(std::span<T> params, std::span<T const> grads, double lr) {
    WEFT_EXPECTS(lr >= 0.0, "lr", ">= 0", lr);
    WEFT_EXPECTS_SHAPE(params.size() == m_.size(), "params",
                       ::weft::detail::concat(m_.size(), " elements (the optimizer's size)"),
                       ::weft::detail::concat(params.size(), " elements"));
    WEFT_EXPECTS_SHAPE(grads.size() == m_.size(), "grads",
                       ::weft::detail::concat(m_.size(), " elements (the optimizer's size)"),
                       ::weft::detail::concat(grads.size(), " elements"));
    ++t_;
    detail::adamw_scalars<T> s = detail::make_adamw_scalars<T>(options_, t_, lr);
    T const decay = s.decay;
    for (auto const& seg : segments_) {
      // Multiplying by 1 is exact: a parameter without decay is left as it was by step 1.
      s.decay = seg.decay ? decay : T(1);
      auto* const kernel =
          s.w1_small ? &detail::adamw_segment<T, true> : &detail::adamw_segment<T, false>;
      kernel(params.data() + seg.offset, grads.data() + seg.offset, m_.data() + seg.offset,
             v_.data() + seg.offset, static_cast<index_t>(seg.count), s);
    }
  }

  //! One step at options().lr.
  void step(std::span<T> params, std::span<T const> grads) { step(params, grads, options_.lr); }

 private:
  struct segment {
    std::size_t offset = 0, count = 0;
    bool decay = true;
  };
  adamw_options options_;
  std::vector<segment> segments_;
  std::vector<T> m_, v_;
  std::int64_t t_ = 0;
};

}  // namespace weft::optim
