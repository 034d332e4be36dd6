// weft/core/cuda/random.cuh — fill_uniform / fill_normal for cuda_space views on exec::cuda: the
// WEFT_HD functors of weft/core/random.hpp run by for_each_index's kernel, one thread per Philox
// block, so device shards equal device whole fills bit for bit (and uniforms equal the host's).
#pragma once

#if !defined(__CUDACC__)
#  error "weft/core/cuda/random.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/exec.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/random.hpp>
#include <weft/core/tensor.hpp>

#if !WEFT_HAS_CUDA_RUNTIME
#  error "weft/core/cuda/random.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

#include <weft/core/cuda/for_each.cuh>

namespace weft {

// The kernel is for_each_index's (a template in for_each.cuh) over detail::fill_chunks_fn: each
// thread handles the elements of one row that fall into one Philox block, so a thread makes one
// Philox call and neighbouring threads write neighbouring elements. Launches are asynchronous on
// ex.stream; argument errors throw before anything is enqueued.

//! Uniform values in [lo, hi) into a device view (see the host overload in random.hpp). Bits and
//! uniforms equal the host fill's bit for bit.
template <TensorIn<cuda_space> V>
  requires detail::RandomFillView<V>
void fill_uniform(exec::cuda const& ex, V const& view, rng gen, double lo, double hi,
                  placement const& where = {}) {
  using real = detail::random_compute_t<typename V::value_type>;
  auto const lo_r = static_cast<real>(lo);
  auto const hi_r = static_cast<real>(hi);
  detail::check_uniform_args(lo_r, hi_r);
  detail::run_fill(ex, random_uniform<real>(gen, lo_r, hi_r), view, where);
}

//! Normal values mean + stddev * z into a device view. Any sharding equals the whole device fill
//! bit for bit; against the host fill, values may differ in the last ulps (CUDA's log, sin and
//! cos are not glibc's).
template <TensorIn<cuda_space> V>
  requires detail::RandomFillView<V>
void fill_normal(exec::cuda const& ex, V const& view, rng gen, double mean, double stddev,
                 placement const& where = {}) {
  using real = detail::random_compute_t<typename V::value_type>;
  auto const mean_r = static_cast<real>(mean);
  auto const stddev_r = static_cast<real>(stddev);
  detail::check_normal_args(mean_r, stddev_r);
  detail::run_fill(ex, random_normal<real>(gen, mean_r, stddev_r), view, where);
}

}  // namespace weft
