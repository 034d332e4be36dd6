// tests/comm/nccl/ring_attention.test.cu — the device ring attention of attention/cuda/ring.cuh
// (stream_ring_forward / stream_ring_backward) driven through the NCCL mock on the CPU: the ranks
// are threads, the "device" buffers host memory, the block compute the CPU flash kernels
// (host_ring_blocks, f32). World sizes 2, 3, 4; contiguous, zigzag and stripe; causal and not; MHA
// and GQA: o, lse, dq, dk, dv must equal the single-device CPU flash over the full sequence, and
// the exchanges must be grouped send/recv pairs. Also the grouped sendrecv of the communicator, and
// the device Ulysses of attention/cuda/ulysses.cuh (world sizes 2 and 4, KV heads split and
// replicated) against the same reference, and the device USP of attention/cuda/usp.cuh (Ulysses
// groups of consecutive ranks, ring groups strided, as usp.test.cpp; 2x2, 1x2, 2x1, on split
// communicators and on a device_mesh) against it too.
#include <weft/attention/cuda/ring.cuh>
#include <weft/attention/cuda/ulysses.cuh>
#include <weft/attention/cuda/usp.cuh>
#include <weft/mesh/device_mesh.hpp>

#include "mock_suite.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace wa = weft::attention;
namespace wad = weft::attention::detail;
namespace wc = weft::comm;
namespace mk = weft::test::nccl_mock;

struct shape {
  std::int64_t b = 1, s = 8, hq = 2, hkv = 2, d = 8;
};

//! Max |got - want| relative to max |want| (and the first element over `tol`, for the report).
struct comparison {
  double max_abs = 0, max_ref = 0;
  std::int64_t first_bad = -1;
  double rel() const { return max_abs / std::max(max_ref, 1e-30); }
};
comparison compare(std::vector<float> const& got, std::vector<float> const& want, double tol) {
  comparison c;
  for (float w : want)
    if (std::isfinite(w)) c.max_ref = std::max(c.max_ref, double(std::fabs(w)));
  for (std::size_t i = 0; i < want.size(); ++i) {
    double const g = got[i], w = want[i];
    double e = 0;
    if (std::isinf(w) || std::isinf(g))
      e = (g == w) ? 0 : std::numeric_limits<double>::infinity();
    else
      e = std::fabs(g - w);
    if (!(e <= tol * std::max(c.max_ref, 1e-30)) && c.first_bad < 0)
      c.first_bad = static_cast<std::int64_t>(i);
    if (!(e <= c.max_abs)) c.max_abs = e;
  }
  return c;
}

std::vector<float> random_vec(std::size_t n, std::mt19937& g) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::string describe(char const* what, int world, wa::layout_kind kind, bool causal,
                     shape const& sh) {
  std::ostringstream os;
  os << what << ": world " << world << ", layout " << wa::to_string(kind) << ", "
     << (causal ? "causal" : "non-causal") << ", B " << sh.b << ", S " << sh.s << ", Hq " << sh.hq
     << ", Hkv " << sh.hkv << ", D " << sh.d;
  return os.str();
}

void check_close(char const* name, std::vector<float> const& got, std::vector<float> const& want,
                 std::string const& ctx, double tol = 1e-5) {
  comparison const c = compare(got, want, tol);
  INFO(ctx << ": " << name << " max |err| " << c.max_abs << ", max |ref| " << c.max_ref
           << ", relative " << c.rel() << ", first element over tolerance " << c.first_bad
           << (c.first_bad >= 0
                   ? " (got " + std::to_string(got[std::size_t(c.first_bad)]) + ", want " +
                         std::to_string(want[std::size_t(c.first_bad)]) + ")"
                   : std::string()));
  CHECK(c.first_bad < 0);
}

