// weft/rl/cuda/returns.cuh — the token-level advantages on the GPU: masked whitening (statistics
// in double with cub::DeviceReduce, two passes as the CPU: count and Σv, then Σ(v − mean)²),
// discounted returns and REINFORCE++, ReMax, and GAE with returns. The row recurrences are
// parallel scans: a block per row, the row in tiles of 512 tokens from its end, each tile one
// cub::BlockScan of the recurrence's affine state maps composed after the later tiles' carry, so
// a row of any length runs on 128 threads (thread x reads 4 consecutive tokens; a warp, 128).
// Their elements and outputs are the CPU path's WEFT_HD scan form (rl::detail::discounted_scan,
// remax_scan, gae_scan), which tests/rl/advantages.test.cpp checks against the CPU's sequential
// row functions; the regrouping changes only rounding. The whitening is the CPU's whiten_fn per
// token. Rows are a padded [rows, cols] batch or packed rows given by device offsets
// (token_layout's two forms, as device_rows).
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/rl/cuda/returns.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/rl/advantages.hpp>
#include <weft/rl/cuda/advantages.cuh>  // adv_detail::scratch, blocks_for, align_up

#include <cub/block/block_scan.cuh>
#include <cub/device/device_reduce.cuh>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/rl/cuda/returns.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

namespace weft::rl::kernels {

//! The rows of a token batch on the device: padded (row i is [i·cols, (i+1)·cols)) or packed
//! (row i is [offsets[i], offsets[i+1]) with `offsets` device memory holding rows + 1 values, the
//! cu_seqlens of token_layout::packed; `tokens` = offsets[rows], which the host knows).
struct device_rows {
  std::int64_t const* offsets = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t tokens = 0;

