// weft/pipeline/schedules/dualpipe.hpp — DualPipeV (DeepSeek-V3's DualPipe cut in half: two
// chunks per rank in a V, microbatches fed from one end), in the order of deepseek-ai/DualPipe's
// dualpipev.py and PyTorch's ScheduleDualPipeV: full backwards in the steady state, each paired
// with a forward of the other chunk (the pairs DualPipe overlaps), and the backward split into I
// and W at both ends, where the deferred W fill what would be bubbles.
#pragma once

#include <weft/pipeline/detail/check.hpp>
#include <weft/pipeline/schedule.hpp>

#include <cstddef>
#include <vector>

namespace weft::pipeline {

//! DualPipeV on p ranks: 2p stages in a V (placement::v; rank r holds stage r, chunk 0, and stage
//! 2p-1-r, chunk 1; the last stage is rank 0's chunk 1). Rank r's program, in dualpipev.py's
//! eight steps (F0/F1 a forward of chunk 0/1, B a full backward, I an input-gradient backward
//! whose W is queued, W the oldest queued weight gradient):
//!   1. 2(p-r-1) x F0
//!   2. r+1 x (F0, F1)
//!   3. p-r-1 x (I1, W, F1)
//!   4. m-2p+r+1 x (F0, B1, F1, B0)   (F0 with B1 and F1 with B0: the overlapped pairs)
//!   5. p-r-1 x (B1, F1, B0)
//!   6. r+1 x (B1, B0), split into I from iteration (r+1)/2 (counting from 0) on: from that
//!      iteration's B1 on odd ranks, from its B0 on even ones
//!   7. p-r-1 x (W, I0)
//!   8. r+1 x W
//! Each overlapped pair is two actions here, forward first (dualpipev.py's order without an
//! overlapped_forward_backward module); the simulator times them one after the other, so it
//! gives an upper bound on a pair that really overlaps compute and communication. With
//! F = I = W per stage (chunks half of that) every rank is idle (p-1)/2 of the makespan, as ZBV,
//! and peak in-flight is 2p+1 chunk-microbatches on every rank (the README's PP + 1 with PP =
//! 2p stages). Needs m >= 2p (dualpipev.py's num_chunks >= 2 * num_ranks); there is no unchecked
//! form, as the program is not defined below it.
inline schedule dualpipe_v(int p, int m) {
  detail::require(p >= 1, "p", ">= 1", p, "p >= 1");
  detail::require(m >= 2 * p, "m", ::weft::detail::concat(">= 2p (", 2 * p, ")"), m, "m >= 2p");
  schedule s(p, 2 * p, m, placement::v);
  for (int r = 0; r < p; ++r) {
    int const stage[2] = {r, 2 * p - 1 - r};
    int next_f[2] = {0, 0}, next_b[2] = {0, 0};
    std::vector<action> queued_w;  // FIFO, as dualpipe's WeightGradStore
    std::size_t w_head = 0;
    auto forward = [&](int c) { s.push(r, s.make(op::forward, stage[c], next_f[c]++)); };
    auto backward = [&](int c, bool split) {
      int const mb = next_b[c]++;
      if (!split) {
        s.push(r, s.make(op::backward, stage[c], mb));
        return;
      }
      s.push(r, s.make(op::backward_input, stage[c], mb));
      queued_w.push_back(s.make(op::backward_weight, stage[c], mb));
    };
    auto weight = [&] { s.push(r, queued_w[w_head++]); };

    for (int i = 0; i < 2 * (p - r - 1); ++i) forward(0);
    for (int i = 0; i < r + 1; ++i) {
      forward(0);
      forward(1);
    }
    for (int i = 0; i < p - r - 1; ++i) {
      backward(1, true);
      weight();
      forward(1);
    }
    for (int i = 0; i < m - 2 * p + r + 1; ++i) {
      forward(0);
      backward(1, false);
      forward(1);
      backward(0, false);
    }
    for (int i = 0; i < p - r - 1; ++i) {
      backward(1, false);
      forward(1);
      backward(0, false);
    }
    bool split = false;
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) split = true;
      backward(1, split);
      if (i == (r + 1) / 2 && r % 2 == 0) split = true;
      backward(0, split);
    }
    for (int i = 0; i < p - r - 1; ++i) {
      weight();
      backward(0, true);
    }
    for (int i = 0; i < r + 1; ++i) weight();
  }
  return s;
}

}  // namespace weft::pipeline
