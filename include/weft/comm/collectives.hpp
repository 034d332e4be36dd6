// weft/comm/collectives.hpp — the typed front door of every communicator: free functions over
// weft tensors (views or owning tensors) and contiguous ranges, in the communicator's memory space
// (checked at compile time), each asking for the weakest concept it uses (isend/irecv/send/recv:
// PointToPoint; the collectives: Collective); buffer_of() makes the type-erased buffer_view.
#pragma once

#include <weft/comm/concepts.hpp>
#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/tensor.hpp>

#include <cstddef>
#include <iterator>
#include <ranges>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

namespace weft::comm {

namespace detail {

template <class X>
struct is_owning_tensor : std::false_type {};
template <class T, std::size_t Rank, class Space>
struct is_owning_tensor<tensor<T, Rank, Space>> : std::true_type {};

template <class X>
constexpr bool is_range_buffer() {
  using R = std::remove_reference_t<X>;
  if constexpr (std::ranges::contiguous_range<R> && std::ranges::sized_range<R>) {
    return Element<std::remove_cv_t<std::ranges::range_value_t<R>>>;
  } else {
    return false;
  }
}

template <class X>
struct buffer_traits_impl;

template <class X>
requires Tensor<std::remove_const_t<X>>
struct buffer_traits_impl<X> {
  // A const view of mutable elements is still writable (the view, not the data, is const).
  using element_type = typename std::remove_const_t<X>::element_type;
  using space = memory_space_t<X>;
};

template <class X>
requires is_owning_tensor<std::remove_const_t<X>>::value struct buffer_traits_impl<X> {
  using element_type =
      std::conditional_t<std::is_const_v<X>, typename std::remove_const_t<X>::value_type const,
                         typename std::remove_const_t<X>::value_type>;
  using space = typename std::remove_const_t<X>::memory_space;
};

template <class X>
requires(!Tensor<std::remove_const_t<X>> && !is_owning_tensor<std::remove_const_t<X>>::value &&
         is_range_buffer<X>()) struct buffer_traits_impl<X> {
  using element_type = std::remove_reference_t<std::ranges::range_reference_t<X>>;
  using space = host_space;
};

//! The wire kind of a buffer in `Space`: memory host code may touch (host_space, or a user's
//! pinned or managed space) travels as memory_kind::host; cuda_space as memory_kind::cuda.
template <class Space>
constexpr memory_kind kind_of() {
  static_assert(Space::host_accessible || std::is_same_v<Space, cuda_space>,
                "weft: communicators take buffers host code can access (host_space or a "
                "host-accessible user space) or cuda_space buffers");
  return Space::host_accessible ? memory_kind::host : memory_kind::cuda;
}

}  // namespace detail

//! Buffer: what the typed functions accept — a weft Tensor view, an owning weft::tensor
//! (lvalue), or a contiguous sized range (std::vector, std::array, std::span; host memory) of
//! Element values. A view must be contiguous at run time (checked: shape_error otherwise).
template <class X>
concept Buffer = requires {
  typename detail::buffer_traits_impl<std::remove_reference_t<X>>::space;
}
&&Element<std::remove_cv_t<
    typename detail::buffer_traits_impl<std::remove_reference_t<X>>::element_type>>;

template <Buffer X>
using buffer_element_t =
    std::remove_cv_t<typename detail::buffer_traits_impl<std::remove_reference_t<X>>::element_type>;
template <Buffer X>
using buffer_space_t = typename detail::buffer_traits_impl<std::remove_reference_t<X>>::space;

//! A Buffer in `Space` (the communicator's).
template <class X, class Space>
concept BufferIn = Buffer<X> && std::same_as<buffer_space_t<X>, Space>;

//! A Buffer whose elements may be written (not a view of const, not a const range).
template <class X>
concept MutableBuffer = Buffer<X> &&
    !std::is_const_v<typename detail::buffer_traits_impl<std::remove_reference_t<X>>::element_type>;

//! The type-erased view of one Buffer argument. `name` is the argument's name in messages.
//! Throws shape_error for a view that is not row-major contiguous (communication reads buffers
//! as flat arrays; pack a strided view into a contiguous tensor first with weft::copy).
template <Buffer X>
[[nodiscard]] buffer_view buffer_of(X&& x, std::string_view name = "buffer") {
  using R = std::remove_reference_t<X>;
  using E = buffer_element_t<X>;
  constexpr memory_kind where = detail::kind_of<buffer_space_t<X>>();
  if constexpr (Tensor<std::remove_const_t<R>>) {
    WEFT_EXPECTS_SHAPE(
        is_contiguous(x), name, "a row-major contiguous view",
        weft::detail::concat("extents ", shape_string(x), " with strides ",
                             weft::detail::array_string(weft::detail::strides_of(x))));
    return {const_cast<E*>(x.data_handle()), static_cast<std::size_t>(x.size()), dtype_of<E>, where,
            -1};
  } else if constexpr (detail::is_owning_tensor<std::remove_const_t<R>>::value) {
    return {const_cast<E*>(x.data()), x.size(), dtype_of<E>, where, -1};
  } else {
    (void)name;
    return {const_cast<E*>(std::ranges::data(x)), static_cast<std::size_t>(std::ranges::size(x)),
            dtype_of<E>, where, -1};
  }
}

//! The elements [offset, offset + count) of a buffer (for the in-place forms below).
[[nodiscard]] inline buffer_view sub_buffer(buffer_view b, std::size_t offset, std::size_t count) {
  WEFT_EXPECTS_SHAPE(offset <= b.count && count <= b.count - offset, "sub_buffer range",
                     weft::detail::concat("within ", b.count, " elements"),
                     weft::detail::concat("[", offset, ", ", offset + count, ")"));
  b.data = b.count == 0 ? b.data : static_cast<std::byte*>(b.data) + offset * size_of(b.type);
  b.count = count;
  return b;
}

// ---- the typed collectives -----------------------------------------------------------------
// Each returns the backend's work: complete on return for host backends (threads, MPI), enqueued
// on op_options::stream for stream-ordered ones (NCCL). In-place forms pass one buffer.

//! inout = reduction over ranks of inout.
template <Collective C, class X>
requires BufferIn<X, communicator_space_t<C>> && MutableBuffer<X> work
all_reduce(C& c, X&& inout, reduce_op op = {}, op_options o = {}) {
  auto const b = buffer_of(inout, "inout");
  return c.all_reduce(b, b, op, o);
}

//! out = reduction over ranks of in.
template <Collective C, class In, class Out>
requires BufferIn<In, communicator_space_t<C>> && BufferIn<Out, communicator_space_t<C>> &&
    MutableBuffer<Out> && std::same_as<buffer_element_t<In>, buffer_element_t<Out>>
        work all_reduce(C& c, In&& in, Out&& out, reduce_op op = {}, op_options o = {}) {
  return c.all_reduce(buffer_of(in, "in"), buffer_of(out, "out"), op, o);
}

//! On `root`, out = reduction over ranks of in; `out` is ignored elsewhere (may be empty).
template <Collective C, class In, class Out>
requires BufferIn<In, communicator_space_t<C>> && BufferIn<Out, communicator_space_t<C>> &&
    MutableBuffer<Out> && std::same_as<buffer_element_t<In>, buffer_element_t<Out>>
        work reduce(C& c, In&& in, Out&& out, int root, reduce_op op = {}, op_options o = {}) {
  return c.reduce(buffer_of(in, "in"), buffer_of(out, "out"), op, root, o);
}

//! In place: on `root`, inout = reduction over ranks of inout; unchanged elsewhere.
template <Collective C, class X>
requires BufferIn<X, communicator_space_t<C>> && MutableBuffer<X> work reduce(C& c, X&& inout,
                                                                              int root,
                                                                              reduce_op op = {},
                                                                              op_options o = {}) {
  auto const b = buffer_of(inout, "inout");
  return c.reduce(b, b, op, root, o);
}

//! In place: every rank's inout = root's inout.
template <Collective C, class X>
requires BufferIn<X, communicator_space_t<C>> && MutableBuffer<X> work
broadcast(C& c, X&& inout, int root, op_options o = {}) {
  auto const b = buffer_of(inout, "inout");
  return c.broadcast(b, b, root, o);
}

//! out = root's in (`in` is ignored off the root).
template <Collective C, class In, class Out>
requires BufferIn<In, communicator_space_t<C>> && BufferIn<Out, communicator_space_t<C>> &&
    MutableBuffer<Out> && std::same_as<buffer_element_t<In>, buffer_element_t<Out>>
        work broadcast(C& c, In&& in, Out&& out, int root, op_options o = {}) {
  return c.broadcast(buffer_of(in, "in"), buffer_of(out, "out"), root, o);
}

//! out = concatenation over ranks of in (out.size() == size() * in.size()).
template <Collective C, class In, class Out>
requires BufferIn<In, communicator_space_t<C>> && BufferIn<Out, communicator_space_t<C>> &&
    MutableBuffer<Out> && std::same_as<buffer_element_t<In>, buffer_element_t<Out>>
        work all_gather(C& c, In&& in, Out&& out, op_options o = {}) {
  return c.all_gather(buffer_of(in, "in"), buffer_of(out, "out"), o);
}

//! In place: each rank's block already sits at out[rank * out.size() / size(), ...).
template <Collective C, class X>
requires BufferIn<X, communicator_space_t<C>> && MutableBuffer<X> work
all_gather(C& c, X&& out, op_options o = {}) {
  auto const b = buffer_of(out, "out");
  auto const n = static_cast<std::size_t>(c.size());
  WEFT_EXPECTS_SHAPE(n > 0 && b.count % n == 0, "out.size()",
                     weft::detail::concat("a multiple of size() = ", n), b.count);
  auto const block = b.count / n;
  return c.all_gather(sub_buffer(b, static_cast<std::size_t>(c.rank()) * block, block), b, o);
}

//! out = concatenation over ranks r of in_r, where in_r has counts[r] elements.
template <Collective C, class In, class Out>
requires BufferIn<In, communicator_space_t<C>> && BufferIn<Out, communicator_space_t<C>> &&
    MutableBuffer<Out> && std::same_as<buffer_element_t<In>, buffer_element_t<Out>>
        work all_gather_v(C& c, In&& in, Out&& out, std::span<std::size_t const> counts,
                          op_options o = {}) {
  return c.all_gather_v(buffer_of(in, "in"), buffer_of(out, "out"), counts, o);
}

//! out = block rank() of the reduction over ranks of in (in.size() == size() * out.size()).
template <Collective C, class In, class Out>
requires BufferIn<In, communicator_space_t<C>> && BufferIn<Out, communicator_space_t<C>> &&
    MutableBuffer<Out> && std::same_as<buffer_element_t<In>, buffer_element_t<Out>>
        work reduce_scatter(C& c, In&& in, Out&& out, reduce_op op = {}, op_options o = {}) {
  return c.reduce_scatter(buffer_of(in, "in"), buffer_of(out, "out"), op, o);
}

//! In place: the reduced block rank() lands in inout[rank * inout.size() / size(), ...); the
//! rest of inout is unspecified afterwards.
template <Collective C, class X>
requires BufferIn<X, communicator_space_t<C>> && MutableBuffer<X> work
reduce_scatter(C& c, X&& inout, reduce_op op = {}, op_options o = {}) {
  auto const b = buffer_of(inout, "inout");
  auto const n = static_cast<std::size_t>(c.size());
  WEFT_EXPECTS_SHAPE(n > 0 && b.count % n == 0, "inout.size()",
                     weft::detail::concat("a multiple of size() = ", n), b.count);
  auto const block = b.count / n;
  return c.reduce_scatter(b, sub_buffer(b, static_cast<std::size_t>(c.rank()) * block, block), op,
                          o);
}

//! out = block rank() (counts[rank()] elements at offset counts[0] + ... + counts[rank()-1]) of
//! the reduction over ranks of in.
template <Collective C, class In, class Out>
requires BufferIn<In, communicator_space_t<C>> && BufferIn<Out, communicator_space_t<C>> &&
    MutableBuffer<Out> && std::same_as<buffer_element_t<In>, buffer_element_t<Out>>
        work reduce_scatter_v(C& c, In&& in, Out&& out, std::span<std::size_t const> counts,
                              reduce_op op = {}, op_options o = {}) {
  return c.reduce_scatter_v(buffer_of(in, "in"), buffer_of(out, "out"), counts, op, o);
}

//! Block s of out = block rank() of rank s's in (equal blocks of in.size() / size()).
template <Collective C, class In, class Out>
requires BufferIn<In, communicator_space_t<C>> && BufferIn<Out, communicator_space_t<C>> &&
    MutableBuffer<Out> && std::same_as<buffer_element_t<In>, buffer_element_t<Out>>
        work all_to_all(C& c, In&& in, Out&& out, op_options o = {}) {
  return c.all_to_all(buffer_of(in, "in"), buffer_of(out, "out"), o);
}

//! In place form of all_to_all.
template <Collective C, class X>
requires BufferIn<X, communicator_space_t<C>> && MutableBuffer<X> work
all_to_all(C& c, X&& inout, op_options o = {}) {
  auto const b = buffer_of(inout, "inout");
  return c.all_to_all(b, b, o);
}

//! Rank r sends send_counts[s] elements to rank s (consecutive blocks of in) and receives
//! recv_counts[s] from rank s (consecutive blocks of out).
template <Collective C, class In, class Out>
requires BufferIn<In, communicator_space_t<C>> && BufferIn<Out, communicator_space_t<C>> &&
    MutableBuffer<Out> && std::same_as<buffer_element_t<In>, buffer_element_t<Out>>
        work all_to_all_v(C& c, In&& in, Out&& out, std::span<std::size_t const> send_counts,
                          std::span<std::size_t const> recv_counts, op_options o = {}) {
  return c.all_to_all_v(buffer_of(in, "in"), buffer_of(out, "out"), send_counts, recv_counts, o);
}

//! On `root`, block r of out = rank r's in; `out` is ignored elsewhere.
template <Collective C, class In, class Out>
requires BufferIn<In, communicator_space_t<C>> && BufferIn<Out, communicator_space_t<C>> &&
    MutableBuffer<Out> && std::same_as<buffer_element_t<In>, buffer_element_t<Out>>
        work gather(C& c, In&& in, Out&& out, int root, op_options o = {}) {
  return c.gather(buffer_of(in, "in"), buffer_of(out, "out"), root, o);
}

//! out = block rank() of root's in; `in` is ignored off the root.
template <Collective C, class In, class Out>
requires BufferIn<In, communicator_space_t<C>> && BufferIn<Out, communicator_space_t<C>> &&
    MutableBuffer<Out> && std::same_as<buffer_element_t<In>, buffer_element_t<Out>>
        work scatter(C& c, In&& in, Out&& out, int root, op_options o = {}) {
  return c.scatter(buffer_of(in, "in"), buffer_of(out, "out"), root, o);
}

//! Blocking send: the model's send where it has one, isend(...).wait() otherwise.
template <PointToPoint C, class In>
requires BufferIn<In, communicator_space_t<C>> work send(C& c, In&& in, int peer,
                                                         op_options o = {}) {
  auto const b = buffer_of(in, "in");
  if constexpr (requires {
                  { c.send(b, peer, o) } -> std::same_as<work>;
                }) {
    return c.send(b, peer, o);
  } else {
    c.isend(b, peer, o).wait();
    return {};
  }
}

//! Blocking receive: the model's recv where it has one, irecv(...).wait() otherwise.
template <PointToPoint C, class Out>
requires BufferIn<Out, communicator_space_t<C>> && MutableBuffer<Out> work recv(C& c, Out&& out,
                                                                                int peer,
                                                                                op_options o = {}) {
  auto const b = buffer_of(out, "out");
  if constexpr (requires {
                  { c.recv(b, peer, o) } -> std::same_as<work>;
                }) {
    return c.recv(b, peer, o);
  } else {
    c.irecv(b, peer, o).wait();
    return {};
  }
}

//! Non-blocking: keep `in` alive and unchanged until the returned work completes.
template <PointToPoint C, class In>
requires BufferIn<In, communicator_space_t<C>>
[[nodiscard]] work isend(C& c, In&& in, int peer, op_options o = {}) {
  return c.isend(buffer_of(in, "in"), peer, o);
}

//! Non-blocking: keep `out` alive and do not read it until the returned work completes.
template <PointToPoint C, class Out>
requires BufferIn<Out, communicator_space_t<C>> && MutableBuffer<Out>
[[nodiscard]] work irecv(C& c, Out&& out, int peer, op_options o = {}) {
  return c.irecv(buffer_of(out, "out"), peer, o);
}

template <Collective C>
work barrier(C& c, op_options o = {}) {
  return c.barrier(o);
}

//! Waits until the work this rank issued on `c` with `o.stream` has run: synchronize(o) on a
//! StreamCommunicator; nothing on a host model, whose calls complete before returning. Generic
//! code calls it where it hands buffers back to host code, whatever the backend.
template <Group C>
void synchronize(C& c, op_options o = {}) {
  if constexpr (StreamCommunicator<C>) {
    c.synchronize(o);
  } else {
    (void)c;
    (void)o;
  }
}

}  // namespace weft::comm
