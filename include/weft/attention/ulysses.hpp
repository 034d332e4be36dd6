// weft/attention/ulysses.hpp — Ulysses (DeepSpeed) sequence parallelism over any collective
// communicator in host memory: an all-to-all turns contiguous sequence shards into head shards of
// the full sequence, local flash attention runs there, and a second all-to-all turns the result
// back; forward and backward.
#pragma once

#include <weft/attention/args.hpp>
#include <weft/attention/agreement.hpp>
#include <weft/attention/common.hpp>
#include <weft/attention/flash.hpp>
#include <weft/attention/ring.hpp>
#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/error.hpp>
#include <weft/core/tensor.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::attention {

//! Which heads of q and of k/v each of `degree` ranks gets after the sequence-to-head all-to-all.
//! Query heads split evenly (Hq % degree == 0). KV heads split evenly when Hkv % degree == 0;
//! when degree % Hkv == 0 instead, rank p gets one replica of KV head p·Hkv/degree — exactly the
//! head its query heads use — and the replicas' gradients are summed on the way back.
struct ulysses_heads {
  int degree = 1;
  std::int64_t hq = 0, hk = 0;
  [[nodiscard]] std::int64_t local_q() const noexcept { return hq / degree; }
  [[nodiscard]] std::int64_t local_k() const noexcept { return replicated() ? 1 : hk / degree; }
  [[nodiscard]] bool replicated() const noexcept { return hk % degree != 0; }
  [[nodiscard]] std::int64_t q_head(int p, std::int64_t j) const noexcept {
    return p * local_q() + j;
  }
  [[nodiscard]] std::int64_t k_head(int p, std::int64_t j) const noexcept {
    return replicated() ? p * hk / degree : p * local_k() + j;
  }

  static ulysses_heads make(int degree, std::int64_t hq, std::int64_t hk) {
    WEFT_EXPECTS_SHAPE(
        hq % degree == 0, "q",
        ::weft::detail::concat("a query head count divisible by the Ulysses degree ", degree),
        ::weft::detail::concat(hq, " heads"));
    WEFT_EXPECTS_SHAPE(
        hk % degree == 0 || degree % hk == 0, "k",
        ::weft::detail::concat(
            "a KV head count that divides or is divisible by the Ulysses degree ", degree),
        ::weft::detail::concat(hk, " heads"));
    return {degree, hq, hk};
  }
};

