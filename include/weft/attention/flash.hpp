// weft/attention/flash.hpp — local flash attention on the CPU: the tiled online-softmax forward
// (O and L) and the recomputing backward from dO with D = rowsum(dO∘O), never forming the
// [Sq, Sk] score matrix; layout [batch, seq, heads, dim]; MHA/GQA/MQA; packed cu_seqlens. Tiles
// run through a host executor's for_each_chunk (exec::host{n}: an OpenMP team of n).
#pragma once

#include <weft/attention/args.hpp>
#include <weft/attention/common.hpp>
#include <weft/attention/softmax_state.hpp>
#include <weft/attention/tile_gemm.hpp>
#include <weft/core/exec.hpp>
#include <weft/core/math.hpp>
#include <weft/core/simd.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

namespace weft::attention {

namespace detail {

//! Query rows per tile and keys per tile. 64 × 128 keeps the f32 working set (Q, K, V, S, O tiles
//! at d = 128) near 200 KiB, inside L2, and gives BLAS tiles large enough to run near peak.
#ifndef WEFT_ATTENTION_BLOCK_Q
#define WEFT_ATTENTION_BLOCK_Q 64
#endif
#ifndef WEFT_ATTENTION_BLOCK_K
#define WEFT_ATTENTION_BLOCK_K 128
#endif
inline constexpr index_t block_q = WEFT_ATTENTION_BLOCK_Q;
inline constexpr index_t block_k = WEFT_ATTENTION_BLOCK_K;

template <class Acc>
struct fwd_workspace {
  std::vector<Acc> q, k, v, s, o, scratch;
  std::vector<softmax_row_state<Acc>> rows;
  explicit fwd_workspace(index_t d)
      : q(std::size_t(block_q * d)),
        k(std::size_t(block_k * d)),
        v(std::size_t(block_k * d)),
        s(std::size_t(block_q * block_k)),
        o(std::size_t(block_q * d)),
        scratch(std::size_t(std::max(d, block_q) * std::max(block_k, block_q))),
        rows(std::size_t(block_q)) {}
};

//! Rows of one head as a GEMM operand: a pointer and a leading dimension.
template <class Acc>
struct tile_ref {
  Acc const* p;
  index_t ld;
};

template <class Acc, class T>
void pack_rows(bshd<T> const& t, index_t b, index_t h, index_t r0, index_t r1, Acc* out) {
  for (index_t r = r0; r < r1; ++r) {
    T const* src = t.row(b, r, h);
    Acc* dst = out + (r - r0) * t.d;
    for (index_t c = 0; c < t.d; ++c) dst[c] = static_cast<Acc>(src[c]);
  }
}

//! Max and sum of a row with eight independent partial results in a fixed pattern: the same bits
//! every run, and no single dependency chain (a plain reduction would not vectorise without
//! fast-math).
template <class Acc>
WEFT_FORCEINLINE Acc row_max_body(Acc const* x, index_t n) noexcept {
  Acc m[8];
  for (auto& v : m) v = empty_lse<Acc>();
  index_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int t = 0; t < 8; ++t) m[t] = x[j + t] > m[t] ? x[j + t] : m[t];
  for (; j < n; ++j) m[0] = x[j] > m[0] ? x[j] : m[0];
  for (int t = 1; t < 8; ++t) m[0] = m[t] > m[0] ? m[t] : m[0];
  return m[0];
}
//! x[j] <- exp(x[j] - shift) for x[j] <= shift (masked -inf scores give 0), by weft's exp_fn.
//! Blocks of eight run as a fixed-length inner loop, which GCC vectorises even at -O2 (whose
//! very-cheap cost model refuses a loop of unknown trip count); the tail runs scalar.
template <class Acc>
WEFT_FORCEINLINE void exp_shifted_body(Acc* x, index_t n, Acc shift) noexcept {
  exp_fn const e;
  index_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int t = 0; t < 8; ++t) x[j + t] = e(x[j + t] - shift);
  for (; j < n; ++j) x[j] = e(x[j] - shift);
}
template <class Acc>
WEFT_FORCEINLINE Acc row_sum_body(Acc const* x, index_t n) noexcept {
  Acc a[8] = {};
  index_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int t = 0; t < 8; ++t) a[t] += x[j + t];
  for (; j < n; ++j) a[0] += x[j];
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// The row loops run once per score row of every tile and hold the exponentials, a quarter of the
// forward's time under SSE2: they are compiled again for AVX2+FMA and AVX-512 and picked at run
// time (weft/core/simd.hpp). The reductions keep their eight-lane order on every ISA, so only the
// exponentials differ between ISAs, by FMA contraction (within exp_fn's 2 ulp).
#if WEFT_MULTIVERSION
template <class Acc>
WEFT_TARGET_AVX2 Acc row_max_avx2(Acc const* x, index_t n) noexcept {
  return row_max_body(x, n);
}
template <class Acc>
WEFT_TARGET_AVX512 Acc row_max_avx512(Acc const* x, index_t n) noexcept {
  return row_max_body(x, n);
}
template <class Acc>
WEFT_TARGET_AVX2 void exp_shifted_avx2(Acc* x, index_t n, Acc shift) noexcept {
  exp_shifted_body(x, n, shift);
}
template <class Acc>
WEFT_TARGET_AVX512 void exp_shifted_avx512(Acc* x, index_t n, Acc shift) noexcept {
  exp_shifted_body(x, n, shift);
}
template <class Acc>
WEFT_TARGET_AVX2 Acc row_sum_avx2(Acc const* x, index_t n) noexcept {
  return row_sum_body(x, n);
}
template <class Acc>
WEFT_TARGET_AVX512 Acc row_sum_avx512(Acc const* x, index_t n) noexcept {
  return row_sum_body(x, n);
}
#endif

