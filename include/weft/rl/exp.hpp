// weft/rl/exp.hpp — rl's names for the vectorised streaming loops' building blocks: weft's
// exponential (exp_fn and select, in weft/core/math.hpp) and the run-time choice of vector ISA
// (weft/core/simd.hpp), which the log-prob and policy-loss loops are compiled for.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/math.hpp>
#include <weft/core/simd.hpp>

#define WEFT_RL_MULTIVERSION WEFT_MULTIVERSION
#if WEFT_MULTIVERSION
#define WEFT_RL_TARGET_AVX2 WEFT_TARGET_AVX2
#define WEFT_RL_TARGET_AVX512 WEFT_TARGET_AVX512
#endif

namespace weft::rl::detail {

using weft::detail::host_simd_level;
using weft::detail::simd_level;

}  // namespace weft::rl::detail
