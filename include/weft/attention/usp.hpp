// weft/attention/usp.hpp — USP, the 2-D hybrid of Ulysses and ring attention: an all-to-all over
// a Ulysses group of u ranks gathers each ring rank's chunk for H/u heads, a (zigzag) ring over r
// ranks runs on it, and a second all-to-all returns the rows; on two communicators (the Ulysses one
// collective, the ring one point-to-point, both over host memory) or a device_mesh.
#pragma once

#include <weft/attention/args.hpp>
#include <weft/attention/agreement.hpp>
#include <weft/attention/common.hpp>
#include <weft/attention/sharding.hpp>
#include <weft/attention/ring.hpp>
#include <weft/attention/ulysses.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/error.hpp>
#include <weft/mesh/device_mesh.hpp>

#include <string_view>
#include <type_traits>
#include <utility>

namespace weft::attention {

namespace detail {

inline void check_usp_layout(seq_layout const& lay, int u, int r, bool causal,
                             std::int64_t local_seq) {
  WEFT_EXPECTS(
      lay.ulysses_degree() == u, "layout",
      ::weft::detail::concat("a USP layout with Ulysses degree ", u, " (the Ulysses group size)"),
      lay.ulysses_degree());
  WEFT_EXPECTS(
      lay.ring_degree() == r, "layout",
      ::weft::detail::concat("a USP layout with ring degree ", r, " (the ring group size)"),
      lay.ring_degree());
  WEFT_EXPECTS(causal || lay.kind() == layout_kind::contiguous, "layout",
               "contiguous inner layout for non-causal attention", to_string(lay.kind()));
  WEFT_EXPECTS_SHAPE(local_seq == lay.local_length(), "q",
                     ::weft::detail::concat("local sequence length ", lay.local_length()),
                     local_seq);
}

}  // namespace detail

//! USP forward on the Ulysses group `ulysses` (size u) and the ring group `ring` (size r). This
//! rank holds the rows of `layout` (a seq_layout::usp(u, r, ...)) for global layout rank
//! ring.rank()·u + ulysses.rank(). Head rules are Ulysses' (Hq % u == 0; Hkv divisible by u or
//! dividing it); the ring carries the (possibly replicated) H_kv/u heads unreplicated further.
//! `ulysses` needs comm::CollectiveIn<U, host_space>, `ring` only comm::PointToPointIn<R,
//! host_space>; other memory spaces are refused at compile time.
template <comm::Collective U, comm::PointToPoint R, HostTensorArg QV, HostTensorArg KV,
          HostTensorArg VV, HostTensorArg OV, HostTensorArg LV>
void usp_forward(U& ulysses, R& ring, seq_layout const& layout, QV&& q_arg, KV&& k_arg, VV&& v_arg,
                 OV&& o_arg, LV&& lse_arg, attention_options const& opt = {}) {
  static_assert(detail::check_ulysses_communicator<U>() && detail::check_ring_communicator<R>());
  auto const q = detail::arg_view(q_arg);
  auto const k = detail::arg_view(k_arg);
  auto const v = detail::arg_view(v_arg);
  auto const o = detail::arg_view(o_arg);
  auto const lse = detail::arg_view(lse_arg);
  using T = std::remove_const_t<typename std::remove_cvref_t<QV>::element_type>;
  static_assert(
      std::is_same_v<std::remove_const_t<typename std::remove_cvref_t<KV>::element_type>, T> &&
          std::is_same_v<std::remove_const_t<typename std::remove_cvref_t<VV>::element_type>, T>,
      "weft: usp_forward needs q, k and v of one element type");
  detail::check_forward_args(q, k, v, o, lse);
  auto const rq = detail::const_bshd(q, "q");
  bool const causal = detail::is_causal(opt);
  detail::check_usp_layout(layout, ulysses.size(), ring.size(), causal, rq.s);
  std::int64_t const hk = detail::as_bshd(k, "k").h;
  (void)ulysses_heads::make(ulysses.size(), rq.h, hk);
  double const scale = resolve_scale(opt.scale, rq.d);
  detail::check_agreement_2d(
      ulysses, ring,
      detail::make_fingerprint<T>(detail::sp_entry::usp_forward, &layout, causal, scale, rq.b, rq.s,
                                  rq.h, hk, rq.d));
  exec::host const ex = host_executor(opt);
  layout_kind const kind = layout.kind();
  detail::ulysses_forward_impl(
      ulysses, rq, detail::const_bshd(k, "k"), detail::const_bshd(v, "v"), detail::as_bshd(o, "o"),
      detail::as_bhs(lse), [&](auto qq, auto kk, auto vv, auto oo, auto ll) {
        detail::ring_forward_impl<T const>(ring, kind, causal, qq, kk, vv, oo, ll, scale, ex);
      });
}

//! USP backward; arguments as usp_forward plus ring_backward's.
template <comm::Collective U, comm::PointToPoint R, HostTensorArg QV, HostTensorArg KV,
          HostTensorArg VV, HostTensorArg OV, HostTensorArg LV, HostTensorArg GV, HostTensorArg DQV,
          HostTensorArg DKV, HostTensorArg DVV>
void usp_backward(U& ulysses, R& ring, seq_layout const& layout, QV&& q_arg, KV&& k_arg, VV&& v_arg,
                  OV&& o_arg, LV&& lse_arg, GV&& dout_arg, DQV&& dq_arg, DKV&& dk_arg, DVV&& dv_arg,
                  attention_options const& opt = {}) {
  static_assert(detail::check_ulysses_communicator<U>() && detail::check_ring_communicator<R>());
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
      "weft: usp_backward needs q, k and v of one element type");
  detail::check_backward_args(q, k, v, o, lse, dout, dq, dk, dv);
  auto const rq = detail::const_bshd(q, "q");
  bool const causal = detail::is_causal(opt);
  detail::check_usp_layout(layout, ulysses.size(), ring.size(), causal, rq.s);
  std::int64_t const hk = detail::as_bshd(k, "k").h;
  (void)ulysses_heads::make(ulysses.size(), rq.h, hk);
  double const scale = resolve_scale(opt.scale, rq.d);
  detail::check_agreement_2d(
      ulysses, ring,
      detail::make_fingerprint<T>(detail::sp_entry::usp_backward, &layout, causal, scale, rq.b,
                                  rq.s, rq.h, hk, rq.d));
  exec::host const ex = host_executor(opt);
  layout_kind const kind = layout.kind();
  detail::ulysses_backward_impl(
      ulysses, rq, detail::const_bshd(k, "k"), detail::const_bshd(v, "v"),
      detail::const_bshd(o, "o"), detail::as_const(detail::as_bhs(lse)),
      detail::const_bshd(dout, "dout"), detail::as_bshd(dq, "dq"), detail::as_bshd(dk, "dk"),
      detail::as_bshd(dv, "dv"),
      [&](auto qq, auto kk, auto vv, auto oo, auto ll, auto gg, auto dqq, auto dkk, auto dvv) {
        detail::ring_backward_impl<T const>(ring, kind, causal, qq, kk, vv, oo, ll, gg, dqq, dkk,
                                            dvv, scale, ex);
      });
}

