// weft/attention/ring.hpp — ring attention over any point-to-point communicator in host memory,
// forward and backward: K/V blocks travel rank to rank with isend/irecv posted before the local
// block's compute; dK/dV travel back with their block to the owner (N sends); per-step causal rules
// for contiguous, zigzag and stripe.
#pragma once

#include <weft/attention/args.hpp>
#include <weft/attention/agreement.hpp>
#include <weft/attention/common.hpp>
#include <weft/attention/flash.hpp>
#include <weft/attention/sharding.hpp>
#include <weft/attention/softmax_state.hpp>
#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::attention {

//! What one rank computes at one ring step: query rows [q0, q1) against the held K/V block's rows
//! [k0, k1) under `mask` (in those slices' own coordinates), or nothing (`skip`). These are the
//! rules of ring-flash-attention (zhuzilin/ring-flash-attention, ring_flash_attn.py and
//! zigzag_ring_flash_attn.py):
//!  - non-causal: everything, unmasked;
//!  - contiguous causal: own block causal, earlier blocks full, later blocks skipped;
//!  - zigzag causal: own block causal; an earlier rank's block: all queries against its first
//!    half; a later rank's block: the second half of the queries against all of it;
//!  - stripe causal: src <= rank causal (j <= i), src > rank strictly causal (j <= i - 1).
struct ring_step {
  bool skip = false;
  std::int64_t q0 = 0, q1 = 0, k0 = 0, k1 = 0;
  mask_rule mask{};
  //! Work in query-key pairs, for balance checks.
  [[nodiscard]] std::int64_t pairs() const noexcept {
    if (skip) return 0;
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < q1 - q0; ++i) n += mask.key_end(i, k1 - k0);
    return n;
  }
};

//! The step of ring rank `rank` holding the K/V of ring rank `src`, with `chunk` local rows.
inline ring_step plan_ring_step(layout_kind kind, bool causal, int rank, int src,
                                std::int64_t chunk) {
  ring_step full{false, 0, chunk, 0, chunk, {false, 0}};
  if (!causal) return full;
  ring_step diag{false, 0, chunk, 0, chunk, {true, 0}};
  switch (kind) {
    case layout_kind::contiguous:
      if (src == rank) return diag;
      if (src < rank) return full;
      return ring_step{true, 0, 0, 0, 0, {}};
    case layout_kind::zigzag:
      if (src == rank) return diag;
      if (src < rank) return ring_step{false, 0, chunk, 0, chunk / 2, {false, 0}};
      return ring_step{false, chunk / 2, chunk, 0, chunk, {false, 0}};
    case layout_kind::stripe:
      if (src <= rank) return diag;
      return ring_step{false, 0, chunk, 0, chunk, {true, -1}};
  }
  return full;
}

