// weft/parallel/sharding.hpp — which slice of a full weight each tensor-parallel rank holds
// (even blocks, or Megatron's partition_stride pieces for fused QKV / gated-MLP weights), and
// fills of a rank's shard through core/random.hpp's placement that equal the whole fill's slice.
#pragma once

#include <weft/core/error.hpp>
#include <weft/core/random.hpp>
#include <weft/core/tensor/subview.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/rl/vocab_parallel.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace weft::parallel {

//! `size` consecutive entries of one dimension: at `local_begin` in the rank's shard, at
//! `global_begin` in the full tensor.
struct shard_piece {
  index_t local_begin = 0;
  index_t global_begin = 0;
  index_t size = 0;
  friend bool operator==(shard_piece const&, shard_piece const&) = default;
};

//! The pieces of an `extent`-long dimension that tp rank `rank` holds under Megatron's
//! partition_stride (`_initialize_affine_weight_cpu`): the dimension is cut into tp * stride
//! equal pieces and rank r takes pieces r, r + tp, ..., r + (stride - 1) tp, stored one after
//! another. stride 1 is the plain even split (one piece, [r extent/tp, (r+1) extent/tp)): the
//! rows of a column-parallel weight and its bias (dimension 0), the columns of a row-parallel
//! weight (dimension 1). A fused QKV weight [3 h, in] stored as [q; k; v] uses stride 3, so each
//! rank holds its heads' q, k and v rows; a gated MLP's [gate; up] uses stride 2. Throws
//! shape_error unless tp * stride divides extent.
[[nodiscard]] inline std::vector<shard_piece> tp_shard_pieces(index_t extent, int tp, int rank,
                                                              int stride = 1) {
  WEFT_EXPECTS(tp >= 1, "tp", ">= 1", tp);
  WEFT_EXPECTS(rank >= 0 && rank < tp, "rank", ::weft::detail::concat("in [0, ", tp, ")"), rank);
  WEFT_EXPECTS(stride >= 1, "stride", ">= 1", stride);
  index_t const parts = static_cast<index_t>(tp) * stride;
  WEFT_EXPECTS_SHAPE(extent >= 0 && extent % parts == 0, "extent",
                     ::weft::detail::concat("a multiple of tp * stride = ", tp, " * ", stride),
                     extent);
  index_t const piece = extent / parts;
  std::vector<shard_piece> out;
  out.reserve(static_cast<std::size_t>(stride));
  for (int s = 0; s < stride; ++s)
    out.push_back({s * piece, (static_cast<index_t>(s) * tp + rank) * piece, piece});
  return out;
}

//! The one piece of an even split (stride 1): [rank extent/tp, (rank + 1) extent/tp).
[[nodiscard]] inline shard_piece tp_shard(index_t extent, int tp, int rank) {
  return tp_shard_pieces(extent, tp, rank, 1).front();
}

//! The rows a vocabulary shard holds of a [vocab, hidden] embedding or output weight.
[[nodiscard]] inline shard_piece vocab_rows(rl::vocab_shard const& shard) {
  return {0, shard.begin, shard.size};
}

namespace detail {

template <class V, class Fill>
void fill_pieces(V const& local, std::span<index_t const> global_extents, int dim,
                 std::span<shard_piece const> pieces, Fill&& fill) {
  constexpr std::size_t rank = V::rank();
  WEFT_EXPECTS_SHAPE(global_extents.size() == rank, "global_extents",
                     ::weft::detail::concat(rank, " extents (the view's rank)"),
                     global_extents.size());
  WEFT_EXPECTS(dim >= 0 && static_cast<std::size_t>(dim) < rank, "dim",
               ::weft::detail::concat("in [0, ", rank, ")"), dim);
  index_t held = 0;
  for (auto const& p : pieces) held += p.size;
  WEFT_EXPECTS_SHAPE(
      static_cast<index_t>(local.extent(static_cast<std::size_t>(dim))) == held, "local",
      ::weft::detail::concat("extent(", dim, ") = ", held, " (the pieces')"),
      ::weft::detail::concat("extent(", dim, ") = ", local.extent(static_cast<std::size_t>(dim))));
  for (auto const& p : pieces) {
    placement where;
    where.global_extents.assign(global_extents.begin(), global_extents.end());
    where.offsets.assign(rank, 0);
    where.offsets[static_cast<std::size_t>(dim)] = p.global_begin;
    fill(slice(local, dim, p.local_begin, p.local_begin + p.size), where);
  }
}

}  // namespace detail

//! Fills a rank's shard `local` of a tensor whose full extents are `global_extents`, sharded along
//! `dim` into `pieces` (tp_shard_pieces), with the normal values the whole tensor gets from
//! fill_normal(whole, gen, mean, stddev): bit for bit the same, whatever tp or stride. Use one
//! rng stream per logical parameter (param_info::init_stream), independent of the layout.
template <TensorIn<host_space> V>
requires ::weft::detail::RandomFillView<V>
void fill_normal_shard(V const& local, rng gen, double mean, double stddev,
                       std::span<index_t const> global_extents, int dim,
                       std::span<shard_piece const> pieces) {
  detail::fill_pieces(local, global_extents, dim, pieces, [&](auto const& part, auto const& where) {
    fill_normal(part, gen, mean, stddev, where);
  });
}

//! As fill_normal_shard, with fill_uniform's values in [lo, hi).
template <TensorIn<host_space> V>
requires ::weft::detail::RandomFillView<V>
void fill_uniform_shard(V const& local, rng gen, double lo, double hi,
                        std::span<index_t const> global_extents, int dim,
                        std::span<shard_piece const> pieces) {
  detail::fill_pieces(local, global_extents, dim, pieces, [&](auto const& part, auto const& where) {
    fill_uniform(part, gen, lo, hi, where);
  });
}

}  // namespace weft::parallel
