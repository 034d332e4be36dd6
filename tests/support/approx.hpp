// tests/support/approx.hpp — the one comparison of a computed array against its reference for
// weft's tests: bitwise, or within a relative + absolute tolerance, or within N ulps; NaN and
// infinities compare by kind, and a failure names the first mismatches (index, expected, actual)
// and how many there were, as llm.c's validate_result does.
#pragma once

#include <weft/core/dtype.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace weft::test {

//! When an element `got` passes against its reference `want`:
//! - bitwise: the bit patterns are equal (signed zeros and NaN payloads count);
//! - otherwise: both NaN, or the same infinity, or |got - want| <= abs + rel * |want|, or the two
//!   are at most `ulps` representable values apart (for integers: |got - want| <= ulps).
//! A NaN never passes against a number, nor an infinity against a finite value: the tolerance
//! cannot hide a lost guard.
struct tolerance {
  double rel = 0.0;
  double abs = 0.0;
  std::uint64_t ulps = 0;
  bool bitwise = false;

  [[nodiscard]] static constexpr tolerance exact() noexcept { return {0.0, 0.0, 0, true}; }
  [[nodiscard]] static constexpr tolerance within(double rel, double abs = 0.0) noexcept {
    return {rel, abs, 0, false};
  }
  [[nodiscard]] static constexpr tolerance ulp(std::uint64_t n) noexcept {
    return {0.0, 0.0, n, false};
  }
};

namespace approx_detail {

template <std::size_t Bytes>
struct bits_of;
template <>
struct bits_of<1> {
  using type = std::uint8_t;
};
template <>
struct bits_of<2> {
  using type = std::uint16_t;
};
template <>
struct bits_of<4> {
  using type = std::uint32_t;
};
template <>
struct bits_of<8> {
  using type = std::uint64_t;
};

template <class T>
typename bits_of<sizeof(T)>::type raw_bits(T x) noexcept {
  typename bits_of<sizeof(T)>::type b{};
  std::memcpy(&b, &x, sizeof(T));
  return b;
}

//! Maps an IEEE bit pattern (f64, f32, f16, bf16: sign-magnitude) to an unsigned key whose order
//! is the order of the values, so that neighbouring floats have neighbouring keys and -0 and +0
//! share one.
template <class T>
std::uint64_t ordered_key(T x) noexcept {
  std::uint64_t const b = raw_bits(x);
  std::uint64_t const sign = std::uint64_t{1} << (8 * sizeof(T) - 1);
  return (b & sign) != 0 ? sign - (b & ~sign) : sign + b;
}

}  // namespace approx_detail

//! The value of `x` as a double: exact for every weft element type except i64 beyond 2^53.
template <class T>
double as_double(T x) noexcept {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<double>(x);
  } else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
    return static_cast<double>(x);
  } else {
    return static_cast<double>(static_cast<float>(x));  // bf16, f16
  }
}

//! How many representable values of T lie between a and b (0: equal; NaN: the maximum).
template <class T>
std::uint64_t ulp_distance(T a, T b) noexcept {
  if constexpr (std::is_integral_v<T>) {
    auto const x = static_cast<long double>(a);
    auto const y = static_cast<long double>(b);
    return static_cast<std::uint64_t>(x > y ? x - y : y - x);
  } else {
    if (std::isnan(as_double(a)) || std::isnan(as_double(b)))
      return std::numeric_limits<std::uint64_t>::max();
    if (as_double(a) == as_double(b)) return 0;  // +0 and -0
    auto const ka = approx_detail::ordered_key(a);
    auto const kb = approx_detail::ordered_key(b);
    return ka > kb ? ka - kb : kb - ka;
  }
}

//! Whether one element passes (see `tolerance`).
template <class T>
bool close(T got, T want, tolerance tol) noexcept {
  if (tol.bitwise) return approx_detail::raw_bits(got) == approx_detail::raw_bits(want);
  double const g = as_double(got);
  double const w = as_double(want);
  if (std::isnan(g) || std::isnan(w)) return std::isnan(g) && std::isnan(w);
  if (std::isinf(g) || std::isinf(w)) return g == w;
  if (g == w) return true;
  if (std::fabs(g - w) <= tol.abs + tol.rel * std::fabs(w)) return true;
  return tol.ulps > 0 && ulp_distance(got, want) <= tol.ulps;
}

