// weft/attention/agreement.hpp — the entry check of the distributed attention calls: every rank
// of a ring, Ulysses or USP group all-gathers a small fingerprint of its call (entry point, layout,
// causality, scale, shapes, element type) and every rank throws the same error if any differ.
#pragma once

#include <weft/attention/common.hpp>
#include <weft/attention/sharding.hpp>
#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weft::attention::detail {

//! The distributed entry points, as recorded in a call fingerprint.
enum class sp_entry : std::int64_t {
  ring_forward = 1,
  ring_backward,
  ulysses_forward,
  ulysses_backward,
  usp_forward,
  usp_backward,
};

constexpr std::string_view to_string(sp_entry e) noexcept {
  switch (e) {
    case sp_entry::ring_forward: return "ring_forward";
    case sp_entry::ring_backward: return "ring_backward";
    case sp_entry::ulysses_forward: return "ulysses_forward";
    case sp_entry::ulysses_backward: return "ulysses_backward";
    case sp_entry::usp_forward: return "usp_forward";
    case sp_entry::usp_backward: return "usp_backward";
  }
  return "unknown";
}

//! What every rank of one distributed attention call must agree on. Ranks whose layouts differ
//! (zigzag here, contiguous there; another sequence length or degree) exchange blocks of equal
//! size and return numbers that are silently wrong, so the local checks cannot catch it: the
//! ranks compare these words before the first block moves. Ulysses has no layout (kind -1).
struct call_fingerprint {
  enum field : std::size_t {
    entry,
    kind,
    seq,
    ring,
    ulysses,
    causal,
    scale,
    batch,
    local,
    heads_q,
    heads_kv,
    dim,
    type,
    count
  };
  std::array<std::int64_t, count> w{};
};

inline constexpr std::array<std::string_view, call_fingerprint::count> fingerprint_argument = {
    "function", "layout", "layout", "layout", "layout", "opt.causal", "opt.scale",
    "q",        "q",      "q",      "k",      "q",      "q"};
inline constexpr std::array<std::string_view, call_fingerprint::count> fingerprint_field = {
    "entry point", "layout kind",    "sequence length", "ring degree",           "ulysses degree",
    "causal",      "scale",          "batch",           "local sequence length", "query heads",
    "KV heads",    "head dimension", "element type"};

//! Fingerprint of a call with query shard [b, c, hq, d], KV heads hk, element type T; `lay` is
//! null for Ulysses. `scale` is the resolved scale (so 0 and an explicit 1/sqrt(d) agree).
template <class T>
call_fingerprint make_fingerprint(sp_entry e, seq_layout const* lay, bool causal, double scale,
                                  std::int64_t b, std::int64_t c, std::int64_t hq, std::int64_t hk,
                                  std::int64_t d) noexcept {
  using F = call_fingerprint;
  call_fingerprint f;
  f.w[F::entry] = static_cast<std::int64_t>(e);
  f.w[F::kind] = lay ? static_cast<std::int64_t>(lay->kind()) : -1;
  f.w[F::seq] = lay ? lay->seq() : -1;
  f.w[F::ring] = lay ? lay->ring_degree() : -1;
  f.w[F::ulysses] = lay ? lay->ulysses_degree() : -1;
  f.w[F::causal] = causal ? 1 : 0;
  f.w[F::scale] = std::bit_cast<std::int64_t>(scale);
  f.w[F::batch] = b;
  f.w[F::local] = c;
  f.w[F::heads_q] = hq;
  f.w[F::heads_kv] = hk;
  f.w[F::dim] = d;
  f.w[F::type] = static_cast<std::int64_t>(dtype_of<std::remove_cv_t<T>>);
  return f;
}

inline std::string fingerprint_value(std::size_t field, std::int64_t v) {
  using F = call_fingerprint;
  switch (field) {
    case F::entry: return std::string(to_string(static_cast<sp_entry>(v)));
    case F::kind:
      return v < 0 ? std::string("none")
                   : std::string(::weft::attention::to_string(static_cast<layout_kind>(v)));
    case F::causal: return v ? "true" : "false";
    case F::scale: return ::weft::detail::concat(std::bit_cast<double>(v));
    case F::type: return std::string(::weft::name(static_cast<dtype>(v)));
    default: return ::weft::detail::concat(v);
  }
}

//! The first difference from rank 0 in the gathered fingerprints of a group, if any.
struct disagreement {
  std::size_t field = 0;
  int rank = 0;
  std::int64_t want = 0, got = 0;
};

