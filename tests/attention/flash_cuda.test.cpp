// Tests of the CUDA flash-attention kernels (weft/attention/cuda/flash.cuh) against the CPU flash
// kernel (weft/attention/flash.hpp, itself tested against the fp64 reference) on the same bf16/f16
// inputs: forward o and lse, backward dq/dk/dv, over causal none/top_left/bottom_right and ring
// offsets, Sq != Sk both ways, lengths off the 64-row tiles, MHA/GQA/MQA, d 64 and 128, batch > 1;
// packed cu_seqlens against the CPU varlen entry points; fully masked rows; the accumulate
// semantics; a dq off its 8-byte alignment; the exec::cuda entry points; argument errors; the
// grid, ring offsets, packed documents and the unaligned dq, with multi-tile shapes, once more with
// each set chosen explicitly (wgmma, wgmma_ws, wgmma_tma, mma_sync) where the default is the Hopper
// mix (compute capability 9.0); elsewhere those cases skip and the default cases run mma_sync. The
// CUDA part is compiled only by nvcc (weft.test.attention.cuda); the host build sees an empty file.
#include <doctest/doctest.h>

#if defined(__CUDACC__) && WEFT_HAS_CUDA_RUNTIME
#include <weft/attention/cuda/flash.cuh>
#include <weft/attention/flash.hpp>

#include "attention_testing.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace wa = weft::attention;
namespace wk = weft::attention::kernels;
namespace wd = weft::attention::detail;
using namespace attention_testing;
using weft::bf16;
using weft::f16;

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

