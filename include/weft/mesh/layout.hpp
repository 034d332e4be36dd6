// weft/mesh/layout.hpp — the pure arithmetic of N-D device meshes: row-major ravel/unravel, the
// (color, key) pair that `split` takes for one axis or a flattened set of axes, the groups that
// result, Megatron's order strings, and `layout` (named axes plus an optional rank map).
// Nothing here communicates: these functions are device_mesh's implementation and its test oracle.
#pragma once

#include <weft/core/config.hpp>
#include <weft/core/error.hpp>

#include <climits>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::mesh {

//! Axis sizes by name, as Megatron's initialize_model_parallel takes them: {{"tp", 2}, {"dp", 4}}.
//! A vector, not a map, so that a name given twice is reported instead of silently dropped.
using axis_sizes = std::vector<std::pair<std::string, int>>;

//! A range of axis names (a vector of strings, a span of string_views, ...) but not one name.
template <class R>
concept AxisNames = !std::convertible_to<R const&, std::string_view> && requires(R const& r) {
  { *r.begin() } -> std::convertible_to<std::string_view>;
  r.end();
};

//! What `split` takes to form a group: ranks with equal `color` form one sub-communicator, ordered
//! by `key` (which is then their rank inside it).
struct split_key {
  int color = 0;
  int key = 0;
  friend constexpr bool operator==(split_key const&, split_key const&) = default;
};

namespace detail {

using ::weft::detail::concat;

inline std::string format_ints(std::span<int const> v) {
  std::string out = "(";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i != 0) out += ", ";
    out += std::to_string(v[i]);
  }
  // A 1-tuple keeps its comma so "(8,)" reads as a shape, not as a parenthesised number.
  if (v.size() == 1) out += ',';
  out += ')';
  return out;
}

template <AxisNames Strings>
std::string format_names(Strings const& names) {
  std::string out = "(";
  bool first = true;
  for (auto const& n : names) {
    if (!first) out += ", ";
    first = false;
    out += std::string_view(n);
  }
  out += ')';
  return out;
}

// Checks every extent is >= 1 and the product fits an int (ranks are ints in every backend).
inline int checked_volume(std::span<int const> shape, std::string_view arg) {
  long long v = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    WEFT_EXPECTS(shape[i] >= 1, arg, "every extent >= 1", format_ints(shape));
    v *= shape[i];
    WEFT_EXPECTS(v <= INT_MAX, arg, "a product of extents <= INT_MAX", format_ints(shape));
  }
  return static_cast<int>(v);
}

// 64-bit FNV-1a, byte by byte: a cheap, portable digest that ranks compare to detect disagreement.
struct fnv1a {
  std::uint64_t value = 14695981039346656037ull;
  void mix(std::uint64_t v) noexcept {
    for (int b = 0; b < 8; ++b) {
      value ^= (v >> (8 * b)) & 0xffu;
      value *= 1099511628211ull;
    }
  }
  void mix(std::string_view s) noexcept {
    mix(s.size());
    for (char c : s) mix(static_cast<unsigned char>(c));
  }
};

// Unchecked kernels: callers have validated shapes, coordinates and dims.
inline int ravel_unchecked(std::span<int const> coord, std::span<int const> shape) noexcept {
  int r = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) r = r * shape[i] + coord[i];
  return r;
}

inline void unravel_unchecked(int index, std::span<int const> shape,
                              std::span<int> coord) noexcept {
  for (std::size_t i = shape.size(); i-- > 0;) {
    coord[i] = index % shape[i];
    index /= shape[i];
  }
}

// The axes of `shape` that are not in `dims`, in mesh order: they make the color.
inline std::vector<int> complement(std::size_t ndim, std::span<int const> dims) {
  std::vector<int> rest;
  for (std::size_t d = 0; d < ndim; ++d) {
    bool in = false;
    for (int x : dims) in = in || x == static_cast<int>(d);
    if (!in) rest.push_back(static_cast<int>(d));
  }
  return rest;
}

inline std::vector<int> pick(std::span<int const> v, std::span<int const> idx) {
  std::vector<int> out;
  out.reserve(idx.size());
  for (int i : idx) out.push_back(v[static_cast<std::size_t>(i)]);
  return out;
}

