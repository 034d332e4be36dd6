// tests/comm/nccl/mock.test.cu — the NCCL backend's logic driven through the mock nccl_api on the
// CPU: dtype and op mapping, bootstrap and split, every collective's argument plumbing and results,
// grouped send/recv, ncclInProgress polling, error mapping, abort on timeout, fingerprints,
// history.
#if defined(__CUDACC__)
#include <weft/comm/nccl/communicator.cuh>
#else
#include <weft/comm/nccl/communicator.hpp>  // g++ iteration: the same logic without nvcc
#endif
#include <weft/comm/threads/world.hpp>

#include "mock_nccl.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace {

namespace wc = weft::comm;
namespace nc = weft::comm::nccl;
using weft_test::nccl_mock::mock;
using namespace std::chrono_literals;

nc::options mock_options(bool fingerprints = false) {
  nc::options o;
  o.api = &mock::api();
  o.timeout = 2s;
  o.check_fingerprints = fingerprints;
  o.poll_interval = 20us;
  return o;
}

template <class T>
wc::buffer_view dv(std::vector<T>& v, std::size_t offset = 0, std::size_t count = std::size_t(-1)) {
  if (count == std::size_t(-1)) count = v.size() - offset;
  return {v.data() + offset, count, weft::dtype_of<T>, wc::memory_kind::cuda, -1};
}

//! n ranks created with the mock's own init and adopted, so one thread can drive them all: every
//! rank enqueues first, then the test waits on the works.
struct adopted_world {
  std::vector<ncclComm_t> raw;
  std::vector<nc::communicator> ranks;
};

adopted_world make_world(mock& m, int n, nc::options o = mock_options()) {
  adopted_world w;
  ncclUniqueId id = m.make_id();
  for (int r = 0; r < n; ++r) {
    ncclComm_t c = nullptr;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    REQUIRE(mock::api().comm_init_rank_config(&c, n, id, r, &cfg) == ncclInProgress);
    w.raw.push_back(c);
  }
  for (auto c : w.raw) w.ranks.push_back(nc::communicator::adopt(c, o));
  return w;
}

template <class T>
double as_double(T v) {
  return static_cast<double>(static_cast<std::conditional_t<std::is_integral_v<T>, T, float>>(v));
}
template <>
double as_double<double>(double v) {
  return v;
}

}  // namespace

TEST_CASE("dtype and reduce-op mapping") {
  CHECK(nc::to_nccl(weft::dtype::f32) == ncclFloat32);
  CHECK(nc::to_nccl(weft::dtype::f64) == ncclFloat64);
  CHECK(nc::to_nccl(weft::dtype::bf16) == ncclBfloat16);
  CHECK(nc::to_nccl(weft::dtype::f16) == ncclFloat16);
  CHECK(nc::to_nccl(weft::dtype::i32) == ncclInt32);
  CHECK(nc::to_nccl(weft::dtype::i64) == ncclInt64);
  CHECK(nc::to_nccl(weft::dtype::u8) == ncclUint8);
  CHECK(nc::to_nccl(wc::reduce_kind::sum) == ncclSum);
  CHECK(nc::to_nccl(wc::reduce_kind::prod) == ncclProd);
  CHECK(nc::to_nccl(wc::reduce_kind::min) == ncclMin);
  CHECK(nc::to_nccl(wc::reduce_kind::max) == ncclMax);
  CHECK(nc::to_nccl(wc::reduce_kind::avg) == ncclAvg);
  CHECK_THROWS_AS((void)nc::to_nccl(wc::reduce_kind::premul_sum), weft::invalid_argument_error);
  CHECK_THROWS_AS((void)nc::to_nccl(static_cast<weft::dtype>(42)), weft::invalid_argument_error);
  static_assert(wc::StreamCommunicator<nc::communicator>);
}

TEST_CASE("bootstrap over a threads communicator: one unique id, non-blocking init polled") {
  mock m;
  std::atomic<int> ok{0};
  wc::threads::world(3).run([&](wc::threads::communicator& host) {
    auto c = nc::communicator::create(host, host.rank() + 4, mock_options());
    CHECK(c.rank() == host.rank());
    CHECK(c.size() == 3);
    CHECK(c.device() == host.rank() + 4);
    CHECK(c.state() == wc::comm_state::healthy);
    ok.fetch_add(1);
  });
  CHECK(ok.load() == 3);
  CHECK(m.count("ncclGetUniqueId") == 1);
  auto inits = m.calls_named("ncclCommInitRankConfig");
  REQUIRE(inits.size() == 3);
  for (auto const& c : inits) {
    CHECK(c.blocking == 0);
    CHECK(c.count == 3u);
  }
  auto devs = m.calls_named("cudaSetDevice");
  REQUIRE(devs.size() == 3);
  std::vector<std::size_t> d;
  for (auto const& c : devs) d.push_back(c.count);
  std::sort(d.begin(), d.end());
  CHECK(d == std::vector<std::size_t>{4, 5, 6});
  // Owned communicators flush and destroy (never abort) when healthy.
  CHECK(m.count("ncclCommFinalize") == 3);
  CHECK(m.count("ncclCommDestroy") == 3);
  CHECK(m.count("ncclCommAbort") == 0);
  CHECK(m.problems().empty());
}

TEST_CASE("bootstrap: ncclGetUniqueId failing on rank 0 fails every rank with backend_error") {
  mock m;
  m.unique_id_fails = true;
  std::atomic<int> thrown{0};
  wc::threads::world(2).run([&](wc::threads::communicator& host) {
    try {
      (void)nc::communicator::create(host, 0, mock_options());
    } catch (weft::backend_error const& e) {
      CHECK(e.backend() == "nccl");
      CHECK(e.backend_code() == ncclSystemError);
      thrown.fetch_add(1);
    }
  });
  CHECK(thrown.load() == 2);
  CHECK(m.count("ncclCommInitRankConfig") == 0);
}

