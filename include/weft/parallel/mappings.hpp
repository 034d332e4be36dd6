// weft/parallel/mappings.hpp — Megatron's conjugate maps over a tensor-parallel group, each a
// forward/backward pair: copy_to_tp (f), reduce_from_tp (g), scatter/gather along the last
// (hidden) dimension, and the sequence-parallel maps along dim 0 (tokens) of [tokens, hidden].
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/parallel/detail/tp_matrix.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace weft::parallel {

// Every map is collective over `tp` (every rank calls it, in the same order, with the same
// shapes) and completes before returning. At group size 1 nothing is communicated: in-place maps
// return at once, out-of-place ones copy their input. The maps come in conjugate pairs: the
// backward of each is the adjoint of its forward, so that a layer's backward is its forward run
// through the adjoints in reverse:
//
//   map                    forward                  backward
//   copy_to_tp        (f)  identity                 all-reduce SUM
//   reduce_from_tp    (g)  all-reduce SUM           identity
//   scatter_to_tp          keep own last-dim slice  all-gather last dim
//   gather_from_tp         all-gather last dim      keep own last-dim slice
//   scatter_to_sp          keep own dim-0 slice     all-gather dim 0
//   gather_from_sp         all-gather dim 0         reduce-scatter dim 0 (SUM)
//   reduce_scatter_to_sp   reduce-scatter dim 0     all-gather dim 0
//
// Splits need the split extent to be a multiple of tp.size() (shape_error naming the argument,
// the expected and the actual extent, thrown on every rank before anything is communicated);
// the slice of rank r is the r-th of tp.size() equal blocks.

namespace detail {

template <class In, class Out>
void copy_matrix(In const& in, Out const& out) {
  if (static_cast<void const*>(in.data_handle()) == static_cast<void const*>(out.data_handle()))
    return;
  std::copy_n(in.data_handle(), in.size(), out.data_handle());
}

// out [N, H] from in [N, H/p] of every rank: the all_gather gives rank-major blocks
// [p][N][H/p], which are transposed into place (the wire is contiguous, the last dim is not).
template <class C, class T>
void all_gather_last_dim(C& tp, tensor_view<T const, 2> in, tensor_view<T, 2> out) {
  auto const p = static_cast<std::size_t>(tp.size());
  auto const n = static_cast<std::size_t>(in.extent(0));
  auto const h = static_cast<std::size_t>(in.extent(1));
  std::vector<T> blocks(p * n * h);
  comm::all_gather(tp, std::span<T const>(in.data_handle(), n * h), blocks).wait();
  for (std::size_t r = 0; r < p; ++r)
    for (std::size_t i = 0; i < n; ++i)
      std::copy_n(blocks.data() + (r * n + i) * h, h, out.data_handle() + i * p * h + r * h);
}

// out [N, H/p] = columns [r H/p, (r+1) H/p) of in [N, H].
template <class T>
void keep_last_dim_slice(int rank, int parts, tensor_view<T const, 2> in, tensor_view<T, 2> out) {
  auto const n = static_cast<std::size_t>(in.extent(0));
  auto const h = static_cast<std::size_t>(in.extent(1));
  auto const w = h / static_cast<std::size_t>(parts);
  for (std::size_t i = 0; i < n; ++i)
    std::copy_n(in.data_handle() + i * h + static_cast<std::size_t>(rank) * w, w,
                out.data_handle() + i * w);
}

// out [N/p, H] = rows [r N/p, (r+1) N/p) of in [N, H].
template <class T>
void keep_row_slice(int rank, int parts, tensor_view<T const, 2> in, tensor_view<T, 2> out) {
  auto const block = in.size() / static_cast<std::size_t>(parts);
  std::copy_n(in.data_handle() + static_cast<std::size_t>(rank) * block, block, out.data_handle());
}

// The shapes of a map between full [N, H] and split [N, H/p] (dim 1) or [N/p, H] (dim 0).
template <class Full, class Split>
void expect_split(Full const& full, Split const& split, int parts, int dim, char const* full_name,
                  char const* split_name) {
  if (dim == 1) {
    expect_divisible(full.extent(1), parts, full_name, "extent(1)");
    expect_extents(split, full.extent(0), full.extent(1) / parts, split_name);
  } else {
    expect_divisible(full.extent(0), parts, full_name, "extent(0)");
    expect_extents(split, full.extent(0) / parts, full.extent(1), split_name);
  }
}

template <class C, class X>
void all_reduce_sum_in_place(C& tp, X& x) {
  if (tp.size() == 1) return;
  comm::all_reduce(tp, x, comm::reduce_kind::sum).wait();
}

}  // namespace detail

// ---- f: copy_to_tp ------------------------------------------------------------------------------

//! Forward of f: the identity (every rank already holds the whole input). Nothing to do; it is
//! spelt out so that a layer's forward and backward read as the same sequence of maps.
template <comm::Group C, class X>
constexpr void copy_to_tp_forward(C& /*tp*/, X&& /*x*/) noexcept {}

//! Backward of f: dx = sum over tp ranks of dx, in place (one SUM all-reduce). `dx` is any host
//! comm::Buffer (a view, an lvalue owning tensor, a vector).
template <comm::CollectiveIn<host_space> C, class X>
requires comm::BufferIn<X, host_space> && comm::MutableBuffer<X>
void copy_to_tp_backward(C& tp, X&& dx) { detail::all_reduce_sum_in_place(tp, dx); }

// ---- g: reduce_from_tp
// ---------------------------------------------------------------------------

//! Forward of g: y = sum over tp ranks of the partial y, in place (one SUM all-reduce).
template <comm::CollectiveIn<host_space> C, class X>
requires comm::BufferIn<X, host_space> && comm::MutableBuffer<X>
void reduce_from_tp_forward(C& tp, X&& y) { detail::all_reduce_sum_in_place(tp, y); }

//! Backward of g: the identity (the gradient of a sum is every rank's, unchanged).
template <comm::Group C, class X>
constexpr void reduce_from_tp_backward(C& /*tp*/, X&& /*dy*/) noexcept {}

namespace detail {

// The three moves behind the split/gather maps, with the argument names the caller's map uses.
// `dim` is 1 (hidden) or 0 (tokens); `full` is [N, H], `part` is [N, H/p] or [N/p, H].

template <class C, class In, class Out>
void keep_slice(C& tp, In& full, Out& part, int dim, char const* full_name, char const* part_name) {
  auto const fv = as_const_matrix(full, full_name);
  auto const pv = as_matrix(part, part_name);
  expect_split(fv, pv, tp.size(), dim, full_name, part_name);
  if (dim == 1) {
    keep_last_dim_slice(tp.rank(), tp.size(), fv, pv);
  } else {
    keep_row_slice(tp.rank(), tp.size(), fv, pv);
  }
}

template <class C, class In, class Out>
void gather_slices(C& tp, In& part, Out& full, int dim, char const* part_name,
                   char const* full_name) {
  auto const pv = as_const_matrix(part, part_name);
  auto const fv = as_matrix(full, full_name);
  expect_split(fv, pv, tp.size(), dim, full_name, part_name);
  if (tp.size() == 1) return copy_matrix(pv, fv);
  if (dim == 1) {
    all_gather_last_dim(tp, pv, fv);
  } else {
    comm::all_gather(tp, pv, fv).wait();  // row blocks are contiguous: straight onto the wire
  }
}

template <class C, class In, class Out>
void reduce_scatter_rows(C& tp, In& full, Out& part, char const* full_name, char const* part_name) {
  auto const fv = as_const_matrix(full, full_name);
  auto const pv = as_matrix(part, part_name);
  expect_split(fv, pv, tp.size(), 0, full_name, part_name);
  if (tp.size() == 1) return copy_matrix(fv, pv);
  comm::reduce_scatter(tp, fv, pv, comm::reduce_kind::sum).wait();
}

}  // namespace detail

// ---- scatter_to_tp / gather_from_tp (last dim)
// ---------------------------------------------------

//! Forward of scatter_to_tp: out [N, H/p] = this rank's columns of x [N, H]. No communication.
template <comm::Group C, HostMatrix In, MutableHostMatrix Out>
requires std::same_as<matrix_value_t<In>, matrix_value_t<Out>>
void scatter_to_tp_forward(C& tp, In&& x, Out&& out) {
  detail::keep_slice(tp, x, out, 1, "x", "out");
}

//! Backward of scatter_to_tp: dx [N, H] = the ranks' dout [N, H/p] side by side (all-gather).
template <comm::CollectiveIn<host_space> C, HostMatrix In, MutableHostMatrix Out>
requires std::same_as<matrix_value_t<In>, matrix_value_t<Out>>
void scatter_to_tp_backward(C& tp, In&& dout, Out&& dx) {
  detail::gather_slices(tp, dout, dx, 1, "dout", "dx");
}

//! Forward of gather_from_tp: out [N, H] = the ranks' x [N, H/p] side by side (all-gather).
template <comm::CollectiveIn<host_space> C, HostMatrix In, MutableHostMatrix Out>
requires std::same_as<matrix_value_t<In>, matrix_value_t<Out>>
void gather_from_tp_forward(C& tp, In&& x, Out&& out) {
  detail::gather_slices(tp, x, out, 1, "x", "out");
}

//! Backward of gather_from_tp: dx [N, H/p] = this rank's columns of dout [N, H].
template <comm::Group C, HostMatrix In, MutableHostMatrix Out>
requires std::same_as<matrix_value_t<In>, matrix_value_t<Out>>
void gather_from_tp_backward(C& tp, In&& dout, Out&& dx) {
  detail::keep_slice(tp, dout, dx, 1, "dout", "dx");
}

// ---- sequence parallelism (dim 0)
// ----------------------------------------------------------------

//! Forward of scatter_to_sp: out [N/p, H] = this rank's rows of x [N, H]. No communication.
template <comm::Group C, HostMatrix In, MutableHostMatrix Out>
requires std::same_as<matrix_value_t<In>, matrix_value_t<Out>>
void scatter_to_sp_forward(C& tp, In&& x, Out&& out) {
  detail::keep_slice(tp, x, out, 0, "x", "out");
}

//! Backward of scatter_to_sp: dx [N, H] = the ranks' dout [N/p, H] stacked (all-gather dim 0).
template <comm::CollectiveIn<host_space> C, HostMatrix In, MutableHostMatrix Out>
requires std::same_as<matrix_value_t<In>, matrix_value_t<Out>>
void scatter_to_sp_backward(C& tp, In&& dout, Out&& dx) {
  detail::gather_slices(tp, dout, dx, 0, "dout", "dx");
}

//! Forward of gather_from_sp: out [N, H] = the ranks' x [N/p, H] stacked (all-gather dim 0).
//! Used before the column-parallel GEMMs under sequence parallelism.
template <comm::CollectiveIn<host_space> C, HostMatrix In, MutableHostMatrix Out>
requires std::same_as<matrix_value_t<In>, matrix_value_t<Out>>
void gather_from_sp_forward(C& tp, In&& x, Out&& out) {
  detail::gather_slices(tp, x, out, 0, "x", "out");
}

//! Backward of gather_from_sp: dx [N/p, H] = this rank's rows of the SUM over ranks of
//! dout [N, H] (reduce-scatter dim 0): each rank's full-sequence gradient is a partial sum.
template <comm::CollectiveIn<host_space> C, HostMatrix In, MutableHostMatrix Out>
requires std::same_as<matrix_value_t<In>, matrix_value_t<Out>>
void gather_from_sp_backward(C& tp, In&& dout, Out&& dx) {
  detail::reduce_scatter_rows(tp, dout, dx, "dout", "dx");
}

//! Forward of reduce_scatter_to_sp: out [N/p, H] = this rank's rows of the SUM over ranks of the
//! partial x [N, H] (reduce-scatter dim 0). Used after the row-parallel GEMM under sequence
//! parallelism, in place of g's all-reduce.
template <comm::CollectiveIn<host_space> C, HostMatrix In, MutableHostMatrix Out>
requires std::same_as<matrix_value_t<In>, matrix_value_t<Out>>
void reduce_scatter_to_sp_forward(C& tp, In&& x, Out&& out) {
  detail::reduce_scatter_rows(tp, x, out, "x", "out");
}

//! Backward of reduce_scatter_to_sp: dx [N, H] = the ranks' dout [N/p, H] stacked (all-gather).
template <comm::CollectiveIn<host_space> C, HostMatrix In, MutableHostMatrix Out>
requires std::same_as<matrix_value_t<In>, matrix_value_t<Out>>
void reduce_scatter_to_sp_backward(C& tp, In&& dout, Out&& dx) {
  detail::gather_slices(tp, dout, dx, 0, "dout", "dx");
}

}  // namespace weft::parallel
