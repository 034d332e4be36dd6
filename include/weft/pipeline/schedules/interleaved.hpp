// weft/pipeline/schedules/interleaved.hpp — interleaved 1F1B with v model chunks per rank and
// Megatron-Core's microbatch-group table (`get_schedule_table`), warmup
// 2(p-r-1) + (v-1)g, and its configuration rules (p <= g <= m, m % g in {0} or [p, g)).
#pragma once

#include <weft/pipeline/detail/check.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>  // one_f_one_b (v = 1)

#include <algorithm>
#include <utility>
#include <vector>

namespace weft::pipeline {

struct interleaved_options {
  //! Microbatch group size per virtual stage (Megatron's --microbatch-group-size-per-virtual-
  //! pipeline-stage); 0 means p, Megatron's default.
  int group = 0;
  bool unchecked = false;
};

//! The smallest microbatch group Megatron's rules accept for m >= p microbatches on p ranks: p
//! where p divides m, else the least g in (p, m] with m % g == 0 or m % g >= p (g = m always
//! qualifies). A step whose microbatch count varies (a DAPO batch) keeps the interleaved
//! schedule this way; the default group with `unchecked` can deadlock (p 5, m 7). For m < p no
//! group qualifies: there `unchecked` with the default group is valid (every forward is warmup).
[[nodiscard]] inline int interleaved_group_for(int p, int m) {
  detail::require(p >= 1, "p", ">= 1", p, "p >= 1");
  detail::require(m >= p, "m", ::weft::detail::concat(">= p (", p, ")"), m, "m >= p");
  int g = p;
  while (m % g != 0 && m % g < p) ++g;
  return g;
}

//! Megatron's schedule table: for each group of g microbatches (the last one takes the rest),
//! chunk 0 over the group, then chunk 1, ...; entry k is (microbatch, chunk) of virtual id k.
inline std::vector<std::pair<int, int>> interleaved_table(int m, int v, int g) {
  std::vector<std::pair<int, int>> table;
  table.reserve(static_cast<std::size_t>(m) * static_cast<std::size_t>(v));
  for (int start = 0; start < m; start += g) {
    int const end = std::min(start + g, m);
    for (int c = 0; c < v; ++c)
      for (int mb = start; mb < end; ++mb) table.emplace_back(mb, c);
  }
  return table;
}

//! Interleaved 1F1B on p ranks with v chunks (looped placement: chunk c of rank r is stage c*p+r).
//! Rank r runs W = min(2(p-r-1) + (v-1)g, mv) forwards, then F(table[W+k]), B(k) pairs, then the
//! remaining backwards; backward k is chunk v-1-chunk(table[k]). v = 1 is plain 1F1B, as in
//! Megatron's dispatch. Megatron's rules are enforced unless `unchecked`.
inline schedule interleaved_one_f_one_b(int p, int m, int v, interleaved_options opt = {}) {
  detail::require(p >= 1, "p", ">= 1", p, "p >= 1");
  detail::require(m >= 1, "m", ">= 1", m, "m >= 1");
  detail::require(v >= 1, "v", ">= 1", v, "v >= 1");
  if (v == 1) return one_f_one_b(p, m, generator_options{opt.unchecked});
  int const g = opt.group == 0 ? p : opt.group;
  detail::require(g >= 1, "group", ">= 1", g, "group >= 1");
  if (!opt.unchecked) {
    detail::require(g >= p, "group", ::weft::detail::concat(">= p (", p, ")"), g, "p <= group");
    detail::require(g <= m, "group", ::weft::detail::concat("<= m (", m, ")"), g, "group <= m");
    detail::require(m % g == 0 || m % g >= p, "m % group",
                    ::weft::detail::concat("0 or >= p (", p, ") to avoid dependency bubbles"),
                    m % g, "m % group == 0 || m % group >= p");
  }
  auto const table = interleaved_table(m, v, g);
  int const total = m * v;
  schedule s(p, p * v, m);
  for (int r = 0; r < p; ++r) {
    int const warmup = std::min(2 * (p - r - 1) + (v - 1) * g, total);
    int const steady = total - warmup;
    auto fwd = [&](int k) {
      auto [mb, c] = table[static_cast<std::size_t>(k)];
      s.push(r, s.make(op::forward, c * p + r, mb));
    };
    auto bwd = [&](int k) {
      auto [mb, c] = table[static_cast<std::size_t>(k)];
      s.push(r, s.make(op::backward, (v - 1 - c) * p + r, mb));
    };
    for (int k = 0; k < warmup; ++k) fwd(k);
    for (int k = 0; k < steady; ++k) {
      fwd(warmup + k);
      bwd(k);
    }
    for (int k = steady; k < total; ++k) bwd(k);
  }
  return s;
}

}  // namespace weft::pipeline
