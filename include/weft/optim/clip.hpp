// weft/optim/clip.hpp — the global gradient norm over a mesh (2-norm or infinity norm) and
// torch's/Megatron's clipping by it. Every element of the model counts once: a tensor-parallel
// replicated parameter only on tp rank 0, the secondary copy of a tied weight never.
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>    // index_t
#include <weft/core/memory.hpp>  // host_space
#include <weft/core/simd.hpp>    // for_each_blocked
#include <weft/optim/param.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>

namespace weft::optim {

//! Which norm global_grad_norm computes: the 2-norm (squares SUM-all-reduced) or the infinity
//! norm (MAX-all-reduced).
enum class grad_norm_kind : std::uint8_t { l2, inf };

//! Whether `p`'s gradient counts in the global norm on tensor-parallel rank `tp_rank`
//! (Megatron's `param_is_not_shared && param_is_not_tensor_parallel_duplicate`).
[[nodiscard]] constexpr bool counts_in_norm(param_info const& p, int tp_rank) noexcept {
  return (p.tp_sharded || tp_rank == 0) && !p.tied_secondary;
}

namespace detail {

template <class T>
void expect_norm_args(std::span<param_info const> params, std::size_t grads, int tp_rank) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::optim: gradients must be float or double");
  expect_buffer_matches(params, grads, "grads");
  WEFT_EXPECTS(tp_rank >= 0, "tp_rank", ">= 0", tp_rank);
}

//! This rank's part: the sum of the counted squares (l2) or the largest counted |g| (inf), in
//! double, element by element in buffer order, so the value is the same on every run. For inf the
//! second entry is 1 if a counted element is NaN (a max all-reduce need not propagate NaN).
template <class T>
std::array<double, 2> local_norm_part(std::span<param_info const> params, std::span<T const> grads,
                                      int tp_rank, grad_norm_kind kind,
                                      std::array<double, 2> acc = {0.0, 0.0}) {
  std::size_t offset = 0;
  for (auto const& p : params) {
    if (counts_in_norm(p, tp_rank)) {
      T const* g = grads.data() + offset;
      if (kind == grad_norm_kind::l2) {
        double s = acc[0];
        for (std::size_t i = 0; i < p.count; ++i) {
          auto const x = static_cast<double>(g[i]);
          s += x * x;
        }
        acc[0] = s;
      } else {
        for (std::size_t i = 0; i < p.count; ++i) {
          double const a = std::abs(static_cast<double>(g[i]));
          if (std::isnan(a))
            acc[1] = 1.0;
          else
            acc[0] = std::max(acc[0], a);
        }
      }
    }
    offset += p.count;
  }
  return acc;
}

//! The global norm from this rank's local part: one SUM (l2) or MAX (inf) all-reduce over
//! `stats_group`, then the square root, or NaN where a rank saw a NaN.
template <comm::CollectiveIn<host_space> C>
double reduce_norm(C& stats_group, std::array<double, 2> const& local, grad_norm_kind kind) {
  std::array<double, 2> global{};
  comm::all_reduce(stats_group, local, global,
                   kind == grad_norm_kind::l2 ? comm::reduce_kind::sum : comm::reduce_kind::max)
      .wait();
  if (kind == grad_norm_kind::l2) return std::sqrt(global[0]);
  return global[1] > 0.0 ? std::numeric_limits<double>::quiet_NaN() : global[0];
}

//! grads *= f, element by element.
template <class T>
void scale(std::span<T> grads, T f) {
  T* g = grads.data();
  weft::detail::for_each_blocked(0, static_cast<index_t>(grads.size()),
                                 [&](index_t j) WEFT_LAMBDA_INLINE { g[j] *= f; });
}

}  // namespace detail

//! The global norm of the gradients of a model spread over `stats_group`, on every rank of it.
//! `grads` is this rank's flat gradient buffer, described by `params` (counts in buffer order,
//! summing to grads.size(), else shape_error); `tp_rank` is this rank's tensor-parallel rank.
//! An element counts iff (tp_sharded || tp_rank == 0) && !tied_secondary. The counted squares
//! (l2) are summed locally in double in buffer order and SUM-all-reduced; the result is their
//! square root. The infinity norm takes the largest |g| and MAX-all-reduces it. A NaN among the
//! counted gradients gives a NaN norm (an infinity gives an infinite one).
//!
//! `stats_group` is the group whose ranks hold disjoint counted pieces: tensor × pipeline
//! parallel for a replicated optimizer (data-parallel replicas hold the same gradients after
//! their all-reduce), data × tensor × pipeline under ZeRO-1 (each rank its own shard of them).
//! Any collective communicator over host memory; every rank of it must call.
template <comm::CollectiveIn<host_space> C, class T>
[[nodiscard]] double global_grad_norm(C& stats_group, std::span<param_info const> params,
                                      std::span<T const> grads, int tp_rank,
                                      grad_norm_kind kind = grad_norm_kind::l2) {
  detail::expect_norm_args<T>(params, grads.size(), tp_rank);
  return detail::reduce_norm(stats_group, detail::local_norm_part(params, grads, tp_rank, kind),
                             kind);
}

