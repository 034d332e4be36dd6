// weft/attention/cuda/detail/flash_ws_kernels.cuh — the warp-specialised Hopper flash forwards
// (a producer loading for two consumer warpgroups through mbarriers): flash_kernel::wgmma_ws's
// (cp.async by a producer warpgroup) and flash_kernel::wgmma_tma's (TMA by one producer thread,
// ping-pong between the consumers), their shared barrier layout and producer schedule, and the
// host side of the TMA loads (the tensor maps). The products and row math are
// flash_wgmma_kernels.cuh's; launched by flash_kernels.cuh.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/attention/cuda/detail/flash_ws_kernels.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/common.hpp>
#include <weft/attention/cuda/detail/flash_rows.cuh>
#include <weft/attention/cuda/detail/flash_wgmma_kernels.cuh>
#include <weft/attention/cuda/detail/mma.cuh>
#include <weft/attention/cuda/detail/wgmma.cuh>
#include <weft/attention/softmax_state.hpp>
#include <weft/core/error.hpp>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

// Kernels live in weft::attention::kernels, not weft::attention::cuda (a namespace named `cuda`
// would hide CCCL's ::cuda for every header parsed after this one).
namespace weft::attention::kernels {

using ::weft::attention::detail::bhs;
using ::weft::attention::detail::bshd;

namespace flash_detail {

inline constexpr int ws_threads =
    384;  // warp-specialised forward: 2 consumer + 1 producer warpgroups

//! The warp-specialised forward's shared memory: forward_wgmma_smem's tiles, then 9 mbarriers.
template <int D>
inline constexpr std::size_t forward_ws_smem = forward_wgmma_smem<D> + 9 * 8;

//! The warp-specialised forwards' mbarriers, 8 bytes each from `base` (after the tiles): Q full,
//! K full [2], V full [2], K empty [2], V empty [2].
struct forward_ws_barriers {
  std::uint32_t base;
  __device__ __forceinline__ std::uint32_t q_full() const { return base; }
  __device__ __forceinline__ std::uint32_t k_full(int s) const {
    return base + 8u + 8u * std::uint32_t(s);
  }
  __device__ __forceinline__ std::uint32_t v_full(int s) const {
    return base + 24u + 8u * std::uint32_t(s);
  }
  __device__ __forceinline__ std::uint32_t k_empty(int s) const {
    return base + 40u + 8u * std::uint32_t(s);
  }
  __device__ __forceinline__ std::uint32_t v_empty(int s) const {
    return base + 56u + 8u * std::uint32_t(s);
  }
  //! Every barrier (one thread): the full ones completing on `full` arrivals, the empty ones on
  //! `empty`.
  __device__ __forceinline__ void init(unsigned full, unsigned empty) const {
    wgmma::mbar_init(q_full(), full);
    for (int s = 0; s < 2; ++s) {
      wgmma::mbar_init(k_full(s), full);
      wgmma::mbar_init(v_full(s), full);
      wgmma::mbar_init(k_empty(s), empty);
      wgmma::mbar_init(v_empty(s), empty);
    }
  }
};

//! The warp-specialised forwards' producer schedule: Q, K_0, then per key tile j V_j and K_{j+1}
//! into the double buffers (stage j & 1). V_j reuses V_{j-2}'s buffer and K_{j+1} K_{j-1}'s: each
//! waits first for that use's release on the buffer's "empty" barrier. load(kind, j, stage) issues
//! one tile (kind 0: Q, 1: K_j, 2: V_j) and signals its "full" barrier.
template <class Load>
__device__ __forceinline__ void produce_forward_tiles(forward_ws_barriers const& bars, int ntiles,
                                                      Load&& load) {
  load(0, 0, 0);
  if (ntiles > 0) load(1, 0, 0);
  for (int j = 0; j < ntiles; ++j) {
    int const s = j & 1;
    if (j >= 2) wgmma::mbar_wait(bars.v_empty(s), unsigned((j >> 1) - 1) & 1u);
    load(2, j, s);
    if (j + 1 < ntiles) {
      int const sn = (j + 1) & 1;
      if (j + 1 >= 2) wgmma::mbar_wait(bars.k_empty(sn), unsigned(((j + 1) >> 1) - 1) & 1u);
      load(1, j + 1, sn);
    }
  }
}

//! The warp-specialised Hopper forward (flash_kernel::wgmma_ws; automatic's forward at d = 64):
//! forward_kernel_wgmma's tiles, products and row math with the loads taken off the consumers.
//! Warpgroup 2 (warps 8-11) is the producer: it loads Q, then K_0, V_0, K_1, V_1, ... by cp.async
//! into the same double buffers, announces each tile on a "full" mbarrier once it has landed
//! (wait_group, proxy fence, arrive), and before reusing a buffer waits for the buffer's "empty"
//! mbarrier. Warpgroups 0 and 1, 64 query rows each (forward_kernel_wgmma's rows), are the
//! consumers: per key tile they wait for K_j, form S_j = Q K_jᵀ, release K_j, run the online
//! softmax, wait for V_j, add P_j V_j and release V_j. No block-wide barrier runs in the key
//! loop, so one consumer's softmax can run under the other's products (FlashAttention-3's
//! warp specialisation, without its TMA and without forward_kernel_wgmma's overlap within a
//! warpgroup, which needs more than the consumers' registers). setmaxnreg gives the producer 40
//! registers and each consumer 232 (2 x 232 + 40 = 3 x 168, the entry count of 384 threads). A
//! producer wait that never completes traps (wgmma::mbar_wait) rather than hang; the consumers'
//! waits spin (wgmma::mbar_wait_spin) and end when the producer's loads land.
template <class T, class O, int D>
__global__ void __launch_bounds__(ws_threads, 1)
    forward_kernel_wgmma_ws(bshd<T const> q, bshd<T const> k, bshd<T const> v, bshd<O> o,
                            bhs<float> lse, mask_rule mask_in, float scale, seq_layout lay) {
  constexpr int BK = wg_block_k;
  constexpr bool BF = mma::is_bf16<T>;
  constexpr int NT_S = BK / 8;
  constexpr int NT_O = D / 8;
  constexpr int CT = 256;              // consumer threads, warps 0-7
  constexpr int PT = ws_threads - CT;  // producer threads, warps 8-11
  constexpr std::uint32_t kv_tile_bytes = forward_wgmma_tiles<D>::kv_bytes;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  forward_wgmma_tiles<D> const tiles(smem_raw);
  std::uint32_t const sq = tiles.sq, sk_base = tiles.sk, sv_base = tiles.sv;
  forward_ws_barriers const bars{tiles.end};

  forward_tile<T> const ft = locate_forward(q, k, v, mask_in, lay);
  cta_seq const& cs = ft.cs;
  mask_rule const mask = cs.mask;
  std::int64_t const i0 = ft.i0;
  if (i0 >= cs.sq) return;  // the whole block: the condition does not depend on the thread
  int const ntiles = static_cast<int>((ft.k_end + BK - 1) / BK);
  int const tid = static_cast<int>(threadIdx.x);
  if (tid == 0) bars.init(PT, CT);
  __syncthreads();

  if (tid >= CT) {
    // The producer. Each load: wait for its buffer, issue, commit; then the load before it has
    // landed (wait_group 1): fence it for the async proxy and announce it.
    int const pt = tid - CT;
    wgmma::setmaxnreg_dec<40>();
    T const *const kb = ft.kb, *const vb = ft.vb;
    std::uint32_t pending = 0;  // the barrier of the load issued before the newest
    auto const issued = [&](std::uint32_t full) {
      mma::cp_async_commit();
      mma::cp_async_wait<1>();
      wgmma::fence_proxy_async();
      if (pending != 0) wgmma::mbar_arrive(pending);
      pending = full;
    };
    produce_forward_tiles(bars, ntiles, [&](int kind, int j, int s) {
      std::int64_t const jb = std::int64_t(j) * BK;
      if (kind == 0) {
        wgmma::load_tile_sw128<fwd_block_q, D, PT>(sq, ft.qb, q.ss, ft.rows, q.data, pt);
        issued(bars.q_full());
      } else if (kind == 1) {
        wgmma::load_tile_sw128<BK, D, PT>(sk_base + s * kv_tile_bytes, kb + jb * k.ss, k.ss,
                                          cs.sk - jb, k.data, pt);
        issued(bars.k_full(s));
      } else {
        wgmma::load_tile_sw128<BK, D, PT>(sv_base + s * kv_tile_bytes, vb + jb * v.ss, v.ss,
                                          cs.sk - jb, v.data, pt);
        issued(bars.v_full(s));
      }
    });
    mma::cp_async_wait<0>();
    wgmma::fence_proxy_async();
    wgmma::mbar_arrive(pending);
    return;
  }

  // A consumer: warp w takes forward_kernel_wgmma's warp w's rows.
  wgmma::setmaxnreg_inc<232>();
  int const warp = tid / 32, lane = tid % 32;
  int const g = lane / 4, t = lane % 4;
  int const h = ft.h;
  std::uint32_t const sq_wg = sq + std::uint32_t(warp / 4) * 64 * 128;
  float oacc[NT_O][4];
  for (auto& x : oacc) x[0] = x[1] = x[2] = x[3] = 0.0f;
  softmax_row_state<float> st[2];
  std::int64_t const row0 = i0 + warp * 16 + g;

  if (ntiles > 0) wgmma::mbar_wait_spin(bars.q_full(), 0);
  for (int j = 0; j < ntiles; ++j) {
    std::int64_t const jb = std::int64_t(j) * BK;
    int const sb = j & 1;
    unsigned const parity = unsigned(j >> 1) & 1u;
    // S_j = Q K_jᵀ.
    wgmma::mbar_wait_spin(bars.k_full(sb), parity);
    std::uint32_t const ck = sk_base + sb * kv_tile_bytes;
    float s[NT_S][4];
    for (auto& x : s) x[0] = x[1] = x[2] = x[3] = 0.0f;
    wgmma::fence_operands(s);
    wgmma::fence();
    issue_scores<BF, D, BK>(s, sq_wg, ck);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(s);
    wgmma::mbar_arrive(bars.k_empty(sb));  // this thread's reads of K_j are done

    online_softmax(s, oacc, st, scale, cs, mask, i0, jb, row0, t);
    std::uint32_t pa[BK / 16][4];
    pack_probabilities<BF, BK>(pa, s);

    // O += P_j V_j.
    wgmma::mbar_wait_spin(bars.v_full(sb), parity);
    std::uint32_t const cv = sv_base + sb * kv_tile_bytes;
    output_product<BF, NT_O, BK>(oacc, pa, cv);
    wgmma::mbar_arrive(bars.v_empty(sb));  // and of V_j
  }
  store_forward_rows(oacc, st, o, lse, cs, h, row0, t);
}

//! The TMA forward's shared memory: wgmma_ws's (the same tiles and 9 mbarriers).
template <int D>
inline constexpr std::size_t forward_tma_smem = forward_ws_smem<D>;

//! The TMA forward (flash_kernel::wgmma_tma, on dense layouts whose views a tensor map can
//! describe; FlashAttention-3's forward): wgmma_ws's roles and buffers, with
//! - the loads by TMA: one producer thread issues each tile's boxes (64 columns x 128 rows of one
//!   head each, in the 128-byte swizzle, rows past the view zero-filled by the tensor map) on the
//!   tile's "full" mbarrier with its byte count, and waits for the buffer's "empty" mbarrier
//!   before reusing it; the producer warpgroup keeps 24 registers, each consumer 240;
//! - forward_kernel_wgmma's overlap within a warpgroup: step j issues S_j = Q K_jᵀ, then
//!   O += P_{j−1} V_{j−1}, forms P_j while the second product runs, then rescales o;
//! - ping-pong between the two consumer warpgroups: each issues its step's products only in its
//!   turn (named barrier 1 for warpgroup 0, 2 for warpgroup 1) and then hands the turn to the
//!   other, so that one warpgroup's softmax runs under the other's products.
//! A consumer warpgroup releases a buffer by one arrival (its wgmma.wait_group has retired the
//! products that read it), so the "empty" barriers count 2. Rows, masks and the store are
//! forward_kernel_wgmma's. A producer wait that never completes traps rather than hang.
template <class T, class O, int D>
__global__ void __launch_bounds__(ws_threads, 1)
    forward_kernel_wgmma_tma(__grid_constant__ CUtensorMap const tq,
                             __grid_constant__ CUtensorMap const tk,
                             __grid_constant__ CUtensorMap const tv, bshd<T const> q,
                             bshd<T const> k, bshd<T const> v, bshd<O> o, bhs<float> lse,
                             mask_rule mask_in, float scale, seq_layout lay) {
  constexpr int BK = wg_block_k;
  constexpr bool BF = mma::is_bf16<T>;
  constexpr int NT_S = BK / 8;
  constexpr int NT_O = D / 8;
  constexpr int CT = 256;  // consumer threads, warps 0-7; the producer is thread CT
  constexpr std::uint32_t kv_tile_bytes = forward_wgmma_tiles<D>::kv_bytes;
  constexpr std::uint32_t q_tile_bytes = std::uint32_t(fwd_block_q) * D * 2;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  forward_wgmma_tiles<D> const tiles(smem_raw);
  std::uint32_t const sq = tiles.sq, sk_base = tiles.sk, sv_base = tiles.sv;
  forward_ws_barriers const bars{tiles.end};

  forward_tile<T> const ft = locate_forward(q, k, v, mask_in, lay);
  cta_seq const& cs = ft.cs;
  mask_rule const mask = cs.mask;
  std::int64_t const i0 = ft.i0;
  if (i0 >= cs.sq) return;  // the whole block: the condition does not depend on the thread
  int const ntiles = static_cast<int>((ft.k_end + BK - 1) / BK);
  int const tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    bars.init(1, 2);
    wgmma::fence_mbarrier_init();
  }
  __syncthreads();

