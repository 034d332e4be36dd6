// weft/core/cuda/random.cuh — device fills, kept as a forwarding header: fill_uniform and
// fill_normal in weft/core/random.hpp take any Executor, so on exec::cuda with cuda_space views
// they run as for_each_index's grid-stride kernel (weft/core/cuda/for_each.cuh, which exec.hpp
// includes in nvcc translation units): one thread per Philox block of a row, so device shards equal
// the device whole fill bit for bit, and uniforms equal the host's.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/core/cuda/random.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/core/cuda/random.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

#include <weft/core/cuda/for_each.cuh>
#include <weft/core/exec.hpp>
#include <weft/core/random.hpp>
