// weft/pipeline/search/repetend.hpp — schedules built from a repetend, as Tessel searches them
// (Lin et al., "Tessel: Boosting Distributed Execution of Large DNN Models via Flexible Schedule
// Search", HPCA 2024): a short per-rank pattern over k microbatches of F, I and W, repeated, with
// the warm-up and cool-down completed around it. One of the candidate generators of search.hpp.
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weft::pipeline::search {

//! One repetend. Rank r first runs `warmup(r)` forwards; then period after period it runs
//! `pattern` (a sequence holding k each of F, I and W, k = the window), where the j-th F of a
//! period is the next forward, the j-th I the next input-gradient backward and the j-th W the
//! next weight-gradient backward, except that W(i) is held back until I(i + lag(r)) has been
//! issued (W trails by `lag(r)` microbatches). Passes past microbatch m - 1 are dropped (the
//! cool-down is the repetend with its forwards gone), and the Ws still pending close the
//! program. 1F1B with eager W is pattern "FIW", warm-up p-r-1, lag 0; ZB-H1 is "FIW" with lag r.
struct repetend {
  //! How warm-up depth and W lag depend on the rank: `staggered` p - r - 1 + x (1F1B's), `uniform`
  //! x, `rising` r + x (ZB-H1's W lag).
  enum class shape : std::uint8_t { staggered, uniform, rising };

  std::string pattern = "FIW";
  shape warmup_shape = shape::staggered;
  int warmup_extra = 0;
  shape lag_shape = shape::uniform;
  int lag_extra = 0;

  [[nodiscard]] static int apply(shape sh, int x, int p, int r) noexcept {
    switch (sh) {
      case shape::staggered: return p - r - 1 + x;
      case shape::uniform: return x;
      case shape::rising: return r + x;
    }
    return x;
  }
  [[nodiscard]] int warmup(int p, int r) const noexcept {
    return std::max(0, apply(warmup_shape, warmup_extra, p, r));
  }
  [[nodiscard]] int lag(int p, int r) const noexcept {
    return std::max(0, apply(lag_shape, lag_extra, p, r));
  }

  [[nodiscard]] std::string name() const {
    auto sh = [](shape x, int e, char const* var) {
      std::string const base = x == shape::staggered ? "p-r-1" : (x == shape::rising ? var : "");
      if (base.empty()) return std::to_string(e);
      return base + (e > 0 ? "+" + std::to_string(e) : (e < 0 ? std::to_string(e) : ""));
    };
    return ::weft::detail::concat("repetend(", pattern, ", warm-up ",
                                  sh(warmup_shape, warmup_extra, "r"), ", W lag ",
                                  sh(lag_shape, lag_extra, "r"), ")");
  }
};

//! Every pattern of a window of k microbatches: the distinct sequences of k Fs, k Is and k Ws
//! (k = 1: the 6 orders of F, I, W; k = 2: 90 sequences; k = 3: 1680).
inline std::vector<std::string> repetend_patterns(int k) {
  WEFT_EXPECTS(k >= 1 && k <= 3, "k", "in [1, 3]", k);
  std::vector<std::string> out;
  std::string cur;
  auto rec = [&](auto&& self, int f, int i, int w) -> void {
    if (f == k && i == k && w == k) {
      out.push_back(cur);
      return;
    }
    for (char c : {'F', 'I', 'W'}) {
      int const left = c == 'F' ? f : (c == 'I' ? i : w);
      if (left == k) continue;
      cur.push_back(c);
      self(self, f + (c == 'F'), i + (c == 'I'), w + (c == 'W'));
      cur.pop_back();
    }
  };
  rec(rec, 0, 0, 0);
  return out;
}

//! The compute-only split-backward schedule (p ranks, p stages) of repetend `rep`. Well formed by
//! construction (complete, FIFO, each W after its I); whether it can run (no rank waits on a pass
//! its own program puts later) is `validate`'s or `simulate`'s to say.
inline schedule repetend_schedule(int p, int m, repetend const& rep) {
  WEFT_EXPECTS(p >= 1, "p", ">= 1", p);
  WEFT_EXPECTS(m >= 1, "m", ">= 1", m);
  int k = 0, ki = 0, kw = 0;
  for (char c : rep.pattern) {
    WEFT_EXPECTS(c == 'F' || c == 'I' || c == 'W', "rep.pattern", "letters F, I and W",
                 rep.pattern);
    k += c == 'F';
    ki += c == 'I';
    kw += c == 'W';
  }
  WEFT_EXPECTS(k >= 1 && k == ki && k == kw, "rep.pattern", "as many F as I as W, at least one",
               rep.pattern);
  schedule s(p, p, m);
  for (int r = 0; r < p; ++r) {
    int const warmup = std::min(rep.warmup(p, r), m);
    int const lag = rep.lag(p, r);
    int f = 0, i = 0, w = 0;
    for (; f < warmup; ++f) s.push(r, s.make(op::forward, r, f));
    while (i < m) {
      for (char c : rep.pattern) {
        if (c == 'F' && f < m) {
          s.push(r, s.make(op::forward, r, f++));
        } else if (c == 'I' && i < m && i < f) {
          s.push(r, s.make(op::backward_input, r, i++));
        } else if (c == 'W' && w < i && (w + lag < i || i == m)) {
          s.push(r, s.make(op::backward_weight, r, w++));
        }
      }
    }
    while (w < m) s.push(r, s.make(op::backward_weight, r, w++));
  }
  return s;
}

}  // namespace weft::pipeline::search
