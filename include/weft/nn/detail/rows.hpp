// weft/nn/detail/rows.hpp — how nn's row functors see memory: a row of a view as a pointer and an
// element stride (WEFT_HD, so a CUDA kernel hands them the same rows), and the row of a host view.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/math.hpp>
#include <weft/nn/detail/args.hpp>

namespace weft::nn::detail {

//! Elements p[0], p[s], p[2s], ...: one row (or a rank-1 view) in any layout.
template <class T>
struct strided_row {
  T* p = nullptr;
  index_t s = 1;
  WEFT_HD constexpr T& operator[](index_t j) const noexcept { return p[j * s]; }
};

//! Row i of a rank-2 host view.
template <class V>
strided_row<typename V::element_type> row_of(V const& v, index_t i) {
  auto const s = ext(v, 1) > 1 ? static_cast<index_t>(v.stride(1)) : index_t{1};
  return {v.data_handle() + (ext(v, 1) > 0 ? v.mapping()(i, 0) : 0), s};
}

//! A rank-1 host view as a row.
template <class V>
strided_row<typename V::element_type> as_row(V const& v) {
  auto const s = ext(v, 0) > 1 ? static_cast<index_t>(v.stride(0)) : index_t{1};
  return {v.data_handle(), s};
}

}  // namespace weft::nn::detail