namespace detail {

//! What Ulysses (and USP's Ulysses group) asks of a communicator, checked at the entry points so
//! the diagnostic names the requirement: a Collective over host memory (all_to_all of host
//! arrays, and all_gather for the entry check).
template <class C>
constexpr bool check_ulysses_communicator() {
  static_assert(comm::CollectiveIn<C, host_space>,
                "weft: Ulysses attention needs a collective communicator over host memory "
                "(comm::CollectiveIn<C, host_space>); this communicator's memory_space is another "
                "one (e.g. an NCCL communicator)");
  return true;
}

//! [B, c, H, D] sequence shards -> [B, N·c, hl, D] with the heads head(p, j) for this rank; the
//! result's rows are the sources' rows in rank order.
template <class E, class HeadFn, comm::CollectiveIn<host_space> C>
std::vector<E> a2a_seq_to_head(C& comm, bshd<E const> x, std::int64_t hl, HeadFn head) {
  int const n = comm.size(), me = comm.rank();
  index_t const piece = x.b * x.s * hl * x.d;
  std::vector<E> send(std::size_t(piece * n)), recv(send.size()), full(send.size());
  for (int p = 0; p < n; ++p) {
    auto dst = contiguous_bshd(send.data() + p * piece, x.b, x.s, hl, x.d);
    for (index_t b = 0; b < x.b; ++b)
      for (index_t s = 0; s < x.s; ++s)
        for (index_t j = 0; j < hl; ++j) {
          E const* a = x.row(b, s, head(p, j));
          std::copy(a, a + x.d, dst.row(b, s, j));
        }
  }
  comm::all_to_all(comm, std::as_const(send), recv).wait();
  auto out = contiguous_bshd(full.data(), x.b, x.s * n, hl, x.d);
  for (int p = 0; p < n; ++p) {
    auto src = contiguous_bshd<E const>(recv.data() + p * piece, x.b, x.s, hl, x.d);
    copy_bshd(src, seq_slice(out, p * x.s, (p + 1) * x.s));
  }
  (void)me;
  return full;
}

//! The inverse: [B, N·c, hl, D] (Acc or E) -> this rank's [B, c, H, D]; with `add`, replicas of a
//! head are summed in source-rank order (deterministic), else assigned.
template <class E, class Out, class HeadFn, comm::CollectiveIn<host_space> C>
void a2a_head_to_seq(C& comm, bshd<E const> full, bshd<Out> x, HeadFn head, bool add) {
  int const n = comm.size();
  index_t const c = x.s, hl = full.h;
  index_t const piece = x.b * c * hl * x.d;
  std::vector<std::remove_const_t<E>> send(std::size_t(piece * n)), recv(send.size());
  for (int p = 0; p < n; ++p)
    copy_bshd(seq_slice(full, p * c, (p + 1) * c),
              contiguous_bshd(send.data() + p * piece, x.b, c, hl, x.d));
  comm::all_to_all(comm, std::as_const(send), recv).wait();
  if (add) zero_rows(x);
  for (int p = 0; p < n; ++p) {
    auto src = contiguous_bshd<E const>(recv.data() + p * piece, x.b, c, hl, x.d);
    for (index_t b = 0; b < x.b; ++b)
      for (index_t s = 0; s < c; ++s)
        for (index_t j = 0; j < hl; ++j) {
          E const* a = src.row(b, s, j);
          Out* z = x.row(b, s, head(p, j));
          for (index_t d = 0; d < x.d; ++d)
            z[d] = add ? static_cast<Out>(static_cast<compute_t<Out>>(z[d]) +
                                          static_cast<compute_t<Out>>(a[d]))
                       : static_cast<Out>(a[d]);
        }
  }
}

//! LSE [B, H, c] -> [B, hl, N·c] (backward needs the LSE in head layout).
template <class L, comm::CollectiveIn<host_space> C>
std::vector<std::remove_const_t<L>> a2a_lse_seq_to_head(C& comm, bhs<L> x,
                                                        ulysses_heads const& uh) {
  using E = std::remove_const_t<L>;
  int const n = comm.size();
  index_t const c = x.s, hl = uh.local_q(), piece = x.b * hl * c;
  std::vector<E> send(std::size_t(piece * n)), recv(send.size()), full(send.size());
  for (int p = 0; p < n; ++p)
    for (index_t b = 0; b < x.b; ++b)
      for (index_t j = 0; j < hl; ++j)
        for (index_t s = 0; s < c; ++s)
          send[std::size_t(p * piece + (b * hl + j) * c + s)] = x.at(b, uh.q_head(p, j), s);
  comm::all_to_all(comm, std::as_const(send), recv).wait();
  for (int p = 0; p < n; ++p)
    for (index_t b = 0; b < x.b; ++b)
      for (index_t j = 0; j < hl; ++j)
        for (index_t s = 0; s < c; ++s)
          full[std::size_t((b * hl + j) * (n * c) + p * c + s)] =
              recv[std::size_t(p * piece + (b * hl + j) * c + s)];
  return full;
}

//! LSE [B, hl, N·c] -> this rank's [B, H, c].
template <class L, class Out, comm::CollectiveIn<host_space> C>
void a2a_lse_head_to_seq(C& comm, bhs<L const> full, bhs<Out> x, ulysses_heads const& uh) {
  int const n = comm.size();
  index_t const c = x.s, hl = full.h, piece = x.b * hl * c;
  std::vector<L> send(std::size_t(piece * n)), recv(send.size());
  for (int p = 0; p < n; ++p)
    for (index_t b = 0; b < x.b; ++b)
      for (index_t j = 0; j < hl; ++j)
        for (index_t s = 0; s < c; ++s)
          send[std::size_t(p * piece + (b * hl + j) * c + s)] = full.at(b, j, p * c + s);
  comm::all_to_all(comm, std::as_const(send), recv).wait();
  for (int p = 0; p < n; ++p)
    for (index_t b = 0; b < x.b; ++b)
      for (index_t j = 0; j < hl; ++j)
        for (index_t s = 0; s < c; ++s)
          x.at(b, uh.q_head(p, j), s) =
              static_cast<Out>(recv[std::size_t(p * piece + (b * hl + j) * c + s)]);
}

//! Ulysses forward around an inner attention `inner(q, k, v, o_acc, lse_acc)` on the head-sharded
//! full (or ring-chunk) sequence.
template <class T, class O, class L, class Inner, comm::CollectiveIn<host_space> C>
void ulysses_forward_impl(C& comm, bshd<T const> q, bshd<T const> k, bshd<T const> v, bshd<O> o,
                          bhs<L> lse, Inner&& inner) {
  using Acc = compute_t<T>;
  auto const uh = ulysses_heads::make(comm.size(), q.h, k.h);
  int const n = comm.size();
  index_t const sf = q.s * n, hq = uh.local_q(), hk = uh.local_k();
  auto qh = a2a_seq_to_head(comm, q, hq, [&](int p, index_t j) { return uh.q_head(p, j); });
  auto kh = a2a_seq_to_head(comm, k, hk, [&](int p, index_t j) { return uh.k_head(p, j); });
  auto vh = a2a_seq_to_head(comm, v, hk, [&](int p, index_t j) { return uh.k_head(p, j); });
  std::vector<Acc> oh(std::size_t(q.b * sf * hq * q.d)), lh(std::size_t(q.b * hq * sf));
  auto const ov = contiguous_bshd(oh.data(), q.b, sf, hq, q.d);
  auto const lv = contiguous_bhs(lh.data(), q.b, hq, sf);
  inner(contiguous_bshd<T const>(qh.data(), q.b, sf, hq, q.d),
        contiguous_bshd<T const>(kh.data(), q.b, sf, hk, q.d),
        contiguous_bshd<T const>(vh.data(), q.b, sf, hk, q.d), ov, lv);
  // The output travels back in the accumulation type, so the caller's o rounds once.
  a2a_head_to_seq(
      comm, as_const(ov), o, [&](int p, index_t j) { return uh.q_head(p, j); }, false);
  a2a_lse_head_to_seq(comm, as_const(lv), lse, uh);
}

//! Ulysses backward around `inner(q, k, v, o, lse, dout, dq_acc, dk_acc, dv_acc)` (overwrites).
template <class T, class O, class L, class G, class DQ, class DK, class DV, class Inner,
          comm::CollectiveIn<host_space> C>
void ulysses_backward_impl(C& comm, bshd<T const> q, bshd<T const> k, bshd<T const> v,
                           bshd<O const> o, bhs<L const> lse, bshd<G const> dout, bshd<DQ> dq,
                           bshd<DK> dk, bshd<DV> dv, Inner&& inner) {
  using Acc = compute_t<T>;
  auto const uh = ulysses_heads::make(comm.size(), q.h, k.h);
  int const n = comm.size();
  index_t const sf = q.s * n, hq = uh.local_q(), hk = uh.local_k();
  auto qf = [&](int p, index_t j) { return uh.q_head(p, j); };
  auto kf = [&](int p, index_t j) { return uh.k_head(p, j); };
  auto qh = a2a_seq_to_head(comm, q, hq, qf);
  auto kh = a2a_seq_to_head(comm, k, hk, kf);
  auto vh = a2a_seq_to_head(comm, v, hk, kf);
  auto oh = a2a_seq_to_head(comm, o, hq, qf);
  auto gh = a2a_seq_to_head(comm, dout, hq, qf);
  auto lh = a2a_lse_seq_to_head(comm, lse, uh);
  using OE = std::remove_const_t<O>;
  using GE = std::remove_const_t<G>;
  using LE = std::remove_const_t<L>;
  std::vector<Acc> gq(std::size_t(q.b * sf * hq * q.d)), gk(std::size_t(q.b * sf * hk * q.d)),
      gv(gk.size());
  auto const dqv = contiguous_bshd(gq.data(), q.b, sf, hq, q.d);
  auto const dkv = contiguous_bshd(gk.data(), q.b, sf, hk, q.d);
  auto const dvv = contiguous_bshd(gv.data(), q.b, sf, hk, q.d);
  inner(contiguous_bshd<T const>(qh.data(), q.b, sf, hq, q.d),
        contiguous_bshd<T const>(kh.data(), q.b, sf, hk, q.d),
        contiguous_bshd<T const>(vh.data(), q.b, sf, hk, q.d),
        contiguous_bshd<OE const>(oh.data(), q.b, sf, hq, q.d),
        contiguous_bhs<LE const>(lh.data(), q.b, hq, sf),
        contiguous_bshd<GE const>(gh.data(), q.b, sf, hq, q.d), dqv, dkv, dvv);
  a2a_head_to_seq(comm, as_const(dqv), dq, qf, false);
  // Replicated KV heads: every replica's gradient comes home and they add up.
  a2a_head_to_seq(comm, as_const(dkv), dk, kf, uh.replicated());
  a2a_head_to_seq(comm, as_const(dvv), dv, kf, uh.replicated());
}

template <class V>
auto const_bshd(V const& v, char const* name) {
  return as_const(as_bshd(v, name));
}

template <class QV, class KV, class VV, class OV, class LV>
void check_forward_args(QV const& q, KV const& k, VV const& v, OV const& o, LV const& lse) {
  auto const rq = as_bshd(q, "q");
  auto const rk = as_bshd(k, "k");
  // The checks of every forward entry point, the head dimension and finite q and k included.
  check_forward_shapes(rq, rk, as_bshd(v, "v"), as_bshd(o, "o"), as_bhs(lse));
  WEFT_EXPECTS_SHAPE(rk.s == rq.s, "k", ::weft::detail::concat("local length ", rq.s, " (as q)"),
                     rk.s);
}

template <class QV, class KV, class VV, class OV, class LV, class GV, class DQV, class DKV,
          class DVV>
void check_backward_args(QV const& q, KV const& k, VV const& v, OV const& o, LV const& lse,
                         GV const& dout, DQV const& dq, DKV const& dk, DVV const& dv) {
  check_forward_args(q, k, v, o, lse);
  auto const rq = as_bshd(q, "q");
  auto const rk = as_bshd(k, "k");
  check_same_shape(rq, as_bshd(dout, "dout"), "dout");
  check_same_shape(rq, as_bshd(dq, "dq"), "dq");
  check_same_shape(rk, as_bshd(dk, "dk"), "dk");
  check_same_shape(rk, as_bshd(dv, "dv"), "dv");
}

}  // namespace detail