//! A random problem on the full sequence and its reference: the CPU flash, forward and backward.
struct problem {
  std::size_t qn, kn, ln;
  std::vector<float> q, k, v, dout, o, l, dq, dk, dv;
  problem(shape const& sh, bool causal, std::mt19937& gen)
      : qn(std::size_t(sh.b * sh.s * sh.hq * sh.d)),
        kn(std::size_t(sh.b * sh.s * sh.hkv * sh.d)),
        ln(std::size_t(sh.b * sh.hq * sh.s)),
        q(random_vec(qn, gen)),
        k(random_vec(kn, gen)),
        v(random_vec(kn, gen)),
        dout(random_vec(qn, gen)),
        o(qn),
        l(ln),
        dq(qn, 0.f),
        dk(kn, 0.f),
        dv(kn, 0.f) {
    double const scale = 1.0 / std::sqrt(double(sh.d));
    wa::mask_rule const mask{causal, 0};
    auto full_q = wad::contiguous_bshd<float const>(q.data(), sh.b, sh.s, sh.hq, sh.d);
    auto full_k = wad::contiguous_bshd<float const>(k.data(), sh.b, sh.s, sh.hkv, sh.d);
    auto full_v = wad::contiguous_bshd<float const>(v.data(), sh.b, sh.s, sh.hkv, sh.d);
    auto full_g = wad::contiguous_bshd<float const>(dout.data(), sh.b, sh.s, sh.hq, sh.d);
    wad::flash_forward_raw(weft::exec::host{}, full_q, full_k, full_v,
                           wad::contiguous_bshd(o.data(), sh.b, sh.s, sh.hq, sh.d),
                           wad::contiguous_bhs(l.data(), sh.b, sh.hq, sh.s), mask, scale);
    wad::flash_backward_accumulate_raw(
        weft::exec::host{}, full_q, full_k, full_v,
        wad::contiguous_bshd<float const>(o.data(), sh.b, sh.s, sh.hq, sh.d),
        wad::contiguous_bhs<float const>(l.data(), sh.b, sh.hq, sh.s), full_g,
        wad::contiguous_bshd(dq.data(), sh.b, sh.s, sh.hq, sh.d),
        wad::contiguous_bshd(dk.data(), sh.b, sh.s, sh.hkv, sh.d),
        wad::contiguous_bshd(dv.data(), sh.b, sh.s, sh.hkv, sh.d), mask, scale);
  }
};

