// weft/comm/detail/describe.hpp — how every backend's messages name things: ranks and groups
// ("rank 1 (world rank 3) of group `tp`"), rank lists, an operation by its fingerprint
// ("all_reduce(dtype f32, count 4, op sum)"), the fields two fingerprints differ in, and the
// wire form of fingerprints that MPI and NCCL all-gather in debug mode.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weft::comm::detail {

//! "[0, 1, 2]"; long lists keep their first and last entries: "[0, 1, 2, 3, ..., 255]".
inline std::string rank_list(std::span<int const> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v.size() > 10 && i == 4) {
      s += ", ...";
      i = v.size() - 2;
      continue;
    }
    if (i != 0) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

//! How messages name the ranks of one group. In a world a rank is its number; in a group made by
//! split (a mesh axis) a number alone is ambiguous, so messages give both ("rank 1 (world rank
//! 3)") and name the group once (" of group `tp`", or by its world ranks when unnamed).
struct group_names {
  bool split = false;
  std::span<int const> world_ranks;  // world rank of each group rank (split groups)
  std::string_view name;             // set_name(); empty when unnamed

  [[nodiscard]] int world_rank(int r) const noexcept {
    return r >= 0 && static_cast<std::size_t>(r) < world_ranks.size()
               ? world_ranks[static_cast<std::size_t>(r)]
               : -1;
  }
  [[nodiscard]] std::string who(int r) const {
    if (!split) return "rank " + std::to_string(r);
    return weft::detail::concat("rank ", r, " (world rank ", world_rank(r), ")");
  }
  //! "[0, 2]" or, in a split group, "[0, 2] (world ranks [4, 6])".
  [[nodiscard]] std::string ranks(std::span<int const> v) const {
    if (!split) return rank_list(v);
    std::vector<int> w;
    w.reserve(v.size());
    for (int r : v) w.push_back(world_rank(r));
    return rank_list(v) + " (world ranks " + rank_list(w) + ")";
  }
  //! "" in a world; " of group `tp`" for a named split group; " of the group of world ranks [..]".
  [[nodiscard]] std::string label() const {
    if (!split) return {};
    if (!name.empty()) return weft::detail::concat(" of group `", name, "`");
    return " of the group of world ranks " + rank_list(world_ranks);
  }
  //! The prefix of every error raised by a call: "all_reduce on rank 1 of group `tp` (seq 4)".
  [[nodiscard]] std::string context(op_kind op, int rank, std::uint64_t seq) const {
    std::string s = weft::detail::concat(to_string(op), " on ", who(rank), label());
    if (seq != 0) s += weft::detail::concat(" (seq ", seq, ")");
    return s;
  }
};

inline bool is_reduction(op_kind k) noexcept {
  return k == op_kind::all_reduce || k == op_kind::reduce || k == op_kind::reduce_scatter ||
         k == op_kind::reduce_scatter_v;
}
inline bool has_counts(op_kind k) noexcept {
  return k == op_kind::all_gather_v || k == op_kind::reduce_scatter_v;
}

//! "all_reduce(dtype f32, count 4, op sum)", "gather(dtype i32, count 2, root 1)",
//! "all_gather_v(dtype f32, counts [1, 0, 2])", "barrier()". `counts` are the _v counts.
inline std::string describe(fingerprint const& fp, std::span<std::size_t const> counts = {}) {
  if (fp.op == op_kind::barrier || fp.op == op_kind::split)
    return std::string(to_string(fp.op)) + "()";
  std::string s = weft::detail::concat(to_string(fp.op), "(dtype ", fp.type);
  if (has_counts(fp.op)) {
    std::vector<int> c;
    for (auto x : counts) c.push_back(static_cast<int>(x));
    s += ", counts " + rank_list(c);
  } else if (fp.op != op_kind::all_to_all_v) {
    s += weft::detail::concat(", count ", fp.count);
  }
  if (fp.root >= 0) s += weft::detail::concat(", root ", fp.root);
  if (is_reduction(fp.op)) s += weft::detail::concat(", op ", to_string(fp.reduction));
  return s + ")";
}

//! The fields in which two ranks' calls differ ("op" alone when the operations differ), joined
//! as "dtype, count"; empty when they match. Counts are compared for all_gather_v and
//! reduce_scatter_v only (all_to_all_v's are cross-checked by a2a_mismatch).
inline std::string diff_fields(fingerprint const& a, fingerprint const& b,
                               std::span<std::size_t const> ca = {},
                               std::span<std::size_t const> cb = {}) {
  if (a.op != b.op) return "op";
  std::string f;
  auto add = [&](char const* x) { f += (f.empty() ? "" : ", ") + std::string(x); };
  if (a.type != b.type) add("dtype");
  if (a.count != b.count) add("count");
  if (a.root != b.root) add("root");
  if (is_reduction(a.op) && a.reduction != b.reduction) add("reduction");
  if (a.seq != b.seq) add("sequence");
  if (has_counts(a.op) && (ca.size() != cb.size() || !std::equal(ca.begin(), ca.end(), cb.begin())))
    add("counts");
  return f;
}