//! Ulysses attention forward. Rank p holds the contiguous sequence shard p (q [B, c, Hq, D], k, v
//! [B, c, Hkv, D]); Hq must be divisible by the group size N, and Hkv divisible by N or dividing
//! it (then KV heads are replicated N/Hkv times). o [B, c, Hq, D] and lse [B, Hq, c] are this
//! rank's rows of single-device attention over the whole sequence.
template <comm::Collective C, HostTensorArg QV, HostTensorArg KV, HostTensorArg VV,
          HostTensorArg OV, HostTensorArg LV>
void ulysses_forward(C& comm, QV&& q_arg, KV&& k_arg, VV&& v_arg, OV&& o_arg, LV&& lse_arg,
                     attention_options const& opt = {}) {
  static_assert(detail::check_ulysses_communicator<C>());
  auto const q = detail::arg_view(q_arg);
  auto const k = detail::arg_view(k_arg);
  auto const v = detail::arg_view(v_arg);
  auto const o = detail::arg_view(o_arg);
  auto const lse = detail::arg_view(lse_arg);
  using T = std::remove_const_t<typename std::remove_cvref_t<QV>::element_type>;
  static_assert(
      std::is_same_v<std::remove_const_t<typename std::remove_cvref_t<KV>::element_type>, T> &&
          std::is_same_v<std::remove_const_t<typename std::remove_cvref_t<VV>::element_type>, T>,
      "weft: ulysses_forward needs q, k and v of one element type");
  detail::check_forward_args(q, k, v, o, lse);
  auto const rq = detail::const_bshd(q, "q");
  std::int64_t const hk = detail::as_bshd(k, "k").h;
  (void)ulysses_heads::make(comm.size(), rq.h, hk);
  double const scale = resolve_scale(opt.scale, rq.d);
  mask_rule const mask{opt.causal != causal_mode::none, 0};
  detail::check_agreement(
      comm,
      detail::make_fingerprint<T>(detail::sp_entry::ulysses_forward, nullptr, mask.causal, scale,
                                  rq.b, rq.s, rq.h, hk, rq.d),
      "Ulysses");
  exec::host const ex = host_executor(opt);
  detail::ulysses_forward_impl(comm, rq, detail::const_bshd(k, "k"), detail::const_bshd(v, "v"),
                               detail::as_bshd(o, "o"), detail::as_bhs(lse),
                               [&](auto qq, auto kk, auto vv, auto oo, auto ll) {
                                 detail::flash_forward_raw(ex, qq, kk, vv, oo, ll, mask, scale);
                               });
}

