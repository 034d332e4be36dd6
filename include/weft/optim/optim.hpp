// weft/optim/optim.hpp — the optimizer area: param_info, AdamW (torch's update, f32 and f64),
// global gradient-norm clipping over a mesh, learning-rate schedules.
#pragma once

#include <weft/optim/adamw.hpp>
#include <weft/optim/clip.hpp>
#include <weft/optim/lr_schedule.hpp>
#include <weft/optim/param.hpp>
