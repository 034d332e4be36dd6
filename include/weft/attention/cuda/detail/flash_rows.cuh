// weft/attention/cuda/detail/flash_rows.cuh — what both families of flash kernels (mma.sync and
// wgmma) share: the tile sizes, where a CTA's sequences lie, the shared-memory sizes of the
// mma.sync kernels, and the per-row device code on accumulator fragments (a thread's rows g and g +
// 8 of its warp's 16, the same in an m16n8k16 and an m64nNk16 tile): the forward's online softmax
// and output, the backward's row statistics, probabilities and dk/dv store.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/attention/cuda/detail/flash_rows.cuh holds CUDA device code: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/args.hpp>
#include <weft/attention/common.hpp>
#include <weft/attention/cuda/detail/mma.cuh>
#include <weft/attention/softmax_state.hpp>
#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/math.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

// Kernels live in weft::attention::kernels, not weft::attention::cuda (a namespace named `cuda`
// would hide CCCL's ::cuda for every header parsed after this one).
namespace weft::attention::kernels {

using ::weft::attention::detail::bhs;
using ::weft::attention::detail::bshd;

namespace flash_detail {

inline constexpr int block_q = 64;       // backward: query rows per tile
inline constexpr int fwd_block_q = 128;  // forward: query rows per tile (8 warps x 16)
inline constexpr int fwd_threads = 256;  // forward: 8 warps
inline constexpr int block_k = 64;       // keys per tile
inline constexpr int threads = 128;      // backward: 4 warps

//! Where a CTA's sequences lie: dense (cu_q null; batch z, lengths of the views, the given mask)
//! or packed (batch 1; document z spans cu_q[z]..cu_q[z+1] of q and cu_k[z].. of k, v; the mask
//! per document from `mode`).
struct seq_layout {
  int const* cu_q = nullptr;
  int const* cu_k = nullptr;
  causal_mode mode = causal_mode::none;
};

struct cta_seq {
  std::int64_t b, q0, k0, sq, sk;
  mask_rule mask;
};

__device__ __forceinline__ cta_seq locate(seq_layout const& lay, std::int64_t sq, std::int64_t sk,
                                          mask_rule mask) {
  int const z = static_cast<int>(blockIdx.z);
  if (lay.cu_q == nullptr) return {z, 0, 0, sq, sk, mask};
  std::int64_t const q0 = lay.cu_q[z], q1 = lay.cu_q[z + 1];
  std::int64_t const k0 = lay.cu_k[z], k1 = lay.cu_k[z + 1];
  mask_rule m{};
  if (lay.mode == causal_mode::top_left) m = {true, 0};
  if (lay.mode == causal_mode::bottom_right) m = {true, (k1 - k0) - (q1 - q0)};
  return {0, q0, k0, q1 - q0, k1 - k0, m};
}

template <int D>
inline constexpr int pitch = D + 8;  // shared row pitch: 16-byte rows, ldmatrix conflict-free

template <int D>
inline constexpr std::size_t forward_smem = std::size_t(fwd_block_q + 4 * block_k) * pitch<D> * 2;

template <int D>
inline constexpr std::size_t backward_smem = std::size_t(2 * block_k + 2 * block_q) * pitch<D> * 2 +
                                             std::size_t(block_k) * (block_q + 8) * 2 +
                                             2 * block_q * sizeof(float);

// The per-element exponentials run on the special-function unit as exp2((x − shift)·log2 e)
// (mma::ex2, within 2 ulp) instead of weft's exp_fn (a dozen FMA-pipe instructions, which made
// the softmax, not the tensor cores, the forward's bottleneck). They keep the semantics of the
// WEFT_HD functors they stand for: softmax_row_state::weight (0 for a masked -inf score, which
// also covers a row that is still empty; the forward forms exp2(s·(scale·log2 e) − m·log2 e) from
// the unscaled score s, one FMA, as FlashAttention does) and recompute_probability (0 for a masked
// score or an empty row's -inf L); the per-row rescale, lse and 1/l stay softmax_row_state's own.
inline constexpr float log2e = 1.44269504088896341f;

//! recompute_probability(x, L) given l_log2 = L·log2 e.
__device__ __forceinline__ float probability(float x, float l_log2) {
  return x == empty_lse<float>() || l_log2 == empty_lse<float>()
             ? 0.0f
             : mma::ex2(fmaf(x, log2e, -l_log2));
}

template <class O>
__device__ __forceinline__ O to_out(float x) {
  if constexpr (std::is_same_v<O, float>)
    return x;
  else
    return O(x);
}

//! A forward CTA's place: its query tile (the highest first: under a causal mask the last tiles
//! see the most keys, and starting them first shortens the tail of the grid), its rows, the keys
//! its last row sees (the most of any of its rows), its head and the pointers to its q rows and
//! its KV head's keys and values. A CTA past the sequence has i0 >= cs.sq and returns.
template <class T>
struct forward_tile {
  cta_seq cs;
  std::int64_t i0, rows, k_end;
  int h;
  T const *qb, *kb, *vb;
};

template <class T>
__device__ __forceinline__ forward_tile<T> locate_forward(bshd<T const> const& q,
                                                          bshd<T const> const& k,
                                                          bshd<T const> const& v, mask_rule mask_in,
                                                          seq_layout const& lay) {
  forward_tile<T> f;
  f.cs = locate(lay, q.s, k.s, mask_in);
  cta_seq const& cs = f.cs;
  f.i0 = std::int64_t(gridDim.x - 1 - blockIdx.x) * fwd_block_q;
  f.h = static_cast<int>(blockIdx.y);
  std::int64_t const hk = f.h / (q.h / k.h);
  f.qb = q.data + cs.b * q.sb + (cs.q0 + f.i0) * q.ss + f.h * q.sh;
  f.kb = k.data + cs.b * k.sb + cs.k0 * k.ss + hk * k.sh;
  f.vb = v.data + cs.b * v.sb + cs.k0 * v.ss + hk * v.sh;
  f.rows = cs.sq - f.i0 < fwd_block_q ? cs.sq - f.i0 : fwd_block_q;
  f.k_end = cs.mask.key_end(f.i0 + f.rows - 1, cs.sk);
  return f;
}

//! One key tile of the forward's online softmax, for this thread's rows row0 and row0 + 8 (the
//! C-fragment rows of an m16n8k16 / m64nNk16 tile; its columns jb + 8·nt + 2t + (e & 1)): scales
//! the scores of s, masks keys past sk or past the causal boundary (only in a tile that crosses
//! either, seen from the CTA's first row i0), takes the row maxima over the quad, rescales the
//! states, sets alpha to the factor the rows' o accumulators must be rescaled by, and turns s into
//! the tile's probabilities (st.weight's semantics), adding this thread's part of each row sum.
//! The o accumulators are not touched, so an MMA into them may still be running.
template <int NS>
__device__ __forceinline__ void tile_probabilities(float (&s)[NS][4],
                                                   softmax_row_state<float> (&st)[2],
                                                   float (&alpha)[2], float scale,
                                                   cta_seq const& cs, mask_rule const& mask,
                                                   std::int64_t i0, std::int64_t jb,
                                                   std::int64_t row0, int t) {
  constexpr std::int64_t bk = NS * 8;
  bool const need_mask = jb + bk > cs.sk || (mask.causal && jb + bk - 1 > i0 + mask.offset);
  float const ninf = empty_lse<float>();
  if (need_mask) {
#pragma unroll
    for (int nt = 0; nt < NS; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        std::int64_t const row = row0 + (e >= 2 ? 8 : 0);
        std::int64_t const col = jb + nt * 8 + 2 * t + (e & 1);
        if (col >= cs.sk || !mask.visible(row, col)) s[nt][e] = ninf;
      }
  }
  // The row maxima of the unscaled scores: scale > 0 and rounding is monotone, so the scaled max
  // is bit for bit the max of the scaled scores, the state's m.
  float mx[2] = {ninf, ninf};
#pragma unroll
  for (int nt = 0; nt < NS; ++nt) {
    mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
  }
  float m_log2[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    alpha[r] = st[r].rescale(mx[r] * scale);
    // A row with no score yet (m = -inf) has only -inf scores: a shift of 0 gives each
    // exp2(-inf) = 0, where -m would give exp2(NaN). A row whose scaled max overflowed
    // (m = +inf) gets NaN, as scaling each score first gives (inf − inf), not the FMA's −inf.
    float const m = st[r].m;
    m_log2[r] = m == ninf ? 0.0f : (m == -ninf ? __int_as_float(0x7fc00000) : m * log2e);
  }
  float const scale_log2 = scale * log2e;
#pragma unroll
  for (int nt = 0; nt < NS; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float const p = mma::ex2(fmaf(s[nt][e], scale_log2, -m_log2[e / 2]));  // st.weight's
      st[e / 2].l += p;
      s[nt][e] = p;
    }
}

//! Multiplies this thread's o accumulators of rows row0 and row0 + 8 by alpha[0] and alpha[1].
template <int NO>
__device__ __forceinline__ void rescale_rows(float (&oacc)[NO][4], float const (&alpha)[2]) {
#pragma unroll
  for (int nt = 0; nt < NO; ++nt) {
    oacc[nt][0] *= alpha[0];
    oacc[nt][1] *= alpha[0];
    oacc[nt][2] *= alpha[1];
    oacc[nt][3] *= alpha[1];
  }
}

//! tile_probabilities, then the o accumulators rescaled (nothing may be writing them).
template <int NS, int NO>
__device__ __forceinline__ void online_softmax(float (&s)[NS][4], float (&oacc)[NO][4],
                                               softmax_row_state<float> (&st)[2], float scale,
                                               cta_seq const& cs, mask_rule const& mask,
                                               std::int64_t i0, std::int64_t jb, std::int64_t row0,
                                               int t) {
  float alpha[2];
  tile_probabilities(s, st, alpha, scale, cs, mask, i0, jb, row0, t);
  rescale_rows(oacc, alpha);
}

//! The forward's end for this thread's rows row0 and row0 + 8: completes the row sums over the
//! quad, writes o = acc / l (0 for a row that saw no key) and, from one thread per row, lse.
template <class O, int NO>
__device__ __forceinline__ void store_forward_rows(float const (&oacc)[NO][4],
                                                   softmax_row_state<float> (&st)[2], bshd<O> o,
                                                   bhs<float> lse, cta_seq const& cs, int h,
                                                   std::int64_t row0, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    st[r].l += __shfl_xor_sync(0xffffffffu, st[r].l, 1);
    st[r].l += __shfl_xor_sync(0xffffffffu, st[r].l, 2);
    std::int64_t const row = row0 + r * 8;
    if (row >= cs.sq) continue;
    float const inv = st[r].inv_sum();
    O* const orow = o.data + cs.b * o.sb + (cs.q0 + row) * o.ss + h * o.sh;
#pragma unroll
    for (int nt = 0; nt < NO; ++nt) {
      orow[nt * 8 + 2 * t] = to_out<O>(oacc[nt][2 * r] * inv);
      orow[nt * 8 + 2 * t + 1] = to_out<O>(oacc[nt][2 * r + 1] * inv);
    }
    if (t == 0) lse.data[cs.b * lse.sb + h * lse.sh + (cs.q0 + row) * lse.ss] = st[r].lse();
  }
}

//! The row statistics of a backward query tile into shared memory: L·log2 e (-inf past the rows)
//! and D = rowsum(dO ∘ O) (0 past the rows), for rows i0.. of head h. EmptyInf: +inf in place of
//! an empty row's (or a row past the tile's) -inf, for backward_probabilities<true>.
template <bool EmptyInf = false>
__device__ __forceinline__ void load_row_stats(float* s_lse, float* s_d, bhs<float const> lse,
                                               float const* __restrict__ dsum, cta_seq const& cs,
                                               std::int64_t qh, std::int64_t qs, int h,
                                               std::int64_t i0, std::int64_t rows) {
  if (threadIdx.x < block_q) {
    int const r = static_cast<int>(threadIdx.x);
    bool const ok = r < rows;
    std::int64_t const qi = cs.q0 + i0 + r;
    float const l2 =
        ok ? lse.data[cs.b * lse.sb + h * lse.sh + qi * lse.ss] * log2e : empty_lse<float>();
    if constexpr (EmptyInf)
      s_lse[r] = l2 == empty_lse<float>() ? -empty_lse<float>() : l2;
    else
      s_lse[r] = l2;
    s_d[r] = ok ? dsum[(cs.b * qh + h) * qs + qi] : 0.0f;
  }
}

//! sum_c dout[b, s, h, c] · o[b, s, h, c] in f32 by one warp (lane `lane` of 32), every lane
//! returning the sum: the backward's D of that row.
template <class T, class O>
__device__ __forceinline__ float row_dot(bshd<T const> const& dout, bshd<O const> const& o,
                                         std::int64_t b, std::int64_t s, std::int64_t h, int lane) {
  T const* const g = dout.data + b * dout.sb + s * dout.ss + h * dout.sh;
  O const* const x = o.data + b * o.sb + s * o.ss + h * o.sh;
  float acc = 0.0f;
  for (std::int64_t c = lane; c < dout.d; c += 32)
    acc += static_cast<float>(g[c]) * static_cast<float>(x[c]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

//! Pᵀ = exp(Sᵀ − L) in place of sacc (recompute_probability's rule: 0 for masked scores and empty
//! rows) and dSᵀ = Pᵀ ∘ (dPᵀ − D) in place of pacc, for this thread's keys key0 and key0 + 8 (the
//! C-fragment rows) and the tile's queries i0 + 8·nt + 2t + (e & 1). Only a tile that crosses the
//! end of the keys or the causal boundary is masked.
//!
//! Fma (the two-warpgroup backward's form): the forward's exponent, P = exp2(s·(scale·log2 e) −
//! L·log2 e), one FMA of the unscaled score s, with s_lse from load_row_stats<true> (+inf for an
//! empty row, whose P is then exp2(−inf) = 0 with no test for a finite score); a masked score's P,
//! and in a partial query tile (`rows` < block_q) a padding row's, is 0 by a select (so that a
//! non-finite key seen only by padding rows adds nothing, as recompute_probability has it).
//!
//! Parts (the overlapped backward's two halves): prob_part forms only Pᵀ (pacc untouched, so its
//! product may still be running), ds_part only dSᵀ from that Pᵀ in sacc; both (the default) is the
//! one pass above.
inline constexpr int prob_part = 1, ds_part = 2;
template <bool Fma = false, int NS, int Parts = prob_part | ds_part>
__device__ __forceinline__ void backward_probabilities(float (&sacc)[NS][4], float (&pacc)[NS][4],
                                                       float const* s_lse, float const* s_d,
                                                       float scale, cta_seq const& cs,
                                                       mask_rule const& mask, std::int64_t j0,
                                                       std::int64_t i0, std::int64_t key0, int t,
                                                       std::int64_t rows = block_q) {
  float const ninf = empty_lse<float>();
  float const c = scale * log2e;
  bool const need_mask = j0 + block_k > cs.sk || (Fma && rows < block_q) ||
                         (mask.causal && j0 + block_k - 1 > i0 + mask.offset);
#pragma unroll
  for (int nt = 0; nt < NS; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int const qc = nt * 8 + 2 * t + (e & 1);  // query within the tile
      if constexpr ((Parts & prob_part) == 0) {
        pacc[nt][e] = sacc[nt][e] * (pacc[nt][e] - s_d[qc]);
      } else {
        float p;
        if constexpr (Fma) {
          p = mma::ex2(fmaf(sacc[nt][e], c, -s_lse[qc]));
          if (need_mask) {
            std::int64_t const key = key0 + (e >= 2 ? 8 : 0);
            if (qc >= rows || key >= cs.sk || !mask.visible(i0 + qc, key)) p = 0.0f;
          }
        } else {
          std::int64_t const key = key0 + (e >= 2 ? 8 : 0);
          float x = sacc[nt][e] * scale;
          if (need_mask && (key >= cs.sk || !mask.visible(i0 + qc, key))) x = ninf;
          p = probability(x, s_lse[qc]);  // s_lse holds L·log2 e
        }
        sacc[nt][e] = p;
        if constexpr ((Parts & ds_part) != 0) pacc[nt][e] = p * (pacc[nt][e] - s_d[qc]);
      }
    }
}

//! The backward's end: adds τ·dK and dV of this thread's keys key0, key0 + 8 into dk, dv.
template <int ND>
__device__ __forceinline__ void store_key_grads(float const (&dk_acc)[ND][4],
                                                float const (&dv_acc)[ND][4], bshd<float> dk,
                                                bshd<float> dv, cta_seq const& cs, int hk,
                                                std::int64_t key0, int t, float scale) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    std::int64_t const key = key0 + r * 8;
    if (key >= cs.sk) continue;
    float* const kr = dk.data + cs.b * dk.sb + (cs.k0 + key) * dk.ss + hk * dk.sh;
    float* const vr = dv.data + cs.b * dv.sb + (cs.k0 + key) * dv.ss + hk * dv.sh;
#pragma unroll
    for (int nt = 0; nt < ND; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        kr[nt * 8 + 2 * t + e] += dk_acc[nt][2 * r + e] * scale;
        vr[nt * 8 + 2 * t + e] += dv_acc[nt][2 * r + e];
      }
  }
}

}  // namespace flash_detail

}  // namespace weft::attention::kernels
