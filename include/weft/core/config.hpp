// weft/core/config.hpp — compiler and feature configuration shared by every weft header:
// the host/device annotation macros, the WEFT_HAS_* feature switches and the version.
// Nothing here allocates, throws or includes anything beyond the standard library.
#pragma once

#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 1
#define WEFT_VERSION_PATCH 0
#define WEFT_VERSION (WEFT_VERSION_MAJOR * 10000 + WEFT_VERSION_MINOR * 100 + WEFT_VERSION_PATCH)
#define WEFT_VERSION_STRING "0.1.0"

// With CCCL 3 a literal `__host__ __device__` no longer compiles under g++, so weft spells the
// annotations through its own macros, which vanish in host-compiler translation units.
#if defined(__CUDACC__)
#define WEFT_HOST __host__
#define WEFT_DEVICE __device__
#define WEFT_HD __host__ __device__
#define WEFT_CUDA_COMPILER 1
#else
#define WEFT_HOST
#define WEFT_DEVICE
#define WEFT_HD
#define WEFT_CUDA_COMPILER 0
#endif

// Feature switches. The CMake component targets define them to 1 (weft::cuda, weft::mpi,
// weft::nccl); a consumer that uses plain `-I include` gets the host-only library.
#ifndef WEFT_HAS_CUDA_RUNTIME
#define WEFT_HAS_CUDA_RUNTIME 0
#endif
#ifndef WEFT_HAS_MPI
#define WEFT_HAS_MPI 0
#endif
#ifndef WEFT_HAS_NCCL
#define WEFT_HAS_NCCL 0
#endif
// BLAS (cblas.h) for the attention tiles; weft::weft defines it to 1 when CMake finds OpenBLAS.
// Without it the tiles use weft's own register-blocked loops.
#ifndef WEFT_HAS_BLAS
#define WEFT_HAS_BLAS 0
#endif
#if WEFT_HAS_NCCL && !WEFT_HAS_CUDA_RUNTIME
#error \
    "weft: WEFT_HAS_NCCL=1 requires WEFT_HAS_CUDA_RUNTIME=1 (link weft::nccl, which brings weft::cuda)"
#endif

// weft's numerics rely on -inf sentinels (empty softmax rows, masked logits) and NaN checks;
// -ffast-math / -ffinite-math-only lets the compiler delete exactly those guards.
#if defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#error \
    "weft: compiled with -ffast-math or -ffinite-math-only; weft's -inf and NaN guards need IEEE semantics (drop the flag)"
#endif

// Before a loop whose iterations are independent (none reads what another writes): lets the
// vectoriser drop the run-time alias checks it would otherwise give up on.
#if defined(__clang__)
#define WEFT_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__) && !defined(__CUDACC__)
#define WEFT_IVDEP _Pragma("GCC ivdep")
#else
#define WEFT_IVDEP
#endif

// Before a loop of a compile-time trip count in WEFT_HD code: unrolled fully by nvcc (whose device
// code needs the array indices constant to keep the arrays in registers); nothing elsewhere.
#if defined(__CUDACC__)
#define WEFT_UNROLL _Pragma("unroll")
#else
#define WEFT_UNROLL
#endif

#if defined(__GNUC__) || defined(__clang__)
#define WEFT_FORCEINLINE inline __attribute__((always_inline))
#define WEFT_LAMBDA_INLINE __attribute__((always_inline))  // after a lambda's parameter list
#else
#define WEFT_FORCEINLINE inline
#define WEFT_LAMBDA_INLINE
#endif

#if defined(NDEBUG)
#define WEFT_DEBUG 0
#else
#define WEFT_DEBUG 1
#endif