//! A device copy of a host buffer, freed on scope exit.
template <class T>
struct dbuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit dbuf(std::size_t count) : n(count) {
    WEFT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p), (n ? n : 1) * sizeof(T)));
    WEFT_CUDA_TRY(cudaMemset(p, 0, (n ? n : 1) * sizeof(T)));
  }
  explicit dbuf(std::vector<T> const& v) : dbuf(v.size()) {
    if (n) WEFT_CUDA_TRY(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  dbuf(dbuf const&) = delete;
  dbuf& operator=(dbuf const&) = delete;
  ~dbuf() { cudaFree(p); }
  [[nodiscard]] std::vector<T> host() const {
    std::vector<T> v(n);
    if (n) WEFT_CUDA_TRY(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  void zero() { WEFT_CUDA_TRY(cudaMemset(p, 0, (n ? n : 1) * sizeof(T))); }
};

struct kernel_shape {
  std::int64_t b, sq, sk, hq, hk, d;
};

std::string describe(char const* type, kernel_shape s, wa::mask_rule m) {
  std::ostringstream os;
  os << type << " b=" << s.b << " sq=" << s.sq << " sk=" << s.sk << " hq=" << s.hq
     << " hkv=" << s.hk << " d=" << s.d << " mask={causal=" << m.causal << ", offset=" << m.offset
     << "}";
  return os.str();
}

//! Compares gpu against ref (flat [d0, d1, d2, d3] or [d0, d1, d2] row-major): the max error
//! relative to max |ref| (error_stats::rel) must be at most `tol`; non-finite values must match in
//! kind (-inf lse for empty rows). On failure the message names the first offending index.
template <class A>
void expect_close(char const* what, std::vector<A> const& gpu, std::vector<float> const& ref,
                  std::vector<std::int64_t> const& dims, double tol, std::string const& ctx) {
  REQUIRE(gpu.size() == ref.size());
  auto const st = compare(gpu.data(), ref.data(), gpu.size());
  double const floor = std::max(st.max_ref, 1e-3) * tol;
  std::size_t bad = gpu.size();
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    double const x = double(gpu[i]), y = double(ref[i]);
    bool const fin = std::isfinite(x) && std::isfinite(y);
    if ((fin && std::abs(x - y) > floor) || (!fin && !(x == y))) {
      bad = i;
      break;
    }
  }
  bool const ok = st.rel() <= tol && !st.mismatch_nonfinite && bad == gpu.size();
  if (!ok) {
    std::ostringstream os;
    os << what << " mismatch [" << ctx << "]: rel err " << st.rel() << " (tol " << tol
       << "), max abs " << st.max_abs << ", max |ref| " << st.max_ref << ", rms " << st.rms
       << ", nonfinite mismatch " << st.mismatch_nonfinite;
    if (bad < gpu.size()) {
      os << "; first bad flat index " << bad << " = [";
      std::size_t r = bad;
      std::vector<std::int64_t> idx(dims.size());
      for (std::size_t k = dims.size(); k-- > 0;) {
        idx[k] = std::int64_t(r % std::size_t(dims[k]));
        r /= std::size_t(dims[k]);
      }
      for (std::size_t k = 0; k < idx.size(); ++k) os << (k ? ", " : "") << idx[k];
      os << "] gpu " << double(gpu[bad]) << " ref " << double(ref[bad]);
    }
    FAIL_CHECK(os.str());
  } else {
    CHECK(ok);
  }
}

template <class T>
char const* type_name() {
  return std::is_same_v<T, bf16> ? "bf16" : "f16";
}

// Tolerances, relative to max |reference| (CPU flash on the same rounded inputs, f32 throughout):
//  - the GPU rounds P to T before P V (and P, dS to T before the backward GEMMs), a relative
//    error of 2^-9 (bf16) or 2^-12 (f16) per product term; over >= 1 keys of random sign these
//    add to well under 4 ulp of T relative to the row's largest value: 5e-3 / 2e-3 for float
//    outputs of the forward, 1.5e-2 / 5e-3 for the backward (two rounded operands chained: dS
//    depends on P and dP, and dq/dk sum dS products);
//  - an o of T adds its own rounding (2^-8 / 2^-11 relative): 2e-2 / 4e-3;
//  - lse: both sides compute scores and sums in f32 and differ only by summation order: 1e-3
//    absolute (the -inf of empty rows must match exactly).
template <class T>
constexpr double fwd_tol() {
  return std::is_same_v<T, bf16> ? 5e-3 : 2e-3;
}
template <class T>
constexpr double fwd_tol_t() {
  return std::is_same_v<T, bf16> ? 2e-2 : 4e-3;
}
template <class T>
constexpr double bwd_tol() {
  return std::is_same_v<T, bf16> ? 1.5e-2 : 5e-3;
}
constexpr double lse_tol = 1e-3;

//! Compares lse by absolute error (compare()'s max_abs) with -inf matching.
void expect_lse(std::vector<float> const& gpu, std::vector<float> const& ref,
                std::vector<std::int64_t> const& dims, std::string const& ctx) {
  auto const st = compare(gpu.data(), ref.data(), gpu.size());
  std::size_t bad = gpu.size();
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    double const x = gpu[i], y = ref[i];
    bool const fin = std::isfinite(x) && std::isfinite(y);
    if ((fin && std::abs(x - y) > lse_tol) || (!fin && !(x == y))) {
      bad = i;
      break;
    }
  }
  if (bad != gpu.size() || st.mismatch_nonfinite) {
    std::ostringstream os;
    os << "lse mismatch [" << ctx << "]: max abs " << st.max_abs << " (tol " << lse_tol << ")";
    if (bad < gpu.size()) {
      std::size_t r = bad;
      std::int64_t const s = std::int64_t(r % std::size_t(dims[2]));
      r /= std::size_t(dims[2]);
      std::int64_t const h = std::int64_t(r % std::size_t(dims[1]));
      std::int64_t const b = std::int64_t(r / std::size_t(dims[1]));
      os << "; first bad [b, h, s] = [" << b << ", " << h << ", " << s << "] gpu " << gpu[bad]
         << " ref " << ref[bad];
    }
    FAIL_CHECK(os.str());
  } else {
    CHECK(true);
  }
}

template <class X>
wd::bshd<X const> cview(X const* p, std::int64_t b, std::int64_t s, std::int64_t h,
                        std::int64_t d) {
  return wd::contiguous_bshd(p, b, s, h, d);
}

//! The CPU results for one problem: o, lse (f32) and the gradients (f32) from dout.
struct cpu_result {
  std::vector<float> o, lse, dq, dk, dv;
};

template <class T>
cpu_result cpu_run(kernel_shape s, owned<T, 4>& q, owned<T, 4>& k, owned<T, 4>& v, owned<T, 4>& g,
                   wa::mask_rule mask, float scale, bool backward) {
  cpu_result r;
  r.o.assign(std::size_t(s.b * s.sq * s.hq * s.d), 0.0f);
  r.lse.assign(std::size_t(s.b * s.hq * s.sq), 0.0f);
  auto const rq = wd::contiguous_bshd(q.data(), s.b, s.sq, s.hq, s.d);
  auto const rk = wd::contiguous_bshd(k.data(), s.b, s.sk, s.hk, s.d);
  auto const rv = wd::contiguous_bshd(v.data(), s.b, s.sk, s.hk, s.d);
  auto const ro = wd::contiguous_bshd(r.o.data(), s.b, s.sq, s.hq, s.d);
  auto const rl = wd::contiguous_bhs(r.lse.data(), s.b, s.hq, s.sq);
  wd::flash_forward_raw(weft::exec::host{}, rq, rk, rv, ro, rl, mask, double(scale));
  if (backward) {
    r.dq.assign(r.o.size(), 0.0f);
    r.dk.assign(std::size_t(s.b * s.sk * s.hk * s.d), 0.0f);
    r.dv.assign(r.dk.size(), 0.0f);
    wd::flash_backward_accumulate_raw(
        weft::exec::host{}, rq, rk, rv, ro, rl, wd::contiguous_bshd(g.data(), s.b, s.sq, s.hq, s.d),
        wd::contiguous_bshd(r.dq.data(), s.b, s.sq, s.hq, s.d),
        wd::contiguous_bshd(r.dk.data(), s.b, s.sk, s.hk, s.d),
        wd::contiguous_bshd(r.dv.data(), s.b, s.sk, s.hk, s.d), mask, double(scale));
  }
  return r;
}

//! One problem: GPU forward (o of float and of T) and backward (from the CPU's o and lse, so the
//! backward is measured alone) against the CPU kernel. unaligned_dq: the backward again with dq 4
//! bytes off an 8-byte boundary (where a kernel adds dq by float2 atomics, its scalar form).
template <class T>
void check_problem(kernel_shape s, wa::mask_rule mask, std::uint64_t seed,
                   bool unaligned_dq = false, double scale_in = 0.0) {
  std::string const ctx = describe(type_name<T>(), s, mask);
  CAPTURE(ctx);
  auto q = random_tensor<T>(seed, 1.5, s.b, s.sq, s.hq, s.d);
  auto k = random_tensor<T>(seed + 1, 1.5, s.b, s.sk, s.hk, s.d);
  auto v = random_tensor<T>(seed + 2, 1.0, s.b, s.sk, s.hk, s.d);
  auto g = random_tensor<T>(seed + 3, 1.0, s.b, s.sq, s.hq, s.d);
  float const scale = float(wa::resolve_scale(scale_in, s.d));
  auto const ref = cpu_run(s, q, k, v, g, mask, scale, true);

  dbuf<T> dq_in(q.buf), dk_in(k.buf), dv_in(v.buf), dg(g.buf);
  auto const gq = cview<T>(dq_in.p, s.b, s.sq, s.hq, s.d);
  auto const gk = cview<T>(dk_in.p, s.b, s.sk, s.hk, s.d);
  auto const gv = cview<T>(dv_in.p, s.b, s.sk, s.hk, s.d);
  auto const gg = cview<T>(dg.p, s.b, s.sq, s.hq, s.d);
  std::vector<std::int64_t> const odims{s.b, s.sq, s.hq, s.d}, kdims{s.b, s.sk, s.hk, s.d},
      ldims{s.b, s.hq, s.sq};

  // Forward, float o.
  dbuf<float> o32(ref.o.size()), lse(ref.lse.size());
  wk::flash_forward<T, float>(nullptr, gq, gk, gv, wd::contiguous_bshd(o32.p, s.b, s.sq, s.hq, s.d),
                              wd::contiguous_bhs(lse.p, s.b, s.hq, s.sq), mask, scale);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  expect_close("o (float)", o32.host(), ref.o, odims, fwd_tol<T>(), ctx);
  expect_lse(lse.host(), ref.lse, ldims, ctx);

  // Forward, o of T.
  dbuf<T> ot(ref.o.size());
  dbuf<float> lse2(ref.lse.size());
  wk::flash_forward<T, T>(nullptr, gq, gk, gv, wd::contiguous_bshd(ot.p, s.b, s.sq, s.hq, s.d),
                          wd::contiguous_bhs(lse2.p, s.b, s.hq, s.sq), mask, scale);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  expect_close("o (T)", ot.host(), ref.o, odims, fwd_tol_t<T>(), ctx);

  // Backward from the CPU's o and lse.
  dbuf<float> ro(ref.o), rl(ref.lse);
  dbuf<float> gdq(ref.dq.size()), gdk(ref.dk.size()), gdv(ref.dv.size());
  wk::flash_backward_accumulate<T, float>(
      nullptr, gq, gk, gv, cview<float>(ro.p, s.b, s.sq, s.hq, s.d),
      wd::contiguous_bhs(static_cast<float const*>(rl.p), s.b, s.hq, s.sq), gg,
      wd::contiguous_bshd(gdq.p, s.b, s.sq, s.hq, s.d),
      wd::contiguous_bshd(gdk.p, s.b, s.sk, s.hk, s.d),
      wd::contiguous_bshd(gdv.p, s.b, s.sk, s.hk, s.d), mask, scale);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  expect_close("dq", gdq.host(), ref.dq, odims, bwd_tol<T>(), ctx);
  expect_close("dk", gdk.host(), ref.dk, kdims, bwd_tol<T>(), ctx);
  expect_close("dv", gdv.host(), ref.dv, kdims, bwd_tol<T>(), ctx);
  if (!unaligned_dq) return;
  dbuf<float> udq(ref.dq.size() + 1);
  gdk.zero();
  gdv.zero();
  wk::flash_backward_accumulate<T, float>(
      nullptr, gq, gk, gv, cview<float>(ro.p, s.b, s.sq, s.hq, s.d),
      wd::contiguous_bhs(static_cast<float const*>(rl.p), s.b, s.hq, s.sq), gg,
      wd::contiguous_bshd(udq.p + 1, s.b, s.sq, s.hq, s.d),
      wd::contiguous_bshd(gdk.p, s.b, s.sk, s.hk, s.d),
      wd::contiguous_bshd(gdv.p, s.b, s.sk, s.hk, s.d), mask, scale);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  auto u = udq.host();
  CHECK(u[0] == 0.0f);  // nothing written before the view
  u.erase(u.begin());
  expect_close("dq (unaligned)", u, ref.dq, odims, bwd_tol<T>(), ctx);
  expect_close("dk (unaligned dq)", gdk.host(), ref.dk, kdims, bwd_tol<T>(), ctx);
  expect_close("dv (unaligned dq)", gdv.host(), ref.dv, kdims, bwd_tol<T>(), ctx);
}

std::vector<kernel_shape> grid_shapes(std::int64_t d) {
  return {
      {1, 1, 1, 2, 1, d},      // single row and key, MQA
      {2, 17, 17, 4, 4, d},    // batch 2, MHA, one partial tile
      {1, 100, 257, 4, 2, d},  // Sq < Sk, GQA, tails on both sides
      {1, 257, 100, 4, 1, d},  // Sq > Sk (bottom_right: 157 fully masked rows), MQA
      {2, 64, 64, 2, 2, d},    // exact tiles
      {1, 128, 200, 3, 1, d},  // 3 query heads on one KV head
      {1, 130, 130, 2, 1, d},  // square, two tiles plus 2 rows
  };
}

//! The CPU tests' grid (flash.test.cpp: batch 2; the forward's lengths and the backward's
//! 150 x 270 and 270 x 150; MHA, GQA and MQA), beside the tile-shaped problems above.
std::vector<kernel_shape> cpu_grid_shapes(std::int64_t d) {
  using len = std::pair<std::int64_t, std::int64_t>;
  std::vector<kernel_shape> out;
  for (auto const& [sq, sk] : {len{1, 1}, len{2, 2}, len{7, 7}, len{7, 13}, len{13, 7},
                               len{130, 200}, len{200, 130}, len{150, 270}, len{270, 150}})
    for (auto const& [hq, hk] : {len{4, 4}, len{4, 2}, len{4, 1}})
      out.push_back({2, sq, sk, hq, hk, d});
  return out;
}

template <class T>
void run_grid() {
  std::uint64_t seed = 100;
  for (std::int64_t d : {64, 128})
    for (auto const& shapes : {grid_shapes(d), cpu_grid_shapes(d)})
      for (auto const& s : shapes)
        for (auto c :
             {wa::causal_mode::none, wa::causal_mode::top_left, wa::causal_mode::bottom_right})
          check_problem<T>(s, wa::make_mask(c, s.sq, s.sk), seed += 10);
}

//! Ring-step masks (stripe offsets -1 and positive, every row empty) and the rows of a
//! bottom_right mask with Sq > Sk that see no key (o = 0, lse = -inf).
void check_ring_offsets() {
  for (std::int64_t d : {64, 128}) {
    check_problem<bf16>({1, 100, 150, 2, 1, d}, {true, -1}, 7);  // row 0 sees nothing
    check_problem<bf16>({2, 70, 90, 2, 2, d}, {true, 37}, 8);
    check_problem<bf16>({1, 80, 80, 2, 2, d}, {true, -100}, 9);  // every row empty
  }
  // Explicit: rows of a bottom_right mask with Sq > Sk that see no key give o = 0, lse = -inf.
  kernel_shape const s{1, 100, 30, 2, 1, 64};
  auto q = random_tensor<bf16>(1, 1.0, s.b, s.sq, s.hq, s.d);
  auto k = random_tensor<bf16>(2, 1.0, s.b, s.sk, s.hk, s.d);
  dbuf<bf16> dq_in(q.buf), dk_in(k.buf);
  dbuf<float> o(std::size_t(s.b * s.sq * s.hq * s.d)), l(std::size_t(s.b * s.hq * s.sq));
  wk::flash_forward<bf16, float>(
      nullptr, cview<bf16>(dq_in.p, 1, s.sq, s.hq, s.d), cview<bf16>(dk_in.p, 1, s.sk, s.hk, s.d),
      cview<bf16>(dk_in.p, 1, s.sk, s.hk, s.d), wd::contiguous_bshd(o.p, 1, s.sq, s.hq, s.d),
      wd::contiguous_bhs(l.p, 1, s.hq, s.sq),
      wa::make_mask(wa::causal_mode::bottom_right, s.sq, s.sk), 0.125f);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  auto const ho = o.host();
  auto const hl = l.host();
  int bad = 0;
  for (std::int64_t h = 0; h < s.hq; ++h)
    for (std::int64_t i = 0; i < s.sq; ++i) {
      float const li = hl[std::size_t(h * s.sq + i)];
      bool const empty = i < s.sq - s.sk;
      if (empty ? !(std::isinf(li) && li < 0) : !std::isfinite(li)) ++bad;
      for (std::int64_t c = 0; c < s.d; ++c) {
        float const x = ho[std::size_t((i * s.hq + h) * s.d + c)];
        if (std::isnan(x) || (empty && x != 0.0f)) ++bad;
      }
    }
  CHECK_MESSAGE(bad == 0, "fully masked rows: ", bad, " wrong values (want o 0, lse -inf)");
}

//! Packed documents (an empty query document, a document with no key, lengths off the tiles)
//! against the CPU varlen entry points, forward and backward.
void check_varlen() {
  // Documents: an empty query document, a document with no key, lengths off the tiles.
  std::vector<std::int64_t> const lq{5, 0, 130, 64, 3, 1}, lk{5, 3, 100, 200, 0, 1};
  std::vector<std::int64_t> cq{0}, ck{0};
  for (std::size_t n = 0; n < lq.size(); ++n) {
    cq.push_back(cq.back() + lq[n]);
    ck.push_back(ck.back() + lk[n]);
  }
  std::vector<int> const cq32(cq.begin(), cq.end()), ck32(ck.begin(), ck.end());
  std::int64_t const tq = cq.back(), tk = ck.back(), max_q = 130, max_k = 200;
  dbuf<int> dcq(cq32), dck(ck32);
  std::int64_t const docs = std::int64_t(lq.size());
  for (std::int64_t d : {64, 128})
    for (auto c :
         {wa::causal_mode::none, wa::causal_mode::top_left, wa::causal_mode::bottom_right}) {
      kernel_shape const s{1, tq, tk, 4, 2, d};
      std::string const ctx =
          describe("bf16 varlen", s, wa::mask_rule{c != wa::causal_mode::none, int(c)});
      CAPTURE(ctx);
      auto q = random_tensor<bf16>(d + 1, 1.5, 1, tq, s.hq, d);
      auto k = random_tensor<bf16>(d + 2, 1.5, 1, tk, s.hk, d);
      auto v = random_tensor<bf16>(d + 3, 1.0, 1, tk, s.hk, d);
      auto g = random_tensor<bf16>(d + 4, 1.0, 1, tq, s.hq, d);
      auto o = make_owned<float>(1, tq, s.hq, d);
      auto l = make_owned<float>(1, s.hq, tq);
      wa::attention_options opt;
      opt.causal = c;
      wa::flash_forward_varlen(q.view(), k.view(), v.view(), o.view(), l.view(), cq, ck, opt);
      auto rdq = make_owned<float>(1, tq, s.hq, d);
      auto rdk = make_owned<float>(1, tk, s.hk, d);
      auto rdv = make_owned<float>(1, tk, s.hk, d);
      wa::flash_backward_varlen(q.view(), k.view(), v.view(), o.view(), l.view(), g.view(),
                                rdq.view(), rdk.view(), rdv.view(), cq, ck, opt);
      float const scale = float(wa::resolve_scale(0.0, d));
      dbuf<bf16> a(q.buf), b(k.buf), cc(v.buf), dg(g.buf);
      auto const gq = cview<bf16>(a.p, 1, tq, s.hq, d);
      auto const gk = cview<bf16>(b.p, 1, tk, s.hk, d);
      auto const gv = cview<bf16>(cc.p, 1, tk, s.hk, d);
      dbuf<float> go(o.size()), gl(l.size());
      wk::flash_forward_varlen<bf16, float>(
          nullptr, gq, gk, gv, wd::contiguous_bshd(go.p, 1, tq, s.hq, d),
          wd::contiguous_bhs(gl.p, 1, s.hq, tq), dcq.p, dck.p, docs, max_q, max_k, c, scale);
      WEFT_CUDA_TRY(cudaDeviceSynchronize());
      expect_close("varlen o", go.host(), o.buf, {1, tq, s.hq, d}, fwd_tol<bf16>(), ctx);
      expect_lse(gl.host(), l.buf, {1, s.hq, tq}, ctx);
      dbuf<float> ro(o.buf), rl(l.buf);
      dbuf<float> gdq(rdq.size()), gdk(rdk.size()), gdv(rdv.size());
      wk::flash_backward_accumulate_varlen<bf16, float>(
          nullptr, gq, gk, gv, cview<float>(ro.p, 1, tq, s.hq, d),
          wd::contiguous_bhs(static_cast<float const*>(rl.p), 1, s.hq, tq),
          cview<bf16>(dg.p, 1, tq, s.hq, d), wd::contiguous_bshd(gdq.p, 1, tq, s.hq, d),
          wd::contiguous_bshd(gdk.p, 1, tk, s.hk, d), wd::contiguous_bshd(gdv.p, 1, tk, s.hk, d),
          dcq.p, dck.p, docs, max_q, max_k, c, scale);
      WEFT_CUDA_TRY(cudaDeviceSynchronize());
      expect_close("varlen dq", gdq.host(), rdq.buf, {1, tq, s.hq, d}, bwd_tol<bf16>(), ctx);
      expect_close("varlen dk", gdk.host(), rdk.buf, {1, tk, s.hk, d}, bwd_tol<bf16>(), ctx);
      expect_close("varlen dv", gdv.host(), rdv.buf, {1, tk, s.hk, d}, bwd_tol<bf16>(), ctx);
    }
}

// dq off the 8-byte alignment (the scalar dQ atomics of wgmma_ws's backward) with the kernels the
// process has chosen.
void check_unaligned_dq() {
  std::uint64_t seed = 1900;
  for (std::int64_t d : {64, 128})
    for (kernel_shape const& s :
         std::vector<kernel_shape>{{1, 257, 100, 4, 1, d}, {1, 700, 1000, 4, 2, d}})
      check_problem<bf16>(s, wa::make_mask(wa::causal_mode::bottom_right, s.sq, s.sk), seed += 10,
                          true);
}

}  // namespace

