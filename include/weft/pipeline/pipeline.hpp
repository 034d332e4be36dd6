// weft/pipeline/pipeline.hpp — the pipeline area in one include: schedules as data, their
// generators, schedule search, lowering, validation, simulation and drawings. Host and nvcc safe;
// the range-v3 planning helpers in weft/pipeline/plan/ are not included (host-only).
#pragma once

#include <weft/pipeline/action.hpp>
#include <weft/pipeline/cost_model.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/measured.hpp>
#include <weft/pipeline/render.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/schedules/controllable_memory.hpp>
#include <weft/pipeline/schedules/dualpipe.hpp>
#include <weft/pipeline/schedules/gpipe.hpp>
#include <weft/pipeline/schedules/interleaved.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/options.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/schedules/zero_bubble.hpp>
#include <weft/pipeline/search/search.hpp>
#include <weft/pipeline/simulate.hpp>
#include <weft/pipeline/stage.hpp>
#include <weft/pipeline/step.hpp>
#include <weft/pipeline/text.hpp>
#include <weft/pipeline/validate.hpp>
#include <weft/pipeline/vocab_stats.hpp>
