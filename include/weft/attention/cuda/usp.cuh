// weft/attention/cuda/usp.cuh — USP (the 2-D hybrid of Ulysses and ring attention, "USP: A
// Unified Sequence Parallelism Approach") on device buffers, stream-ordered, as attention/usp.hpp
// composes it on the host: a sequence-to-head all_to_all over the Ulysses group of u ranks gathers
// this ring rank's chunk for Hq/u query heads (KV heads split or replicated as ulysses_heads
// says), the device ring of cuda/ring.cuh runs on it over the ring group of r ranks under the
// layout's inner kind, and head-to-sequence all_to_alls return the rows. Both communicators are
// StreamCommunicators over device memory (weft's NCCL communicator; the ring one also needs the
// grouped sendrecv). The Ulysses all_to_alls and the ring's exchanges run on the transfer stream of
// the `Blocks` policy (cuda_ring_blocks / cuda_flash_ring_blocks, or host_ring_blocks over the NCCL
// mock), packing and block compute on its compute stream, CUDA events between them.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/attention/cuda/usp.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/common.hpp>
#include <weft/attention/cuda/ring.cuh>
#include <weft/attention/cuda/ulysses.cuh>
#include <weft/attention/ring.hpp>
#include <weft/attention/sharding.hpp>
#include <weft/attention/ulysses.hpp>
#include <weft/attention/usp.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/error.hpp>
#include <weft/mesh/device_mesh.hpp>

#include <cstdint>
#include <string_view>