TEST_CASE("bootstrap: two ranks on one device fail alike before NCCL init") {
  mock m;
  std::atomic<int> thrown{0};
  wc::threads::world(3).run([&](wc::threads::communicator& host) {
    try {
      (void)nc::communicator::create(host, host.rank() == 2 ? 0 : host.rank(), mock_options());
    } catch (weft::invalid_argument_error const& e) {
      std::string const what = e.what();
      CHECK(what.find("`device`") != std::string::npos);
      CHECK(what.find("rank 0 and rank 2") != std::string::npos);
      thrown.fetch_add(1);
    }
  });
  CHECK(thrown.load() == 3);
  CHECK(m.count("ncclCommInitRankConfig") == 0);
}

TEST_CASE("init: a rank that never joins is a timeout_error and an abort") {
  mock m;
  auto o = mock_options();
  o.timeout = 60ms;
  auto const t0 = std::chrono::steady_clock::now();
  try {
    (void)nc::communicator::init(m.make_id(), 0, 2, 0, o);
    FAIL("init returned");
  } catch (weft::timeout_error const& e) {
    CHECK(std::string(e.what()).find("ncclCommInitRankConfig") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  CHECK(m.count("ncclCommAbort") == 1);
  CHECK(m.count("ncclCommDestroy") == 0);
}

TEST_CASE("init: argument checks throw before any call") {
  mock m;
  CHECK_THROWS_AS((void)nc::communicator::init(m.make_id(), 2, 2, 0, mock_options()),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS((void)nc::communicator::init(m.make_id(), 0, 0, 0, mock_options()),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS((void)nc::communicator::init(m.make_id(), 0, 1, -1, mock_options()),
                  weft::invalid_argument_error);
  CHECK(m.count("ncclCommInitRankConfig") == 0);
  CHECK_THROWS_AS((void)nc::communicator::adopt(nullptr, mock_options()),
                  weft::invalid_argument_error);
}

TEST_CASE_TEMPLATE("all_reduce maps every dtype and op, premul_sum through a created op", T, float,
                   double, weft::bf16, weft::f16, std::int32_t, std::int64_t, std::uint8_t) {
  mock m;
  int const n = 3;
  auto w = make_world(m, n);
  std::size_t const count = 7;
  auto input = [](int r, std::size_t i) { return double(r + 1) + double(i % 3); };
  struct case_t {
    wc::reduce_op op;
    int nccl_op;
  };
  std::vector<case_t> cases = {{wc::reduce_kind::sum, ncclSum}, {wc::reduce_kind::prod, ncclProd},
                               {wc::reduce_kind::min, ncclMin}, {wc::reduce_kind::max, ncclMax},
                               {wc::reduce_kind::avg, ncclAvg}, {wc::reduce_op::premul(2.0), -1}};
  for (auto const& cs : cases) {
    CAPTURE(to_string(cs.op.kind));
    std::vector<std::vector<T>> in(n, std::vector<T>(count)), out(n, std::vector<T>(count));
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < count; ++i)
        in[r][i] = static_cast<T>(static_cast<float>(input(r, i)));
    auto const before = m.count("ncclAllReduce");
    std::vector<wc::work> works;
    for (int r = 0; r < n; ++r)
      works.push_back(w.ranks[r].all_reduce(dv(in[r]), dv(out[r]), cs.op));
    for (auto& wk : works) wk.wait();
    auto calls = m.calls_named("ncclAllReduce");
    REQUIRE(calls.size() == before + n);
    for (std::size_t k = before; k < calls.size(); ++k) {
      CHECK(calls[k].type == static_cast<int>(nc::to_nccl(weft::dtype_of<T>)));
      CHECK(calls[k].count == count);
      if (cs.nccl_op >= 0)
        CHECK(calls[k].op == cs.nccl_op);
      else
        CHECK(calls[k].op >= static_cast<int>(ncclNumOps));
    }
    for (std::size_t i = 0; i < count; ++i) {
      double want = 0;
      double a = input(0, i), b = input(1, i), c = input(2, i);
      switch (cs.op.kind) {
        case wc::reduce_kind::sum: want = a + b + c; break;
        case wc::reduce_kind::prod: want = a * b * c; break;
        case wc::reduce_kind::min: want = std::min({a, b, c}); break;
        case wc::reduce_kind::max: want = std::max({a, b, c}); break;
        case wc::reduce_kind::avg:
          want = (a + b + c) / 3.0;
          if (std::is_integral_v<T>) want = std::trunc(want);
          break;
        case wc::reduce_kind::premul_sum: want = 2.0 * (a + b + c); break;
      }
      double const tol = std::is_integral_v<T> ? 0.0 : (sizeof(T) == 2 ? 1e-2 : 1e-6) * want;
      for (int r = 0; r < n; ++r) CHECK(std::abs(as_double(out[r][i]) - want) <= tol);
    }
  }
  // premul: one op per rank created with the scalar in the element type, destroyed once enqueued.
  auto created = m.calls_named("ncclRedOpCreatePreMulSum");
  REQUIRE(created.size() == static_cast<std::size_t>(n));
  for (auto const& c : created) {
    CHECK(c.scalar == 2.0);
    CHECK(c.type == static_cast<int>(nc::to_nccl(weft::dtype_of<T>)));
  }
  CHECK(m.count("ncclRedOpDestroy") == static_cast<std::size_t>(n));
  CHECK(m.live_premul_ops() == 0);
  CHECK(m.problems().empty());
}

TEST_CASE("rooted collectives: broadcast, reduce, gather, scatter for every root") {
  mock m;
  int const n = 4;
  auto w = make_world(m, n);
  for (int root = 0; root < n; ++root) {
    CAPTURE(root);
    std::size_t const c = 5;
    std::vector<std::vector<float>> in(n), out(n);
    for (int r = 0; r < n; ++r) {
      in[r].resize(n * c);
      std::iota(in[r].begin(), in[r].end(), float(100 * r));
      out[r].assign(n * c, -1.f);
    }
    std::vector<wc::work> ws;
    // broadcast: root's first c elements to everyone's out[0..c)
    for (int r = 0; r < n; ++r)
      ws.push_back(w.ranks[r].broadcast(dv(in[r], 0, c), dv(out[r], 0, c), root));
    for (auto& x : ws) x.wait();
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < c; ++i) CHECK(out[r][i] == float(100 * root + int(i)));
    auto b = m.calls_named("ncclBroadcast");
    CHECK(b.back().root_or_peer == root);
    ws.clear();
    // reduce (sum) into root's out
    for (auto& o : out) std::fill(o.begin(), o.end(), -1.f);
    for (int r = 0; r < n; ++r)
      ws.push_back(w.ranks[r].reduce(dv(in[r], 0, c), dv(out[r], 0, r == root ? c : 0),
                                     wc::reduce_kind::sum, root));
    for (auto& x : ws) x.wait();
    for (std::size_t i = 0; i < c; ++i)
      CHECK(out[root][i] == float(100 * (0 + 1 + 2 + 3) + 4 * int(i)));
    for (int r = 0; r < n; ++r)
      if (r != root) CHECK(out[r][0] == -1.f);
    for (auto const& call : m.calls_named("ncclReduce"))
      CHECK((call.rank == call.root_or_peer) == (call.recv != nullptr));
    ws.clear();
    // gather: c from each rank into root's out (native ncclGather)
    for (auto& o : out) std::fill(o.begin(), o.end(), -1.f);
    for (int r = 0; r < n; ++r)
      ws.push_back(
          w.ranks[r].gather(dv(in[r], 0, c), r == root ? dv(out[r]) : wc::buffer_view{}, root));
    for (auto& x : ws) x.wait();
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < c; ++i) CHECK(out[root][q * c + i] == float(100 * q + int(i)));
    ws.clear();
    // scatter: root's n*c split among ranks (native ncclScatter)
    for (auto& o : out) std::fill(o.begin(), o.end(), -1.f);
    for (int r = 0; r < n; ++r)
      ws.push_back(
          w.ranks[r].scatter(r == root ? dv(in[r]) : wc::buffer_view{}, dv(out[r], 0, c), root));
    for (auto& x : ws) x.wait();
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < c; ++i) CHECK(out[r][i] == float(100 * root + int(r * c + i)));
  }
  CHECK(m.count("ncclGather") == 16);
  CHECK(m.count("ncclScatter") == 16);
  CHECK(m.problems().empty());
}