TEST_CASE("CUDA flash: bad arguments throw naming the argument, before any launch") {
  // Null device pointers: every check runs on the host before a launch.
  auto const q = cview<bf16>(nullptr, 1, 8, 4, 72);
  auto const k = cview<bf16>(nullptr, 1, 8, 4, 72);
  auto o = wd::contiguous_bshd(static_cast<float*>(nullptr), 1, 8, 4, 72);
  auto l = wd::contiguous_bhs(static_cast<float*>(nullptr), 1, 4, 8);
  auto const what = [](auto&& f) -> std::string {
    try {
      f();
    } catch (std::exception const& e) {
      return e.what();
    }
    return "no exception";
  };
  std::string const e1 =
      what([&] { wk::flash_forward<bf16, float>(nullptr, q, k, k, o, l, {}, 0.125f); });
  CAPTURE(e1);
  CHECK(e1.find("72") != std::string::npos);
  CHECK(e1.find("head dimension d") != std::string::npos);
  auto const q4 = cview<bf16>(nullptr, 1, 8, 4, 64);
  auto const k3 = cview<bf16>(nullptr, 1, 8, 3, 64);
  auto o4 = wd::contiguous_bshd(static_cast<float*>(nullptr), 1, 8, 4, 64);
  std::string const e2 =
      what([&] { wk::flash_forward<bf16, float>(nullptr, q4, k3, k3, o4, l, {}, 0.125f); });
  CAPTURE(e2);
  CHECK(e2.find("`k`") != std::string::npos);
  CHECK(e2.find("dividing q's 4 heads") != std::string::npos);
  auto const g4 = cview<bf16>(nullptr, 1, 8, 4, 72);
  auto dq4 = wd::contiguous_bshd(static_cast<float*>(nullptr), 1, 8, 4, 72);
  auto dk4 = wd::contiguous_bshd(static_cast<float*>(nullptr), 1, 8, 4, 72);
  std::string const e3 = what([&] {
    wk::flash_backward_accumulate<bf16, float>(nullptr, q, k, k, wd::as_const(o), wd::as_const(l),
                                               g4, dq4, dk4, dk4, {}, 0.125f);
  });
  CAPTURE(e3);
  CHECK(e3.find("d = 72") != std::string::npos);
}

