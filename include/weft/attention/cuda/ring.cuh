// weft/attention/cuda/ring.cuh — ring attention (contiguous, zigzag, stripe) over a
// StreamCommunicator whose buffers live in device memory (weft's NCCL communicator), forward and
// backward, stream-ordered: block compute on a compute stream, K/V (and, backward, dK/dV) block
// transfers on a transfer stream, CUDA events between them. Each step's send and recv are ONE
// grouped exchange (comm.sendrecv), posted before the current block's compute into the other half
// of a double buffer. The per-step causal rules are plan_ring_step's (attention/ring.hpp); block
// results merge through the WEFT_HD lse_merge of softmax_state.hpp in a merge kernel.
//
// The block compute, scratch memory and stream synchronisation are a policy (`Blocks`), so the
// same ring code runs with the CUDA flash kernels (cuda_ring_blocks, see cuda/flash.cuh) and with
// the CPU flash kernels on host memory (host_ring_blocks: for an NCCL mock whose "device" buffers
// are host memory, where the whole ring runs without a GPU).
#pragma once

#if !defined(__CUDACC__)
#error \
    "weft/attention/cuda/ring.cuh holds CUDA kernels: include it only from .cu files compiled by nvcc"
#endif

#include <weft/attention/common.hpp>
#include <weft/attention/flash.hpp>
#include <weft/attention/ring.hpp>
#include <weft/attention/sharding.hpp>
#include <weft/attention/softmax_state.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/comm/work.hpp>
#include <weft/core/config.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/exec.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#if __has_include(<weft/attention/cuda/flash.cuh>)
#include <weft/attention/cuda/flash.cuh>
#define WEFT_ATTENTION_RING_HAS_CUDA_FLASH 1
#else
#define WEFT_ATTENTION_RING_HAS_CUDA_FLASH 0
#endif

namespace weft::attention {

// Kernels live in weft::attention::kernels, not ...::cuda (a namespace `cuda` would hide CCCL's).
namespace kernels {

//! dst = src element by element (converted), over [B, S, H, D] strided views.
template <class To, class From>
__global__ void ring_copy_bshd_kernel(detail::bshd<From> src, detail::bshd<To> dst) {
  std::int64_t const n = src.b * src.s * src.h * src.d;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t const c = i % src.d;
    std::int64_t const h = (i / src.d) % src.h;
    std::int64_t const s = (i / (src.d * src.h)) % src.s;
    std::int64_t const b = i / (src.d * src.h * src.s);
    dst.data[b * dst.sb + s * dst.ss + h * dst.sh + c] =
        static_cast<To>(static_cast<float>(src.data[b * src.sb + s * src.ss + h * src.sh + c]));
  }
}

//! dst = src over [B, H, S] strided views.
template <class To, class From>
__global__ void ring_copy_bhs_kernel(detail::bhs<From> src, detail::bhs<To> dst) {
  std::int64_t const n = src.b * src.h * src.s;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t const s = i % src.s;
    std::int64_t const h = (i / src.s) % src.h;
    std::int64_t const b = i / (src.s * src.h);
    dst.data[b * dst.sb + h * dst.sh + s * dst.ss] =
        static_cast<To>(src.data[b * src.sb + h * src.sh + s * src.ss]);
  }
}

__global__ inline void ring_fill_kernel(float* p, std::int64_t n, float value) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    p[i] = value;
}

__global__ inline void ring_add_kernel(float* dst, float const* src, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

//! dst += src element by element over [B, S, H, D] strided float views.
__global__ inline void ring_accumulate_bshd_kernel(detail::bshd<float const> src,
                                                   detail::bshd<float> dst) {
  std::int64_t const n = src.b * src.s * src.h * src.d;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t const c = i % src.d;
    std::int64_t const h = (i / src.d) % src.h;
    std::int64_t const s = (i / (src.d * src.h)) % src.s;
    std::int64_t const b = i / (src.d * src.h * src.s);
    dst.data[b * dst.sb + s * dst.ss + h * dst.sh + c] +=
        src.data[b * src.sb + s * src.ss + h * src.sh + c];
  }
}

