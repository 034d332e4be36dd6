// tests/comm/nccl/ring_gpu.test.cu — the device sequence parallelism of attention/cuda on one GPU
// with the real libnccl (world size 1: NCCL 2.28 forbids two ranks on one device) and the CUDA
// flash kernels (cuda_flash_ring_blocks):
// - ring (contiguous, zigzag and stripe layouts), Ulysses and USP (1 x 1, contiguous and zigzag
//   inner layouts) forward / backward must equal the flash kernels called directly (bf16 inputs,
//   MHA, GQA and MQA, float outputs; f16 would compile every flash kernel once more in this
//   program, and f16 flash is the attention twin's), which exercises the stream-ordered machinery
//   (two streams, events, the grouped self-exchange of dK/dV, the all_to_all packing,
//   stream-ordered scratch);
// - the block operations of cuda_ring_blocks that one rank cannot reach in full (a merge into
//   accumulators already holding rows, the strided accumulate of replicated KV heads, the
//   converting copies over strided views) must equal host_ring_blocks', the CPU path the NCCL
//   mock's world sizes 2-4 run.
// Label gpu. Built only once attention/cuda/flash.cuh exists (an empty test binary part otherwise).
#include <weft/comm/nccl/communicator.hpp>
#include <weft/comm/threads/world.hpp>

#if __has_include(<weft/attention/cuda/flash.cuh>)
#include <weft/attention/cuda/ring.cuh>
#include <weft/attention/cuda/ulysses.cuh>
#include <weft/attention/cuda/usp.cuh>

#include "support/cuda_buffer.hpp"

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <limits>
#include <string>
#include <type_traits>
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
    // A copy from pageable memory may return before it lands; the kernels that read it run on
    // non-blocking streams, which do not wait for the legacy stream.
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
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

//! The parallel forms one rank runs (each the flash kernels on the whole sequence there).
enum class sp_mode {
  ring_contiguous,
  ring_zigzag,
  ring_stripe,
  ulysses,
  usp_contiguous,
  usp_zigzag
};

char const* mode_name(sp_mode m) {
  switch (m) {
    case sp_mode::ring_contiguous: return "ring (contiguous)";
    case sp_mode::ring_zigzag: return "ring (zigzag)";
    case sp_mode::ring_stripe: return "ring (stripe)";
    case sp_mode::ulysses: return "Ulysses";
    case sp_mode::usp_contiguous: return "USP 1x1 (contiguous)";
    case sp_mode::usp_zigzag: return "USP 1x1 (zigzag)";
  }
  return "?";
}