namespace weft::attention {

namespace detail {

//! Entry checks of the device USP (forward and backward; no device memory is read): usp.hpp's
//! layout rules (degrees equal to the group sizes, contiguous unless causal, local length) and
//! Ulysses' head rules over the Ulysses group. Returns the resolved scale.
template <class T, class O>
float check_device_usp(int ulysses, int ring, seq_layout const& layout,
                       detail::bshd<T const> const& q, detail::bshd<T const> const& k,
                       detail::bshd<T const> const& v, detail::bshd<O> const& o,
                       detail::bhs<float> const& lse, bool causal, double scale) {
  check_qkv(q, k, v);
  check_same_shape(q, o, "o");
  check_lse_shape(q, lse, "lse");
  WEFT_EXPECTS_SHAPE(k.s == q.s, "k", ::weft::detail::concat("local length ", q.s, " (as q)"), k.s);
  check_usp_layout(layout, ulysses, ring, causal, q.s);
  (void)ulysses_heads::make(ulysses, q.h, k.h);
  return static_cast<float>(resolve_scale(scale, q.d));
}

//! The layout the ring group runs on the gathered ring chunks: the USP layout's inner kind over
//! its r ring ranks (ring rank ρ holds ring chunk ρ, Ulysses pieces in Ulysses-rank order).
inline seq_layout usp_ring_layout(seq_layout const& layout) {
  return seq_layout::usp(1, layout.ring_degree(), layout.kind(), layout.seq());
}

}  // namespace detail

//! USP forward on device buffers, stream-ordered, on the Ulysses group `ulysses` (size u) and the
//! ring group `ring` (size r). This rank holds, as raw views of device memory, the rows of
//! `layout` (a seq_layout::usp(u, r, kind, S)) for global layout rank ring.rank()·u +
//! ulysses.rank(): q [B, c, Hq, D], k, v [B, c, Hkv, D] of T with c = layout.local_length(); Hq
//! divisible by u, Hkv divisible by u or dividing it (KV heads then replicated; the ring carries
//! the H_kv/u, or 1, heads unreplicated further). o [B, c, Hq, D] (of O) and lse [B, Hq, c]
//! receive this rank's rows of single-device attention over the whole sequence (top-left causal
//! when opt.causal is set), ready when the compute stream of `blocks` reaches them. Non-causal
//! attention needs the contiguous inner layout; opt.scale 0 means 1/sqrt(D). Every argument is
//! checked before the first exchange.
template <class Blocks, class U, class R, class T, class O>
requires detail::device_ulysses_communicator<U> && detail::device_ring_communicator<R>
void stream_usp_forward(U& ulysses, R& ring, Blocks& blocks, seq_layout const& layout,
                        detail::bshd<T const> q, detail::bshd<T const> k, detail::bshd<T const> v,
                        detail::bshd<O> o, detail::bhs<float> lse,
                        attention_options const& opt = {}) {
  bool const causal = detail::is_causal(opt);
  (void)detail::check_device_usp(ulysses.size(), ring.size(), layout, q, k, v, o, lse, causal,
                                 opt.scale);
  seq_layout const inner = detail::usp_ring_layout(layout);
  detail::stream_ulysses_forward_impl(
      ulysses, blocks, q, k, v, o, lse, [&](auto qh, auto kh, auto vh, auto oh, auto lh) {
        stream_ring_forward(ring, blocks, inner, qh, kh, vh, oh, lh, opt);
      });
}

//! USP backward on device buffers, stream-ordered; arguments as stream_usp_forward plus
//! stream_ring_backward's: o and lse are this rank's forward results, dq, dk, dv (of G) of this
//! rank's rows are overwritten (replicated KV heads' gradients summed in Ulysses-rank order).
template <class Blocks, class U, class R, class T, class O, class G>
requires detail::device_ulysses_communicator<U> && detail::device_ring_communicator<R>
void stream_usp_backward(U& ulysses, R& ring, Blocks& blocks, seq_layout const& layout,
                         detail::bshd<T const> q, detail::bshd<T const> k, detail::bshd<T const> v,
                         detail::bshd<O const> o, detail::bhs<float const> lse,
                         detail::bshd<T const> dout, detail::bshd<G> dq, detail::bshd<G> dk,
                         detail::bshd<G> dv, attention_options const& opt = {}) {
  bool const causal = detail::is_causal(opt);
  detail::bhs<float> const lse_shape{nullptr, lse.b, lse.h, lse.s, lse.sb, lse.sh, lse.ss};
  (void)detail::check_device_usp(ulysses.size(), ring.size(), layout, q, k, v, o, lse_shape, causal,
                                 opt.scale);
  detail::check_gradient_shapes(q, k, dout, dq, dk, dv);
  seq_layout const inner = detail::usp_ring_layout(layout);
  detail::stream_ulysses_backward_impl(
      ulysses, blocks, q, k, v, o, lse, dout, dq, dk, dv,
      [&](auto qh, auto kh, auto vh, auto oh, auto lh, auto gh, auto dqh, auto dkh, auto dvh) {
        stream_ring_backward(ring, blocks, inner, qh, kh, vh, oh, lh, gh, dqh, dkh, dvh, opt);
      });
}

//! USP forward over two axes of a device_mesh of stream communicators (Ulysses over
//! `ulysses_axis`, ring over `ring_axis`; this rank's layout rank is usp_layout_rank(mesh,
//! ulysses_axis, ring_axis)); the rest is stream_usp_forward's.
template <class Blocks, comm::SplittableGroup C, class T, class O>
requires detail::device_ulysses_communicator<C> && detail::device_ring_communicator<C>
void stream_usp_forward(device_mesh<C>& mesh, std::string_view ulysses_axis,
                        std::string_view ring_axis, Blocks& blocks, seq_layout const& layout,
                        detail::bshd<T const> q, detail::bshd<T const> k, detail::bshd<T const> v,
                        detail::bshd<O> o, detail::bhs<float> lse,
                        attention_options const& opt = {}) {
  WEFT_EXPECTS(ulysses_axis != ring_axis, "ring_axis", "an axis other than the Ulysses axis",
               ring_axis);
  stream_usp_forward(mesh.group(ulysses_axis), mesh.group(ring_axis), blocks, layout, q, k, v, o,
                     lse, opt);
}

//! USP backward over two axes of a device_mesh; the rest is stream_usp_backward's.
template <class Blocks, comm::SplittableGroup C, class T, class O, class G>
requires detail::device_ulysses_communicator<C> && detail::device_ring_communicator<C>
void stream_usp_backward(device_mesh<C>& mesh, std::string_view ulysses_axis,
                         std::string_view ring_axis, Blocks& blocks, seq_layout const& layout,
                         detail::bshd<T const> q, detail::bshd<T const> k, detail::bshd<T const> v,
                         detail::bshd<O const> o, detail::bhs<float const> lse,
                         detail::bshd<T const> dout, detail::bshd<G> dq, detail::bshd<G> dk,
                         detail::bshd<G> dv, attention_options const& opt = {}) {
  WEFT_EXPECTS(ulysses_axis != ring_axis, "ring_axis", "an axis other than the Ulysses axis",
               ring_axis);
  stream_usp_backward(mesh.group(ulysses_axis), mesh.group(ring_axis), blocks, layout, q, k, v, o,
                      lse, dout, dq, dk, dv, opt);
}

}  // namespace weft::attention