inline void check_dims(std::span<int const> dims, std::size_t ndim) {
  for (std::size_t i = 0; i < dims.size(); ++i) {
    WEFT_EXPECTS(dims[i] >= 0 && static_cast<std::size_t>(dims[i]) < ndim, "dims",
                 concat("axis indices in [0, ", ndim, ")"), format_ints(dims));
    for (std::size_t j = 0; j < i; ++j)
      WEFT_EXPECTS(dims[i] != dims[j], "dims", "distinct axis indices", format_ints(dims));
  }
}

inline void check_coord(std::span<int const> coord, std::span<int const> shape) {
  WEFT_EXPECTS(coord.size() == shape.size(), "coord",
               concat(shape.size(), " coordinates for shape ", format_ints(shape)),
               concat(coord.size(), " coordinates ", format_ints(coord)));
  for (std::size_t i = 0; i < shape.size(); ++i)
    WEFT_EXPECTS(coord[i] >= 0 && coord[i] < shape[i], "coord",
                 concat("0 <= coord[i] < shape[i] for shape ", format_ints(shape)),
                 format_ints(coord));
}

}  // namespace detail

//! Number of ranks of a mesh of this shape (1 for zero axes). Throws if an extent is < 1 or the
//! product exceeds INT_MAX.
[[nodiscard]] inline int volume(std::span<int const> shape) {
  return detail::checked_volume(shape, "shape");
}

