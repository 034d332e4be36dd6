// weft/attention/reference.hpp — the plain fp64 materialised-softmax attention, forward and
// backward, that the flash kernels and the distributed schemes are tested against. One query row
// at a time (the [Sq, Sk] matrix is formed row by row), fp64 throughout; slow by design.
#pragma once

#include <weft/attention/common.hpp>
#include <weft/attention/softmax_state.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace weft::attention {

namespace detail {

// Every quantity is computed from its definition: P_ij = exp(S_ij - L_i) with L from the full row,
// dS = P (dP - sum_j P dP), never the D = rowsum(dO * O) shortcut the kernels use.
template <class Q, class K, class V, class O, class L>
void reference_forward_raw(bshd<Q> q, bshd<K> k, bshd<V> v, bshd<O> o, bhs<L> lse, mask_rule mask,
                           double scale) {
  std::int64_t const group = q.h / k.h;
  std::vector<double> s_buf(static_cast<std::size_t>(k.s));
  std::vector<double> acc_buf(static_cast<std::size_t>(q.d));
  double* const s = s_buf.data();
  double* const acc = acc_buf.data();
  double const ninf = -std::numeric_limits<double>::infinity();
  for (std::int64_t b = 0; b < q.b; ++b)
    for (std::int64_t h = 0; h < q.h; ++h)
      for (std::int64_t i = 0; i < q.s; ++i) {
        auto const* qi = q.row(b, i, h);
        double mx = ninf;
        for (std::int64_t j = 0; j < k.s; ++j) {
          if (!mask.visible(i, j)) {
            s[j] = ninf;
            continue;
          }
          auto const* kj = k.row(b, j, h / group);
          double dot = 0;
          for (std::int64_t c = 0; c < q.d; ++c) dot += double(qi[c]) * double(kj[c]);
          s[j] = dot * scale;
          if (s[j] > mx) mx = s[j];
        }
        auto* oi = o.row(b, i, h);
        if (mx == ninf) {  // fully masked row
          for (std::int64_t c = 0; c < q.d; ++c) oi[c] = O(0.0);
          lse.at(b, h, i) = L(ninf);
          continue;
        }
        double sum = 0;
        for (std::int64_t j = 0; j < k.s; ++j) sum += s[j] == ninf ? 0.0 : std::exp(s[j] - mx);
        double const l = mx + std::log(sum);
        for (std::int64_t c = 0; c < q.d; ++c) acc[c] = 0;
        for (std::int64_t j = 0; j < k.s; ++j) {
          if (s[j] == ninf) continue;
          double const p = std::exp(s[j] - l);
          auto const* vj = v.row(b, j, h / group);
          for (std::int64_t c = 0; c < q.d; ++c) acc[c] += p * double(vj[c]);
        }
        for (std::int64_t c = 0; c < q.d; ++c) oi[c] = O(acc[c]);
        lse.at(b, h, i) = L(l);
      }
}

// Gradients are accumulated in fp64 buffers and written once, so narrow outputs round once.
template <class Q, class K, class V, class G, class DQ, class DK, class DV>
void reference_backward_raw(bshd<Q> q, bshd<K> k, bshd<V> v, bshd<G> dout, bshd<DQ> dq, bshd<DK> dk,
                            bshd<DV> dv, mask_rule mask, double scale) {
  std::int64_t const group = q.h / k.h;
  std::int64_t const d = q.d;
  std::vector<double> gq(static_cast<std::size_t>(q.b * q.s * q.h * d), 0.0);
  std::vector<double> gk(static_cast<std::size_t>(k.b * k.s * k.h * d), 0.0);
  std::vector<double> gv(gk.size(), 0.0);
  auto kidx = [&](std::int64_t b, std::int64_t j, std::int64_t hk) {
    return static_cast<std::size_t>(((b * k.s + j) * k.h + hk) * d);
  };
  std::vector<double> s_buf(static_cast<std::size_t>(k.s)), dp_buf(static_cast<std::size_t>(k.s));
  double* const s = s_buf.data();
  double* const dp = dp_buf.data();
  double const ninf = -std::numeric_limits<double>::infinity();
  for (std::int64_t b = 0; b < q.b; ++b)
    for (std::int64_t h = 0; h < q.h; ++h) {
      std::int64_t const hk = h / group;
      for (std::int64_t i = 0; i < q.s; ++i) {
        auto const* qi = q.row(b, i, h);
        auto const* gi = dout.row(b, i, h);
        double mx = ninf;
        for (std::int64_t j = 0; j < k.s; ++j) {
          if (!mask.visible(i, j)) {
            s[j] = ninf;
            continue;
          }
          auto const* kj = k.row(b, j, hk);
          double dot = 0;
          for (std::int64_t c = 0; c < d; ++c) dot += double(qi[c]) * double(kj[c]);
          s[j] = dot * scale;
          if (s[j] > mx) mx = s[j];
        }
        if (mx == ninf) continue;  // empty row: no gradient flows
        double sum = 0;
        for (std::int64_t j = 0; j < k.s; ++j) sum += s[j] == ninf ? 0.0 : std::exp(s[j] - mx);
        double const l = mx + std::log(sum);
        double pdp = 0;  // sum_j P_ij dP_ij
        for (std::int64_t j = 0; j < k.s; ++j) {
          if (s[j] == ninf) {
            dp[j] = 0;
            continue;
          }
          auto const* vj = v.row(b, j, hk);
          double dot = 0;
          for (std::int64_t c = 0; c < d; ++c) dot += double(gi[c]) * double(vj[c]);
          dp[j] = dot;
          pdp += std::exp(s[j] - l) * dot;
        }
        double* gqi = &gq[static_cast<std::size_t>(((b * q.s + i) * q.h + h) * d)];
        for (std::int64_t j = 0; j < k.s; ++j) {
          if (s[j] == ninf) continue;
          double const p = std::exp(s[j] - l);
          double const ds = p * (dp[j] - pdp) * scale;
          auto const* kj = k.row(b, j, hk);
          double* gkj = &gk[kidx(b, j, hk)];
          double* gvj = &gv[kidx(b, j, hk)];
          for (std::int64_t c = 0; c < d; ++c) {
            gqi[c] += ds * double(kj[c]);
            gkj[c] += ds * double(qi[c]);
            gvj[c] += p * double(gi[c]);
          }
        }
      }
    }
  for (std::int64_t b = 0; b < q.b; ++b)
    for (std::int64_t i = 0; i < q.s; ++i)
      for (std::int64_t h = 0; h < q.h; ++h)
        for (std::int64_t c = 0; c < d; ++c)
          dq.row(b, i, h)[c] = DQ(gq[static_cast<std::size_t>(((b * q.s + i) * q.h + h) * d + c)]);
  for (std::int64_t b = 0; b < k.b; ++b)
    for (std::int64_t j = 0; j < k.s; ++j)
      for (std::int64_t h = 0; h < k.h; ++h)
        for (std::int64_t c = 0; c < d; ++c) {
          dk.row(b, j, h)[c] = DK(gk[kidx(b, j, h) + static_cast<std::size_t>(c)]);
          dv.row(b, j, h)[c] = DV(gv[kidx(b, j, h) + static_cast<std::size_t>(c)]);
        }
}

}  // namespace detail