namespace detail {

inline bool is_causal(attention_options const& opt) noexcept {
  return opt.causal != causal_mode::none;
}

//! What ring attention asks of a communicator, checked where a user's call enters (ring_forward,
//! ring_backward) so that the diagnostic names the requirement rather than a buffer mismatch deep
//! inside: a PointToPoint whose buffers live in host memory (K/V blocks are host arrays).
template <class C>
constexpr bool check_ring_communicator() {
  static_assert(comm::PointToPointIn<C, host_space>,
                "weft: ring attention needs a point-to-point communicator over host memory "
                "(comm::PointToPointIn<C, host_space>); this communicator's memory_space is "
                "another one (e.g. an NCCL communicator: use stream_ring_forward / "
                "stream_ring_backward of weft/attention/cuda/ring.cuh for device buffers, or "
                "stage the blocks through host memory)");
  return true;
}

//! Copies a [B, c, H, D] strided tensor into a contiguous buffer and back.
template <class To, class From>
void copy_bshd(bshd<From> const& src, bshd<To> const& dst) {
  for (index_t b = 0; b < src.b; ++b)
    for (index_t s = 0; s < src.s; ++s)
      for (index_t h = 0; h < src.h; ++h) {
        From const* a = src.row(b, s, h);
        To* z = dst.row(b, s, h);
        for (index_t c = 0; c < src.d; ++c) z[c] = static_cast<To>(a[c]);
      }
}
template <class To, class From>
void copy_bhs(bhs<From> const& src, bhs<To> const& dst) {
  for (index_t b = 0; b < src.b; ++b)
    for (index_t h = 0; h < src.h; ++h)
      for (index_t s = 0; s < src.s; ++s) dst.at(b, h, s) = static_cast<To>(src.at(b, h, s));
}

//! Merges a block result (rows [q0, q1) of the accumulators) row by row.
template <class Acc>
void merge_block(bshd<Acc> const& o, bhs<Acc> const& l, bshd<Acc> const& bo, bhs<Acc> const& bl,
                 index_t q0) {
  for (index_t b = 0; b < bo.b; ++b)
    for (index_t h = 0; h < bo.h; ++h)
      for (index_t i = 0; i < bo.s; ++i)
        lse_merge{}(o.row(b, q0 + i, h), l.at(b, h, q0 + i), bo.row(b, i, h), bl.at(b, h, i), bo.d);
}

//! The ring forward on raw views. q [B, c, Hq, D] of type T; k, v [B, c, Hkv, D] of type T (they
//! travel as T); o_acc and lse_acc receive the merged result in Acc.
template <class T, comm::PointToPointIn<host_space> C>
void ring_forward_impl(C& comm, layout_kind kind, bool causal, bshd<T const> q, bshd<T const> k,
                       bshd<T const> v, bshd<compute_t<T>> o_acc, bhs<compute_t<T>> lse_acc,
                       double scale, exec::host const& ex) {
  using Acc = compute_t<T>;
  using E = std::remove_const_t<T>;
  int const n = comm.size(), r = comm.rank();
  index_t const c = q.s;
  index_t const kv_elems = k.b * k.s * k.h * k.d;
  // Two K/V buffers, each [2][B, c, Hkv, D] contiguous: the one in use and the one arriving.
  std::vector<E> kv_a(std::size_t(2 * kv_elems)), kv_b(std::size_t(2 * kv_elems));
  copy_bshd(k, contiguous_bshd(kv_a.data(), k.b, k.s, k.h, k.d));
  copy_bshd(v, contiguous_bshd(kv_a.data() + kv_elems, k.b, k.s, k.h, k.d));
  E* cur = kv_a.data();
  E* nxt = kv_b.data();

  for (index_t b = 0; b < o_acc.b; ++b)
    for (index_t h = 0; h < o_acc.h; ++h)
      for (index_t i = 0; i < c; ++i) {
        std::fill(o_acc.row(b, i, h), o_acc.row(b, i, h) + o_acc.d, Acc(0));
        lse_acc.at(b, h, i) = empty_lse<Acc>();
      }
  std::vector<Acc> bo_buf(std::size_t(q.b * c * q.h * q.d)), bl_buf(std::size_t(q.b * q.h * c));

  int const next = (r + 1) % n, prev = (r - 1 + n) % n;
  for (int s = 0; s < n; ++s) {
    comm::work send_w, recv_w;
    if (s + 1 < n) {  // prefetch the next block before computing on this one
      send_w = comm::isend(comm, std::span<E const>(cur, std::size_t(2 * kv_elems)), next);
      recv_w = comm::irecv(comm, std::span<E>(nxt, std::size_t(2 * kv_elems)), prev);
    }
    int const src = (r - s + n) % n;
    ring_step const st = plan_ring_step(kind, causal, r, src, c);
    if (!st.skip && st.q1 > st.q0 && st.k1 > st.k0) {
      auto const kb = contiguous_bshd<E const>(cur, k.b, k.s, k.h, k.d);
      auto const vb = contiguous_bshd<E const>(cur + kv_elems, k.b, k.s, k.h, k.d);
      index_t const rows = st.q1 - st.q0;
      auto const bo = contiguous_bshd(bo_buf.data(), q.b, rows, q.h, q.d);
      auto const bl = contiguous_bhs(bl_buf.data(), q.b, q.h, rows);
      flash_forward_raw(ex, seq_slice(q, st.q0, st.q1), seq_slice(kb, st.k0, st.k1),
                        seq_slice(vb, st.k0, st.k1), bo, bl, st.mask, scale);
      merge_block(o_acc, lse_acc, bo, bl, st.q0);
    }
    if (s + 1 < n) {
      send_w.wait();
      recv_w.wait();
      std::swap(cur, nxt);
    }
  }
}

//! The ring backward on raw views (ring-flash-attention's protocol): K/V circulate again, and a
//! traveling dK/dV buffer (Acc) for the block in hand gathers each rank's contribution and is
//! passed on, arriving complete at its owner after the N-th send. dq_acc, dk_acc, dv_acc are
//! overwritten. o and lse are this rank's forward results (the global ones for its rows).
template <class T, class O, class L, class G, comm::PointToPointIn<host_space> C>
void ring_backward_impl(C& comm, layout_kind kind, bool causal, bshd<T const> q, bshd<T const> k,
                        bshd<T const> v, bshd<O const> o, bhs<L const> lse, bshd<G const> dout,
                        bshd<compute_t<T>> dq_acc, bshd<compute_t<T>> dk_acc,
                        bshd<compute_t<T>> dv_acc, double scale, exec::host const& ex) {
  using Acc = compute_t<T>;
  using E = std::remove_const_t<T>;
  int const n = comm.size(), r = comm.rank();
  index_t const c = q.s;
  index_t const kv_elems = k.b * k.s * k.h * k.d;
  std::vector<E> kv_a(std::size_t(2 * kv_elems)), kv_b(std::size_t(2 * kv_elems));
  copy_bshd(k, contiguous_bshd(kv_a.data(), k.b, k.s, k.h, k.d));
  copy_bshd(v, contiguous_bshd(kv_a.data() + kv_elems, k.b, k.s, k.h, k.d));
  E* cur = kv_a.data();
  E* nxt = kv_b.data();
  // Traveling dK/dV ([2][B, c, Hkv, D] in Acc), double-buffered, and this step's block gradients.
  std::vector<Acc> dkv_a(std::size_t(2 * kv_elems), Acc(0)),
      dkv_b(std::size_t(2 * kv_elems), Acc(0));
  std::vector<Acc> blk(std::size_t(2 * kv_elems));
  Acc* travel = dkv_a.data();  // the buffer for the block in hand (received, or zeros at step 0)
  Acc* spare = dkv_b.data();
  zero_rows(dq_acc);

  int const next = (r + 1) % n, prev = (r - 1 + n) % n;
  comm::work dkv_recv, dkv_send;
  for (int s = 0; s < n; ++s) {
    comm::work send_w, recv_w;
    if (s + 1 < n) {
      send_w = comm::isend(comm, std::span<E const>(cur, std::size_t(2 * kv_elems)), next);
      recv_w = comm::irecv(comm, std::span<E>(nxt, std::size_t(2 * kv_elems)), prev);
    }
    int const src = (r - s + n) % n;
    ring_step const st = plan_ring_step(kind, causal, r, src, c);
    bool const busy = !st.skip && st.q1 > st.q0 && st.k1 > st.k0;
    if (busy) {
      std::fill(blk.begin(), blk.end(), Acc(0));
      auto const kb = contiguous_bshd<E const>(cur, k.b, k.s, k.h, k.d);
      auto const vb = contiguous_bshd<E const>(cur + kv_elems, k.b, k.s, k.h, k.d);
      auto const dkb = contiguous_bshd(blk.data(), k.b, k.s, k.h, k.d);
      auto const dvb = contiguous_bshd(blk.data() + kv_elems, k.b, k.s, k.h, k.d);
      flash_backward_accumulate_raw(ex, seq_slice(q, st.q0, st.q1), seq_slice(kb, st.k0, st.k1),
                                    seq_slice(vb, st.k0, st.k1), seq_slice(o, st.q0, st.q1),
                                    seq_slice(lse, st.q0, st.q1), seq_slice(dout, st.q0, st.q1),
                                    seq_slice(dq_acc, st.q0, st.q1), seq_slice(dkb, st.k0, st.k1),
                                    seq_slice(dvb, st.k0, st.k1), st.mask, scale);
    }
    // The traveling buffer for this block arrives from the previous rank (posted last step).
    dkv_recv.wait();
    if (busy)
      for (std::size_t i = 0; i < blk.size(); ++i) travel[i] += blk[i];
    dkv_send.wait();  // `spare` was last step's outgoing buffer: free it before receiving into it
    dkv_send = comm::isend(comm, std::span<Acc const>(travel, std::size_t(2 * kv_elems)), next);
    dkv_recv = comm::irecv(comm, std::span<Acc>(spare, std::size_t(2 * kv_elems)), prev);
    std::swap(travel, spare);
    if (s + 1 < n) {
      send_w.wait();
      recv_w.wait();
      std::swap(cur, nxt);
    }
  }
  dkv_recv.wait();  // after N sends: our own block's complete dK/dV
  dkv_send.wait();
  copy_bshd(contiguous_bshd<Acc const>(travel, k.b, k.s, k.h, k.d), dk_acc);
  copy_bshd(contiguous_bshd<Acc const>(travel + kv_elems, k.b, k.s, k.h, k.d), dv_acc);
}

inline void check_ring_layout(seq_layout const& lay, int world, bool causal,
                              std::int64_t local_seq) {
  WEFT_EXPECTS(lay.ulysses_degree() == 1, "layout", "a ring layout (ulysses degree 1; use usp_*)",
               lay.ulysses_degree());
  WEFT_EXPECTS(lay.world() == world, "layout",
               ::weft::detail::concat("a layout over ", world, " ranks"), lay.world());
  WEFT_EXPECTS(
      causal || lay.kind() == layout_kind::contiguous, "layout",
      "contiguous for non-causal attention (zigzag and stripe exist to balance causal work)",
      to_string(lay.kind()));
  WEFT_EXPECTS_SHAPE(local_seq == lay.local_length(), "q",
                     ::weft::detail::concat("local sequence length ", lay.local_length()),
                     local_seq);
}

}  // namespace detail

