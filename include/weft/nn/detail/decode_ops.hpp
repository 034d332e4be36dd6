// weft/nn/detail/decode_ops.hpp — the element functors of nn::cuda_gpt_decoder's kernels
// (weft/nn/cuda/decode.cuh launches each over its index range): the cache write, the attention of
// a row's new query over its cache (detail::decode_attention_head per row and head) and fork's
// gather and scatter. WEFT_HD and free of CUDA, so the host runs them too: tests/nn/decode.test.cpp
// drives them over a host cache against a model of each row's history.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/math.hpp>
#include <weft/nn/detail/decode_attention.hpp>

#include <cstdint>

namespace weft::nn {

namespace kernels {

//! Row r's new keys and values (k, v: [rows, kvd]) into its cache slot at position `pos`
//! (cache_k, cache_v: one layer's [max_rows, max_len, kvd]).
template <class T>
struct decode_cache_write_op {
  T const* k;
  T const* v;
  T* cache_k;
  T* cache_v;
  index_t kvd, row_stride, pos;
  WEFT_HD void operator()(std::int64_t i) const noexcept {
    index_t const r = i / kvd, e = i % kvd;
    index_t const at = r * row_stride + pos * kvd + e;
    cache_k[at] = k[i];
    cache_v[at] = v[i];
  }
};

//! Thread i = (row, head): detail::decode_attention_head over the row's n cached positions.
template <class T>
struct decode_attention_op {
  using C = compute_t<T>;
  T const* q;        // [rows, heads · head_dim]
  T const* cache_k;  // one layer's [max_rows, max_len, kvd]
  T const* cache_v;
  T* out;     // [rows, heads · head_dim]
  C* scores;  // [rows · heads, max_len]
  C* acc;     // [rows · heads, head_dim]
  index_t heads, group, head_dim, kvd, row_stride, max_len, n;
  C scale;
  WEFT_HD void operator()(std::int64_t i) const noexcept {
    index_t const r = i / heads, h = i % heads, g = h / group, d = heads * head_dim;
    ::weft::nn::detail::decode_attention_head(
        q + r * d + h * head_dim, cache_k + r * row_stride + g * head_dim,
        cache_v + r * row_stride + g * head_dim, n, kvd, head_dim, scale, scores + i * max_len,
        acc + i * head_dim, out + r * d + h * head_dim);
  }
};

//! fork's two passes over every layer's first `span` cached elements of each row:
//! gather (to_slots = false): packed[(l · rows + r) · span + e] = cache[l, r, e] for r < rows;
//! scatter (to_slots = true): cache[l, r, e] = packed[(l · from_rows + sources[r]) · span + e].
template <class T>
struct decode_fork_op {
  T* cache;
  T* packed;
  std::int64_t const* sources;  // scatter only
  index_t rows, from_rows, span, max_rows, slot_stride;
  bool to_slots;
  WEFT_HD void operator()(std::int64_t i) const noexcept {
    index_t const l = i / (rows * span), rem = i % (rows * span), r = rem / span, e = rem % span;
    T* slot = cache + (l * max_rows + r) * slot_stride + e;
    if (to_slots)
      *slot = packed[(l * from_rows + sources[r]) * span + e];
    else
      packed[i] = *slot;
  }
};

}  // namespace kernels

}  // namespace weft::nn
