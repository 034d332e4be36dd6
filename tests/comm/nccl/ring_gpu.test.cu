// tests/comm/nccl/ring_gpu.test.cu — the device ring attention of attention/cuda/ring.cuh on one
// GPU with the real libnccl (world size 1: NCCL 2.28 forbids two ranks on one device) and the CUDA
// flash kernels (cuda_flash_ring_blocks): ring forward / backward must equal the flash kernels
// called directly (bf16 inputs, float outputs), which exercises the stream-ordered machinery (two
// streams, events, the grouped self-exchange of dK/dV, stream-ordered scratch). Label gpu. Built
// only once attention/cuda/flash.cuh exists (an empty test binary part otherwise).
#include <weft/comm/nccl/communicator.hpp>
#include <weft/comm/threads/world.hpp>

#if __has_include(<weft/attention/cuda/flash.cuh>)
#include <weft/attention/cuda/ring.cuh>

#include "support/cuda_buffer.hpp"

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace wa = weft::attention;
namespace wad = weft::attention::detail;
namespace wc = weft::comm;
namespace nc = weft::comm::nccl;
using namespace std::chrono_literals;

template <class T>
struct dbuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dbuf(std::vector<T> const& h) : n(h.size()) {
    WEFT_CUDA_TRY(
        cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(n, 1) * sizeof(T)));
    if (n > 0) WEFT_CUDA_TRY(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit dbuf(std::size_t count, T fill = T(0)) : dbuf(std::vector<T>(count, fill)) {}
  ~dbuf() { (void)cudaFree(p); }
  dbuf(dbuf const&) = delete;
  dbuf& operator=(dbuf const&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n > 0) WEFT_CUDA_TRY(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

//! Max |got - want| / max |want| (infinities must match exactly), with the first index over tol.
void check_close(char const* name, std::vector<float> const& got, std::vector<float> const& want,
                 std::string const& ctx, double tol) {
  double max_ref = 0, max_abs = 0;
  std::int64_t first = -1;
  for (float w : want)
    if (std::isfinite(w)) max_ref = std::max(max_ref, double(std::fabs(w)));
  for (std::size_t i = 0; i < want.size(); ++i) {
    double const g = got[i], w = want[i];
    double const e =
        (std::isinf(w) || std::isinf(g)) ? (g == w ? 0.0 : INFINITY) : std::fabs(g - w);
    if (!(e <= tol * std::max(max_ref, 1e-30)) && first < 0) first = std::int64_t(i);
    if (!(e <= max_abs)) max_abs = e;
  }
  std::ostringstream os;
  os << ctx << ": " << name << " max |err| " << max_abs << ", max |ref| " << max_ref
     << ", relative " << max_abs / std::max(max_ref, 1e-30) << " (tolerance " << tol
     << "), first element over tolerance " << first;
  if (first >= 0)
    os << " (got " << got[std::size_t(first)] << ", want " << want[std::size_t(first)] << ")";
  INFO(os.str());
  MESSAGE(os.str());
  CHECK(first < 0);
}

void gpu_case(nc::communicator& comm, std::int64_t b, std::int64_t s, std::int64_t hq,
              std::int64_t hkv, std::int64_t d, bool causal) {
  using T = weft::bf16;
  std::ostringstream cs;
  cs << "ring on one GPU vs flash kernels: B " << b << ", S " << s << ", Hq " << hq << ", Hkv "
     << hkv << ", D " << d << (causal ? ", causal" : ", non-causal");
  std::string const ctx = cs.str();
  std::size_t const qn = std::size_t(b * s * hq * d), kn = std::size_t(b * s * hkv * d),
                    ln = std::size_t(b * hq * s);
  std::mt19937 gen(7u + unsigned(d + s) + (causal ? 1u : 0u));
  std::normal_distribution<float> nd(0.f, 1.f);
  auto rnd = [&](std::size_t n) {
    std::vector<T> v(n);
    for (auto& x : v) x = T(nd(gen));
    return v;
  };
  dbuf<T> q(rnd(qn)), k(rnd(kn)), v(rnd(kn)), g(rnd(qn));
  dbuf<float> o_ring(qn), l_ring(ln), o_ref(qn), l_ref(ln);
  dbuf<float> dq_ring(qn), dk_ring(kn), dv_ring(kn), dq_ref(qn), dk_ref(kn), dv_ref(kn);
  auto cq = wad::contiguous_bshd<T const>(q.p, b, s, hq, d);
  auto ck = wad::contiguous_bshd<T const>(k.p, b, s, hkv, d);
  auto cv = wad::contiguous_bshd<T const>(v.p, b, s, hkv, d);
  auto cg = wad::contiguous_bshd<T const>(g.p, b, s, hq, d);
  float const scale = float(1.0 / std::sqrt(double(d)));
  wa::mask_rule const mask{causal, 0};

  cudaStream_t compute = nullptr, transfer = nullptr;
  WEFT_CUDA_TRY(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  WEFT_CUDA_TRY(cudaStreamCreateWithFlags(&transfer, cudaStreamNonBlocking));
  // Direct: the flash kernels on the whole sequence.
  wa::kernels::flash_forward<T, float>(compute, cq, ck, cv,
                                       wad::contiguous_bshd(o_ref.p, b, s, hq, d),
                                       wad::contiguous_bhs(l_ref.p, b, hq, s), mask, scale);
  wa::kernels::flash_backward_accumulate<T, float>(
      compute, cq, ck, cv, wad::contiguous_bshd<float const>(o_ref.p, b, s, hq, d),
      wad::contiguous_bhs<float const>(l_ref.p, b, hq, s), cg,
      wad::contiguous_bshd(dq_ref.p, b, s, hq, d), wad::contiguous_bshd(dk_ref.p, b, s, hkv, d),
      wad::contiguous_bshd(dv_ref.p, b, s, hkv, d), mask, scale);
  WEFT_CUDA_TRY(cudaStreamSynchronize(compute));

  // The ring (one rank).
  wa::attention_options opt;
  opt.causal = causal ? wa::causal_mode::top_left : wa::causal_mode::none;
  auto const layout = wa::seq_layout::contiguous(1, s);
  {
    wa::cuda_flash_ring_blocks<T> blocks(compute, transfer);
    wa::stream_ring_forward(comm, blocks, layout, cq, ck, cv,
                            wad::contiguous_bshd(o_ring.p, b, s, hq, d),
                            wad::contiguous_bhs(l_ring.p, b, hq, s), opt);
    wa::stream_ring_backward(
        comm, blocks, layout, cq, ck, cv, wad::contiguous_bshd<float const>(o_ring.p, b, s, hq, d),
        wad::contiguous_bhs<float const>(l_ring.p, b, hq, s), cg,
        wad::contiguous_bshd(dq_ring.p, b, s, hq, d), wad::contiguous_bshd(dk_ring.p, b, s, hkv, d),
        wad::contiguous_bshd(dv_ring.p, b, s, hkv, d), opt);
    blocks.wait_transfers();
    WEFT_CUDA_TRY(cudaStreamSynchronize(compute));
  }
  WEFT_CUDA_TRY(cudaStreamSynchronize(transfer));
  // One block merged into empty accumulators is a copy: o and lse match exactly (up to the
  // float copy); dq (float atomics in the kernel, order not fixed) to 1e-5 of max |dq|; dk, dv
  // the same kernel on the same inputs, plus a float copy.
  check_close("o", o_ring.host(), o_ref.host(), ctx, 1e-6);
  check_close("lse", l_ring.host(), l_ref.host(), ctx, 1e-6);
  check_close("dq", dq_ring.host(), dq_ref.host(), ctx, 1e-5);
  check_close("dk", dk_ring.host(), dk_ref.host(), ctx, 1e-5);
  check_close("dv", dv_ring.host(), dv_ref.host(), ctx, 1e-5);
  // Sanity of the reference itself against the CPU flash on the same bf16 inputs (f32 math):
  // bf16 inputs, float accumulation in both; 2e-2 of max |o| covers the kernel's bf16 P·V.
  {
    auto const hq_ = q.host(), hk_ = k.host(), hv_ = v.host();
    std::vector<float> o_cpu(qn), l_cpu(ln);
    wad::flash_forward_raw(weft::exec::host{},
                           wad::contiguous_bshd<T const>(hq_.data(), b, s, hq, d),
                           wad::contiguous_bshd<T const>(hk_.data(), b, s, hkv, d),
                           wad::contiguous_bshd<T const>(hv_.data(), b, s, hkv, d),
                           wad::contiguous_bshd(o_cpu.data(), b, s, hq, d),
                           wad::contiguous_bhs(l_cpu.data(), b, hq, s), mask, double(scale));
    check_close("o vs CPU flash", o_ring.host(), o_cpu, ctx, 2e-2);
    check_close("lse vs CPU flash", l_ring.host(), l_cpu, ctx, 2e-2);
  }
  WEFT_CUDA_TRY(cudaStreamDestroy(compute));
  WEFT_CUDA_TRY(cudaStreamDestroy(transfer));
}

}  // namespace

TEST_CASE("gpu: ring attention over a one-rank NCCL communicator equals the flash kernels") {
  REQUIRE_MESSAGE(weft::test::cuda_device_present(), "this test needs a CUDA device (label gpu)");
  wc::threads::world(1).run([](wc::threads::communicator& host) {
    nc::options o;
    o.timeout = 60s;
    auto comm = nc::communicator::create(host, 0, o);
    for (bool causal : {false, true}) {
      gpu_case(comm, 2, 256, 8, 2, 128, causal);
      gpu_case(comm, 1, 200, 4, 4, 64, causal);
    }
  });
}

#endif  // __has_include(<weft/attention/cuda/flash.cuh>)
