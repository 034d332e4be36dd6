// weft/core/algorithm/copy.hpp — weft::copy, both halves: copy(dst, src) between any two memory
// spaces, run by the calling host thread (memcpy, cudaMemcpy or an element loop), and
// copy(ex, dst, src) within the executor's memory space, run by the executor (any layouts, a
// kernel for exec::cuda).
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>   // WEFT_EXPECTS, WEFT_EXPECTS_SHAPE, error(errc::unsupported)
#include <weft/core/exec.hpp>    // Executor, for_each_index
#include <weft/core/memory.hpp>  // copy_bytes
#include <weft/core/tensor/owning.hpp>  // tensor, for snapshots and host staging buffers
#include <weft/core/tensor/view.hpp>    // Tensor, TensorIn, MutableTensor, is_contiguous

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

namespace weft {

// One contract for both overloads: dst and src have the same value type, the same rank and the
// same extents (checked first: shape_error, and nothing has been written); every element of src
// is written to the element of dst at the same multi-index, whatever either layout. Call it
// qualified (weft::copy): unqualified, ADL also finds cuda::std::copy through the view's type.
// They differ in who runs the loop, and so in what they accept:
//  - copy(dst, src): any two memory spaces, on the calling host thread; overlapping host views are
//    well defined; a non-contiguous device view needs a kernel, so it throws errc::unsupported;
//  - copy(ex, dst, src): both views in the executor's memory space (checked at compile time),
//    any layouts, asynchronous for exec::cuda.
// Both treat overlap alike: overlapping host views are copied as if all of src were read before
// dst is written; overlapping device views throw invalid_argument_error before anything is
// written (a safe copy would need a device snapshot, which weft does not allocate unasked).

namespace detail {

template <Tensor Dst, Tensor Src>
void check_same_extents(Dst const& dst, Src const& src) {
  bool same = true;
  for (std::size_t k = 0; k != Dst::rank(); ++k)
    same = same && static_cast<index_t>(dst.extent(k)) == static_cast<index_t>(src.extent(k));
  WEFT_EXPECTS_SHAPE(same, "src", concat("extents ", shape_string(dst), " (those of `dst`)"),
                     shape_string(src));
}

template <Tensor Dst, Tensor Src>
void host_strided_copy(Dst const& dst, Src const& src) {
  auto* const d = dst.data_handle();
  auto const* const s = src.data_handle();
  for_each_offset_pair<Dst::rank()>(extents_of(dst), strides_of(dst), strides_of(src),
                                    [&](index_t od, index_t os) { d[od] = s[os]; });
}

//! The bytes [first, last) that a view's elements lie in (negative strides included); empty for a
//! view with no elements. Addresses as integers: comparing pointers into unrelated objects is
//! unspecified, and unsigned arithmetic wraps where a negative stride reaches below the handle.
template <Tensor V>
std::pair<std::uintptr_t, std::uintptr_t> byte_span(V const& v) {
  using T = typename V::value_type;
  auto const ext = extents_of(v);
  auto const str = strides_of(v);
  index_t lo = 0, hi = 0;
  for (std::size_t k = 0; k != V::rank(); ++k) {
    if (ext[k] == 0) return {0, 0};
    index_t const reach = (ext[k] - 1) * str[k];
    (reach < 0 ? lo : hi) += reach;
  }
  auto const base = reinterpret_cast<std::uintptr_t>(v.data_handle());
  return {base + static_cast<std::uintptr_t>(lo) * sizeof(T),
          base + static_cast<std::uintptr_t>(hi + 1) * sizeof(T)};
}

//! Whether the byte ranges of two views intersect (a conservative test: interleaved views that
//! share no element still count, and are then copied through a snapshot, which is also correct).
template <Tensor A, Tensor B>
bool spans_overlap(A const& a, B const& b) {
  auto const [a0, a1] = byte_span(a);
  auto const [b0, b1] = byte_span(b);
  return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

template <class T>
struct copy_contiguous_fn {
  T* dst;
  T const* src;
  WEFT_HD void operator()(index_t i) const noexcept { dst[i] = src[i]; }
};

template <class T, std::size_t R>
struct copy_strided_fn {
  T* dst;
  strided_offset<R> dst_at;
  T const* src;
  strided_offset<R> src_at;
  WEFT_HD void operator()(index_t i) const noexcept { dst[dst_at(i)] = src[src_at(i)]; }
};

}  // namespace detail

//! Copies src's elements into dst (same rank, same extents, same value type), across memory
//! spaces: one memcpy/cudaMemcpy when both are contiguous, an element loop between strided host
//! views, a host staging buffer when a strided host view meets a contiguous device view. A
//! strided device view throws error(errc::unsupported): use copy(ex, dst, src) below.
//! Shapes are checked first (shape_error); on any error nothing has been written.
//! Overlapping host views are copied as if all of src were read before dst is written (memmove
//! for two contiguous views, a snapshot of src otherwise), so an in-place shift or transpose is
//! well defined. Overlapping device views throw invalid_argument_error before anything is written.
template <Tensor Dst, Tensor Src>
requires MutableTensor<Dst> && std::same_as<typename Dst::value_type, typename Src::value_type> &&
    (Dst::rank() == Src::rank()) void copy(Dst const& dst, Src const& src) {
  using T = typename Dst::value_type;
  using dst_space = memory_space_t<Dst>;
  using src_space = memory_space_t<Src>;
  detail::check_same_extents(dst, src);
  if (dst.size() == 0) return;
  bool const dst_c = is_contiguous(dst);
  bool const src_c = is_contiguous(src);
  if constexpr (dst_space::host_accessible && src_space::host_accessible) {
    if (detail::spans_overlap(dst, src)) {
      if (dst_c && src_c) {
        std::memmove(dst.data_handle(), src.data_handle(), dst.size() * sizeof(T));
      } else {
        tensor<T, Dst::rank(), host_space> snapshot(detail::to_std_array(detail::extents_of(dst)));
        detail::host_strided_copy(snapshot.view(), src);
        detail::host_strided_copy(dst, snapshot.view());
      }
      return;
    }
  } else if constexpr (std::same_as<dst_space, src_space>) {
    WEFT_EXPECTS(!detail::spans_overlap(dst, src), "dst",
                 "a device view that does not overlap `src` (copy through a separate buffer)",
                 "overlapping byte ranges");
  }
  if (dst_c && src_c) {
    copy_bytes(dst_space{}, dst.data_handle(), src_space{}, src.data_handle(),
               dst.size() * sizeof(T));
  } else if constexpr (dst_space::host_accessible && src_space::host_accessible) {
    detail::host_strided_copy(dst, src);
  } else {
    bool const device_side_contiguous =
        (dst_space::host_accessible || dst_c) && (src_space::host_accessible || src_c);
    if (!device_side_contiguous)
      throw error(errc::unsupported,
                  detail::concat("weft::copy: a non-contiguous view in device memory (dst strides ",
                                 detail::array_string(detail::strides_of(dst)), ", src strides ",
                                 detail::array_string(detail::strides_of(src)),
                                 ") needs a kernel; use weft::copy(exec, dst, src) from "
                                 "<weft/core/algorithm/copy.hpp> in a .cu translation unit"),
                  source_location::current());
    tensor<T, Dst::rank(), host_space> staging(detail::to_std_array(detail::extents_of(dst)));
    if constexpr (dst_space::host_accessible) {
      copy_bytes(host_space{}, staging.data(), src_space{}, src.data_handle(),
                 staging.size_bytes());
      detail::host_strided_copy(dst, staging.view());
    } else {
      detail::host_strided_copy(staging.view(), src);
      copy_bytes(dst_space{}, dst.data_handle(), host_space{}, staging.data(),
                 staging.size_bytes());
    }
  }
}

//! Element-wise copy between two views of the executor's memory space, any layouts (the
//! cross-space copy is weft::copy(dst, src) above). Extents must match (shape_error,
//! checked before anything runs). Call it qualified (weft::copy).
//! Overlapping views: in a host-accessible space the copy waits for ex (ex.synchronize()) and
//! then runs as copy(dst, src) on the calling thread, which reads all of src before writing dst
//! (memmove or a snapshot): split over a team, the element loop would read elements another
//! worker, or an earlier index, had already written. In a device space they throw
//! invalid_argument_error before anything is launched.
template <Executor E, TensorIn<memory_space_t<E>> Dst, TensorIn<memory_space_t<E>> Src>
requires MutableTensor<Dst> && std::same_as<typename Dst::value_type, typename Src::value_type> &&
    (Dst::rank() == Src::rank()) void copy(E const& ex, Dst const& dst, Src const& src) {
  using T = typename Dst::value_type;
  detail::check_same_extents(dst, src);
  auto const n = static_cast<index_t>(dst.size());
  if (n == 0) return;
  if constexpr (!memory_space_t<E>::host_accessible) {
    WEFT_EXPECTS(!detail::spans_overlap(dst, src), "dst",
                 "a device view that does not overlap `src` (copy through a separate buffer)",
                 "overlapping byte ranges");
  } else if (detail::spans_overlap(dst, src)) {
    ex.synchronize();  // work already submitted through ex may still be using either view
    weft::copy(dst, src);
    return;
  }
  if (is_contiguous(dst) && is_contiguous(src)) {
    for_each_index(ex, n, detail::copy_contiguous_fn<T>{dst.data_handle(), src.data_handle()});
  } else {
    using fn = detail::copy_strided_fn<T, Dst::rank()>;
    for_each_index(
        ex, n,
        fn{dst.data_handle(), detail::offsets_of(dst), src.data_handle(), detail::offsets_of(src)});
  }
}

}  // namespace weft
