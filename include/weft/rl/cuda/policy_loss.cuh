// weft/rl/cuda/policy_loss.cuh — CUDA kernel for the per-token policy losses (ppo_clip, cispo,
// reinforce): the same WEFT_HD token functors as the CPU path, writing each token's weighted
// loss and its gradient; the caller sums the loss (e.g. cub::DeviceReduce::Sum).
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/rl/cuda/policy_loss.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/rl/policy_loss.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace weft::rl::kernels {

//! loss_tok[t] = w_t isw_t loss_t and dlogp[t] = w_t isw_t d loss_t / d l_t on valid tokens, 0 on
//! masked ones (their inputs are not read). isw may be null; old_logp may be null for reinforce.
template <class Fn, class T, class M>
__global__ void policy_token_kernel(Fn fn, std::int64_t n, T const* __restrict__ logp,
                                    T const* __restrict__ old_logp, T const* __restrict__ adv,
                                    M const* __restrict__ mask, T const* __restrict__ w,
                                    T const* __restrict__ isw, T* __restrict__ loss_tok,
                                    T* __restrict__ dlogp) {
  std::int64_t const step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += step) {
    if (mask[k] == M{}) {
      loss_tok[k] = T(0);
      dlogp[k] = T(0);
      continue;
    }
    pg_token<T> const p = fn(logp[k], old_logp != nullptr ? old_logp[k] : logp[k], adv[k]);
    T const scale = isw != nullptr ? w[k] * isw[k] : w[k];
    loss_tok[k] = scale * p.loss;
    dlogp[k] = scale * p.grad;
  }
}

//! Launches the per-token loss on `stream` (asynchronous; device pointers). GSPO needs row
//! statistics and is not offered here.
template <class T, class M>
void policy_loss_tokens(cudaStream_t stream, policy_loss_config const& cfg, std::int64_t n,
                        T const* logp, T const* old_logp, T const* adv, M const* mask, T const* w,
                        T const* isw, T* loss_tok, T* dlogp) {
  cfg.validate();
  WEFT_EXPECTS(cfg.kind != policy_loss_kind::gspo, "cfg.kind",
               "ppo_clip, cispo or reinforce (gspo: use the host path)", to_string(cfg.kind));
  if (n <= 0) return;
  int const block = 256;
  std::int64_t const want = (n + block - 1) / block;
  unsigned const grid = static_cast<unsigned>(want < 65535 ? want : 65535);
  T const el = static_cast<T>(cfg.clip_low), eh = static_cast<T>(cfg.clip_high);
  T const clamp = static_cast<T>(cfg.log_ratio_clamp);
  switch (cfg.kind) {
    case policy_loss_kind::ppo_clip:
      policy_token_kernel<<<grid, block, 0, stream>>>(
          ppo_clip_token<T>{el, eh, static_cast<T>(cfg.dual_clip), clamp}, n, logp, old_logp, adv,
          mask, w, isw, loss_tok, dlogp);
      break;
    case policy_loss_kind::cispo:
      policy_token_kernel<<<grid, block, 0, stream>>>(cispo_token<T>{el, eh, clamp}, n, logp,
                                                      old_logp, adv, mask, w, isw, loss_tok, dlogp);
      break;
    default:
      policy_token_kernel<<<grid, block, 0, stream>>>(reinforce_token<T>{}, n, logp, old_logp, adv,
                                                      mask, w, isw, loss_tok, dlogp);
      break;
  }
}

}  // namespace weft::rl::kernels
