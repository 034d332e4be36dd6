// weft/rl/cuda/advantages.cuh — GRPO (and Dr. GRPO) and RLOO group advantages on the GPU for
// groups given as contiguous segments (CSR offsets; empty groups allowed) or a fixed group size:
// per-group sums with cub::DeviceSegmentedReduce (two-pass: Σr, then Σ(r − mean)² and the count
// of scores unequal to the group's first), then the CPU path's WEFT_HD functors per response
// (group_moments_fn, grpo_element_fn, rloo_element_fn). Statistics in double, as the CPU.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/rl/cuda/advantages.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/rl/advantages.hpp>

#include <cub/device/device_segmented_reduce.cuh>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/rl/cuda/advantages.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

namespace weft::rl::kernels {

//! offsets[g] = g·size for g in [0, groups].
template <class I>
__global__ void fixed_group_offsets_kernel(I* offsets, I groups, I size) {
  I const g = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g <= groups) offsets[g] = g * size;
}

//! One block per group: group_of[i] = g and val[i] = scores[i] in double.
template <class T>
__global__ void group_scatter_kernel(T const* __restrict__ scores,
                                     std::int64_t const* __restrict__ offsets,
                                     std::int64_t* __restrict__ group_of,
                                     double* __restrict__ val) {
  std::int64_t const g = blockIdx.x;
  for (std::int64_t i = offsets[g] + threadIdx.x; i < offsets[g + 1]; i += blockDim.x) {
    group_of[i] = g;
    val[i] = static_cast<double>(scores[i]);
  }
}

//! Second pass: dev[i] = (r − mean_g)², neq[i] = 1 where r differs from the group's first score
//! (NaN included, so a group holding a NaN is never constant, as on the CPU).
template <class T>
__global__ void group_deviation_kernel(T const* __restrict__ scores,
                                       std::int64_t const* __restrict__ offsets,
                                       std::int64_t const* __restrict__ group_of,
                                       double const* __restrict__ sums, std::int64_t n,
                                       double* __restrict__ dev, double* __restrict__ neq) {
  std::int64_t const i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  std::int64_t const g = group_of[i];
  std::int64_t const count = offsets[g + 1] - offsets[g];
  double const r = static_cast<double>(scores[i]);
  double const d = r - group_moments_fn{}.mean(sums[g], static_cast<index_t>(count));
  dev[i] = d * d;
  neq[i] = r == static_cast<double>(scores[offsets[g]]) ? 0.0 : 1.0;
}

//! Per response: out[i] = fn(r, group statistics), through grpo_element_fn or rloo_element_fn.
template <class T, class F>
__global__ void group_advantage_kernel(T const* __restrict__ scores,
                                       std::int64_t const* __restrict__ offsets,
                                       std::int64_t const* __restrict__ group_of,
                                       double const* __restrict__ sums,
                                       double const* __restrict__ sq_dev,
                                       double const* __restrict__ unequal, std::int64_t n, F fn,
                                       T* __restrict__ out) {
  std::int64_t const i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  std::int64_t const g = group_of[i];
  auto const count = static_cast<index_t>(offsets[g + 1] - offsets[g]);
  group_moments_fn const mom{};
  double const r = static_cast<double>(scores[i]);
  double const mean = mom.mean(sums[g], count);
  bool const constant = unequal[g] == 0.0;
  if constexpr (requires { fn(r, mean, 0.0, count, constant); })
    out[i] = static_cast<T>(fn(r, mean, mom.stddev(sq_dev[g], count), count, constant));
  else
    out[i] = static_cast<T>(fn(r, mean, count, constant));
}

