// weft/rl/cuda/logprobs.cuh — CUDA kernels for token log-probs, entropy and dlogits: one block
// per token, per-thread online softmax statistics merged with a CUB block reduction, then the
// same WEFT_HD functors as the CPU path (softmax_push/merge/finish, logit_grad) per logit.
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

//! Visits the elements [0, n) of a row, thread `tid` of `Block` taking its share: f(v, x) with the
//! element's index and value. The aligned middle of the row is read in 16-byte vectors, two in
//! flight per thread (a bandwidth-bound loop needs several loads outstanding; one scalar load per
//! iteration left the forward at a sixth of the copy bandwidth); the unaligned head and the tail
//! are read one element at a time. Only the order in which a thread sees its elements depends on
//! this, not which elements are seen.
template <int Block, class L, class F>
__device__ WEFT_FORCEINLINE void for_row(L const* __restrict__ z, std::int64_t n, F&& f) {
  constexpr int N = 16 / static_cast<int>(sizeof(L));
  constexpr int U = 2;
  auto const tid = static_cast<std::int64_t>(threadIdx.x);
  auto const addr = reinterpret_cast<std::uintptr_t>(z);
  std::int64_t head =
      addr % sizeof(L) != 0 ? n : static_cast<std::int64_t>(((16 - addr % 16) % 16) / sizeof(L));
  if (head > n) head = n;
  for (std::int64_t v = tid; v < head; v += Block) f(v, z[v]);
  std::int64_t const nvec = (n - head) / N;
  auto const* zv = reinterpret_cast<uint4 const*>(z + head);
  std::int64_t i = tid;
  for (; i + (U - 1) * Block < nvec; i += U * Block) {
    uint4 buf[U];
#pragma unroll
    for (int u = 0; u < U; ++u) buf[u] = __ldg(zv + i + u * Block);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      L const* e = reinterpret_cast<L const*>(&buf[u]);
      std::int64_t const v0 = head + (i + u * Block) * N;
#pragma unroll
      for (int j = 0; j < N; ++j) f(v0 + j, e[j]);
    }
  }
  for (; i < nvec; i += Block) {
    uint4 const b = __ldg(zv + i);
    L const* e = reinterpret_cast<L const*>(&b);
#pragma unroll
    for (int j = 0; j < N; ++j) f(head + i * N + j, e[j]);
  }
  for (std::int64_t v = head + nvec * N + tid; v < n; v += Block) f(v, z[v]);
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

//! Accumulates one logit into per-thread softmax statistics.
template <class L>
struct push_logit {
  softmax_stats<compute_t<L>>* s;
  compute_t<L> inv_tau;
  __device__ WEFT_FORCEINLINE void operator()(std::int64_t, L x) const {
    using C = compute_t<L>;
    *s = softmax_push{}(*s, static_cast<C>(static_cast<compute_t<L>>(x)) * inv_tau);
  }
};

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
  softmax_stats<C> s{};
  detail::for_row<Block>(z, vocab, detail::push_logit<L>{&s, inv_tau});
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
  logit_grad<C> const fn{l,
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
  log_prob_forward_kernel<logprob_block, L, I, T>
      <<<static_cast<unsigned>(tokens), logprob_block, 0, stream>>>(
          logits, vocab, targets, tokens, inv_tau, opt.ignore_index, logp, entropy, lse);
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
  log_prob_backward_kernel<logprob_block, L, I, T, D>
      <<<static_cast<unsigned>(tokens), logprob_block, 0, stream>>>(
          logits, vocab, targets, tokens, inv_tau, opt.ignore_index, lse, entropy, d_logp,
          d_entropy, dlogits);
}

}  // namespace weft::rl::kernels
