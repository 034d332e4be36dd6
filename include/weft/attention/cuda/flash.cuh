// weft/attention/cuda/flash.cuh — flash attention forward and backward as CUDA kernels
// (FlashAttention-2 on mma.sync tensor cores, bf16/f16 inputs, f32 accumulation), the CUDA twin
// of weft/attention/flash.hpp: same layout ([batch, seq, heads, dim]), MHA/GQA/MQA, causal masks
// of any offset, packed cu_seqlens, and the same per-row math (softmax_row_state's rescale, lse
// and 1/l; its weight and recompute_probability with their semantics, on exp2: see `weight`).
//
// Forward: one CTA of 8 warps per (128-row query tile, head, batch or document); each warp owns
// 16 query rows; K/V tiles of 64 keys stream through shared memory by cp.async, double-buffered
// (a 128-row tile halves the K/V traffic per flop against 64 rows); S = Q Kᵀ and O += P V run on
// m16n8k16 mma.sync, the online softmax in registers in f32. Key tiles past the causal boundary
// are skipped; only tiles that cross it (or the end of the keys) are masked.
// Backward: a row-sum kernel forms Dᵢ = rowsum(dOᵢ ∘ Oᵢ); then one CTA per (64-key tile, KV head,
// batch or document) loops over the group's query heads and the query tiles that see its keys,
// recomputes P = exp(S − L), and accumulates dV += Pᵀ dO, dK += τ dSᵀ Q in registers (each warp
// owns 16 keys; GQA needs no atomics for dk/dv) and dQ += τ dS K by float atomicAdd.
// Hopper (compute capability 9.0 and an sm_90a build; the default there, flash_kernel::automatic):
// the same two designs with their products on warpgroup MMA (wgmma m64nNk16, operands in
// 128-byte-swizzled shared memory or, for P, Pᵀ and dSᵀ, in registers): the forward on 128-key
// tiles with the softmax of one tile overlapping the previous tile's O += P V (at d = 64 with a
// producer warpgroup loading for the two consumers), the backward's five products per 64 x 64
// tile with two warpgroups sharing each query tile's loads, and the same row math.
// flash_kernel::wgmma_tma (compiled, not yet run on a GPU) adds FlashAttention-3's TMA loads and
// ping-pong scheduling to the warp-specialised forward, and TMA loads on mbarrier stages to the
// two-warpgroup backward. set_flash_kernel picks one set for the process.
// The kernels are in detail/: flash_kernels.cuh (the mma.sync kernels and every launch),
// flash_wgmma_kernels.cuh (the Hopper kernels), flash_ws_kernels.cuh (the warp-specialised Hopper
// forwards), flash_tma_backward.cuh (wgmma_tma's backward) and flash_rows.cuh (the row code all
// share). This
// header holds the entry points (raw views on a stream, and exec::cuda with tensor views).
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/attention/cuda/flash.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/args.hpp>
#include <weft/attention/common.hpp>
#include <weft/attention/cuda/detail/flash_kernels.cuh>
#include <weft/attention/softmax_state.hpp>
#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/exec.hpp>
#include <weft/core/math.hpp>
#include <weft/core/tensor.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