//! The one text of a mismatch found by comparing fingerprints.
inline std::string mismatch_text(std::uint64_t seq, std::string_view who_a, std::string const& a,
                                 std::string_view who_b, std::string const& b,
                                 std::string_view fields) {
  return weft::detail::concat("mismatched collectives at seq ", seq, ": ", who_a, " called ", a,
                              " but ", who_b, " called ", b, "; they differ in: ", fields);
}

//! all_to_all_v: what `a` sends to `b` is not what `b` expects from `a`.
inline std::string a2a_mismatch(std::uint64_t seq, std::string_view a, std::size_t sends,
                                std::string_view b, std::size_t expects) {
  return weft::detail::concat("mismatched all_to_all_v at seq ", seq, ": ", a, " sends ", sends,
                              " elements to ", b, " but ", b, " expects ", expects, " from ", a,
                              "; they differ in: counts");
}

// ---- fingerprints on the wire (debug mode of MPI and NCCL) ------------------------------------
// Each rank contributes one row of int64 words: op, dtype, count, root, reduction, seq, then (with
// counts) its n _v counts and n receive counts; rows are all-gathered and compared the same way
// on every rank, so every rank reaches the same verdict before any data moves.

inline std::size_t fingerprint_width(std::size_t n, bool with_counts) noexcept {
  return with_counts ? 6 + 2 * n : 8;
}

inline std::vector<std::int64_t> fingerprint_row(fingerprint const& fp, std::size_t width,
                                                 std::span<std::size_t const> counts = {},
                                                 std::span<std::size_t const> counts2 = {}) {
  std::vector<std::int64_t> w(width, 0);
  w[0] = static_cast<std::int64_t>(fp.op);
  w[1] = static_cast<std::int64_t>(fp.type);
  w[2] = static_cast<std::int64_t>(fp.count);
  w[3] = fp.root;
  w[4] = static_cast<std::int64_t>(fp.reduction);
  w[5] = static_cast<std::int64_t>(fp.seq);
  std::size_t const n = (width - 6) / 2;
  for (std::size_t i = 0; i < counts.size() && i < n && width > 8; ++i)
    w[6 + i] = static_cast<std::int64_t>(counts[i]);
  for (std::size_t i = 0; i < counts2.size() && i < n && width > 8; ++i)
    w[6 + n + i] = static_cast<std::int64_t>(counts2[i]);
  return w;
}

//! Compares the all-gathered rows of `n` ranks (each `width` words); the message of the first
//! mismatch, or nothing. `names` names the ranks.
inline std::optional<std::string> compare_rows(std::span<std::int64_t const> all, std::size_t n,
                                               std::size_t width, group_names const& names) {
  auto row = [&](std::size_t r) { return all.subspan(r * width, width); };
  auto fp = [&](std::size_t r) {
    auto const x = row(r);
    return fingerprint{static_cast<op_kind>(x[0]),     static_cast<dtype>(x[1]),
                       static_cast<std::size_t>(x[2]), static_cast<int>(x[3]),
                       static_cast<reduce_kind>(x[4]), static_cast<std::uint64_t>(x[5])};
  };
  auto counts = [&](std::size_t r) {
    std::vector<std::size_t> c;
    if (width > 8 && has_counts(fp(r).op))
      for (std::size_t i = 0; i < n; ++i) c.push_back(static_cast<std::size_t>(row(r)[6 + i]));
    return c;
  };
  fingerprint const f0 = fp(0);
  auto const c0 = counts(0);
  for (std::size_t s = 1; s < n; ++s) {
    auto const cs = counts(s);
    std::string const fields = diff_fields(f0, fp(s), c0, cs);
    if (fields.empty()) continue;
    return mismatch_text(f0.seq, names.who(0), describe(f0, c0), names.who(static_cast<int>(s)),
                         describe(fp(s), cs), fields);
  }
  if (f0.op == op_kind::all_to_all_v && width > 8)
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t s = 0; s < n; ++s)
        if (row(r)[6 + s] != row(s)[6 + n + r])
          return a2a_mismatch(
              f0.seq, names.who(static_cast<int>(r)), static_cast<std::size_t>(row(r)[6 + s]),
              names.who(static_cast<int>(s)), static_cast<std::size_t>(row(s)[6 + n + r]));
  return std::nullopt;
}

}  // namespace weft::comm::detail
