// weft/pipeline/schedules/controllable_memory.hpp — V-Half and V-Min, the V-shape schedules of
// Qi et al., "Pipeline Parallelism with Controllable Memory" (NeurIPS'24, arXiv 2405.15362):
// two chunks per rank in a V, the backward split into I and W, built from a repeated "building
// block" whose lifespan sets the peak activation memory: about half of 1F1B's (V-Half) or a
// third (V-Min), at a bubble between 1F1B's and ZBV's.
#pragma once

#include <weft/pipeline/detail/check.hpp>
#include <weft/pipeline/schedule.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <tuple>
#include <utility>
#include <vector>

namespace weft::pipeline {

//! Which building block a V schedule repeats: `half` (V-Half: about 1/2 of 1F1B's activation
//! memory, bubble about half of 1F1B's) or `min` (V-Min: about 1/3, bubble about 2/3 of 1F1B's).
enum class v_memory : unsigned char { half, min };

namespace detail::vshape {

// One rank's actions as time slots (unit time, F = I = W): slots[t][k] is the slot of the k-th
// action of kind t, kinds in the order below. A rank runs its actions of one kind in microbatch
// order, so the k-th of a kind is microbatch k's.
enum kind : int { f0 = 0, f1, i1, i0, w1, w0 };  // f0/i0/w0: chunk 0 (stage r); the rest chunk 1
using rank_slots = std::vector<std::vector<int>>;

// The building block's slots of microbatch 0 (F0, F1, I1, I0) on each rank, repeated every 6
// slots: the stable patterns of the paper's Figure 3, as sail-sg's zbv_greedy.py lays them out.
inline std::vector<std::array<int, 4>> block(int p, v_memory mem) {
  std::vector<std::array<int, 4>> out(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    if (mem == v_memory::half) {
      int const gap = p % 2 == 0 ? 3 : 0;
      out[static_cast<std::size_t>(r)] = {2 * r, 3 * p - r - 2, 3 * p + gap + 2 * r - 1,
                                          6 * p + gap - r - 2};
    } else {
      int const gap = p % 3 == 0 ? 2 : 0;
      out[static_cast<std::size_t>(r)] = {r, 2 * p - r - 1, 2 * p + gap + r, 4 * p + gap - r - 1};
    }
  }
  return out;
}

inline int last_slot(rank_slots const& s) {
  int last = -1;
  for (auto const& v : s)
    if (!v.empty()) last = std::max(last, v.back());
  return last;
}

// The kind whose next action (past `next`) sits at slot `t` among the first `kinds`, or -1.
inline int kind_at(rank_slots const& s, std::vector<std::size_t> const& next, int kinds, int t) {
  for (int k = 0; k < kinds; ++k) {
    auto const u = static_cast<std::size_t>(k);
    if (next[u] < s[u].size() && s[u][next[u]] == t) return k;
  }
  return -1;
}

// Appends W: each free slot (no F or I) takes a pending W, as do the slots after the last one.
// `split`: separate lists for chunk 1's and chunk 0's W (w1 before w0 when both are pending);
// otherwise one list, kind 4, for W of either chunk.
inline void put_w(rank_slots& s, bool split) {
  s.resize(4);  // F and I only
  int const bound = last_slot(s);
  s.resize(split ? 6 : 5);
  std::array<int, 2> pending{0, 0};
  std::vector<std::size_t> next(4, 0);
  for (int t = 0; t <= bound; ++t) {
    int const k = kind_at(s, next, 4, t);
    if (k >= 0) {
      ++next[static_cast<std::size_t>(k)];
      if (k == i1 || k == i0) ++pending[split ? static_cast<std::size_t>(k - i1) : 0];
      continue;
    }
    for (std::size_t w = 0; w < 2; ++w)
      if (pending[w] > 0) {
        s[4 + w].push_back(t);
        --pending[w];
        break;
      }
  }
  int t = bound;
  for (std::size_t w = 0; w < 2; ++w)
    for (; pending[w] > 0; --pending[w]) s[4 + w].push_back(++t);
}

// Peak activations held on a rank, an F holding one chunk-activation until its W: with W lists,
// counted exactly; without, a pending W is assumed to run in each free slot.
inline int peak_memory(rank_slots const& s) {
  bool const has_w = s.size() > 4;
  int const kinds = static_cast<int>(s.size());
  std::vector<std::size_t> next(s.size(), 0);
  int cur = 0, peak = 0, pending = 0;
  for (int t = 0, bound = last_slot(s); t <= bound; ++t) {
    int const k = kind_at(s, next, kinds, t);
    if (k >= 0) {
      ++next[static_cast<std::size_t>(k)];
      if (k <= f1) ++cur;
      if (k >= w1) --cur;
      if (k == i1 || k == i0) ++pending;
    } else if (!has_w && pending > 0) {
      --cur;
      --pending;
    }
    peak = std::max(peak, cur);
  }
  return peak;
}

// Start times of the slots' actions run as early as their dependencies and their rank's order
// allow (unit time, no communication cost): the paper's "squeeze" of a slot table.
inline std::vector<rank_slots> eager(std::vector<rank_slots> const& slots) {
  auto const p = slots.size();
  auto const kinds = slots[0].size();
  std::vector<rank_slots> end(p, rank_slots(kinds));
  for (std::size_t r = 0; r < p; ++r)
    for (std::size_t k = 0; k < kinds; ++k) end[r][k].assign(slots[r][k].size(), 0);
  // Every action, in slot order (ties: rank, kind, microbatch), which respects the dependencies.
  std::vector<std::tuple<int, std::size_t, std::size_t, std::size_t>> order;
  for (std::size_t r = 0; r < p; ++r)
    for (std::size_t k = 0; k < kinds; ++k)
      for (std::size_t mb = 0; mb < slots[r][k].size(); ++mb)
        order.emplace_back(slots[r][k][mb], r, k, mb);
  std::sort(order.begin(), order.end());
  std::vector<int> rank_free(p, 0);
  for (auto const& [slot, r, k, mb] : order) {
    int ready = rank_free[r];
    if ((k == f0 || k == i1) && r > 0) ready = std::max(ready, end[r - 1][k][mb]);
    if ((k == f1 || k == i0) && r + 1 < p) ready = std::max(ready, end[r + 1][k][mb]);
    if (k >= f1 && k <= i0) ready = std::max(ready, end[r][k - 1][mb]);
    if (mb > 0) ready = std::max(ready, end[r][k][mb - 1]);
    end[r][k][mb] = ready + 1;
    rank_free[r] = ready + 1;
  }
  for (auto& rank : end)
    for (auto& v : rank)
      for (int& t : v) --t;  // start = end - 1
  return end;
}

// The paper's reordering pass: every action, in slot order, moves to the earliest free slot after
// its dependencies that keeps its rank's peak memory within the table's current peak. The
// building block's slots are kept from the first chunk-0 I on rank 0 up to the last microbatch's
// F0 (its stable middle); with_w: the W are placed first (one list) and move too.
inline std::vector<rank_slots> reorder(std::vector<rank_slots> slots, bool with_w) {
  if (with_w)
    for (auto& s : slots) put_w(s, false);
  auto const p = slots.size();
  auto const kinds = slots[0].size();
  int limit = 0;
  for (auto const& s : slots) limit = std::max(limit, peak_memory(s));
  std::vector<std::vector<char>> taken(p);
  for (std::size_t r = 0; r < p; ++r)
    taken[r].assign(static_cast<std::size_t>(last_slot(slots[r]) + 1), 0);
  std::vector<std::vector<std::size_t>> next(p, std::vector<std::size_t>(kinds, 0));
  std::size_t total = 0;
  for (auto const& v : slots[0]) total += v.size() * p;
  int phase = 0;
  for (std::size_t n = 0; n < total; ++n) {
    // The action with the smallest (slot, rank, kind, microbatch) not yet placed.
    std::tuple<int, std::size_t, std::size_t> best{-1, 0, 0};
    bool found = false;
    for (std::size_t r = 0; r < p; ++r)
      for (std::size_t k = 0; k < kinds; ++k)
        if (next[r][k] < slots[r][k].size()) {
          std::tuple<int, std::size_t, std::size_t> const c{slots[r][k][next[r][k]], r, k};
          if (!found || c < best) best = c;
          found = true;
        }
    auto const [at, r, k] = best;
    auto const mb = next[r][k]++;
    if (k == i0 && r == 0 && phase == 0) phase = 1;
    bool const fixed = phase == 1 || (phase == 0 && !with_w);
    if (phase == 1 && k == f0 && mb + 1 == slots[0][f0].size()) phase = 2;
    if (!fixed) {
      int dep = -1;
      if ((k == f0 || k == i1) && r > 0) dep = std::max(dep, slots[r - 1][k][mb]);
      if ((k == f1 || k == i0) && r + 1 < p) dep = std::max(dep, slots[r + 1][k][mb]);
      if (k >= f1 && k <= i0) dep = std::max(dep, slots[r][k - 1][mb]);
      if (k == 4) {  // the mb-th W follows the mb-th I of either chunk
        std::vector<int> is = slots[r][i1];
        is.insert(is.end(), slots[r][i0].begin(), slots[r][i0].end());
        std::nth_element(is.begin(), is.begin() + static_cast<std::ptrdiff_t>(mb), is.end());
        dep = std::max(dep, is[mb]);
      }
      if (mb > 0) dep = std::max(dep, slots[r][k][mb - 1]);
      bool moved = false;
      for (int t = dep + 1; t < at && !moved; ++t) {
        if (taken[r][static_cast<std::size_t>(t)]) continue;
        slots[r][k][mb] = t;
        moved = peak_memory(slots[r]) <= limit;
      }
      if (!moved) slots[r][k][mb] = at;
    }
    auto const t = static_cast<std::size_t>(slots[r][k][mb]);
    if (t >= taken[r].size()) taken[r].resize(t + 1, 0);
    taken[r][t] = 1;
  }
  if (!with_w)
    for (auto& s : slots) put_w(s, false);
  return eager(slots);
}

}  // namespace detail::vshape

//! A V-shape schedule of controllable memory on p ranks (2p stages, placement::v: rank r holds
//! stage r, chunk 0, and stage 2p-1-r, chunk 1), built as the paper's reference scheduler
//! (sail-sg's zbv_greedy.py) builds it: the building block of `mem` repeated every 6 unit slots
//! for each microbatch, then two greedy reordering passes ("squeeze"; the first moves W too, the
//! second re-places them in free slots) that keep each rank's peak memory, and the W of each
//! chunk put in the free slots that remain (chunk 1's first). Its peak in-flight is at most
//! p + 2 chunk-microbatches (V-Half: p + 2 for even p, p + 1 for odd; ZBV and 1F1B hold 2p) or
//! ceil(2p/3) + 2 (V-Min); the rank programs for (4, 8, half), (3, 5, half), (3, 6, min) and
//! (2, 4, min) equal zbv_greedy.py's action for action (tests/pipeline/
//! controllable_memory.test.cpp). Any m >= 1. Building takes Theta(p^2 m) time (about 4 s at
//! p = 64, m = 4096).
inline schedule v_schedule(int p, int m, v_memory mem) {
  detail::require(p >= 1, "p", ">= 1", p, "p >= 1");
  detail::require(m >= 1, "m", ">= 1", m, "m >= 1");
  using namespace detail::vshape;
  auto const P = static_cast<std::size_t>(p);
  std::vector<rank_slots> slots(P, rank_slots(4));
  auto const first = block(p, mem);
  for (std::size_t r = 0; r < P; ++r)
    for (std::size_t k = 0; k < 4; ++k)
      for (int mb = 0; mb < m; ++mb) slots[r][k].push_back(first[r][k] + 6 * mb);
  slots = reorder(std::move(slots), true);
  for (auto& s : slots) s.resize(4);
  slots = reorder(std::move(slots), false);
  for (auto& s : slots) {
    s.resize(4);
    put_w(s, true);
  }
  schedule out(p, 2 * p, m, placement::v);
  for (int r = 0; r < p; ++r) {
    auto const& s = slots[static_cast<std::size_t>(r)];
    std::vector<std::tuple<int, int, int>> acts;  // slot, kind, microbatch
    for (std::size_t k = 0; k < s.size(); ++k)
      for (std::size_t mb = 0; mb < s[k].size(); ++mb)
        acts.emplace_back(s[k][mb], static_cast<int>(k), static_cast<int>(mb));
    std::sort(acts.begin(), acts.end());
    for (auto const& [slot, k, mb] : acts) {
      int const stage = (k == f0 || k == i0 || k == w0) ? r : 2 * p - 1 - r;
      op const o = k <= f1 ? op::forward : (k <= i0 ? op::backward_input : op::backward_weight);
      out.push(r, out.make(o, stage, mb));
    }
  }
  return out;
}

//! V-Half: about half of 1F1B's activation memory (see v_schedule).
inline schedule v_half(int p, int m) { return v_schedule(p, m, v_memory::half); }

//! V-Min: about a third of 1F1B's activation memory (see v_schedule).
inline schedule v_min(int p, int m) { return v_schedule(p, m, v_memory::min); }

}  // namespace weft::pipeline