template <class Acc>
Acc row_max(Acc const* x, index_t n) noexcept {
#if WEFT_MULTIVERSION
  switch (weft::detail::host_simd_level()) {
    case weft::detail::simd_level::avx512: return row_max_avx512(x, n);
    case weft::detail::simd_level::avx2: return row_max_avx2(x, n);
    case weft::detail::simd_level::base: break;
  }
#endif
  return row_max_body(x, n);
}
template <class Acc>
void exp_shifted(Acc* x, index_t n, Acc shift) noexcept {
#if WEFT_MULTIVERSION
  switch (weft::detail::host_simd_level()) {
    case weft::detail::simd_level::avx512: return exp_shifted_avx512(x, n, shift);
    case weft::detail::simd_level::avx2: return exp_shifted_avx2(x, n, shift);
    case weft::detail::simd_level::base: break;
  }
#endif
  exp_shifted_body(x, n, shift);
}
template <class Acc>
Acc row_sum(Acc const* x, index_t n) noexcept {
#if WEFT_MULTIVERSION
  switch (weft::detail::host_simd_level()) {
    case weft::detail::simd_level::avx512: return row_sum_avx512(x, n);
    case weft::detail::simd_level::avx2: return row_sum_avx2(x, n);
    case weft::detail::simd_level::base: break;
  }
#endif
  return row_sum_body(x, n);
}

//! Rows [r0, r1) of head h: read in place when they already are Acc (the strided rows are a valid
//! GEMM operand with ld = row stride), else converted into `buf`.
template <class Acc, class T>
tile_ref<Acc> load_rows(bshd<T> const& t, index_t b, index_t h, index_t r0, index_t r1, Acc* buf) {
  if constexpr (std::is_same_v<std::remove_const_t<T>, Acc>) {
    return {t.row(b, r0, h), t.ss};
  } else {
    pack_rows(t, b, h, r0, r1, buf);
    return {buf, t.d};
  }
}

//! Applies the mask and the diagonal rule to a score tile in place: masked scores become -inf.
//! Only tiles that cross the causal boundary pay for it.
template <class Acc>
void mask_tile(Acc* s, index_t i0, index_t bi, index_t j0, index_t bj, mask_rule mask) {
  if (!mask.causal) return;
  if (j0 + bj - 1 <= i0 + mask.offset) return;  // every (i, j) visible
  Acc const ninf = empty_lse<Acc>();
  for (index_t i = 0; i < bi; ++i) {
    index_t const end =
        mask.key_end(i0 + i, j0 + bj) - j0;  // visible: j < end (in tile coordinates)
    for (index_t j = std::max<index_t>(end, 0); j < bj; ++j) s[i * bj + j] = ninf;
  }
}

