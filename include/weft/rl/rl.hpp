// weft/rl/rl.hpp — everything of weft's RL area in one include: token log-probs and entropy
// (whole and vocabulary-parallel), policy losses, aggregation, advantages, KL, value loss,
// dynamic sampling, overlong shaping, rl_config and keyed token sampling. CUDA kernels:
// weft/rl/cuda/*.cuh.
#pragma once

#include <weft/rl/advantages.hpp>
#include <weft/rl/aggregation.hpp>
#include <weft/rl/dynamic_sampling.hpp>
#include <weft/rl/exp.hpp>
#include <weft/rl/kl.hpp>
#include <weft/rl/token_layout.hpp>
#include <weft/rl/logprobs.hpp>
#include <weft/rl/named_arrays.hpp>
#include <weft/rl/policy_loss.hpp>
#include <weft/rl/sampling.hpp>
#include <weft/rl/vocab_parallel.hpp>