TEST_CASE("all_gather, reduce_scatter (in-place offset forms too) and native all_to_all") {
  mock m;
  int const n = 3;
  auto w = make_world(m, n);
  std::size_t const c = 4;
  std::vector<std::vector<std::int32_t>> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    in[r].resize(n * c);
    std::iota(in[r].begin(), in[r].end(), 10 * r);
    out[r].assign(n * c, -1);
  }
  std::vector<wc::work> ws;
  for (int r = 0; r < n; ++r) ws.push_back(w.ranks[r].all_gather(dv(in[r], 0, c), dv(out[r])));
  for (auto& x : ws) x.wait();
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < c; ++i) CHECK(out[r][q * c + i] == 10 * q + int(i));
  CHECK(m.calls_named("ncclAllGather").back().count == c);  // per-rank count, as NCCL wants
  ws.clear();
  // in-place all_gather: in == out + rank * c
  auto buf = in;
  for (int r = 0; r < n; ++r) ws.push_back(w.ranks[r].all_gather(dv(buf[r], r * c, c), dv(buf[r])));
  for (auto& x : ws) x.wait();
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q) CHECK(buf[r][q * c] == 10 * q + q * int(c));
  ws.clear();
  // reduce_scatter out-of-place: out = sum over ranks of in[q][r*c .. r*c+c)
  for (int r = 0; r < n; ++r) ws.push_back(w.ranks[r].reduce_scatter(dv(in[r]), dv(out[r], 0, c)));
  for (auto& x : ws) x.wait();
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < c; ++i) CHECK(out[r][i] == (0 + 10 + 20) + 3 * int(r * c + i));
  CHECK(m.calls_named("ncclReduceScatter").back().count == c);
  ws.clear();
  // in-place reduce_scatter: out == in + rank * c
  buf = in;
  for (int r = 0; r < n; ++r)
    ws.push_back(w.ranks[r].reduce_scatter(dv(buf[r]), dv(buf[r], r * c, c)));
  for (auto& x : ws) x.wait();
  for (int r = 0; r < n; ++r) CHECK(buf[r][r * c] == 30 + 3 * int(r * c));
  ws.clear();
  // all_to_all: block q of rank r goes to rank q's block r
  for (int r = 0; r < n; ++r) ws.push_back(w.ranks[r].all_to_all(dv(in[r]), dv(out[r])));
  for (auto& x : ws) x.wait();
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q) CHECK(out[r][q * c] == 10 * q + r * int(c));
  CHECK(m.calls_named("ncclAlltoAll").back().count == c);
  CHECK(m.count("ncclSend") == 0);  // natives, not emulated
  ws.clear();
  // in-place all_to_all (out == in), as on every backend: the input is read from a device copy
  // made on the call's stream (one stream per rank: the mock runs a stream's copies in order, and
  // the default stream would queue each rank's copy behind the others' pending collectives)
  auto const stream_of = [](int r) {
    wc::op_options o;
    o.stream = reinterpret_cast<void*>(std::uintptr_t(0x7000 + r));
    return o;
  };
  auto const mallocs = m.count("cudaMalloc");
  for (int round = 0; round < 2; ++round) {  // twice: the staging buffer is kept and reused
    buf = in;
    ws.clear();
    for (int r = 0; r < n; ++r)
      ws.push_back(w.ranks[r].all_to_all(dv(buf[r]), dv(buf[r]), stream_of(r)));
    for (auto& x : ws) x.wait();
    CHECK(buf == out);
  }
  CHECK(m.count("cudaMalloc") - mallocs == n);  // one staging buffer per rank
  CHECK(m.problems().empty());
}

