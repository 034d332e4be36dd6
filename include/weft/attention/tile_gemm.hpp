// weft/attention/tile_gemm.hpp — the three small row-major GEMM shapes the CPU flash-attention
// tiles need (C = A·Bᵀ, C += A·B, C += Aᵀ·B), through BLAS when WEFT_HAS_BLAS is 1 and otherwise
// through register-blocked loops that vectorise without fast-math (no reductions in inner loops).
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/math.hpp>

#include <cstdint>
#include <type_traits>

#include <weft/core/blas.hpp>  // BLAS calls, single-threaded: weft parallelises above its tiles

namespace weft::attention::detail {

// C[M×N] (+)= A[M×K] · B[K×N]. Four rows of C share each loaded row of B, and the inner loop runs
// along contiguous rows of B and C, so it vectorises without reassociating any sum.
template <class T>
void gemm_nn_loops(index_t m, index_t n, index_t k, T const* a, index_t lda, T const* b,
                   index_t ldb, T* c, index_t ldc, bool accumulate) {
  if (!accumulate)
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) c[i * ldc + j] = T(0);
  index_t i = 0;
  for (; i + 4 <= m; i += 4) {
    T* __restrict c0 = c + i * ldc;
    T* __restrict c1 = c0 + ldc;
    T* __restrict c2 = c1 + ldc;
    T* __restrict c3 = c2 + ldc;
    for (index_t p = 0; p < k; ++p) {
      T const a0 = a[i * lda + p], a1 = a[(i + 1) * lda + p], a2 = a[(i + 2) * lda + p],
              a3 = a[(i + 3) * lda + p];
      T const* __restrict bp = b + p * ldb;
      for (index_t j = 0; j < n; ++j) {
        T const bv = bp[j];
        c0[j] += a0 * bv;
        c1[j] += a1 * bv;
        c2[j] += a2 * bv;
        c3[j] += a3 * bv;
      }
    }
  }
  for (; i < m; ++i) {
    T* __restrict ci = c + i * ldc;
    for (index_t p = 0; p < k; ++p) {
      T const ai = a[i * lda + p];
      T const* __restrict bp = b + p * ldb;
      for (index_t j = 0; j < n; ++j) ci[j] += ai * bp[j];
    }
  }
}

// C[M×N] += Aᵀ · B with A stored [K×M] and B [K×N].
template <class T>
void gemm_tn_loops(index_t m, index_t n, index_t k, T const* a, index_t lda, T const* b,
                   index_t ldb, T* c, index_t ldc) {
  index_t i = 0;
  for (; i + 4 <= m; i += 4) {
    T* __restrict c0 = c + i * ldc;
    T* __restrict c1 = c0 + ldc;
    T* __restrict c2 = c1 + ldc;
    T* __restrict c3 = c2 + ldc;
    for (index_t p = 0; p < k; ++p) {
      T const* ap = a + p * lda + i;
      T const a0 = ap[0], a1 = ap[1], a2 = ap[2], a3 = ap[3];
      if (a0 == T(0) && a1 == T(0) && a2 == T(0) && a3 == T(0)) continue;  // masked rows of P
      T const* __restrict bp = b + p * ldb;
      for (index_t j = 0; j < n; ++j) {
        T const bv = bp[j];
        c0[j] += a0 * bv;
        c1[j] += a1 * bv;
        c2[j] += a2 * bv;
        c3[j] += a3 * bv;
      }
    }
  }
  for (; i < m; ++i) {
    T* __restrict ci = c + i * ldc;
    for (index_t p = 0; p < k; ++p) {
      T const ai = a[p * lda + i];
      T const* __restrict bp = b + p * ldb;
      for (index_t j = 0; j < n; ++j) ci[j] += ai * bp[j];
    }
  }
}

//! C[M×N] = alpha · A[M×K] · B[N×K]ᵀ (overwrites C). `scratch` holds K×N elements.
template <class T>
void gemm_nt(index_t m, index_t n, index_t k, T alpha, T const* a, index_t lda, T const* b,
             index_t ldb, T* c, index_t ldc, T* scratch) {
#if WEFT_HAS_BLAS
  (void)scratch;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    weft::blas::gemm<T>(weft::blas::op::none, weft::blas::op::transpose, m, n, k, alpha, a, lda, b,
                        ldb, T(0), c, ldc);
    return;
  }
#endif
  for (index_t j = 0; j < n; ++j)
    for (index_t p = 0; p < k; ++p) scratch[p * n + j] = b[j * ldb + p];
  gemm_nn_loops(m, n, k, a, lda, scratch, n, c, ldc, false);
  if (alpha != T(1))
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) c[i * ldc + j] *= alpha;
}

//! C[M×N] += alpha · A[M×K] · B[K×N].
template <class T>
void gemm_nn_acc(index_t m, index_t n, index_t k, T alpha, T const* a, index_t lda, T const* b,
                 index_t ldb, T* c, index_t ldc, T* scratch) {
#if WEFT_HAS_BLAS
  (void)scratch;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    weft::blas::gemm<T>(weft::blas::op::none, weft::blas::op::none, m, n, k, alpha, a, lda, b, ldb,
                        T(1), c, ldc);
    return;
  }
#endif
  if (alpha == T(1)) {
    gemm_nn_loops(m, n, k, a, lda, b, ldb, c, ldc, true);
    return;
  }
  // Scale the small operand A (M×K) rather than C so rounding matches alpha·(A·B) closely.
  for (index_t i = 0; i < m; ++i)
    for (index_t p = 0; p < k; ++p) scratch[i * k + p] = alpha * a[i * lda + p];
  gemm_nn_loops(m, n, k, scratch, k, b, ldb, c, ldc, true);
}

//! C[M×N] += alpha · A[K×M]ᵀ · B[K×N].
template <class T>
void gemm_tn_acc(index_t m, index_t n, index_t k, T alpha, T const* a, index_t lda, T const* b,
                 index_t ldb, T* c, index_t ldc, T* scratch) {
#if WEFT_HAS_BLAS
  (void)scratch;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    weft::blas::gemm<T>(weft::blas::op::transpose, weft::blas::op::none, m, n, k, alpha, a, lda, b,
                        ldb, T(1), c, ldc);
    return;
  }
#endif
  if (alpha == T(1)) {
    gemm_tn_loops(m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  for (index_t p = 0; p < k; ++p)
    for (index_t i = 0; i < m; ++i) scratch[p * m + i] = alpha * a[p * lda + i];
  gemm_tn_loops(m, n, k, scratch, m, b, ldb, c, ldc);
}

}  // namespace weft::attention::detail
