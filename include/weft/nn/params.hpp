// weft/nn/params.hpp — a model's parameters and their gradients as two contiguous buffers of one
// layout (llm.c's single allocation; what DP buckets and ZeRO-1 shard), named views in definition
// order, and initialisation keyed by a per-parameter random stream so any shard equals its slice.
#pragma once

#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/random.hpp>
#include <weft/core/tensor/owning.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/optim/param.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::nn {

//! The random stream a parameter initialises from when its param_info gives none: FNV-1a (64-bit)
//! of its name, so the values depend on the name alone, not on the definition order, the model's
//! split over pipeline stages, or tensor-parallel sharding.
[[nodiscard]] constexpr std::uint64_t stream_of(std::string_view name) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

//! One parameter of a layout: [offset, offset + info.count) of the flat buffers.
struct param_entry {
  std::string name;
  std::size_t offset = 0;
  std::vector<index_t> shape;
  optim::param_info info;
};

//! The layout of a flat parameter buffer: parameters in definition order, packed without gaps
//! (so optim's param_info spans describe the buffer directly).
class param_layout {
 public:
  //! Appends a parameter. `info.count` is set from the shape; `info.init_stream` 0 means
  //! stream_of(name). Throws invalid_argument_error for an empty or repeated name and shape_error
  //! for a rank outside 1..4 or a negative extent.
  std::size_t add(std::string name, std::vector<index_t> shape, optim::param_info info = {}) {
    WEFT_EXPECTS(!name.empty(), "name", "a non-empty parameter name", "\"\"");
    WEFT_EXPECTS(index_.find(name) == index_.end(), "name", "a name not yet in the layout",
                 ::weft::detail::concat("\"", name, "\" (repeated)"));
    WEFT_EXPECTS_SHAPE(!shape.empty() && shape.size() <= 4, "shape", "rank 1 to 4",
                       ::weft::detail::concat("rank ", shape.size()));
    std::size_t count = 1;
    for (index_t e : shape) {
      WEFT_EXPECTS_SHAPE(e >= 0, "shape", "extents >= 0", ::weft::detail::array_string(shape));
      count *= static_cast<std::size_t>(e);
    }
    info.count = count;
    if (info.init_stream == 0) info.init_stream = stream_of(name);
    std::size_t const k = entries_.size();
    index_.emplace(name, k);
    entries_.push_back(param_entry{std::move(name), size_, std::move(shape), info});
    size_ += count;
    return k;
  }
  std::size_t add(std::string name, std::initializer_list<index_t> shape,
                  optim::param_info info = {}) {
    return add(std::move(name), std::vector<index_t>(shape), info);
  }

  [[nodiscard]] std::span<param_entry const> entries() const noexcept { return entries_; }
  //! Elements in the flat buffers.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! The entry called `name`; invalid_argument_error naming the known names otherwise.
  [[nodiscard]] param_entry const& at(std::string_view name) const {
    auto const it = index_.find(name);
    if (it == index_.end()) {
      std::string known;
      for (auto const& e : entries_) known += (known.empty() ? "" : ", ") + e.name;
      WEFT_EXPECTS(false, "name", ::weft::detail::concat("one of the parameters (", known, ")"),
                   ::weft::detail::concat("\"", name, "\""));
    }
    return entries_[it->second];
  }
  [[nodiscard]] bool contains(std::string_view name) const { return index_.contains(name); }
  //! The param_info of every parameter in buffer order, as optim's adamw and clipping take them.
  [[nodiscard]] std::vector<optim::param_info> infos() const {
    std::vector<optim::param_info> out;
    out.reserve(entries_.size());
    for (auto const& e : entries_) out.push_back(e.info);
    return out;
  }

 private:
  std::vector<param_entry> entries_;
  std::map<std::string, std::size_t, std::less<>> index_;
  std::size_t size_ = 0;
};

namespace detail {

//! shape_error unless `got` holds `want`'s parameters: the same names, shapes and offsets in the
//! same order (equal totals alone could be another configuration's, or another pipeline
//! stage's); `origin` says where `want` comes from, e.g. "gpt_layout(config)".
inline void expect_layout(param_layout const& got, param_layout const& want,
                          std::string_view origin) {
  WEFT_EXPECTS_SHAPE(
      got.entries().size() == want.entries().size() && got.size() == want.size(), "store",
      ::weft::detail::concat(want.entries().size(), " parameters of ", want.size(), " elements (",
                             origin, ")"),
      ::weft::detail::concat(got.entries().size(), " parameters of ", got.size(), " elements"));
  auto const w = want.entries();
  auto const g = got.entries();
  for (std::size_t k = 0; k < w.size(); ++k)
    WEFT_EXPECTS_SHAPE(
        g[k].name == w[k].name && g[k].shape == w[k].shape && g[k].offset == w[k].offset,
        ::weft::detail::concat("store parameter ", k),
        ::weft::detail::concat(w[k].name, " ", ::weft::detail::array_string(w[k].shape), " at ",
                               w[k].offset, " (", origin, ")"),
        ::weft::detail::concat(g[k].name, " ", ::weft::detail::array_string(g[k].shape), " at ",
                               g[k].offset));
}

}  // namespace detail