TEST_CASE("_v variants are grouped send/recv (all_gather_v, all_to_all_v) and grouped reduce") {
  mock m;
  int const n = 3;
  auto w = make_world(m, n);
  std::vector<std::size_t> counts = {2, 0, 3};  // uneven, one empty
  std::size_t const total = 5;
  std::vector<std::vector<double>> in(n), out(n, std::vector<double>(total, -1));
  for (int r = 0; r < n; ++r) {
    in[r].resize(counts[r]);
    for (std::size_t i = 0; i < counts[r]; ++i) in[r][i] = 10.0 * r + double(i);
  }
  auto const sends0 = m.count("ncclSend");
  auto const groups0 = m.count("ncclGroupStart");
  std::vector<wc::work> ws;
  for (int r = 0; r < n; ++r) ws.push_back(w.ranks[r].all_gather_v(dv(in[r]), dv(out[r]), counts));
  for (auto& x : ws) x.wait();
  std::vector<double> want = {0, 1, 20, 21, 22};
  for (int r = 0; r < n; ++r) CHECK(out[r] == want);
  CHECK(m.count("ncclGroupStart") - groups0 == 3);
  CHECK(m.count("ncclGroupEnd") == m.count("ncclGroupStart"));
  // ranks 0 and 2 send to 3 peers each (self included); rank 1 has nothing to send
  CHECK(m.count("ncclSend") - sends0 == 6);
  CHECK(m.count("ncclSend", 1) == 0);
  CHECK(m.count("ncclRecv", 0) == 2);  // from ranks 0 and 2 (rank 1's count is 0)
  ws.clear();

  // reduce_scatter_v: rank r gets the sum of slice r (counts[r] at offset sum(counts[<r]))
  std::vector<std::vector<double>> full(n, std::vector<double>(total));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < total; ++i) full[r][i] = double(r + 1) * double(i + 1);
  std::vector<std::vector<double>> part(n);
  for (int r = 0; r < n; ++r) part[r].assign(counts[r], -1);
  auto const reduces0 = m.count("ncclReduce");
  for (int r = 0; r < n; ++r)
    ws.push_back(
        w.ranks[r].reduce_scatter_v(dv(full[r]), dv(part[r]), counts, wc::reduce_op::premul(0.5)));
  for (auto& x : ws) x.wait();
  CHECK(part[0] == std::vector<double>{0.5 * 6 * 1, 0.5 * 6 * 2});
  CHECK(part[2] == std::vector<double>{0.5 * 6 * 3, 0.5 * 6 * 4, 0.5 * 6 * 5});
  CHECK(m.count("ncclReduce") - reduces0 == 6);  // 2 non-empty slices x 3 ranks
  CHECK(m.live_premul_ops() == 0);
  ws.clear();

  // all_to_all_v: rank r sends (r + p) % 2 + 1 elements to p
  std::vector<std::vector<std::size_t>> sc(n, std::vector<std::size_t>(n)),
      rc(n, std::vector<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    for (int p = 0; p < n; ++p) sc[r][p] = rc[p][r] = std::size_t((r + p) % 2 + 1);
  std::vector<std::vector<double>> a(n), b(n);
  for (int r = 0; r < n; ++r) {
    std::size_t k = 0;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < sc[r][p]; ++i)
        a[r].push_back(100.0 * r + 10.0 * p + double(i)), ++k;
    b[r].assign(std::accumulate(rc[r].begin(), rc[r].end(), std::size_t(0)), -1);
  }
  for (int r = 0; r < n; ++r)
    ws.push_back(w.ranks[r].all_to_all_v(dv(a[r]), dv(b[r]), sc[r], rc[r]));
  for (auto& x : ws) x.wait();
  for (int r = 0; r < n; ++r) {
    std::vector<double> expect;
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < rc[r][p]; ++i) expect.push_back(100.0 * p + 10.0 * r + double(i));
    CHECK(b[r] == expect);
  }
  CHECK(m.problems().empty());
}

TEST_CASE("send, recv, isend, irecv and barrier with done() and wait_for() following the event") {
  mock m;
  auto w = make_world(m, 2);
  std::vector<float> x = {1, 2, 3}, y(3, 0);
  auto s = w.ranks[0].isend(dv(x), 1);
  CHECK_FALSE(s.done());  // the receiver has not posted
  CHECK_FALSE(s.wait_for(5ms));
  auto r = w.ranks[1].irecv(dv(y), 0);
  CHECK(s.wait_for(1s));
  r.wait();
  CHECK(y == x);
  CHECK(m.calls_named("ncclSend").back().root_or_peer == 1);
  CHECK(m.calls_named("ncclRecv").back().root_or_peer == 0);
  // blocking-named calls are enqueued too on a stream backend
  auto s2 = w.ranks[1].send(dv(y), 0);
  std::vector<float> z(3, 0);
  auto r2 = w.ranks[0].recv(dv(z), 1);
  s2.wait();
  r2.wait();
  CHECK(z == x);
  // a message to oneself (one rule on every backend): the second half issues both in one group
  std::vector<float> self_in{7, 8, 9}, self_out(3, 0);
  auto ss = w.ranks[0].isend(dv(self_in), 0);
  CHECK_FALSE(ss.done());  // waits for its other half
  auto sr = w.ranks[0].recv(dv(self_out), 0);
  sr.wait();
  ss.wait();
  CHECK(self_out == self_in);
  CHECK(w.ranks[0].history().back().op == wc::op_kind::recv);
  CHECK_THROWS_AS(w.ranks[0].send(dv(x), 2), weft::invalid_argument_error);
  // barrier: a one-word all_reduce on device scratch
  auto b0 = w.ranks[0].barrier();
  CHECK_FALSE(b0.wait_for(2ms));
  auto b1 = w.ranks[1].barrier();
  b0.wait();
  b1.wait();
  auto ar = m.calls_named("ncclAllReduce");
  REQUIRE(ar.size() == 2);
  CHECK(ar[0].count == 1);
  CHECK(ar[0].type == ncclInt32);
  CHECK(m.count("cudaMalloc") == 2);  // once per communicator
  CHECK(m.problems().empty());
}

