// tests/support/checks.hpp — the small checks many test files share: has(text, part) for the
// words of an exception message, message_of(f) (the what() of the exception f throws, "" when it
// throws none), close_rel(a, b, rel), inf, and under_sanitizer. One definition here, not one per
// file: the test programs are unity builds (CMAKE_UNITY_BUILD in the presets), where two files'
// helpers of one name would clash or, worse, overload each other.
#pragma once

#include <cmath>
#include <exception>
#include <limits>
#include <string>
#include <string_view>

namespace weft::test {

//! Whether `part` occurs in `s`.
inline bool has(std::string_view s, std::string_view part) { return s.find(part) != s.npos; }

//! The what() of the std::exception that f() throws; "" when it returns normally.
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (std::exception const& e) {
    return e.what();
  }
  return "";
}

//! +infinity as a double.
inline constexpr double inf = std::numeric_limits<double>::infinity();

//! Whether this program is built with AddressSanitizer or ThreadSanitizer (10 to 20 times slower):
//! the few exhaustive grids that would take minutes there run a part of their grid under it, and
//! the whole grid in the default build.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool under_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool under_sanitizer = true;
#else
inline constexpr bool under_sanitizer = false;
#endif
#else
inline constexpr bool under_sanitizer = false;
#endif

//! |a - b| <= rel |b|.
inline bool close_rel(double a, double b, double rel) {
  return std::abs(a - b) <= rel * std::abs(b);
}

}  // namespace weft::test