//! The factor clip_grad_norm multiplies the gradients by: min(max_norm / (norm + 1e-6), 1), as
//! torch's `clip_grads_with_norm_` and Megatron's `clip_grad_by_total_norm_fp32` compute it
//! (NaN for a NaN norm, 0 for an infinite one).
[[nodiscard]] inline double clip_coefficient(double norm, double max_norm) noexcept {
  double const coeff = max_norm / (norm + 1e-6);
  return std::isnan(coeff) ? coeff : std::min(coeff, 1.0);
}

//! Computes global_grad_norm, then multiplies every gradient of this rank (counted or not: a
//! replicated or tied copy is scaled like its original) by clip_coefficient(norm, max_norm).
//! torch always multiplies, by 1 when the norm is at most max_norm (exact, so nothing changes);
//! a NaN norm makes every gradient NaN, as in torch without error_if_nonfinite: the caller decides
//! whether to skip the step. The factor is computed in double and rounded once to T. Returns the
//! norm before clipping. max_norm >= 0 (invalid_argument_error otherwise, checked before the
//! collective on every rank).
template <comm::CollectiveIn<host_space> C, class T>
double clip_grad_norm(C& stats_group, std::span<param_info const> params, std::span<T> grads,
                      int tp_rank, double max_norm, grad_norm_kind kind = grad_norm_kind::l2) {
  WEFT_EXPECTS(max_norm >= 0.0, "max_norm", ">= 0", max_norm);
  double const norm =
      global_grad_norm(stats_group, params, std::span<T const>(grads), tp_rank, kind);
  detail::scale(grads, static_cast<T>(clip_coefficient(norm, max_norm)));
  return norm;
}

//! One of several gradient buffers of a rank (a pipeline rank's model chunks, each its own
//! parameter store): its `params` descriptions and its gradients, as global_grad_norm takes them.
template <class T>
struct grad_group {
  using value_type = T;
  std::span<param_info const> params;
  std::span<T> grads;
};

namespace detail {
template <class G>
inline constexpr bool is_grad_group = false;
template <class T>
inline constexpr bool is_grad_group<grad_group<T>> = true;
}  // namespace detail

//! A range of grad_group (a std::vector, a span, an array).
template <class R>
concept GradGroups = std::ranges::forward_range<R const> &&
    detail::is_grad_group<std::ranges::range_value_t<R const>>;

//! global_grad_norm over several buffers of this rank, counted as one buffer made of them in
//! `groups` order (the same double sum, so one group gives global_grad_norm's bits): one
//! all-reduce for all of them. Every buffer is checked before the collective.
template <comm::CollectiveIn<host_space> C, GradGroups R>
[[nodiscard]] double global_grad_norm(C& stats_group, R const& groups, int tp_rank,
                                      grad_norm_kind kind = grad_norm_kind::l2) {
  using T = typename std::ranges::range_value_t<R const>::value_type;
  for (auto const& g : groups) detail::expect_norm_args<T>(g.params, g.grads.size(), tp_rank);
  std::array<double, 2> local{0.0, 0.0};
  for (auto const& g : groups)
    local = detail::local_norm_part(g.params, std::span<T const>(g.grads), tp_rank, kind, local);
  return detail::reduce_norm(stats_group, local, kind);
}

//! clip_grad_norm over several buffers of this rank (grad_group): the norm of all of them as
//! global_grad_norm(groups) computes it, then every gradient of every group scaled by the one
//! clip_coefficient. Returns the norm before clipping.
template <comm::CollectiveIn<host_space> C, GradGroups R>
double clip_grad_norm(C& stats_group, R const& groups, int tp_rank, double max_norm,
                      grad_norm_kind kind = grad_norm_kind::l2) {
  WEFT_EXPECTS(max_norm >= 0.0, "max_norm", ">= 0", max_norm);
  double const norm = global_grad_norm(stats_group, groups, tp_rank, kind);
  using T = typename std::ranges::range_value_t<R const>::value_type;
  T const f = static_cast<T>(clip_coefficient(norm, max_norm));
  for (auto const& group : groups) detail::scale(group.grads, f);
  return norm;
}

}  // namespace weft::optim