TEST_CASE("streams: work is recorded on op_options::stream and synchronize waits on it") {
  mock m;
  auto w = make_world(m, 2);
  auto* st = reinterpret_cast<void*>(std::uintptr_t{0x5000});
  std::vector<float> a(4, 1), b(4, 2);
  wc::op_options o;
  o.stream = st;
  auto w0 = w.ranks[0].all_reduce(dv(a), dv(a), {}, o);
  auto w1 = w.ranks[1].all_reduce(dv(b), dv(b), {}, o);
  for (auto const& c : m.calls_named("ncclAllReduce")) CHECK(c.stream == st);
  for (auto const& c : m.calls_named("cudaEventRecord")) CHECK(c.stream == st);
  w.ranks[0].synchronize(o);
  w.ranks[1].synchronize(o);
  CHECK(w0.wait_for(1s));
  CHECK(a == std::vector<float>(4, 3));
  CHECK(b == std::vector<float>(4, 3));
}

TEST_CASE("zero count is a local no-op, recorded in the history and reported to the hook") {
  mock m;
  auto w = make_world(m, 2);
  std::vector<float> e;
  int hooked = 0;
  w.ranks[0].set_hook([&](wc::op_record const&) { ++hooked; });
  auto const before = m.calls().size();
  auto wk = w.ranks[0].all_reduce(dv(e), dv(e));
  CHECK(wk.done());
  (void)w.ranks[0].all_gather(dv(e), dv(e));
  (void)w.ranks[0].broadcast(dv(e), dv(e), 1);
  (void)w.ranks[0].send(dv(e), 1);  // nothing travels, nothing must be matched
  CHECK(m.calls().size() == before);
  auto const h = w.ranks[0].history();
  REQUIRE(h.size() == 4);  // as on every backend (it recorded nothing here)
  CHECK(h[0].op == wc::op_kind::all_reduce);
  CHECK(h[0].seq == 0);
  CHECK(h[0].ok);
  CHECK(h[2].root_or_peer == 1);
  CHECK(h[3].op == wc::op_kind::send);
  CHECK(hooked == 4);
}

TEST_CASE("invalid arguments throw before any NCCL call and leave the communicator healthy") {
  mock m;
  auto w = make_world(m, 2);
  std::vector<float> a(4), b(4), c(8);
  auto host = dv(a);
  host.where = wc::memory_kind::host;
  auto other_dev = dv(a);
  other_dev.device = 3;
  auto const before = m.calls().size();
  auto& r0 = w.ranks[0];
  CHECK_THROWS_AS(r0.all_reduce(host, dv(b)), weft::invalid_argument_error);
  CHECK_THROWS_AS(r0.all_reduce(other_dev, dv(b)), weft::invalid_argument_error);
  CHECK_THROWS_AS(r0.all_reduce(dv(a), dv(c)), weft::shape_error);
  CHECK_THROWS_AS(r0.all_reduce(dv(c, 0, 4), dv(c, 2, 4)),
                  weft::invalid_argument_error);  // overlap
  CHECK_THROWS_AS(r0.broadcast(dv(a), dv(b), 2), weft::invalid_argument_error);
  CHECK_THROWS_AS(r0.reduce(dv(a), dv(b), wc::reduce_kind::sum, -1), weft::invalid_argument_error);
  CHECK_THROWS_AS(r0.all_gather(dv(a), dv(b)), weft::shape_error);
  CHECK_THROWS_AS(r0.reduce_scatter(dv(a), dv(a, 0, 3)), weft::shape_error);
  CHECK_THROWS_AS(r0.all_to_all(dv(c, 0, 3), dv(a, 0, 3)), weft::shape_error);
  CHECK_THROWS_AS(r0.all_to_all(dv(c, 0, 4), dv(c, 2, 4)),
                  weft::invalid_argument_error);  // overlap
  CHECK_THROWS_AS(r0.gather(dv(a), dv(b), 0), weft::shape_error);
  CHECK_THROWS_AS(r0.scatter(dv(a), dv(b), 0), weft::shape_error);
  std::vector<std::size_t> bad_counts = {4};
  CHECK_THROWS_AS(r0.all_gather_v(dv(a), dv(c), bad_counts), weft::invalid_argument_error);
  std::vector<std::size_t> counts = {4, 4};
  CHECK_THROWS_AS(r0.all_gather_v(dv(a, 0, 3), dv(c), counts), weft::shape_error);
  // Size arithmetic on counts is checked (issue 9, item 10): {SIZE_MAX, 1} sums to 0 unchecked.
  std::vector<std::uint8_t> u8s(1);
  std::vector<std::size_t> wraps = {std::size_t(-1), 1};
  auto big = [&](std::size_t count) {  // dv's count sentinel is SIZE_MAX: build the view here
    return wc::buffer_view{u8s.data(), count, weft::dtype::u8, wc::memory_kind::cuda, -1};
  };
  CHECK_THROWS_WITH_AS(r0.all_gather_v(big(std::size_t(-1)), big(0), wraps),
                       doctest::Contains("`counts`"), weft::invalid_argument_error);
  CHECK_THROWS_WITH_AS(r0.reduce_scatter_v(big(0), big(std::size_t(-1)), wraps),
                       doctest::Contains("`counts`"), weft::invalid_argument_error);
  CHECK_THROWS_WITH_AS(r0.all_to_all_v(big(0), big(0), wraps, wraps),
                       doctest::Contains("`send_counts`"), weft::invalid_argument_error);
  CHECK_THROWS_AS(r0.all_gather(big(std::size_t(1) << 63), big(0)),
                  weft::invalid_argument_error);  // 2 * 2^63 wraps to 0
  wc::buffer_view huge{a.data(), std::size_t(-1) / 2, weft::dtype::f32, wc::memory_kind::cuda, -1};
  CHECK_THROWS_AS(r0.all_reduce(huge, huge), weft::invalid_argument_error);  // bytes do not fit
  std::vector<std::int32_t> ints(4);
  CHECK_THROWS_AS(r0.all_reduce(dv(ints), dv(ints), wc::reduce_op::premul(0.5)),
                  weft::invalid_argument_error);
  CHECK_THROWS_AS(r0.all_reduce(dv(a), dv(ints)), weft::invalid_argument_error);  // dtype
  CHECK(m.calls().size() == before);
  CHECK(r0.state() == wc::comm_state::healthy);
  // ... and the next valid collective works
  std::vector<float> x(4, 1), y(4, 2);
  auto w0 = r0.all_reduce(dv(x), dv(x));
  auto w1 = w.ranks[1].all_reduce(dv(y), dv(y));
  w0.wait();
  w1.wait();
  CHECK(x == std::vector<float>(4, 3));
}

