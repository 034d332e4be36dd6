// weft/nn/attention.hpp — the attention core of a transformer block over packed token rows, as the
// Q, K and V linears produce them: q [T, Hq·D], k and v [T, Hkv·D], causal within each document of
// cu_seqlens, through weft's flash attention (GQA when Hkv < Hq). Forward keeps o and lse for the
// backward; no T×T score matrix is ever stored.
#pragma once

#include <weft/attention/args.hpp>
#include <weft/attention/common.hpp>
#include <weft/attention/flash.hpp>
#include <weft/core/error.hpp>
#include <weft/core/exec.hpp>
#include <weft/core/tensor.hpp>

#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

namespace weft::nn {

//! Head layout of an attention layer: `heads` query heads and `kv_heads` key/value heads
//! (heads % kv_heads == 0; query head h reads KV head h / (heads / kv_heads)), each `head_dim`
//! wide. `scale` 0 means 1/sqrt(head_dim).
struct attention_heads {
  index_t heads = 1;
  index_t kv_heads = 1;
  index_t head_dim = 1;
  double scale = 0.0;
};

namespace detail {

inline void check_heads(attention_heads const& h) {
  WEFT_EXPECTS(h.heads > 0, "attention_heads::heads", "> 0", h.heads);
  WEFT_EXPECTS(h.kv_heads > 0, "attention_heads::kv_heads", "> 0", h.kv_heads);
  WEFT_EXPECTS(h.head_dim > 0, "attention_heads::head_dim", "> 0", h.head_dim);
  WEFT_EXPECTS(h.heads % h.kv_heads == 0, "attention_heads::kv_heads",
               ::weft::detail::concat("a divisor of heads = ", h.heads), h.kv_heads);
}

//! [T, H·D] rows (unit column stride, any row stride) seen as the [1, T, H, D] tensor flash
//! attention takes; shape_error naming `name` unless the width is H·D.
template <class V>
auto as_heads(V const& v, index_t h, index_t d, char const* name) {
  static_assert(V::rank() == 2, "weft::nn: attention rows are [tokens, heads * head_dim] (rank 2)");
  using T = typename V::element_type;
  WEFT_EXPECTS_SHAPE(v.extent(1) == h * d, name,
                     ::weft::detail::concat("[T, ", h * d, "] (", h, " heads x ", d, ")"),
                     ::weft::detail::concat("[", v.extent(0), ", ", v.extent(1), "]"));
  auto const t = static_cast<index_t>(v.extent(0));
  auto const ld = static_cast<index_t>(v.stride(0));
  WEFT_EXPECTS_SHAPE(t == 0 || h * d == 0 || v.stride(1) == 1, name, "unit column stride",
                     static_cast<index_t>(v.stride(1)));
  using E4 = dextents<4>;
  using mapping = ::cuda::std::layout_stride::mapping<E4>;
  ::cuda::std::array<index_t, 4> const strides{t * ld, ld, d, 1};
  return strided_view<T, 4>(v.data_handle(), mapping(E4(1, t, h, d), strides));
}

//! [H, T] log-sum-exp rows seen as flash attention's [1, H, T].
template <class V>
auto as_lse(V const& v, index_t h, index_t t, char const* name) {
  static_assert(V::rank() == 2, "weft::nn: attention lse is [heads, tokens] (rank 2)");
  using T = typename V::element_type;
  WEFT_EXPECTS_SHAPE(v.extent(0) == h && v.extent(1) == t, name,
                     ::weft::detail::concat("[", h, ", ", t, "]"),
                     ::weft::detail::concat("[", v.extent(0), ", ", v.extent(1), "]"));
  using E3 = dextents<3>;
  using mapping = ::cuda::std::layout_stride::mapping<E3>;
  auto const ld = static_cast<index_t>(v.stride(0));
  ::cuda::std::array<index_t, 3> const strides{h * ld, ld, static_cast<index_t>(v.stride(1))};
  return strided_view<T, 3>(v.data_handle(), mapping(E3(1, h, t), strides));
}

inline attention::attention_options causal_options(attention_heads const& h) {
  attention::attention_options o;
  o.scale = h.scale;
  o.causal = attention::causal_mode::top_left;
  return o;
}

}  // namespace detail

//! Causal self-attention of packed documents: document n is rows [cu_seqlens[n], cu_seqlens[n+1])
//! of q, k, v and o, and its token i attends to its tokens j <= i. q, o [T, heads·head_dim];
//! k, v [T, kv_heads·head_dim]; lse [heads, T] in compute_t of the inputs (f32 for f32 and bf16,
//! f64 for f64), kept for the backward. cu_seqlens starts at 0, does not decrease and ends at T
//! ({0, T} for one sequence). Runs on the host executor `ex`; the same bits for any executor.
template <attention::HostExecutor E, attention::HostTensorArg QV, attention::HostTensorArg KV,
          attention::HostTensorArg VV, attention::HostTensorArg OV, attention::HostTensorArg LV>
void causal_attention_forward(E const& ex, QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse,
                              std::span<std::int64_t const> cu_seqlens,
                              attention_heads const& heads) {
  detail::check_heads(heads);
  auto const qv = attention::detail::arg_view(q);
  auto const tq = static_cast<index_t>(qv.extent(0));
  auto const q4 = detail::as_heads(qv, heads.heads, heads.head_dim, "q");
  auto const k4 =
      detail::as_heads(attention::detail::arg_view(k), heads.kv_heads, heads.head_dim, "k");
  auto const v4 =
      detail::as_heads(attention::detail::arg_view(v), heads.kv_heads, heads.head_dim, "v");
  auto const o4 =
      detail::as_heads(attention::detail::arg_view(o), heads.heads, heads.head_dim, "o");
  auto const l3 = detail::as_lse(attention::detail::arg_view(lse), heads.heads, tq, "lse");
  attention::flash_forward_varlen(ex, q4, k4, v4, o4, l3, cu_seqlens, cu_seqlens,
                                  detail::causal_options(heads));
}

//! The backward of causal_attention_forward from dout [T, heads·head_dim], with the forward's o
//! and lse: writes dq [T, heads·head_dim], dk and dv [T, kv_heads·head_dim] (overwritten; GQA
//! sums each KV head's gradient over its query heads).
template <attention::HostExecutor E, attention::HostTensorArg QV, attention::HostTensorArg KV,
          attention::HostTensorArg VV, attention::HostTensorArg OV, attention::HostTensorArg LV,
          attention::HostTensorArg GV, attention::HostTensorArg DQV, attention::HostTensorArg DKV,
          attention::HostTensorArg DVV>
void causal_attention_backward(E const& ex, QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse, GV&& dout,
                               DQV&& dq, DKV&& dk, DVV&& dv,
                               std::span<std::int64_t const> cu_seqlens,
                               attention_heads const& heads) {
  detail::check_heads(heads);
  index_t const hq = heads.heads, hk = heads.kv_heads, d = heads.head_dim;
  auto const qv = attention::detail::arg_view(q);
  auto const tq = static_cast<index_t>(qv.extent(0));
  attention::flash_backward_varlen(
      ex, detail::as_heads(qv, hq, d, "q"),
      detail::as_heads(attention::detail::arg_view(k), hk, d, "k"),
      detail::as_heads(attention::detail::arg_view(v), hk, d, "v"),
      detail::as_heads(attention::detail::arg_view(o), hq, d, "o"),
      detail::as_lse(attention::detail::arg_view(lse), hq, tq, "lse"),
      detail::as_heads(attention::detail::arg_view(dout), hq, d, "dout"),
      detail::as_heads(attention::detail::arg_view(dq), hq, d, "dq"),
      detail::as_heads(attention::detail::arg_view(dk), hk, d, "dk"),
      detail::as_heads(attention::detail::arg_view(dv), hk, d, "dv"), cu_seqlens, cu_seqlens,
      detail::causal_options(heads));
}

//! causal_attention_forward on the calling thread.
template <attention::HostTensorArg QV, attention::HostTensorArg KV, attention::HostTensorArg VV,
          attention::HostTensorArg OV, attention::HostTensorArg LV>
void causal_attention_forward(QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse,
                              std::span<std::int64_t const> cu_seqlens,
                              attention_heads const& heads) {
  causal_attention_forward(exec::host{}, std::forward<QV>(q), std::forward<KV>(k),
                           std::forward<VV>(v), std::forward<OV>(o), std::forward<LV>(lse),
                           cu_seqlens, heads);
}

//! causal_attention_backward on the calling thread.
template <attention::HostTensorArg QV, attention::HostTensorArg KV, attention::HostTensorArg VV,
          attention::HostTensorArg OV, attention::HostTensorArg LV, attention::HostTensorArg GV,
          attention::HostTensorArg DQV, attention::HostTensorArg DKV, attention::HostTensorArg DVV>
void causal_attention_backward(QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse, GV&& dout, DQV&& dq,
                               DKV&& dk, DVV&& dv, std::span<std::int64_t const> cu_seqlens,
                               attention_heads const& heads) {
  causal_attention_backward(exec::host{}, std::forward<QV>(q), std::forward<KV>(k),
                            std::forward<VV>(v), std::forward<OV>(o), std::forward<LV>(lse),
                            std::forward<GV>(dout), std::forward<DQV>(dq), std::forward<DKV>(dk),
                            std::forward<DVV>(dv), cu_seqlens, heads);
}

}  // namespace weft::nn