//! Runs the ring over the mock and compares it with the CPU flash on the full sequence.
void ring_case(int world, wa::layout_kind kind, bool causal, shape sh, bool ulysses = false) {
  std::string const ctx = describe(
      ulysses ? "Ulysses over the NCCL mock" : "ring over the NCCL mock", world, kind, causal, sh);
  CAPTURE(ctx);
  std::mt19937 gen(1234u + static_cast<unsigned>(world * 97 + int(kind) * 13 + (causal ? 1 : 0)));
  problem const pb(sh, causal, gen);
  std::size_t const qn = pb.qn, kn = pb.kn, ln = pb.ln;
  auto const &q = pb.q, &k = pb.k, &v = pb.v, &dout = pb.dout;
  auto const &o_ref = pb.o, &l_ref = pb.l, &dq_ref = pb.dq, &dk_ref = pb.dk, &dv_ref = pb.dv;
  wa::seq_layout const layout =
      kind == wa::layout_kind::contiguous ? wa::seq_layout::contiguous(world, sh.s)
      : kind == wa::layout_kind::zigzag   ? wa::seq_layout::zigzag(world, sh.s)
                                          : wa::seq_layout::stripe(world, sh.s);
  std::int64_t const c = layout.local_length();
  std::vector<float> o_got(qn, NAN), l_got(ln, NAN), dq_got(qn, NAN), dk_got(kn, NAN),
      dv_got(kn, NAN);
  std::mutex m;
  // Gathers rows of a full [B, S, H, D] array into a rank's [B, c, H, D] shard, and back.
  auto shard = [&](std::vector<float> const& full, std::int64_t h, int rank) {
    std::vector<float> out(std::size_t(sh.b * c * h * sh.d));
    for (std::int64_t b = 0; b < sh.b; ++b)
      for (std::int64_t i = 0; i < c; ++i) {
        std::int64_t const t = layout.global_position(rank, i);
        std::copy_n(full.data() + ((b * sh.s + t) * h) * sh.d, h * sh.d,
                    out.data() + ((b * c + i) * h) * sh.d);
      }
    return out;
  };
  auto unshard = [&](std::vector<float> const& part, std::int64_t h, int rank,
                     std::vector<float>& full) {
    for (std::int64_t b = 0; b < sh.b; ++b)
      for (std::int64_t i = 0; i < c; ++i) {
        std::int64_t const t = layout.global_position(rank, i);
        std::copy_n(part.data() + ((b * c + i) * h) * sh.d, h * sh.d,
                    full.data() + ((b * sh.s + t) * h) * sh.d);
      }
  };
  wa::attention_options opt;
  opt.causal = causal ? wa::causal_mode::top_left : wa::causal_mode::none;

  mk::run_ranks(world, [&](wc::nccl::communicator& comm) {
    int const r = comm.rank();
    auto const lq = shard(q, sh.hq, r), lk = shard(k, sh.hkv, r), lv = shard(v, sh.hkv, r),
               lg = shard(dout, sh.hq, r);
    std::vector<float> lo(lq.size()), ll(std::size_t(sh.b * sh.hq * c)), ldq(lq.size()),
        ldk(lk.size()), ldv(lk.size());
    auto const vq = wad::contiguous_bshd<float const>(lq.data(), sh.b, c, sh.hq, sh.d);
    auto const vk = wad::contiguous_bshd<float const>(lk.data(), sh.b, c, sh.hkv, sh.d);
    auto const vv = wad::contiguous_bshd<float const>(lv.data(), sh.b, c, sh.hkv, sh.d);
    auto const vg = wad::contiguous_bshd<float const>(lg.data(), sh.b, c, sh.hq, sh.d);
    wa::host_ring_blocks<float> blocks;
    blocks.stream = reinterpret_cast<void*>(std::uintptr_t(0x5157));  // any transfer "stream"
    if (ulysses) {
      wa::stream_ulysses_forward(comm, blocks, vq, vk, vv,
                                 wad::contiguous_bshd(lo.data(), sh.b, c, sh.hq, sh.d),
                                 wad::contiguous_bhs(ll.data(), sh.b, sh.hq, c), opt);
      wa::stream_ulysses_backward(
          comm, blocks, vq, vk, vv,
          wad::contiguous_bshd<float const>(lo.data(), sh.b, c, sh.hq, sh.d),
          wad::contiguous_bhs<float const>(ll.data(), sh.b, sh.hq, c), vg,
          wad::contiguous_bshd(ldq.data(), sh.b, c, sh.hq, sh.d),
          wad::contiguous_bshd(ldk.data(), sh.b, c, sh.hkv, sh.d),
          wad::contiguous_bshd(ldv.data(), sh.b, c, sh.hkv, sh.d), opt);
    } else {
      wa::stream_ring_forward(comm, blocks, layout, vq, vk, vv,
                              wad::contiguous_bshd(lo.data(), sh.b, c, sh.hq, sh.d),
                              wad::contiguous_bhs(ll.data(), sh.b, sh.hq, c), opt);
      wa::stream_ring_backward(comm, blocks, layout, vq, vk, vv,
                               wad::contiguous_bshd<float const>(lo.data(), sh.b, c, sh.hq, sh.d),
                               wad::contiguous_bhs<float const>(ll.data(), sh.b, sh.hq, c), vg,
                               wad::contiguous_bshd(ldq.data(), sh.b, c, sh.hq, sh.d),
                               wad::contiguous_bshd(ldk.data(), sh.b, c, sh.hkv, sh.d),
                               wad::contiguous_bshd(ldv.data(), sh.b, c, sh.hkv, sh.d), opt);
    }
    std::lock_guard lock(m);
    unshard(lo, sh.hq, r, o_got);
    unshard(ldq, sh.hq, r, dq_got);
    unshard(ldk, sh.hkv, r, dk_got);
    unshard(ldv, sh.hkv, r, dv_got);
    for (std::int64_t b = 0; b < sh.b; ++b)
      for (std::int64_t h = 0; h < sh.hq; ++h)
        for (std::int64_t i = 0; i < c; ++i)
          l_got[std::size_t((b * sh.hq + h) * sh.s + layout.global_position(r, i))] =
              ll[std::size_t((b * sh.hq + h) * c + i)];
  });
  check_close("o", o_got, o_ref, ctx);
  check_close("lse", l_got, l_ref, ctx);
  check_close("dq", dq_got, dq_ref, ctx);
  check_close("dk", dk_got, dk_ref, ctx);
  check_close("dv", dv_got, dv_ref, ctx);
}