namespace adv_detail {

inline unsigned blocks_for(std::int64_t n, int block) {
  return static_cast<unsigned>((n + block - 1) / block);
}

// Stream-ordered scratch, freed on scope exit (after the launches queued before it).
struct scratch {
  cudaStream_t stream;
  void* p = nullptr;
  scratch(cudaStream_t s, std::size_t bytes) : stream(s) {
    if (bytes > 0) WEFT_CUDA_TRY(cudaMallocAsync(&p, bytes, s));
  }
  scratch(scratch const&) = delete;
  scratch& operator=(scratch const&) = delete;
  ~scratch() {
    if (p != nullptr) cudaFreeAsync(p, stream);
  }
};

inline std::size_t align_up(std::size_t b) { return (b + 255) / 256 * 256; }

template <class T, class F>
void group_advantages(cudaStream_t stream, T const* scores, std::int64_t n,
                      std::int64_t const* offsets, std::int64_t groups, F const& fn, T* out) {
  WEFT_EXPECTS(n >= 0, "n", ">= 0", n);
  WEFT_EXPECTS(groups >= 0, "groups", ">= 0", groups);
  WEFT_EXPECTS(groups <= std::int64_t{0x7fffffff}, "groups", "<= 2^31 - 1 (one block per group)",
               groups);
  if (n == 0) return;
  WEFT_EXPECTS(groups >= 1, "groups", ">= 1 when there are scores", groups);
  auto const un = static_cast<std::size_t>(n), ug = static_cast<std::size_t>(groups);
  std::size_t reduce_bytes = 0;
  WEFT_CUDA_TRY(cub::DeviceSegmentedReduce::Sum(
      nullptr, reduce_bytes, static_cast<double const*>(nullptr), static_cast<double*>(nullptr),
      groups, offsets, offsets + 1, stream));
  // Layout: group_of [n] i64, val/dev [n], neq [n], sums/sq/unequal [groups], CUB's temp.
  std::size_t const o_group = 0, o_val = align_up(un * sizeof(std::int64_t));
  std::size_t const o_neq = o_val + align_up(un * sizeof(double));
  std::size_t const o_sums = o_neq + align_up(un * sizeof(double));
  std::size_t const o_sq = o_sums + align_up(ug * sizeof(double));
  std::size_t const o_uneq = o_sq + align_up(ug * sizeof(double));
  std::size_t const o_temp = o_uneq + align_up(ug * sizeof(double));
  scratch s(stream, o_temp + reduce_bytes);
  auto* const base = static_cast<unsigned char*>(s.p);
  auto* const group_of = reinterpret_cast<std::int64_t*>(base + o_group);
  auto* const val = reinterpret_cast<double*>(base + o_val);
  auto* const neq = reinterpret_cast<double*>(base + o_neq);
  auto* const sums = reinterpret_cast<double*>(base + o_sums);
  auto* const sq = reinterpret_cast<double*>(base + o_sq);
  auto* const uneq = reinterpret_cast<double*>(base + o_uneq);
  void* const temp = base + o_temp;
  constexpr int block = 256;
  group_scatter_kernel<T>
      <<<static_cast<unsigned>(groups), block, 0, stream>>>(scores, offsets, group_of, val);
  WEFT_CUDA_TRY(cudaGetLastError());
  std::size_t bytes = reduce_bytes;
  WEFT_CUDA_TRY(cub::DeviceSegmentedReduce::Sum(temp, bytes, static_cast<double const*>(val), sums,
                                                groups, offsets, offsets + 1, stream));
  group_deviation_kernel<T>
      <<<blocks_for(n, block), block, 0, stream>>>(scores, offsets, group_of, sums, n, val, neq);
  WEFT_CUDA_TRY(cudaGetLastError());
  bytes = reduce_bytes;
  WEFT_CUDA_TRY(cub::DeviceSegmentedReduce::Sum(temp, bytes, static_cast<double const*>(val), sq,
                                                groups, offsets, offsets + 1, stream));
  bytes = reduce_bytes;
  WEFT_CUDA_TRY(cub::DeviceSegmentedReduce::Sum(temp, bytes, static_cast<double const*>(neq), uneq,
                                                groups, offsets, offsets + 1, stream));
  group_advantage_kernel<T, F><<<blocks_for(n, block), block, 0, stream>>>(
      scores, offsets, group_of, sums, sq, uneq, n, fn, out);
  WEFT_CUDA_TRY(cudaGetLastError());
}

// Runs f(offsets) with device offsets for `groups` groups of `size`.
template <class F>
void with_fixed_offsets(cudaStream_t stream, std::int64_t n, std::int64_t size, F&& f) {
  WEFT_EXPECTS(size >= 1, "group_size", ">= 1", size);
  WEFT_EXPECTS(n >= 0 && n % size == 0, "n",
               ::weft::detail::concat("a multiple of group size ", size, " items"), n);
  std::int64_t const groups = n / size;
  scratch off(stream, static_cast<std::size_t>(groups + 1) * sizeof(std::int64_t));
  auto* const offsets = static_cast<std::int64_t*>(off.p);
  fixed_group_offsets_kernel<std::int64_t>
      <<<blocks_for(groups + 1, 256), 256, 0, stream>>>(offsets, groups, size);
  WEFT_CUDA_TRY(cudaGetLastError());
  f(static_cast<std::int64_t const*>(offsets), groups);
}

}  // namespace adv_detail

//! GRPO (norm_by_std) or Dr. GRPO advantages of n scores in `groups` contiguous groups: group g is
//! [offsets[g], offsets[g + 1]) (device int64 offsets, groups + 1 of them, offsets[0] = 0,
//! nondecreasing, offsets[groups] = n; empty groups allowed). Same results as rl::grpo_advantages
//! over the same groups (statistics in double, summed in a tree instead of serially).
//! Asynchronous on `stream` (stream-ordered scratch).
template <class T>
void grpo_advantages(cudaStream_t stream, T const* scores, std::int64_t n,
                     std::int64_t const* offsets, std::int64_t groups, T* out,
                     grpo_options const& opt = {}) {
  WEFT_EXPECTS(opt.eps >= 0, "eps", ">= 0", opt.eps);
  adv_detail::group_advantages(stream, scores, n, offsets, groups,
                               grpo_element_fn{opt.norm_by_std, opt.eps, opt.singleton}, out);
}

//! grpo_advantages over consecutive groups of group_size (group_layout::fixed).
template <class T>
void grpo_advantages(cudaStream_t stream, T const* scores, std::int64_t n, std::int64_t group_size,
                     T* out, grpo_options const& opt = {}) {
  WEFT_EXPECTS(opt.eps >= 0, "eps", ">= 0", opt.eps);
  adv_detail::with_fixed_offsets(stream, n, group_size, [&](std::int64_t const* o, std::int64_t g) {
    grpo_advantages(stream, scores, n, o, g, out, opt);
  });
}

//! RLOO advantages n/(n−1)·(R − mean) over segment groups (as grpo_advantages).
template <class T>
void rloo_advantages(cudaStream_t stream, T const* scores, std::int64_t n,
                     std::int64_t const* offsets, std::int64_t groups, T* out,
                     singleton_group singleton = singleton_group::zero) {
  adv_detail::group_advantages(stream, scores, n, offsets, groups, rloo_element_fn{singleton}, out);
}

//! rloo_advantages over consecutive groups of group_size.
template <class T>
void rloo_advantages(cudaStream_t stream, T const* scores, std::int64_t n, std::int64_t group_size,
                     T* out, singleton_group singleton = singleton_group::zero) {
  adv_detail::with_fixed_offsets(stream, n, group_size, [&](std::int64_t const* o, std::int64_t g) {
    rloo_advantages(stream, scores, n, o, g, out, singleton);
  });
}

}  // namespace weft::rl::kernels
