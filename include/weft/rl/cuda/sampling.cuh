// weft/rl/cuda/sampling.cuh — rl::sample_tokens on the GPU: one thread per row runs the CPU path's
// WEFT_HD rl::detail::sample_row over the row's device logits, with the coin
// rng::uniform_double(coins[r]) drawn on the device (Philox4x32-10, the host's values). O(V) per
// thread, four passes over the row (max, sum, search, entropy): a reference sampler for the
// vocabularies and batches of a reference model, whose draws equal the host's up to the device's
// exp (a coin within a few ulp of a CDF boundary may fall on the other side), not a block-per-row
// kernel for 150k vocabularies.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/rl/cuda/sampling.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/random.hpp>
#include <weft/rl/sampling.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/rl/cuda/sampling.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

namespace weft::rl::kernels {

template <class T>
__global__ void sample_tokens_kernel(T const* __restrict__ logits, std::int64_t rows, index_t vocab,
                                     rng gen, std::uint64_t const* __restrict__ coins,
                                     double inv_tau, bool greedy, token_sample* __restrict__ out) {
  std::int64_t const r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  double const coin = greedy ? 0.0 : gen.uniform_double(coins[r]);
  out[r] = rl::detail::sample_row(logits + r * vocab, vocab, inv_tau, coin, greedy);
}

//! out[r] (device memory) = rl::sample_tokens's draw from row r of `logits` (device, [rows,
//! vocab] row-major) with coin gen.uniform_double(coins[r]) (coins: device memory, one per row).
//! The host checks rows, vocab and the temperature before the launch (invalid_argument_error);
//! the logits are not read on the host, so a row without a finite largest logit / tau or with a
//! NaN or +inf gives a NaN log-prob and entropy instead of the CPU path's exception (nvcc may
//! also contract z·(1/tau) − max into an FMA: at tau != 1 one more rounding difference from the
//! host). Asynchronous on `stream`.
template <class T>
void sample_tokens(cudaStream_t stream, T const* logits, std::int64_t rows, index_t vocab,
                   rng const& gen, std::uint64_t const* coins, token_sample* out,
                   sample_options const& opt = {}) {
  double const inv_tau = rl::detail::sampling_inverse_temperature(vocab, opt);
  WEFT_EXPECTS(rows >= 0, "rows", ">= 0", rows);
  if (rows == 0) return;
  WEFT_EXPECTS(logits != nullptr && out != nullptr && (opt.greedy || coins != nullptr), "logits",
               "device logits, coins (unless greedy) and out", "a null pointer");
  constexpr int block = 128;
  std::int64_t const blocks = (rows + block - 1) / block;
  WEFT_EXPECTS(blocks <= 0x7fffffff, "rows", "<= (2^31 - 1) · 128", rows);
  sample_tokens_kernel<T><<<static_cast<unsigned>(blocks), block, 0, stream>>>(
      logits, rows, vocab, gen, coins, inv_tau, opt.greedy, out);
  WEFT_CUDA_TRY(cudaGetLastError());
}

}  // namespace weft::rl::kernels