//! Parameters and gradients of one layout in two flat host buffers (64-byte aligned, gradients
//! zeroed, parameters zeroed until initialised). Move-only; views stay valid while it lives.
template <class T>
class param_store {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> ||
                    std::is_same_v<T, f16>,
                "weft::nn::param_store<T>: T must be float, double, weft::bf16 or weft::f16");

 public:
  explicit param_store(param_layout layout)
      : layout_(std::move(layout)),
        params_(std::array<index_t, 1>{static_cast<index_t>(layout_.size())}),
        grads_(std::array<index_t, 1>{static_cast<index_t>(layout_.size())}) {
    std::fill_n(params_.data(), layout_.size(), T(0.0f));
    zero_grad();
  }

  [[nodiscard]] param_layout const& layout() const noexcept { return layout_; }
  [[nodiscard]] std::span<T> params() noexcept { return {params_.data(), layout_.size()}; }
  [[nodiscard]] std::span<T const> params() const noexcept {
    return {params_.data(), layout_.size()};
  }
  [[nodiscard]] std::span<T> grads() noexcept { return {grads_.data(), layout_.size()}; }
  [[nodiscard]] std::span<T const> grads() const noexcept {
    return {grads_.data(), layout_.size()};
  }

  //! Sets every gradient to 0 (the layers' backward functions accumulate).
  void zero_grad() noexcept { std::fill_n(grads_.data(), layout_.size(), T(0.0f)); }

  //! The parameter (gradient) `name` as a rank-R view; shape_error if it has another rank.
  template <std::size_t R>
  [[nodiscard]] tensor_view<T, R> param(std::string_view name) {
    return view_of<R>(params_.data(), layout_.at(name), "param");
  }
  template <std::size_t R>
  [[nodiscard]] tensor_view<T const, R> param(std::string_view name) const {
    return view_of<R>(params_.data(), layout_.at(name), "param");
  }
  template <std::size_t R>
  [[nodiscard]] tensor_view<T, R> grad(std::string_view name) {
    return view_of<R>(grads_.data(), layout_.at(name), "grad");
  }
  //! The elements of `name` as a flat span, of the parameters or the gradients.
  [[nodiscard]] std::span<T> param_span(std::string_view name) {
    auto const& e = layout_.at(name);
    return {params_.data() + e.offset, e.info.count};
  }
  [[nodiscard]] std::span<T const> param_span(std::string_view name) const {
    auto const& e = layout_.at(name);
    return {params_.data() + e.offset, e.info.count};
  }
  [[nodiscard]] std::span<T> grad_span(std::string_view name) {
    auto const& e = layout_.at(name);
    return {grads_.data() + e.offset, e.info.count};
  }

  //! Initialises `name` with normal (uniform) values from rng(seed, its init_stream): the same
  //! numbers init_normal(shard, seed, entry, ..., placement) gives any shard of it.
  void init_normal(std::string_view name, std::uint64_t seed, double mean, double stddev) {
    auto const& e = layout_.at(name);
    fill_normal(whole(e), rng(seed, e.info.init_stream), mean, stddev);
  }
  void init_uniform(std::string_view name, std::uint64_t seed, double lo, double hi) {
    auto const& e = layout_.at(name);
    fill_uniform(whole(e), rng(seed, e.info.init_stream), lo, hi);
  }
  void init_constant(std::string_view name, double value) {
    for (T& v : param_span(name)) v = static_cast<T>(value);
  }

 private:
  template <std::size_t R, class E>
  static tensor_view<E, R> view_of(E* base, param_entry const& e, char const* what) {
    WEFT_EXPECTS_SHAPE(e.shape.size() == R, what,
                       ::weft::detail::concat("rank ", R, " (as requested)"),
                       ::weft::detail::concat("rank ", e.shape.size(), " (\"", e.name, "\" is ",
                                              ::weft::detail::array_string(e.shape), ")"));
    ::weft::detail::index_array<R> ext{};
    for (std::size_t k = 0; k != R; ++k) ext[k] = e.shape[k];
    return tensor_view<E, R>(base + e.offset, dextents<R>(ext));
  }
  tensor_view<T, 1> whole(param_entry const& e) {
    return tensor_view<T, 1>(params_.data() + e.offset, static_cast<index_t>(e.info.count));
  }

  param_layout layout_;
  tensor<T, 1> params_;
  tensor<T, 1> grads_;
};

//! The global extents of a parameter, for a placement of a shard of it.
[[nodiscard]] inline std::vector<std::int64_t> global_extents(param_entry const& e) {
  return {e.shape.begin(), e.shape.end()};
}

//! Fills `shard`, the part of parameter `e` at `where` (offsets and steps over e's shape; empty:
//! the whole parameter; the shard's rank is e's), from rng(seed, e.info.init_stream): bit for bit
//! what param_store::init_normal puts at those positions. Tensor- or pipeline-parallel ranks
//! initialise their pieces with it.
template <TensorIn<host_space> V>
void init_normal(V const& shard, std::uint64_t seed, param_entry const& e, double mean,
                 double stddev, placement where = {}) {
  if (where.global_extents.empty()) where.global_extents = global_extents(e);
  fill_normal(shard, rng(seed, e.info.init_stream), mean, stddev, where);
}
template <TensorIn<host_space> V>
void init_uniform(V const& shard, std::uint64_t seed, param_entry const& e, double lo, double hi,
                  placement where = {}) {
  if (where.global_extents.empty()) where.global_extents = global_extents(e);
  fill_uniform(shard, rng(seed, e.info.init_stream), lo, hi, where);
}

}  // namespace weft::nn