//! Ulysses attention backward: dq, dk, dv of this rank's shard (overwritten).
template <comm::Collective C, HostTensorArg QV, HostTensorArg KV, HostTensorArg VV,
          HostTensorArg OV, HostTensorArg LV, HostTensorArg GV, HostTensorArg DQV,
          HostTensorArg DKV, HostTensorArg DVV>
void ulysses_backward(C& comm, QV&& q_arg, KV&& k_arg, VV&& v_arg, OV&& o_arg, LV&& lse_arg,
                      GV&& dout_arg, DQV&& dq_arg, DKV&& dk_arg, DVV&& dv_arg,
                      attention_options const& opt = {}) {
  static_assert(detail::check_ulysses_communicator<C>());
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
      "weft: ulysses_backward needs q, k and v of one element type");
  detail::check_backward_args(q, k, v, o, lse, dout, dq, dk, dv);
  auto const rq = detail::const_bshd(q, "q");
  std::int64_t const hk = detail::as_bshd(k, "k").h;
  (void)ulysses_heads::make(comm.size(), rq.h, hk);
  double const scale = resolve_scale(opt.scale, rq.d);
  mask_rule const mask{opt.causal != causal_mode::none, 0};
  detail::check_agreement(
      comm,
      detail::make_fingerprint<T>(detail::sp_entry::ulysses_backward, nullptr, mask.causal, scale,
                                  rq.b, rq.s, rq.h, hk, rq.d),
      "Ulysses");
  exec::host const ex = host_executor(opt);
  detail::ulysses_backward_impl(
      comm, rq, detail::const_bshd(k, "k"), detail::const_bshd(v, "v"), detail::const_bshd(o, "o"),
      detail::as_const(detail::as_bhs(lse)), detail::const_bshd(dout, "dout"),
      detail::as_bshd(dq, "dq"), detail::as_bshd(dk, "dk"), detail::as_bshd(dv, "dv"),
      [&](auto qq, auto kk, auto vv, auto oo, auto ll, auto gg, auto dqq, auto dkk, auto dvv) {
        detail::zero_rows(dqq);
        detail::zero_rows(dkk);
        detail::zero_rows(dvv);
        detail::flash_backward_accumulate_raw(ex, qq, kk, vv, oo, ll, gg, dqq, dkk, dvv, mask,
                                              scale);
      });
}

}  // namespace weft::attention
