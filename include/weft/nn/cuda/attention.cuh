// weft/nn/cuda/attention.cuh — causal GQA self-attention over packed documents (cu_seqlens) in f32
// or f64 on the GPU, nn/attention.hpp's semantics for the small head dimensions a reference model
// has (attention/cuda/flash.cuh is bf16/f16 at d = 64 or 128): WEFT_HD per-row functors, one
// thread per (head, row) in a grid-stride loop, built on the CPU path's row math
// (softmax_row_state, recompute_probability). No atomics: the same bits every run.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/nn/cuda/attention.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/common.hpp>         // resolve_scale
#include <weft/attention/softmax_state.hpp>  // softmax_row_state, recompute_probability
#include <weft/core/config.hpp>
#include <weft/core/cuda/for_each.cuh>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>     // compute_t
#include <weft/nn/attention.hpp>  // attention_heads, detail::check_heads

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#if !WEFT_HAS_CUDA_RUNTIME
#error "weft/nn/cuda/attention.cuh needs WEFT_HAS_CUDA_RUNTIME=1 (link weft::cuda)"
#endif

namespace weft::nn::kernels {

namespace attention_detail {

//! Rows [begin, end) of the document holding packed row i.
struct document_rows {
  std::int64_t begin, end;
};

//! The document of row i in cu_seqlens (documents + 1 entries from 0 to the row count, not
//! decreasing): the last n with cu[n] <= i, found by bisection, so empty documents are skipped.
WEFT_HD inline document_rows document_of(std::int64_t const* cu, std::int64_t documents,
                                         std::int64_t i) noexcept {
  std::int64_t lo = 0, hi = documents - 1;
  while (lo < hi) {
    std::int64_t const mid = (lo + hi + 1) / 2;
    if (cu[mid] <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  return {cu[lo], cu[lo + 1]};
}

//! Σ_c a[c]·b[c] in the compute type, c in order.
template <class C, class A, class B>
WEFT_HD C dot(A const* a, B const* b, std::int64_t n) noexcept {
  C s = C(0);
  for (std::int64_t c = 0; c < n; ++c) s += static_cast<C>(a[c]) * static_cast<C>(b[c]);
  return s;
}

//! The index space and head layout every functor below shares: rows of q, o [T, Hq·D] and of
//! k, v [T, Hkv·D]; query head h reads KV head h / (Hq / Hkv).
template <class C>
struct packed_heads {
  std::int64_t tokens, hq, hkv, d;
  C scale;
  WEFT_HD std::int64_t q_at(std::int64_t row, std::int64_t h) const noexcept {
    return (row * hq + h) * d;
  }
  WEFT_HD std::int64_t kv_at(std::int64_t row, std::int64_t hk) const noexcept {
    return (row * hkv + hk) * d;
  }
};

inline void check_launch(std::int64_t tokens, std::int64_t documents, attention_heads const& h) {
  nn::detail::check_heads(h);
  WEFT_EXPECTS(tokens >= 0, "tokens", ">= 0", tokens);
  WEFT_EXPECTS(documents >= 1, "documents", ">= 1 (cu_seqlens holds documents + 1 entries)",
               documents);
  // One thread per (head, row): the index space must fit int64 (the grid-stride loop covers it).
  WEFT_EXPECTS(tokens <= std::int64_t{0x7fffffffffffffff} / h.heads, "tokens",
               ::weft::detail::concat("at most 2^63 / heads (", h.heads, " heads)"), tokens);
}

}  // namespace attention_detail

//! Forward of one (query head, row) — thread e is head e / tokens, row e % tokens, so consecutive
//! threads read the same keys: scores against the document's keys up to the row, their max first
//! (one softmax_row_state rescale, as a CPU tile does), then the weights exp(s − m), their sum and
//! the weighted values accumulated in o's row, normalised by inv_sum; lse = m + log l.
template <class T>
struct causal_attention_forward_op {
  T const* q;
  T const* k;
  T const* v;
  T* o;
  compute_t<T>* lse;
  std::int64_t const* cu;
  std::int64_t documents;
  attention_detail::packed_heads<compute_t<T>> p;

  WEFT_HD void operator()(std::int64_t e) const noexcept {
    using C = compute_t<T>;
    std::int64_t const h = e / p.tokens, i = e % p.tokens, hk = h / (p.hq / p.hkv);
    auto const doc = attention_detail::document_of(cu, documents, i);
    T const* qi = q + p.q_at(i, h);
    T* oi = o + p.q_at(i, h);
    C top = ::weft::attention::empty_lse<C>();
    for (std::int64_t j = doc.begin; j <= i; ++j) {
      C const s = p.scale * attention_detail::dot<C>(qi, k + p.kv_at(j, hk), p.d);
      top = s > top ? s : top;
    }
    ::weft::attention::softmax_row_state<C> st;
    st.rescale(top);
    for (std::int64_t c = 0; c < p.d; ++c) oi[c] = T(0);
    for (std::int64_t j = doc.begin; j <= i; ++j) {
      C const w = st.weight(p.scale * attention_detail::dot<C>(qi, k + p.kv_at(j, hk), p.d));
      st.l += w;
      T const* vj = v + p.kv_at(j, hk);
      for (std::int64_t c = 0; c < p.d; ++c)
        oi[c] = static_cast<T>(static_cast<C>(oi[c]) + w * static_cast<C>(vj[c]));
    }
    C const inv = st.inv_sum();
    for (std::int64_t c = 0; c < p.d; ++c) oi[c] = static_cast<T>(static_cast<C>(oi[c]) * inv);
    lse[h * p.tokens + i] = st.lse();
  }
};

//! Backward, query side, one (query head, row) as the forward: D = rowsum(dO∘O) (kept for the
//! key side), then over the visible keys P = exp(S − L), dS = P·(dO·V − D),
//! dq = scale·Σ dS·K (overwrites dq).
template <class T>
struct causal_attention_backward_query_op {
  T const* q;
  T const* k;
  T const* v;
  T const* o;
  compute_t<T> const* lse;
  T const* dout;
  T* dq;
  compute_t<T>* dsum;
  std::int64_t const* cu;
  std::int64_t documents;
  attention_detail::packed_heads<compute_t<T>> p;

  WEFT_HD void operator()(std::int64_t e) const noexcept {
    using C = compute_t<T>;
    std::int64_t const h = e / p.tokens, i = e % p.tokens, hk = h / (p.hq / p.hkv);
    auto const doc = attention_detail::document_of(cu, documents, i);
    std::int64_t const at = p.q_at(i, h);
    C const di = attention_detail::dot<C>(dout + at, o + at, p.d);
    dsum[h * p.tokens + i] = di;
    C const l = lse[h * p.tokens + i];
    T* dqi = dq + at;
    for (std::int64_t c = 0; c < p.d; ++c) dqi[c] = T(0);
    for (std::int64_t j = doc.begin; j <= i; ++j) {
      T const* kj = k + p.kv_at(j, hk);
      C const pr = ::weft::attention::recompute_probability(
          p.scale * attention_detail::dot<C>(q + at, kj, p.d), l);
      C const ds = pr * (attention_detail::dot<C>(dout + at, v + p.kv_at(j, hk), p.d) - di);
      C const f = p.scale * ds;
      for (std::int64_t c = 0; c < p.d; ++c)
        dqi[c] = static_cast<T>(static_cast<C>(dqi[c]) + f * static_cast<C>(kj[c]));
    }
  }
};

//! Backward, key side, one (KV head, row j) — thread e is KV head e / tokens, row e % tokens: over
//! the group's query heads (in order) and the document's rows i >= j, dv += P·dO and
//! dk += scale·dS·Q (overwrites dk and dv). GQA sums each KV head's gradient over its query heads
//! in one thread, without atomics, so the result is the same every run.
template <class T>
struct causal_attention_backward_key_op {
  T const* q;
  T const* k;
  T const* v;
  compute_t<T> const* lse;
  T const* dout;
  compute_t<T> const* dsum;
  T* dk;
  T* dv;
  std::int64_t const* cu;
  std::int64_t documents;
  attention_detail::packed_heads<compute_t<T>> p;

  WEFT_HD void operator()(std::int64_t e) const noexcept {
    using C = compute_t<T>;
    std::int64_t const hk = e / p.tokens, j = e % p.tokens, group = p.hq / p.hkv;
    auto const doc = attention_detail::document_of(cu, documents, j);
    std::int64_t const at = p.kv_at(j, hk);
    T* dkj = dk + at;
    T* dvj = dv + at;
    for (std::int64_t c = 0; c < p.d; ++c) dkj[c] = dvj[c] = T(0);
    for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (std::int64_t i = j; i < doc.end; ++i) {
        T const* qi = q + p.q_at(i, h);
        T const* gi = dout + p.q_at(i, h);
        C const pr = ::weft::attention::recompute_probability(
            p.scale * attention_detail::dot<C>(qi, k + at, p.d), lse[h * p.tokens + i]);
        C const ds = pr * (attention_detail::dot<C>(gi, v + at, p.d) - dsum[h * p.tokens + i]);
        C const f = p.scale * ds;
        for (std::int64_t c = 0; c < p.d; ++c) {
          dvj[c] = static_cast<T>(static_cast<C>(dvj[c]) + pr * static_cast<C>(gi[c]));
          dkj[c] = static_cast<T>(static_cast<C>(dkj[c]) + f * static_cast<C>(qi[c]));
        }
      }
    }
  }
};

// ---- launches (asynchronous on `stream`; every pointer is device memory, rows contiguous) ------
// cu_seqlens holds documents + 1 device int64 entries: 0, not decreasing, ending at `tokens` (the
// caller checks them on the host: the device cannot report a bad one). Document n is rows
// [cu[n], cu[n+1]) and its row i attends to its rows j <= i, as nn::causal_attention_forward.

//! o [tokens, heads·head_dim] and lse [heads, tokens] (compute type) from q [tokens,
//! heads·head_dim] and k, v [tokens, kv_heads·head_dim]. T is float or double. Throws
//! invalid_argument_error for bad heads, a bad scale or sizes before any launch.
template <class T>
void causal_attention_forward(cudaStream_t stream, T const* q, T const* k, T const* v, T* o,
                              compute_t<T>* lse, std::int64_t const* cu_seqlens,
                              std::int64_t documents, std::int64_t tokens,
                              attention_heads const& heads) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::nn::kernels::causal_attention: T must be float or double (bf16/f16 at "
                "d = 64 or 128: attention/cuda/flash.cuh)");
  attention_detail::check_launch(tokens, documents, heads);
  auto const scale =
      static_cast<compute_t<T>>(::weft::attention::resolve_scale(heads.scale, heads.head_dim));
  if (tokens == 0) return;
  attention_detail::packed_heads<compute_t<T>> const p{tokens, heads.heads, heads.kv_heads,
                                                       heads.head_dim, scale};
  ::weft::detail::launch_for_each_index(
      stream, heads.heads * tokens,
      causal_attention_forward_op<T>{q, k, v, o, lse, cu_seqlens, documents, p});
}

//! dq [tokens, heads·head_dim], dk and dv [tokens, kv_heads·head_dim] (overwritten) from dout and
//! the forward's o and lse. `dsum` is device scratch of heads·tokens compute-type elements
//! (rowsum(dO∘O), written by the query pass and read by the key pass).
template <class T>
void causal_attention_backward(cudaStream_t stream, T const* q, T const* k, T const* v, T const* o,
                               compute_t<T> const* lse, T const* dout, T* dq, T* dk, T* dv,
                               compute_t<T>* dsum, std::int64_t const* cu_seqlens,
                               std::int64_t documents, std::int64_t tokens,
                               attention_heads const& heads) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft::nn::kernels::causal_attention: T must be float or double (bf16/f16 at "
                "d = 64 or 128: attention/cuda/flash.cuh)");
  attention_detail::check_launch(tokens, documents, heads);
  auto const scale =
      static_cast<compute_t<T>>(::weft::attention::resolve_scale(heads.scale, heads.head_dim));
  if (tokens == 0) return;
  attention_detail::packed_heads<compute_t<T>> const p{tokens, heads.heads, heads.kv_heads,
                                                       heads.head_dim, scale};
  ::weft::detail::launch_for_each_index(
      stream, heads.heads * tokens,
      causal_attention_backward_query_op<T>{q, k, v, o, lse, dout, dq, dsum, cu_seqlens, documents,
                                            p});
  ::weft::detail::launch_for_each_index(
      stream, heads.kv_heads * tokens,
      causal_attention_backward_key_op<T>{q, k, v, lse, dout, dsum, dk, dv, cu_seqlens, documents,
                                          p});
}

}  // namespace weft::nn::kernels