//! Ring attention forward. Each rank passes its shard under `layout` (q [B, c, Hq, D], k, v
//! [B, c, Hkv, D] with c = layout.local_length()) and gets its rows of the global output o and
//! lse [B, Hq, c]. K/V (unreplicated under GQA) make N-1 hops; each hop's isend/irecv is posted
//! before the current block's compute. Non-causal attention needs the contiguous layout.
//! `comm` needs only rank, size, isend and irecv over host memory (comm::PointToPointIn<C,
//! host_space>; a communicator in another memory space is refused at compile time).
template <comm::PointToPoint C, HostTensorArg QV, HostTensorArg KV, HostTensorArg VV,
          HostTensorArg OV, HostTensorArg LV>
void ring_forward(C& comm, seq_layout const& layout, QV&& q_arg, KV&& k_arg, VV&& v_arg, OV&& o_arg,
                  LV&& lse_arg, attention_options const& opt = {}) {
  static_assert(detail::check_ring_communicator<C>());
  auto const q = detail::arg_view(q_arg);
  auto const k = detail::arg_view(k_arg);
  auto const v = detail::arg_view(v_arg);
  auto const o = detail::arg_view(o_arg);
  auto const lse = detail::arg_view(lse_arg);
  using T = std::remove_const_t<typename std::remove_cvref_t<QV>::element_type>;
  static_assert(
      std::is_same_v<std::remove_const_t<typename std::remove_cvref_t<KV>::element_type>, T> &&
          std::is_same_v<std::remove_const_t<typename std::remove_cvref_t<VV>::element_type>, T>,
      "weft: ring_forward needs q, k and v of one element type (K/V travel as it)");
  using Acc = compute_t<T>;
  auto const rq = detail::as_bshd(q, "q");
  auto const rk = detail::as_bshd(k, "k");
  auto const rv = detail::as_bshd(v, "v");
  auto const ro = detail::as_bshd(o, "o");
  auto const rl = detail::as_bhs(lse);
  detail::check_forward_shapes(rq, rk, rv, ro, rl);
  WEFT_EXPECTS_SHAPE(rk.s == rq.s, "k", ::weft::detail::concat("local length ", rq.s, " (as q)"),
                     rk.s);
  bool const causal = detail::is_causal(opt);
  detail::check_ring_layout(layout, comm.size(), causal, rq.s);
  double const scale = resolve_scale(opt.scale, rq.d);
  detail::check_agreement(comm,
                          detail::make_fingerprint<T>(detail::sp_entry::ring_forward, &layout,
                                                      causal, scale, rq.b, rq.s, rq.h, rk.h, rq.d),
                          "ring");
  std::vector<Acc> o_buf(std::size_t(rq.b * rq.s * rq.h * rq.d)),
      l_buf(std::size_t(rq.b * rq.h * rq.s));
  auto const oa = detail::contiguous_bshd(o_buf.data(), rq.b, rq.s, rq.h, rq.d);
  auto const la = detail::contiguous_bhs(l_buf.data(), rq.b, rq.h, rq.s);
  detail::ring_forward_impl<T const>(comm, layout.kind(), causal, detail::as_const(rq),
                                     detail::as_const(rk), detail::as_const(rv), oa, la, scale,
                                     host_executor(opt));
  detail::copy_bshd(detail::as_const(oa), ro);
  detail::copy_bhs(detail::as_const(la), rl);
}