  static device_rows padded(std::int64_t rows, std::int64_t cols) {
    WEFT_EXPECTS(rows >= 0, "rows", ">= 0", rows);
    WEFT_EXPECTS(cols >= 0, "cols", ">= 0", cols);
    WEFT_EXPECTS(cols == 0 || rows <= INT64_MAX / cols, "rows * cols", "<= 2^63 - 1",
                 ::weft::detail::concat(rows, " * ", cols));
    return {nullptr, rows, cols, rows * cols};
  }
  static device_rows packed(std::int64_t const* device_offsets, std::int64_t rows,
                            std::int64_t tokens) {
    WEFT_EXPECTS(rows >= 0, "rows", ">= 0", rows);
    WEFT_EXPECTS(tokens >= 0, "tokens", ">= 0 (offsets[rows])", tokens);
    WEFT_EXPECTS(device_offsets != nullptr || rows == 0, "offsets",
                 "rows + 1 device offsets (cu_seqlens)", "null");
    return {device_offsets, rows, 0, tokens};
  }
  [[nodiscard]] WEFT_HD std::int64_t begin(std::int64_t i) const noexcept {
    return offsets != nullptr ? offsets[i] : i * cols;
  }
  [[nodiscard]] WEFT_HD std::int64_t end(std::int64_t i) const noexcept {
    return offsets != nullptr ? offsets[i + 1] : (i + 1) * cols;
  }
};

namespace returns_detail {

// The row recurrences as reverse scans (rl::detail::discounted_scan, remax_scan, gae_scan: the
// row functions' arithmetic as scan elements and outputs): a block per row walks it in tiles of
// scan_tile tokens from its end; each tile is one cub::BlockScan in reverse token order, composed
// after the carry of the later tiles. Thread x holds tokens tile_end − 1 − (x·items + i).
constexpr int scan_block = 128;
constexpr int scan_items = 4;
constexpr std::int64_t scan_tile = std::int64_t{scan_block} * scan_items;

//! One tile's block-wide reverse scan: items become their inclusive (Exclusive: exclusive) scan
//! composed after `carry`, and carry moves past the tile. Every thread of the block calls it.
template <bool Exclusive, class E, class Op>
__device__ void tile_scan(E (&items)[scan_items], E& carry, Op op,
                          typename cub::BlockScan<E, scan_block>::TempStorage& temp) {
  using block_scan = cub::BlockScan<E, scan_block>;
  E aggregate;
  if constexpr (Exclusive)
    block_scan(temp).ExclusiveScan(items, items, E{}, op, aggregate);  // E{}: the identity
  else
    block_scan(temp).InclusiveScan(items, items, op, aggregate);
  for (int i = 0; i < scan_items; ++i) items[i] = op(carry, items[i]);
  carry = op(carry, aggregate);
  __syncthreads();  // temp is reused by the next scan
}

//! Token i of this thread's part of the tile ending at tile_end.
__device__ inline std::int64_t tile_token(std::int64_t tile_end, int i) {
  return tile_end - 1 - (static_cast<std::int64_t>(threadIdx.x) * scan_items + i);
}

//! One affine reverse scan over a row's tokens [begin, end), tile by tile from its end: element(t)
//! the token's map (the identity past the row's start), then write(t, state) with the state of
//! the inclusive (Exclusive: exclusive) scan. Every thread of the block calls it.
template <bool Exclusive, class Element, class Write>
__device__ void scan_row(
    std::int64_t begin, std::int64_t end, Element const& element, Write const& write,
    typename cub::BlockScan<rl::detail::affine_map, scan_block>::TempStorage& temp) {
  using rl::detail::affine_map;
  affine_map carry{};
  for (; end > begin; end -= scan_tile) {
    affine_map items[scan_items];
    for (int k = 0; k < scan_items; ++k) {
      std::int64_t const t = tile_token(end, k);
      items[k] = t >= begin ? element(t) : affine_map{};
    }
    tile_scan<Exclusive>(items, carry, rl::detail::affine_then{}, temp);
    for (int k = 0; k < scan_items; ++k) {
      std::int64_t const t = tile_token(end, k);
      if (t >= begin) write(t, items[k].b);
    }
  }
}

template <class T, class M>
__global__ void __launch_bounds__(scan_block)
    discounted_scan_kernel(device_rows rows, rl::detail::discounted_scan<T, M> f) {
  __shared__ typename cub::BlockScan<rl::detail::affine_map, scan_block>::TempStorage temp;
  for (std::int64_t i = blockIdx.x; i < rows.rows; i += gridDim.x)
    scan_row<true>(
        rows.begin(i), rows.end(i), [&](std::int64_t t) { return f.element(t); },
        [&](std::int64_t t, double later) { f.write(t, later); }, temp);
}

template <class T, class M>
__global__ void __launch_bounds__(scan_block)
    remax_scan_kernel(device_rows rows, rl::detail::remax_scan<T, M> f,
                      T const* __restrict__ baselines) {
  __shared__ typename cub::BlockScan<rl::detail::affine_map, scan_block>::TempStorage temp;
  for (std::int64_t i = blockIdx.x; i < rows.rows; i += gridDim.x) {
    double const b = static_cast<double>(baselines[i]);
    scan_row<false>(
        rows.begin(i), rows.end(i), [&](std::int64_t t) { return f.element(t); },
        [&](std::int64_t t, double run) { f.write(t, run, b); }, temp);
  }
}

template <class T, class M>
__global__ void __launch_bounds__(scan_block)
    gae_scan_kernel(device_rows rows, rl::detail::gae_scan<T, M> f) {
  using rl::detail::affine_map;
  using rl::detail::nearest_valid;
  __shared__ typename cub::BlockScan<nearest_valid, scan_block>::TempStorage next_temp;
  __shared__ typename cub::BlockScan<affine_map, scan_block>::TempStorage temp;
  for (std::int64_t i = blockIdx.x; i < rows.rows; i += gridDim.x) {
    std::int64_t const begin = rows.begin(i);
    nearest_valid next_carry{};
    affine_map carry{};
    for (std::int64_t end = rows.end(i); end > begin; end -= scan_tile) {
      nearest_valid next[scan_items];
      for (int k = 0; k < scan_items; ++k) {
        std::int64_t const t = tile_token(end, k);
        next[k] = t >= begin ? f.value_element(t) : nearest_valid{};
      }
      tile_scan<true>(next, next_carry, rl::detail::nearer_valid{}, next_temp);
      affine_map items[scan_items];
      for (int k = 0; k < scan_items; ++k) {
        std::int64_t const t = tile_token(end, k);
        items[k] = t >= begin ? f.element(t, next[k]) : affine_map{};
      }
      tile_scan<false>(items, carry, rl::detail::affine_then{}, temp);
      for (int k = 0; k < scan_items; ++k) {
        std::int64_t const t = tile_token(end, k);
        if (t >= begin) f.write(t, items[k].b);
      }
    }
  }
}

//! Σ of whiten_stats, field by field (cub's reduction operator).
struct stats_plus {
  WEFT_HD whiten_stats operator()(whiten_stats const& a, whiten_stats const& b) const noexcept {
    whiten_stats s;
    s.count = a.count + b.count;
    s.sum = a.sum + b.sum;
    s.sum_sq = a.sum_sq + b.sum_sq;
    return s;
  }
};

//! terms[k] = {1, v, v²} on valid tokens, zeros on masked ones (their values are not read).
template <class T, class M>
__global__ void stats_terms_kernel(T const* __restrict__ values, M const* __restrict__ mask,
                                   std::int64_t n, whiten_stats* __restrict__ terms) {
  std::int64_t const k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  whiten_stats t;
  if (rl::detail::valid(mask[k])) {
    double const v = static_cast<double>(values[k]);
    t.count = 1;
    t.sum = v;
    t.sum_sq = v * v;
  }
  terms[k] = t;
}

//! d2[k] = (v − mean)² on valid tokens, 0 on masked ones; the mean from the device statistics.
template <class T, class M>
__global__ void centred_squares_kernel(T const* __restrict__ values, M const* __restrict__ mask,
                                       std::int64_t n, whiten_stats const* __restrict__ stats,
                                       double* __restrict__ d2) {
  std::int64_t const k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  double const d = static_cast<double>(values[k]) - stats->mean();
  d2[k] = rl::detail::valid(mask[k]) ? d * d : 0.0;
}

//! The centred Σ re-expressed as the raw Σv² (rl::detail::raw_sum_sq, as the CPU).
template <class = void>
__global__ void finish_stats_kernel(whiten_stats* stats, double const* centred) {
  stats->sum_sq = rl::detail::raw_sum_sq(*centred, stats->sum, stats->count);
}

template <class T, class M>
__global__ void whiten_kernel(T const* values, M const* __restrict__ mask, std::int64_t n,
                              whiten_stats const* __restrict__ stats, bool shift_mean, double eps,
                              T* out) {
  std::int64_t const k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  rl::detail::whiten_fn const fn(*stats, shift_mean, eps);
  out[k] = fn(values[k], rl::detail::valid(mask[k]));
}

constexpr int block = 256;

inline void check_rows(device_rows const& r) {
  WEFT_EXPECTS(r.rows >= 0 && r.tokens >= 0, "rows", "a device_rows from padded() or packed()",
               ::weft::detail::concat(r.rows, " rows, ", r.tokens, " tokens"));
}

inline unsigned grid_for(std::int64_t n) { return adv_detail::blocks_for(n, block); }

//! Launches a row-scan kernel (a block per row, the grid striding over rows) after checking them.
template <class Kernel, class... Args>
void launch_row_scans(cudaStream_t stream, device_rows const& rows, Kernel kernel, Args... args) {
  check_rows(rows);
  if (rows.rows == 0) return;
  constexpr std::int64_t max_blocks = std::int64_t{1} << 20;
  auto const blocks = static_cast<unsigned>(rows.rows < max_blocks ? rows.rows : max_blocks);
  kernel<<<blocks, scan_block, 0, stream>>>(rows, args...);
  WEFT_CUDA_TRY(cudaGetLastError());
}

//! Σ over n items of `in` (device) into *out (device) with cub::DeviceReduce::Reduce.
template <class V, class Op>
void reduce(cudaStream_t stream, V const* in, std::int64_t n, V* out, Op op, V init) {
  std::size_t bytes = 0;
  WEFT_CUDA_TRY(cub::DeviceReduce::Reduce(nullptr, bytes, in, out, n, op, init, stream));
  adv_detail::scratch temp(stream, bytes);
  WEFT_CUDA_TRY(cub::DeviceReduce::Reduce(temp.p, bytes, in, out, n, op, init, stream));
}

}  // namespace returns_detail

//! *stats (device memory) = rl::whiten_statistics of n values: {count, Σv, Σv²} over the valid
//! tokens, in double (a tree instead of the CPU's serial sum). Such statistics add across
//! micro-batches and ranks: all-reduce them, then pass them to masked_whiten. Asynchronous.
template <class T, class M>
void whiten_statistics(cudaStream_t stream, T const* values, M const* mask, std::int64_t n,
                       whiten_stats* stats) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  adv_detail::scratch terms(stream, static_cast<std::size_t>(n) * sizeof(whiten_stats));
  auto* const t = static_cast<whiten_stats*>(terms.p);
  if (n > 0) {
    returns_detail::stats_terms_kernel<T, M>
        <<<returns_detail::grid_for(n), returns_detail::block, 0, stream>>>(values, mask, n, t);
    WEFT_CUDA_TRY(cudaGetLastError());
  }
  returns_detail::reduce(stream, static_cast<whiten_stats const*>(t), n, stats,
                         returns_detail::stats_plus{}, whiten_stats{});
}