TEST_CASE("ncclInProgress from enqueue and group end is polled through ncclCommGetAsyncError") {
  mock m;
  m.enqueue_in_progress = true;
  m.in_progress_polls = 3;
  auto w = make_world(m, 2);
  std::vector<float> x(2, 1), y(2, 2);
  auto const polls0 = m.count("ncclCommGetAsyncError");
  (void)polls0;
  auto w0 = w.ranks[0].all_reduce(dv(x), dv(x));
  auto w1 = w.ranks[1].all_reduce(dv(y), dv(y));
  w0.wait();
  w1.wait();
  CHECK(x == std::vector<float>(2, 3));
  std::vector<std::size_t> counts = {2, 2};
  std::vector<float> g0(4), g1(4);
  auto v0 = w.ranks[0].all_gather_v(dv(x), dv(g0), counts);
  auto v1 = w.ranks[1].all_gather_v(dv(y), dv(g1), counts);
  v0.wait();
  v1.wait();
  CHECK(g0 == std::vector<float>{3, 3, 3, 3});
  CHECK(w.ranks[0].state() == wc::comm_state::healthy);
}

TEST_CASE("error mapping: invalid argument keeps the communicator, fatal results abort it") {
  struct expect_t {
    ncclResult_t r;
    bool fatal;
  };
  for (auto const& e : {expect_t{ncclInvalidArgument, false}, expect_t{ncclInvalidUsage, true},
                        expect_t{ncclSystemError, true}, expect_t{ncclInternalError, true},
                        expect_t{ncclUnhandledCudaError, true}, expect_t{ncclRemoteError, true}}) {
    ncclResult_t const r = e.r;
    bool const fatal = e.fatal;
    CAPTURE(static_cast<int>(r));
    mock m;
    auto w = make_world(m, 2);
    std::vector<float> x(2, 1);
    m.fail_next("ncclAllReduce", r, 0);
    try {
      (void)w.ranks[0].all_reduce(dv(x), dv(x));
      FAIL("no throw");
    } catch (weft::peer_aborted_error const& err) {
      CHECK(r == ncclRemoteError);
      CHECK(std::string(err.what()).find("remote") != std::string::npos);
    } catch (weft::backend_error const& err) {
      CHECK(r != ncclRemoteError);
      CHECK(err.backend() == "nccl");
      CHECK(err.backend_code() == static_cast<long long>(r));
      CHECK(std::string(err.what()).find("ncclResult_t") != std::string::npos);
    }
    CHECK(m.count("ncclCommAbort", 0) == (fatal ? 1u : 0u));
    CHECK(w.ranks[0].state() == (fatal ? wc::comm_state::poisoned : wc::comm_state::healthy));
    if (fatal) {
      auto const before = m.calls().size();
      // rejected with the original fault's type
      if (r == ncclRemoteError)
        CHECK_THROWS_AS(w.ranks[0].all_reduce(dv(x), dv(x)), weft::peer_aborted_error);
      else
        CHECK_THROWS_AS(w.ranks[0].all_reduce(dv(x), dv(x)), weft::backend_error);
      CHECK_THROWS_AS(w.ranks[0].barrier(), weft::comm_error);
      CHECK_THROWS_AS(w.ranks[0].split(0, 0), weft::comm_error);
      CHECK(m.calls().size() == before);  // rejected at once
      auto h = w.ranks[0].history();
      REQUIRE(h.size() == 1);
      CHECK_FALSE(h[0].ok);
      CHECK_FALSE(h[0].error.empty());
    }
  }
}

TEST_CASE("asynchronous error while waiting: abort and peer_aborted_error") {
  mock m;
  auto w = make_world(m, 2);
  std::vector<float> x(2, 1);
  auto wk = w.ranks[0].all_reduce(dv(x), dv(x));  // rank 1 never posts
  m.set_async_error(w.raw[0], ncclRemoteError);
  CHECK_THROWS_AS(wk.wait(), weft::peer_aborted_error);
  CHECK(m.aborted(w.raw[0]));
  CHECK(w.ranks[0].state() == wc::comm_state::poisoned);
  CHECK_THROWS_AS(w.ranks[0].all_reduce(dv(x), dv(x)), weft::peer_aborted_error);
}

TEST_CASE("a CUDA error from the event is a backend_error naming cuda") {
  mock m;
  auto w = make_world(m, 1);
  std::vector<float> x(2, 1);
  auto wk = w.ranks[0].all_reduce(dv(x), dv(x));
  m.set_event_error(cudaErrorIllegalAddress);
  try {
    wk.wait();
    FAIL("no throw");
  } catch (weft::backend_error const& e) {
    CHECK(e.backend() == "cuda");
    CHECK(e.backend_code() == cudaErrorIllegalAddress);
  }
  CHECK(w.ranks[0].state() == wc::comm_state::poisoned);
}

TEST_CASE("a missing rank: timeout_error within the deadline, then ncclCommAbort") {
  mock m;
  auto w = make_world(m, 2);
  std::vector<float> x(2, 1);
  wc::op_options o;
  o.timeout = 80ms;
  auto const t0 = std::chrono::steady_clock::now();
  auto wk = w.ranks[0].all_reduce(dv(x), dv(x), {}, o);
  try {
    wk.wait();
    FAIL("no throw");
  } catch (weft::timeout_error const& e) {
    CHECK(std::string(e.what()).find("all_reduce") != std::string::npos);
    CHECK(std::string(e.what()).find("seq 1") != std::string::npos);
  }
  auto const took = std::chrono::steady_clock::now() - t0;
  CHECK(took >= 80ms);
  CHECK(took < 1s);
  CHECK(m.count("ncclCommAbort", 0) == 1);
  CHECK_THROWS_AS(w.ranks[0].all_gather(dv(x, 0, 1), dv(x)), weft::timeout_error);
  w.ranks[0].abort();  // idempotent after a fault
  CHECK(m.count("ncclCommAbort", 0) == 1);
}