//! Forward of one (batch, head, query tile): writes o rows [i0, i1) and their LSE.
template <class Acc, class Q, class K, class V, class O, class L>
void forward_tile(bshd<Q> const& q, bshd<K> const& k, bshd<V> const& v, bshd<O> const& o,
                  bhs<L> const& lse, index_t b, index_t h, index_t i0, index_t i1, mask_rule mask,
                  Acc scale, fwd_workspace<Acc>& w) {
  index_t const d = q.d, bi = i1 - i0, hk = h / (q.h / k.h);
  auto const qt = load_rows(q, b, h, i0, i1, w.q.data());
  std::fill(w.o.begin(), w.o.begin() + bi * d, Acc(0));
  for (index_t r = 0; r < bi; ++r) w.rows[std::size_t(r)] = softmax_row_state<Acc>{};
  index_t const k_end = mask.key_end(i1 - 1, k.s);  // the last row sees the most keys
  for (index_t j0 = 0; j0 < k_end; j0 += block_k) {
    index_t const bj = std::min(block_k, k_end - j0);
    if (mask.causal && j0 > i1 - 1 + mask.offset) break;
    auto const kt = load_rows(k, b, hk, j0, j0 + bj, w.k.data());
    auto const vt = load_rows(v, b, hk, j0, j0 + bj, w.v.data());
    Acc* s = w.s.data();
    gemm_nt<Acc>(bi, bj, d, scale, qt.p, qt.ld, kt.p, kt.ld, s, bj, w.scratch.data());
    mask_tile(s, i0, bi, j0, bj, mask);
    for (index_t r = 0; r < bi; ++r) {
      Acc* sr = s + r * bj;
      auto& st = w.rows[std::size_t(r)];
      Acc const alpha = st.rescale(row_max(sr, bj));
      if (alpha != Acc(1)) {
        Acc* orow = w.o.data() + r * d;
        for (index_t c = 0; c < d; ++c) orow[c] *= alpha;
      }
      if (st.m == empty_lse<Acc>()) {  // nothing visible yet: the weights are all 0
        std::fill(sr, sr + bj, Acc(0));
        continue;
      }
      Acc const m = st.m;
      exp_shifted(sr, bj, m);  // masked -inf -> 0
      st.l += row_sum(sr, bj);
    }
    gemm_nn_acc<Acc>(bi, d, bj, Acc(1), s, bj, vt.p, vt.ld, w.o.data(), d, w.scratch.data());
  }
  for (index_t r = 0; r < bi; ++r) {
    auto const& st = w.rows[std::size_t(r)];
    Acc const inv = st.inv_sum();
    O* dst = o.row(b, i0 + r, h);
    Acc const* src = w.o.data() + r * d;
    for (index_t c = 0; c < d; ++c) dst[c] = static_cast<O>(src[c] * inv);
    lse.at(b, h, i0 + r) = static_cast<L>(st.lse());
  }
}

//! The forward over raw views, on a host executor (one workspace per worker, tiles handed out
//! dynamically); the mask rule is given in (query row, key row) coordinates of these views, which
//! is what the ring steps need.
template <HostExecutor E, class Q, class K, class V, class O, class L>
void flash_forward_raw(E const& ex, bshd<Q> q, bshd<K> k, bshd<V> v, bshd<O> o, bhs<L> lse,
                       mask_rule mask, double scale) {
  using Acc = compute_t<Q>;
  index_t const tiles = (q.s + block_q - 1) / block_q;
  struct workspace {
    index_t d;
    fwd_workspace<Acc> operator()() const { return fwd_workspace<Acc>(d); }
  };
  struct body {
    bshd<Q> q;
    bshd<K> k;
    bshd<V> v;
    bshd<O> o;
    bhs<L> lse;
    mask_rule mask;
    Acc scale;
    index_t tiles;
    void operator()(index_t t, fwd_workspace<Acc>& w) const {
      index_t const tile = t % tiles, h = (t / tiles) % q.h, b = t / (tiles * q.h);
      index_t const i0 = tile * block_q;
      forward_tile<Acc>(q, k, v, o, lse, b, h, i0, std::min(q.s, i0 + block_q), mask, scale, w);
    }
  };
  if (q.s == 0) return;
  for_each_chunk(ex, q.b * q.h * tiles, workspace{q.d},
                 body{q, k, v, o, lse, mask, static_cast<Acc>(scale), tiles});
}