// Kernels live in weft::attention::kernels, not weft::attention::cuda (a namespace named `cuda`
// would hide CCCL's ::cuda for every header parsed after this one).
namespace weft::attention::kernels {

using ::weft::attention::detail::bhs;
using ::weft::attention::detail::bshd;

//! Selects the kernels of every later flash launch, forward and backward, in this process (the
//! choice is global, as torch.backends.cuda's SDPA switches are; launches already queued keep
//! theirs). The default, automatic, runs the Hopper kernels on each device where they run (the
//! two-warpgroup backward of wgmma_ws; the warp-specialised forward at d = 64 and wgmma's at
//! d = 128, the faster of each) and mma_sync elsewhere. wgmma or wgmma_ws is checked here on the
//! current device, and again at
//! each launch on the launching device: where it cannot run (not compute capability 9.0, or code
//! built without sm_90a) the call throws invalid_argument_error naming the device. The first check
//! on a device (automatic's included, at its first launch there) probes it with one tiny launch and
//! a synchronous copy; under automatic, a launch on a device not yet probed while its stream is
//! being captured into a CUDA graph uses mma_sync (call flash_kernel_in_use() once before the
//! capture to probe).
inline void set_flash_kernel(flash_kernel choice) {
  WEFT_EXPECTS(choice == flash_kernel::mma_sync || choice == flash_kernel::wgmma ||
                   choice == flash_kernel::automatic || choice == flash_kernel::wgmma_ws ||
                   choice == flash_kernel::wgmma_tma,
               "choice", "flash_kernel::mma_sync, wgmma, automatic, wgmma_ws or wgmma_tma",
               static_cast<int>(choice));
  if (choice == flash_kernel::wgmma || choice == flash_kernel::wgmma_ws ||
      choice == flash_kernel::wgmma_tma)
    flash_detail::check_wgmma_usable();
  flash_detail::kernel_choice().store(choice, std::memory_order_relaxed);
}
//! The choice set_flash_kernel made (automatic by default).
inline flash_kernel get_flash_kernel() {
  return flash_detail::kernel_choice().load(std::memory_order_relaxed);
}
//! The kernels a flash launch on the current device uses now: mma_sync, wgmma or wgmma_ws
//! (automatic resolved: wgmma_ws where the Hopper kernels run, whose d = 128 forward is wgmma's;
//! probes the device if not yet done, so not inside a CUDA graph capture).
inline flash_kernel flash_kernel_in_use() { return flash_detail::launch_kernel(cudaStreamLegacy); }

//! Flash attention forward on `stream` (asynchronous). q [B, Sq, Hq, D], k, v [B, Sk, Hkv, D] of
//! T (weft::bf16 or weft::f16), Hq % Hkv == 0, D 64 or 128; o [B, Sq, Hq, D] of O (T or float);
//! lse [B, Hq, Sq] float (natural log; -inf for a row with no visible key, whose o row is 0). The
//! mask is in (query row, key row) coordinates of these views (ring steps pass their offsets).
//! All pointers are device memory; q, k, v rows 16-byte aligned. Shapes are checked before any
//! launch; values are not (a non-finite q or k gives non-finite rows, not an exception).
template <class T, class O>
void flash_forward(cudaStream_t stream, bshd<T const> q, bshd<T const> k, bshd<T const> v,
                   bshd<O> o, bhs<float> lse, mask_rule mask, float scale) {
  static_assert(std::is_same_v<O, T> || std::is_same_v<O, float>, "weft: o is of T or float");
  flash_detail::check_kernel_args(q, k, v);
  ::weft::attention::detail::check_same_shape(q, o, "o");
  ::weft::attention::detail::check_lse_shape(q, lse, "lse");
  flash_detail::check_scale(scale);
  // With no key (k.s == 0) every CTA skips its key loop and writes o = 0, lse = -inf.
  flash_detail::forward_launch(stream, q, k, v, o, lse, mask, scale, {}, q.b, q.s);
}

//! Flash attention backward on `stream` (asynchronous): ADDS this block's gradients into float dq
//! [B, Sq, Hq, D], dk and dv [B, Sk, Hkv, D] (the caller zeroes them for a plain call). o and lse
//! are the global forward results for these query rows (a ring step passes the merged o and lse);
//! dout [B, Sq, Hq, D] of T. GQA: dk/dv sum over the head group. dq is added by float atomics, so
//! its bits may differ from run to run by the order of additions.
template <class T, class O>
void flash_backward_accumulate(cudaStream_t stream, bshd<T const> q, bshd<T const> k,
                               bshd<T const> v, bshd<O const> o, bhs<float const> lse,
                               bshd<T const> dout, bshd<float> dq, bshd<float> dk, bshd<float> dv,
                               mask_rule mask, float scale) {
  static_assert(std::is_same_v<O, T> || std::is_same_v<O, float>, "weft: o is of T or float");
  flash_detail::check_kernel_args(q, k, v);
  ::weft::attention::detail::check_same_shape(q, o, "o");
  ::weft::attention::detail::check_lse_shape(q, lse, "lse");
  ::weft::attention::detail::check_gradient_shapes(q, k, dout, dq, dk, dv);
  flash_detail::check_operand(dout, "dout");
  flash_detail::check_scale(scale);
  flash_detail::backward_launch(stream, q, k, v, o, lse, dout, dq, dk, dv, mask, scale, {}, q.b,
                                k.s);
}

//! Packed variable-length forward: batch 1, documents concatenated along S; document n spans rows
//! [cu_q[n], cu_q[n+1]) of q, o, lse and [cu_k[n], cu_k[n+1]) of k, v, attending only within
//! itself with the causal alignment `causal` per document. cu_q, cu_k are DEVICE int32 arrays of
//! docs + 1 entries (0 first, the totals last; not checked on the device); max_sq, max_sk are
//! the longest document lengths (host values, at least the true maxima).
template <class T, class O>
void flash_forward_varlen(cudaStream_t stream, bshd<T const> q, bshd<T const> k, bshd<T const> v,
                          bshd<O> o, bhs<float> lse, int const* cu_q, int const* cu_k,
                          std::int64_t docs, std::int64_t max_sq, std::int64_t max_sk,
                          causal_mode causal, float scale) {
  static_assert(std::is_same_v<O, T> || std::is_same_v<O, float>, "weft: o is of T or float");
  flash_detail::check_kernel_args(q, k, v);
  ::weft::attention::detail::check_same_shape(q, o, "o");
  ::weft::attention::detail::check_lse_shape(q, lse, "lse");
  WEFT_EXPECTS_SHAPE(q.b == 1, "q", "batch 1 for packed sequences", q.b);
  WEFT_EXPECTS(docs >= 0 && (docs == 0 || (cu_q != nullptr && cu_k != nullptr)), "cu_seqlens_q",
               "device arrays of docs + 1 entries", docs);
  WEFT_EXPECTS(max_sq >= 0 && max_sq <= q.s, "max_seqlen_q",
               ::weft::detail::concat("in [0, ", q.s, "]"), max_sq);
  WEFT_EXPECTS(max_sk >= 0 && max_sk <= k.s, "max_seqlen_k",
               ::weft::detail::concat("in [0, ", k.s, "]"), max_sk);
  flash_detail::check_scale(scale);
  flash_detail::forward_launch(stream, q, k, v, o, lse, mask_rule{}, scale, {cu_q, cu_k, causal},
                               docs, max_sq);
}

//! Packed variable-length backward (adds, as flash_backward_accumulate); arguments as
//! flash_forward_varlen plus the gradients.
template <class T, class O>
void flash_backward_accumulate_varlen(cudaStream_t stream, bshd<T const> q, bshd<T const> k,
                                      bshd<T const> v, bshd<O const> o, bhs<float const> lse,
                                      bshd<T const> dout, bshd<float> dq, bshd<float> dk,
                                      bshd<float> dv, int const* cu_q, int const* cu_k,
                                      std::int64_t docs, std::int64_t max_sq, std::int64_t max_sk,
                                      causal_mode causal, float scale) {
  static_assert(std::is_same_v<O, T> || std::is_same_v<O, float>, "weft: o is of T or float");
  flash_detail::check_kernel_args(q, k, v);
  ::weft::attention::detail::check_same_shape(q, o, "o");
  ::weft::attention::detail::check_lse_shape(q, lse, "lse");
  ::weft::attention::detail::check_gradient_shapes(q, k, dout, dq, dk, dv);
  flash_detail::check_operand(dout, "dout");
  WEFT_EXPECTS_SHAPE(q.b == 1, "q", "batch 1 for packed sequences", q.b);
  WEFT_EXPECTS(docs >= 0 && (docs == 0 || (cu_q != nullptr && cu_k != nullptr)), "cu_seqlens_q",
               "device arrays of docs + 1 entries", docs);
  WEFT_EXPECTS(max_sq >= 0 && max_sq <= q.s, "max_seqlen_q",
               ::weft::detail::concat("in [0, ", q.s, "]"), max_sq);
  WEFT_EXPECTS(max_sk >= 0 && max_sk <= k.s, "max_seqlen_k",
               ::weft::detail::concat("in [0, ", k.s, "]"), max_sk);
  flash_detail::check_scale(scale);
  if (max_sq == 0) return;
  flash_detail::backward_launch(stream, q, k, v, o, lse, dout, dq, dk, dv, mask_rule{}, scale,
                                {cu_q, cu_k, causal}, docs, max_sk);
}

//! Writes a contiguous float [B, S, H, D] buffer into `dst` (any strides), converted to its
//! element type, on `stream`.
template <class X>
void store_rows(cudaStream_t stream, float const* src, bshd<X> dst) {
  std::int64_t const n = dst.b * dst.s * dst.h * dst.d;
  if (n == 0) return;
  std::int64_t const blocks = std::min<std::int64_t>((n + 255) / 256, 65535);
  flash_detail::store_rows_kernel<X><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(src, dst);
  WEFT_CUDA_TRY(cudaGetLastError());
}

}  // namespace weft::attention::kernels

