// weft/pipeline/schedules/gpipe.hpp — GPipe (all forwards, then all backwards; PyTorch's
// ScheduleGPipe) as a compute-only schedule. 1F1B is in one_f_one_b.hpp.
#pragma once

#include <weft/pipeline/detail/check.hpp>  // detail::require
#include <weft/pipeline/schedule.hpp>      // schedule, op

namespace weft::pipeline {

//! GPipe on p ranks: F(0..m-1) then B(0..m-1) on every stage. Peak in-flight m on every rank.
inline schedule gpipe(int p, int m) {
  detail::require(p >= 1, "p", ">= 1", p, "p >= 1");
  detail::require(m >= 1, "m", ">= 1", m, "m >= 1");
  schedule s(p, p, m);
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < m; ++i) s.push(r, s.make(op::forward, r, i));
    for (int i = 0; i < m; ++i) s.push(r, s.make(op::backward, r, i));
  }
  return s;
}

}  // namespace weft::pipeline
