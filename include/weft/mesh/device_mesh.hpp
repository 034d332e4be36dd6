// weft/mesh/device_mesh.hpp — `device_mesh<C>`: an N-D mesh of ranks with named axes over any
// communicator that can split (comm::SplittableGroup, in any memory space: NCCL included), owning
// one sub-communicator per axis and one per declared flattened group, all created up front by
// `split(color, key)` when the mesh is built (never lazily).
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/mesh/layout.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft {

//! An N-D mesh over a world communicator: row-major, last axis fastest (so put `tp` last and
//! its peers are adjacent ranks). Built collectively: every rank of `world` constructs it with the
//! same layout and flatten list, in the same program order relative to its other collectives on
//! `world`. Construction
//!   1. validates everything locally (nothing is communicated if an argument is bad),
//!   2. compares a fingerprint of the layout across ranks, so ranks that disagree all throw
//!      mismatch_error instead of building groups that hang later (one host all_gather where `C`
//!      is a comm::CollectiveIn<C, host_space>; otherwise one split with the fingerprint as the
//!      color, which needs no buffers and so works in any memory space: see check_agreement),
//!   3. splits `world` once per axis (color = ravel of the other coordinates, key = this rank's
//!      coordinate on the axis), then once per flattened group in the order declared (color =
//!      ravel of the coordinates outside the group, key = ravel of those inside, in the order
//!      given).
//! The mesh owns the sub-communicators; `world` is not kept and stays usable on its own. Where
//! the backend can name a communicator (`set_name`), each group is named after its axis ("tp") or
//! its flattened axes ("[dp, cp]"), and errors raised in it say so.
//! `C` needs only rank(), size() and split() (comm::SplittableGroup); the groups have type C, so
//! what the caller does with them (collectives, point-to-point) is C's to provide.
template <comm::SplittableGroup C>
class device_mesh {
 public:
  using communicator_type = C;
  //! Flattened groups to create, each a list of at least two axis names; the group's ranks are
  //! numbered row-major over those axes in the order given ({"dp", "cp"}: cp fastest).
  using flatten_list = std::vector<std::vector<std::string>>;

  device_mesh(C& world, mesh::layout layout, flatten_list flatten = {})
      : layout_(std::move(layout)), flatten_(std::move(flatten)) {
    WEFT_EXPECTS(world.size() == layout_.size(), "world",
                 detail::concat("a communicator of ", layout_.size(), " ranks (mesh ",
                                layout_.describe(), ')'),
                 detail::concat(world.size(), " ranks"));
    std::vector<std::vector<int>> flat_dims;
    flat_dims.reserve(flatten_.size());
    for (std::size_t i = 0; i < flatten_.size(); ++i) {
      WEFT_EXPECTS(flatten_[i].size() >= 2, "flatten",
                   "groups of at least two axis names (one axis already has its group)",
                   detail::concat("group ", i, " = ", mesh::detail::format_names(flatten_[i])));
      for (auto const& n : flatten_[i])
        WEFT_EXPECTS(
            layout_.has_axis(n), "flatten",
            detail::concat("axis names among ", mesh::detail::format_names(layout_.names())),
            detail::concat('`', n, "` in group ", mesh::detail::format_names(flatten_[i])));
      flat_dims.push_back(layout_.axes(flatten_[i]));
      for (std::size_t j = 0; j < i; ++j)
        WEFT_EXPECTS(flatten_[i] != flatten_[j], "flatten", "each flattened group once",
                     detail::concat(mesh::detail::format_names(flatten_[i]), " given twice"));
    }
    global_rank_ = world.rank();
    coord_ = layout_.coordinate(global_rank_);

    check_agreement(world);

    groups_.reserve(static_cast<std::size_t>(layout_.ndim()) + flatten_.size());
    for (int d = 0; d < layout_.ndim(); ++d) {
      int const dims[1] = {d};
      add_group(world, dims, layout_.names()[static_cast<std::size_t>(d)]);
    }
    for (std::size_t i = 0; i < flatten_.size(); ++i)
      add_group(world, flat_dims[i], mesh::detail::format_names(flatten_[i]));
  }

  //! Shape and names axis by axis, slowest first: device_mesh(world, {2, 4}, {"dp", "tp"}).
  device_mesh(C& world, std::vector<int> shape, std::vector<std::string> names,
              flatten_list flatten = {})
      : device_mesh(world, mesh::layout(std::move(shape), std::move(names)), std::move(flatten)) {}

  //! From Megatron's order string (fastest first) and axis sizes:
  //! from_megatron(world, "tp-cp-dp-pp", {{"tp", 2}, {"cp", 1}, {"dp", 2}, {"pp", 2}}) is the
  //! row-major mesh (pp, dp, cp, tp). Megatron's flattened group "dp-cp" is {"dp", "cp"} here:
  //! list the axes slowest first to number members as Megatron does.
  [[nodiscard]] static device_mesh from_megatron(C& world, std::string_view order,
                                                 mesh::axis_sizes const& sizes,
                                                 flatten_list flatten = {}) {
    return device_mesh(world, mesh::layout::from_megatron(order, sizes), std::move(flatten));
  }

  device_mesh(device_mesh&&) = default;
  device_mesh& operator=(device_mesh&&) = default;
  device_mesh(device_mesh const&) = delete;
  device_mesh& operator=(device_mesh const&) = delete;
  ~device_mesh() = default;

  [[nodiscard]] mesh::layout const& layout() const noexcept { return layout_; }
  [[nodiscard]] int ndim() const noexcept { return layout_.ndim(); }
  //! Number of ranks (the world size).
  [[nodiscard]] int size() const noexcept { return layout_.size(); }
  [[nodiscard]] int size(std::string_view axis) const { return layout_.size(axis); }
  [[nodiscard]] std::span<int const> shape() const noexcept { return layout_.shape(); }
  [[nodiscard]] std::span<std::string const> names() const noexcept { return layout_.names(); }
  [[nodiscard]] flatten_list const& flattened() const noexcept { return flatten_; }

  //! This rank's rank in the world the mesh was built over.
  [[nodiscard]] int global_rank() const noexcept { return global_rank_; }
  //! This rank's coordinate, axis by axis.
  [[nodiscard]] std::span<int const> coordinate() const noexcept { return coord_; }
  //! This rank's coordinate on `axis`, which is also its rank in group(axis).
  [[nodiscard]] int local_rank(std::string_view axis) const {
    return coord_[static_cast<std::size_t>(layout_.axis(axis))];
  }

  //! The communicator of this rank's group along `axis`.
  [[nodiscard]] C& group(std::string_view axis) {
    return groups_[static_cast<std::size_t>(layout_.axis(axis))];
  }
  [[nodiscard]] C const& group(std::string_view axis) const {
    return groups_[static_cast<std::size_t>(layout_.axis(axis))];
  }
  //! The communicator of a flattened group; it must have been declared at construction with the
  //! same axes in the same order.
  [[nodiscard]] C& group(std::initializer_list<std::string_view> axes) {
    return groups_[group_index(axes)];
  }
  [[nodiscard]] C const& group(std::initializer_list<std::string_view> axes) const {
    return groups_[group_index(axes)];
  }
  template <mesh::AxisNames Strings>
  [[nodiscard]] C& group(Strings const& axes) {
    return groups_[group_index(axes)];
  }
  template <mesh::AxisNames Strings>
  [[nodiscard]] C const& group(Strings const& axes) const {
    return groups_[group_index(axes)];
  }

  //! Every group along `axes` as global ranks (pure; see mesh::layout::groups_along).
  [[nodiscard]] std::vector<std::vector<int>> groups_along(std::string_view axis) const {
    return layout_.groups_along(axis);
  }
  [[nodiscard]] std::vector<std::vector<int>> groups_along(
      std::initializer_list<std::string_view> axes) const {
    return layout_.groups_along(axes);
  }
  template <mesh::AxisNames Strings>
  [[nodiscard]] std::vector<std::vector<int>> groups_along(Strings const& axes) const {
    return layout_.groups_along(axes);
  }

  //! The pure row-major functions, also reachable as mesh::ravel / mesh::unravel.
  [[nodiscard]] static int ravel(std::span<int const> coord, std::span<int const> shape) {
    return mesh::ravel(coord, shape);
  }
  [[nodiscard]] static std::vector<int> unravel(int index, std::span<int const> shape) {
    return mesh::unravel(index, shape);
  }

 private:
  // Ranks that pass different shapes, names, rank maps or flatten lists would build groups that
  // disagree and hang at the first collective; comparing a hash of them first turns that into an
  // error on every rank. Over a host collective, one all_gather of the hashes tells every rank
  // exactly which ranks differ. Otherwise (a stream communicator over device memory, or one that
  // only splits) the ranks split `world` with the hash as the color: the ranks that agree form
  // one group, so a group smaller than the world means some rank disagrees, and since then every
  // group is smaller than the world, every rank learns it. The color keeps 31 bits of the hash:
  // a disagreement escapes with probability 2^-31 (and would then fail at the first collective).
  void check_agreement(C& world) {
    mesh::detail::fnv1a h;
    h.mix(layout_.fingerprint());
    h.mix(flatten_.size());
    for (auto const& g : flatten_) {
      h.mix(g.size());
      for (auto const& n : g) h.mix(n);
    }
    if constexpr (comm::CollectiveIn<C, host_space>) {
      i64 const mine = std::bit_cast<i64>(h.value);
      std::vector<i64> hashes(static_cast<std::size_t>(world.size()));
      comm::all_gather(world, std::span<i64 const>(&mine, 1), hashes).wait();
      std::string differ;
      int count = 0;
      for (std::size_t r = 0; r < hashes.size(); ++r)
        if (hashes[r] != hashes[0]) differ += (count++ == 0 ? "" : ", ") + std::to_string(r);
      if (count != 0)
        WEFT_THROW(
            mismatch_error, "device_mesh: ", count == 1 ? "rank " : "ranks ", differ,
            " built the mesh with a different layout or flatten list than rank 0 (this rank ",
            global_rank_, " has ", layout_.describe(), " flatten ", describe_flatten(), ")");
    } else {
      int const color = static_cast<int>((h.value ^ (h.value >> 32)) & 0x7fffffffU);
      C const same = world.split(color, global_rank_);
      if (same.size() != world.size())
        WEFT_THROW(mismatch_error,
                   "device_mesh: ranks built the mesh with different layouts or "
                   "flatten lists: ",
                   same.size(), " of ", world.size(), " ranks agree with this rank ", global_rank_,
                   ", which has ", layout_.describe(), " flatten ", describe_flatten());
    }
  }

  void add_group(C& world, std::span<int const> dims, std::string const& what) {
    mesh::split_key const sk = mesh::split_along(coord_, layout_.shape(), dims);
    int expected_size = 1;
    for (int d : dims) expected_size *= layout_.shape()[static_cast<std::size_t>(d)];
    C sub = world.split(sk.color, sk.key);
    // The agreement check makes this a backend invariant: split must order by key.
    if (sub.size() != expected_size || sub.rank() != sk.key)
      throw error(errc::internal,
                  detail::concat("device_mesh: split(color ", sk.color, ", key ", sk.key,
                                 ") for group ", what, " gave rank ", sub.rank(), " of ",
                                 sub.size(), ", expected rank ", sk.key, " of ", expected_size));
    // Errors raised in the group then name it after its axis (or flattened axes).
    if constexpr (requires { sub.set_name(what); }) sub.set_name(what);
    groups_.push_back(std::move(sub));
  }

  template <class Strings>
  std::size_t group_index(Strings const& axes) const {
    std::vector<int> const dims = layout_.axes(axes);
    if (dims.size() == 1) return static_cast<std::size_t>(dims[0]);
    std::size_t found = groups_.size();
    for (std::size_t i = 0; i < flatten_.size() && found == groups_.size(); ++i) {
      if (flatten_[i].size() != dims.size()) continue;
      bool same = true;
      std::size_t j = 0;
      for (auto const& n : axes) same = same && flatten_[i][j++] == std::string_view(n);
      if (same) found = static_cast<std::size_t>(layout_.ndim()) + i;
    }
    WEFT_EXPECTS(found < groups_.size(), "axes",
                 detail::concat("one axis, or a flattened group declared at construction (in the "
                                "same order): ",
                                describe_flatten()),
                 mesh::detail::format_names(axes));
    return found;
  }

  std::string describe_flatten() const {
    std::string out = "[";
    for (std::size_t i = 0; i < flatten_.size(); ++i) {
      if (i != 0) out += ", ";
      out += mesh::detail::format_names(flatten_[i]);
    }
    return out + ']';
  }

  mesh::layout layout_;
  flatten_list flatten_;
  int global_rank_ = 0;
  std::vector<int> coord_;
  std::vector<C> groups_;  // one per axis, then one per flattened group, in declaration order
};

}  // namespace weft
