// weft/attention/cuda/detail/flash_kernels.cuh — the kernels behind weft/attention/cuda/flash.cuh
// and their launches (shapes and scale checked first): the mma.sync forward, the D = rowsum(dO * O)
// pass, the mma.sync backward, the float-to-element store, and the choice between them and the
// Hopper kernels (flash_wgmma_kernels.cuh, flash_ws_kernels.cuh). The design is described at the
// top of flash.cuh.
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/attention/cuda/detail/flash_kernels.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/args.hpp>
#include <weft/attention/common.hpp>
#include <weft/attention/cuda/detail/flash_rows.cuh>
#include <weft/attention/cuda/detail/flash_tma_backward.cuh>
#include <weft/attention/cuda/detail/flash_wgmma_kernels.cuh>
#include <weft/attention/cuda/detail/flash_ws_kernels.cuh>
#include <weft/attention/cuda/detail/mma.cuh>
#include <weft/attention/softmax_state.hpp>
#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/math.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

// Kernels live in weft::attention::kernels, not weft::attention::cuda (a namespace named `cuda`
// would hide CCCL's ::cuda for every header parsed after this one).
namespace weft::attention::kernels {

using ::weft::attention::detail::bhs;
using ::weft::attention::detail::bshd;

//! Which kernels the flash entry points launch (forward and backward). mma_sync: the
//! FlashAttention-2-shaped kernels on m16n8k16 mma.sync (sm_80 and up). wgmma: the Hopper kernels
//! on warpgroup MMA (compute capability 9.0 with an sm_90a build). wgmma_ws: the warp-specialised
//! Hopper forward (a producer warpgroup loading for two consumer warpgroups through mbarriers) and
//! the two-warpgroup wgmma backward (backward_kernel_wgmma's WGS = 2 form). automatic (the
//! default): on a device where the Hopper kernels run, wgmma_ws's backward and the faster forward
//! of each head dimension (wgmma_ws's at d = 64, wgmma's at d = 128); mma_sync elsewhere. These
//! passed the gpu label on an H200 (benchmarks/RESULTS.md has their speeds). wgmma_tma:
//! FlashAttention-3's forward (TMA loads by one producer thread, ping-pong between the consumer
//! warpgroups, the overlap within each) and the two-warpgroup backward with TMA loads on mbarrier
//! stages (no block-wide barrier in its loop) on dense layouts a tensor map can describe,
//! wgmma_ws's kernels on the others (its backward at d = 64 with Pᵀ formed under dPᵀ's products);
//! compiled, not yet run on a GPU, so no default uses it. flash_kernel_in_use() reports wgmma_tma
//! when it is chosen; which kernels a launch runs under it depends on its views
//! (flash_detail::tma_forward_maps and tma_backward_maps, three and four tensor-map encodes,
//! host-side).
enum class flash_kernel { mma_sync, wgmma, automatic, wgmma_ws, wgmma_tma };

namespace flash_detail {

//! The forward kernel (see the file comment). Rows past sq and keys past sk are zero-filled in
//! shared memory and masked; rows that see no key give o = 0 and lse = -inf.
template <class T, class O, int D>
__global__ void __launch_bounds__(fwd_threads)
    forward_kernel(bshd<T const> q, bshd<T const> k, bshd<T const> v, bshd<O> o, bhs<float> lse,
                   mask_rule mask_in, float scale, seq_layout lay) {
  constexpr int P = pitch<D>;
  constexpr bool BF = mma::is_bf16<T>;
  constexpr int NT_S = block_k / 8;  // n8 tiles of S per warp
  constexpr int NT_O = D / 8;        // n8 tiles of O per warp
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const sq_tile = reinterpret_cast<T*>(smem_raw);
  T* const sk_tile = sq_tile + fwd_block_q * P;  // [2][block_k][P]
  T* const sv_tile = sk_tile + 2 * block_k * P;

  forward_tile<T> const ft = locate_forward(q, k, v, mask_in, lay);
  cta_seq const& cs = ft.cs;
  mask_rule const mask = cs.mask;
  std::int64_t const i0 = ft.i0;
  if (i0 >= cs.sq) return;
  int const h = ft.h;
  int const warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  int const g = lane / 4, t = lane % 4;
  T const *const qb = ft.qb, *const kb = ft.kb, *const vb = ft.vb;
  std::int64_t const rows = ft.rows;
  int const ntiles = static_cast<int>((ft.k_end + block_k - 1) / block_k);

  mma::load_tile_async<fwd_block_q, D, P, fwd_threads>(sq_tile, qb, q.ss, rows, q.data);
  if (ntiles > 0) {
    mma::load_tile_async<block_k, D, P, fwd_threads>(sk_tile, kb, k.ss, cs.sk, k.data);
    mma::load_tile_async<block_k, D, P, fwd_threads>(sv_tile, vb, v.ss, cs.sk, v.data);
  }
  mma::cp_async_commit();
  mma::cp_async_wait<0>();
  __syncthreads();

  std::uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    mma::ldmatrix_x4(
        qf[kk], mma::smem_addr(sq_tile + (warp * 16 + lane % 16) * P + kk * 16 + (lane / 16) * 8));

  float oacc[NT_O][4];
  for (auto& x : oacc) x[0] = x[1] = x[2] = x[3] = 0.0f;
  softmax_row_state<float> st[2];  // rows g and g + 8 of this warp; l is this thread's part
  std::int64_t const row0 = i0 + warp * 16 + g;

  for (int j = 0; j < ntiles; ++j) {
    if (j + 1 < ntiles) {
      std::int64_t const jn = std::int64_t(j + 1) * block_k;
      int const buf = (j + 1) & 1;
      mma::load_tile_async<block_k, D, P, fwd_threads>(sk_tile + buf * block_k * P, kb + jn * k.ss,
                                                       k.ss, cs.sk - jn, k.data);
      mma::load_tile_async<block_k, D, P, fwd_threads>(sv_tile + buf * block_k * P, vb + jn * v.ss,
                                                       v.ss, cs.sk - jn, v.data);
      mma::cp_async_commit();
      mma::cp_async_wait<1>();
    } else {
      mma::cp_async_wait<0>();
    }
    __syncthreads();
    T const* const ck = sk_tile + (j & 1) * block_k * P;
    T const* const cv = sv_tile + (j & 1) * block_k * P;

    float s[NT_S][4];
    for (auto& x : s) x[0] = x[1] = x[2] = x[3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int nn = 0; nn < block_k / 16; ++nn) {
        std::uint32_t r[4];
        mma::ldmatrix_x4(r, mma::smem_addr(ck + (nn * 16 + lane % 8 + (lane / 16) * 8) * P +
                                           kk * 16 + ((lane / 8) % 2) * 8));
        mma::mma16816<BF>(s[2 * nn], qf[kk], r[0], r[1]);
        mma::mma16816<BF>(s[2 * nn + 1], qf[kk], r[2], r[3]);
      }

    online_softmax(s, oacc, st, scale, cs, mask, i0, std::int64_t(j) * block_k, row0, t);

#pragma unroll
    for (int kk = 0; kk < block_k / 16; ++kk) {
      std::uint32_t const a[4] = {mma::pack2<BF>(s[2 * kk][0], s[2 * kk][1]),
                                  mma::pack2<BF>(s[2 * kk][2], s[2 * kk][3]),
                                  mma::pack2<BF>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  mma::pack2<BF>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nn = 0; nn < D / 16; ++nn) {
        std::uint32_t r[4];
        mma::ldmatrix_x4_trans(
            r, mma::smem_addr(cv + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * P + nn * 16 +
                              (lane / 16) * 8));
        mma::mma16816<BF>(oacc[2 * nn], a, r[0], r[1]);
        mma::mma16816<BF>(oacc[2 * nn + 1], a, r[2], r[3]);
      }
    }
    __syncthreads();  // the next iteration's prefetch overwrites this buffer
  }

  store_forward_rows(oacc, st, o, lse, cs, h, row0, t);
}

//! D[b, h, s] = sum_c dout[b, s, h, c] · o[b, s, h, c] in f32, one warp per row; `dsum` is
//! [B, Hq, Sq] contiguous.
template <class T, class O>
__global__ void __launch_bounds__(128)
    dsum_kernel(bshd<T const> dout, bshd<O const> o, float* __restrict__ dsum) {
  std::int64_t const row = std::int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
  int const lane = static_cast<int>(threadIdx.x) % 32;
  std::int64_t const rows = dout.b * dout.s * dout.h;
  if (row >= rows) return;
  std::int64_t const h = row % dout.h, s = (row / dout.h) % dout.s, b = row / (dout.h * dout.s);
  float const acc = row_dot(dout, o, b, s, h, lane);
  if (lane == 0) dsum[(b * dout.h + h) * dout.s + s] = acc;
}

//! The backward kernel (see the file comment). Adds into dq (atomically), dk and dv (each CTA
//! owns its key rows of one KV head).
template <class T, int D>
__global__ void __launch_bounds__(threads)
    backward_kernel(bshd<T const> q, bshd<T const> k, bshd<T const> v, bhs<float const> lse,
                    float const* __restrict__ dsum, bshd<T const> dout, bshd<float> dq,
                    bshd<float> dk, bshd<float> dv, mask_rule mask_in, float scale,
                    seq_layout lay) {
  constexpr int P = pitch<D>;
  constexpr int PS = block_q + 8;  // pitch of the dSᵀ tile
  constexpr bool BF = mma::is_bf16<T>;
  constexpr int NT_S = block_q / 8;  // n8 tiles of Sᵀ (queries) per warp
  constexpr int NT_D = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const s_k = reinterpret_cast<T*>(smem_raw);
  T* const s_v = s_k + block_k * P;
  T* const s_q = s_v + block_k * P;
  T* const s_g = s_q + block_q * P;
  T* const s_ds = s_g + block_q * P;  // [block_k][PS]: dSᵀ, keys x queries
  float* const s_lse = reinterpret_cast<float*>(s_ds + block_k * PS);
  float* const s_d = s_lse + block_q;

  cta_seq const cs = locate(lay, q.s, k.s, mask_in);
  mask_rule const mask = cs.mask;
  std::int64_t const j0 = std::int64_t(blockIdx.x) * block_k;
  if (j0 >= cs.sk) return;
  int const hk = static_cast<int>(blockIdx.y);
  int const group = static_cast<int>(q.h / k.h);
  int const warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  int const g = lane / 4, t = lane % 4;
  std::int64_t const key0 = j0 + warp * 16 + g;  // this thread's key rows: key0, key0 + 8

  mma::load_tile_async<block_k, D, P, threads>(
      s_k, k.data + cs.b * k.sb + (cs.k0 + j0) * k.ss + hk * k.sh, k.ss, cs.sk - j0, k.data);
  mma::load_tile_async<block_k, D, P, threads>(
      s_v, v.data + cs.b * v.sb + (cs.k0 + j0) * v.ss + hk * v.sh, v.ss, cs.sk - j0, v.data);
  mma::cp_async_commit();

  float dk_acc[NT_D][4], dv_acc[NT_D][4];
#pragma unroll
  for (int i = 0; i < NT_D; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[i][e] = dv_acc[i][e] = 0.0f;

  // The first query row that sees key j0: j0 <= i + offset.
  std::int64_t i_first = 0;
  if (mask.causal) i_first = j0 - mask.offset > 0 ? j0 - mask.offset : 0;
  std::int64_t const it0 = (i_first / block_q) * block_q;

  for (int hg = 0; hg < group; ++hg) {
    int const h = hk * group + hg;
    for (std::int64_t i0 = it0; i0 < cs.sq; i0 += block_q) {
      std::int64_t const rows = cs.sq - i0 < block_q ? cs.sq - i0 : block_q;
      __syncthreads();  // the previous tile's readers of s_q, s_g, s_ds, s_lse, s_d are done
      mma::load_tile_async<block_q, D, P, threads>(
          s_q, q.data + cs.b * q.sb + (cs.q0 + i0) * q.ss + h * q.sh, q.ss, rows, q.data);
      mma::load_tile_async<block_q, D, P, threads>(
          s_g, dout.data + cs.b * dout.sb + (cs.q0 + i0) * dout.ss + h * dout.sh, dout.ss, rows,
          dout.data);
      mma::cp_async_commit();
      load_row_stats(s_lse, s_d, lse, dsum, cs, q.h, q.s, h, i0, rows);
      mma::cp_async_wait<0>();
      __syncthreads();

      // Sᵀ = K_w Qᵀ (this warp's 16 keys x 64 queries), and dPᵀ = V_w dOᵀ.
      float sacc[NT_S][4], pacc[NT_S][4];
#pragma unroll
      for (int i = 0; i < NT_S; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[i][e] = pacc[i][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t ak[4], av[4];
        int const aoff = (warp * 16 + lane % 16) * P + kk * 16 + (lane / 16) * 8;
        mma::ldmatrix_x4(ak, mma::smem_addr(s_k + aoff));
        mma::ldmatrix_x4(av, mma::smem_addr(s_v + aoff));
#pragma unroll
        for (int nn = 0; nn < block_q / 16; ++nn) {
          int const boff =
              (nn * 16 + lane % 8 + (lane / 16) * 8) * P + kk * 16 + ((lane / 8) % 2) * 8;
          std::uint32_t r[4];
          mma::ldmatrix_x4(r, mma::smem_addr(s_q + boff));
          mma::mma16816<BF>(sacc[2 * nn], ak, r[0], r[1]);
          mma::mma16816<BF>(sacc[2 * nn + 1], ak, r[2], r[3]);
          mma::ldmatrix_x4(r, mma::smem_addr(s_g + boff));
          mma::mma16816<BF>(pacc[2 * nn], av, r[0], r[1]);
          mma::mma16816<BF>(pacc[2 * nn + 1], av, r[2], r[3]);
        }
      }
      backward_probabilities(sacc, pacc, s_lse, s_d, scale, cs, mask, j0, i0, key0, t);
// dV += Pᵀ dO, dK += dSᵀ Q (τ applied at the end), B operands by transposed ldmatrix.
#pragma unroll
      for (int kk = 0; kk < block_q / 16; ++kk) {
        std::uint32_t const ap[4] = {mma::pack2<BF>(sacc[2 * kk][0], sacc[2 * kk][1]),
                                     mma::pack2<BF>(sacc[2 * kk][2], sacc[2 * kk][3]),
                                     mma::pack2<BF>(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]),
                                     mma::pack2<BF>(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3])};
        std::uint32_t const ads[4] = {mma::pack2<BF>(pacc[2 * kk][0], pacc[2 * kk][1]),
                                      mma::pack2<BF>(pacc[2 * kk][2], pacc[2 * kk][3]),
                                      mma::pack2<BF>(pacc[2 * kk + 1][0], pacc[2 * kk + 1][1]),
                                      mma::pack2<BF>(pacc[2 * kk + 1][2], pacc[2 * kk + 1][3])};
        // The packed dSᵀ also goes to shared memory for dQ (row key, column query).
        auto* const ds_row0 = reinterpret_cast<std::uint32_t*>(s_ds + (warp * 16 + g) * PS);
        auto* const ds_row8 = reinterpret_cast<std::uint32_t*>(s_ds + (warp * 16 + g + 8) * PS);
        ds_row0[(kk * 16 + 2 * t) / 2] = ads[0];
        ds_row8[(kk * 16 + 2 * t) / 2] = ads[1];
        ds_row0[(kk * 16 + 8 + 2 * t) / 2] = ads[2];
        ds_row8[(kk * 16 + 8 + 2 * t) / 2] = ads[3];
#pragma unroll
        for (int nn = 0; nn < D / 16; ++nn) {
          int const boff =
              (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * P + nn * 16 + (lane / 16) * 8;
          std::uint32_t r[4];
          mma::ldmatrix_x4_trans(r, mma::smem_addr(s_g + boff));
          mma::mma16816<BF>(dv_acc[2 * nn], ap, r[0], r[1]);
          mma::mma16816<BF>(dv_acc[2 * nn + 1], ap, r[2], r[3]);
          mma::ldmatrix_x4_trans(r, mma::smem_addr(s_q + boff));
          mma::mma16816<BF>(dk_acc[2 * nn], ads, r[0], r[1]);
          mma::mma16816<BF>(dk_acc[2 * nn + 1], ads, r[2], r[3]);
        }
      }
      __syncthreads();  // dSᵀ complete

      // dQ (this warp's 16 queries x D) = dS K over the tile's 64 keys; A = dS from dSᵀ by
      // transposed ldmatrix, B = K by transposed ldmatrix.
      float qacc[NT_D][4];
#pragma unroll
      for (int i = 0; i < NT_D; ++i) qacc[i][0] = qacc[i][1] = qacc[i][2] = qacc[i][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < block_k / 16; ++kk) {
        std::uint32_t a[4];
        mma::ldmatrix_x4_trans(
            a, mma::smem_addr(s_ds + (kk * 16 + lane % 8 + (lane / 16) * 8) * PS + warp * 16 +
                              ((lane / 8) % 2) * 8));
#pragma unroll
        for (int nn = 0; nn < D / 16; ++nn) {
          std::uint32_t r[4];
          mma::ldmatrix_x4_trans(
              r, mma::smem_addr(s_k + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * P + nn * 16 +
                                (lane / 16) * 8));
          mma::mma16816<BF>(qacc[2 * nn], a, r[0], r[1]);
          mma::mma16816<BF>(qacc[2 * nn + 1], a, r[2], r[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        std::int64_t const qr = warp * 16 + g + r * 8;
        if (qr >= rows) continue;
        float* const dst = dq.data + cs.b * dq.sb + (cs.q0 + i0 + qr) * dq.ss + h * dq.sh;
#pragma unroll
        for (int nt = 0; nt < NT_D; ++nt) {
          atomicAdd(dst + nt * 8 + 2 * t, qacc[nt][2 * r] * scale);
          atomicAdd(dst + nt * 8 + 2 * t + 1, qacc[nt][2 * r + 1] * scale);
        }
      }
    }
  }
  mma::cp_async_wait<0>();  // nothing left in flight when no query tile ran
  store_key_grads(dk_acc, dv_acc, dk, dv, cs, hk, key0, t, scale);
}

//! dst <- src (a contiguous float [B, S, H, D] scratch), converted to dst's element type.
template <class X>
__global__ void __launch_bounds__(256)
    store_rows_kernel(float const* __restrict__ src, bshd<X> dst) {
  std::int64_t const n = dst.b * dst.s * dst.h * dst.d;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t const c = i % dst.d, h = (i / dst.d) % dst.h, s = (i / (dst.d * dst.h)) % dst.s,
                       b = i / (dst.d * dst.h * dst.s);
    dst.data[b * dst.sb + s * dst.ss + h * dst.sh + c] = to_out<std::remove_const_t<X>>(src[i]);
  }
}

// ---- host-side checks and launches
// ---------------------------------------------------------------

template <class X>
void check_operand(bshd<X> const& x, char const* name) {
  WEFT_EXPECTS(reinterpret_cast<std::uintptr_t>(x.data) % 16 == 0, name,
               "a 16-byte aligned data pointer (the kernels copy rows by 16-byte cp.async)",
               reinterpret_cast<std::uintptr_t>(x.data) % 16);
  WEFT_EXPECTS(x.sb % 8 == 0 && x.ss % 8 == 0 && x.sh % 8 == 0, name,
               "batch, seq and head strides that are multiples of 8 elements (16 bytes)",
               ::weft::detail::concat("strides ", x.sb, ", ", x.ss, ", ", x.sh));
}

template <class T>
void check_kernel_args(bshd<T const> const& q, bshd<T const> const& k, bshd<T const> const& v) {
  static_assert(mma::is_16bit<T>,
                "weft: the CUDA flash kernels take weft::bf16 or weft::f16 inputs");
  ::weft::attention::detail::check_qkv(q, k, v);
  WEFT_EXPECTS(q.d == 64 || q.d == 128, "q",
               "a head dimension d of 64 or 128 (the CUDA flash kernels' tile sizes)",
               ::weft::detail::concat("d = ", q.d));
  check_operand(q, "q");
  check_operand(k, "k");
  check_operand(v, "v");
  WEFT_EXPECTS(q.h <= 65535 && k.h <= 65535, "q", "at most 65535 heads", q.h);
}

inline void check_scale(float scale) {
  WEFT_EXPECTS(scale > 0.0f && std::isfinite(scale), "scale",
               "a finite positive softmax scale (resolve_scale(0, d) gives 1/sqrt(d))", scale);
}

template <class K, class... A>
void launch(K kernel, dim3 grid, int block, std::size_t smem, cudaStream_t stream,
            A const&... args) {
  WEFT_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  kernel<<<grid, block, smem, stream>>>(args...);
  WEFT_CUDA_TRY(cudaGetLastError());
}

//! Reports whether this device's code of the program has the wgmma instructions (an sm_90a
//! build running on a compute capability 9.0 device).
template <int = 0>
__global__ void wgmma_probe_kernel(int* out) {
  *out = WEFT_WGMMA_DEVICE;
}

//! Per device: 0 not probed yet, 1 wgmma usable, 2 not. Devices 0-63 in an array; any other
//! ordinal in a map of its own (under a lock; its entries are never erased, so the reference
//! stays valid).
inline std::atomic<int>& wgmma_known(int dev) {
  static std::atomic<int> cache[64] = {};
  if (dev >= 0 && dev < 64) return cache[dev];
  static std::mutex lock;
  static std::map<int, std::unique_ptr<std::atomic<int>>> more;
  std::lock_guard<std::mutex> const hold(lock);
  std::unique_ptr<std::atomic<int>>& entry = more[dev];
  if (!entry) entry = std::make_unique<std::atomic<int>>(0);
  return *entry;
}

//! Whether the wgmma kernels run on the current device: probed once per device (a launch and a
//! synchronous copy, on the first call for that device), then cached.
inline bool wgmma_usable() {
  int dev = 0;
  WEFT_CUDA_TRY(cudaGetDevice(&dev));
  std::atomic<int>& cache = wgmma_known(dev);
  if (int const c = cache.load(std::memory_order_acquire); c != 0) return c == 1;
  int major = 0, minor = 0;
  WEFT_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  WEFT_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  bool ok = false;
  if (major == 9 && minor == 0) {
    // An error pending from earlier work is the caller's, not the probe's: surface it rather than
    // absorb it (and cache a wrong answer).
    WEFT_CUDA_TRY(cudaPeekAtLastError());
    int* d = nullptr;
    WEFT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(int)));
    int h = 0;
    wgmma_probe_kernel<><<<1, 1>>>(d);
    cudaError_t const launched = cudaGetLastError();
    cudaError_t const copied = launched == cudaSuccess
                                   ? cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost)
                                   : cudaSuccess;
    cudaFree(d);
    // No code for this device in the program: not usable. Any other failure is an error.
    if (launched != cudaErrorNoKernelImageForDevice && launched != cudaErrorInvalidDeviceFunction)
      WEFT_CUDA_TRY(launched);
    WEFT_CUDA_TRY(copied);
    ok = launched == cudaSuccess && h == 1;
  }
  cache.store(ok ? 1 : 2, std::memory_order_release);
  return ok;
}

//! The process-wide kernel choice (see set_flash_kernel).
inline std::atomic<flash_kernel>& kernel_choice() {
  static std::atomic<flash_kernel> choice{flash_kernel::automatic};
  return choice;
}

inline void check_wgmma_usable() {
  if (wgmma_usable()) return;
  int dev = 0, major = 0, minor = 0;
  WEFT_CUDA_TRY(cudaGetDevice(&dev));
  WEFT_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  WEFT_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  WEFT_EXPECTS(
      false, "flash_kernel::wgmma",
      "a compute capability 9.0 device and a program built for CUDA architecture 90a",
      ::weft::detail::concat("device ", dev, " of compute capability ", major, ".", minor,
                             major == 9 && minor == 0 ? ", code built without sm_90a" : ""));
}

//! The kernels a launch on `stream` (on the current device) uses: the choice, with automatic
//! resolved; wgmma chosen where it cannot run throws. automatic on a device not yet probed, while
//! `stream` is being captured into a CUDA graph, resolves to mma_sync without probing (the probe
//! synchronises, which a capture forbids). Only `stream` is asked: a capture in global mode on
//! another stream would be broken by the probe, so probe first (flash_kernel_in_use()) in a
//! program that captures.
inline flash_kernel launch_kernel(
    cudaStream_t stream, flash_kernel choice = kernel_choice().load(std::memory_order_relaxed)) {
  if (choice == flash_kernel::mma_sync) return choice;
  if (choice == flash_kernel::wgmma || choice == flash_kernel::wgmma_ws ||
      choice == flash_kernel::wgmma_tma) {
    check_wgmma_usable();
    return choice;
  }
  int dev = 0;
  WEFT_CUDA_TRY(cudaGetDevice(&dev));
  if (wgmma_known(dev).load(std::memory_order_acquire) == 0) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    WEFT_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return flash_kernel::mma_sync;
  }
  return wgmma_usable() ? flash_kernel::wgmma_ws : flash_kernel::mma_sync;
}

//! The forward kernels a launch of head dimension `d` uses: launch_kernel's set, except that
//! automatic's Hopper set runs wgmma's forward at d = 128, where it measured faster than the
//! warp-specialised one (H200, S = 4096, causal: 308 against 300 TFLOP/s; at d = 64 the
//! warp-specialised forward is the faster, 251 against 215; benchmarks/RESULTS.md). The choice is
//! read once, so a concurrent set_flash_kernel cannot mix two choices in one launch.
inline flash_kernel forward_kernels(cudaStream_t stream, std::int64_t d) {
  flash_kernel const choice = kernel_choice().load(std::memory_order_relaxed);
  flash_kernel const set = launch_kernel(stream, choice);
  if (choice == flash_kernel::automatic && set == flash_kernel::wgmma_ws && d == 128)
    return flash_kernel::wgmma;
  return set;
}

template <class T, class O>
void forward_launch(cudaStream_t stream, bshd<T const> q, bshd<T const> k, bshd<T const> v,
                    bshd<O> o, bhs<float> lse, mask_rule mask, float scale, seq_layout lay,
                    std::int64_t z, std::int64_t max_sq) {
  if (z == 0 || max_sq == 0) return;
  WEFT_EXPECTS(z <= 65535, lay.cu_q ? "cu_seqlens_q" : "q",
               lay.cu_q ? "at most 65535 documents" : "a batch of at most 65535", z);
  dim3 const grid(static_cast<unsigned>((max_sq + fwd_block_q - 1) / fwd_block_q),
                  static_cast<unsigned>(q.h), static_cast<unsigned>(z));
  flash_kernel kernels = forward_kernels(stream, q.d);
  if (kernels == flash_kernel::wgmma_tma) {
    forward_tensor_maps maps;
    if (tma_forward_maps(maps, q, k, v, lay)) {
      if (q.d == 64)
        launch(forward_kernel_wgmma_tma<T, O, 64>, grid, ws_threads, forward_tma_smem<64>, stream,
               maps.q, maps.k, maps.v, q, k, v, o, lse, mask, scale, lay);
      else
        launch(forward_kernel_wgmma_tma<T, O, 128>, grid, ws_threads, forward_tma_smem<128>, stream,
               maps.q, maps.k, maps.v, q, k, v, o, lse, mask, scale, lay);
      return;
    }
    kernels = flash_kernel::wgmma_ws;  // packed documents, or views TMA cannot describe
  }
  if (kernels == flash_kernel::wgmma_ws) {
    if (q.d == 64)
      launch(forward_kernel_wgmma_ws<T, O, 64>, grid, ws_threads, forward_ws_smem<64>, stream, q, k,
             v, o, lse, mask, scale, lay);
    else
      launch(forward_kernel_wgmma_ws<T, O, 128>, grid, ws_threads, forward_ws_smem<128>, stream, q,
             k, v, o, lse, mask, scale, lay);
    return;
  }
  if (kernels == flash_kernel::wgmma) {
    if (q.d == 64)
      launch(forward_kernel_wgmma<T, O, 64>, grid, fwd_threads, forward_wgmma_smem<64>, stream, q,
             k, v, o, lse, mask, scale, lay);
    else
      launch(forward_kernel_wgmma<T, O, 128>, grid, fwd_threads, forward_wgmma_smem<128>, stream, q,
             k, v, o, lse, mask, scale, lay);
    return;
  }
  if (q.d == 64)
    launch(forward_kernel<T, O, 64>, grid, fwd_threads, forward_smem<64>, stream, q, k, v, o, lse,
           mask, scale, lay);
  else
    launch(forward_kernel<T, O, 128>, grid, fwd_threads, forward_smem<128>, stream, q, k, v, o, lse,
           mask, scale, lay);
}

//! wgmma_tma's backward on a dense layout (tma_backward_maps accepted it): row_stats_kernel into
//! a stream-ordered scratch, then backward_kernel_wgmma_tma (the overlap of Pᵀ and dPᵀ at d = 64,
//! as wgmma_tma's fallback; float2 dQ atomics where v2).
template <class T, class O>
void tma_backward_launch(cudaStream_t stream, backward_tensor_maps const& maps, bshd<T const> q,
                         bshd<T const> k, bshd<O const> o, bhs<float const> lse, bshd<T const> dout,
                         bshd<float> dq, bshd<float> dk, bshd<float> dv, mask_rule mask,
                         float scale, seq_layout lay, std::int64_t z, std::int64_t max_sk,
                         bool v2) {
  std::int64_t const tiles = (q.s + block_q - 1) / block_q;
  std::int64_t const rows = q.b * q.h * tiles * block_q;  // padded to whole tiles
  float* stats = nullptr;
  WEFT_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&stats),
                                static_cast<std::size_t>(rows) * 2 * sizeof(float), stream));
  try {
    row_stats_kernel<T, O>
        <<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(dout, o, lse, stats, tiles);
    WEFT_CUDA_TRY(cudaGetLastError());
    dim3 const grid(static_cast<unsigned>((max_sk + 2 * block_k - 1) / (2 * block_k)),
                    static_cast<unsigned>(k.h), static_cast<unsigned>(z));
    auto const go = [&](auto kernel, std::size_t smem) {
      launch(kernel, grid, 2 * threads, smem, stream, maps.q, maps.k, maps.v, maps.g, q, k,
             static_cast<float const*>(stats), dq, dk, dv, mask, scale, lay);
    };
    if (q.d == 64 && v2)
      go(backward_kernel_wgmma_tma<T, 64, true, true>, backward_tma_smem<64>);
    else if (q.d == 64)
      go(backward_kernel_wgmma_tma<T, 64, false, true>, backward_tma_smem<64>);
    else if (v2)
      go(backward_kernel_wgmma_tma<T, 128, true, false>, backward_tma_smem<128>);
    else
      go(backward_kernel_wgmma_tma<T, 128, false, false>, backward_tma_smem<128>);
  } catch (...) {
    cudaFreeAsync(stats, stream);
    throw;
  }
  WEFT_CUDA_TRY(cudaFreeAsync(stats, stream));
}

