// tests/comm/nccl/gpu.test.cu — the NCCL backend against the real libnccl on one GPU (world size 1:
// NCCL 2.28 forbids two ranks on one device). Label gpu: built everywhere, run where a GPU is.
// The single-rank path still exercises init, config, every entry point, premul ops and events.
#include <weft/comm/nccl/communicator.cuh>
#include <weft/comm/threads/world.hpp>

#include "support/cuda_buffer.hpp"

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <vector>

namespace {

namespace wc = weft::comm;
namespace nc = weft::comm::nccl;
using namespace std::chrono_literals;

//! A device buffer of T (RAII), filled from and read back to host vectors.
template <class T>
struct device_buffer {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_buffer(std::vector<T> const& h) : n(h.size()) {
    WEFT_CUDA_TRY(
        cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(n, 1) * sizeof(T)));
    if (n > 0) WEFT_CUDA_TRY(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit device_buffer(std::size_t count) : device_buffer(std::vector<T>(count)) {}
  ~device_buffer() { (void)cudaFree(p); }
  device_buffer(device_buffer const&) = delete;
  device_buffer& operator=(device_buffer const&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n > 0) WEFT_CUDA_TRY(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  wc::buffer_view view() { return nc::device_view(p, n, 0); }
};

nc::options gpu_options() {
  nc::options o;
  o.timeout = 60s;
  o.check_fingerprints = true;
  return o;
}

}  // namespace

TEST_CASE("gpu: a one-rank NCCL communicator runs every collective") {
  REQUIRE_MESSAGE(weft::test::cuda_device_present(), "this test needs a CUDA device (label gpu)");
  wc::threads::world(1).run([](wc::threads::communicator& host) {
    auto c = nc::communicator::create(host, 0, gpu_options());
    REQUIRE(c.size() == 1);
    REQUIRE(c.rank() == 0);
    cudaStream_t s = nullptr;
    WEFT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    wc::op_options o;
    o.stream = s;

    std::vector<float> h(6);
    std::iota(h.begin(), h.end(), 1.f);
    device_buffer<float> in(h), out(6);
    c.all_reduce(in.view(), out.view(), wc::reduce_kind::sum, o).wait();
    CHECK(out.host() == h);
    c.all_reduce(in.view(), out.view(), wc::reduce_op::premul(2.0), o).wait();
    CHECK(out.host() == std::vector<float>{2, 4, 6, 8, 10, 12});
    c.broadcast(in.view(), out.view(), 0, o).wait();
    CHECK(out.host() == h);
    c.all_gather(in.view(), out.view(), o).wait();
    CHECK(out.host() == h);
    c.reduce_scatter(in.view(), out.view(), wc::reduce_kind::max, o).wait();
    CHECK(out.host() == h);
    c.all_to_all(in.view(), out.view(), o).wait();
    CHECK(out.host() == h);
    c.gather(in.view(), out.view(), 0, o).wait();
    CHECK(out.host() == h);
    c.scatter(in.view(), out.view(), 0, o).wait();
    CHECK(out.host() == h);
    std::vector<std::size_t> counts = {6};
    device_buffer<float> out2(6);
    c.all_gather_v(in.view(), out2.view(), counts, o).wait();
    CHECK(out2.host() == h);
    c.reduce_scatter_v(in.view(), out.view(), counts, wc::reduce_kind::sum, o).wait();
    CHECK(out.host() == h);
    c.all_to_all_v(in.view(), out2.view(), counts, counts, o).wait();
    CHECK(out2.host() == h);
    c.barrier(o).wait();
    c.synchronize(o);

    auto sub = c.split(0, 0);
    CHECK(sub.size() == 1);
    std::vector<std::int32_t> hi = {5, 7};
    device_buffer<std::int32_t> a(hi);
    sub.all_reduce(a.view(), a.view(), wc::reduce_kind::avg, o).wait();
    CHECK(a.host() == hi);
    CHECK(c.history().size() >= 12);
    CHECK(c.state() == wc::comm_state::healthy);
    WEFT_CUDA_TRY(cudaStreamDestroy(s));
  });
}

TEST_CASE("gpu: host memory is rejected before NCCL sees it") {
  REQUIRE_MESSAGE(weft::test::cuda_device_present(), "this test needs a CUDA device (label gpu)");
  wc::threads::world(1).run([](wc::threads::communicator& host) {
    auto c = nc::communicator::create(host, 0, gpu_options());
    std::vector<float> h(4);
    CHECK_THROWS_AS(
        c.all_reduce(wc::host_view(std::span<float>(h)), wc::host_view(std::span<float>(h))),
        weft::invalid_argument_error);
    CHECK(c.state() == wc::comm_state::healthy);
  });
}
