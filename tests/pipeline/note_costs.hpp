// The unit-cost model of the published bubble formulas (F = 1, I = W = 1 per stage, no output
// layer; Narayanan et al., SC'21, arXiv:2104.04473; Qi et al., ICLR'24, arXiv:2401.10241), which
// the golden makespans and closed forms of these tests assume.
#pragma once

#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/simulate.hpp>

inline weft::pipeline::cost_model note_costs(weft::pipeline::schedule const& s, double f = 1.0,
                                             double i = 1.0, double w = 1.0) {
  return weft::pipeline::unit_costs(s, f, i, w, 0.0);
}

inline weft::pipeline::simulation simulate_note(weft::pipeline::schedule const& s) {
  return weft::pipeline::simulate(s, note_costs(s));
}