  if (tid >= CT) {
    // The producer: one thread issues every load; the rest of its warpgroup leaves.
    wgmma::setmaxnreg_dec<24>();
    if (tid != CT || ntiles == 0) return;
    wgmma::prefetch_tensor_map(&tq);
    wgmma::prefetch_tensor_map(&tk);
    wgmma::prefetch_tensor_map(&tv);
    int const h = ft.h;
    int const hk = static_cast<int>(h / (q.h / k.h));
    int const b = static_cast<int>(cs.b);
    // One tile: its byte count announced on `full`, then a box per 64-column block (the blocks
    // rows x 128 bytes apart, as wgmma.cuh's swizzled layout has them).
    auto const load = [b](std::uint32_t dst, CUtensorMap const& map, std::uint32_t full,
                          std::uint32_t bytes, int rows, int head, std::int64_t row) {
      wgmma::mbar_arrive_expect_tx(full, bytes);
#pragma unroll
      for (int c = 0; c < D / 64; ++c)
        wgmma::tma_load_4d(dst + std::uint32_t(c * rows * 128), &map, full, c * 64, head,
                           static_cast<int>(row), b);
    };
    produce_forward_tiles(bars, ntiles, [&](int kind, int j, int s) {
      std::int64_t const jb = std::int64_t(j) * BK;
      if (kind == 0)
        load(sq, tq, bars.q_full(), q_tile_bytes, fwd_block_q, h, i0);
      else if (kind == 1)
        load(sk_base + s * kv_tile_bytes, tk, bars.k_full(s), kv_tile_bytes, BK, hk, jb);
      else
        load(sv_base + s * kv_tile_bytes, tv, bars.v_full(s), kv_tile_bytes, BK, hk, jb);
    });
    return;
  }