//! An element written for a failure report: the value with 17 digits and, for floats, its bits.
template <class T>
std::string show_value(T x) {
  std::ostringstream os;
  if constexpr (std::is_integral_v<T>) {
    os << static_cast<long long>(x);
  } else {
    os.precision(17);
    os << as_double(x) << " (bits 0x" << std::hex
       << static_cast<std::uint64_t>(approx_detail::raw_bits(x)) << ")";
  }
  return os.str();
}

//! The result of comparing two arrays: counts, the first few mismatches, the worst errors.
struct comparison {
  struct mismatch {
    std::size_t index = 0;
    std::string expected;
    std::string actual;
    std::uint64_t ulps = 0;
  };
  std::size_t checked = 0;
  std::size_t failed = 0;
  bool size_differs = false;
  std::size_t got_size = 0;
  std::size_t want_size = 0;
  std::vector<mismatch> first;  // at most `keep` of them, in index order
  double max_abs = 0.0;         // over finite pairs
  std::uint64_t max_ulps = 0;

  [[nodiscard]] bool ok() const noexcept { return !size_differs && failed == 0; }
  explicit operator bool() const noexcept { return ok(); }

  //! "<what>: 3 of 1000 elements differ (max |diff| 0.5, max 2 ulps); first: [7] expected 1 (bits
  //! ...), got 1.5 (bits ...), ..."
  [[nodiscard]] std::string report(std::string_view what) const {
    std::ostringstream os;
    os << what << ": ";
    if (size_differs) {
      os << "got " << got_size << " elements, expected " << want_size;
      return os.str();
    }
    os << failed << " of " << checked << " elements differ (max |diff| " << max_abs << ", max "
       << max_ulps << " ulps); first:";
    for (auto const& m : first)
      os << "\n  [" << m.index << "] expected " << m.expected << ", got " << m.actual << " ("
         << (m.ulps == std::numeric_limits<std::uint64_t>::max() ? std::string("NaN")
                                                                 : std::to_string(m.ulps))
         << " ulps)";
    return os.str();
  }
};

//! Compares `got` with the reference `want` element by element under `tol`.
template <class T>
comparison compare(std::span<T const> got, std::span<T const> want, tolerance tol,
                   std::size_t keep = 5) {
  comparison r;
  r.got_size = got.size();
  r.want_size = want.size();
  if (got.size() != want.size()) {
    r.size_differs = true;
    return r;
  }
  r.checked = got.size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    double const g = as_double(got[i]);
    double const w = as_double(want[i]);
    if (std::isfinite(g) && std::isfinite(w)) r.max_abs = std::max(r.max_abs, std::fabs(g - w));
    std::uint64_t const u = ulp_distance(got[i], want[i]);
    if (u != std::numeric_limits<std::uint64_t>::max()) r.max_ulps = std::max(r.max_ulps, u);
    if (close(got[i], want[i], tol)) continue;
    ++r.failed;
    if (r.first.size() < keep) r.first.push_back({i, show_value(want[i]), show_value(got[i]), u});
  }
  return r;
}

template <class T>
comparison compare(std::vector<T> const& got, std::vector<T> const& want, tolerance tol,
                   std::size_t keep = 5) {
  return compare(std::span<T const>(got), std::span<T const>(want), tol, keep);
}

//! One doctest check over a whole array: passes silently, or fails once with compare()'s report.
//! Returns whether it passed.
template <class T>
bool check_close(std::span<T const> got, std::span<T const> want, tolerance tol,
                 std::string_view what) {
  comparison const r = compare(got, want, tol);
  if (!r.ok()) {
    std::string const msg = r.report(what);
    FAIL_CHECK(msg);
  }
  return r.ok();
}

}  // namespace weft::test