// ---- the user-facing entry points on exec::cuda
// ---------------------------------------------------

namespace weft::attention {

namespace detail {
template <class X>
struct is_owning_cuda_tensor : std::false_type {};
template <class T, std::size_t R>
struct is_owning_cuda_tensor<::weft::tensor<T, R, cuda_space>> : std::true_type {};

//! A contiguous float [b, s, h, d] scratch from the stream-ordered allocator, zeroed.
inline bshd<float> zeroed_scratch(cudaStream_t stream, std::int64_t b, std::int64_t s,
                                  std::int64_t h, std::int64_t d) {
  float* p = nullptr;
  std::size_t const bytes = static_cast<std::size_t>(b * s * h * d) * sizeof(float);
  WEFT_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&p), bytes > 0 ? bytes : 4, stream));
  if (bytes > 0) WEFT_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, stream));
  return contiguous_bshd(p, b, s, h, d);
}
}  // namespace detail

//! A tensor argument of a CUDA attention entry point: a cuda_space Tensor view or an owning
//! cuda_space weft::tensor (whose view() is used).
template <class X>
concept CudaTensorArg = TensorIn<std::remove_cvref_t<X>, cuda_space> ||
    detail::is_owning_cuda_tensor<std::remove_cvref_t<X>>::value;

//! Flash attention forward on the GPU (asynchronous on ex.stream): q [B, Sq, Hq, D], k, v
//! [B, Sk, Hkv, D] of bf16 or f16 with D 64 or 128; o of the input type or float; lse [B, Hq, Sq]
//! float. The same shape and alias checks as the CPU flash_forward (q and k are not scanned for
//! non-finite values: they live on the device).
template <CudaTensorArg QV, CudaTensorArg KV, CudaTensorArg VV, CudaTensorArg OV, CudaTensorArg LV>
void flash_forward(exec::cuda const& ex, QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse,
                   attention_options const& opt = {}) {
  auto const rq = detail::as_const(detail::as_bshd(detail::arg_view(q), "q"));
  auto const rk = detail::as_const(detail::as_bshd(detail::arg_view(k), "k"));
  auto const rv = detail::as_const(detail::as_bshd(detail::arg_view(v), "v"));
  auto const ro = detail::as_bshd(detail::arg_view(o), "o");
  auto const rl = detail::as_bhs(detail::arg_view(lse));
  detail::check_forward_aliases(rq, rk, rv, ro, rl);
  double const scale = resolve_scale(opt.scale, rq.d);
  kernels::flash_forward(ex.stream, rq, rk, rv, ro, rl, make_mask(opt.causal, rq.s, rk.s),
                         static_cast<float>(scale));
}

