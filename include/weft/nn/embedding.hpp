// weft/nn/embedding.hpp — table lookups: token embedding (out[t] = table[ids[t]]) and, with
// positions as the ids, the learned position embedding (packed sequences pass their per-document
// positions). The backward scatter-adds rows in token order, so repeated ids sum deterministically.
#pragma once

#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/nn/detail/args.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

namespace weft::nn {

namespace detail {
// Every id in [0, rows) before anything is written; invalid_argument_error names the first bad one.
template <class I>
void check_ids(std::span<I const> ids, index_t rows, char const* name) {
  for (std::size_t k = 0; k < ids.size(); ++k) {
    auto const id = static_cast<long long>(ids[k]);
    WEFT_EXPECTS(id >= 0 && id < rows, ::weft::detail::concat(name, "[", k, "]"),
                 ::weft::detail::concat("an id in [0, ", rows, ") (the table's rows)"), id);
  }
}
}  // namespace detail

//! out[t, :] = table[ids[t], :] (overwrites out). ids [T] (int32 or int64), table [V, D], out
//! [T, D]. Throws invalid_argument_error naming ids[k] for an id outside [0, V), and shape_error,
//! before writing anything. The learned position embedding is this with positions as ids.
template <std::integral I, class W, class O>
requires HostArg<W, 2> && HostArg<O, 2>
void embedding_forward(std::span<I const> ids, W&& table, O&& out) {
  auto const wv = detail::arg_view(table);
  auto const ov = detail::arg_view(out);
  using T = detail::value_t<decltype(ov)>;
  static_assert(std::is_same_v<detail::value_t<decltype(wv)>, T>,
                "weft::nn::embedding_forward: table and out must hold the same element type");
  auto const t = static_cast<index_t>(ids.size());
  index_t const v = detail::ext(wv, 0), d = detail::ext(wv, 1);
  WEFT_EXPECTS_SHAPE(detail::ext(ov, 0) == t && detail::ext(ov, 1) == d, "out",
                     detail::dims(t, d) + " ([ids.size(), table.extent(1)])", shape_string(ov));
  detail::check_ids(ids, v, "ids");
  detail::check_no_overlap(ov, "out", wv, "table");
  for (index_t k = 0; k < t; ++k) {
    auto const r = static_cast<index_t>(ids[static_cast<std::size_t>(k)]);
    for (index_t j = 0; j < d; ++j) detail::at(ov, k, j) = detail::at(wv, r, j);
  }
}

//! dtable[ids[t], :] += dout[t, :] for t = 0, 1, ... in order (ACCUMULATES; repeated ids add up in
//! token order, so the result is bitwise reproducible). Same checks as the forward.
template <std::integral I, class G, class DW>
requires HostArg<G, 2> && HostArg<DW, 2>
void embedding_backward(std::span<I const> ids, G&& dout, DW&& dtable) {
  auto const gv = detail::arg_view(dout);
  auto const dv = detail::arg_view(dtable);
  using T = detail::value_t<decltype(dv)>;
  using C = compute_t<T>;
  static_assert(std::is_same_v<detail::value_t<decltype(gv)>, T>,
                "weft::nn::embedding_backward: dout and dtable must hold the same element type");
  auto const t = static_cast<index_t>(ids.size());
  index_t const v = detail::ext(dv, 0), d = detail::ext(dv, 1);
  WEFT_EXPECTS_SHAPE(detail::ext(gv, 0) == t && detail::ext(gv, 1) == d, "dout",
                     detail::dims(t, d) + " ([ids.size(), dtable.extent(1)])", shape_string(gv));
  detail::check_ids(ids, v, "ids");
  detail::check_no_overlap(dv, "dtable", gv, "dout");
  for (index_t k = 0; k < t; ++k) {
    auto const r = static_cast<index_t>(ids[static_cast<std::size_t>(k)]);
    for (index_t j = 0; j < d; ++j)
      detail::at(dv, r, j) = static_cast<T>(static_cast<C>(detail::at(dv, r, j)) +
                                            static_cast<C>(detail::at(gv, k, j)));
  }
}

}  // namespace weft::nn