//! rl::masked_whiten with the statistics given (device memory, e.g. all-reduced whiten_stats):
//! (v − mean) / sqrt(var + eps) on valid tokens (plus the mean without shift_mean), exactly 0 on
//! masked ones. out may be values (in place). Asynchronous.
template <class T, class M>
void masked_whiten(cudaStream_t stream, T const* values, M const* mask, std::int64_t n, T* out,
                   whiten_stats const* stats, bool shift_mean = true, double eps = 1e-8) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  WEFT_EXPECTS(eps >= 0, "eps", ">= 0", eps);
  if (n == 0) return;
  returns_detail::whiten_kernel<T, M>
      <<<returns_detail::grid_for(n), returns_detail::block, 0, stream>>>(values, mask, n, stats,
                                                                          shift_mean, eps, out);
  WEFT_CUDA_TRY(cudaGetLastError());
}

//! rl::masked_whiten with the batch's own statistics, two-pass as the CPU (the mean, then the
//! centred sum of squares), all on the stream. out may be values. Asynchronous.
template <class T, class M>
void masked_whiten(cudaStream_t stream, T const* values, M const* mask, std::int64_t n, T* out,
                   bool shift_mean = true, double eps = 1e-8) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  WEFT_EXPECTS(eps >= 0, "eps", ">= 0", eps);
  if (n == 0) return;
  std::size_t const o_d2 = adv_detail::align_up(2 * sizeof(whiten_stats));
  adv_detail::scratch s(stream, o_d2 + static_cast<std::size_t>(n) * sizeof(double));
  auto* const base = static_cast<unsigned char*>(s.p);
  auto* const stats = reinterpret_cast<whiten_stats*>(base);
  auto* const centred = reinterpret_cast<double*>(base + sizeof(whiten_stats));
  auto* const d2 = reinterpret_cast<double*>(base + o_d2);
  whiten_statistics(stream, values, mask, n, stats);
  returns_detail::centred_squares_kernel<T, M>
      <<<returns_detail::grid_for(n), returns_detail::block, 0, stream>>>(values, mask, n, stats,
                                                                          d2);
  WEFT_CUDA_TRY(cudaGetLastError());
  returns_detail::reduce(stream, static_cast<double const*>(d2), n, centred,
                         ::cuda::std::plus<double>{}, 0.0);
  returns_detail::finish_stats_kernel<><<<1, 1, 0, stream>>>(stats, centred);
  WEFT_CUDA_TRY(cudaGetLastError());
  masked_whiten(stream, values, mask, n, out, static_cast<whiten_stats const*>(stats), shift_mean,
                eps);
}