//! fp64 reference forward: o [B, Sq, Hq, D] and lse [B, Hq, Sq] from q [B, Sq, Hq, D] and k, v
//! [B, Sk, Hkv, D]. Empty rows give o = 0, lse = -inf.
template <TensorIn<host_space> QV, TensorIn<host_space> KV, TensorIn<host_space> VV,
          TensorIn<host_space> OV, TensorIn<host_space> LV>
void reference_forward(QV const& q, KV const& k, VV const& v, OV const& o, LV const& lse,
                       attention_options const& opt = {}) {
  auto const rq = detail::as_bshd(q, "q");
  auto const rk = detail::as_bshd(k, "k");
  auto const rv = detail::as_bshd(v, "v");
  auto const ro = detail::as_bshd(o, "o");
  auto const rl = detail::as_bhs(lse);
  detail::check_forward_shapes(rq, rk, rv, ro, rl);
  detail::reference_forward_raw(rq, rk, rv, ro, rl, make_mask(opt.causal, rq.s, rk.s),
                                resolve_scale(opt.scale, rq.d));
}

//! fp64 reference backward: dq, dk, dv from q, k, v and dout (no O or LSE needed).
template <TensorIn<host_space> QV, TensorIn<host_space> KV, TensorIn<host_space> VV,
          TensorIn<host_space> GV, TensorIn<host_space> DQV, TensorIn<host_space> DKV,
          TensorIn<host_space> DVV>
void reference_backward(QV const& q, KV const& k, VV const& v, GV const& dout, DQV const& dq,
                        DKV const& dk, DVV const& dv, attention_options const& opt = {}) {
  auto const rq = detail::as_bshd(q, "q");
  auto const rk = detail::as_bshd(k, "k");
  auto const rv = detail::as_bshd(v, "v");
  auto const rg = detail::as_bshd(dout, "dout");
  auto const rdq = detail::as_bshd(dq, "dq");
  auto const rdk = detail::as_bshd(dk, "dk");
  auto const rdv = detail::as_bshd(dv, "dv");
  detail::check_qkv(rq, rk, rv);
  detail::check_gradient_shapes(rq, rk, rg, rdq, rdk, rdv);
  detail::reference_backward_raw(rq, rk, rv, rg, rdq, rdk, rdv, make_mask(opt.causal, rq.s, rk.s),
                                 resolve_scale(opt.scale, rq.d));
}

}  // namespace weft::attention
