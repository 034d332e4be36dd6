// weft/rl/cuda/logprobs.cuh — CUDA kernels for token log-probs, entropy and dlogits: one block
// per token, rows read in 16-byte vectors, per-thread softmax statistics of 4-32 logits at a time
// (f64 4, f32 8, 16-bit 32) by core/math.hpp's softmax_push_chunk (run on an H200 in the third
// GPU run), merged with the CPU path's softmax_merge (also in the CUB block reduction),
// then the same WEFT_HD functors as the CPU path (softmax_finish, logit_grad) per logit; the
// forward's exponentials are the SFU's ex2.approx for float, the backward's fast_exp (__expf).
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/rl/cuda/logprobs.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/rl/logprobs.hpp>

#include <cub/block/block_reduce.cuh>
#include <cuda_runtime_api.h>

#include <cstdint>

// Kernels live in weft::rl::kernels, not weft::rl::cuda: a namespace named `cuda` inside weft::rl
// would hide CCCL's ::cuda for every rl header parsed after this one.
namespace weft::rl::kernels {

namespace detail {

//! e^x for the kernels' inner loops: the SFU's ex2.approx for float (__expf: about 2 ulp near 0,
//! relative error growing with |x|, so for the e^{x - max} <= 1 of a softmax at most ~3e-5 of a
//! term already below e^-80), weft's exp_fn for double. The CPU path uses exp_fn everywhere; the
//! tests compare within their tolerance (1e-5 relative).
struct fast_exp {
  __device__ WEFT_FORCEINLINE float operator()(float x) const noexcept { return __expf(x); }
  __device__ WEFT_FORCEINLINE double operator()(double x) const noexcept { return exp_fn{}(x); }
};

//! 2^x on the special-function unit (ex2.approx.ftz.f32: within 2 ulp; -inf and anything below
//! -126 give +0).
__device__ WEFT_FORCEINLINE float ex2_approx(float x) noexcept {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

//! The factor that puts a logit/tau into push_values' units: log2(e) for float (its exponentials
//! are base 2 on the SFU), 1 for double.
template <class C>
inline constexpr C push_unit = sizeof(C) == 4 ? C(1.44269504088896341) : C(1);

//! exp_u of softmax_push_chunk: 2^d on the SFU for float, e^d by exp_fn for double.
struct exp_in_units {
  __device__ WEFT_FORCEINLINE float operator()(float d) const noexcept { return ex2_approx(d); }
  __device__ WEFT_FORCEINLINE double operator()(double d) const noexcept { return exp_fn{}(d); }
};

//! The statistics of K raw logits at once (logit · inv_tau is the value), merged into `s` by
//! core/math.hpp's softmax_push_chunk (the host-tested chunk math: softmax_push's rules, one
//! NaN-propagating max of the raw logits, then per logit one FMA into push_unit units, ex2, an add
//! and an FMA; poison and an all -inf chunk tested once per chunk). The forward of a bf16 row is
//! bound by these instructions, not by memory.
template <int K, class C>
__device__ WEFT_FORCEINLINE softmax_stats<C> push_values(softmax_stats<C> s, C const (&raw)[K],
                                                         C inv_tau) {
  return softmax_push_chunk(s, raw, inv_tau * push_unit<C>, C(1) / push_unit<C>, exp_in_units{});
}

//! A thread's softmax statistics of logits/tau over its share of a row of n logits, thread `tid`
//! of `Block`. The aligned middle of the row is read in 16-byte vectors, two or four in flight per
//! thread (one scalar load per iteration left the forward at a sixth of the copy bandwidth), and
//! pushed together (push_values: one merge per 8 to 32 logits, not one rescale per logit);
//! the unaligned head and the tail go through softmax_push one at a time.
template <int Block, class L>
__device__ WEFT_FORCEINLINE softmax_stats<compute_t<L>> row_stats(L const* __restrict__ z,
                                                                  std::int64_t n,
                                                                  compute_t<L> inv_tau) {
  using C = compute_t<L>;
  constexpr int N = 16 / static_cast<int>(sizeof(L));
  // Vectors in flight per thread, pushed together: four for 16-bit logits (32 values per merge:
  // their forward is bound by instructions per logit), two otherwise.
  constexpr int U = sizeof(L) == 2 ? 4 : 2;
  softmax_stats<C> s{};
  auto const tid = static_cast<std::int64_t>(threadIdx.x);
  auto const addr = reinterpret_cast<std::uintptr_t>(z);
  auto const value = [inv_tau](L x) {
    return static_cast<C>(static_cast<compute_t<L>>(x)) * inv_tau;
  };
  auto const raw = [](L x) { return static_cast<C>(static_cast<compute_t<L>>(x)); };
  std::int64_t head =
      addr % sizeof(L) != 0 ? n : static_cast<std::int64_t>(((16 - addr % 16) % 16) / sizeof(L));
  if (head > n) head = n;
  for (std::int64_t v = tid; v < head; v += Block) s = softmax_push{}(s, value(z[v]));
  std::int64_t const nvec = (n - head) / N;
  auto const* zv = reinterpret_cast<uint4 const*>(z + head);
  std::int64_t i = tid;
  for (; i + (U - 1) * Block < nvec; i += U * Block) {
    uint4 buf[U];
#pragma unroll
    for (int u = 0; u < U; ++u) buf[u] = __ldg(zv + i + u * Block);
    C x[U * N];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      L const* e = reinterpret_cast<L const*>(&buf[u]);
#pragma unroll
      for (int j = 0; j < N; ++j) x[u * N + j] = raw(e[j]);
    }
    s = push_values(s, x, inv_tau);
  }
  for (; i < nvec; i += Block) {
    uint4 const b = __ldg(zv + i);
    L const* e = reinterpret_cast<L const*>(&b);
    C x[N];
#pragma unroll
    for (int j = 0; j < N; ++j) x[j] = raw(e[j]);
    s = push_values(s, x, inv_tau);
  }
  for (std::int64_t v = head + nvec * N + tid; v < n; v += Block)
    s = softmax_push{}(s, value(z[v]));
  return s;
}

//! out[v] = g(v, z[v]) over a row. When out's elements are as wide as z's and both rows sit at
//! the same offset from a 16-byte boundary, the aligned middle is read and written in 16-byte
//! vectors (a warp's stores then cover whole lines); otherwise element by element, coalesced.
template <int Block, class L, class D, class G>
__device__ WEFT_FORCEINLINE void map_row(L const* __restrict__ z, D* __restrict__ out,
                                         std::int64_t n, G&& g) {
  auto const az = reinterpret_cast<std::uintptr_t>(z), ao = reinterpret_cast<std::uintptr_t>(out);
  if constexpr (sizeof(D) == sizeof(L)) {
    if (az % 16 == ao % 16 && az % sizeof(L) == 0) {
      constexpr int N = 16 / static_cast<int>(sizeof(L));
      auto const tid = static_cast<std::int64_t>(threadIdx.x);
      std::int64_t head = static_cast<std::int64_t>(((16 - az % 16) % 16) / sizeof(L));
      if (head > n) head = n;
      for (std::int64_t v = tid; v < head; v += Block) out[v] = g(v, z[v]);
      std::int64_t const nvec = (n - head) / N;
      auto const* zv = reinterpret_cast<uint4 const*>(z + head);
      auto* ov = reinterpret_cast<uint4*>(out + head);
      for (std::int64_t i = tid; i < nvec; i += Block) {
        uint4 const b = __ldg(zv + i);
        L const* e = reinterpret_cast<L const*>(&b);
        uint4 r;
        D* d = reinterpret_cast<D*>(&r);
#pragma unroll
        for (int j = 0; j < N; ++j) d[j] = g(head + i * N + j, e[j]);
        ov[i] = r;
      }
      for (std::int64_t v = head + nvec * N + tid; v < n; v += Block) out[v] = g(v, z[v]);
      return;
    }
  }
  for (std::int64_t v = threadIdx.x; v < n; v += Block) out[v] = g(v, z[v]);
}

}  // namespace detail

//! Statistics of logits/tau for one token per block; writes logp, entropy and lse (f32 compute
//! for f32/bf16/f16 logits, f64 for f64). Ignored targets give zeros.
template <int Block, class L, class I, class T>
__global__ void __launch_bounds__(Block)
    log_prob_forward_kernel(L const* __restrict__ logits, std::int64_t vocab,
                            I const* __restrict__ targets, std::int64_t tokens,
                            compute_t<L> inv_tau, std::int64_t ignore_index, T* __restrict__ logp,
                            T* __restrict__ entropy, T* __restrict__ lse) {
  using C = compute_t<L>;
  using reduce = cub::BlockReduce<softmax_stats<C>, Block>;
  __shared__ typename reduce::TempStorage temp;
  std::int64_t const k = blockIdx.x;
  if (k >= tokens) return;
  auto const o = static_cast<std::int64_t>(targets[k]);
  if (o == ignore_index) {
    if (threadIdx.x == 0) {
      logp[k] = entropy[k] = T(0);
      if (lse != nullptr) lse[k] = T(0);
    }
    return;
  }
  L const* z = logits + k * vocab;
  softmax_stats<C> const s = detail::row_stats<Block>(z, vocab, inv_tau);
  softmax_stats<C> const total = reduce(temp).Reduce(s, softmax_merge{});
  if (threadIdx.x == 0) {
    C const l = softmax_finish{}.lse(total);
    C const x = static_cast<C>(static_cast<compute_t<L>>(z[o])) * inv_tau;
    logp[k] = static_cast<T>(l > -::cuda::std::numeric_limits<C>::infinity() ? x - l : l);
    entropy[k] = static_cast<T>(softmax_finish{}.entropy(total));
    if (lse != nullptr) lse[k] = static_cast<T>(l);
  }
}

//! dlogits for one token per block from the forward's lse and entropy (either upstream may be
//! null).
template <int Block, class L, class I, class T, class D>
__global__ void __launch_bounds__(Block)
    log_prob_backward_kernel(L const* __restrict__ logits, std::int64_t vocab,
                             I const* __restrict__ targets, std::int64_t tokens,
                             compute_t<L> inv_tau, std::int64_t ignore_index,
                             T const* __restrict__ lse, T const* __restrict__ entropy,
                             T const* __restrict__ d_logp, T const* __restrict__ d_entropy,
                             D* __restrict__ dlogits) {
  using C = compute_t<L>;
  std::int64_t const k = blockIdx.x;
  if (k >= tokens) return;
  auto const o = static_cast<std::int64_t>(targets[k]);
  L const* z = logits + k * vocab;
  D* dz = dlogits + k * vocab;
  bool const ignored = o == ignore_index;
  C const gl = ignored || d_logp == nullptr ? C(0) : static_cast<C>(d_logp[k]);
  C const ge = ignored || d_entropy == nullptr ? C(0) : static_cast<C>(d_entropy[k]);
  C const l = static_cast<C>(lse[k]);
  // lse -inf (an all -inf row): zero row; NaN (a NaN or +inf logit): NaN propagates.
  bool const zero =
      ignored || l == -::cuda::std::numeric_limits<C>::infinity() || (gl == C(0) && ge == C(0));
  logit_grad<C, detail::fast_exp> const fn{
      l,
      static_cast<C>(static_cast<double>(lse[k]) - static_cast<double>(l)),
      static_cast<C>(entropy[k]),
      gl,
      ge,
      inv_tau};
  if (zero) {
    for (std::int64_t v = threadIdx.x; v < vocab; v += Block) dz[v] = D(0);
    return;
  }
  // Each element's gradient is pointwise: the same bits whichever way the row is traversed.
  detail::map_row<Block>(z, dz, vocab, [&](std::int64_t v, L x) {
    C g = fn(static_cast<C>(static_cast<compute_t<L>>(x)) * inv_tau);
    if (v == o) g += gl * inv_tau;
    return static_cast<D>(g);
  });
}

inline constexpr int logprob_block = 256;

//! Launches the forward on `stream` (asynchronous); all pointers are device memory.
template <class L, class I, class T>
void log_prob_forward(cudaStream_t stream, L const* logits, std::int64_t vocab, I const* targets,
                      std::int64_t tokens, logprob_options const& opt, T* logp, T* entropy,
                      T* lse = nullptr) {
  WEFT_EXPECTS(vocab >= 1, "vocab", ">= 1", vocab);
  auto const inv_tau = weft::rl::detail::inverse_temperature<L>(opt.temperature);
  if (tokens <= 0) return;
  (void)weft::rl::detail::checked_elements(static_cast<std::size_t>(tokens), vocab, "logits");
  WEFT_EXPECTS(tokens <= std::int64_t{0x7fffffff}, "tokens", "<= 2^31 - 1 (one block per token)",
               tokens);
  log_prob_forward_kernel<logprob_block, L, I, T>
      <<<static_cast<unsigned>(tokens), logprob_block, 0, stream>>>(
          logits, vocab, targets, tokens, inv_tau, opt.ignore_index, logp, entropy, lse);
  WEFT_CUDA_TRY(cudaGetLastError());
}

//! Launches the backward on `stream` (asynchronous); all pointers are device memory.
template <class L, class I, class T, class D>
void log_prob_backward(cudaStream_t stream, L const* logits, std::int64_t vocab, I const* targets,
                       std::int64_t tokens, logprob_options const& opt, T const* lse,
                       T const* entropy, T const* d_logp, T const* d_entropy, D* dlogits) {
  WEFT_EXPECTS(vocab >= 1, "vocab", ">= 1", vocab);
  auto const inv_tau = weft::rl::detail::inverse_temperature<L>(opt.temperature);
  if (tokens <= 0) return;
  (void)weft::rl::detail::checked_elements(static_cast<std::size_t>(tokens), vocab, "logits");
  WEFT_EXPECTS(tokens <= std::int64_t{0x7fffffff}, "tokens", "<= 2^31 - 1 (one block per token)",
               tokens);
  log_prob_backward_kernel<logprob_block, L, I, T, D>
      <<<static_cast<unsigned>(tokens), logprob_block, 0, stream>>>(
          logits, vocab, targets, tokens, inv_tau, opt.ignore_index, lse, entropy, d_logp,
          d_entropy, dlogits);
  WEFT_CUDA_TRY(cudaGetLastError());
}

}  // namespace weft::rl::kernels