TEST_CASE("abort() is idempotent and later calls throw peer_aborted_error naming this rank") {
  mock m;
  auto w = make_world(m, 2);
  w.ranks[1].abort();
  w.ranks[1].abort();
  CHECK(w.ranks[1].state() == wc::comm_state::aborted);
  CHECK(m.count("ncclCommAbort", 1) == 1);
  std::vector<float> x(2);
  try {
    (void)w.ranks[1].all_reduce(dv(x), dv(x));
    FAIL("no throw");
  } catch (weft::peer_aborted_error const& e) {
    CHECK(e.origin_rank() == 1);
  }
}

TEST_CASE("owned communicator: poisoned ones are aborted, not destroyed, at destruction") {
  mock m;
  std::atomic<int> n{0};
  wc::threads::world(2).run([&](wc::threads::communicator& host) {
    auto c = nc::communicator::create(host, host.rank(), mock_options());
    if (c.rank() == 0) {
      m.fail_next("ncclAllGather", ncclSystemError, 0);
      std::vector<float> x(2);
      CHECK_THROWS_AS(c.all_gather(dv(x, 0, 1), dv(x)), weft::backend_error);
      n.fetch_add(1);
    }
  });
  CHECK(n.load() == 1);
  CHECK(m.count("ncclCommAbort") == 1);
  CHECK(m.count("ncclCommDestroy") == 1);  // the healthy rank 1 only
}

TEST_CASE(
    "split: ncclCommSplit non-blocking, children ordered by key, negative color a non-member") {
  mock m;
  std::atomic<int> checked{0};
  wc::threads::world(4).run([&](wc::threads::communicator& host) {
    auto c = nc::communicator::create(host, host.rank(), mock_options());
    int const r = c.rank();
    int const color = r == 3 ? -1 : r % 2;
    auto sub = c.split(color, -r);  // descending parent rank
    if (r == 3) {
      CHECK(sub.size() == 0);
      CHECK(sub.rank() == -1);
      std::vector<float> x(1);
      CHECK_THROWS_AS(sub.all_reduce(dv(x), dv(x)), weft::invalid_argument_error);
    } else if (color == 0) {
      CHECK(sub.size() == 2);                 // parent ranks 0 and 2
      CHECK(sub.rank() == (r == 2 ? 0 : 1));  // key -2 < key 0
      std::vector<float> x(3, float(r + 1));
      sub.all_reduce(dv(x), dv(x)).wait();
      CHECK(x == std::vector<float>(3, 4.f));
    } else {
      CHECK(sub.size() == 1);
      CHECK(sub.rank() == 0);
    }
    checked.fetch_add(1);
  });
  CHECK(checked.load() == 4);
  auto splits = m.calls_named("ncclCommSplit");
  REQUIRE(splits.size() == 4);
  for (auto const& s : splits) {
    CHECK(s.blocking == 0);
    if (s.rank == 3) CHECK(s.op == NCCL_SPLIT_NOCOLOR);
  }
  CHECK(m.problems().empty());
}

TEST_CASE("debug fingerprints: mismatched op or count throws mismatch_error on every rank") {
  for (int variant = 0; variant < 2; ++variant) {
    CAPTURE(variant);
    mock m;
    std::atomic<int> mismatches{0};
    wc::threads::world(2).run([&](wc::threads::communicator& host) {
      auto c = nc::communicator::create(host, host.rank(), mock_options(true));
      std::vector<float> x(4, 1), y(8, 0);
      try {
        if (c.rank() == 0 || variant == 1) {
          std::size_t const k = c.rank() == 1 ? 3 : 4;  // variant 1: count differs
          c.all_reduce(dv(x, 0, k), dv(y, 0, k)).wait();
        } else {
          c.all_gather(dv(x), dv(y)).wait();
        }
        FAIL("no mismatch detected");
      } catch (weft::mismatch_error const& e) {
        std::string const what = e.what();
        CHECK(what.find(variant == 0 ? "differ in: op" : "differ in: count") != std::string::npos);
        CHECK(what.find("rank 0") != std::string::npos);
        CHECK(what.find("rank 1") != std::string::npos);
        mismatches.fetch_add(1);
      }
      CHECK(c.state() == wc::comm_state::poisoned);
    });
    CHECK(mismatches.load() == 2);
    CHECK(m.count("ncclAllReduce") == 0);  // the mismatched collective itself never ran
  }
}

TEST_CASE("debug fingerprints: matching calls pass and cost one 8-word all_gather each") {
  mock m;
  wc::threads::world(3).run([&](wc::threads::communicator& host) {
    auto c = nc::communicator::create(host, host.rank(), mock_options(true));
    std::vector<double> x(5, c.rank());
    c.all_reduce(dv(x), dv(x)).wait();
    c.all_reduce(dv(x), dv(x), wc::reduce_kind::max).wait();
    CHECK(x == std::vector<double>(5, 3.0));
  });
  auto ag = m.calls_named("ncclAllGather");
  CHECK(ag.size() == 6);
  for (auto const& a : ag) {
    CHECK(a.count == 8);
    CHECK(a.type == ncclInt64);
  }
}