//! Flash attention backward on the GPU (asynchronous on ex.stream) from dout and the forward's o
//! and lse: OVERWRITES dq, dk, dv (any element type: T or float), accumulating in float scratch
//! from the stream-ordered allocator and converting at the end. Checks as the CPU flash_backward.
template <CudaTensorArg QV, CudaTensorArg KV, CudaTensorArg VV, CudaTensorArg OV, CudaTensorArg LV,
          CudaTensorArg GV, CudaTensorArg DQV, CudaTensorArg DKV, CudaTensorArg DVV>
void flash_backward(exec::cuda const& ex, QV&& q, KV&& k, VV&& v, OV&& o, LV&& lse, GV&& dout,
                    DQV&& dq, DKV&& dk, DVV&& dv, attention_options const& opt = {}) {
  auto const rq = detail::as_const(detail::as_bshd(detail::arg_view(q), "q"));
  auto const rk = detail::as_const(detail::as_bshd(detail::arg_view(k), "k"));
  auto const rv = detail::as_const(detail::as_bshd(detail::arg_view(v), "v"));
  auto const ro = detail::as_const(detail::as_bshd(detail::arg_view(o), "o"));
  auto const rl = detail::as_const(detail::as_bhs(detail::arg_view(lse)));
  auto const rg = detail::as_const(detail::as_bshd(detail::arg_view(dout), "dout"));
  auto const rdq = detail::as_bshd(detail::arg_view(dq), "dq");
  auto const rdk = detail::as_bshd(detail::arg_view(dk), "dk");
  auto const rdv = detail::as_bshd(detail::arg_view(dv), "dv");
  detail::check_qkv(rq, rk, rv);
  detail::check_same_shape(rq, ro, "o");
  detail::check_lse_shape(rq, rl, "lse");
  detail::check_gradient_shapes(rq, rk, rg, rdq, rdk, rdv);
  detail::check_backward_aliases(rq, rk, rv, ro, rl, rg, rdq, rdk, rdv);
  double const scale = resolve_scale(opt.scale, rq.d);
  kernels::flash_detail::check_kernel_args(rq, rk, rv);  // throws before anything is allocated
  auto const sq = detail::zeroed_scratch(ex.stream, rq.b, rq.s, rq.h, rq.d);
  auto const sk = detail::zeroed_scratch(ex.stream, rk.b, rk.s, rk.h, rk.d);
  auto const sv = detail::zeroed_scratch(ex.stream, rk.b, rk.s, rk.h, rk.d);
  kernels::flash_backward_accumulate(ex.stream, rq, rk, rv, ro, rl, rg, sq, sk, sv,
                                     make_mask(opt.causal, rq.s, rk.s), static_cast<float>(scale));
  kernels::store_rows(ex.stream, sq.data, rdq);
  kernels::store_rows(ex.stream, sk.data, rdk);
  kernels::store_rows(ex.stream, sv.data, rdv);
  for (float* p : {sq.data, sk.data, sv.data}) WEFT_CUDA_TRY(cudaFreeAsync(p, ex.stream));
}

}  // namespace weft::attention