  // A consumer: warp w takes forward_kernel_wgmma's warp w's rows.
  wgmma::setmaxnreg_inc<240>();
  int const warp = tid / 32, lane = tid % 32;
  int const wg = warp / 4;
  bool const leader = tid % 128 == 0;  // releases buffers for its warpgroup
  int const g = lane / 4, t = lane % 4;
  std::uint32_t const sq_wg = sq + std::uint32_t(wg) * 64 * 128;
  float oacc[NT_O][4];
  for (auto& x : oacc) x[0] = x[1] = x[2] = x[3] = 0.0f;
  // S_j's accumulators and P_{j-1} packed (forward_kernel_wgmma's), zeroed once so that no
  // register is read unset.
  float s[NT_S][4];
  for (auto& x : s) x[0] = x[1] = x[2] = x[3] = 0.0f;
  std::uint32_t pa[BK / 16][4];
  for (auto& x : pa) x[0] = x[1] = x[2] = x[3] = 0u;
  softmax_row_state<float> st[2];
  std::int64_t const row0 = i0 + warp * 16 + g;

  if (ntiles > 0) {
    wgmma::mbar_wait_spin(bars.q_full(), 0);
    if (wg == 1) named_barrier_arrive<1>(CT);  // warpgroup 0 takes the first turn
  }
  for (int j = 0; j < ntiles; ++j) {
    std::int64_t const jb = std::int64_t(j) * BK;
    int const sb = j & 1;
    wgmma::mbar_wait_spin(bars.k_full(sb), unsigned(j >> 1) & 1u);
    if (j > 0) wgmma::mbar_wait_spin(bars.v_full(sb ^ 1), unsigned((j - 1) >> 1) & 1u);
    // This warpgroup's turn: issue S_j = Q K_jᵀ and O += P_{j-1} V_{j-1}.
    if (wg == 0)
      named_barrier<1>(CT);
    else
      named_barrier<2>(CT);
    std::uint32_t const ck = sk_base + sb * kv_tile_bytes;
    wgmma::fence_operands(s);
    wgmma::fence_operands(oacc);
    wgmma::fence_operands(pa);
    wgmma::fence();
    issue_scores<BF, D, BK>(s, sq_wg, ck);
    wgmma::commit();
    if (j > 0) {
      issue_output<BF, NT_O, BK>(oacc, pa, sv_base + (sb ^ 1) * kv_tile_bytes);
      wgmma::commit();
    }
    if (j > 0)
      wgmma::wait<1>();  // S_j (the older group) is done
    else
      wgmma::wait<0>();
    // Then hand the turn over: after the wait, since a bar.arrive between the issue and the wait
    // makes ptxas serialise the products (C7514); O += P_{j-1} V_{j-1} still runs.
    if (wg == 0)
      named_barrier_arrive<2>(CT);
    else
      named_barrier_arrive<1>(CT);
    wgmma::fence_operands(s);
    if (leader) wgmma::mbar_arrive(bars.k_empty(sb));  // this warpgroup's reads of K_j are done

    float alpha[2];
    tile_probabilities(s, st, alpha, scale, cs, mask, i0, jb, row0, t);
    wgmma::fence_operands(s);  // P_j is formed here, under the product (not sunk past the wait)

    wgmma::wait<0>();  // O += P_{j-1} V_{j-1} is done: o and P_{j-1}'s registers are free
    wgmma::fence_operands(oacc);
    wgmma::fence_operands(pa);
    if (j > 0 && leader) wgmma::mbar_arrive(bars.v_empty(sb ^ 1));  // and of V_{j-1}
    rescale_rows(oacc, alpha);
    pack_probabilities<BF, BK>(pa, s);
  }
  if (ntiles > 0) {
    // The last tile's O += P V, outside the turns; warpgroup 0 then takes warpgroup 1's last
    // hand-over, so that no arrival is left on a barrier.
    int const last = ntiles - 1;
    wgmma::mbar_wait_spin(bars.v_full(last & 1), unsigned(last >> 1) & 1u);
    output_product<BF, NT_O, BK>(oacc, pa, sv_base + (last & 1) * kv_tile_bytes);
    if (wg == 0) named_barrier<1>(CT);
  }
  store_forward_rows(oacc, st, o, lse, cs, ft.h, row0, t);
}

// ---- host side: the TMA forward's tensor maps
// ---------------------------------------------------------------

//! cuTensorMapEncodeTiled of the driver, reached through the runtime (no link against libcuda);
//! null where the driver has none. Looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 const encode = [] {
    // An error pending from earlier work is the caller's: surface it rather than clear it below.
    WEFT_CUDA_TRY(cudaPeekAtLastError());
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    cudaError_t const e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                           cudaEnableDefault, &found);
    if (e != cudaSuccess) (void)cudaGetLastError();  // the lookup's own error (not sticky)
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encode;
}

