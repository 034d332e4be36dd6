// weft/rl/cuda/sampling.cuh — rl::sample_tokens on the GPU: a block of sample_block threads per
// row runs rl::detail::sample_row split among its threads (rl/sampling.hpp: the peak and mass of
// the row strided over the threads and combined by cub::BlockReduce; the inverse-CDF search over
// tiles of sample_block · sample_items<T> tokens, a cub::BlockScan of the threads' in-order sums
// giving each its start, stopping at the first tile that draws), with the coin
// rng::uniform_double(coins[r]) drawn on the device (Philox4x32-10, the host's values). Three
// passes over the row (peak; mass with the entropy's sum; the search, which stops where it draws),
// the last two from L2 when the rows in flight fit there (up to 4 blocks an SM by registers: at a
// 152k bf16 vocabulary, ~300 KB a row, an H100's 50 MB holds ~160 of its up to 528). The draws
// equal the host's up to the order of the sums and the device's exp (a coin within a few ulp of a
// CDF boundary may fall on the other side); detail::sample_row_split is the same split on the host,
// tested against sample_row on the CPU.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/rl/cuda/sampling.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/random.hpp>
#include <weft/rl/sampling.hpp>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda/functional>
#include <cuda_runtime_api.h>

#include <cstdint>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/rl/cuda/sampling.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

namespace weft::rl::kernels {

//! Threads per row, and tokens per thread of a search tile (16 bytes of logits).
inline constexpr int sample_block = 256;
template <class T>
inline constexpr index_t sample_items = sizeof(T) >= 16 ? 1 : static_cast<index_t>(16 / sizeof(T));

template <class T>
__global__ void __launch_bounds__(sample_block)
    sample_tokens_kernel(T const* __restrict__ logits, index_t vocab, rng gen,
                         std::uint64_t const* __restrict__ coins, double inv_tau, bool greedy,
                         token_sample* __restrict__ out) {
  namespace d = rl::detail;
  using peak_reduce = cub::BlockReduce<d::row_peak, sample_block>;
  using mass_reduce = cub::BlockReduce<d::row_mass, sample_block>;
  using prefix_scan = cub::BlockScan<double, sample_block>;
  using first_reduce = cub::BlockReduce<index_t, sample_block>;
  __shared__ typename peak_reduce::TempStorage peak_temp;
  __shared__ typename mass_reduce::TempStorage mass_temp;
  __shared__ typename prefix_scan::TempStorage scan_temp;
  __shared__ typename first_reduce::TempStorage first_temp;
  __shared__ double row_mx, row_s, row_t, row_u;
  __shared__ index_t row_arg, row_last, tile_first;

  std::int64_t const r = blockIdx.x;
  T const* z = logits + r * vocab;
  index_t const tid = threadIdx.x;

  d::row_peak const peak = peak_reduce(peak_temp).Reduce(
      d::peak_of(z, vocab, inv_tau, tid, sample_block), d::peak_combiner{});
  if (tid == 0) {
    row_mx = peak.mx;
    row_arg = peak.arg;
  }
  __syncthreads();
  double const mx = row_mx;
  d::row_mass const mass = mass_reduce(mass_temp).Reduce(
      d::mass_of(z, vocab, inv_tau, mx, tid, sample_block), d::mass_combiner{});
  if (tid == 0) {
    row_s = mass.s;
    row_t = mass.t;
    row_last = mass.last;
    row_u = greedy ? 0.0 : gen.uniform_double(coins[r]) * mass.s;
  }
  __syncthreads();
  index_t tok = row_arg;
  if (!greedy) {
    constexpr index_t items = sample_items<T>;
    double const u = row_u;
    double acc = 0;  // the mass of the tiles before this one (the same in every thread)
    index_t found = vocab;
    for (index_t tile = 0; tile < vocab; tile += sample_block * items) {
      index_t const b = tile + tid * items < vocab ? tile + tid * items : vocab;
      index_t const e = b + items < vocab ? b + items : vocab;
      double prefix = 0, total = 0;
      prefix_scan(scan_temp).ExclusiveSum(d::span_mass(z, b, e, inv_tau, mx), prefix, total);
      index_t const hit = d::span_search(z, b, e, inv_tau, mx, acc + prefix, u);
      index_t const first =
          first_reduce(first_temp).Reduce(hit < 0 ? vocab : hit, ::cuda::minimum<>{});
      if (tid == 0) tile_first = first;
      __syncthreads();
      found = tile_first;
      __syncthreads();  // every thread has read tile_first before the next tile writes it
      if (found < vocab) break;
      acc += total;
    }
    tok = found < vocab ? found : row_last;
  }
  if (tid == 0) out[r] = d::split_sample(z, tok, inv_tau, mx, d::row_mass{row_s, row_t, row_last});
}

//! out[r] (device memory) = rl::sample_tokens's draw from row r of `logits` (device, [rows,
//! vocab] row-major) with coin gen.uniform_double(coins[r]) (coins: device memory, one per row),
//! one block of sample_block threads per row. The host checks rows, vocab and the temperature
//! before the launch (invalid_argument_error); the logits are not read on the host, so a row
//! without a finite largest logit / tau or with a NaN or +inf gives a NaN log-prob and entropy (and
//! an unspecified token) instead of the CPU path's exception (nvcc may also contract z·(1/tau) −
//! max into an FMA: at tau != 1 one more rounding difference from the host). Asynchronous on
//! `stream`.
template <class T>
void sample_tokens(cudaStream_t stream, T const* logits, std::int64_t rows, index_t vocab,
                   rng const& gen, std::uint64_t const* coins, token_sample* out,
                   sample_options const& opt = {}) {
  double const inv_tau = rl::detail::sampling_inverse_temperature(vocab, opt);
  WEFT_EXPECTS(rows >= 0 && rows <= 0x7fffffff, "rows", "in [0, 2^31 - 1] (one block each)", rows);
  if (rows == 0) return;
  WEFT_EXPECTS(logits != nullptr && out != nullptr && (opt.greedy || coins != nullptr), "logits",
               "device logits, coins (unless greedy) and out", "a null pointer");
  sample_tokens_kernel<T><<<static_cast<unsigned>(rows), sample_block, 0, stream>>>(
      logits, vocab, gen, coins, inv_tau, opt.greedy, out);
  WEFT_CUDA_TRY(cudaGetLastError());
}

}  // namespace weft::rl::kernels
