// weft/pipeline/schedules/options.hpp — generator_options, the options that the generators with
// no options of their own share (one_f_one_b, zero_bubble_h1).
#pragma once

namespace weft::pipeline {

//! Options shared by the generators. `unchecked` skips the rules that Megatron and PyTorch apply
//! to a configuration (not the basic ones: positive sizes), so experiments and tests can build
//! what those systems reject.
struct generator_options {
  bool unchecked = false;
};

}  // namespace weft::pipeline
