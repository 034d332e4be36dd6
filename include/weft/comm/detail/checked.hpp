// weft/comm/detail/checked.hpp — size arithmetic on user-supplied counts, checked: every backend
// sums `_v` counts and scales element counts to bytes through these, so a wrap-around (counts
// {SIZE_MAX, 1} summing to 0, then a null pointer offset) is an invalid_argument_error naming
// the argument instead of a wild pointer.
#pragma once

#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <cstddef>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

namespace weft::comm::detail {

//! a + b, or invalid_argument_error naming `what` when it does not fit in std::size_t.
inline std::size_t checked_add(std::size_t a, std::size_t b, std::string_view what,
                               source_location where = source_location::current()) {
  std::size_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    throw invalid_argument_error(
        weft::detail::concat(
            "argument `", what, "`: expected a sum that fits in std::size_t (at most ",
            std::numeric_limits<std::size_t>::max(), "), actual ", a, " + ", b, " overflows"),
        where);
  return r;
}

//! a * b, or invalid_argument_error naming `what` when it does not fit in std::size_t.
inline std::size_t checked_mul(std::size_t a, std::size_t b, std::string_view what,
                               source_location where = source_location::current()) {
  std::size_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    throw invalid_argument_error(
        weft::detail::concat(
            "argument `", what, "`: expected a product that fits in std::size_t (at most ",
            std::numeric_limits<std::size_t>::max(), "), actual ", a, " * ", b, " overflows"),
        where);
  return r;
}

//! count * size_of(type): the bytes of a buffer of `count` elements, checked.
inline std::size_t checked_bytes(std::size_t count, dtype type, std::string_view what,
                                 source_location where = source_location::current()) {
  std::size_t const es = size_of(type);
  if (es != 0 && count > std::numeric_limits<std::size_t>::max() / es) [[unlikely]]
    throw invalid_argument_error(
        weft::detail::concat("argument `", what, "`: expected at most ",
                             std::numeric_limits<std::size_t>::max() / es, " elements of ", type,
                             " (their bytes must fit in std::size_t), actual ", count),
        where);
  return count * es;
}

//! off[0] = 0, off[i + 1] = counts[0] + ... + counts[i]: the element offsets of the blocks of a
//! `_v` collective. Throws invalid_argument_error naming `name` when the sum, or the sum in bytes
//! of elements of `type`, does not fit in std::size_t.
inline std::vector<std::size_t> checked_offsets(
    std::span<std::size_t const> counts, dtype type, std::string_view name,
    source_location where = source_location::current()) {
  std::vector<std::size_t> off(counts.size() + 1, 0);
  std::size_t const es = size_of(type);
  std::size_t const limit = std::numeric_limits<std::size_t>::max() / (es == 0 ? 1 : es);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    std::size_t next = 0;
    if (__builtin_add_overflow(off[i], counts[i], &next) || next > limit) [[unlikely]]
      throw invalid_argument_error(
          weft::detail::concat(
              "argument `", name, "`: expected a sum of counts of at most ", limit, " elements of ",
              type, " (their bytes must fit in std::size_t), actual ", name, "[0] + ... + ", name,
              "[", i, "] = ", off[i], " + ", counts[i], " overflows"),
          where);
    off[i + 1] = next;
  }
  return off;
}

//! The sum of `counts`, checked as checked_offsets does.
inline std::size_t checked_sum(std::span<std::size_t const> counts, dtype type,
                               std::string_view name,
                               source_location where = source_location::current()) {
  return checked_offsets(counts, type, name, where).back();
}

}  // namespace weft::comm::detail