//! Ring attention backward: this rank's dq (its rows) and dk, dv (its K/V rows, summed over every
//! rank's queries), from its shard of q, k, v, the forward's o and lse, and dout. dK/dV travel in
//! the accumulation type and reach their owner after N sends. `comm` as for ring_forward.
template <comm::PointToPoint C, HostTensorArg QV, HostTensorArg KV, HostTensorArg VV,
          HostTensorArg OV, HostTensorArg LV, HostTensorArg GV, HostTensorArg DQV,
          HostTensorArg DKV, HostTensorArg DVV>
void ring_backward(C& comm, seq_layout const& layout, QV&& q_arg, KV&& k_arg, VV&& v_arg,
                   OV&& o_arg, LV&& lse_arg, GV&& dout_arg, DQV&& dq_arg, DKV&& dk_arg,
                   DVV&& dv_arg, attention_options const& opt = {}) {
  static_assert(detail::check_ring_communicator<C>());
  auto const q = detail::arg_view(q_arg);
  auto const k = detail::arg_view(k_arg);
  auto const v = detail::arg_view(v_arg);
  auto const o = detail::arg_view(o_arg);
  auto const lse = detail::arg_view(lse_arg);
  auto const dout = detail::arg_view(dout_arg);
  auto const dq = detail::arg_view(dq_arg);
  auto const dk = detail::arg_view(dk_arg);
  auto const dv = detail::arg_view(dv_arg);
  using T = std::remove_const_t<typename std::remove_cvref_t<QV>::element_type>;
  static_assert(
      std::is_same_v<std::remove_const_t<typename std::remove_cvref_t<KV>::element_type>, T> &&
          std::is_same_v<std::remove_const_t<typename std::remove_cvref_t<VV>::element_type>, T>,
      "weft: ring_backward needs q, k and v of one element type (K/V travel as it)");
  using Acc = compute_t<T>;
  auto const rq = detail::as_bshd(q, "q");
  auto const rk = detail::as_bshd(k, "k");
  auto const rv = detail::as_bshd(v, "v");
  auto const ro = detail::as_bshd(o, "o");
  auto const rl = detail::as_bhs(lse);
  auto const rg = detail::as_bshd(dout, "dout");
  auto const rdq = detail::as_bshd(dq, "dq");
  auto const rdk = detail::as_bshd(dk, "dk");
  auto const rdv = detail::as_bshd(dv, "dv");
  detail::check_forward_shapes(rq, rk, rv, ro, rl);
  detail::check_gradient_shapes(rq, rk, rg, rdq, rdk, rdv);
  WEFT_EXPECTS_SHAPE(rk.s == rq.s, "k", ::weft::detail::concat("local length ", rq.s, " (as q)"),
                     rk.s);
  bool const causal = detail::is_causal(opt);
  detail::check_ring_layout(layout, comm.size(), causal, rq.s);
  double const scale = resolve_scale(opt.scale, rq.d);
  detail::check_agreement(comm,
                          detail::make_fingerprint<T>(detail::sp_entry::ring_backward, &layout,
                                                      causal, scale, rq.b, rq.s, rq.h, rk.h, rq.d),
                          "ring");
  std::vector<Acc> gq(std::size_t(rq.b * rq.s * rq.h * rq.d)),
      gk(std::size_t(rk.b * rk.s * rk.h * rk.d)), gv(gk.size());
  auto const aq = detail::contiguous_bshd(gq.data(), rq.b, rq.s, rq.h, rq.d);
  auto const ak = detail::contiguous_bshd(gk.data(), rk.b, rk.s, rk.h, rk.d);
  auto const av = detail::contiguous_bshd(gv.data(), rk.b, rk.s, rk.h, rk.d);
  detail::ring_backward_impl<T const>(comm, layout.kind(), causal, detail::as_const(rq),
                                      detail::as_const(rk), detail::as_const(rv),
                                      detail::as_const(ro), detail::as_const(rl),
                                      detail::as_const(rg), aq, ak, av, scale, host_executor(opt));
  detail::copy_bshd(detail::as_const(aq), rdq);
  detail::copy_bshd(detail::as_const(ak), rdk);
  detail::copy_bshd(detail::as_const(av), rdv);
}

}  // namespace weft::attention
