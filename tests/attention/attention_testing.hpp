// tests/attention/attention_testing.hpp — helpers shared by the attention tests: deterministic
// random [batch, seq, heads, dim] tensors, and error metrics between tensors of any element type.
#pragma once

#include <weft/core/dtype.hpp>
#include <weft/core/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <array>
#include <tuple>
#include <vector>

namespace attention_testing {

//! A std::vector-backed row-major array with weft views; the tests own their buffers this way so
//! that they depend only on weft::tensor_view.
template <class T, std::size_t R>
struct owned {
  std::vector<T> buf;
  std::array<std::int64_t, R> ext{};
  owned() = default;
  explicit owned(std::array<std::int64_t, R> e) : ext(e) {
    std::size_t n = 1;
    for (auto x : e) n *= std::size_t(x);
    buf.resize(n);
  }
  [[nodiscard]] weft::tensor_view<T, R> view() {
    return std::apply([&](auto... x) { return weft::tensor_view<T, R>(buf.data(), x...); }, ext);
  }
  [[nodiscard]] weft::tensor_view<T const, R> view() const {
    return std::apply([&](auto... x) { return weft::tensor_view<T const, R>(buf.data(), x...); },
                      ext);
  }
  [[nodiscard]] T* data() { return buf.data(); }
  [[nodiscard]] T const* data() const { return buf.data(); }
  [[nodiscard]] std::size_t size() const { return buf.size(); }
  [[nodiscard]] std::int64_t extent(std::size_t k) const { return ext[k]; }
};

template <class T, class... I>
owned<T, sizeof...(I)> make_owned(I... e) {
  return owned<T, sizeof...(I)>(std::array<std::int64_t, sizeof...(I)>{std::int64_t(e)...});
}

inline std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
//! Uniform in [-1, 1) from (seed, index).
inline double uniform(std::uint64_t seed, std::uint64_t i) {
  return double(splitmix(seed * 0x100000001B3ull + i) >> 11) * 0x1p-52 - 1.0;
}

template <class T, class... I>
owned<T, sizeof...(I)> random_tensor(std::uint64_t seed, double amp, I... ext) {
  auto t = make_owned<T>(ext...);
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = T(amp * uniform(seed, i));
  return t;
}
template <class T, class... I>
owned<T, sizeof...(I)> filled_tensor(double value, I... ext) {
  auto t = make_owned<T>(ext...);
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = T(value);
  return t;
}
//! A copy converted to another element type.
template <class To, class From, std::size_t R>
owned<To, R> converted(owned<From, R> const& src) {
  owned<To, R> t(src.ext);
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = To(double(src.data()[i]));
  return t;
}

struct error_stats {
  double max_abs = 0;               // max |a - b| over finite pairs
  double max_ref = 0;               // max |b|
  double rms = 0;                   // sqrt(mean (a - b)^2)
  bool mismatch_nonfinite = false;  // an infinity or NaN not matched bit-for-bit in kind
  // Relative to the largest reference value, floored at 1e-3 so that an all-zero reference (a
  // one-key row has dq = 0 exactly) measures absolute rounding noise instead of dividing by 0.
  [[nodiscard]] double rel() const { return max_abs / std::max(max_ref, 1e-3); }
};

//! Compares a against reference b elementwise (both flat, same size). -inf must meet -inf.
template <class A, class B>
error_stats compare(A const* a, B const* b, std::size_t n) {
  error_stats s;
  double sq = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double const x = double(a[i]), y = double(b[i]);
    if (!std::isfinite(x) || !std::isfinite(y)) {
      if (!(x == y)) s.mismatch_nonfinite = true;
      continue;
    }
    double const d = std::abs(x - y);
    s.max_abs = std::max(s.max_abs, d);
    s.max_ref = std::max(s.max_ref, std::abs(y));
    sq += d * d;
  }
  s.rms = n ? std::sqrt(sq / double(n)) : 0.0;
  return s;
}
template <class A, class B, std::size_t R>
error_stats compare(owned<A, R> const& a, owned<B, R> const& b) {
  return compare(a.data(), b.data(), std::min(a.size(), b.size()));
}

template <class T, std::size_t R>
bool all_finite_or_neg_inf(owned<T, R> const& t) {
  for (std::size_t i = 0; i < t.size(); ++i) {
    double const x = double(t.data()[i]);
    if (std::isnan(x) || x == std::numeric_limits<double>::infinity()) return false;
  }
  return true;
}

}  // namespace attention_testing
