// weft/rl/named_arrays.hpp — the named per-token arrays of policy_inputs (weft::rl::arg): one
// type per field, built explicitly from any FlatArray, so the fields of a loss's inputs are named
// at the call site and cannot be swapped (or given in verl's old-before-new order) silently.
#pragma once

#include <weft/rl/token_layout.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

namespace weft::rl {

//! Named per-token inputs of policy_loss. Each field of policy_inputs has its own type, built
//! explicitly from any FlatArray, so a positional list of plain arrays, or the new and old
//! log-probs given in verl's order (old first), does not compile:
//!   policy_inputs<float, std::uint8_t> in{arg::new_logp{lp}, arg::old_logp{old},
//!                                         arg::advantages{adv}, arg::mask{m}, arg::weights{w}};
namespace arg {

template <class Tag, class E>
class named_array {
 public:
  named_array() = default;
  // The first clause keeps copies of named arrays away from the FlatArray check (which asks
  // whether the type is copyable, which would ask this constructor again).
  template <class R>
  requires(!std::is_base_of_v<named_array, std::remove_cvref_t<R>>) &&
      FlatArray<R>&& std::same_as<flat_value_t<R>, E> explicit named_array(R&& r)
      : s_(as_flat_const(r, Tag::name)) {}

  [[nodiscard]] E const* data() const noexcept { return s_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return s_.size(); }
  [[nodiscard]] bool empty() const noexcept { return s_.empty(); }
  [[nodiscard]] E const& operator[](std::size_t k) const noexcept { return s_[k]; }
  [[nodiscard]] std::span<E const> span() const noexcept { return s_; }

 private:
  std::span<E const> s_;
};

#define WEFT_RL_NAMED_ARRAY(type, label)           \
  struct type##_tag {                              \
    static constexpr char const* name = label;     \
  };                                               \
  template <class E>                               \
  struct type : named_array<type##_tag, E> {       \
    using named_array<type##_tag, E>::named_array; \
  };                                               \
  template <FlatArray R>                           \
  type(R&&)->type<flat_value_t<R>>

//! The current policy's log-probs l (the differentiable input).
WEFT_RL_NAMED_ARRAY(new_logp, "logp");
//! The behaviour policy's log-probs l_old (may be empty for reinforce).
WEFT_RL_NAMED_ARRAY(old_logp, "old_logp");
WEFT_RL_NAMED_ARRAY(advantages, "advantages");
//! Nonzero = valid token.
WEFT_RL_NAMED_ARRAY(mask, "mask");
//! Aggregation weights (aggregation_weights).
WEFT_RL_NAMED_ARRAY(weights, "weights");
//! Optional detached per-token importance weights (empty = none).
WEFT_RL_NAMED_ARRAY(rollout_is_weights, "rollout_is_weights");
#undef WEFT_RL_NAMED_ARRAY

}  // namespace arg

}  // namespace weft::rl