//! The global layout rank of this process in a USP mesh: ring coordinate · u + Ulysses coordinate.
template <comm::SplittableGroup C>
int usp_layout_rank(device_mesh<C>& mesh, std::string_view ulysses_axis,
                    std::string_view ring_axis) {
  return mesh.local_rank(ring_axis) * mesh.size(ulysses_axis) + mesh.local_rank(ulysses_axis);
}

//! USP forward over two axes of a device_mesh (Ulysses over `ulysses_axis`, ring over `ring_axis`);
//! the tensors and options are usp_forward's, views or owning weft::tensors alike.
template <comm::Collective C, HostTensorArg QV, HostTensorArg KV, HostTensorArg VV,
          HostTensorArg OV, HostTensorArg LV>
void usp_forward(device_mesh<C>& mesh, std::string_view ulysses_axis, std::string_view ring_axis,
                 seq_layout const& layout, QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse,
                 attention_options const& opt = {}) {
  WEFT_EXPECTS(ulysses_axis != ring_axis, "ring_axis", "an axis other than the Ulysses axis",
               ring_axis);
  usp_forward(mesh.group(ulysses_axis), mesh.group(ring_axis), layout, std::forward<QV>(q),
              std::forward<KV>(k), std::forward<VV>(v), std::forward<OV>(o), std::forward<LV>(lse),
              opt);
}

//! USP backward over two axes of a device_mesh; the tensors and options are usp_backward's.
template <comm::Collective C, HostTensorArg QV, HostTensorArg KV, HostTensorArg VV,
          HostTensorArg OV, HostTensorArg LV, HostTensorArg GV, HostTensorArg DQV,
          HostTensorArg DKV, HostTensorArg DVV>
void usp_backward(device_mesh<C>& mesh, std::string_view ulysses_axis, std::string_view ring_axis,
                  seq_layout const& layout, QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse, GV&& dout,
                  DQV&& dq, DKV&& dk, DVV&& dv, attention_options const& opt = {}) {
  WEFT_EXPECTS(ulysses_axis != ring_axis, "ring_axis", "an axis other than the Ulysses axis",
               ring_axis);
  usp_backward(mesh.group(ulysses_axis), mesh.group(ring_axis), layout, std::forward<QV>(q),
               std::forward<KV>(k), std::forward<VV>(v), std::forward<OV>(o), std::forward<LV>(lse),
               std::forward<GV>(dout), std::forward<DQV>(dq), std::forward<DKV>(dk),
               std::forward<DVV>(dv), opt);
}

}  // namespace weft::attention
