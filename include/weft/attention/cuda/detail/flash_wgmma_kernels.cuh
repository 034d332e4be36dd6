// weft/attention/cuda/detail/flash_wgmma_kernels.cuh — the Hopper flash kernels
// (flash_kernel::wgmma): the mma.sync kernels' tiling and row math (flash_rows.cuh) with the
// products on warpgroup MMA (wgmma.cuh), the pieces of the forward the warp-specialised forwards
// (flash_ws_kernels.cuh) share, the backward's step (backward_tile, which wgmma_tma's backward in
// flash_tma_backward.cuh shares) and the backward in its one- and two-warpgroup forms (wgmma_ws's;
// wgmma_tma's on packed documents). Launched by flash_kernels.cuh.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/attention/cuda/detail/flash_wgmma_kernels.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/common.hpp>
#include <weft/attention/cuda/detail/flash_rows.cuh>
#include <weft/attention/cuda/detail/mma.cuh>
#include <weft/attention/cuda/detail/wgmma.cuh>
#include <weft/attention/softmax_state.hpp>

#include <cstddef>
#include <cstdint>

// Kernels live in weft::attention::kernels, not weft::attention::cuda (a namespace named `cuda`
// would hide CCCL's ::cuda for every header parsed after this one).
namespace weft::attention::kernels {

using ::weft::attention::detail::bhs;
using ::weft::attention::detail::bshd;

namespace flash_detail {

inline constexpr int wg_block_k = 128;  // wgmma forward: keys per tile

//! The wgmma forward: the swizzled Q tile, double-buffered swizzled K and V tiles, and up to 1023
//! bytes to put them on a 1024-byte boundary.
template <int D>
inline constexpr std::size_t forward_wgmma_smem =
    std::size_t(fwd_block_q) * D * 2 + std::size_t(4 * wg_block_k) * D * 2 + 1024;

//! The wgmma backward with WGS warpgroups: swizzled K and V tiles of 64 rows for each, Q and dO
//! twice, a 64 x 64 dSᵀ tile for each, L and D of the query tile, and the alignment slack.
template <int D, int WGS = 1>
inline constexpr std::size_t backward_wgmma_smem =
    std::size_t((2 * WGS + 4) * 64) * D * 2 + std::size_t(WGS * 64) * 128 + 2 * 64 * sizeof(float) +
    1024;

//! Waits at named barrier Id (1..15; 0 is __syncthreads's) for `count` threads (an immediate id,
//! so that ptxas reserves only the barriers named).
template <int Id>
__device__ __forceinline__ void named_barrier(int count) {
  static_assert(Id >= 1 && Id <= 15, "named barriers 1..15");
  asm volatile("bar.sync %0, %1;\n" ::"n"(Id), "r"(count) : "memory");
}

//! Arrives at named barrier Id (1..15) without waiting: with the `count - arrivals` threads that
//! wait there (named_barrier<Id>(count)) it completes the barrier's phase.
template <int Id>
__device__ __forceinline__ void named_barrier_arrive(int count) {
  static_assert(Id >= 1 && Id <= 15, "named barriers 1..15");
  asm volatile("bar.arrive %0, %1;\n" ::"n"(Id), "r"(count) : "memory");
}

//! atomicAdd of 2 adjacent floats (8-byte aligned): one vector atomic on sm_90 (each element
//! atomic on its own, as two scalar ones), two scalar ones elsewhere.
__device__ __forceinline__ void atomic_add2(float* dst, float2 x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), x);
#else
  atomicAdd(dst, x.x);
  atomicAdd(dst + 1, x.y);
#endif
}

//! The Hopper forwards' tiles in dynamic shared memory, from a 1024-byte boundary (the swizzle
//! atom): Q [fwd_block_q x D], then K [2][wg_block_k x D] and V [2][wg_block_k x D], all in the
//! 128-byte swizzle; `end` is the first byte after them.
template <int D>
struct forward_wgmma_tiles {
  static constexpr std::uint32_t kv_bytes = std::uint32_t(wg_block_k) * D * 2;
  std::uint32_t sq, sk, sv, end;
  __device__ __forceinline__ explicit forward_wgmma_tiles(unsigned char* smem) {
    std::uint32_t const raw = mma::smem_addr(smem);
    sq = raw + (((raw + 1023u) & ~1023u) - raw);
    sk = sq + std::uint32_t(fwd_block_q) * D * 2;
    sv = sk + 2 * kv_bytes;
    end = sv + 2 * kv_bytes;
  }
};

