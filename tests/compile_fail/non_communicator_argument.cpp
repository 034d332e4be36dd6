// compile-fail: a type is a communicator only if it opts in (`using communicator_concept =
// weft::comm::point_to_point_tag;` or a stronger tag). A class with rank, size, isend and irecv
// but no tag is not one, and ring_forward must say so by weft's PointToPoint concept. The twin
// passes the same members with the tag.
// WEFT_COMPILE_FAIL selects the one line that differs from the twin, which compiles.
#include <weft/attention/ring.hpp>

namespace wc = weft::comm;

struct not_opted_in {
  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }
  wc::work isend(wc::buffer_view, int, wc::op_options = {}) { return {}; }
  wc::work irecv(wc::buffer_view, int, wc::op_options = {}) { return {}; }
};
struct opted_in : not_opted_in {
  using communicator_concept = wc::point_to_point_tag;
};

void snippet(float* p) {
#if defined(WEFT_COMPILE_FAIL)
  not_opted_in comm;
#else
  opted_in comm;
#endif
  weft::tensor_view<float, 4> q(p, 1, 4, 2, 8);
  weft::tensor_view<float, 3> lse(p, 1, 2, 4);
  auto const layout = weft::attention::seq_layout::contiguous(1, 4);
  weft::attention::ring_forward(comm, layout, q, q, q, q, lse);
}