template <class Acc>
struct bwd_workspace {
  std::vector<Acc> q, g, k, v, s, dp, dq, dk, dv, scratch, dsum, lse;
  bwd_workspace(index_t d, index_t sk)
      : q(std::size_t(block_q * d)),
        g(std::size_t(block_q * d)),
        k(std::size_t(block_k * d)),
        v(std::size_t(block_k * d)),
        s(std::size_t(block_q * block_k)),
        dp(std::size_t(block_q * block_k)),
        dq(std::size_t(block_q * d)),
        dk(std::size_t(sk * d)),
        dv(std::size_t(sk * d)),
        scratch(std::size_t(std::max(d, block_q) * std::max(block_k, block_q))),
        dsum(std::size_t(block_q)),
        lse(std::size_t(block_q)) {}
};

//! Backward of one (batch, KV head): all query heads of its group, all query tiles. Adds into
//! dq (rows of those heads) and into dk, dv of that KV head, so a caller can accumulate block
//! gradients (ring steps) in place. `o` and `lse` are the *global* forward results.
template <class Acc, class Q, class K, class V, class O, class L, class G, class DQ, class DK,
          class DV>
void backward_kv_head(bshd<Q> const& q, bshd<K> const& k, bshd<V> const& v, bshd<O> const& o,
                      bhs<L> const& lse, bshd<G> const& dout, bshd<DQ> const& dq,
                      bshd<DK> const& dk, bshd<DV> const& dv, index_t b, index_t hk, mask_rule mask,
                      Acc scale, bwd_workspace<Acc>& w) {
  index_t const d = q.d, group = q.h / k.h;
  std::fill(w.dk.begin(), w.dk.end(), Acc(0));
  std::fill(w.dv.begin(), w.dv.end(), Acc(0));
  for (index_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (index_t i0 = 0; i0 < q.s; i0 += block_q) {
      index_t const i1 = std::min(q.s, i0 + block_q), bi = i1 - i0;
      index_t const k_end = mask.key_end(i1 - 1, k.s);
      if (k_end <= 0) continue;
      auto const qt = load_rows(q, b, h, i0, i1, w.q.data());
      auto const gt = load_rows(dout, b, h, i0, i1, w.g.data());
      bool any_row = false;
      for (index_t r = 0; r < bi; ++r) {
        O const* orow = o.row(b, i0 + r, h);
        Acc const* grow = gt.p + r * gt.ld;
        Acc acc = 0;
        for (index_t c = 0; c < d; ++c) acc += grow[c] * static_cast<Acc>(orow[c]);
        w.dsum[std::size_t(r)] = acc;
        w.lse[std::size_t(r)] = static_cast<Acc>(lse.at(b, h, i0 + r));
        any_row = any_row || w.lse[std::size_t(r)] != empty_lse<Acc>();
      }
      if (!any_row) continue;  // every row empty: no gradient flows
      std::fill(w.dq.begin(), w.dq.begin() + bi * d, Acc(0));
      for (index_t j0 = 0; j0 < k_end; j0 += block_k) {
        index_t const bj = std::min(block_k, k_end - j0);
        auto const kt = load_rows(k, b, hk, j0, j0 + bj, w.k.data());
        auto const vt = load_rows(v, b, hk, j0, j0 + bj, w.v.data());
        Acc* s = w.s.data();
        gemm_nt<Acc>(bi, bj, d, scale, qt.p, qt.ld, kt.p, kt.ld, s, bj, w.scratch.data());
        mask_tile(s, i0, bi, j0, bj, mask);
        for (index_t r = 0; r < bi; ++r) {
          Acc const l = w.lse[std::size_t(r)];
          Acc* sr = s + r * bj;
          if (l == empty_lse<Acc>()) {  // empty row: P = 0 (recompute_probability's rule)
            std::fill(sr, sr + bj, Acc(0));
            continue;
          }
          // P = exp(S - L) <= 1; a masked -inf score gives 0.
          exp_shifted(sr, bj, l);
        }
        // dV_j += Pᵀ dO
        gemm_tn_acc<Acc>(bj, d, bi, Acc(1), s, bj, gt.p, gt.ld, w.dv.data() + j0 * d, d,
                         w.scratch.data());
        // dP = dO Vᵀ ; dS = P ∘ (dP − D)
        Acc* dp = w.dp.data();
        gemm_nt<Acc>(bi, bj, d, Acc(1), gt.p, gt.ld, vt.p, vt.ld, dp, bj, w.scratch.data());
        for (index_t r = 0; r < bi; ++r) {
          Acc const dr = w.dsum[std::size_t(r)];
          Acc const* pr = s + r * bj;
          Acc* dpr = dp + r * bj;
          for (index_t j = 0; j < bj; ++j) dpr[j] = pr[j] * (dpr[j] - dr);
        }
        // dQ_i += τ dS K_j ; dK_j += τ dSᵀ Q_i
        gemm_nn_acc<Acc>(bi, d, bj, scale, dp, bj, kt.p, kt.ld, w.dq.data(), d, w.scratch.data());
        gemm_tn_acc<Acc>(bj, d, bi, scale, dp, bj, qt.p, qt.ld, w.dk.data() + j0 * d, d,
                         w.scratch.data());
      }
      for (index_t r = 0; r < bi; ++r) {
        DQ* dst = dq.row(b, i0 + r, h);
        Acc const* src = w.dq.data() + r * d;
        for (index_t c = 0; c < d; ++c) dst[c] = static_cast<DQ>(static_cast<Acc>(dst[c]) + src[c]);
      }
    }
  }
  for (index_t j = 0; j < k.s; ++j) {
    DK* dkr = dk.row(b, j, hk);
    DV* dvr = dv.row(b, j, hk);
    Acc const* sk = w.dk.data() + j * d;
    Acc const* sv = w.dv.data() + j * d;
    for (index_t c = 0; c < d; ++c) {
      dkr[c] = static_cast<DK>(static_cast<Acc>(dkr[c]) + sk[c]);
      dvr[c] = static_cast<DV>(static_cast<Acc>(dvr[c]) + sv[c]);
    }
  }
}