//! One thread per (batch, head, block row): merges the block result (bo, bl) into rows
//! [q0, q0 + bo.s) of the accumulators with the CPU path's lse_merge.
__global__ inline void ring_merge_kernel(detail::bshd<float> o, detail::bhs<float> l,
                                         detail::bshd<float const> bo, detail::bhs<float const> bl,
                                         std::int64_t q0) {
  std::int64_t const n = bo.b * bo.h * bo.s;
  for (std::int64_t t = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; t < n;
       t += std::int64_t(gridDim.x) * blockDim.x) {
    std::int64_t const i = t % bo.s;
    std::int64_t const h = (t / bo.s) % bo.h;
    std::int64_t const b = t / (bo.s * bo.h);
    lse_merge{}(o.data + b * o.sb + (q0 + i) * o.ss + h * o.sh,
                l.data[b * l.sb + h * l.sh + (q0 + i) * l.ss],
                bo.data + b * bo.sb + i * bo.ss + h * bo.sh,
                bl.data[b * bl.sb + h * bl.sh + i * bl.ss], bo.d);
  }
}

//! A grid for `n` items of a grid-stride loop (at most 4096 blocks of 256 threads).
inline unsigned ring_grid(std::int64_t n) {
  std::int64_t const blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

}  // namespace kernels

// ---- block policies ----------------------------------------------------------------------------
// A Blocks policy for element type T (K/V travel as T; accumulators are float) provides:
//   void* allocate(std::size_t bytes); void deallocate(void*, std::size_t bytes);
//   void* transfer_stream();                       the op_options::stream of the exchanges
//   template <class To, class From> void copy(detail::bshd<From const>, detail::bshd<To>); (compute
//   stream) template <class To, class From> void copy(detail::bhs<From const>, detail::bhs<To>);
//   void fill(float*, std::int64_t n, float);  void add(float* dst, float const*, std::int64_t n);
//   void accumulate(bshd<float const> src, bshd<float> dst);   dst += src (Ulysses replicas)
//   void forward(q, k, v, detail::bshd<float> o, detail::bhs<float> lse, mask_rule, float scale);
//   template <class O> void backward(q, k, v, detail::bshd<O const> o, detail::bhs<float const>
//   lse, dout,
//                                    detail::bshd<float> dq, dk, dv, mask_rule, float scale);
//                                    (adds)
//   void merge(detail::bshd<float> o, detail::bhs<float> l, detail::bshd<float const> bo,
//   detail::bhs<float const> bl, q0); mark after_transfer(comm::work);  the exchange just enqueued;
//   void compute_waits(mark&); void transfer_waits_compute();    later exchanges wait for the
//   compute issued so far; void finish();                    the compute stream waits for every
//   exchange issued.

//! Blocks on host memory with the CPU flash kernels (f32 accumulation), for a communicator whose
//! "device" memory is host memory (weft's NCCL mock). Compute runs on the calling thread, so
//! "the compute waits for an exchange" is work::wait().
template <class T>
struct host_ring_blocks {
  static_assert(std::is_same_v<compute_t<T>, float>,
                "weft: the ring's accumulators are float (T = float, bf16 or f16)");
  using mark = comm::work;
  exec::host ex{};
  void* stream = nullptr;  //!< the transfer stream value handed to the communicator

