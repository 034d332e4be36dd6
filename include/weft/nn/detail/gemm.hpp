// weft/nn/detail/gemm.hpp — the one matrix product nn's layers use: C += op(A)·op(B) in the compute
// type (f32 or f64), through blas::gemm when WEFT_HAS_BLAS and a plain fixed-order loop otherwise,
// with operands packed from any rank-2 host view (strided, bf16/f16) when BLAS cannot read them.
#pragma once

#include <weft/core/blas.hpp>
#include <weft/core/math.hpp>
#include <weft/nn/detail/args.hpp>

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace weft::nn::detail {

using blas::op;

//! The plain-loop product, used without BLAS and as the reference for the BLAS path in the tests:
//! c[i, j] += sum_p op(a)[i, p] · op(b)[p, j], summed in order p = 0, 1, ..., k-1 per element (a
//! fixed order, so results do not depend on anything but the inputs).
template <class C>
void gemm_loops(op oa, op ob, index_t m, index_t n, index_t k, C const* a, index_t lda, C const* b,
                index_t ldb, C* c, index_t ldc) {
  auto const av = [&](index_t i, index_t p) {
    return oa == op::none ? a[i * lda + p] : a[p * lda + i];
  };
  if (ob == op::transpose) {  // b rows are contiguous along p: a dot product per element
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) {
        C acc = c[i * ldc + j];
        for (index_t p = 0; p < k; ++p) acc += av(i, p) * b[j * ldb + p];
        c[i * ldc + j] = acc;
      }
  } else {  // b rows are contiguous along j: row updates the compiler vectorises over j
    for (index_t i = 0; i < m; ++i) {
      C* crow = c + i * ldc;
      for (index_t p = 0; p < k; ++p) {
        C const s = av(i, p);
        C const* brow = b + p * ldb;
        for (index_t j = 0; j < n; ++j) crow[j] += s * brow[j];
      }
    }
  }
}

//! c += op(a)·op(b) (m×n, inner k), BLAS when `use_blas` and weft links one.
template <class C>
void gemm_acc(op oa, op ob, index_t m, index_t n, index_t k, C const* a, index_t lda, C const* b,
              index_t ldb, C* c, index_t ldc, bool use_blas) {
  static_assert(std::is_same_v<C, float> || std::is_same_v<C, double>,
                "weft::nn::detail::gemm_acc: the compute type is float or double");
  if (m == 0 || n == 0 || k == 0) return;
#if WEFT_HAS_BLAS
  if (use_blas) {
    blas::gemm(oa, ob, m, n, k, C(1), a, lda, b, ldb, C(1), c, ldc);
    return;
  }
#else
  (void)use_blas;
#endif
  gemm_loops(oa, ob, m, n, k, a, lda, b, ldb, c, ldc);
}

//! A matrix operand as BLAS reads it: row-major with unit column stride and row stride ld.
template <class C>
struct operand {
  C const* p = nullptr;
  index_t ld = 1;
};

//! The view itself when its elements are C with unit column stride, else a packed C copy in
//! `scratch`.
template <class C, class V>
operand<C> as_operand(V const& v, std::vector<C>& scratch) {
  index_t const rows = ext(v, 0), cols = ext(v, 1);
  if constexpr (std::is_same_v<value_t<V>, C>) {
    auto const s0 = static_cast<index_t>(v.stride(0));
    bool const unit = cols <= 1 || static_cast<index_t>(v.stride(1)) == 1;
    if (unit && (rows <= 1 || s0 >= std::max<index_t>(cols, 1)))
      return {v.data_handle(), rows <= 1 ? std::max<index_t>(cols, 1) : s0};
  }
  scratch.resize(static_cast<std::size_t>(rows * cols));
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j)
      scratch[static_cast<std::size_t>(i * cols + j)] = static_cast<C>(at(v, i, j));
  return {scratch.data(), std::max<index_t>(cols, 1)};
}

//! out = init(i, j) + op(A)·op(B) for a rank-2 output view of any element type: in place when out
//! holds C with unit column stride, otherwise through a C buffer rounded into out once at the end.
//! `init` is read before anything is written (it may read out itself, to accumulate).
template <class C, class Out, class Init>
void gemm_into(op oa, op ob, index_t k, operand<C> a, operand<C> b, Out const& out, Init&& init,
               bool use_blas) {
  index_t const m = ext(out, 0), n = ext(out, 1);
  if constexpr (std::is_same_v<value_t<Out>, C>) {
    auto const s0 = static_cast<index_t>(out.stride(0));
    bool const unit = n <= 1 || static_cast<index_t>(out.stride(1)) == 1;
    if (unit && (m <= 1 || s0 >= std::max<index_t>(n, 1))) {
      for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) at(out, i, j) = init(i, j);
      gemm_acc(oa, ob, m, n, k, a.p, a.ld, b.p, b.ld, out.data_handle(),
               m <= 1 ? std::max<index_t>(n, 1) : s0, use_blas);
      return;
    }
  }
  std::vector<C> buf(static_cast<std::size_t>(m * n));
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) buf[static_cast<std::size_t>(i * n + j)] = init(i, j);
  gemm_acc(oa, ob, m, n, k, a.p, a.ld, b.p, b.ld, buf.data(), std::max<index_t>(n, 1), use_blas);
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j)
      at(out, i, j) = static_cast<value_t<Out>>(buf[static_cast<std::size_t>(i * n + j)]);
}

}  // namespace weft::nn::detail