//! Row-major strides: the last axis is fastest (stride 1), stride[i] = stride[i+1] * shape[i+1].
[[nodiscard]] inline std::vector<int> strides(std::span<int const> shape) {
  (void)volume(shape);
  std::vector<int> s(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

//! Linear index of a coordinate, row-major: sum of coord[i] * strides(shape)[i].
[[nodiscard]] inline int ravel(std::span<int const> coord, std::span<int const> shape) {
  (void)volume(shape);
  detail::check_coord(coord, shape);
  return detail::ravel_unchecked(coord, shape);
}

//! Inverse of ravel: coord[i] = (index / stride[i]) % shape[i].
[[nodiscard]] inline std::vector<int> unravel(int index, std::span<int const> shape) {
  int const n = volume(shape);
  WEFT_EXPECTS(
      index >= 0 && index < n, "index",
      detail::concat("0 <= index < ", n, " (the volume of ", detail::format_ints(shape), ")"),
      index);
  std::vector<int> coord(shape.size());
  detail::unravel_unchecked(index, shape, coord);
  return coord;
}

//! The split arguments that put `coord` into its group along the axes `dims` (indices into
//! `shape`, in the order given): color = ravel of the other coordinates (in mesh order) over their
//! extents, key = ravel of the coordinates of `dims` in the order given. For one axis d this is
//! color = ravel(coord without d), key = coord[d].
[[nodiscard]] inline split_key split_along(std::span<int const> coord, std::span<int const> shape,
                                           std::span<int const> dims) {
  (void)volume(shape);
  detail::check_coord(coord, shape);
  detail::check_dims(dims, shape.size());
  std::vector<int> const rest = detail::complement(shape.size(), dims);
  return {detail::ravel_unchecked(detail::pick(coord, rest), detail::pick(shape, rest)),
          detail::ravel_unchecked(detail::pick(coord, dims), detail::pick(shape, dims))};
}

//! Every group along `dims`, as linear mesh indices: groups in ascending color, members in
//! ascending key (so member i has rank i inside the group). For one axis d this is PyTorch's
//! `mesh.swapdims(-1, d).reshape(-1, shape[d])`; for several it is `_flatten`'s
//! `mesh.permute(rest..., dims...).reshape(-1, prod)`.
[[nodiscard]] inline std::vector<std::vector<int>> groups_along(std::span<int const> shape,
                                                                std::span<int const> dims) {
  (void)volume(shape);
  detail::check_dims(dims, shape.size());
  std::vector<int> const rest = detail::complement(shape.size(), dims);
  std::vector<int> const rest_shape = detail::pick(shape, rest);
  std::vector<int> const dims_shape = detail::pick(shape, dims);
  int const groups = volume(rest_shape);
  int const members = volume(dims_shape);
  std::vector<int> full(shape.size()), rc(rest.size()), dc(dims.size());
  std::vector<std::vector<int>> out(static_cast<std::size_t>(groups));
  for (int color = 0; color < groups; ++color) {
    detail::unravel_unchecked(color, rest_shape, rc);
    for (std::size_t i = 0; i < rest.size(); ++i) full[static_cast<std::size_t>(rest[i])] = rc[i];
    auto& g = out[static_cast<std::size_t>(color)];
    g.reserve(static_cast<std::size_t>(members));
    for (int key = 0; key < members; ++key) {
      detail::unravel_unchecked(key, dims_shape, dc);
      for (std::size_t j = 0; j < dims.size(); ++j) full[static_cast<std::size_t>(dims[j])] = dc[j];
      g.push_back(detail::ravel_unchecked(full, shape));
    }
  }
  return out;
}

//! Splits a Megatron order string ("tp-cp-ep-dp-pp") into its axis names, fastest first.
//! Throws if it is empty, has an empty token ("tp--dp", "-tp") or repeats a name.
[[nodiscard]] inline std::vector<std::string> parse_megatron_order(std::string_view order) {
  WEFT_EXPECTS(!order.empty(), "order",
               "axis names joined by '-', fastest first (e.g. \"tp-dp-pp\")", "\"\"");
  std::vector<std::string> tokens;
  std::size_t start = 0;
  while (true) {
    std::size_t const end = order.find('-', start);
    std::string_view const tok =
        order.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    WEFT_EXPECTS(!tok.empty(), "order", "non-empty axis names joined by '-' (e.g. \"tp-dp-pp\")",
                 detail::concat('"', order, '"'));
    for (auto const& t : tokens)
      WEFT_EXPECTS(t != tok, "order", "each axis name once",
                   detail::concat('"', order, "\" (`", tok, "` repeated)"));
    tokens.emplace_back(tok);
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return tokens;
}

//! A mesh's shape with named axes (row-major, last axis fastest) and a rank map: the global rank
//! at linear mesh index i is rank_map()[i] (the identity unless given, JAX-style). Immutable.
class layout {
 public:
  //! `shape` and `names` axis by axis, slowest first (put `tp` last so TP peers are adjacent
  //! ranks). `rank_map`, if not empty, must be a permutation of [0, volume).
  layout(std::vector<int> shape, std::vector<std::string> names, std::vector<int> rank_map = {})
      : shape_(std::move(shape)), names_(std::move(names)), rank_map_(std::move(rank_map)) {
    WEFT_EXPECTS(!shape_.empty(), "shape", "at least one axis", "()");
    int const n = detail::checked_volume(shape_, "shape");
    WEFT_EXPECTS(names_.size() == shape_.size(), "names",
                 detail::concat(shape_.size(), " names, one per axis of shape ",
                                detail::format_ints(shape_)),
                 detail::concat(names_.size(), " names ", detail::format_names(names_)));
    for (std::size_t i = 0; i < names_.size(); ++i) {
      WEFT_EXPECTS(!names_[i].empty(), "names", "non-empty axis names",
                   detail::format_names(names_));
      for (std::size_t j = 0; j < i; ++j)
        WEFT_EXPECTS(names_[i] != names_[j], "names", "distinct axis names",
                     detail::concat(detail::format_names(names_), " (`", names_[i], "` repeated)"));
    }
    if (rank_map_.empty()) {
      rank_map_.resize(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) rank_map_[static_cast<std::size_t>(i)] = i;
    }
    WEFT_EXPECTS(rank_map_.size() == static_cast<std::size_t>(n), "rank_map",
                 detail::concat(n, " entries (the mesh volume) or none"),
                 detail::concat(rank_map_.size(), " entries"));
    index_of_rank_.assign(static_cast<std::size_t>(n), -1);
    for (int i = 0; i < n; ++i) {
      int const r = rank_map_[static_cast<std::size_t>(i)];
      WEFT_EXPECTS(r >= 0 && r < n, "rank_map", detail::concat("a permutation of [0, ", n, ")"),
                   detail::concat("entry ", i, " = ", r));
      WEFT_EXPECTS(index_of_rank_[static_cast<std::size_t>(r)] < 0, "rank_map",
                   detail::concat("a permutation of [0, ", n, ")"),
                   detail::concat("rank ", r, " at entries ",
                                  index_of_rank_[static_cast<std::size_t>(r)], " and ", i));
      index_of_rank_[static_cast<std::size_t>(r)] = i;
    }
  }

  //! From a Megatron order string (fastest first) and axis sizes: "tp-cp-dp-pp" is the row-major
  //! mesh (pp, dp, cp, tp). As in Megatron's RankGenerator, a named size missing from the order
  //! must be 1 and is appended to the order (so it becomes a size-1 axis, asked for like any
  //! other); every name in the order must have a size.
  [[nodiscard]] static layout from_megatron(std::string_view order, axis_sizes const& sizes) {
    std::vector<std::string> fastest_first = parse_megatron_order(order);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      WEFT_EXPECTS(!sizes[i].first.empty(), "sizes", "non-empty axis names", "an empty name");
      WEFT_EXPECTS(sizes[i].second >= 1, "sizes",
                   detail::concat("a size >= 1 for axis `", sizes[i].first, '`'), sizes[i].second);
      for (std::size_t j = 0; j < i; ++j)
        WEFT_EXPECTS(sizes[i].first != sizes[j].first, "sizes", "each axis name once",
                     detail::concat('`', sizes[i].first, "` given twice"));
    }
    auto size_of = [&](std::string const& name) {
      for (auto const& [n, s] : sizes)
        if (n == name) return s;
      return 0;
    };
    for (auto const& name : fastest_first)
      WEFT_EXPECTS(size_of(name) != 0, "sizes",
                   detail::concat("a size for every axis of order \"", order, '"'),
                   detail::concat("none for `", name, "` in ", format_sizes(sizes)));
    for (auto const& [name, s] : sizes) {
      bool in_order = false;
      for (auto const& t : fastest_first) in_order = in_order || t == name;
      if (in_order) continue;
      WEFT_EXPECTS(s == 1, "order",
                   detail::concat("every axis of size > 1 named (`", name, "` has size ", s, ')'),
                   detail::concat('"', order, '"'));
      fastest_first.push_back(name);
    }
    std::vector<int> shape;
    std::vector<std::string> names;
    for (std::size_t i = fastest_first.size(); i-- > 0;) {
      shape.push_back(size_of(fastest_first[i]));
      names.push_back(fastest_first[i]);
    }
    return layout(std::move(shape), std::move(names));
  }

  [[nodiscard]] int ndim() const noexcept { return static_cast<int>(shape_.size()); }
  //! Number of ranks.
  [[nodiscard]] int size() const noexcept { return static_cast<int>(rank_map_.size()); }
  [[nodiscard]] int size(std::string_view axis_name) const {
    return shape_[static_cast<std::size_t>(axis(axis_name))];
  }
  [[nodiscard]] std::span<int const> shape() const noexcept { return shape_; }
  [[nodiscard]] std::span<std::string const> names() const noexcept { return names_; }
  [[nodiscard]] std::span<int const> rank_map() const noexcept { return rank_map_; }

  //! Index of the axis called `name`; throws invalid_argument_error listing the known names.
  [[nodiscard]] int axis(std::string_view name) const {
    int found = -1;
    for (std::size_t i = 0; i < names_.size() && found < 0; ++i)
      if (names_[i] == name) found = static_cast<int>(i);
    WEFT_EXPECTS(found >= 0, "axis", detail::concat("one of ", detail::format_names(names_)),
                 detail::concat('`', name, '`'));
    return found;
  }
  [[nodiscard]] bool has_axis(std::string_view name) const noexcept {
    for (auto const& n : names_)
      if (n == name) return true;
    return false;
  }

  //! Axis indices of `axis_names`, in the order given; throws on unknown or repeated names.
  template <AxisNames Strings>
  [[nodiscard]] std::vector<int> axes(Strings const& axis_names) const {
    std::vector<int> dims;
    for (auto const& n : axis_names) {
      int const d = axis(n);
      for (int x : dims)
        WEFT_EXPECTS(x != d, "axes", "each axis name once",
                     detail::concat(detail::format_names(axis_names), " (`", std::string_view(n),
                                    "` repeated)"));
      dims.push_back(d);
    }
    return dims;
  }
  [[nodiscard]] std::vector<int> axes(std::initializer_list<std::string_view> axis_names) const {
    return axes<std::initializer_list<std::string_view>>(axis_names);
  }

  //! Global rank at a coordinate: rank_map()[ravel(coord, shape())].
  [[nodiscard]] int global_rank(std::span<int const> coord) const {
    return rank_map_[static_cast<std::size_t>(ravel(coord, shape_))];
  }
  //! Coordinate of a global rank.
  [[nodiscard]] std::vector<int> coordinate(int global_rank) const {
    WEFT_EXPECTS(global_rank >= 0 && global_rank < size(), "global_rank",
                 detail::concat("0 <= global_rank < ", size()), global_rank);
    return unravel(index_of_rank_[static_cast<std::size_t>(global_rank)], shape_);
  }

  //! The split arguments of `global_rank` for its group along `axis_names` (in the order given).
  template <AxisNames Strings>
  [[nodiscard]] split_key split_along(int global_rank, Strings const& axis_names) const {
    std::vector<int> const dims = axes(axis_names);
    return mesh::split_along(coordinate(global_rank), shape_, dims);
  }
  [[nodiscard]] split_key split_along(int global_rank,
                                      std::initializer_list<std::string_view> axis_names) const {
    return split_along<std::initializer_list<std::string_view>>(global_rank, axis_names);
  }
  [[nodiscard]] split_key split_along(int global_rank, std::string_view axis_name) const {
    return split_along(global_rank, {axis_name});
  }

  //! Every group along `axis_names` (in the order given), as global ranks: groups in ascending
  //! color, members in ascending key. A flattened group of several axes numbers its members
  //! row-major over those axes in the order given.
  template <AxisNames Strings>
  [[nodiscard]] std::vector<std::vector<int>> groups_along(Strings const& axis_names) const {
    std::vector<int> const dims = axes(axis_names);
    auto groups = mesh::groups_along(shape_, dims);
    for (auto& g : groups)
      for (auto& r : g) r = rank_map_[static_cast<std::size_t>(r)];
    return groups;
  }
  [[nodiscard]] std::vector<std::vector<int>> groups_along(
      std::initializer_list<std::string_view> axis_names) const {
    return groups_along<std::initializer_list<std::string_view>>(axis_names);
  }
  [[nodiscard]] std::vector<std::vector<int>> groups_along(std::string_view axis_name) const {
    return groups_along({axis_name});
  }

  //! "(pp=2, dp=2, tp=2)", for messages.
  [[nodiscard]] std::string describe() const {
    std::string out = "(";
    for (std::size_t i = 0; i < shape_.size(); ++i) {
      if (i != 0) out += ", ";
      out += names_[i] + '=' + std::to_string(shape_[i]);
    }
    return out + ')';
  }

  //! A 64-bit FNV-1a hash of shape, names and rank map: equal on every rank that built the same
  //! layout, so ranks can cheaply check they agree before splitting.
  [[nodiscard]] std::uint64_t fingerprint() const noexcept {
    detail::fnv1a h;
    h.mix(shape_.size());
    for (int s : shape_) h.mix(static_cast<std::uint64_t>(s));
    for (auto const& n : names_) h.mix(n);
    for (int r : rank_map_) h.mix(static_cast<std::uint64_t>(r));
    return h.value;
  }

  friend bool operator==(layout const& a, layout const& b) {
    return a.shape_ == b.shape_ && a.names_ == b.names_ && a.rank_map_ == b.rank_map_;
  }

 private:
  static std::string format_sizes(axis_sizes const& sizes) {
    std::string out = "{";
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (i != 0) out += ", ";
      out += sizes[i].first + '=' + std::to_string(sizes[i].second);
    }
    return out + '}';
  }

  std::vector<int> shape_;
  std::vector<std::string> names_;
  std::vector<int> rank_map_;
  std::vector<int> index_of_rank_;  // inverse of rank_map_
};

}  // namespace weft::mesh