  void* allocate(std::size_t bytes) {
    void* p = std::calloc(bytes > 0 ? bytes : 1, 1);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept { std::free(p); }
  void* transfer_stream() const noexcept { return stream; }

  template <class To, class From>
  void copy(detail::bshd<From const> src, detail::bshd<To> dst) {
    detail::copy_bshd(src, dst);
  }
  template <class To, class From>
  void copy(detail::bhs<From const> src, detail::bhs<To> dst) {
    detail::copy_bhs(src, dst);
  }
  void fill(float* p, std::int64_t n, float value) { std::fill(p, p + n, value); }
  void add(float* dst, float const* src, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  void accumulate(detail::bshd<float const> src, detail::bshd<float> dst) {
    for (std::int64_t b = 0; b < src.b; ++b)
      for (std::int64_t s = 0; s < src.s; ++s)
        for (std::int64_t h = 0; h < src.h; ++h)
          for (std::int64_t c = 0; c < src.d; ++c) dst.row(b, s, h)[c] += src.row(b, s, h)[c];
  }
  void forward(detail::bshd<T const> q, detail::bshd<T const> k, detail::bshd<T const> v,
               detail::bshd<float> o, detail::bhs<float> lse, mask_rule mask, float scale) {
    detail::flash_forward_raw(ex, q, k, v, o, lse, mask, double(scale));
  }
  template <class O>
  void backward(detail::bshd<T const> q, detail::bshd<T const> k, detail::bshd<T const> v,
                detail::bshd<O const> o, detail::bhs<float const> lse, detail::bshd<T const> dout,
                detail::bshd<float> dq, detail::bshd<float> dk, detail::bshd<float> dv,
                mask_rule mask, float scale) {
    detail::flash_backward_accumulate_raw(ex, q, k, v, o, lse, dout, dq, dk, dv, mask,
                                          double(scale));
  }
  void merge(detail::bshd<float> o, detail::bhs<float> l, detail::bshd<float const> bo,
             detail::bhs<float const> bl, std::int64_t q0) {
    for (std::int64_t b = 0; b < bo.b; ++b)
      for (std::int64_t h = 0; h < bo.h; ++h)
        for (std::int64_t i = 0; i < bo.s; ++i)
          lse_merge{}(o.row(b, q0 + i, h), l.at(b, h, q0 + i), bo.row(b, i, h), bl.at(b, h, i),
                      bo.d);
  }
  mark after_transfer(comm::work w) { return w; }
  void compute_waits(mark& m) { m.wait(); }
  void transfer_waits_compute() noexcept {}
  void finish() noexcept {}
};

//! Blocks on device memory with CUDA kernels. `Flash` supplies the block kernels:
//!   template <class T> static void forward(cudaStream_t, detail::bshd<T const> q, k, v,
//!   detail::bshd<float> o,
//!                                          detail::bhs<float> lse, mask_rule, float scale);
//!   template <class T, class O> static void backward(cudaStream_t, q, k, v, detail::bshd<O const>
//!   o,
//!       detail::bhs<float const> lse, detail::bshd<T const> dout, detail::bshd<float> dq, dk, dv,
//!       mask_rule, float);
//! (cuda_flash_ring_blocks<T> binds the kernels of cuda/flash.cuh.) Scratch is stream-ordered
//! (cudaMallocAsync / cudaFreeAsync on the compute stream); every transfer is bracketed by events.
//! The caller synchronises `compute` before reading the results; the two streams must differ.
template <class T, class Flash>
struct cuda_ring_blocks {
  struct mark {
    cudaEvent_t event = nullptr;
  };
  cudaStream_t compute = nullptr;
  cudaStream_t transfer = nullptr;

  cuda_ring_blocks(cudaStream_t compute_stream, cudaStream_t transfer_stream)
      : compute(compute_stream), transfer(transfer_stream) {
    WEFT_EXPECTS(compute != transfer, "transfer_stream",
                 "a stream other than the compute stream (transfers overlap compute)",
                 "the compute stream");
  }
  cuda_ring_blocks(cuda_ring_blocks const&) = delete;
  cuda_ring_blocks& operator=(cuda_ring_blocks const&) = delete;
  ~cuda_ring_blocks() {
    for (auto& w : pending_) (void)w.done();
  }

  void* allocate(std::size_t bytes) {
    void* p = nullptr;
    WEFT_CUDA_TRY(cudaMallocAsync(&p, bytes > 0 ? bytes : 1, compute));
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept { (void)cudaFreeAsync(p, compute); }
  void* transfer_stream() const noexcept { return transfer; }

  template <class To, class From>
  void copy(detail::bshd<From const> src, detail::bshd<To> dst) {
    std::int64_t const n = src.b * src.s * src.h * src.d;
    if (n == 0) return;
    kernels::ring_copy_bshd_kernel<To, From const>
        <<<kernels::ring_grid(n), 256, 0, compute>>>(src, dst);
    WEFT_CUDA_TRY(cudaGetLastError());
  }
  template <class To, class From>
  void copy(detail::bhs<From const> src, detail::bhs<To> dst) {
    std::int64_t const n = src.b * src.h * src.s;
    if (n == 0) return;
    kernels::ring_copy_bhs_kernel<To, From const>
        <<<kernels::ring_grid(n), 256, 0, compute>>>(src, dst);
    WEFT_CUDA_TRY(cudaGetLastError());
  }
  void fill(float* p, std::int64_t n, float value) {
    if (n == 0) return;
    kernels::ring_fill_kernel<<<kernels::ring_grid(n), 256, 0, compute>>>(p, n, value);
    WEFT_CUDA_TRY(cudaGetLastError());
  }
  void add(float* dst, float const* src, std::int64_t n) {
    if (n == 0) return;
    kernels::ring_add_kernel<<<kernels::ring_grid(n), 256, 0, compute>>>(dst, src, n);
    WEFT_CUDA_TRY(cudaGetLastError());
  }
  void accumulate(detail::bshd<float const> src, detail::bshd<float> dst) {
    std::int64_t const n = src.b * src.s * src.h * src.d;
    if (n == 0) return;
    kernels::ring_accumulate_bshd_kernel<<<kernels::ring_grid(n), 256, 0, compute>>>(src, dst);
    WEFT_CUDA_TRY(cudaGetLastError());
  }
  void forward(detail::bshd<T const> q, detail::bshd<T const> k, detail::bshd<T const> v,
               detail::bshd<float> o, detail::bhs<float> lse, mask_rule mask, float scale) {
    Flash::template forward<T>(compute, q, k, v, o, lse, mask, scale);
  }
  template <class O>
  void backward(detail::bshd<T const> q, detail::bshd<T const> k, detail::bshd<T const> v,
                detail::bshd<O const> o, detail::bhs<float const> lse, detail::bshd<T const> dout,
                detail::bshd<float> dq, detail::bshd<float> dk, detail::bshd<float> dv,
                mask_rule mask, float scale) {
    Flash::template backward<T, O>(compute, q, k, v, o, lse, dout, dq, dk, dv, mask, scale);
  }
  void merge(detail::bshd<float> o, detail::bhs<float> l, detail::bshd<float const> bo,
             detail::bhs<float const> bl, std::int64_t q0) {
    std::int64_t const n = bo.b * bo.h * bo.s;
    if (n == 0) return;
    kernels::ring_merge_kernel<<<kernels::ring_grid(n), 256, 0, compute>>>(o, l, bo, bl, q0);
    WEFT_CUDA_TRY(cudaGetLastError());
  }
  //! An event on the transfer stream after the exchange just enqueued (its work is kept so that
  //! wait_transfers() can complete the communicator's records).
  mark after_transfer(comm::work w) {
    pending_.push_back(std::move(w));
    return {record(transfer)};
  }
  void compute_waits(mark& m) {
    if (m.event == nullptr) return;
    WEFT_CUDA_TRY(cudaStreamWaitEvent(compute, m.event, 0));
    WEFT_CUDA_TRY(cudaEventDestroy(m.event));  // released once reached
    m.event = nullptr;
  }
  void transfer_waits_compute() {
    mark m{record(compute)};
    WEFT_CUDA_TRY(cudaStreamWaitEvent(transfer, m.event, 0));
    WEFT_CUDA_TRY(cudaEventDestroy(m.event));
  }
  void finish() {
    mark m{record(transfer)};
    compute_waits(m);
  }
  //! Blocks until every exchange issued through this policy completed (bounded by the
  //! communicator's deadline; throws its comm_error), completing their history records.
  void wait_transfers() {
    for (auto& w : pending_) w.wait();
    pending_.clear();
  }

 private:
  static cudaEvent_t record(cudaStream_t s) {
    cudaEvent_t e = nullptr;
    WEFT_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    WEFT_CUDA_TRY(cudaEventRecord(e, s));
    return e;
  }
  std::vector<comm::work> pending_;
};

#if WEFT_ATTENTION_RING_HAS_CUDA_FLASH
//! The block kernels of cuda/flash.cuh (bf16 / f16 inputs, float block outputs).
struct cuda_flash_kernels {
  template <class T>
  static void forward(cudaStream_t s, detail::bshd<T const> q, detail::bshd<T const> k,
                      detail::bshd<T const> v, detail::bshd<float> o, detail::bhs<float> lse,
                      mask_rule mask, float scale) {
    kernels::flash_forward<T, float>(s, q, k, v, o, lse, mask, scale);
  }
  template <class T, class O>
  static void backward(cudaStream_t s, detail::bshd<T const> q, detail::bshd<T const> k,
                       detail::bshd<T const> v, detail::bshd<O const> o,
                       detail::bhs<float const> lse, detail::bshd<T const> dout,
                       detail::bshd<float> dq, detail::bshd<float> dk, detail::bshd<float> dv,
                       mask_rule mask, float scale) {
    kernels::flash_backward_accumulate<T, O>(s, q, k, v, o, lse, dout, dq, dk, dv, mask, scale);
  }
};
template <class T>
using cuda_flash_ring_blocks = cuda_ring_blocks<T, cuda_flash_kernels>;
#endif

// ---- the ring ------------------------------------------------------------------------------

namespace detail {

//! What the device ring asks of a communicator: a StreamCommunicator over device memory with a
//! grouped exchange, sendrecv(in, to, out, from, options).
template <class C>
concept device_ring_communicator = comm::StreamCommunicator<C> &&
    comm::CommunicatorIn<C, cuda_space> &&
    requires(C& c, comm::buffer_view v, int peer, comm::op_options o) {
  { c.sendrecv(v, peer, v, peer, o) } -> std::same_as<comm::work>;
};

//! Policy-owned scratch of `n` X, released through the policy (stream-ordered on the device).
template <class P, class X>
class ring_scratch {
 public:
  ring_scratch(P& p, std::int64_t n)
      : p_(&p),
        n_(static_cast<std::size_t>(n)),
        data_(static_cast<X*>(p.allocate(n_ * sizeof(X)))) {}
  ~ring_scratch() { p_->deallocate(data_, n_ * sizeof(X)); }
  ring_scratch(ring_scratch const&) = delete;
  ring_scratch& operator=(ring_scratch const&) = delete;
  X* get() const noexcept { return data_; }

 private:
  P* p_;
  std::size_t n_;
  X* data_;
};

template <class X>
comm::buffer_view ring_buffer(X const* p, std::int64_t n) noexcept {
  return {const_cast<X*>(p), static_cast<std::size_t>(n), dtype_of<X>, comm::memory_kind::cuda, -1};
}

template <class X>
detail::bshd<X const> cview(detail::bshd<X> const& t) noexcept {
  return {t.data, t.b, t.s, t.h, t.d, t.sb, t.ss, t.sh};
}
template <class X>
detail::bhs<X const> cview(detail::bhs<X> const& t) noexcept {
  return {t.data, t.b, t.h, t.s, t.sb, t.sh, t.ss};
}

//! Entry checks shared by forward and backward (no device memory is read).
template <class T, class O>
float check_device_ring(int world, seq_layout const& layout, detail::bshd<T const> const& q,
                        detail::bshd<T const> const& k, detail::bshd<T const> const& v,
                        detail::bshd<O> const& o, detail::bhs<float> const& lse, bool causal,
                        double scale) {
  check_qkv(q, k, v);
  check_same_shape(q, o, "o");
  check_lse_shape(q, lse, "lse");
  WEFT_EXPECTS_SHAPE(k.s == q.s, "k", ::weft::detail::concat("local length ", q.s, " (as q)"), k.s);
  check_ring_layout(layout, world, causal, q.s);
  return static_cast<float>(resolve_scale(scale, q.d));
}

}  // namespace detail

//! Ring attention forward on device buffers, stream-ordered. Each rank passes its shard under
//! `layout` as raw views of device memory (q [B, c, Hq, D], k, v [B, c, Hkv, D] of T, c =
//! layout.local_length()) and receives its rows of the global o [B, c, Hq, D] (of O) and lse
//! [B, Hq, c] (natural log). `blocks` (host_ring_blocks or cuda_ring_blocks) runs the block compute
//! and holds the streams; the results are ready when its compute stream reaches them. K/V hop
//! N-1 times, each hop one grouped comm.sendrecv on the transfer stream posted before the block's
//! compute. Non-causal attention needs the contiguous layout; opt.scale 0 means 1/sqrt(D).
template <class Blocks, class C, class T, class O>
requires detail::device_ring_communicator<C>
void stream_ring_forward(C& comm, Blocks& blocks, seq_layout const& layout, detail::bshd<T const> q,
                         detail::bshd<T const> k, detail::bshd<T const> v, detail::bshd<O> o,
                         detail::bhs<float> lse, attention_options const& opt = {}) {
  bool const causal = detail::is_causal(opt);
  float const scale =
      detail::check_device_ring(comm.size(), layout, q, k, v, o, lse, causal, opt.scale);
  layout_kind const kind = layout.kind();
  int const n = comm.size(), r = comm.rank();
  std::int64_t const c = q.s;
  std::int64_t const kv = k.b * k.s * k.h * k.d;
  std::int64_t const qe = q.b * c * q.h * q.d, le = q.b * q.h * c;
  detail::ring_scratch<Blocks, T> kv_a(blocks, 2 * kv), kv_b(blocks, 2 * kv);
  detail::ring_scratch<Blocks, float> oacc(blocks, qe), lacc(blocks, le), bo(blocks, qe),
      bl(blocks, le);
  blocks.copy(k, detail::contiguous_bshd(kv_a.get(), k.b, k.s, k.h, k.d));
  blocks.copy(v, detail::contiguous_bshd(kv_a.get() + kv, k.b, k.s, k.h, k.d));
  blocks.fill(oacc.get(), qe, 0.0f);
  blocks.fill(lacc.get(), le, empty_lse<float>());
  auto const oa = detail::contiguous_bshd(oacc.get(), q.b, c, q.h, q.d);
  auto const la = detail::contiguous_bhs(lacc.get(), q.b, q.h, c);
  T* cur = kv_a.get();
  T* nxt = kv_b.get();
  comm::op_options co;
  co.stream = blocks.transfer_stream();
  int const next = (r + 1) % n, prev = (r - 1 + n) % n;
  for (int s = 0; s < n; ++s) {
    typename Blocks::mark arrived{};
    if (s + 1 < n) {                    // the next block's exchange, before this block's compute
      blocks.transfer_waits_compute();  // nxt was last read by the previous step's compute
      arrived = blocks.after_transfer(comm.sendrecv(detail::ring_buffer(cur, 2 * kv), next,
                                                    detail::ring_buffer(nxt, 2 * kv), prev, co));
    }
    int const src = (r - s + n) % n;
    ring_step const st = plan_ring_step(kind, causal, r, src, c);
    if (!st.skip && st.q1 > st.q0 && st.k1 > st.k0) {
      auto const kb = detail::contiguous_bshd<T const>(cur, k.b, k.s, k.h, k.d);
      auto const vb = detail::contiguous_bshd<T const>(cur + kv, k.b, k.s, k.h, k.d);
      std::int64_t const rows = st.q1 - st.q0;
      auto const bov = detail::contiguous_bshd(bo.get(), q.b, rows, q.h, q.d);
      auto const blv = detail::contiguous_bhs(bl.get(), q.b, q.h, rows);
      blocks.forward(detail::seq_slice(q, st.q0, st.q1), detail::seq_slice(kb, st.k0, st.k1),
                     detail::seq_slice(vb, st.k0, st.k1), bov, blv, st.mask, scale);
      blocks.merge(oa, la, detail::cview(bov), detail::cview(blv), st.q0);
    }
    if (s + 1 < n) {
      blocks.compute_waits(arrived);
      std::swap(cur, nxt);
    }
  }
  blocks.template copy<O>(detail::cview(oa), o);
  blocks.template copy<float>(detail::cview(la), lse);
  blocks.finish();
}

//! Ring attention backward on device buffers, stream-ordered (ring-flash-attention's protocol, as
//! ring_backward): K/V circulate again, and a traveling dK/dV buffer (float) for the block in hand
//! gathers each rank's contribution and is passed on with one grouped sendrecv per step, arriving
//! complete at its owner after the N-th. o and lse are this rank's forward results; dq, dk, dv
//! (of G) are overwritten. Ready when the compute stream of `blocks` reaches them.
template <class Blocks, class C, class T, class O, class G>
requires detail::device_ring_communicator<C>
void stream_ring_backward(C& comm, Blocks& blocks, seq_layout const& layout,
                          detail::bshd<T const> q, detail::bshd<T const> k, detail::bshd<T const> v,
                          detail::bshd<O const> o, detail::bhs<float const> lse,
                          detail::bshd<T const> dout, detail::bshd<G> dq, detail::bshd<G> dk,
                          detail::bshd<G> dv, attention_options const& opt = {}) {
  bool const causal = detail::is_causal(opt);
  detail::bhs<float> const lse_shape{nullptr, lse.b, lse.h, lse.s, lse.sb, lse.sh, lse.ss};
  float const scale =
      detail::check_device_ring(comm.size(), layout, q, k, v, o, lse_shape, causal, opt.scale);
  detail::check_gradient_shapes(q, k, dout, dq, dk, dv);
  layout_kind const kind = layout.kind();
  int const n = comm.size(), r = comm.rank();
  std::int64_t const c = q.s;
  std::int64_t const kv = k.b * k.s * k.h * k.d;
  std::int64_t const qe = q.b * c * q.h * q.d;
  detail::ring_scratch<Blocks, T> kv_a(blocks, 2 * kv), kv_b(blocks, 2 * kv);
  detail::ring_scratch<Blocks, float> dkv_a(blocks, 2 * kv), dkv_b(blocks, 2 * kv),
      blk(blocks, 2 * kv), dqacc(blocks, qe);
  blocks.copy(k, detail::contiguous_bshd(kv_a.get(), k.b, k.s, k.h, k.d));
  blocks.copy(v, detail::contiguous_bshd(kv_a.get() + kv, k.b, k.s, k.h, k.d));
  blocks.fill(dkv_a.get(), 2 * kv, 0.0f);  // the traveling buffer of our own block, at step 0
  blocks.fill(dqacc.get(), qe, 0.0f);
  auto const dqa = detail::contiguous_bshd(dqacc.get(), q.b, c, q.h, q.d);
  T* cur = kv_a.get();
  T* nxt = kv_b.get();
  float* travel = dkv_a.get();
  float* spare = dkv_b.get();
  comm::op_options co;
  co.stream = blocks.transfer_stream();
  int const next = (r + 1) % n, prev = (r - 1 + n) % n;
  typename Blocks::mark dkv_arrived{};
  for (int s = 0; s < n; ++s) {
    typename Blocks::mark arrived{};
    if (s + 1 < n) {
      blocks.transfer_waits_compute();
      arrived = blocks.after_transfer(comm.sendrecv(detail::ring_buffer(cur, 2 * kv), next,
                                                    detail::ring_buffer(nxt, 2 * kv), prev, co));
    }
    int const src = (r - s + n) % n;
    ring_step const st = plan_ring_step(kind, causal, r, src, c);
    bool const busy = !st.skip && st.q1 > st.q0 && st.k1 > st.k0;
    if (busy) {
      blocks.fill(blk.get(), 2 * kv, 0.0f);
      auto const kb = detail::contiguous_bshd<T const>(cur, k.b, k.s, k.h, k.d);
      auto const vb = detail::contiguous_bshd<T const>(cur + kv, k.b, k.s, k.h, k.d);
      auto const dkb = detail::contiguous_bshd(blk.get(), k.b, k.s, k.h, k.d);
      auto const dvb = detail::contiguous_bshd(blk.get() + kv, k.b, k.s, k.h, k.d);
      blocks.backward(detail::seq_slice(q, st.q0, st.q1), detail::seq_slice(kb, st.k0, st.k1),
                      detail::seq_slice(vb, st.k0, st.k1), detail::seq_slice(o, st.q0, st.q1),
                      detail::seq_slice(lse, st.q0, st.q1), detail::seq_slice(dout, st.q0, st.q1),
                      detail::seq_slice(dqa, st.q0, st.q1), detail::seq_slice(dkb, st.k0, st.k1),
                      detail::seq_slice(dvb, st.k0, st.k1), st.mask, scale);
    }
    // The traveling buffer for this block arrived from the previous rank (last step's exchange).
    blocks.compute_waits(dkv_arrived);
    if (busy) blocks.add(travel, blk.get(), 2 * kv);
    blocks.transfer_waits_compute();  // travel is complete; `spare` was sent last step (in order)
    dkv_arrived = blocks.after_transfer(comm.sendrecv(
        detail::ring_buffer(travel, 2 * kv), next, detail::ring_buffer(spare, 2 * kv), prev, co));
    std::swap(travel, spare);
    if (s + 1 < n) {
      blocks.compute_waits(arrived);
      std::swap(cur, nxt);
    }
  }
  blocks.compute_waits(dkv_arrived);  // after N exchanges: our own block's complete dK/dV
  blocks.template copy<G>(detail::cview(dqa), dq);
  blocks.template copy<G>(detail::contiguous_bshd<float const>(travel, k.b, k.s, k.h, k.d), dk);
  blocks.template copy<G>(detail::contiguous_bshd<float const>(travel + kv, k.b, k.s, k.h, k.d),
                          dv);
  blocks.finish();
}

}  // namespace weft::attention
