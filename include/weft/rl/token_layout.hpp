// weft/rl/token_layout.hpp — how the tokens of an RL batch are laid out: `token_layout` (padded [B,
// T] rows or packed sequences described by `cu_seqlens`), and the checks and view-to-span helpers
// every rl entry point uses, so a bad shape throws shape_error naming the argument.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace weft::rl {

namespace detail {

template <class R>
concept contiguous_sized = std::ranges::contiguous_range<R> && std::ranges::sized_range<R>;

template <class R>
concept host_tensor_like = TensorIn<std::remove_cvref_t<R>, host_space> ||
    requires(std::remove_reference_t<R>& r) {
  { r.view() } -> TensorIn<host_space>;
};

template <class R>
auto flat_span(R& r, std::string_view name) {
  if constexpr (contiguous_sized<R&>) {
    return std::span(std::ranges::data(r), static_cast<std::size_t>(std::ranges::size(r)));
  } else if constexpr (TensorIn<std::remove_cvref_t<R>, host_space>) {
    WEFT_EXPECTS_SHAPE(is_contiguous(r), name, "a row-major contiguous view", shape_string(r));
    return std::span(r.data_handle(), static_cast<std::size_t>(r.size()));
  } else {
    auto const v = r.view();
    return std::span(v.data_handle(), static_cast<std::size_t>(v.size()));
  }
}

//! rows * cols as an element count, or shape_error naming `name` if the product overflows.
inline index_t checked_elements(std::size_t rows, index_t cols, std::string_view name) {
  WEFT_EXPECTS_SHAPE(cols >= 0, name, "a non-negative row length", cols);
  constexpr auto max = std::numeric_limits<index_t>::max();
  WEFT_EXPECTS_SHAPE(
      rows <= static_cast<std::size_t>(max) &&
          (cols == 0 || static_cast<index_t>(rows) <= max / cols),
      name, ::weft::detail::concat("rows * row length = ", rows, " * ", cols, " within int64"),
      "an overflowing product");
  return static_cast<index_t>(rows) * cols;
}

}  // namespace detail

//! What every rl entry point takes as a flat per-token (or per-row) array: a contiguous sized
//! range (std::vector, std::array, std::span, a C array) or a host weft view or tensor, which
//! must be row-major contiguous at run time (else shape_error naming the argument).
template <class R>
concept FlatArray = detail::contiguous_sized<R> || detail::host_tensor_like<R>;

//! The element type a FlatArray exposes (const for a const vector or a const view).
template <FlatArray R>
using flat_element_t = typename decltype(detail::flat_span(
    std::declval<std::remove_reference_t<R>&>(), ""))::element_type;
template <FlatArray R>
using flat_value_t = std::remove_const_t<flat_element_t<R>>;

//! A FlatArray whose elements can be written (an output).
template <class R>
concept MutableFlatArray = FlatArray<R> && !std::is_const_v<flat_element_t<R>>;

//! The elements of `r` as a span (shape_error naming `name` for a non-contiguous view).
template <FlatArray R>
[[nodiscard]] std::span<flat_element_t<R>> as_flat(R&& r, std::string_view name = "array") {
  return detail::flat_span(r, name);
}
//! The same, read-only.
template <FlatArray R>
[[nodiscard]] std::span<flat_value_t<R> const> as_flat_const(R&& r,
                                                             std::string_view name = "array") {
  return detail::flat_span(r, name);
}

//! The rows (responses) of a token batch. Every per-token input of an rl function is one flat,
//! contiguous array of `tokens()` elements; the layout says which of them form row i:
//! [row_begin(i), row_end(i)). A padded [B, T] batch is the layout with offsets i*T (its mask marks
//! the padding); a packed batch (verl's remove-padding path, flash-attention's varlen) stores
//! the rows back to back and is described by `cu_seqlens` = {0, L_0, L_0+L_1, ...}. Both go
//! through the same loops, which is why packed and padded inputs give identical results.
class token_layout {
 public:
  token_layout() = default;

  //! `rows` rows of `cols` tokens each, row-major.
  static token_layout padded(index_t rows, index_t cols) {
    WEFT_EXPECTS_SHAPE(rows >= 0, "rows", ">= 0", rows);
    WEFT_EXPECTS_SHAPE(cols >= 0, "cols", ">= 0", cols);
    (void)detail::checked_elements(static_cast<std::size_t>(rows), cols, "rows * cols");
    token_layout l;
    l.rows_ = rows;
    l.cols_ = cols;
    return l;
  }

