// weft/nn/detail/decode_attention.hpp — one new query's softmax attention over a row's cached keys
// and values, for one head: the key/value-cache decoder's attention (nn::gpt_decoder on the CPU,
// nn::cuda_gpt_decoder's kernel, one thread per row and head), WEFT_HD so that both run this code.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/math.hpp>

#include <cuda/std/cmath>

namespace weft::nn::detail {

//! out[e] = Σ_j softmax_j(scale · q·k_j) v_j[e] over the n cached positions j = 0 .. n − 1 of
//! keys[j · stride + e] and values[j · stride + e] (e < head_dim), in C: the scores into
//! scores[0, n), their maximum subtracted before the exponentials, the weighted values summed
//! into acc[0, head_dim) in position order and divided by the sum of the weights once. n >= 1.
template <class T, class C>
WEFT_HD void decode_attention_head(T const* q, T const* keys, T const* values, index_t n,
                                   index_t stride, index_t head_dim, C scale, C* scores, C* acc,
                                   T* out) noexcept {
  C mx = neg_inf<C>();
  for (index_t j = 0; j < n; ++j) {
    T const* k = keys + j * stride;
    C s = 0;
    for (index_t e = 0; e < head_dim; ++e) s += static_cast<C>(q[e]) * static_cast<C>(k[e]);
    s *= scale;
    scores[j] = s;
    mx = s > mx ? s : mx;
  }
  C sum = 0;
  for (index_t j = 0; j < n; ++j) {
    scores[j] = ::cuda::std::exp(scores[j] - mx);
    sum += scores[j];
  }
  for (index_t e = 0; e < head_dim; ++e) acc[e] = C(0);
  for (index_t j = 0; j < n; ++j) {
    C const p = scores[j];
    T const* v = values + j * stride;
    for (index_t e = 0; e < head_dim; ++e) acc[e] += p * static_cast<C>(v[e]);
  }
  for (index_t e = 0; e < head_dim; ++e) out[e] = static_cast<T>(acc[e] / sum);
}

}  // namespace weft::nn::detail
