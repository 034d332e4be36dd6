// The reference note's unit model (pipeline_schedules.md §2.1: F = 1, I = W = 1 per stage, no
// output layer), which its golden numbers and closed forms assume.
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