//! Adds this block's dq, dk, dv into the given buffers (which the caller zeroes for a plain call),
//! on a host executor: one workspace per worker, (batch, KV head) pairs handed out dynamically.
template <HostExecutor E, class Q, class K, class V, class O, class L, class G, class DQ, class DK,
          class DV>
void flash_backward_accumulate_raw(E const& ex, bshd<Q> q, bshd<K> k, bshd<V> v, bshd<O> o,
                                   bhs<L> lse, bshd<G> dout, bshd<DQ> dq, bshd<DK> dk, bshd<DV> dv,
                                   mask_rule mask, double scale) {
  using Acc = compute_t<Q>;
  struct workspace {
    index_t d, sk;
    bwd_workspace<Acc> operator()() const { return bwd_workspace<Acc>(d, sk); }
  };
  struct body {
    bshd<Q> q;
    bshd<K> k;
    bshd<V> v;
    bshd<O> o;
    bhs<L> lse;
    bshd<G> g;
    bshd<DQ> dq;
    bshd<DK> dk;
    bshd<DV> dv;
    mask_rule mask;
    Acc scale;
    void operator()(index_t t, bwd_workspace<Acc>& w) const {
      backward_kv_head<Acc>(q, k, v, o, lse, g, dq, dk, dv, t / k.h, t % k.h, mask, scale, w);
    }
  };
  if (q.s == 0 || k.s == 0) return;
  for_each_chunk(ex, q.b * k.h, workspace{q.d, k.s},
                 body{q, k, v, o, lse, dout, dq, dk, dv, mask, static_cast<Acc>(scale)});
}

template <class T>
void zero_rows(bshd<T> const& t) {
  for (index_t b = 0; b < t.b; ++b)
    for (index_t s = 0; s < t.s; ++s)
      for (index_t h = 0; h < t.h; ++h) std::fill(t.row(b, s, h), t.row(b, s, h) + t.d, T(0.0f));
}

//! Checks cu_seqlens: starts at 0, non-decreasing, ends at `total`.
inline void check_cu_seqlens(std::span<std::int64_t const> cu, index_t total, char const* name) {
  WEFT_EXPECTS(cu.size() >= 2, name, "at least 2 entries (0 and the total)", cu.size());
  WEFT_EXPECTS(cu.front() == 0, name, "first entry 0", cu.front());
  for (std::size_t i = 1; i < cu.size(); ++i)
    WEFT_EXPECTS(cu[i] >= cu[i - 1], name, ::weft::detail::concat("non-decreasing at ", i),
                 ::weft::detail::concat(cu[i - 1], " then ", cu[i]));
  WEFT_EXPECTS(cu.back() == total, name, ::weft::detail::concat("last entry = tokens ", total),
               cu.back());
}