template <class T>
void gpu_case(nc::communicator& comm, sp_mode mode, std::int64_t b, std::int64_t s, std::int64_t hq,
              std::int64_t hkv, std::int64_t d, bool causal) {
  std::ostringstream cs;
  cs << mode_name(mode)
     << " on one GPU vs flash kernels: " << (std::is_same_v<T, weft::f16> ? "f16" : "bf16")
     << ", B " << b << ", S " << s << ", Hq " << hq << ", Hkv " << hkv << ", D " << d
     << (causal ? ", causal" : ", non-causal");
  std::string const ctx = cs.str();
  std::size_t const qn = std::size_t(b * s * hq * d), kn = std::size_t(b * s * hkv * d),
                    ln = std::size_t(b * hq * s);
  std::mt19937 gen(7u + unsigned(d + s + hkv) + (causal ? 1u : 0u) + 3u * unsigned(mode));
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

  // The parallel form (one rank).
  wa::attention_options opt;
  opt.causal = causal ? wa::causal_mode::top_left : wa::causal_mode::none;
  {
    wa::cuda_flash_ring_blocks<T> blocks(compute, transfer);
    auto const vo = wad::contiguous_bshd(o_ring.p, b, s, hq, d);
    auto const vl = wad::contiguous_bhs(l_ring.p, b, hq, s);
    auto const co = wad::contiguous_bshd<float const>(o_ring.p, b, s, hq, d);
    auto const cl = wad::contiguous_bhs<float const>(l_ring.p, b, hq, s);
    auto const vdq = wad::contiguous_bshd(dq_ring.p, b, s, hq, d);
    auto const vdk = wad::contiguous_bshd(dk_ring.p, b, s, hkv, d);
    auto const vdv = wad::contiguous_bshd(dv_ring.p, b, s, hkv, d);
    switch (mode) {
      case sp_mode::ring_contiguous:
      case sp_mode::ring_zigzag:
      case sp_mode::ring_stripe: {
        auto const layout = mode == sp_mode::ring_contiguous ? wa::seq_layout::contiguous(1, s)
                            : mode == sp_mode::ring_zigzag   ? wa::seq_layout::zigzag(1, s)
                                                             : wa::seq_layout::stripe(1, s);
        wa::stream_ring_forward(comm, blocks, layout, cq, ck, cv, vo, vl, opt);
        wa::stream_ring_backward(comm, blocks, layout, cq, ck, cv, co, cl, cg, vdq, vdk, vdv, opt);
        break;
      }
      case sp_mode::ulysses:
        wa::stream_ulysses_forward(comm, blocks, cq, ck, cv, vo, vl, opt);
        wa::stream_ulysses_backward(comm, blocks, cq, ck, cv, co, cl, cg, vdq, vdk, vdv, opt);
        break;
      case sp_mode::usp_contiguous:
      case sp_mode::usp_zigzag: {
        // One rank is both the Ulysses group and the ring.
        auto const layout = wa::seq_layout::usp(
            1, 1,
            mode == sp_mode::usp_zigzag ? wa::layout_kind::zigzag : wa::layout_kind::contiguous, s);
        wa::stream_usp_forward(comm, comm, blocks, layout, cq, ck, cv, vo, vl, opt);
        wa::stream_usp_backward(comm, comm, blocks, layout, cq, ck, cv, co, cl, cg, vdq, vdk, vdv,
                                opt);
        break;
      }
    }
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
  // Sanity of the reference itself against the CPU flash on the same 16-bit inputs (f32 math):
  // 16-bit inputs, float accumulation in both; 2e-2 of max |o| covers the kernel's 16-bit P·V.
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

template <class X>
std::vector<float> as_floats(std::vector<X> const& v) {
  return std::vector<float>(v.begin(), v.end());
}

//! fn(comm) on a one-rank communicator over the real libnccl.
template <class Fn>
void on_one_rank_nccl(Fn fn) {
  REQUIRE_MESSAGE(weft::test::cuda_device_present(), "this test needs a CUDA device (label gpu)");
  wc::threads::world(1).run([&](wc::threads::communicator& host) {
    nc::options o;
    o.timeout = 60s;
    auto comm = nc::communicator::create(host, 0, o);
    fn(comm);
  });
}

}  // namespace

TEST_CASE("gpu: ring attention over a one-rank NCCL communicator equals the flash kernels") {
  on_one_rank_nccl([](nc::communicator& comm) {
    for (bool causal : {false, true}) {
      gpu_case<weft::bf16>(comm, sp_mode::ring_contiguous, 2, 256, 8, 2, 128, causal);
      gpu_case<weft::bf16>(comm, sp_mode::ring_contiguous, 1, 200, 4, 4, 64, causal);
      gpu_case<weft::bf16>(comm, sp_mode::ring_contiguous, 2, 96, 4, 1, 64, causal);
    }
    // The causal-only layouts: their plans on one rank.
    gpu_case<weft::bf16>(comm, sp_mode::ring_zigzag, 2, 256, 8, 2, 128, true);
    gpu_case<weft::bf16>(comm, sp_mode::ring_stripe, 1, 200, 4, 1, 64, true);
  });
}

TEST_CASE("gpu: Ulysses and USP over a one-rank NCCL communicator equal the flash kernels") {
  on_one_rank_nccl([](nc::communicator& comm) {
    for (bool causal : {false, true}) {
      gpu_case<weft::bf16>(comm, sp_mode::ulysses, 2, 256, 8, 2, 128, causal);
      gpu_case<weft::bf16>(comm, sp_mode::ulysses, 1, 200, 4, 1, 64, causal);
      gpu_case<weft::bf16>(comm, sp_mode::usp_contiguous, 2, 128, 4, 4, 64, causal);
    }
    gpu_case<weft::bf16>(comm, sp_mode::usp_zigzag, 2, 256, 8, 2, 128, true);
    gpu_case<weft::bf16>(comm, sp_mode::usp_zigzag, 1, 200, 4, 1, 64, true);
  });
}

// The block operations of cuda_ring_blocks against host_ring_blocks' on the same inputs. Copies,
// fill, add and accumulate are one conversion or one float add per element: equal bit for bit
// (elements outside a strided view untouched). The merge (lse_merge, the same WEFT_HD code) of a
// block of 20 rows at row 9 into accumulators holding finite rows and empty ones (lse -inf, o 0),
// with empty block rows too: within 2e-6 of the largest element, infinities equal.
TEST_CASE("gpu: the device ring's block operations equal host_ring_blocks'") {
  REQUIRE_MESSAGE(weft::test::cuda_device_present(), "this test needs a CUDA device (label gpu)");
  using T = weft::bf16;
  std::int64_t const B = 2, S = 37, H = 3, HW = 5, D = 24, h0 = 1, rows = 20, q0 = 9;
  std::size_t const wide = std::size_t(B * S * HW * D), narrow = std::size_t(B * S * H * D),
                    lw = std::size_t(B * HW * S), ln = std::size_t(B * H * S);
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto rnd = [&](std::size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(gen);
    return v;
  };
  auto rnd_t = [&](std::size_t n) {
    std::vector<T> v(n);
    for (auto& x : v) x = T(nd(gen));
    return v;
  };
  // Heads [h0, h0 + H) of a [B, S, HW, D] buffer; of a [B, HW, S] one.
  auto slice = [&](auto* base) {
    return wad::head_slice(wad::contiguous_bshd(base, B, S, HW, D), h0, H);
  };
  auto lslice = [&](auto* base) {
    return wad::head_slice(wad::contiguous_bhs(base, B, HW, S), h0, H);
  };
  cudaStream_t compute = nullptr, transfer = nullptr;
  WEFT_CUDA_TRY(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  WEFT_CUDA_TRY(cudaStreamCreateWithFlags(&transfer, cudaStreamNonBlocking));
  {
    wa::cuda_flash_ring_blocks<T> dev(compute, transfer);
    wa::host_ring_blocks<T> host;
    auto sync = [&] { WEFT_CUDA_TRY(cudaStreamSynchronize(compute)); };
    // copy: 16-bit contiguous -> float strided (the sentinel 7 stays outside the view).
    {
      auto const src = rnd_t(narrow);
      std::vector<float> h_dst(wide, 7.f);
      dbuf<T> d_src(src);
      dbuf<float> d_dst(h_dst);
      host.copy<float>(wad::contiguous_bshd<T const>(src.data(), B, S, H, D), slice(h_dst.data()));
      dev.copy<float>(wad::contiguous_bshd<T const>(d_src.p, B, S, H, D), slice(d_dst.p));
      sync();
      check_close("copy bf16 -> strided float", d_dst.host(), h_dst, "block operations", 0);
    }
    // copy: float strided -> 16-bit contiguous (one rounding).
    {
      auto const src = rnd(wide);
      std::vector<T> h_dst(narrow, T(7.f));
      dbuf<float> d_src(src);
      dbuf<T> d_dst(h_dst);
      host.copy<T>(slice(src.data()), wad::contiguous_bshd(h_dst.data(), B, S, H, D));
      dev.copy<T>(wad::as_const(slice(d_src.p)), wad::contiguous_bshd(d_dst.p, B, S, H, D));
      sync();
      check_close("copy strided float -> bf16", as_floats(d_dst.host()), as_floats(h_dst),
                  "block operations", 0);
    }
    // copy of lse rows: contiguous -> strided.
    {
      auto const src = rnd(ln);
      std::vector<float> h_dst(lw, 7.f);
      dbuf<float> d_src(src);
      dbuf<float> d_dst(h_dst);
      host.copy<float>(wad::contiguous_bhs<float const>(src.data(), B, H, S), lslice(h_dst.data()));
      dev.copy<float>(wad::contiguous_bhs<float const>(d_src.p, B, H, S), lslice(d_dst.p));
      sync();
      check_close("copy lse -> strided", d_dst.host(), h_dst, "block operations", 0);
    }
    // fill, add, and the strided accumulate (dst heads [h0, h0 + H) += src's).
    {
      auto h_a = rnd(wide);
      auto const h_b = rnd(wide), h_c = rnd(narrow);
      dbuf<float> d_a(h_a), d_b(h_b), d_c(h_c);
      std::int64_t const part = std::int64_t(wide) / 3;
      host.fill(h_a.data() + part, part, -std::numeric_limits<float>::infinity());
      dev.fill(d_a.p + part, part, -std::numeric_limits<float>::infinity());
      host.add(h_a.data(), h_b.data(), 2 * part);
      dev.add(d_a.p, d_b.p, 2 * part);
      host.accumulate(wad::contiguous_bshd<float const>(h_c.data(), B, S, H, D), slice(h_a.data()));
      dev.accumulate(wad::contiguous_bshd<float const>(d_c.p, B, S, H, D), slice(d_a.p));
      sync();
      check_close("fill, add, accumulate", d_a.host(), h_a, "block operations", 0);
    }
    // merge: accumulators with finite and empty rows, a block with empty rows.
    {
      auto h_o = rnd(narrow), h_l = rnd(ln);
      auto const bo = rnd(std::size_t(B * rows * H * D));
      auto bl = rnd(std::size_t(B * H * rows));
      float const ninf = -std::numeric_limits<float>::infinity();
      for (std::int64_t bi = 0; bi < B; ++bi)
        for (std::int64_t h = 0; h < H; ++h) {
          for (std::int64_t i = 0; i < S; i += 5) {  // empty accumulator rows
            h_l[std::size_t((bi * H + h) * S + i)] = ninf;
            for (std::int64_t c = 0; c < D; ++c)
              h_o[std::size_t(((bi * S + i) * H + h) * D + c)] = 0.f;
          }
          // Empty block rows: on row 10 into an empty accumulator row too (both empty stays
          // o 0, lse -inf), on rows 17 and 24 into finite ones.
          for (std::int64_t i = 1; i < rows; i += 7)
            bl[std::size_t((bi * H + h) * rows + i)] = ninf;
        }
      dbuf<float> d_o(h_o), d_l(h_l), d_bo(bo), d_bl(bl);
      host.merge(wad::contiguous_bshd(h_o.data(), B, S, H, D),
                 wad::contiguous_bhs(h_l.data(), B, H, S),
                 wad::contiguous_bshd<float const>(bo.data(), B, rows, H, D),
                 wad::contiguous_bhs<float const>(bl.data(), B, H, rows), q0);
      dev.merge(wad::contiguous_bshd(d_o.p, B, S, H, D), wad::contiguous_bhs(d_l.p, B, H, S),
                wad::contiguous_bshd<float const>(d_bo.p, B, rows, H, D),
                wad::contiguous_bhs<float const>(d_bl.p, B, H, rows), q0);
      sync();
      check_close("merge o", d_o.host(), h_o, "block operations", 2e-6);
      check_close("merge lse", d_l.host(), h_l, "block operations", 2e-6);
    }
  }
  WEFT_CUDA_TRY(cudaStreamDestroy(compute));
  WEFT_CUDA_TRY(cudaStreamDestroy(transfer));
}

#endif  // __has_include(<weft/attention/cuda/flash.cuh>)