//! The forward's pieces both Hopper forwards share (registers of one thread of a consumer
//! warpgroup; the shared-memory tiles in the 128-byte swizzle).
//! Issues S = Q Kᵀ for this warpgroup's 64 rows (Q and K both K-major, k16 steps along D); the
//! first step overwrites s.
template <bool BF, int D, int BK>
__device__ __forceinline__ void issue_scores(float (&s)[BK / 8][4], std::uint32_t sq_wg,
                                             std::uint32_t ck) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma::mma_ss<BF, 0, 0>(s, wgmma::kmajor_step<fwd_block_q>(sq_wg, kk),
                            wgmma::kmajor_step<BK>(ck, kk), kk > 0 ? 1 : 0);
}
//! Issues O += P V: the packed probabilities from registers, V MN-major, k16 steps along the keys
//! (16 rows = 2048 bytes), the 64-column blocks of D BK·128 bytes apart.
template <bool BF, int NT_O, int BK>
__device__ __forceinline__ void issue_output(float (&oacc)[NT_O][4],
                                             std::uint32_t const (&pa)[BK / 16][4],
                                             std::uint32_t cv) {
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk)
    wgmma::mma_rs<BF, 1>(oacc, pa[kk], wgmma::mnmajor_step<BK>(cv, kk), 1);
}
//! O += P V on its own: fenced, issued, committed and waited for.
template <bool BF, int NT_O, int BK>
__device__ __forceinline__ void output_product(float (&oacc)[NT_O][4],
                                               std::uint32_t (&pa)[BK / 16][4], std::uint32_t cv) {
  wgmma::fence_operands(oacc);
  wgmma::fence_operands(pa);
  wgmma::fence();
  issue_output<BF, NT_O, BK>(oacc, pa, cv);
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_operands(oacc);
  wgmma::fence_operands(pa);
}
//! The probabilities of s packed to 16 bits as m64nNk16 A fragments (one per k16 step).
template <bool BF, int BK>
__device__ __forceinline__ void pack_probabilities(std::uint32_t (&pa)[BK / 16][4],
                                                   float const (&s)[BK / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk) {
    pa[kk][0] = mma::pack2<BF>(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = mma::pack2<BF>(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = mma::pack2<BF>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = mma::pack2<BF>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

//! The Hopper forward (flash_kernel::wgmma): the forward kernel's tiling and row math with the two
//! products on warpgroup MMA. 8 warps = 2 warpgroups of 64 query rows (a warp's rows are those of
//! forward_kernel's warp, so the row code of flash_rows.cuh serves both); key tiles of wg_block_k
//! keys. Q, K and V are in the 128-byte swizzle of wgmma.cuh: S = Q Kᵀ reads both from shared
//! memory (K-major, m64n{wg_block_k}k16), O += P V takes the probabilities, packed to 16 bits, from
//! registers and V MN-major (m64n{D}k16).
//! The softmax of tile j overlaps the product of tile j − 1: step j issues S_j = Q K_jᵀ and then
//! O += P_{j−1} V_{j−1}, waits for S_j only, forms P_j (tile_probabilities, which leaves o alone),
//! and only then waits for the second product and rescales o. Step j's cp.async group loads K_{j+1}
//! and V_j, double-buffered: K_{j+1} takes K_{j−1}'s buffer and V_j takes V_{j−2}'s, both released
//! by the barrier that ends step j − 1.
template <class T, class O, int D>
__global__ void __launch_bounds__(fwd_threads, 1)
    forward_kernel_wgmma(bshd<T const> q, bshd<T const> k, bshd<T const> v, bshd<O> o,
                         bhs<float> lse, mask_rule mask_in, float scale, seq_layout lay) {
  constexpr int BK = wg_block_k;
  constexpr bool BF = mma::is_bf16<T>;
  constexpr int NT_S = BK / 8;
  constexpr int NT_O = D / 8;
  constexpr std::uint32_t kv_tile_bytes = forward_wgmma_tiles<D>::kv_bytes;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  forward_wgmma_tiles<D> const tiles(smem_raw);
  std::uint32_t const sq = tiles.sq, sk_base = tiles.sk, sv_base = tiles.sv;

  forward_tile<T> const ft = locate_forward(q, k, v, mask_in, lay);
  cta_seq const& cs = ft.cs;
  mask_rule const mask = cs.mask;
  std::int64_t const i0 = ft.i0;
  if (i0 >= cs.sq) return;
  int const h = ft.h;
  int const warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  int const g = lane / 4, t = lane % 4;
  T const *const qb = ft.qb, *const kb = ft.kb, *const vb = ft.vb;
  int const ntiles = static_cast<int>((ft.k_end + BK - 1) / BK);
  // This warpgroup's 64 rows of Q: 64 rows x 128 bytes into each 64-column block of the tile.
  std::uint32_t const sq_wg = sq + std::uint32_t(warp / 4) * 64 * 128;

  wgmma::load_tile_sw128<fwd_block_q, D, fwd_threads>(sq, qb, q.ss, ft.rows, q.data);
  if (ntiles > 0) wgmma::load_tile_sw128<BK, D, fwd_threads>(sk_base, kb, k.ss, cs.sk, k.data);
  mma::cp_async_commit();

  float oacc[NT_O][4];
  for (auto& x : oacc) x[0] = x[1] = x[2] = x[3] = 0.0f;
  // S_j's accumulators (each product overwrites them: its first k-step does not accumulate) and
  // P_{j-1}, packed: the A operand of O += P V. Zeroed once so that no register is read unset.
  float s[NT_S][4];
  for (auto& x : s) x[0] = x[1] = x[2] = x[3] = 0.0f;
  std::uint32_t pa[BK / 16][4];
  for (auto& x : pa) x[0] = x[1] = x[2] = x[3] = 0u;
  softmax_row_state<float> st[2];
  std::int64_t const row0 = i0 + warp * 16 + g;

  for (int j = 0; j < ntiles; ++j) {
    // This step's loads, V_j and K_{j+1}; then everything before them (Q, K_j, V_{j-1}) landed.
    std::int64_t const jb = std::int64_t(j) * BK;
    wgmma::load_tile_sw128<BK, D, fwd_threads>(sv_base + (j & 1) * kv_tile_bytes, vb + jb * v.ss,
                                               v.ss, cs.sk - jb, v.data);
    if (j + 1 < ntiles)
      wgmma::load_tile_sw128<BK, D, fwd_threads>(sk_base + ((j + 1) & 1) * kv_tile_bytes,
                                                 kb + (jb + BK) * k.ss, k.ss, cs.sk - jb - BK,
                                                 k.data);
    mma::cp_async_commit();
    mma::cp_async_wait<1>();
    wgmma::fence_proxy_async();
    __syncthreads();

    // S_j = Q K_jᵀ, both K-major, k16 steps along D (4 per 64-column block, 32 bytes apart).
    std::uint32_t const ck = sk_base + (j & 1) * kv_tile_bytes;
    wgmma::fence_operands(s);
    wgmma::fence_operands(oacc);
    wgmma::fence_operands(pa);
    wgmma::fence();
    issue_scores<BF, D, BK>(s, sq_wg, ck);
    wgmma::commit();
    if (j > 0) {
      // O += P_{j-1} V_{j-1}: MN-major V, k16 steps along the keys (16 rows = 2048 bytes), the
      // 64-column blocks of D BK·128 bytes apart. It runs while P_j is formed below.
      std::uint32_t const cv = sv_base + ((j - 1) & 1) * kv_tile_bytes;
      issue_output<BF, NT_O, BK>(oacc, pa, cv);
      wgmma::commit();
      wgmma::wait<1>();  // S_j (the older group) is done
    } else {
      wgmma::wait<0>();
    }
    wgmma::fence_operands(s);

    float alpha[2];
    tile_probabilities(s, st, alpha, scale, cs, mask, i0, jb, row0, t);

    wgmma::wait<0>();  // O += P_{j-1} V_{j-1} is done: o and P_{j-1}'s registers are free
    wgmma::fence_operands(oacc);
    wgmma::fence_operands(pa);
    rescale_rows(oacc, alpha);
    // P_j packed before the next fence: a register written between two wgmma makes ptxas
    // serialise them (it injects warpgroup.arrive).
    pack_probabilities<BF, BK>(pa, s);
    // Every warpgroup's products of this step are done: the next step's loads may overwrite
    // K_j's and V_{j-1}'s buffers.
    __syncthreads();
  }
  if (ntiles > 0) {
    // The last tile's O += P V.
    mma::cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();
    std::uint32_t const cv = sv_base + ((ntiles - 1) & 1) * kv_tile_bytes;
    output_product<BF, NT_O, BK>(oacc, pa, cv);
  } else {
    mma::cp_async_wait<0>();  // nothing left in flight
  }

  store_forward_rows(oacc, st, o, lse, cs, h, row0, t);
}

//! The two-warpgroup backward's dQ: adds scale · qacc (a warp's 16 query rows x 64 columns, the
//! m64n64 C fragments) into dq rows i0.. of head h from column c0, rows at or past `rows` left
//! out, each thread's 2 adjacent columns of a row by one atomic_add2 (dq's rows 8-byte aligned):
//! half the scalar form's atomics. (float4 atomics after a pair shuffle would halve them again, but
//! spill 160 bytes at d = 128.)
__device__ __forceinline__ void add_dq_v2(float const (&qacc)[8][4], bshd<float> dq,
                                          cta_seq const& cs, int h, std::int64_t i0,
                                          std::int64_t rows, int c0, int g, int t, float scale) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    std::int64_t const qr = g + r * 8;
    if (qr >= rows) continue;
    float* const dst = dq.data + cs.b * dq.sb + (cs.q0 + i0 + qr) * dq.ss + h * dq.sh + c0 + 2 * t;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      atomic_add2(dst + nt * 8, make_float2(qacc[nt][2 * r] * scale, qacc[nt][2 * r + 1] * scale));
  }
}

//! The shared memory one backward step reads: this warpgroup's K and V tiles, the query tile's Q
//! and dO (all 128-byte swizzled), this warpgroup's dSᵀ tile (its address and a generic pointer),
//! and the query tile's row statistics (load_row_stats' L and D).
struct backward_tile_smem {
  std::uint32_t k, v, q, g, ds;
  unsigned char* ds_ptr;
  float const* lse;
  float const* d;
};

//! One step of the wgmma backward for this thread's warpgroup (its 64 keys from key row jw
//! against the query tile at i0, `rows` of whose rows are real): Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, Pᵀ and
//! dSᵀ (backward_probabilities), dV += Pᵀ dO and dK += dSᵀ Q into dv_acc and dk_acc, then
//! keys_done() (the caller's barrier over the warpgroup: its dSᵀ is in shared memory, and its reads
//! of Q, dO and the row statistics are over), then dQ = dS K added into dq by float atomics
//! (float2 ones where V2), none where `skip`. The kernels' template flags as backward_kernel_wgmma.
template <class T, int D, bool Fast, bool V2, bool Overlap, class KeysDone>
__device__ __forceinline__ void backward_tile(float (&dk_acc)[D / 8][4], float (&dv_acc)[D / 8][4],
                                              backward_tile_smem const& sm, bshd<float> dq,
                                              cta_seq const& cs, mask_rule const& mask, float scale,
                                              int h, std::int64_t jw, std::int64_t i0,
                                              std::int64_t rows, std::int64_t key0, int warp, int g,
                                              int t, bool skip, KeysDone&& keys_done) {
  constexpr bool BF = mma::is_bf16<T>;
  constexpr int NT_S = block_q / 8;
  constexpr std::uint32_t block_bytes = 64u * 128;  // one 64-column block of a swizzled tile
  std::uint32_t const s_k = sm.k, s_v = sm.v, s_q = sm.q, s_g = sm.g, s_ds = sm.ds;
  unsigned char* const ds_ptr = sm.ds_ptr;
  float const* const s_lse = sm.lse;
  float const* const s_d = sm.d;
  // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (64 keys x 64 queries each).
  float sacc[NT_S][4], pacc[NT_S][4];
#pragma unroll
  for (int i = 0; i < NT_S; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) sacc[i][e] = pacc[i][e] = 0.0f;
  wgmma::fence_operands(sacc);
  wgmma::fence_operands(pacc);
  wgmma::fence();
  if constexpr (Overlap) {
    // Sᵀ and dPᵀ as two groups: Pᵀ is formed from Sᵀ while dPᵀ's products run.
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma::mma_ss<BF, 0, 0>(sacc, wgmma::kmajor_step<64>(s_k, kk),
                              wgmma::kmajor_step<64>(s_q, kk), kk > 0 ? 1 : 0);
    wgmma::commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma::mma_ss<BF, 0, 0>(pacc, wgmma::kmajor_step<64>(s_v, kk),
                              wgmma::kmajor_step<64>(s_g, kk), kk > 0 ? 1 : 0);
    wgmma::commit();
    wgmma::fence_operands(pacc);
    wgmma::wait<1>();
    wgmma::fence_operands(sacc);
    backward_probabilities<Fast, NT_S, prob_part>(sacc, pacc, s_lse, s_d, scale, cs, mask, jw, i0,
                                                  key0, t, rows);
    wgmma::fence_operands(sacc);  // Pᵀ is formed here, before the wait (not sunk past it)
    wgmma::wait<0>();
    wgmma::fence_operands(sacc);
    wgmma::fence_operands(pacc);
    backward_probabilities<Fast, NT_S, ds_part>(sacc, pacc, s_lse, s_d, scale, cs, mask, jw, i0,
                                                key0, t, rows);
  } else {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      wgmma::mma_ss<BF, 0, 0>(sacc, wgmma::kmajor_step<64>(s_k, kk),
                              wgmma::kmajor_step<64>(s_q, kk), kk > 0 ? 1 : 0);
      wgmma::mma_ss<BF, 0, 0>(pacc, wgmma::kmajor_step<64>(s_v, kk),
                              wgmma::kmajor_step<64>(s_g, kk), kk > 0 ? 1 : 0);
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(sacc);
    wgmma::fence_operands(pacc);
    backward_probabilities<Fast>(sacc, pacc, s_lse, s_d, scale, cs, mask, jw, i0, key0, t, rows);
  }

  // Pᵀ and dSᵀ packed as A operands; dSᵀ also to shared memory (row key, column query) for dQ.
  std::uint32_t ap[block_q / 16][4], ads[block_q / 16][4];
#pragma unroll
  for (int kk = 0; kk < block_q / 16; ++kk) {
    ap[kk][0] = mma::pack2<BF>(sacc[2 * kk][0], sacc[2 * kk][1]);
    ap[kk][1] = mma::pack2<BF>(sacc[2 * kk][2], sacc[2 * kk][3]);
    ap[kk][2] = mma::pack2<BF>(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
    ap[kk][3] = mma::pack2<BF>(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
    ads[kk][0] = mma::pack2<BF>(pacc[2 * kk][0], pacc[2 * kk][1]);
    ads[kk][1] = mma::pack2<BF>(pacc[2 * kk][2], pacc[2 * kk][3]);
    ads[kk][2] = mma::pack2<BF>(pacc[2 * kk + 1][0], pacc[2 * kk + 1][1]);
    ads[kk][3] = mma::pack2<BF>(pacc[2 * kk + 1][2], pacc[2 * kk + 1][3]);
    int const r0 = warp * 16 + g, c0 = kk * 16 + 2 * t;
    auto const put = [&](int r, int c, std::uint32_t x) {
      *reinterpret_cast<std::uint32_t*>(ds_ptr + wgmma::sw128_offset<block_k>(r, c)) = x;
    };
    put(r0, c0, ads[kk][0]);
    put(r0 + 8, c0, ads[kk][1]);
    put(r0, c0 + 8, ads[kk][2]);
    put(r0 + 8, c0 + 8, ads[kk][3]);
  }
  wgmma::fence_proxy_async();  // dSᵀ: generic stores, read by wgmma below

  // dV += Pᵀ dO, dK += dSᵀ Q (τ applied at the end): k16 steps along the queries.
  wgmma::fence_operands(dv_acc);
  wgmma::fence_operands(dk_acc);
  wgmma::fence_operands(ap);
  wgmma::fence_operands(ads);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < block_q / 16; ++kk) {
    wgmma::mma_rs<BF, 1>(dv_acc, ap[kk], wgmma::mnmajor_step<64>(s_g, kk), 1);
    wgmma::mma_rs<BF, 1>(dk_acc, ads[kk], wgmma::mnmajor_step<64>(s_q, kk), 1);
  }
  wgmma::commit();
  wgmma::wait<0>();
  wgmma::fence_operands(dv_acc);
  wgmma::fence_operands(dk_acc);
  wgmma::fence_operands(ap);
  wgmma::fence_operands(ads);
  keys_done();  // dSᵀ complete from every warp of the warpgroup

  // dQ (64 queries x D) = dS K, 64 columns at a time: A = dS (M = queries, K = keys) from
  // dSᵀ, B = K (K = keys, N = D), both MN-major; k16 steps along the keys.
#pragma unroll
  for (int half = 0; half < D / 64; ++half) {
    float qacc[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) qacc[i][0] = qacc[i][1] = qacc[i][2] = qacc[i][3] = 0.0f;
    wgmma::fence_operands(qacc);
    __syncwarp();  // reconverge after the previous half's row-bounded stores
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < block_k / 16; ++kk)
      wgmma::mma_ss<BF, 1, 1>(qacc, wgmma::mnmajor_step<64>(s_ds, kk),
                              wgmma::mnmajor_step<64>(s_k + std::uint32_t(half) * block_bytes, kk),
                              kk > 0 ? 1 : 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(qacc);
    if constexpr (V2) {
      if (!skip)
        add_dq_v2(qacc, dq, cs, h, i0 + warp * 16, rows - warp * 16, half * 64, g, t, scale);
    } else if (!skip) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        std::int64_t const qr = warp * 16 + g + r * 8;
        if (qr >= rows) continue;
        float* const dst =
            dq.data + cs.b * dq.sb + (cs.q0 + i0 + qr) * dq.ss + h * dq.sh + half * 64;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          atomicAdd(dst + nt * 8 + 2 * t, qacc[nt][2 * r] * scale);
          atomicAdd(dst + nt * 8 + 2 * t + 1, qacc[nt][2 * r + 1] * scale);
        }
      }
    }
  }
}

