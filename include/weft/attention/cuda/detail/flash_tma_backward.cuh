// weft/attention/cuda/detail/flash_tma_backward.cuh — flash_kernel::wgmma_tma's backward: the
// two-warpgroup wgmma backward's steps (backward_tile, flash_wgmma_kernels.cuh) with its loads
// taken off the warps. K and V, and per step Q, dO and the query tile's row statistics, arrive by
// TMA on mbarriers into double buffers, so no block-wide barrier runs in the loop and each
// warpgroup's softmax can run under the other's products (the two-warpgroup kernel meets at two
// __syncthreads a step). Also the kernel that lays the row statistics out for one bulk copy a
// step, and the host side (which launches qualify, their tensor maps). Launched by
// flash_kernels.cuh.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/attention/cuda/detail/flash_tma_backward.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/common.hpp>
#include <weft/attention/cuda/detail/flash_rows.cuh>
#include <weft/attention/cuda/detail/flash_wgmma_kernels.cuh>
#include <weft/attention/cuda/detail/flash_ws_kernels.cuh>
#include <weft/attention/cuda/detail/mma.cuh>
#include <weft/attention/cuda/detail/wgmma.cuh>

#include <cuda.h>

#include <cstddef>
#include <cstdint>

// Kernels live in weft::attention::kernels, not weft::attention::cuda (a namespace named `cuda`
// would hide CCCL's ::cuda for every header parsed after this one).
namespace weft::attention::kernels {

using ::weft::attention::detail::bhs;
using ::weft::attention::detail::bshd;

namespace flash_detail {

//! The TMA backward's row statistics, per (batch, query head, 64-row query tile): the tile's 64
//! L values as load_row_stats<true> puts them in shared memory (lse · log2 e; +inf for an empty
//! row), then its 64 D values (rowsum(dO ∘ O)): 512 contiguous bytes, one bulk copy. Rows past
//! the sequence hold load_row_stats' padding values, L = +inf and D = 0.
inline constexpr int stats_tile_floats = 2 * block_q;

//! Fills `stats` (B × Hq × tiles tiles of stats_tile_floats, tiles = ⌈Sq / 64⌉) from the
//! forward's lse and dout · o: one warp per row of the padded tiles.
template <class T, class O>
__global__ void __launch_bounds__(128)
    row_stats_kernel(bshd<T const> dout, bshd<O const> o, bhs<float const> lse,
                     float* __restrict__ stats, std::int64_t tiles) {
  std::int64_t const row = std::int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
  int const lane = static_cast<int>(threadIdx.x) % 32;
  std::int64_t const padded = tiles * block_q;
  if (row >= dout.b * dout.h * padded) return;
  std::int64_t const s = row % padded, h = (row / padded) % dout.h, b = row / (padded * dout.h);
  float d = 0.0f, l = -empty_lse<float>();
  if (s < dout.s) {
    d = row_dot(dout, o, b, s, h, lane);
    float const l2 = lse.data[b * lse.sb + h * lse.sh + s * lse.ss] * log2e;
    l = l2 == empty_lse<float>() ? -empty_lse<float>() : l2;
  }
  if (lane == 0) {
    float* const tile = stats + ((b * dout.h + h) * tiles + s / block_q) * stats_tile_floats;
    tile[s % block_q] = l;
    tile[block_q + s % block_q] = d;
  }
}

//! wgmma_tma's backward shared memory: backward_wgmma_smem<D, 2>'s tiles (K and V for each
//! warpgroup, Q and dO twice) with dSᵀ and the row statistics twice instead of once, and 5
//! mbarriers.
template <int D>
inline constexpr std::size_t backward_tma_smem = backward_wgmma_smem<D, 2> + 2 * 64 * 128 -
                                                 2 * block_q * sizeof(float) +
                                                 2 * stats_tile_floats * sizeof(float) + 5 * 8;

//! The TMA backward (flash_kernel::wgmma_tma's, dense layouts): backward_kernel_wgmma<T, D, 2,
//! Fast = true, V2, Overlap>'s tiling, steps and results, with its loads by TMA.
//! - Loads: thread 0 issues them all. First K and V of both warpgroups' 64-key tiles (one
//!   mbarrier), then per step (a head of the group, a query tile) Q and dO by 4-D tensor maps
//!   (128-byte swizzle, rows past the sequence zero-filled) and the tile's row statistics by a
//!   bulk copy from row_stats_kernel's layout, into stage n & 1, completing that stage's "full"
//!   mbarrier. Before it refills a stage it waits for the stage's "empty" mbarrier, on which each
//!   warpgroup arrives once its reads of the stage are over (after its dV and dK products).
//! - No block-wide barrier in the loop: each warpgroup waits only for its stage to land, and meets
//!   its own four warps at one named barrier a step (its dSᵀ complete before the dQ product).
//!   dSᵀ is double-buffered like the stages, so that no second barrier has to hold the next
//!   step's dSᵀ behind this step's dQ product (step n's writes into buffer n & 1 come after step
//!   n - 1's barrier, which every warp passes after its dQ product of step n - 2; with a second
//!   barrier instead, ptxas spilled 12-28 bytes at d = 128). Thread 0's wait for a free stage
//!   holds warpgroup 0 at most one step ahead of warpgroup 1; the "full" waits hold warpgroup 1
//!   behind the loads.
//! The waits spin (wgmma::mbar_wait_spin): each ends when a load lands or the other warpgroup
//! finishes a step.
template <class T, int D, bool V2, bool Overlap>
__global__ void __launch_bounds__(2 * threads, 1)
    backward_kernel_wgmma_tma(__grid_constant__ CUtensorMap const tq,
                              __grid_constant__ CUtensorMap const tk,
                              __grid_constant__ CUtensorMap const tv,
                              __grid_constant__ CUtensorMap const tg, bshd<T const> q,
                              bshd<T const> k, float const* __restrict__ stats, bshd<float> dq,
                              bshd<float> dk, bshd<float> dv, mask_rule mask_in, float scale,
                              seq_layout lay) {
  static_assert(block_k == 64 && block_q == 64 && threads == 128,
                "warpgroups of 64-row tiles: the m64 of wgmma");
  constexpr int WGS = 2;
  constexpr int NT_D = D / 8;
  constexpr std::uint32_t tile_bytes = 64u * D * 2;  // K, V, Q, dO: 64 rows x D, swizzled
  constexpr std::uint32_t block_bytes = 64u * 128;   // one 64-column block of such a tile
  constexpr std::uint32_t stats_bytes = stats_tile_floats * sizeof(float);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  std::uint32_t const raw = mma::smem_addr(smem_raw);
  std::uint32_t const pad = ((raw + 1023u) & ~1023u) - raw;
  // K, V (a 64-row tile per warpgroup); Q and dO in two stages; dSᵀ (two per warpgroup); the row
  // statistics in two stages; the mbarriers: K and V, "full" [2], "empty" [2].
  std::uint32_t const s_k0 = raw + pad, s_v0 = s_k0 + WGS * tile_bytes,
                      s_q2 = s_v0 + WGS * tile_bytes, s_g2 = s_q2 + 2 * tile_bytes,
                      s_ds0 = s_g2 + 2 * tile_bytes, s_st2 = s_ds0 + 2 * WGS * block_bytes,
                      kv_full = s_st2 + 2 * stats_bytes;
  unsigned char* const ds0_ptr = smem_raw + pad + (2 * WGS + 4) * tile_bytes;
  float const* const st2_ptr = reinterpret_cast<float const*>(ds0_ptr + 2 * WGS * block_bytes);
  auto const full = [kv_full](int s) { return kv_full + 8u + 8u * std::uint32_t(s); };
  auto const empty = [kv_full](int s) { return kv_full + 24u + 8u * std::uint32_t(s); };

  cta_seq const cs = locate(lay, q.s, k.s, mask_in);
  mask_rule const mask = cs.mask;
  std::int64_t const j0 = std::int64_t(blockIdx.x) * (block_k * WGS);  // the CTA's first key
  if (j0 >= cs.sk) return;                                             // the whole block
  int const hk = static_cast<int>(blockIdx.y);
  int const group = static_cast<int>(q.h / k.h);
  int const tid = static_cast<int>(threadIdx.x);
  int const wg = tid / threads;  // this thread's warpgroup
  int const warp = (tid % threads) / 32, lane = tid % 32;
  int const g = lane / 4, t = lane % 4;
  std::int64_t const jw = j0 + wg * block_k;  // this warpgroup's first key
  std::int64_t const key0 = jw + warp * 16 + g;
  std::uint32_t const s_k = s_k0 + wg * tile_bytes, s_v = s_v0 + wg * tile_bytes,
                      s_ds = s_ds0 + 2 * wg * block_bytes;  // and the next block
  unsigned char* const ds_ptr = ds0_ptr + 2 * wg * block_bytes;

  // The steps in order: each head of the group (hg) against the query tiles from the first that
  // sees a key of this CTA (it0) to the end; step n in stage n & 1.
  std::int64_t i_first = 0;
  if (mask.causal) i_first = j0 - mask.offset > 0 ? j0 - mask.offset : 0;
  // 32-bit row indices (tma_backward_maps admits only sequences below 2^31 rows): registers are
  // short at d = 128. The first tile is capped at the end of the queries first (a causal offset
  // that masks every key puts it far beyond), so that the cast cannot wrap.
  std::int64_t const it0_64 = (i_first / block_q) * block_q;
  int const it0 = static_cast<int>(it0_64 < cs.sq ? it0_64 : cs.sq);
  int const sq = static_cast<int>(cs.sq);
  int const b = static_cast<int>(cs.b);

  // One 64-row tile of a [B, S, H, D] map into `dst`: a box per 64-column block.
  auto const load_tile = [b](std::uint32_t dst, CUtensorMap const& map, std::uint32_t bar, int head,
                             int row) {
#pragma unroll
    for (int c = 0; c < D / 64; ++c)
      wgmma::tma_load_4d(dst + std::uint32_t(c) * block_bytes, &map, bar, c * 64, head, row, b);
  };
  // Head h's query tile at i0: Q, dO and the row statistics into stage s (thread 0).
  auto const issue = [&](int s, int h, int i0) {
    std::int64_t const tiles = (q.s + block_q - 1) / block_q;  // per (batch, head) in `stats`
    wgmma::mbar_arrive_expect_tx(full(s), 2 * tile_bytes + stats_bytes);
    load_tile(s_q2 + std::uint32_t(s) * tile_bytes, tq, full(s), h, i0);
    load_tile(s_g2 + std::uint32_t(s) * tile_bytes, tg, full(s), h, i0);
    wgmma::bulk_load(s_st2 + std::uint32_t(s) * stats_bytes,
                     stats + ((cs.b * q.h + h) * tiles + i0 / block_q) * stats_tile_floats,
                     stats_bytes, full(s));
  };

  if (tid == 0) {
    wgmma::mbar_init(kv_full, 1);
    for (int s = 0; s < 2; ++s) {
      wgmma::mbar_init(full(s), 1);
      wgmma::mbar_init(empty(s), WGS);
    }
    wgmma::fence_mbarrier_init();
  }
  __syncthreads();
  if (tid == 0) {
    wgmma::prefetch_tensor_map(&tq);
    wgmma::prefetch_tensor_map(&tk);
    wgmma::prefetch_tensor_map(&tv);
    wgmma::prefetch_tensor_map(&tg);
    wgmma::mbar_arrive_expect_tx(kv_full, 2 * WGS * tile_bytes);
#pragma unroll
    for (int w = 0; w < WGS; ++w) {
      int const row = static_cast<int>(j0) + w * block_k;
      load_tile(s_k0 + std::uint32_t(w) * tile_bytes, tk, kv_full, hk, row);
      load_tile(s_v0 + std::uint32_t(w) * tile_bytes, tv, kv_full, hk, row);
    }
    if (it0 < sq) issue(0, hk * group, it0);
  }

  float dk_acc[NT_D][4], dv_acc[NT_D][4];
#pragma unroll
  for (int i = 0; i < NT_D; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.0f;

  wgmma::mbar_wait_spin(kv_full, 0);
  int hg = 0, n = 0;
  for (int i0 = it0; i0 < sq && hg < group; ++n) {
    int const s = n & 1;
    int const h = hk * group + hg;
    int const rows = sq - i0 < block_q ? sq - i0 : block_q;
    int next_i0 = i0 + block_q;
    int next_hg = hg;
    if (next_i0 >= sq) {
      next_i0 = it0;
      ++next_hg;
    }
    if (tid == 0 && next_hg < group) {
      // Stage s ^ 1 last held step n - 1: both warpgroups release it before it is refilled.
      if (n >= 1) wgmma::mbar_wait_spin(empty(s ^ 1), unsigned((n - 1) >> 1) & 1u);
      issue(s ^ 1, hk * group + next_hg, next_i0);
    }
    wgmma::mbar_wait_spin(full(s), unsigned(n >> 1) & 1u);
    __syncwarp();  // warp 0 reconverges after thread 0's loads (wgmma is .aligned)
    // A warpgroup whose keys are all past the end, or all masked from every row of the tile,
    // adds only zeros to dq: it leaves the atomics out (as backward_kernel_wgmma).
    bool const skip = jw >= cs.sk || (mask.causal && jw > i0 + rows - 1 + mask.offset);
    float const* const s_st = st2_ptr + s * stats_tile_floats;
    backward_tile<T, D, true, V2, Overlap>(
        dk_acc, dv_acc,
        backward_tile_smem{
            s_k, s_v, s_q2 + std::uint32_t(s) * tile_bytes, s_g2 + std::uint32_t(s) * tile_bytes,
            s_ds + std::uint32_t(s) * block_bytes, ds_ptr + s * block_bytes, s_st, s_st + block_q},
        dq, cs, mask, scale, h, jw, i0, rows, key0, warp, g, t, skip, [&] {
          if (wg == 0)
            named_barrier<1>(threads);
          else
            named_barrier<2>(threads);
          // Every warp of this warpgroup is past its reads of stage s: release it.
          if (tid % threads == 0) wgmma::mbar_arrive(empty(s));
        });
    i0 = next_i0;
    hg = next_hg;
  }
  store_key_grads(dk_acc, dv_acc, dk, dv, cs, hk, key0, t, scale);
}

// ---- host side
// ---------------------------------------------------------------------------------------

//! The TMA backward's tensor maps of q, k, v and dout (64-row boxes).
struct backward_tensor_maps {
  CUtensorMap q, k, v, g;
};

//! Whether wgmma_tma's backward takes a launch with these views and layout (dense, each view one
//! a tensor map describes, sequences short enough for the kernel's 32-bit row indices), filling
//! `maps` if so; otherwise wgmma_tma runs wgmma_ws's backward.
template <class T>
bool tma_backward_maps(backward_tensor_maps& maps, bshd<T const> const& q, bshd<T const> const& k,
                       bshd<T const> const& v, bshd<T const> const& dout, seq_layout const& lay) {
  constexpr std::int64_t max_rows = (std::int64_t(1) << 31) - 2 * block_q;
  return lay.cu_q == nullptr && q.s <= max_rows && k.s <= max_rows &&
         make_tile_map(maps.q, q, block_q) && make_tile_map(maps.k, k, block_k) &&
         make_tile_map(maps.v, v, block_k) && make_tile_map(maps.g, dout, block_q);
}

}  // namespace flash_detail

}  // namespace weft::attention::kernels
