// weft/core/algorithm/fill.hpp — weft::fill, both halves: fill(v, x) on a host view, run by the
// calling thread, and fill(ex, v, x) on a view in the executor's memory space, run by the
// executor (a kernel for exec::cuda).
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/exec.hpp>         // Executor, for_each_index
#include <weft/core/memory.hpp>       // host_space
#include <weft/core/tensor/view.hpp>  // TensorIn, MutableTensor, is_contiguous

#include <cstddef>

namespace weft {

// One contract for both overloads: every element of `v` (any layout, any rank, empty included)
// becomes `value`, and nothing outside `v` is written. Call it qualified (weft::fill):
// unqualified, ADL also finds cuda::std::fill through the view's type. They differ in who runs
// the loop: fill(v, x) takes host views only (checked at compile time) and returns when done;
// fill(ex, v, x) takes views in the executor's memory space and is asynchronous for exec::cuda.

namespace detail {

template <class T>
struct fill_contiguous_fn {
  T* data;
  T value;
  WEFT_HD void operator()(index_t i) const noexcept { data[i] = value; }
};

template <class T, std::size_t R>
struct fill_strided_fn {
  T* data;
  strided_offset<R> at;
  T value;
  WEFT_HD void operator()(index_t i) const noexcept { data[at(i)] = value; }
};

}  // namespace detail

//! Sets every element of a host view to `value`.
template <TensorIn<host_space> V>
requires MutableTensor<V>
void fill(V const& v, typename V::value_type const& value) {
  auto* const p = v.data_handle();
  auto const str = detail::strides_of(v);
  detail::for_each_offset_pair<V::rank()>(detail::extents_of(v), str, str,
                                          [&](index_t o, index_t) { p[o] = value; });
}

//! Sets every element of `v` to `value`, running on `ex` (asynchronous for exec::cuda). The
//! view must live in the executor's memory space. Call it qualified (weft::fill): unqualified,
//! ADL also finds cuda::std::fill through the view's type.
template <Executor E, TensorIn<memory_space_t<E>> V>
requires MutableTensor<V>
void fill(E const& ex, V const& v, typename V::value_type const& value) {
  using T = typename V::value_type;
  auto const n = static_cast<index_t>(v.size());
  if (n == 0) return;
  if (is_contiguous(v)) {
    for_each_index(ex, n, detail::fill_contiguous_fn<T>{v.data_handle(), value});
  } else {
    using fn = detail::fill_strided_fn<T, V::rank()>;
    for_each_index(ex, n, fn{v.data_handle(), detail::offsets_of(v), value});
  }
}

}  // namespace weft