//! The TMA forward's tensor maps of q, k and v.
struct forward_tensor_maps {
  CUtensorMap q, k, v;
};

//! A tensor map of the [B, S, H, D] view x (16-bit elements) for boxes of 64 columns x `rows` rows
//! of one head in the 128-byte swizzle: dimensions D, H, S, B (innermost first), rows past S
//! zero-filled. False where TMA cannot describe the view (a pointer or stride off 16 bytes, a
//! stride of 0, negative or of 2^40 bytes or more along a dimension of extent above 1, a dimension
//! of 0 or of 2^31 or more) or the driver refuses it.
template <class T>
bool make_tile_map(CUtensorMap& map, bshd<T const> const& x, int rows) {
  PFN_cuTensorMapEncodeTiled_v12000 const encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  constexpr std::int64_t max_stride = std::int64_t(1) << 40;
  std::int64_t const dims[4] = {x.d, x.h, x.s, x.b};
  if (reinterpret_cast<std::uintptr_t>(x.data) % 16 != 0) return false;
  for (std::int64_t const n : dims)
    if (n <= 0 || n >= (std::int64_t(1) << 31)) return false;
  std::int64_t strides[3] = {x.sh * 2, x.ss * 2, x.sb * 2};  // bytes, of dimensions 1..3
  // A dimension of extent 1 is never stepped along: it takes the contiguous stride (the extent of
  // the dimensions inside it), which is valid wherever those are.
  std::int64_t natural = x.d * 2;
  for (int i = 0; i < 3; ++i) {
    if (dims[i + 1] == 1) strides[i] = natural;
    if (strides[i] <= 0 || strides[i] % 16 != 0 || strides[i] >= max_stride) return false;
    natural = strides[i] < max_stride / dims[i + 1] ? strides[i] * dims[i + 1] : max_stride;
  }
  cuuint64_t const gdim[4] = {cuuint64_t(dims[0]), cuuint64_t(dims[1]), cuuint64_t(dims[2]),
                              cuuint64_t(dims[3])};
  cuuint64_t const gstride[3] = {cuuint64_t(strides[0]), cuuint64_t(strides[1]),
                                 cuuint64_t(strides[2])};
  cuuint32_t const box[4] = {64, 1, cuuint32_t(rows), 1};
  cuuint32_t const estride[4] = {1, 1, 1, 1};
  CUresult const r = encode(
      &map, mma::is_bf16<T> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
      const_cast<void*>(static_cast<void const*>(x.data)), gdim, gstride, box, estride,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

//! Whether wgmma_tma's forward takes a launch with these views and layout (dense, each view one a
//! tensor map describes), filling `maps` if so; otherwise wgmma_tma runs wgmma_ws's forward.
template <class T>
bool tma_forward_maps(forward_tensor_maps& maps, bshd<T const> const& q, bshd<T const> const& k,
                      bshd<T const> const& v, seq_layout const& lay) {
  return lay.cu_q == nullptr && make_tile_map(maps.q, q, fwd_block_q) &&
         make_tile_map(maps.k, k, wg_block_k) && make_tile_map(maps.v, v, wg_block_k);
}

}  // namespace flash_detail

}  // namespace weft::attention::kernels