TEST_CASE("CUDA flash forward/backward match the CPU kernel (bf16)") {
  if (!have_device()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  run_grid<bf16>();
  check_unaligned_dq();
}

TEST_CASE("CUDA flash forward/backward match the CPU kernel (f16)") {
  if (!have_device()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  run_grid<f16>();
}

TEST_CASE("CUDA flash: ring offsets (stripe -1, positive) and fully masked rows") {
  if (!have_device()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  check_ring_offsets();
}

TEST_CASE("CUDA flash backward accumulates (two calls give twice one) and chains from GPU o") {
  if (!have_device()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  kernel_shape const s{2, 150, 150, 4, 2, 128};
  auto const mask = wa::make_mask(wa::causal_mode::top_left, s.sq, s.sk);
  auto q = random_tensor<bf16>(31, 1.5, s.b, s.sq, s.hq, s.d);
  auto k = random_tensor<bf16>(32, 1.5, s.b, s.sk, s.hk, s.d);
  auto v = random_tensor<bf16>(33, 1.0, s.b, s.sk, s.hk, s.d);
  auto g = random_tensor<bf16>(34, 1.0, s.b, s.sq, s.hq, s.d);
  float const scale = float(wa::resolve_scale(0.0, s.d));
  auto const ref = cpu_run(s, q, k, v, g, mask, scale, true);
  dbuf<bf16> a(q.buf), b(k.buf), c(v.buf), dg(g.buf);
  auto const gq = cview<bf16>(a.p, s.b, s.sq, s.hq, s.d);
  auto const gk = cview<bf16>(b.p, s.b, s.sk, s.hk, s.d);
  auto const gv = cview<bf16>(c.p, s.b, s.sk, s.hk, s.d);
  auto const gg = cview<bf16>(dg.p, s.b, s.sq, s.hq, s.d);
  // The whole chain on the GPU: o of bf16 and lse from the GPU forward.
  dbuf<bf16> o(ref.o.size());
  dbuf<float> l(ref.lse.size());
  wk::flash_forward<bf16, bf16>(nullptr, gq, gk, gv, wd::contiguous_bshd(o.p, s.b, s.sq, s.hq, s.d),
                                wd::contiguous_bhs(l.p, s.b, s.hq, s.sq), mask, scale);
  dbuf<float> dq(ref.dq.size()), dk(ref.dk.size()), dv(ref.dv.size());
  auto const run = [&] {
    wk::flash_backward_accumulate<bf16, bf16>(
        nullptr, gq, gk, gv, cview<bf16>(o.p, s.b, s.sq, s.hq, s.d),
        wd::contiguous_bhs(static_cast<float const*>(l.p), s.b, s.hq, s.sq), gg,
        wd::contiguous_bshd(dq.p, s.b, s.sq, s.hq, s.d),
        wd::contiguous_bshd(dk.p, s.b, s.sk, s.hk, s.d),
        wd::contiguous_bshd(dv.p, s.b, s.sk, s.hk, s.d), mask, scale);
    WEFT_CUDA_TRY(cudaDeviceSynchronize());
  };
  run();
  std::string const ctx = describe("bf16 chained", s, mask);
  std::vector<std::int64_t> const odims{s.b, s.sq, s.hq, s.d}, kdims{s.b, s.sk, s.hk, s.d};
  auto const dq1 = dq.host(), dk1 = dk.host(), dv1 = dv.host();
  // o rounded to bf16 feeds D = rowsum(dO o): one more bf16 rounding than the CPU's f32 o.
  expect_close("dq chained", dq1, ref.dq, odims, 2e-2, ctx);
  expect_close("dk chained", dk1, ref.dk, kdims, 2e-2, ctx);
  expect_close("dv chained", dv1, ref.dv, kdims, 2e-2, ctx);
  run();
  auto twice = [](std::vector<float> x) {
    for (auto& e : x) e *= 2.0f;
    return x;
  };
  // Only the order of dq's float atomics differs between the calls.
  expect_close("dq twice", dq.host(), twice(dq1), odims, 1e-5, ctx);
  expect_close("dk twice", dk.host(), twice(dk1), kdims, 1e-6, ctx);
  expect_close("dv twice", dv.host(), twice(dv1), kdims, 1e-6, ctx);
}

TEST_CASE("CUDA flash varlen (packed cu_seqlens) matches the CPU varlen entry points") {
  if (!have_device()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  check_varlen();
}

TEST_CASE("CUDA flash: exec::cuda entry points on cuda_space views") {
  if (!have_device()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  kernel_shape const s{2, 90, 120, 4, 1, 64};
  auto q = random_tensor<bf16>(51, 1.5, s.b, s.sq, s.hq, s.d);
  auto k = random_tensor<bf16>(52, 1.5, s.b, s.sk, s.hk, s.d);
  auto v = random_tensor<bf16>(53, 1.0, s.b, s.sk, s.hk, s.d);
  auto g = random_tensor<bf16>(54, 1.0, s.b, s.sq, s.hq, s.d);
  wa::attention_options opt;
  opt.causal = wa::causal_mode::bottom_right;
  auto const mask = wa::make_mask(opt.causal, s.sq, s.sk);
  float const scale = float(wa::resolve_scale(0.0, s.d));
  auto const ref = cpu_run(s, q, k, v, g, mask, scale, true);
  dbuf<bf16> a(q.buf), b(k.buf), c(v.buf), dg(g.buf);
  using cv4 = weft::tensor_view<bf16 const, 4, weft::cuda_space>;
  using v4 = weft::tensor_view<bf16, 4, weft::cuda_space>;
  cv4 const tq(a.p, s.b, s.sq, s.hq, s.d), tk(b.p, s.b, s.sk, s.hk, s.d),
      tv(c.p, s.b, s.sk, s.hk, s.d), tg(dg.p, s.b, s.sq, s.hq, s.d);
  dbuf<float> o(ref.o.size()), l(ref.lse.size());
  weft::tensor_view<float, 4, weft::cuda_space> to(o.p, s.b, s.sq, s.hq, s.d);
  weft::tensor_view<float, 3, weft::cuda_space> tl(l.p, s.b, s.hq, s.sq);
  weft::exec::cuda const ex{};
  wa::flash_forward(ex, tq, tk, tv, to, tl, opt);
  dbuf<bf16> dq(ref.dq.size()), dk(ref.dk.size()), dv(ref.dv.size());
  wa::flash_backward(ex, tq, tk, tv, to, tl, tg, v4(dq.p, s.b, s.sq, s.hq, s.d),
                     v4(dk.p, s.b, s.sk, s.hk, s.d), v4(dv.p, s.b, s.sk, s.hk, s.d), opt);
  ex.synchronize();
  std::string const ctx = describe("bf16 exec::cuda", s, mask);
  std::vector<std::int64_t> const odims{s.b, s.sq, s.hq, s.d}, kdims{s.b, s.sk, s.hk, s.d};
  expect_close("o", o.host(), ref.o, odims, fwd_tol<bf16>(), ctx);
  expect_lse(l.host(), ref.lse, {s.b, s.hq, s.sq}, ctx);
  // Gradients of bf16: the float result rounded once more.
  expect_close("dq", dq.host(), ref.dq, odims, 2e-2, ctx);
  expect_close("dk", dk.host(), ref.dk, kdims, 2e-2, ctx);
  expect_close("dv", dv.host(), ref.dv, kdims, 2e-2, ctx);
  // An output aliasing an input is refused before any launch.
  bool threw = false;
  try {
    wa::flash_forward(ex, tq, tk, tv,
                      weft::tensor_view<float, 4, weft::cuda_space>(reinterpret_cast<float*>(a.p),
                                                                    s.b, s.sq, s.hq, s.d),
                      tl, opt);
  } catch (std::exception const&) {
    threw = true;
  }
  CHECK(threw);
}
// Host side, no device needed: every wgmma operand descriptor the Hopper kernels build, read the
// way the PTX ISA defines the canonical 128-byte-swizzle layouts (K-major: row r of M or N at
// (r / 8)·SBO + (r % 8)·128, K contiguous; MN-major: 64-element atoms along M or N at LBO, K rows
// at (k / 8)·SBO + (k % 8)·128; then bits 4-6 of the byte address XOR bits 7-9), must find each
// operand element where the cp.async loader (or the dSᵀ store) put it.
namespace wgmma_layout {
namespace ww = weft::attention::kernels::wgmma;
struct fields {
  std::uint32_t start, lbo, sbo;
  unsigned layout;
};
fields decode(std::uint64_t d) {
  return {std::uint32_t(d & 0x3FFF) << 4, std::uint32_t((d >> 16) & 0x3FFF) << 4,
          std::uint32_t((d >> 32) & 0x3FFF) << 4, unsigned(d >> 62)};
}
std::uint32_t swizzle(std::uint32_t a) { return a ^ (((a >> 7) & 7u) << 4); }
// Element (row of M or N, k) of a K-major operand; element (m or n, k) of an MN-major one.
std::uint32_t k_major(fields f, int row, int k) {
  return swizzle(f.start + std::uint32_t(row / 8) * f.sbo + std::uint32_t(row % 8) * 128 +
                 std::uint32_t(k) * 2);
}
std::uint32_t mn_major(fields f, int mn, int k) {
  return swizzle(f.start + std::uint32_t(mn / 64) * f.lbo + std::uint32_t(k / 8) * f.sbo +
                 std::uint32_t(k % 8) * 128 + std::uint32_t(mn % 64) * 2);
}
// Where the loader put element (r, c) of an R-row tile at `base`.
template <int R>
std::uint32_t stored(std::uint32_t base, int r, int c) {
  return base + ww::sw128_offset<R>(r, c);
}
// Counts the elements of `rows` x 16 (one k16 step) an operand reads from the wrong address.
template <class Read, class Want>
int misplaced(int rows, Read read, Want want) {
  int bad = 0;
  for (int i = 0; i < rows; ++i)
    for (int k = 0; k < 16; ++k) bad += read(i, k) != want(i, k);
  return bad;
}
}  // namespace wgmma_layout

TEST_CASE("CUDA flash wgmma descriptors address the elements the loaders stored (host)") {
  using namespace wgmma_layout;
  constexpr std::uint32_t base = 0x8000;  // any 1024-byte aligned shared address
  for (int D : {64, 128}) {
    CAPTURE(D);
    // Forward, 128-key tiles: S = Q Kᵀ reads K [key][d] K-major (N = keys, K = d), and each
    // warpgroup w its 64 rows of the 128-row Q tile [query][d] K-major (M = queries, K = d), from
    // 64 rows (8192 bytes) into each 64-column block.
    constexpr int BK = 128;
    for (int kk = 0; kk < D / 16; ++kk) {
      fields const f = decode(ww::kmajor_step<BK>(base, kk));
      CHECK(f.layout == 1u);
      CHECK(misplaced(
                BK, [&](int n, int k) { return k_major(f, n, k); },
                [&](int n, int k) { return stored<BK>(base, n, kk * 16 + k); }) == 0);
      for (int w = 0; w < 2; ++w) {
        fields const a = decode(ww::kmajor_step<128>(base + std::uint32_t(w) * 64 * 128, kk));
        CHECK(misplaced(
                  64, [&](int m, int k) { return k_major(a, m, k); },
                  [&](int m, int k) { return stored<128>(base, w * 64 + m, kk * 16 + k); }) == 0);
      }
    }
    // Forward: O += P V reads V [key][d] MN-major (K = keys, N = d).
    for (int kk = 0; kk < BK / 16; ++kk) {
      fields const f = decode(ww::mnmajor_step<BK>(base, kk));
      CHECK(misplaced(
                D, [&](int n, int k) { return mn_major(f, n, k); },
                [&](int n, int k) { return stored<BK>(base, kk * 16 + k, n); }) == 0);
    }
    // Backward, 64-row tiles. Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: both operands K-major ([row][d]).
    for (int kk = 0; kk < D / 16; ++kk) {
      fields const f = decode(ww::kmajor_step<64>(base, kk));
      CHECK(misplaced(
                64, [&](int r, int k) { return k_major(f, r, k); },
                [&](int r, int k) { return stored<64>(base, r, kk * 16 + k); }) == 0);
    }
    // dV += Pᵀ dO and dK += dSᵀ Q: dO and Q [query][d] MN-major (K = queries, N = d).
    for (int kk = 0; kk < 4; ++kk) {
      fields const f = decode(ww::mnmajor_step<64>(base, kk));
      CHECK(misplaced(
                D, [&](int n, int k) { return mn_major(f, n, k); },
                [&](int n, int k) { return stored<64>(base, kk * 16 + k, n); }) == 0);
    }
    // dQ = dS K, 64 columns of D at a time: A = dS from dSᵀ [key][query] MN-major (M = queries,
    // K = keys); B = K [key][d] MN-major (K = keys, N = the half's 64 columns).
    for (int kk = 0; kk < 4; ++kk) {
      fields const a = decode(ww::mnmajor_step<64>(base, kk));
      CHECK(misplaced(
                64, [&](int m, int k) { return mn_major(a, m, k); },
                [&](int m, int k) { return stored<64>(base, kk * 16 + k, m); }) == 0);
      for (int half = 0; half < D / 64; ++half) {
        fields const b = decode(ww::mnmajor_step<64>(base + std::uint32_t(half) * 64 * 128, kk));
        CHECK(misplaced(
                  64, [&](int n, int k) { return mn_major(b, n, k); },
                  [&](int n, int k) { return stored<64>(base, kk * 16 + k, half * 64 + n); }) == 0);
      }
    }
  }
  // The swizzled store is a permutation of the tile: no two elements share an address.
  std::vector<int> seen(64 * 128 * 2, 0);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 128; ++c) ++seen[ww::sw128_offset<64>(r, c) / 2];
  CHECK(std::count(seen.begin(), seen.end(), 1) == 64 * 128);
}

namespace {
// The grid, ring offsets, packed documents, several 128-key tiles through the double buffer (a
// partial last tile, GQA, batch 2) and an unaligned dq with the kernels the process has chosen.
void run_all_shapes() {
  run_grid<bf16>();
  run_grid<f16>();
  check_ring_offsets();
  check_varlen();
  std::uint64_t seed = 900;
  for (std::int64_t d : {64, 128})
    for (kernel_shape const& s :
         std::vector<kernel_shape>{{1, 700, 1000, 4, 2, d}, {2, 384, 384, 2, 1, d}})
      for (auto c :
           {wa::causal_mode::none, wa::causal_mode::top_left, wa::causal_mode::bottom_right})
        check_problem<bf16>(s, wa::make_mask(c, s.sq, s.sk), seed += 10);
  // A scale other than 1/sqrt(D).
  for (std::int64_t d : {64, 128})
    check_problem<f16>({2, 130, 200, 4, 2, d},
                       wa::make_mask(wa::causal_mode::bottom_right, 130, 200), seed += 10, false,
                       0.7);
  check_unaligned_dq();
}

struct restore_kernel {
  ~restore_kernel() { wk::set_flash_kernel(wk::flash_kernel::automatic); }
};

// Runs the whole set of shapes with `kernels` chosen, where the default is the Hopper set (so the
// default cases ran automatic's mix: wgmma_ws's backward and d = 64 forward, wgmma's d = 128
// forward; each set alone, and mma_sync, need choosing); elsewhere says why it skips.
void run_all_shapes_where_hopper_is_default(wk::flash_kernel kernels) {
  if (!have_device() || wk::flash_kernel_in_use() != wk::flash_kernel::wgmma_ws) {
    MESSAGE("no compute capability 9.0 device: the default cases ran mma_sync; skipped");
    return;
  }
  restore_kernel const guard;
  wk::set_flash_kernel(kernels);
  run_all_shapes();
}
}  // namespace

TEST_CASE("CUDA flash: the default kernels are wgmma_ws on compute capability 9.0, else mma_sync") {
  // The choice is checked before anything else, device or not.
  std::string bad;
  try {
    wk::set_flash_kernel(static_cast<wk::flash_kernel>(7));
  } catch (weft::invalid_argument_error const& e) {
    bad = e.what();
  }
  CAPTURE(bad);
  CHECK(bad.find("`choice`") != std::string::npos);
  CHECK(bad.find("7") != std::string::npos);
  REQUIRE(wk::get_flash_kernel() == wk::flash_kernel::automatic);  // the default, unchanged
  if (!have_device()) {
    MESSAGE("no CUDA device: skipped");
    return;
  }
  int dev = 0, major = 0, minor = 0;
  WEFT_CUDA_TRY(cudaGetDevice(&dev));
  WEFT_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  WEFT_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  // weft's own build targets 90a (WEFT_CUDA_ARCHITECTURES), so on a 9.0 device the Hopper set
  // (wgmma_ws) runs.
  bool const hopper = major == 9 && minor == 0;
  CHECK(wk::flash_kernel_in_use() ==
        (hopper ? wk::flash_kernel::wgmma_ws : wk::flash_kernel::mma_sync));
  // The forward automatic launches for each head dimension: on Hopper, wgmma_ws's at d = 64 and
  // wgmma's at d = 128 (the faster of each, benchmarks/RESULTS.md's third run).
  auto const forward = [](std::int64_t d) {
    return wk::flash_detail::forward_kernels(cudaStreamLegacy, d);
  };
  CHECK(forward(64) == (hopper ? wk::flash_kernel::wgmma_ws : wk::flash_kernel::mma_sync));
  CHECK(forward(128) == (hopper ? wk::flash_kernel::wgmma : wk::flash_kernel::mma_sync));
  restore_kernel const guard;
  if (hopper) {  // a set chosen by name runs its own forward at every head dimension
    for (auto const k :
         {wk::flash_kernel::wgmma, wk::flash_kernel::wgmma_ws, wk::flash_kernel::wgmma_tma}) {
      wk::set_flash_kernel(k);
      CHECK(forward(64) == k);
      CHECK(forward(128) == k);
    }
  }
  wk::set_flash_kernel(wk::flash_kernel::mma_sync);
  CHECK(wk::flash_kernel_in_use() == wk::flash_kernel::mma_sync);
  CHECK(forward(64) == wk::flash_kernel::mma_sync);
  CHECK(forward(128) == wk::flash_kernel::mma_sync);
  if (!hopper) {
    // Elsewhere wgmma is refused, naming it and the device, and the choice stays.
    std::string msg;
    try {
      wk::set_flash_kernel(wk::flash_kernel::wgmma);
    } catch (weft::invalid_argument_error const& e) {
      msg = e.what();
    }
    CAPTURE(msg);
    CHECK(msg.find("flash_kernel::wgmma") != std::string::npos);
    CHECK(msg.find("compute capability") != std::string::npos);
    CHECK(wk::get_flash_kernel() == wk::flash_kernel::mma_sync);
  }
}

TEST_CASE("CUDA flash forward/backward on wgmma (Hopper, sm_90a) match the CPU kernel") {
  run_all_shapes_where_hopper_is_default(wk::flash_kernel::wgmma);
}

TEST_CASE(
    "CUDA flash forward/backward on wgmma_ws alone (warp-specialised forward at d 64 and 128, "
    "two-warpgroup backward) match the CPU kernel") {
  run_all_shapes_where_hopper_is_default(wk::flash_kernel::wgmma_ws);
}

TEST_CASE(
    "CUDA flash forward/backward on wgmma_tma alone (TMA forward with ping-pong and TMA "
    "two-warpgroup backward on dense views, wgmma_ws's kernels on packed documents) match the CPU "
    "kernel") {
  if (have_device() && wk::flash_kernel_in_use() == wk::flash_kernel::wgmma_ws) {
    // The grid's dense views are ones a tensor map describes (so the TMA kernel is what the dense
    // cases run); packed documents are not.
    dbuf<bf16> x(std::size_t(2 * 300 * 4 * 128));
    auto const dense = cview<bf16>(x.p, 2, 300, 4, 128);
    auto const one_head = cview<bf16>(x.p, 1, 7, 1, 64);
    wk::flash_detail::forward_tensor_maps maps{};
    CHECK(wk::flash_detail::tma_forward_maps(maps, dense, dense, dense, {}));
    CHECK(wk::flash_detail::tma_forward_maps(maps, one_head, one_head, one_head, {}));
    // K and V broadcast over the batch (batch stride 0): accepted by the entry points, not by TMA.
    wd::bshd<bf16 const> const broadcast{x.p, 2, 300, 4, 128, 0, 4 * 128, 128};
    CHECK_FALSE(wk::flash_detail::tma_forward_maps(maps, dense, broadcast, broadcast, {}));
    int const cu[2] = {0, 300};
    CHECK_FALSE(wk::flash_detail::tma_forward_maps(maps, dense, dense, dense,
                                                   {cu, cu, wa::causal_mode::none}));
    // The backward's maps (q, k, v and dout): the same rule.
    wk::flash_detail::backward_tensor_maps bmaps{};
    CHECK(wk::flash_detail::tma_backward_maps(bmaps, dense, dense, dense, dense, {}));
    CHECK(wk::flash_detail::tma_backward_maps(bmaps, one_head, one_head, one_head, one_head, {}));
    CHECK_FALSE(wk::flash_detail::tma_backward_maps(bmaps, dense, broadcast, broadcast, dense, {}));
    CHECK_FALSE(wk::flash_detail::tma_backward_maps(bmaps, dense, dense, dense, broadcast, {}));
    CHECK_FALSE(wk::flash_detail::tma_backward_maps(bmaps, dense, dense, dense, dense,
                                                    {cu, cu, wa::causal_mode::none}));
  }
  run_all_shapes_where_hopper_is_default(wk::flash_kernel::wgmma_tma);
}

TEST_CASE("CUDA flash forward/backward on mma_sync, chosen where the Hopper set is the default") {
  run_all_shapes_where_hopper_is_default(wk::flash_kernel::mma_sync);
}
#endif
