// weft/attention/cuda/detail/mma.cuh — the warp-level tensor-core pieces of the flash attention
// kernels as inline PTX that runs on sm_80 and sm_90: cp.async 16-byte copies into shared memory
// (zero-filling rows past the end), ldmatrix (plain and transposed) and the m16n8k16 mma.sync with
// f32 accumulation on bf16 or f16 operands, plus the packing of f32 pairs into 16-bit operands.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A 16x16: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8 : b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C 16x8 : c0, c1 (g, 2t, 2t+1), c2, c3 (g+8, 2t, 2t+1)
// so the C fragments of two adjacent n8 tiles are, packed to 16 bits, the A fragment of one k16
// step: the probabilities of S = Q Kᵀ feed P V without leaving registers.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/attention/cuda/detail/mma.cuh holds CUDA device code: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/dtype.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace weft::attention::kernels::mma {

//! Whether weft's 16-bit storage type T runs the bf16 (true) or the f16 (false) tensor-core path.
template <class T>
inline constexpr bool is_bf16 = std::is_same_v<std::remove_cv_t<T>, ::weft::bf16>;

template <class T>
inline constexpr bool is_16bit = std::is_same_v<std::remove_cv_t<T>, ::weft::bf16> ||
                                 std::is_same_v<std::remove_cv_t<T>, ::weft::f16>;

__device__ __forceinline__ std::uint32_t smem_addr(void const* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

//! 16 bytes global -> shared, asynchronously; with valid = false nothing is read and the 16
//! bytes are zero-filled (src-size 0).
__device__ __forceinline__ void cp_async16(std::uint32_t dst, void const* src, bool valid) {
  int const n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

//! c += a · b on one m16n8k16 tile, f32 accumulation.
template <bool BF16>
__device__ __forceinline__ void mma16816(float (&c)[4], std::uint32_t const (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

//! 2^x on the special-function unit (ex2.approx.ftz.f32: within 2 ulp, -inf gives +0).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

//! Two floats rounded (nearest even) to a 16-bit pair; `lo` in the low half (the lower column).
template <bool BF16>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  std::uint32_t u;
  if constexpr (BF16) {
    __nv_bfloat162 const v = __floats2bfloat162_rn(lo, hi);
    std::memcpy(&u, &v, 4);
  } else {
    __half2 const v = __floats2half2_rn(lo, hi);
    std::memcpy(&u, &v, 4);
  }
  return u;
}

//! Copies rows [0, Rows) x [0, D) of a tile into shared memory by 16-byte cp.async chunks, chunk
//! (r, col) to the shared byte address dst(r, col); rows at or past `valid` are zero-filled.
//! `base` points at row 0 (any valid address when valid = 0), `ld` is the row stride in elements.
//! NT threads cooperate, each calling with its index tid in [0, NT).
template <int Rows, int D, int NT, class T, class Dst>
__device__ __forceinline__ void load_rows_async(Dst const& dst, T const* base, std::int64_t ld,
                                                std::int64_t valid, T const* fallback, int tid) {
  constexpr int chunks_per_row = D / 8;
  if constexpr (NT % chunks_per_row == 0 && (Rows * chunks_per_row) % NT == 0) {
    // Each thread keeps its column and steps down the rows NT / chunks_per_row at a time: a fixed
    // number of chunks with the division, the swizzle phase and most of the addressing hoisted.
    constexpr int row_step = NT / chunks_per_row;
    int const r0 = tid / chunks_per_row;
    int const col = (tid % chunks_per_row) * 8;
    int const rows = valid < Rows ? (valid > 0 ? static_cast<int>(valid) : 0) : Rows;
    std::int64_t const off0 = r0 * ld + col, step = row_step * ld;
#pragma unroll
    for (int i = 0; i < Rows / row_step; ++i) {
      int const r = r0 + i * row_step;
      bool const ok = r < rows;
      cp_async16(dst(r, col), ok ? base + (off0 + i * step) : fallback, ok);
    }
  } else {
    for (int c = tid; c < Rows * chunks_per_row; c += NT) {
      int const r = c / chunks_per_row, col = (c % chunks_per_row) * 8;
      bool const ok = r < valid;
      T const* src = ok ? base + r * ld + col : fallback;
      cp_async16(dst(r, col), src, ok);
    }
  }
}
//! The same with the block's threads 0..NT-1 (blockDim.x == NT) as the loaders.
template <int Rows, int D, int NT, class T, class Dst>
__device__ __forceinline__ void load_rows_async(Dst const& dst, T const* base, std::int64_t ld,
                                                std::int64_t valid, T const* fallback) {
  load_rows_async<Rows, D, NT>(dst, base, ld, valid, fallback, static_cast<int>(threadIdx.x));
}

//! load_rows_async into a plain tile of row pitch Pitch elements.
template <int Rows, int D, int Pitch, int NT, class T>
__device__ __forceinline__ void load_tile_async(T* smem, T const* base, std::int64_t ld,
                                                std::int64_t valid, T const* fallback) {
  load_rows_async<Rows, D, NT>([smem](int r, int col) { return smem_addr(smem + r * Pitch + col); },
                               base, ld, valid, fallback);
}

}  // namespace weft::attention::kernels::mma