template <class T>
bshd<T> seq_slice(bshd<T> t, index_t s0, index_t s1) noexcept {
  t.data += s0 * t.ss;
  t.s = s1 - s0;
  return t;
}
template <class T>
bhs<T> seq_slice(bhs<T> t, index_t s0, index_t s1) noexcept {
  t.data += s0 * t.ss;
  t.s = s1 - s0;
  return t;
}

}  // namespace detail

//! Flash attention forward. q [B, Sq, Hq, D]; k, v [B, Sk, Hkv, D] with Hq % Hkv == 0 (query head
//! h uses KV head h / (Hq/Hkv)); o [B, Sq, Hq, D] (any element type, e.g. the input's or f32);
//! lse [B, Hq, Sq] (natural log; -inf for a row that sees no key, whose o row is 0). Tiles run on
//! the host executor `ex` (exec::host{n}: n OpenMP threads); results are the same bits for any
//! executor and thread count.
template <HostExecutor E, HostTensorArg QV, HostTensorArg KV, HostTensorArg VV, HostTensorArg OV,
          HostTensorArg LV>
void flash_forward(E const& ex, QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse,
                   attention_options const& opt = {}) {
  auto const rq = detail::as_bshd(detail::arg_view(q), "q");
  auto const rk = detail::as_bshd(detail::arg_view(k), "k");
  auto const rv = detail::as_bshd(detail::arg_view(v), "v");
  auto const ro = detail::as_bshd(detail::arg_view(o), "o");
  auto const rl = detail::as_bhs(detail::arg_view(lse));
  detail::check_forward_shapes(rq, rk, rv, ro, rl);
  detail::check_forward_aliases(rq, rk, rv, ro, rl);
  detail::flash_forward_raw(ex, rq, rk, rv, ro, rl, make_mask(opt.causal, rq.s, rk.s),
                            resolve_scale(opt.scale, rq.d));
}

//! Flash attention backward from dout, with the forward's o and lse: writes dq, dk, dv
//! (overwritten; any element type). Accumulates in f32 (f64 for f64 inputs); GQA dk/dv sum over
//! their query-head group.
template <HostExecutor E, HostTensorArg QV, HostTensorArg KV, HostTensorArg VV, HostTensorArg OV,
          HostTensorArg LV, HostTensorArg GV, HostTensorArg DQV, HostTensorArg DKV,
          HostTensorArg DVV>
void flash_backward(E const& ex, QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse, GV&& dout, DQV&& dq,
                    DKV&& dk, DVV&& dv, attention_options const& opt = {}) {
  auto const rq = detail::as_bshd(detail::arg_view(q), "q");
  auto const rk = detail::as_bshd(detail::arg_view(k), "k");
  auto const rv = detail::as_bshd(detail::arg_view(v), "v");
  auto const ro = detail::as_bshd(detail::arg_view(o), "o");
  auto const rl = detail::as_bhs(detail::arg_view(lse));
  auto const rg = detail::as_bshd(detail::arg_view(dout), "dout");
  auto const rdq = detail::as_bshd(detail::arg_view(dq), "dq");
  auto const rdk = detail::as_bshd(detail::arg_view(dk), "dk");
  auto const rdv = detail::as_bshd(detail::arg_view(dv), "dv");
  detail::check_forward_shapes(rq, rk, rv, ro, rl);
  detail::check_gradient_shapes(rq, rk, rg, rdq, rdk, rdv);
  detail::check_backward_aliases(rq, rk, rv, ro, rl, rg, rdq, rdk, rdv);
  double const scale = resolve_scale(opt.scale, rq.d);  // throws before anything is zeroed
  detail::zero_rows(rdq);
  detail::zero_rows(rdk);
  detail::zero_rows(rdv);
  detail::flash_backward_accumulate_raw(ex, rq, rk, rv, ro, rl, rg, rdq, rdk, rdv,
                                        make_mask(opt.causal, rq.s, rk.s), scale);
}