//! All-gathers `mine` and a flag word over `comm`, count + 1 int64 per rank, and returns the
//! gathered words in rank order. A collective communicator does it in one all_gather; a
//! point-to-point one (all ring attention needs) passes the words around the ring in size() - 1
//! isend/irecv steps, so ring attention's entry check needs nothing the ring itself does not.
template <comm::PointToPointIn<host_space> C>
std::vector<std::int64_t> gather_fingerprints(C& comm, call_fingerprint const& mine,
                                              std::int64_t flag) {
  constexpr std::size_t W = call_fingerprint::count + 1;
  std::array<std::int64_t, W> out{};
  std::copy(mine.w.begin(), mine.w.end(), out.begin());
  out[W - 1] = flag;
  std::size_t const n = std::size_t(comm.size());
  std::vector<std::int64_t> all(W * n);
  if constexpr (comm::Collective<C>) {
    comm::all_gather(comm, std::span<std::int64_t const>(out), all).wait();
  } else {
    // Step s: send the block of rank (r - s) to the next rank, receive rank (r - s - 1)'s block.
    std::size_t const r = std::size_t(comm.rank());
    std::copy(out.begin(), out.end(), all.begin() + std::ptrdiff_t(r * W));
    std::size_t const next = (r + 1) % n, prev = (r + n - 1) % n;
    for (std::size_t s = 0; s + 1 < n; ++s) {
      std::size_t const have = (r + n - s) % n, get = (r + 2 * n - s - 1) % n;
      auto send =
          comm::isend(comm, std::span<std::int64_t const>(all.data() + have * W, W), int(next));
      auto recv = comm::irecv(comm, std::span<std::int64_t>(all.data() + get * W, W), int(prev));
      send.wait();
      recv.wait();
    }
  }
  return all;
}

inline std::optional<disagreement> first_disagreement(std::vector<std::int64_t> const& all) {
  constexpr std::size_t W = call_fingerprint::count + 1;
  std::size_t const n = all.size() / W;
  for (std::size_t j = 1; j < n; ++j)
    for (std::size_t f = 0; f < call_fingerprint::count; ++f)
      if (all[f] != all[j * W + f]) return disagreement{f, int(j), all[f], all[j * W + f]};
  return std::nullopt;
}

//! The error every rank of a group throws for `d`: the argument, the field, rank 0's value and the
//! first differing rank's value. `group` names the communicator ("ring", "Ulysses").
[[noreturn]] inline void throw_disagreement(disagreement const& d, std::string_view group,
                                            source_location where = source_location::current()) {
  ::weft::detail::fail_expectation<invalid_argument_error>(
      where, "every rank passes the same layout and call", fingerprint_argument[d.field],
      ::weft::detail::concat("the same ", fingerprint_field[d.field], " on every rank of the ",
                             group, " group (rank 0 has ", fingerprint_value(d.field, d.want), ")"),
      ::weft::detail::concat(fingerprint_value(d.field, d.got), " on rank ", d.rank));
}

//! Entry check of a one-group call: every rank of `comm` throws the same invalid_argument_error
//! unless all ranks' fingerprints agree. Skipped for a group of one.
template <comm::PointToPointIn<host_space> C>
void check_agreement(C& comm, call_fingerprint const& mine, std::string_view group) {
  if (comm.size() <= 1) return;
  if (auto const d = first_disagreement(gather_fingerprints(comm, mine, 0)))
    throw_disagreement(*d, group);
}

//! Entry check of a two-group call (USP: Ulysses groups × ring groups). The ring exchange carries
//! whether each rank's Ulysses group agreed, so every rank of the grid learns of any disagreement:
//! a rank that saw none in its own two groups has, through its ring partners' flags, compared
//! with every Ulysses group, i.e. with every rank.
template <comm::CollectiveIn<host_space> U, comm::PointToPointIn<host_space> R>
void check_agreement_2d(U& ulysses, R& ring, call_fingerprint const& mine) {
  std::optional<disagreement> in_ulysses;
  if (ulysses.size() > 1) in_ulysses = first_disagreement(gather_fingerprints(ulysses, mine, 0));
  if (ring.size() <= 1) {
    if (in_ulysses) throw_disagreement(*in_ulysses, "Ulysses");
    return;
  }
  auto const all = gather_fingerprints(ring, mine, in_ulysses ? 1 : 0);
  if (in_ulysses) throw_disagreement(*in_ulysses, "Ulysses");
  if (auto const d = first_disagreement(all)) throw_disagreement(*d, "ring");
  constexpr std::size_t W = call_fingerprint::count + 1;
  for (std::size_t j = 0; j < all.size() / W; ++j)
    WEFT_EXPECTS(
        all[j * W + W - 1] == 0, "layout", "the same layout and call on every rank of the USP grid",
        ::weft::detail::concat("a disagreement inside the Ulysses group of ring rank ", j));
}

}  // namespace weft::attention::detail
