// weft/attention/sharding.hpp — how a global sequence is sharded over context-parallel ranks, as
// pure index maps: contiguous, zigzag (2N chunks; rank r holds chunks r and 2N-1-r), stripe (token
// t on rank t mod N), and USP (Ulysses pieces inside a ring layout); extract_local /
// restore_global.
#pragma once

#include <weft/attention/common.hpp>
#include <weft/core/error.hpp>
#include <weft/core/tensor.hpp>

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace weft::attention {

enum class layout_kind : std::uint8_t { contiguous, zigzag, stripe };

constexpr std::string_view to_string(layout_kind k) noexcept {
  switch (k) {
    case layout_kind::contiguous: return "contiguous";
    case layout_kind::zigzag: return "zigzag";
    case layout_kind::stripe: return "stripe";
  }
  return "unknown";
}

//! A sharding of `seq` tokens over ring_degree × ulysses_degree ranks. The ring layout `kind`
//! splits the sequence over ring ranks ρ; each ring chunk is then cut into `ulysses_degree`
//! contiguous pieces υ (USP; 1 for the plain layouts). Global rank g = ρ·u + υ (Ulysses ranks
//! adjacent, yunchang's use_ulysses_low). Local row i of rank g is global token
//! global_position(g, i). The map is a bijection; nothing about it depends on the data.
class seq_layout {
 public:
  //! Rank r holds tokens [r·S/N, (r+1)·S/N). Needs S % N == 0.
  static seq_layout contiguous(int world, std::int64_t seq) {
    return seq_layout(layout_kind::contiguous, world, 1, seq);
  }
  //! 2N chunks; rank r holds chunk r then chunk 2N-1-r. Needs S % 2N == 0. Causal only.
  static seq_layout zigzag(int world, std::int64_t seq) {
    return seq_layout(layout_kind::zigzag, world, 1, seq);
  }
  //! Token t lives on rank t mod N at local row t / N. Needs S % N == 0. Causal only.
  static seq_layout stripe(int world, std::int64_t seq) {
    return seq_layout(layout_kind::stripe, world, 1, seq);
  }
  //! USP: ring layout `inner` over `ring` ranks, each ring chunk cut in `ulysses` pieces.
  static seq_layout usp(int ulysses, int ring, layout_kind inner, std::int64_t seq) {
    return seq_layout(inner, ring, ulysses, seq);
  }

  [[nodiscard]] layout_kind kind() const noexcept { return kind_; }
  [[nodiscard]] int world() const noexcept { return ring_ * ulysses_; }
  [[nodiscard]] int ring_degree() const noexcept { return ring_; }
  [[nodiscard]] int ulysses_degree() const noexcept { return ulysses_; }
  [[nodiscard]] std::int64_t seq() const noexcept { return seq_; }
  [[nodiscard]] std::int64_t local_length() const noexcept { return seq_ / world(); }
  //! Rows a ring rank holds (all Ulysses pieces of its chunk).
  [[nodiscard]] std::int64_t ring_chunk_length() const noexcept { return seq_ / ring_; }

  //! Global token of ring rank `rho`'s chunk row `i` (i < ring_chunk_length()).
  [[nodiscard]] std::int64_t ring_position(int rho, std::int64_t i) const noexcept {
    std::int64_t const c = ring_chunk_length();
    switch (kind_) {
      case layout_kind::contiguous: return rho * c + i;
      case layout_kind::zigzag: {
        std::int64_t const half = c / 2;
        return i < half ? rho * half + i : (2 * ring_ - 1 - rho) * half + (i - half);
      }
      case layout_kind::stripe: return i * ring_ + rho;
    }
    return -1;
  }

  //! Global token of global rank `rank`'s local row `i`.
  [[nodiscard]] std::int64_t global_position(int rank, std::int64_t i) const noexcept {
    int const rho = rank / ulysses_, upsilon = rank % ulysses_;
    return ring_position(rho, upsilon * local_length() + i);
  }

  //! Global token ids of `rank`'s rows, in local order (for RoPE and position ids).
  [[nodiscard]] std::vector<std::int64_t> positions(int rank) const {
    check_rank(rank);
    std::vector<std::int64_t> p(static_cast<std::size_t>(local_length()));
    for (std::int64_t i = 0; i < local_length(); ++i)
      p[static_cast<std::size_t>(i)] = global_position(rank, i);
    return p;
  }

  void check_rank(int rank) const {
    WEFT_EXPECTS(rank >= 0 && rank < world(), "rank",
                 ::weft::detail::concat("0 <= rank < ", world()), rank);
  }

 private:
  seq_layout(layout_kind k, int ring, int ulysses, std::int64_t seq)
      : kind_(k), ring_(ring), ulysses_(ulysses), seq_(seq) {
    WEFT_EXPECTS(ring >= 1, "world", ">= 1", ring);
    WEFT_EXPECTS(ulysses >= 1, "ulysses", ">= 1", ulysses);
    WEFT_EXPECTS(seq >= 0, "seq", ">= 0", seq);
    std::int64_t const unit = (k == layout_kind::zigzag ? 2 : 1) * std::int64_t{ring} * ulysses;
    WEFT_EXPECTS(
        seq % unit == 0, "seq",
        ::weft::detail::concat("a multiple of ", unit, " for the ", to_string(k), " layout over ",
                               ring, " ring x ", ulysses, " ulysses ranks"),
        seq);
  }

  layout_kind kind_;
  int ring_;
  int ulysses_;
  std::int64_t seq_;
};

namespace detail {

// Copies between a global tensor and a rank's shard, with `seq_axis` the sequence dimension.
template <class G, class L, bool ToLocal>
void layout_copy(seq_layout const& lay, int rank, G const& global, L const& local,
                 std::size_t seq_axis) {
  constexpr std::size_t R = G::rank();
  static_assert(L::rank() == R, "weft: extract_local/restore_global need tensors of the same rank");
  lay.check_rank(rank);
  WEFT_EXPECTS(seq_axis < R, "seq_axis", ::weft::detail::concat("< ", R), seq_axis);
  for (std::size_t a = 0; a < R; ++a) {
    auto const want = a == seq_axis ? lay.seq() : static_cast<std::int64_t>(global.extent(a));
    WEFT_EXPECTS_SHAPE(static_cast<std::int64_t>(global.extent(a)) == want, "global",
                       ::weft::detail::concat("extent ", want, " on axis ", a), global.extent(a));
    auto const lwant = a == seq_axis ? lay.local_length() : want;
    WEFT_EXPECTS_SHAPE(static_cast<std::int64_t>(local.extent(a)) == lwant, "local",
                       ::weft::detail::concat("extent ", lwant, " on axis ", a), local.extent(a));
  }
  if (local.size() == 0) return;
  std::array<std::int64_t, R> ix{};
  for (;;) {
    std::int64_t go = 0, lo = 0;
    for (std::size_t a = 0; a < R; ++a) {
      std::int64_t const gi = a == seq_axis ? lay.global_position(rank, ix[a]) : ix[a];
      go += gi * static_cast<std::int64_t>(global.stride(a));
      lo += ix[a] * static_cast<std::int64_t>(local.stride(a));
    }
    if constexpr (ToLocal)
      local.data_handle()[lo] = global.data_handle()[go];
    else
      global.data_handle()[go] = local.data_handle()[lo];
    std::size_t a = R;
    while (a > 0) {
      --a;
      if (++ix[a] < static_cast<std::int64_t>(local.extent(a))) break;
      ix[a] = 0;
      if (a == 0) return;
    }
  }
}

}  // namespace detail

//! Copies rank `rank`'s shard of `global` into `local`. The sequence axis is `seq_axis` (1 for
//! [batch, seq, heads, dim] tensors, 2 for [batch, heads, seq] LSE tensors).
template <TensorIn<host_space> GV, TensorIn<host_space> LV>
void extract_local(seq_layout const& lay, int rank, GV const& global, LV const& local,
                   std::size_t seq_axis = 1) {
  detail::layout_copy<GV, LV, true>(lay, rank, global, local, seq_axis);
}

//! Writes rank `rank`'s shard `local` back to its positions in `global` (the inverse map).
template <TensorIn<host_space> LV, TensorIn<host_space> GV>
void restore_global(seq_layout const& lay, int rank, LV const& local, GV const& global,
                    std::size_t seq_axis = 1) {
  detail::layout_copy<GV, LV, false>(lay, rank, global, local, seq_axis);
}

}  // namespace weft::attention