//! Runs USP (u Ulysses x r ring ranks) over the mock and compares it with the CPU flash on the
//! full sequence. Global rank g forms Ulysses group g / u (rank g % u) and ring group g % u (rank
//! g / u) by splitting the world, or through a device_mesh {r, u} {"ring", "uly"} with `mesh`.
void usp_case(int u, int r, wa::layout_kind kind, bool causal, shape sh, bool mesh = false) {
  int const world = u * r;
  std::ostringstream what;
  what << "USP " << u << "x" << r << " (ulysses x ring) over the NCCL mock"
       << (mesh ? " on a device_mesh" : "");
  std::string const ctx = describe(what.str().c_str(), world, kind, causal, sh);
  CAPTURE(ctx);
  std::mt19937 gen(4321u + static_cast<unsigned>(u * 101 + r * 31 + int(kind) * 7 +
                                                 int(sh.hkv) * 3 + (causal ? 1 : 0)));
  problem const pb(sh, causal, gen);
  auto const layout = wa::seq_layout::usp(u, r, kind, sh.s);
  std::int64_t const c = layout.local_length();
  std::vector<float> o_got(pb.qn, NAN), l_got(pb.ln, NAN), dq_got(pb.qn, NAN), dk_got(pb.kn, NAN),
      dv_got(pb.kn, NAN);
  std::mutex m;
  auto shard = [&](std::vector<float> const& full, std::int64_t h, int rank) {
    std::vector<float> out(std::size_t(sh.b * c * h * sh.d));
    for (std::int64_t b = 0; b < sh.b; ++b)
      for (std::int64_t i = 0; i < c; ++i)
        std::copy_n(full.data() + ((b * sh.s + layout.global_position(rank, i)) * h) * sh.d,
                    h * sh.d, out.data() + ((b * c + i) * h) * sh.d);
    return out;
  };
  auto unshard = [&](std::vector<float> const& part, std::int64_t h, int rank,
                     std::vector<float>& full) {
    for (std::int64_t b = 0; b < sh.b; ++b)
      for (std::int64_t i = 0; i < c; ++i)
        std::copy_n(part.data() + ((b * c + i) * h) * sh.d, h * sh.d,
                    full.data() + ((b * sh.s + layout.global_position(rank, i)) * h) * sh.d);
  };
  wa::attention_options opt;
  opt.causal = causal ? wa::causal_mode::top_left : wa::causal_mode::none;

  mk::run_ranks(world, [&](wc::nccl::communicator& comm) {
    int const g = comm.rank();
    auto const lq = shard(pb.q, sh.hq, g), lk = shard(pb.k, sh.hkv, g), lv = shard(pb.v, sh.hkv, g),
               lg = shard(pb.dout, sh.hq, g);
    std::vector<float> lo(lq.size(), NAN), ll(std::size_t(sh.b * sh.hq * c), NAN),
        ldq(lq.size(), NAN), ldk(lk.size(), NAN), ldv(lk.size(), NAN);
    auto const vq = wad::contiguous_bshd<float const>(lq.data(), sh.b, c, sh.hq, sh.d);
    auto const vk = wad::contiguous_bshd<float const>(lk.data(), sh.b, c, sh.hkv, sh.d);
    auto const vv = wad::contiguous_bshd<float const>(lv.data(), sh.b, c, sh.hkv, sh.d);
    auto const vg = wad::contiguous_bshd<float const>(lg.data(), sh.b, c, sh.hq, sh.d);
    auto const vo = wad::contiguous_bshd(lo.data(), sh.b, c, sh.hq, sh.d);
    auto const vl = wad::contiguous_bhs(ll.data(), sh.b, sh.hq, c);
    auto const vdq = wad::contiguous_bshd(ldq.data(), sh.b, c, sh.hq, sh.d);
    auto const vdk = wad::contiguous_bshd(ldk.data(), sh.b, c, sh.hkv, sh.d);
    auto const vdv = wad::contiguous_bshd(ldv.data(), sh.b, c, sh.hkv, sh.d);
    wa::host_ring_blocks<float> blocks;
    blocks.stream = reinterpret_cast<void*>(std::uintptr_t(0x5157));  // any transfer "stream"
    if (mesh) {
      weft::device_mesh<wc::nccl::communicator> dm(comm, {r, u}, {"ring", "uly"});
      REQUIRE(wa::usp_layout_rank(dm, "uly", "ring") == g);
      wa::stream_usp_forward(dm, "uly", "ring", blocks, layout, vq, vk, vv, vo, vl, opt);
      wa::stream_usp_backward(dm, "uly", "ring", blocks, layout, vq, vk, vv, wad::cview(vo),
                              wad::cview(vl), vg, vdq, vdk, vdv, opt);
    } else {
      auto uc = comm.split(g / u, g % u);
      auto rc = comm.split(g % u, g / u);
      REQUIRE(uc.size() == u);
      REQUIRE(rc.size() == r);
      REQUIRE(rc.rank() * u + uc.rank() == g);  // usp.hpp's global layout rank
      wa::stream_usp_forward(uc, rc, blocks, layout, vq, vk, vv, vo, vl, opt);
      wa::stream_usp_backward(uc, rc, blocks, layout, vq, vk, vv, wad::cview(vo), wad::cview(vl),
                              vg, vdq, vdk, vdv, opt);
    }
    std::lock_guard lock(m);
    unshard(lo, sh.hq, g, o_got);
    unshard(ldq, sh.hq, g, dq_got);
    unshard(ldk, sh.hkv, g, dk_got);
    unshard(ldv, sh.hkv, g, dv_got);
    for (std::int64_t b = 0; b < sh.b; ++b)
      for (std::int64_t h = 0; h < sh.hq; ++h)
        for (std::int64_t i = 0; i < c; ++i)
          l_got[std::size_t((b * sh.hq + h) * sh.s + layout.global_position(g, i))] =
              ll[std::size_t((b * sh.hq + h) * c + i)];
  });
  check_close("o", o_got, pb.o, ctx);
  check_close("lse", l_got, pb.l, ctx);
  check_close("dq", dq_got, pb.dq, ctx);
  check_close("dk", dk_got, pb.dk, ctx);
  check_close("dv", dv_got, pb.dv, ctx);
}