//! rl::discounted_returns: G_t = r_t + γ·G_{t+1} per row, the running return reset after each
//! masked token. Asynchronous.
template <class T, class M>
void discounted_returns(cudaStream_t stream, device_rows const& rows, T const* token_rewards,
                        M const* mask, double gamma, T* out) {
  returns_detail::launch_row_scans(
      stream, rows, returns_detail::discounted_scan_kernel<T, M>,
      rl::detail::discounted_scan<T, M>{token_rewards, mask, gamma, out});
}

//! rl::reinforce_pp_advantages: the discounted returns, whitened over the batch's valid tokens.
template <class T, class M>
void reinforce_pp_advantages(cudaStream_t stream, device_rows const& rows, T const* token_rewards,
                             M const* mask, double gamma, T* out) {
  discounted_returns(stream, rows, token_rewards, mask, gamma, out);
  masked_whiten(stream, static_cast<T const*>(out), mask, rows.tokens, out);
}

//! rl::remax_advantages: returns_t = Σ_{s >= t} r_s·m_s and A_t = (returns_t − b_i)·m_t with
//! baselines b (one per row, device memory). Asynchronous.
template <class T, class M>
void remax_advantages(cudaStream_t stream, device_rows const& rows, T const* token_rewards,
                      T const* baselines, M const* mask, T* advantages, T* returns) {
  returns_detail::launch_row_scans(
      stream, rows, returns_detail::remax_scan_kernel<T, M>,
      rl::detail::remax_scan<T, M>{token_rewards, mask, advantages, returns}, baselines);
}

//! rl::gae_advantages: δ_t = r_t + γ·V_next − V_t, A_t = δ_t + γλ·A_next, returns = A + V, "next"
//! skipping masked tokens; then A whitened over the valid tokens (options.whiten). Masked
//! positions of both outputs are 0. Asynchronous.
template <class T, class M>
void gae_advantages(cudaStream_t stream, device_rows const& rows, T const* token_rewards,
                    T const* values, M const* mask, T* advantages, T* returns,
                    gae_options const& opt = {}) {
  returns_detail::launch_row_scans(
      stream, rows, returns_detail::gae_scan_kernel<T, M>,
      rl::detail::gae_scan<T, M>{token_rewards, values, mask, opt.gamma, opt.lambda, advantages,
                                 returns});
  if (rows.rows > 0 && opt.whiten)
    masked_whiten(stream, static_cast<T const*>(advantages), mask, rows.tokens, advantages);
}

}  // namespace weft::rl::kernels