  //! Packed rows: cu_seqlens has rows+1 non-decreasing offsets starting at 0.
  template <class Int>
  requires std::is_integral_v<Int>
  static token_layout packed(std::span<Int const> cu_seqlens) {
    WEFT_EXPECTS_SHAPE(!cu_seqlens.empty(), "cu_seqlens", "rows + 1 >= 1 offsets", 0);
    WEFT_EXPECTS_SHAPE(cu_seqlens[0] == 0, "cu_seqlens[0]", 0,
                       static_cast<long long>(cu_seqlens[0]));
    token_layout l;
    l.packed_ = true;
    l.offsets_.assign(cu_seqlens.begin(), cu_seqlens.end());
    for (std::size_t i = 1; i < l.offsets_.size(); ++i) {
      WEFT_EXPECTS_SHAPE(
          l.offsets_[i] >= l.offsets_[i - 1], "cu_seqlens", "non-decreasing offsets",
          ::weft::detail::concat("offset ", i, " = ", l.offsets_[i], " < ", l.offsets_[i - 1]));
    }
    l.rows_ = static_cast<index_t>(l.offsets_.size()) - 1;
    return l;
  }
  //! Any FlatArray of integers (std::vector, std::array, a weft view, ...).
  template <FlatArray R>
  requires std::is_integral_v<flat_value_t<R>>
  static token_layout packed(R&& cu_seqlens) {
    return packed(as_flat_const(cu_seqlens, "cu_seqlens"));
  }

  [[nodiscard]] bool is_packed() const noexcept { return packed_; }
  [[nodiscard]] index_t rows() const noexcept { return rows_; }
  [[nodiscard]] index_t tokens() const noexcept {
    return packed_ ? offsets_.back() : rows_ * cols_;
  }
  [[nodiscard]] index_t row_begin(index_t i) const noexcept {
    return packed_ ? offsets_[static_cast<std::size_t>(i)] : i * cols_;
  }
  [[nodiscard]] index_t row_end(index_t i) const noexcept {
    return packed_ ? offsets_[static_cast<std::size_t>(i) + 1] : (i + 1) * cols_;
  }
  //! Padded row length (T), or the longest packed row.
  [[nodiscard]] index_t max_row_length() const noexcept {
    if (!packed_) return cols_;
    index_t m = 0;
    for (index_t i = 0; i < rows_; ++i)
      m = row_end(i) - row_begin(i) > m ? row_end(i) - row_begin(i) : m;
    return m;
  }

 private:
  index_t rows_ = 0;
  index_t cols_ = 0;
  bool packed_ = false;
  std::vector<index_t> offsets_;
};

namespace detail {

//! Throws shape_error unless the per-token array `name` has one element per token.
template <class S>
void expect_tokens(S const& s, token_layout const& layout, std::string_view name) {
  WEFT_EXPECTS_SHAPE(
      static_cast<index_t>(s.size()) == layout.tokens(), name,
      ::weft::detail::concat(layout.tokens(), " elements (one per token of the layout)"), s.size());
}

//! As expect_tokens, but an empty span means "not given".
template <class S>
void expect_tokens_or_empty(S const& s, token_layout const& layout, std::string_view name) {
  if (!s.empty()) expect_tokens(s, layout, name);
}

template <class S>
void expect_rows(S const& s, token_layout const& layout, std::string_view name) {
  WEFT_EXPECTS_SHAPE(static_cast<index_t>(s.size()) == layout.rows(), name,
                     ::weft::detail::concat(layout.rows(), " elements (one per row of the layout)"),
                     s.size());
}

template <class M>
WEFT_HD constexpr bool valid(M m) noexcept {
  return m != M{};
}

}  // namespace detail

//! The elements of a host view as one flat span, for the rl functions (which take flat per-token
//! arrays). Throws shape_error naming `name` unless the view is row-major contiguous.
template <TensorIn<host_space> V>
[[nodiscard]] std::span<typename V::element_type> flat(V const& v, std::string_view name = "view") {
  WEFT_EXPECTS_SHAPE(is_contiguous(v), name, "a row-major contiguous view", shape_string(v));
  return {v.data_handle(), static_cast<std::size_t>(v.size())};
}

//! The layout of a padded rank-2 view [B, T].
template <TensorIn<host_space> V>
requires(V::rank() == 2) [[nodiscard]] token_layout padded_layout(V const& v) {
  return token_layout::padded(static_cast<index_t>(v.extent(0)), static_cast<index_t>(v.extent(1)));
}

}  // namespace weft::rl