//! Every inner layout (non-causal only contiguous, as usp.hpp), causal and not, Hq 4 with Hkv 4
//! (MHA), 2 and 1 (GQA/MQA: KV heads split, or replicated when u exceeds them).
void usp_grid(int u, int r) {
  for (auto kind : {wa::layout_kind::contiguous, wa::layout_kind::zigzag, wa::layout_kind::stripe})
    for (bool causal : {false, true}) {
      if (!causal && kind != wa::layout_kind::contiguous) continue;  // refused by the layout
      for (std::int64_t hkv : {std::int64_t(4), std::int64_t(2), std::int64_t(1)}) {
        shape sh;
        sh.b = 2;
        sh.s = 2 * u * r * 3;  // zigzag halves of 3 rows per Ulysses piece
        sh.hq = 4;
        sh.hkv = hkv;
        sh.d = 6;
        usp_case(u, r, kind, causal, sh);
      }
    }
}

}  // namespace

TEST_CASE("ring attention over NCCL (mock): forward and backward equal the full-sequence flash") {
  for (int world : {2, 3, 4})
    for (auto kind :
         {wa::layout_kind::contiguous, wa::layout_kind::zigzag, wa::layout_kind::stripe})
      for (bool causal : {false, true}) {
        if (!causal && kind != wa::layout_kind::contiguous) continue;  // refused by the layout
        shape gqa;
        gqa.b = 2;
        gqa.s = 4 * world;  // 4 local rows: zigzag halves of 2
        gqa.hq = 4;
        gqa.hkv = 2;
        gqa.d = 8;
        ring_case(world, kind, causal, gqa);
        shape mha;
        mha.b = 1;
        mha.s = 6 * world;
        mha.hq = 3;
        mha.hkv = 3;
        mha.d = 5;
        ring_case(world, kind, causal, mha);
      }
}

TEST_CASE("ring attention over NCCL (mock): one rank is the plain flash") {
  shape sh;
  sh.b = 1;
  sh.s = 6;
  sh.hq = 2;
  sh.hkv = 1;
  sh.d = 4;
  ring_case(1, wa::layout_kind::contiguous, true, sh);
  ring_case(1, wa::layout_kind::contiguous, false, sh);
}