//! Packed variable-length forward: documents are concatenated along dim 1 of q, k, v (batch 1:
//! q [1, Tq, Hq, D], k, v [1, Tk, Hkv, D]); document n spans rows [cu_q[n], cu_q[n+1]) of q and
//! [cu_k[n], cu_k[n+1]) of k and v, and attends only within itself (causal alignment per document).
//! lse is [1, Hq, Tq].
template <HostExecutor E, HostTensorArg QV, HostTensorArg KV, HostTensorArg VV, HostTensorArg OV,
          HostTensorArg LV>
void flash_forward_varlen(E const& ex, QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse,
                          std::span<std::int64_t const> cu_seqlens_q,
                          std::span<std::int64_t const> cu_seqlens_k,
                          attention_options const& opt = {}) {
  auto const rq = detail::as_bshd(detail::arg_view(q), "q");
  auto const rk = detail::as_bshd(detail::arg_view(k), "k");
  auto const rv = detail::as_bshd(detail::arg_view(v), "v");
  auto const ro = detail::as_bshd(detail::arg_view(o), "o");
  auto const rl = detail::as_bhs(detail::arg_view(lse));
  detail::check_forward_shapes(rq, rk, rv, ro, rl);
  detail::check_forward_aliases(rq, rk, rv, ro, rl);
  WEFT_EXPECTS_SHAPE(rq.b == 1, "q", "batch 1 for packed sequences", rq.b);
  detail::check_cu_seqlens(cu_seqlens_q, rq.s, "cu_seqlens_q");
  detail::check_cu_seqlens(cu_seqlens_k, rk.s, "cu_seqlens_k");
  WEFT_EXPECTS(cu_seqlens_k.size() == cu_seqlens_q.size(), "cu_seqlens_k", cu_seqlens_q.size(),
               cu_seqlens_k.size());
  double const scale = resolve_scale(opt.scale, rq.d);
  for (std::size_t n = 0; n + 1 < cu_seqlens_q.size(); ++n) {
    std::int64_t const q0 = cu_seqlens_q[n], q1 = cu_seqlens_q[n + 1];
    std::int64_t const k0 = cu_seqlens_k[n], k1 = cu_seqlens_k[n + 1];
    detail::flash_forward_raw(ex, detail::seq_slice(rq, q0, q1), detail::seq_slice(rk, k0, k1),
                              detail::seq_slice(rv, k0, k1), detail::seq_slice(ro, q0, q1),
                              detail::seq_slice(rl, q0, q1),
                              make_mask(opt.causal, q1 - q0, k1 - k0), scale);
  }
}

//! Packed variable-length backward; arguments as flash_forward_varlen plus flash_backward's.
template <HostExecutor E, HostTensorArg QV, HostTensorArg KV, HostTensorArg VV, HostTensorArg OV,
          HostTensorArg LV, HostTensorArg GV, HostTensorArg DQV, HostTensorArg DKV,
          HostTensorArg DVV>