template <class T, class O>
void backward_launch(cudaStream_t stream, bshd<T const> q, bshd<T const> k, bshd<T const> v,
                     bshd<O const> o, bhs<float const> lse, bshd<T const> dout, bshd<float> dq,
                     bshd<float> dk, bshd<float> dv, mask_rule mask, float scale, seq_layout lay,
                     std::int64_t z, std::int64_t max_sk) {
  if (z == 0 || max_sk == 0 || q.s == 0) return;
  WEFT_EXPECTS(z <= 65535, lay.cu_q ? "cu_seqlens_q" : "q",
               lay.cu_q ? "at most 65535 documents" : "a batch of at most 65535", z);
  // Checked before the scratch is allocated, so that a refusal leaks nothing.
  flash_kernel const kernels = launch_kernel(stream);
  bool const two_wg = kernels == flash_kernel::wgmma_ws || kernels == flash_kernel::wgmma_tma;
  bool const wgmma = kernels == flash_kernel::wgmma || two_wg;
  // Float2 dQ atomics where every row of dq is 8-byte aligned (D is even).
  bool const v2 = reinterpret_cast<std::uintptr_t>(dq.data) % 8 == 0 && dq.sb % 2 == 0 &&
                  dq.ss % 2 == 0 && dq.sh % 2 == 0;
  if (kernels == flash_kernel::wgmma_tma) {
    backward_tensor_maps maps;
    if (tma_backward_maps(maps, q, k, v, dout, lay)) {
      tma_backward_launch(stream, maps, q, k, o, lse, dout, dq, dk, dv, mask, scale, lay, z, max_sk,
                          v2);
      return;
    }
    // Packed documents, or views TMA cannot describe: wgmma_ws's kernel (below), with the
    // overlap of Pᵀ and dPᵀ at d = 64.
  }
  std::int64_t const rows = q.b * q.s * q.h;
  float* dsum = nullptr;
  WEFT_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&dsum),
                                static_cast<std::size_t>(rows) * sizeof(float), stream));
  // The scratch is freed (stream-ordered) whether the launches succeed or throw.
  try {
    dsum_kernel<T, O><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(dout, o, dsum);
    WEFT_CUDA_TRY(cudaGetLastError());
    if (two_wg) {
      // Two warpgroups, 128 keys a CTA.
      dim3 const grid2(static_cast<unsigned>((max_sk + 2 * block_k - 1) / (2 * block_k)),
                       static_cast<unsigned>(k.h), static_cast<unsigned>(z));
      auto const go = [&](auto kernel, std::size_t smem) {
        launch(kernel, grid2, 2 * threads, smem, stream, q, k, v, lse,
               static_cast<float const*>(dsum), dout, dq, dk, dv, mask, scale, lay);
      };
      // wgmma_tma's: the same kernel, Pᵀ formed while dPᵀ's products run, at d = 64 (at d = 128
      // that form spills 40-48 bytes, ptxas 13.0: wgmma_ws's kernel runs there).
      bool const overlap = kernels == flash_kernel::wgmma_tma && q.d == 64;
      auto const pick = [&](auto overlap_c) {
        constexpr bool Ov = decltype(overlap_c)::value;
        if (q.d == 64 && v2)
          go(backward_kernel_wgmma<T, 64, 2, true, true, Ov>, backward_wgmma_smem<64, 2>);
        else if (q.d == 64)
          go(backward_kernel_wgmma<T, 64, 2, true, false, Ov>, backward_wgmma_smem<64, 2>);
        else if (v2)
          go(backward_kernel_wgmma<T, 128, 2, true, true>, backward_wgmma_smem<128, 2>);
        else
          go(backward_kernel_wgmma<T, 128, 2, true, false>, backward_wgmma_smem<128, 2>);
      };
      if (overlap)
        pick(std::true_type{});
      else
        pick(std::false_type{});
    } else {
      dim3 const grid(static_cast<unsigned>((max_sk + block_k - 1) / block_k),
                      static_cast<unsigned>(k.h), static_cast<unsigned>(z));
      if (wgmma && q.d == 64)
        launch(backward_kernel_wgmma<T, 64>, grid, threads, backward_wgmma_smem<64>, stream, q, k,
               v, lse, static_cast<float const*>(dsum), dout, dq, dk, dv, mask, scale, lay);
      else if (wgmma)
        launch(backward_kernel_wgmma<T, 128>, grid, threads, backward_wgmma_smem<128>, stream, q, k,
               v, lse, static_cast<float const*>(dsum), dout, dq, dk, dv, mask, scale, lay);
      else if (q.d == 64)
        launch(backward_kernel<T, 64>, grid, threads, backward_smem<64>, stream, q, k, v, lse,
               static_cast<float const*>(dsum), dout, dq, dk, dv, mask, scale, lay);
      else
        launch(backward_kernel<T, 128>, grid, threads, backward_smem<128>, stream, q, k, v, lse,
               static_cast<float const*>(dsum), dout, dq, dk, dv, mask, scale, lay);
    }
  } catch (...) {
    cudaFreeAsync(dsum, stream);
    throw;
  }
  WEFT_CUDA_TRY(cudaFreeAsync(dsum, stream));
}

}  // namespace flash_detail

}  // namespace weft::attention::kernels