TEST_CASE("ring attention over NCCL (mock): each ring exchange is one grouped send/recv") {
  mk::mock m;
  int const world = 3;
  std::vector<std::size_t> sends(world), groups(world);
  wc::threads::world(world, weft::test::test_options()).run([&](wc::threads::communicator& host) {
    auto comm = wc::nccl::communicator::create(
        host, host.rank(), mk::suite_options(weft::test::default_test_timeout, false));
    int const r = comm.rank();
    std::vector<float> out(3, -1.f), in{float(r), float(r) + 0.5f, float(r) + 0.25f};
    comm.sendrecv(weft::test::mock_device_memory::view(std::span<float>(in)), (r + 1) % world,
                  weft::test::mock_device_memory::view(std::span<float>(out)),
                  (r - 1 + world) % world)
        .wait();
    int const p = (r - 1 + world) % world;
    CHECK(out == std::vector<float>{float(p), float(p) + 0.5f, float(p) + 0.25f});
    auto const h = comm.history();
    REQUIRE(h.size() >= 2);
    CHECK(h[h.size() - 2].op == wc::op_kind::send);
    CHECK(h.back().op == wc::op_kind::recv);
    CHECK(h.back().end >= h.back().start);
  });
  // Per rank: one group with an ncclSend and an ncclRecv (calls are recorded in order per rank).
  auto const calls = m.calls();
  for (int r = 0; r < world; ++r) {
    CHECK(m.count("ncclSend", r) == 1);
    CHECK(m.count("ncclRecv", r) == 1);
  }
  CHECK(m.count("ncclGroupStart") >= std::size_t(world));
  CHECK(m.problems().empty());
}

TEST_CASE("ring attention over NCCL (mock): argument checks name the argument") {
  mk::run_ranks(2, [&](wc::nccl::communicator& comm) {
    std::vector<float> q(2 * 4 * 2 * 4), k(2 * 4 * 1 * 4), o(q.size()), l(2 * 2 * 4);
    auto const vq = wad::contiguous_bshd<float const>(q.data(), 2, 4, 2, 4);
    auto const vk = wad::contiguous_bshd<float const>(k.data(), 2, 4, 1, 4);
    wa::host_ring_blocks<float> blocks;
    // A layout over the wrong number of ranks.
    CHECK_THROWS_AS(wa::stream_ring_forward(comm, blocks, wa::seq_layout::contiguous(4, 16), vq, vk,
                                            vk, wad::contiguous_bshd(o.data(), 2, 4, 2, 4),
                                            wad::contiguous_bhs(l.data(), 2, 2, 4)),
                    weft::invalid_argument_error);
    // o of the wrong shape.
    CHECK_THROWS_AS(wa::stream_ring_forward(comm, blocks, wa::seq_layout::contiguous(2, 8), vq, vk,
                                            vk, wad::contiguous_bshd(o.data(), 2, 4, 1, 4),
                                            wad::contiguous_bhs(l.data(), 2, 2, 4)),
                    weft::invalid_argument_error);
  });
}

TEST_CASE("Ulysses over NCCL (mock): forward and backward equal the full-sequence flash") {
  for (int world : {2, 4})
    for (bool causal : {false, true})
      for (std::int64_t hkv : {std::int64_t(4), std::int64_t(2), std::int64_t(1)}) {
        // Hkv 4: split evenly; Hkv 2 on 4 ranks and Hkv 1: replicated KV heads.
        shape sh;
        sh.b = 2;
        sh.s = 3 * world;
        sh.hq = 4;
        sh.hkv = hkv;
        sh.d = 6;
        ring_case(world, wa::layout_kind::contiguous, causal, sh, true);
      }
}

TEST_CASE("USP over NCCL (mock): 2x2 (ulysses x ring) equals the full-sequence flash") {
  usp_grid(2, 2);
}

TEST_CASE("USP over NCCL (mock): 1x2 (a ring of one-rank Ulysses groups) equals the flash") {
  usp_grid(1, 2);
}

TEST_CASE("USP over NCCL (mock): 2x1 (Ulysses with one-rank rings) equals the flash") {
  usp_grid(2, 1);
}

