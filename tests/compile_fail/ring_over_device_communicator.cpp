// compile-fail: ring attention moves host arrays, so it asks for a point-to-point communicator over
// host memory (comm::PointToPointIn<C, host_space>). A communicator whose buffers live in CUDA
// memory (here a minimal user type declaring cuda_space, the shape of weft's NCCL communicator)
// must be refused at compile time with weft's own message (which points to the device path,
// stream_ring_forward of weft/attention/cuda/ring.cuh), not throw at run time. The twin passes
// the same type without the memory_space declaration (host memory).
// WEFT_COMPILE_FAIL selects the one line that differs from the twin, which compiles.
#include <weft/attention/ring.hpp>

namespace wc = weft::comm;

template <class Space>
struct user_comm {
  using communicator_concept = wc::point_to_point_tag;
  using memory_space = Space;
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }
  wc::work isend(wc::buffer_view, int, wc::op_options = {}) { return {}; }
  wc::work irecv(wc::buffer_view, int, wc::op_options = {}) { return {}; }
};

void snippet(float* p) {
#if defined(WEFT_COMPILE_FAIL)
  user_comm<weft::cuda_space> comm;
#else
  user_comm<weft::host_space> comm;
#endif
  weft::tensor_view<float, 4> q(p, 1, 4, 2, 8);
  weft::tensor_view<float, 3> lse(p, 1, 2, 4);
  auto const layout = weft::attention::seq_layout::contiguous(1, 4);
  weft::attention::ring_forward(comm, layout, q, q, q, q, lse);
}
