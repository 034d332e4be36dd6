// weft/attention/cuda/ulysses.cuh — Ulysses attention (DeepSpeed-Ulysses: sequence-to-head
// all-to-all, full-sequence attention on a slice of the heads, head-to-sequence all-to-all back)
// over a StreamCommunicator whose buffers live in device memory (weft's NCCL communicator), forward
// and backward, stream-ordered. Packing and unpacking are copy kernels over strided views on the
// compute stream; each all_to_all runs on the transfer stream between CUDA events. The head split
// (even, or KV heads replicated when the group outnumbers them) is ulysses_heads' (ulysses.hpp);
// the attention itself is the `Blocks` policy's (cuda/ring.cuh: cuda_ring_blocks with the flash
// kernels, or host_ring_blocks over a mock whose device memory is host memory); USP
// (cuda/usp.cuh) runs the device ring there instead, through the detail::*_impl functions.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/attention/cuda/ulysses.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/common.hpp>
#include <weft/attention/cuda/ring.cuh>
#include <weft/attention/ulysses.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>

#include <cstdint>
#include <type_traits>

namespace weft::attention {

namespace detail {

//! What device Ulysses asks of a communicator: a StreamCommunicator over device memory.
template <class C>
concept device_ulysses_communicator =
    comm::StreamCommunicator<C> && comm::CommunicatorIn<C, cuda_space>;

//! Heads [h0, h0 + n) of a view.
template <class X>
bshd<X> head_slice(bshd<X> t, std::int64_t h0, std::int64_t n) noexcept {
  t.data += h0 * t.sh;
  t.h = n;
  return t;
}
template <class X>
bhs<X> head_slice(bhs<X> t, std::int64_t h0, std::int64_t n) noexcept {
  t.data += h0 * t.sh;
  t.h = n;
  return t;
}

//! One all_to_all of `count` X per rank between `send` and `recv` (policy scratch), on the
//! transfer stream after the compute that packed `send`; the compute then waits for it.
template <class Blocks, class C, class X>
void ulysses_exchange(C& comm, Blocks& blocks, X const* send, X* recv, std::int64_t total) {
  comm::op_options co;
  co.stream = blocks.transfer_stream();
  blocks.transfer_waits_compute();
  auto m = blocks.after_transfer(
      comm.all_to_all(ring_buffer(send, total), ring_buffer(recv, total), co));
  blocks.compute_waits(m);
}

//! [B, c, H, D] sequence shards -> scratch [B, N·c, hl, D] holding heads
//! [head0(p), head0(p) + hl) of every rank p, in rank order along the sequence.
template <class Blocks, class C, class X, class HeadFn>
void d_seq_to_head(C& comm, Blocks& blocks, bshd<X const> x, std::int64_t hl, HeadFn head0,
                   std::remove_const_t<X>* full) {
  using E = std::remove_const_t<X>;
  int const n = comm.size();
  std::int64_t const piece = x.b * x.s * hl * x.d;
  ring_scratch<Blocks, E> send(blocks, piece * n), recv(blocks, piece * n);
  for (int p = 0; p < n; ++p)
    blocks.copy(head_slice(x, head0(p), hl),
                contiguous_bshd(send.get() + p * piece, x.b, x.s, hl, x.d));
  ulysses_exchange(comm, blocks, send.get(), recv.get(), piece * n);
  auto const out = contiguous_bshd(full, x.b, x.s * n, hl, x.d);
  for (int p = 0; p < n; ++p)
    blocks.copy(contiguous_bshd<E const>(recv.get() + p * piece, x.b, x.s, hl, x.d),
                seq_slice(out, p * x.s, (p + 1) * x.s));
}

//! The inverse for float results: [B, N·c, hl, D] -> this rank's [B, c, H, D] of Out; with
//! `add` (replicated KV heads) the replicas are summed in source-rank order into a float
//! accumulator first, else assigned.
template <class Blocks, class C, class Out, class HeadFn>
void d_head_to_seq(C& comm, Blocks& blocks, bshd<float const> full, bshd<Out> x, HeadFn head0,
                   bool add) {
  int const n = comm.size();
  std::int64_t const c = x.s, hl = full.h;
  std::int64_t const piece = x.b * c * hl * x.d;
  ring_scratch<Blocks, float> send(blocks, piece * n), recv(blocks, piece * n);
  for (int p = 0; p < n; ++p)
    blocks.copy(seq_slice(full, p * c, (p + 1) * c),
                contiguous_bshd(send.get() + p * piece, x.b, c, hl, x.d));
  ulysses_exchange(comm, blocks, send.get(), recv.get(), piece * n);
  if (!add) {
    for (int p = 0; p < n; ++p)
      blocks.copy(contiguous_bshd<float const>(recv.get() + p * piece, x.b, c, hl, x.d),
                  head_slice(x, head0(p), hl));
    return;
  }
  std::int64_t const acc_n = x.b * c * x.h * x.d;
  ring_scratch<Blocks, float> acc(blocks, acc_n);
  blocks.fill(acc.get(), acc_n, 0.0f);
  auto const av = contiguous_bshd(acc.get(), x.b, c, x.h, x.d);
  for (int p = 0; p < n; ++p)
    blocks.accumulate(contiguous_bshd<float const>(recv.get() + p * piece, x.b, c, hl, x.d),
                      head_slice(av, head0(p), hl));
  blocks.copy(cview(av), x);
}

//! LSE [B, Hq, c] -> scratch [B, hl, N·c] (float).
template <class Blocks, class C>
void d_lse_seq_to_head(C& comm, Blocks& blocks, bhs<float const> x, std::int64_t hl, float* full) {
  int const n = comm.size();
  std::int64_t const c = x.s, piece = x.b * hl * c;
  ring_scratch<Blocks, float> send(blocks, piece * n), recv(blocks, piece * n);
  for (int p = 0; p < n; ++p)
    blocks.copy(head_slice(x, p * hl, hl), contiguous_bhs(send.get() + p * piece, x.b, hl, c));
  ulysses_exchange(comm, blocks, send.get(), recv.get(), piece * n);
  auto const out = contiguous_bhs(full, x.b, hl, n * c);
  for (int p = 0; p < n; ++p)
    blocks.copy(contiguous_bhs<float const>(recv.get() + p * piece, x.b, hl, c),
                seq_slice(out, p * c, (p + 1) * c));
}

//! LSE [B, hl, N·c] (float) -> this rank's [B, Hq, c].
template <class Blocks, class C>
void d_lse_head_to_seq(C& comm, Blocks& blocks, bhs<float const> full, bhs<float> x) {
  int const n = comm.size();
  std::int64_t const c = x.s, hl = full.h, piece = x.b * hl * c;
  ring_scratch<Blocks, float> send(blocks, piece * n), recv(blocks, piece * n);
  for (int p = 0; p < n; ++p)
    blocks.copy(seq_slice(full, p * c, (p + 1) * c),
                contiguous_bhs(send.get() + p * piece, x.b, hl, c));
  ulysses_exchange(comm, blocks, send.get(), recv.get(), piece * n);
  for (int p = 0; p < n; ++p)
    blocks.copy(contiguous_bhs<float const>(recv.get() + p * piece, x.b, hl, c),
                head_slice(x, p * hl, hl));
}

template <class T, class O>
float check_device_ulysses(int world, bshd<T const> const& q, bshd<T const> const& k,
                           bshd<T const> const& v, bshd<O> const& o, bhs<float> const& lse,
                           double scale) {
  check_qkv(q, k, v);
  check_same_shape(q, o, "o");
  check_lse_shape(q, lse, "lse");
  WEFT_EXPECTS_SHAPE(k.s == q.s, "k", ::weft::detail::concat("local length ", q.s, " (as q)"), k.s);
  (void)ulysses_heads::make(world, q.h, k.h);
  return static_cast<float>(resolve_scale(scale, q.d));
}

//! Ulysses forward around `inner(q, k, v, o, lse)`, the attention on the head-sharded gathered
//! sequence (contiguous [B, N·c, hl, D] views of policy scratch; o and lse float, to be
//! overwritten): the sequence-to-head all_to_alls, the inner attention, the head-to-sequence
//! all_to_alls into o and lse, then the compute stream waits for every exchange. No checks: the
//! entry points check first (USP runs its ring as `inner`).
template <class Blocks, class C, class T, class O, class Inner>
void stream_ulysses_forward_impl(C& comm, Blocks& blocks, bshd<T const> q, bshd<T const> k,
                                 bshd<T const> v, bshd<O> o, bhs<float> lse, Inner&& inner) {
  auto const uh = ulysses_heads::make(comm.size(), q.h, k.h);
  int const n = comm.size();
  std::int64_t const sf = q.s * n, hq = uh.local_q(), hk = uh.local_k();
  auto qf = [&](int p) { return uh.q_head(p, 0); };
  auto kf = [&](int p) { return uh.k_head(p, 0); };
  ring_scratch<Blocks, T> qh(blocks, q.b * sf * hq * q.d), kh(blocks, q.b * sf * hk * q.d),
      vh(blocks, q.b * sf * hk * q.d);
  ring_scratch<Blocks, float> oh(blocks, q.b * sf * hq * q.d), lh(blocks, q.b * hq * sf);
  d_seq_to_head(comm, blocks, q, hq, qf, qh.get());
  d_seq_to_head(comm, blocks, k, hk, kf, kh.get());
  d_seq_to_head(comm, blocks, v, hk, kf, vh.get());
  auto const ov = contiguous_bshd(oh.get(), q.b, sf, hq, q.d);
  auto const lv = contiguous_bhs(lh.get(), q.b, hq, sf);
  inner(contiguous_bshd<T const>(qh.get(), q.b, sf, hq, q.d),
        contiguous_bshd<T const>(kh.get(), q.b, sf, hk, q.d),
        contiguous_bshd<T const>(vh.get(), q.b, sf, hk, q.d), ov, lv);
  d_head_to_seq(comm, blocks, cview(ov), o, qf, false);
  d_lse_head_to_seq(comm, blocks, cview(lv), lse);
  blocks.finish();
}

//! Ulysses backward around `inner(q, k, v, o, lse, dout, dq, dk, dv)` on the head-sharded
//! gathered sequence (float dq, dk, dv to be overwritten); replicated KV heads' gradients are
//! summed in rank order on the way back. No checks, as stream_ulysses_forward_impl.
template <class Blocks, class C, class T, class O, class G, class Inner>
void stream_ulysses_backward_impl(C& comm, Blocks& blocks, bshd<T const> q, bshd<T const> k,
                                  bshd<T const> v, bshd<O const> o, bhs<float const> lse,
                                  bshd<T const> dout, bshd<G> dq, bshd<G> dk, bshd<G> dv,
                                  Inner&& inner) {
  auto const uh = ulysses_heads::make(comm.size(), q.h, k.h);
  int const n = comm.size();
  std::int64_t const sf = q.s * n, hq = uh.local_q(), hk = uh.local_k();
  auto qf = [&](int p) { return uh.q_head(p, 0); };
  auto kf = [&](int p) { return uh.k_head(p, 0); };
  using OE = std::remove_const_t<O>;
  std::int64_t const qe = q.b * sf * hq * q.d, ke = q.b * sf * hk * q.d;
  ring_scratch<Blocks, T> qh(blocks, qe), kh(blocks, ke), vh(blocks, ke), gh(blocks, qe);
  ring_scratch<Blocks, OE> oh(blocks, qe);
  ring_scratch<Blocks, float> lh(blocks, q.b * hq * sf), dqh(blocks, qe), dkh(blocks, ke),
      dvh(blocks, ke);
  d_seq_to_head(comm, blocks, q, hq, qf, qh.get());
  d_seq_to_head(comm, blocks, k, hk, kf, kh.get());
  d_seq_to_head(comm, blocks, v, hk, kf, vh.get());
  d_seq_to_head(comm, blocks, o, hq, qf, oh.get());
  d_seq_to_head(comm, blocks, dout, hq, qf, gh.get());
  d_lse_seq_to_head(comm, blocks, lse, hq, lh.get());
  auto const dqv = contiguous_bshd(dqh.get(), q.b, sf, hq, q.d);
  auto const dkv = contiguous_bshd(dkh.get(), q.b, sf, hk, q.d);
  auto const dvv = contiguous_bshd(dvh.get(), q.b, sf, hk, q.d);
  inner(contiguous_bshd<T const>(qh.get(), q.b, sf, hq, q.d),
        contiguous_bshd<T const>(kh.get(), q.b, sf, hk, q.d),
        contiguous_bshd<T const>(vh.get(), q.b, sf, hk, q.d),
        contiguous_bshd<OE const>(oh.get(), q.b, sf, hq, q.d),
        contiguous_bhs<float const>(lh.get(), q.b, hq, sf),
        contiguous_bshd<T const>(gh.get(), q.b, sf, hq, q.d), dqv, dkv, dvv);
  d_head_to_seq(comm, blocks, cview(dqv), dq, qf, false);
  d_head_to_seq(comm, blocks, cview(dkv), dk, kf, uh.replicated());
  d_head_to_seq(comm, blocks, cview(dvv), dv, kf, uh.replicated());
  blocks.finish();
}

}  // namespace detail

//! Ulysses attention forward on device buffers, stream-ordered. Rank p holds the contiguous
//! sequence shard p as raw views of device memory (q [B, c, Hq, D], k, v [B, c, Hkv, D] of T);
//! Hq divisible by the group size N, Hkv divisible by N or dividing it (KV heads then
//! replicated). o [B, c, Hq, D] (of O) and lse [B, Hq, c] receive this rank's rows of
//! single-device attention over the whole sequence (top-left causal when opt.causal is set), ready
//! when the compute stream of `blocks` reaches them. Five all_to_all calls on the transfer stream.
template <class Blocks, class C, class T, class O>
requires detail::device_ulysses_communicator<C>
void stream_ulysses_forward(C& comm, Blocks& blocks, detail::bshd<T const> q,
                            detail::bshd<T const> k, detail::bshd<T const> v, detail::bshd<O> o,
                            detail::bhs<float> lse, attention_options const& opt = {}) {
  float const scale = detail::check_device_ulysses(comm.size(), q, k, v, o, lse, opt.scale);
  mask_rule const mask{opt.causal != causal_mode::none, 0};
  detail::stream_ulysses_forward_impl(comm, blocks, q, k, v, o, lse,
                                      [&](auto qh, auto kh, auto vh, auto oh, auto lh) {
                                        blocks.forward(qh, kh, vh, oh, lh, mask, scale);
                                      });
}

//! Ulysses attention backward on device buffers, stream-ordered: dq, dk, dv (of G) of this
//! rank's shard, overwritten (replicated KV heads' gradients summed in rank order). o and lse
//! are this rank's forward results.
template <class Blocks, class C, class T, class O, class G>
requires detail::device_ulysses_communicator<C>
void stream_ulysses_backward(C& comm, Blocks& blocks, detail::bshd<T const> q,
                             detail::bshd<T const> k, detail::bshd<T const> v,
                             detail::bshd<O const> o, detail::bhs<float const> lse,
                             detail::bshd<T const> dout, detail::bshd<G> dq, detail::bshd<G> dk,
                             detail::bshd<G> dv, attention_options const& opt = {}) {
  detail::bhs<float> const lse_shape{nullptr, lse.b, lse.h, lse.s, lse.sb, lse.sh, lse.ss};
  float const scale = detail::check_device_ulysses(comm.size(), q, k, v, o, lse_shape, opt.scale);
  detail::check_gradient_shapes(q, k, dout, dq, dk, dv);
  mask_rule const mask{opt.causal != causal_mode::none, 0};
  detail::stream_ulysses_backward_impl(
      comm, blocks, q, k, v, o, lse, dout, dq, dk, dv,
      [&](auto qh, auto kh, auto vh, auto oh, auto lh, auto gh, auto dqh, auto dkh, auto dvh) {
        std::int64_t const qe = dqh.b * dqh.s * dqh.h * dqh.d, ke = dkh.b * dkh.s * dkh.h * dkh.d;
        blocks.fill(dqh.data, qe, 0.0f);  // the block kernels add
        blocks.fill(dkh.data, ke, 0.0f);
        blocks.fill(dvh.data, ke, 0.0f);
        blocks.backward(qh, kh, vh, oh, lh, gh, dqh, dkh, dvh, mask, scale);
      });
}

}  // namespace weft::attention