TEST_CASE("USP over NCCL (mock): on a device_mesh, as on split communicators") {
  shape sh;
  sh.b = 1;
  sh.s = 2 * 2 * 2 * 2;
  sh.hq = 4;
  sh.hkv = 2;
  sh.d = 4;
  usp_case(2, 2, wa::layout_kind::zigzag, true, sh, true);
  usp_case(2, 2, wa::layout_kind::contiguous, false, sh, true);
}

TEST_CASE("USP over NCCL (mock): bad arguments are refused before any exchange") {
  mk::run_ranks(4, [&](wc::nccl::communicator& comm) {
    int const g = comm.rank();
    auto uc = comm.split(g / 2, g % 2);
    auto rc = comm.split(g % 2, g / 2);
    std::size_t const uh = uc.history().size(), rh = rc.history().size();
    // B 1, c 4, Hq 2, Hkv 2, D 4 on a 2x2 USP over S = 16.
    std::vector<float> q(1 * 4 * 2 * 4), o(q.size()), l(1 * 2 * 4), q3(1 * 4 * 3 * 4);
    auto const vq = wad::contiguous_bshd<float const>(q.data(), 1, 4, 2, 4);
    auto const vo = wad::contiguous_bshd(o.data(), 1, 4, 2, 4);
    auto const vl = wad::contiguous_bhs(l.data(), 1, 2, 4);
    wa::host_ring_blocks<float> blocks;
    wa::attention_options causal;
    causal.causal = wa::causal_mode::top_left;
    // Degrees that are not the groups'.
    CHECK_THROWS_WITH_AS(wa::stream_usp_forward(
                             uc, rc, blocks, wa::seq_layout::usp(4, 1, wa::layout_kind::zigzag, 16),
                             vq, vq, vq, vo, vl, causal),
                         doctest::Contains("Ulysses degree 2"), weft::invalid_argument_error);
    CHECK_THROWS_WITH_AS(wa::stream_usp_forward(
                             uc, rc, blocks, wa::seq_layout::usp(2, 1, wa::layout_kind::zigzag, 8),
                             vq, vq, vq, vo, vl, causal),
                         doctest::Contains("ring degree 2"), weft::invalid_argument_error);
    // Zigzag without a causal mask.
    CHECK_THROWS_WITH_AS(wa::stream_usp_forward(
                             uc, rc, blocks, wa::seq_layout::usp(2, 2, wa::layout_kind::zigzag, 16),
                             vq, vq, vq, vo, vl),
                         doctest::Contains("contiguous"), weft::invalid_argument_error);
    // A local length that is not the layout's.
    CHECK_THROWS_WITH_AS(wa::stream_usp_forward(
                             uc, rc, blocks, wa::seq_layout::usp(2, 2, wa::layout_kind::zigzag, 32),
                             vq, vq, vq, vo, vl, causal),
                         doctest::Contains("local sequence length 8"),
                         weft::invalid_argument_error);
    // Query heads (3) not divisible by the Ulysses degree (one KV head).
    auto const v3 = wad::contiguous_bshd<float const>(q3.data(), 1, 4, 3, 4);
    auto const v1 = wad::contiguous_bshd<float const>(q.data(), 1, 4, 1, 4);
    std::vector<float> o3(q3.size()), l3(1 * 3 * 4);
    CHECK_THROWS_WITH_AS(wa::stream_usp_forward(
                             uc, rc, blocks, wa::seq_layout::usp(2, 2, wa::layout_kind::zigzag, 16),
                             v3, v1, v1, wad::contiguous_bshd(o3.data(), 1, 4, 3, 4),
                             wad::contiguous_bhs(l3.data(), 1, 3, 4), causal),
                         doctest::Contains("divisible by the Ulysses degree 2"),
                         weft::invalid_argument_error);
    // o of the wrong shape, in the backward.
    CHECK_THROWS_AS(wa::stream_usp_backward(
                        uc, rc, blocks, wa::seq_layout::usp(2, 2, wa::layout_kind::zigzag, 16), vq,
                        vq, vq, wad::cview(vo), wad::cview(vl), vq,
                        wad::contiguous_bshd(o.data(), 1, 4, 1, 4), vo, vo, causal),
                    weft::invalid_argument_error);
    // Nothing reached either communicator.
    CHECK(uc.history().size() == uh);
    CHECK(rc.history().size() == rh);
  });
}