TEST_CASE("history and hook: one record per operation, completed by the waiting thread") {
  mock m;
  auto w = make_world(m, 2);
  std::vector<wc::op_record> hooked;
  w.ranks[0].set_hook([&](wc::op_record const& r) { hooked.push_back(r); });
  std::vector<float> a(4, 1), b(4, 1), g0(8), g1(8);
  std::vector<wc::work> ws;
  ws.push_back(w.ranks[0].all_reduce(dv(a), dv(a)));
  ws.push_back(w.ranks[1].all_reduce(dv(b), dv(b)));
  ws.push_back(w.ranks[0].all_gather(dv(a), dv(g0)));
  ws.push_back(w.ranks[1].all_gather(dv(b), dv(g1)));
  for (auto& x : ws) x.wait();
  auto h = w.ranks[0].history();
  REQUIRE(h.size() == 2);
  CHECK(h[0].op == wc::op_kind::all_reduce);
  CHECK(h[0].seq == 1);
  CHECK(h[0].send_bytes == 16);
  CHECK(h[1].op == wc::op_kind::all_gather);
  CHECK(h[1].seq == 2);
  CHECK(h[1].recv_bytes == 32);
  CHECK(h[1].ok);
  CHECK(h[1].end >= h[1].start);
  REQUIRE(hooked.size() == 2);
  CHECK(hooked[1].op == wc::op_kind::all_gather);
  auto o = mock_options();
  o.history_size = 1;
  auto w2 = make_world(m, 1, o);
  (void)w2.ranks[0].all_reduce(dv(a), dv(a));
  (void)w2.ranks[0].all_reduce(dv(a), dv(a));
  REQUIRE(w2.ranks[0].history().size() == 1);
  CHECK(w2.ranks[0].history()[0].seq == 2);
}

TEST_CASE("events are destroyed with their work, premul ops never leak on a failed enqueue") {
  mock m;
  {
    auto w = make_world(m, 1);
    std::vector<float> x(3, 2);
    {
      auto wk = w.ranks[0].all_reduce(dv(x), dv(x), wc::reduce_op::premul(3.0));
      wk.wait();
      CHECK(x == std::vector<float>(3, 6));
    }
    CHECK(m.live_events() == 0);
    m.fail_next("ncclAllReduce", ncclInvalidArgument, 0);
    CHECK_THROWS_AS(w.ranks[0].all_reduce(dv(x), dv(x), wc::reduce_op::premul(3.0)),
                    weft::backend_error);
    CHECK(m.count("ncclRedOpDestroy") == 2);
  }
  auto problems = m.problems();
  // the failed premul op was destroyed without a use, which the mock reports; nothing else
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("before any use") != std::string::npos);
}

TEST_CASE("all_to_all_v with a rank that moves nothing keeps every rank's sequence aligned") {
  mock m;
  std::atomic<int> ok{0};
  wc::threads::world(3).run([&](wc::threads::communicator& host) {
    auto c = nc::communicator::create(host, host.rank(), mock_options(true));
    int const r = c.rank();
    // ranks 0 and 2 exchange 2 elements each way; rank 1 neither sends nor receives
    std::vector<std::size_t> sc(3, 0), rc(3, 0);
    if (r != 1) sc[2 - r] = rc[2 - r] = 2;
    std::vector<float> in(r == 1 ? 0 : 2, float(r + 1)), out(r == 1 ? 0 : 2, 0.f);
    c.all_to_all_v(dv(in), dv(out), sc, rc).wait();
    if (r != 1) CHECK(out == std::vector<float>(2, float(3 - r)));
    std::vector<float> x(2, 1.f);
    c.all_reduce(dv(x), dv(x)).wait();  // fingerprints agree: same seq on every rank
    CHECK(x == std::vector<float>(2, 3.f));
    CHECK(c.history().back().seq == 2);
    ok.fetch_add(1);
  });
  CHECK(ok.load() == 3);
  CHECK(m.problems().empty());
}

TEST_CASE(
    "deadlines also bound split, a stuck ncclInProgress enqueue and finalize at destruction") {
  mock m;
  auto o = mock_options();
  o.timeout = 60ms;
  {
    auto w = make_world(m, 2, o);
    auto const t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_AS((void)w.ranks[0].split(0, 0), weft::timeout_error);  // rank 1 never splits
    CHECK(std::chrono::steady_clock::now() - t0 < 1s);
    CHECK(m.count("ncclCommAbort", 0) == 1);
    CHECK(w.ranks[0].state() == wc::comm_state::poisoned);
  }
  {
    auto w = make_world(m, 1, o);
    m.enqueue_in_progress = true;
    m.in_progress_polls = 1 << 30;  // the enqueue never leaves ncclInProgress
    std::vector<float> x(2, 1);
    try {
      (void)w.ranks[0].all_reduce(dv(x), dv(x));
      FAIL("no throw");
    } catch (weft::timeout_error const& e) {
      CHECK(std::string(e.what()).find("not enqueued") != std::string::npos);
    }
    m.enqueue_in_progress = false;
    m.in_progress_polls = 2;
  }
  std::atomic<bool> created{false};
  wc::threads::world(1).run([&](wc::threads::communicator& host) {
    auto c = nc::communicator::create(host, 0, o);
    created = true;
    m.in_progress_polls = 1 << 30;  // finalize never quiesces: the destructor must abort
  });
  CHECK(created.load());
  CHECK(m.count("ncclCommFinalize") == 1);
  CHECK(m.count("ncclCommDestroy") == 0);
  CHECK(m.count("ncclCommAbort") == 4);  // split (parent and half-made child), enqueue, finalize
}

TEST_CASE(
    "adopt: the wrapped handle is never destroyed by weft, and a failed query does not abort it") {
  mock m;
  ncclComm_t raw = nullptr;
  {
    auto w = make_world(m, 1);
    raw = w.raw[0];
    CHECK(w.ranks[0].native_handle() == raw);
    std::vector<float> x(2, 1);
    w.ranks[0].all_reduce(dv(x), dv(x)).wait();
  }
  CHECK_FALSE(m.destroyed(raw));
  CHECK_FALSE(m.aborted(raw));
  CHECK(m.count("ncclCommFinalize") == 0);
  ncclComm_t pending = nullptr;  // a split child whose rendezvous never completed: queries fail
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  auto w2 = make_world(m, 2);
  REQUIRE(mock::api().comm_split(w2.raw[0], 0, 0, &pending, &cfg) == ncclInProgress);
  CHECK_THROWS_AS((void)nc::communicator::adopt(pending, mock_options()), weft::backend_error);
  CHECK_FALSE(m.aborted(pending));
}
