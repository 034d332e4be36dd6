// weft/comm/reference.hpp — what a reduction means, element by element, for every reduce_kind and
// dtype (bf16/f16 accumulate in f32 and round once; integer rules below), as WEFT_HD functors, and
// the serial rank-ordered reference reducer that every backend's results are checked against.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

namespace weft::comm {

//! The type a reduction accumulates in: f32 for f32, bf16 and f16 (rounded to the element type
//! once, at the end); f64 for f64; the element type itself for integers.
template <Element T>
struct accumulator {
  using type = T;
};
template <>
struct accumulator<bf16> {
  using type = float;
};
template <>
struct accumulator<f16> {
  using type = float;
};
template <Element T>
using accumulator_t = typename accumulator<T>::type;

namespace detail {

// Integer sum and product wrap modulo 2^bits (two's complement), in every backend: done on the
// unsigned type so that signed overflow, undefined in C++, never happens.
template <class T>
WEFT_HD constexpr T wrapping_add(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <class T>
WEFT_HD constexpr T wrapping_mul(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    // u8 * u8 promotes to int, where 255 * 255 cannot overflow; wider types stay unsigned.
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

}  // namespace detail

//! The element math of one reduction, as a fold in ascending rank order:
//!   acc = load(x_0, s_0); acc = combine(acc, load(x_r, s_r)) for r = 1 .. n-1; out = finish(acc,
//!   n)
//! where s_r is rank r's premul_sum scalar converted to the accumulator type (ignored by the
//! other kinds). Semantics, identical in every backend:
//!  - sum, avg, premul_sum add in the accumulator type; integers wrap modulo 2^bits.
//!  - prod multiplies in the accumulator type; integers wrap.
//!  - min, max propagate NaN (a NaN input gives NaN); otherwise the first of equal values wins.
//!  - avg: floats divide the sum by n in the accumulator type; integers divide the (wrapped) sum
//!    by n truncating toward zero (NCCL's SumPostDiv): avg(-3, 0) == -1.
//!  - premul_sum: sum over ranks of s_r * x_r. For integers s_r must be an integer representable
//!    in the element type (validate_reduce_op checks it) and the products wrap.
//!  - finish rounds the accumulator to the element type once (nearest-even for bf16/f16).
template <Element T, reduce_kind Kind>
struct reducer {
  using value_type = T;
  using acc_type = accumulator_t<T>;

  WEFT_HD static constexpr acc_type load(T x, acc_type scale) noexcept {
    auto const a = static_cast<acc_type>(x);
    if constexpr (Kind == reduce_kind::premul_sum) {
      return detail::wrapping_mul(scale, a);
    } else {
      (void)scale;
      return a;
    }
  }

  WEFT_HD static constexpr acc_type combine(acc_type a, acc_type b) noexcept {
    if constexpr (Kind == reduce_kind::prod) {
      return detail::wrapping_mul(a, b);
    } else if constexpr (Kind == reduce_kind::min) {
      if (a != a) return a;  // NaN wins (never true for integers)
      if (b != b) return b;
      return b < a ? b : a;
    } else if constexpr (Kind == reduce_kind::max) {
      if (a != a) return a;
      if (b != b) return b;
      return a < b ? b : a;
    } else {
      return detail::wrapping_add(a, b);
    }
  }

  WEFT_HD static constexpr T finish(acc_type a, int n) noexcept {
    if constexpr (Kind == reduce_kind::avg) {
      if constexpr (std::is_integral_v<T>) {
        // 64-bit division: n may exceed the range of u8, and i64's sum / n cannot overflow (n >=
        // 1).
        a = static_cast<acc_type>(static_cast<std::int64_t>(a) / static_cast<std::int64_t>(n));
      } else {
        a = a / static_cast<acc_type>(n);
      }
    }
    if constexpr (std::is_same_v<T, acc_type>) {
      return a;
    } else {
      return T(a);  // bf16/f16 from float: one round to nearest even
    }
  }
};

//! Calls f(std::integral_constant<reduce_kind, K>{}) for the runtime kind `k`.
template <class F>
constexpr decltype(auto) dispatch_reduce_kind(reduce_kind k, F&& f) {
  switch (k) {
    case reduce_kind::sum: return f(std::integral_constant<reduce_kind, reduce_kind::sum>{});
    case reduce_kind::prod: return f(std::integral_constant<reduce_kind, reduce_kind::prod>{});
    case reduce_kind::min: return f(std::integral_constant<reduce_kind, reduce_kind::min>{});
    case reduce_kind::max: return f(std::integral_constant<reduce_kind, reduce_kind::max>{});
    case reduce_kind::avg: return f(std::integral_constant<reduce_kind, reduce_kind::avg>{});
    case reduce_kind::premul_sum:
      return f(std::integral_constant<reduce_kind, reduce_kind::premul_sum>{});
  }
  WEFT_EXPECTS(false, "op.kind", "one of sum, prod, min, max, avg, premul_sum",
               static_cast<int>(k));
  return f(std::integral_constant<reduce_kind, reduce_kind::sum>{});  // unreachable
}

//! Throws invalid_argument_error unless `op` is a reduction every backend can apply to `type`:
//! the kind is one of the enum's; a premul_sum scalar is finite in the accumulator type (a NaN or
//! infinite scale would turn every element into NaN or +-inf, and a double beyond FLT_MAX becomes
//! inf in f32), and for integer dtypes an integer that the element type can hold (3.0 is fine for
//! i32; 0.5 or 300.0 for u8 are not).
inline void validate_reduce_op(reduce_op op, dtype type) {
  auto const k = static_cast<unsigned>(op.kind);
  WEFT_EXPECTS(k <= static_cast<unsigned>(reduce_kind::premul_sum), "op.kind",
               "one of sum, prod, min, max, avg, premul_sum", k);
  if (op.kind != reduce_kind::premul_sum) return;
  if (is_floating(type)) {
    // f64 accumulates in double; f32, bf16 and f16 in float.
    double const limit = type == dtype::f64
                             ? std::numeric_limits<double>::max()
                             : static_cast<double>(std::numeric_limits<float>::max());
    WEFT_EXPECTS(std::isfinite(op.scalar) && std::fabs(op.scalar) <= limit, "op.scalar",
                 weft::detail::concat("a finite premul_sum scale (|scalar| <= ", limit,
                                      ", the largest ", type == dtype::f64 ? "double" : "float",
                                      ": ", name(type), " accumulates in it)"),
                 op.scalar);
    return;
  }
  double lo = 0.0;
  double hi = 0.0;
  switch (type) {
    case dtype::i32:
      lo = -2147483648.0;
      hi = 2147483647.0;
      break;
    case dtype::i64:
      lo = -9223372036854775808.0;
      hi = 9223372036854775807.0;
      break;
    case dtype::u8:
      lo = 0.0;
      hi = 255.0;
      break;
    default: break;
  }
  bool const integral = std::isfinite(op.scalar) && std::trunc(op.scalar) == op.scalar;
  // 2^63 is the double nearest i64's maximum and is out of range: compare with < for i64.
  bool const in_range = op.scalar >= lo && (type == dtype::i64 ? op.scalar < hi : op.scalar <= hi);
  WEFT_EXPECTS(integral && in_range, "op.scalar",
               weft::detail::concat("an integer representable in ", name(type),
                                    " (premul_sum over an integer dtype)"),
               op.scalar);
}

//! The premul_sum scale of one rank in the accumulator type (1 for the other kinds).
template <Element T>
constexpr accumulator_t<T> scale_of(reduce_op op) noexcept {
  if (op.kind != reduce_kind::premul_sum) return static_cast<accumulator_t<T>>(1);
  return static_cast<accumulator_t<T>>(op.scalar);
}

//! Serial reference: out[i] = fold over ranks r = 0, 1, ..., n-1 of inputs[r][i] (see reducer),
//! with rank r's premul_sum scalar taken from ops[r] (the kind must be the same on all ranks).
//! `out` may alias one of the inputs. Every input must have out.size() elements.
template <Element T>
void reduce_reference(std::span<T const* const> inputs, std::span<reduce_op const> ops,
                      std::span<T> out) {
  auto const n = static_cast<int>(inputs.size());
  WEFT_EXPECTS(n >= 1, "inputs.size()", ">= 1", n);
  WEFT_EXPECTS(ops.size() == inputs.size(), "ops.size()", inputs.size(), ops.size());
  for (auto const& o : ops) {
    validate_reduce_op(o, dtype_of<T>);
    WEFT_EXPECTS(o.kind == ops[0].kind, "ops[r].kind", to_string(ops[0].kind), to_string(o.kind));
  }
  dispatch_reduce_kind(ops[0].kind, [&](auto kind) {
    using R = reducer<T, decltype(kind)::value>;
    std::vector<accumulator_t<T>> scale(inputs.size());
    for (std::size_t r = 0; r < inputs.size(); ++r) scale[r] = scale_of<T>(ops[r]);
    for (std::size_t i = 0; i < out.size(); ++i) {
      auto acc = R::load(inputs[0][i], scale[0]);
      for (std::size_t r = 1; r < inputs.size(); ++r)
        acc = R::combine(acc, R::load(inputs[r][i], scale[r]));
      out[i] = R::finish(acc, n);
    }
  });
}

//! Convenience: every rank uses the same op.
template <Element T>
void reduce_reference(std::span<T const* const> inputs, reduce_op op, std::span<T> out) {
  std::vector<reduce_op> ops(inputs.size(), op);
  reduce_reference<T>(inputs, std::span<reduce_op const>(ops), out);
}

}  // namespace weft::comm