void flash_backward_varlen(E const& ex, QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse, GV&& dout,
                           DQV&& dq, DKV&& dk, DVV&& dv, std::span<std::int64_t const> cu_seqlens_q,
                           std::span<std::int64_t const> cu_seqlens_k,
                           attention_options const& opt = {}) {
  auto const rq = detail::as_bshd(detail::arg_view(q), "q");
  auto const rk = detail::as_bshd(detail::arg_view(k), "k");
  auto const rv = detail::as_bshd(detail::arg_view(v), "v");
  auto const ro = detail::as_bshd(detail::arg_view(o), "o");
  auto const rl = detail::as_bhs(detail::arg_view(lse));
  auto const rg = detail::as_bshd(detail::arg_view(dout), "dout");
  auto const rdq = detail::as_bshd(detail::arg_view(dq), "dq");
  auto const rdk = detail::as_bshd(detail::arg_view(dk), "dk");
  auto const rdv = detail::as_bshd(detail::arg_view(dv), "dv");
  detail::check_forward_shapes(rq, rk, rv, ro, rl);
  detail::check_gradient_shapes(rq, rk, rg, rdq, rdk, rdv);
  detail::check_backward_aliases(rq, rk, rv, ro, rl, rg, rdq, rdk, rdv);
  WEFT_EXPECTS_SHAPE(rq.b == 1, "q", "batch 1 for packed sequences", rq.b);
  detail::check_cu_seqlens(cu_seqlens_q, rq.s, "cu_seqlens_q");
  detail::check_cu_seqlens(cu_seqlens_k, rk.s, "cu_seqlens_k");
  WEFT_EXPECTS(cu_seqlens_k.size() == cu_seqlens_q.size(), "cu_seqlens_k", cu_seqlens_q.size(),
               cu_seqlens_k.size());
  double const scale = resolve_scale(opt.scale, rq.d);  // throws before anything is zeroed
  detail::zero_rows(rdq);
  detail::zero_rows(rdk);
  detail::zero_rows(rdv);
  for (std::size_t n = 0; n + 1 < cu_seqlens_q.size(); ++n) {
    std::int64_t const q0 = cu_seqlens_q[n], q1 = cu_seqlens_q[n + 1];
    std::int64_t const k0 = cu_seqlens_k[n], k1 = cu_seqlens_k[n + 1];
    detail::flash_backward_accumulate_raw(
        ex, detail::seq_slice(rq, q0, q1), detail::seq_slice(rk, k0, k1),
        detail::seq_slice(rv, k0, k1), detail::seq_slice(ro, q0, q1), detail::seq_slice(rl, q0, q1),
        detail::seq_slice(rg, q0, q1), detail::seq_slice(rdq, q0, q1),
        detail::seq_slice(rdk, k0, k1), detail::seq_slice(rdv, k0, k1),
        make_mask(opt.causal, q1 - q0, k1 - k0), scale);
  }
}

// ---- the same entry points on exec::host{opt.num_threads} --------------------------------------

template <HostTensorArg QV, HostTensorArg KV, HostTensorArg VV, HostTensorArg OV, HostTensorArg LV>
void flash_forward(QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse, attention_options const& opt = {}) {
  flash_forward(host_executor(opt), std::forward<QV>(q), std::forward<KV>(k), std::forward<VV>(v),
                std::forward<OV>(o), std::forward<LV>(lse), opt);
}

template <HostTensorArg QV, HostTensorArg KV, HostTensorArg VV, HostTensorArg OV, HostTensorArg LV,
          HostTensorArg GV, HostTensorArg DQV, HostTensorArg DKV, HostTensorArg DVV>
void flash_backward(QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse, GV&& dout, DQV&& dq, DKV&& dk,
                    DVV&& dv, attention_options const& opt = {}) {
  flash_backward(host_executor(opt), std::forward<QV>(q), std::forward<KV>(k), std::forward<VV>(v),
                 std::forward<OV>(o), std::forward<LV>(lse), std::forward<GV>(dout),
                 std::forward<DQV>(dq), std::forward<DKV>(dk), std::forward<DVV>(dv), opt);
}

template <HostTensorArg QV, HostTensorArg KV, HostTensorArg VV, HostTensorArg OV, HostTensorArg LV>
void flash_forward_varlen(QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse,
                          std::span<std::int64_t const> cu_seqlens_q,
                          std::span<std::int64_t const> cu_seqlens_k,
                          attention_options const& opt = {}) {
  flash_forward_varlen(host_executor(opt), std::forward<QV>(q), std::forward<KV>(k),
                       std::forward<VV>(v), std::forward<OV>(o), std::forward<LV>(lse),
                       cu_seqlens_q, cu_seqlens_k, opt);
}

template <HostTensorArg QV, HostTensorArg KV, HostTensorArg VV, HostTensorArg OV, HostTensorArg LV,
          HostTensorArg GV, HostTensorArg DQV, HostTensorArg DKV, HostTensorArg DVV>
void flash_backward_varlen(QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse, GV&& dout, DQV&& dq, DKV&& dk,
                           DVV&& dv, std::span<std::int64_t const> cu_seqlens_q,
                           std::span<std::int64_t const> cu_seqlens_k,
                           attention_options const& opt = {}) {
  flash_backward_varlen(host_executor(opt), std::forward<QV>(q), std::forward<KV>(k),
                        std::forward<VV>(v), std::forward<OV>(o), std::forward<LV>(lse),
                        std::forward<GV>(dout), std::forward<DQV>(dq), std::forward<DKV>(dk),
                        std::forward<DVV>(dv), cu_seqlens_q, cu_seqlens_k, opt);
}

}  // namespace weft::attention
