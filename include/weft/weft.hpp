// weft/weft.hpp — the umbrella header: every host-safe weft header (no .cuh, no optional backend
// that needs a component's definitions, and nothing under pipeline/plan/, which uses range-v3).
// Include single areas (weft/core/tensor.hpp, weft/mesh/mesh.hpp, ...) to pay only for what you
// use.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/exec.hpp>
#include <weft/core/math.hpp>
#include <weft/core/simd.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/random.hpp>
#include <weft/core/tensor.hpp>  // views, tensor, sub-views, copy, fill, printer

#include <weft/comm/comm.hpp>
#include <weft/mesh/mesh.hpp>

#include <weft/attention/flash.hpp>
#include <weft/attention/sharding.hpp>
#include <weft/attention/reference.hpp>
#include <weft/attention/ring.hpp>
#include <weft/attention/softmax_state.hpp>
#include <weft/attention/ulysses.hpp>
#include <weft/attention/usp.hpp>
#include <weft/pipeline/pipeline.hpp>
#include <weft/nn/nn.hpp>
#include <weft/optim/optim.hpp>
#include <weft/parallel/parallel.hpp>
#include <weft/rl/rl.hpp>