//! The Hopper backward (flash_kernel::wgmma): backward_kernel's tiling (one warpgroup per 64-key
//! tile of a KV head, looping over the group's heads and the 64-query tiles that see its keys)
//! with the five products on warpgroup MMA, K, V, Q, dO and dSᵀ in 128-byte-swizzled shared
//! memory (wgmma.cuh): Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (both operands K-major), dV += Pᵀ dO and
//! dK += dSᵀ Q (Pᵀ and dSᵀ packed in registers, dO and Q read MN-major), dQ = dS K (dS read from
//! dSᵀ MN-major, K MN-major; 64 columns of D at a time) added by float atomics.
//!
//! flash_kernel::wgmma_ws's backward (automatic's on Hopper) is the same kernel with
//! WGS = 2, Fast and, where dq's rows are 8-byte aligned, V2:
//! - WGS = 2: two warpgroups, each the kernel above on its own 64 keys of a 128-key tile, share
//!   each query tile's Q, dO (loaded by all 256 threads: half the loads per product) and row
//!   statistics. They meet at block barriers only around those loads; a warpgroup's dSᵀ reaches
//!   its own dQ product through a named barrier of its 128 threads, so one warpgroup's softmax can
//!   run under the other's products. A warpgroup whose keys a tile cannot see (past the end, or
//!   causally masked from all its rows) leaves that tile's dQ atomics out.
//! - Fast: the exponent as the forward's, one FMA of the unscaled score
//!   (backward_probabilities<true>; an empty row's L is +inf in shared memory, so its P is 0 with
//!   no test for a finite score; masked scores and a partial tile's padding rows by a select).
//! - V2: dQ is added by float2 atomics (sm_90's vector atomicAdd), each thread's 2 adjacent
//!   columns of a row at once: half the atomic instructions and L2 requests.
//! - Overlap (flash_kernel::wgmma_tma's backward at d = 64, here where its TMA kernel does not
//!   take the views): Sᵀ and dPᵀ are committed as two groups, and Pᵀ is formed from Sᵀ while dPᵀ's
//!   products still run. (At d = 128 ptxas spills 40-48 bytes in this form, so wgmma_tma runs the
//!   kernels without it there.)
template <class T, int D, int WGS = 1, bool Fast = false, bool V2 = false, bool Overlap = false>
__global__ void __launch_bounds__(threads* WGS)
    backward_kernel_wgmma(bshd<T const> q, bshd<T const> k, bshd<T const> v, bhs<float const> lse,
                          float const* __restrict__ dsum, bshd<T const> dout, bshd<float> dq,
                          bshd<float> dk, bshd<float> dv, mask_rule mask_in, float scale,
                          seq_layout lay) {
  static_assert(block_k == 64 && block_q == 64 && threads == 128,
                "warpgroups of 64-row tiles: the m64 of wgmma");
  static_assert(WGS == 1 || WGS == 2, "one or two warpgroups");
  constexpr int NTH = threads * WGS;
  constexpr int NT_D = D / 8;
  constexpr std::uint32_t tile_bytes = 64u * D * 2;  // K, V, Q, dO: 64 rows x D, swizzled
  constexpr std::uint32_t block_bytes = 64u * 128;   // one 64-column block of such a tile
  extern __shared__ __align__(16) unsigned char smem_raw[];
  std::uint32_t const raw = mma::smem_addr(smem_raw);
  std::uint32_t const pad = ((raw + 1023u) & ~1023u) - raw;
  // K, V (a 64-row tile per warpgroup); then Q and dO twice (the next query tile loads while this
  // one computes); then dSᵀ (one per warpgroup).
  std::uint32_t const s_k0 = raw + pad, s_v0 = s_k0 + WGS * tile_bytes,
                      s_q2 = s_v0 + WGS * tile_bytes, s_g2 = s_q2 + 2 * tile_bytes,
                      s_ds0 = s_g2 + 2 * tile_bytes;
  unsigned char* const ds0_ptr = smem_raw + pad + (2 * WGS + 4) * tile_bytes;
  float* const s_lse = reinterpret_cast<float*>(ds0_ptr + WGS * block_bytes);
  float* const s_d = s_lse + block_q;

  cta_seq const cs = locate(lay, q.s, k.s, mask_in);
  mask_rule const mask = cs.mask;
  std::int64_t const j0 = std::int64_t(blockIdx.x) * (block_k * WGS);  // the CTA's first key
  if (j0 >= cs.sk) return;
  int const hk = static_cast<int>(blockIdx.y);
  int const group = static_cast<int>(q.h / k.h);
  int const tid = static_cast<int>(threadIdx.x);
  int const wg = WGS == 1 ? 0 : tid / threads;  // this thread's warpgroup
  int const warp = (WGS == 1 ? tid : tid % threads) / 32, lane = tid % 32;
  int const g = lane / 4, t = lane % 4;
  std::int64_t const jw = j0 + wg * block_k;  // this warpgroup's first key
  std::int64_t const key0 = jw + warp * 16 + g;
  std::uint32_t const s_k = s_k0 + wg * tile_bytes, s_v = s_v0 + wg * tile_bytes,
                      s_ds = s_ds0 + wg * block_bytes;
  unsigned char* const ds_ptr = ds0_ptr + wg * block_bytes;

#pragma unroll
  for (int w = 0; w < WGS; ++w) {
    std::int64_t const jt = j0 + w * block_k;
    wgmma::load_tile_sw128<block_k, D, NTH>(s_k0 + w * tile_bytes,
                                            k.data + cs.b * k.sb + (cs.k0 + jt) * k.ss + hk * k.sh,
                                            k.ss, cs.sk - jt, k.data);
    wgmma::load_tile_sw128<block_k, D, NTH>(s_v0 + w * tile_bytes,
                                            v.data + cs.b * v.sb + (cs.k0 + jt) * v.ss + hk * v.sh,
                                            v.ss, cs.sk - jt, v.data);
  }
  mma::cp_async_commit();

  float dk_acc[NT_D][4], dv_acc[NT_D][4];
#pragma unroll
  for (int i = 0; i < NT_D; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.0f;

  std::int64_t i_first = 0;
  if (mask.causal) i_first = j0 - mask.offset > 0 ? j0 - mask.offset : 0;
  std::int64_t const it0 = (i_first / block_q) * block_q;
  // The (head of the group, query tile) pairs in order, each step starting the next one's Q and
  // dO loads into the other buffer.
  auto const load_q_do = [&](int h, std::int64_t i0, int buf) {
    std::int64_t const rows = cs.sq - i0 < block_q ? cs.sq - i0 : block_q;
    wgmma::load_tile_sw128<block_q, D, NTH>(s_q2 + buf * tile_bytes,
                                            q.data + cs.b * q.sb + (cs.q0 + i0) * q.ss + h * q.sh,
                                            q.ss, rows, q.data);
    wgmma::load_tile_sw128<block_q, D, NTH>(
        s_g2 + buf * tile_bytes, dout.data + cs.b * dout.sb + (cs.q0 + i0) * dout.ss + h * dout.sh,
        dout.ss, rows, dout.data);
    mma::cp_async_commit();
  };
  int hg = 0, buf = 0;
  std::int64_t i0 = it0;
  if (i0 < cs.sq) load_q_do(hk * group, i0, 0);
  for (; i0 < cs.sq && hg < group; buf ^= 1) {
    int const h = hk * group + hg;
    std::int64_t const rows = cs.sq - i0 < block_q ? cs.sq - i0 : block_q;
    std::int64_t next_i0 = i0 + block_q;
    int next_hg = hg;
    if (next_i0 >= cs.sq) {
      next_i0 = it0;
      ++next_hg;
    }
    bool const more = next_hg < group;
    std::uint32_t const s_q = s_q2 + buf * tile_bytes, s_g = s_g2 + buf * tile_bytes;
    __syncthreads();  // the previous step's readers of the other buffers, s_ds, s_lse, s_d are done
    if (more) load_q_do(hk * group + next_hg, next_i0, buf ^ 1);
    load_row_stats<Fast>(s_lse, s_d, lse, dsum, cs, q.h, q.s, h, i0, rows);
    if (more)
      mma::cp_async_wait<1>();  // K, V and this step's tiles landed; the next step's in flight
    else
      mma::cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();
    // A warpgroup whose keys are all past the end, or all masked from every row of the tile,
    // adds only zeros to dq: it leaves the atomics out. (Skipping its products too, by a branch
    // around them, made ptxas spill 216 bytes at d = 128.)
    bool const skip =
        WGS == 2 && (jw >= cs.sk || (mask.causal && jw > i0 + rows - 1 + mask.offset));

    backward_tile<T, D, Fast, V2, Overlap>(
        dk_acc, dv_acc, backward_tile_smem{s_k, s_v, s_q, s_g, s_ds, ds_ptr, s_lse, s_d}, dq, cs,
        mask, scale, h, jw, i0, rows, key0, warp, g, t, skip, [&] {
          if constexpr (WGS == 1) {
            __syncthreads();  // dSᵀ complete from every warp
          } else if (wg == 0) {
            named_barrier<1>(threads);  // from every warp of this warpgroup
          } else {
            named_barrier<2>(threads);
          }
        });
    i0 = next_i0;
    hg = next_hg;
  }
  mma::cp_async_wait<0>();  // nothing left in flight when no query tile ran
  store_key_grads(dk_acc, dv_acc, dk, dv, cs, hk, key0, t, scale);
}

}  // namespace flash_detail

}  // namespace weft::attention::kernels
