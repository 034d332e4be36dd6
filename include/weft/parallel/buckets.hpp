// weft/parallel/buckets.hpp — bucket_plan: where each parameter's gradient lives in the
// data-parallel gradient buffer (Megatron's layout: reverse definition order, buckets that close
// once they reach bucket_size, ZeRO-1 padding), and which piece of each bucket every DP rank owns.
#pragma once

#include <weft/core/error.hpp>
#include <weft/optim/param.hpp>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

namespace weft::parallel {

using optim::param_info;

//! How bucket_plan lays out a gradient buffer.
//! - `bucket_size`: a bucket closes once it holds at least this many elements (the parameter
//!   that reaches it stays in, so a bucket may exceed it by one parameter); 0 puts everything in
//!   one bucket (Megatron without overlap_grad_reduce). Megatron's default is
//!   max(40'000'000, 1'000'000·dp), megatron_bucket_size(dp).
//! - `dp`: the data-parallel size the buffer is reduced over.
//! - `shard`: ZeRO-1 (Megatron's distributed optimizer): each bucket is reduce-scattered, so the
//!   layout pads parameter starts to 64 elements and bucket ends to a multiple of lcm(dp, 128)
//!   (NCCL's fast paths want aligned chunks, and every rank's piece must be the same size), and a
//!   tied parameter (param_info::tied or tied_secondary) gets a bucket of its own.
//! - `pad_for_high_nccl_busbw`: bucket ends to lcm(dp, 128, 2^16) instead (Megatron's
//!   pad_buckets_for_high_nccl_busbw). Only with `shard`.
struct bucket_options {
  std::size_t bucket_size = 40'000'000;
  int dp = 1;
  bool shard = false;
  bool pad_for_high_nccl_busbw = false;
};

//! Megatron's default bucket size: max(40M, 1M·dp) elements ("larger DP sizes need larger
//! buckets", so the per-rank piece of a reduce-scatter does not shrink with dp).
[[nodiscard]] constexpr std::size_t megatron_bucket_size(int dp) noexcept {
  return std::max<std::size_t>(40'000'000, 1'000'000 * static_cast<std::size_t>(dp > 0 ? dp : 1));
}

//! Where parameter `param` (its index in definition order) lives: [start, start + count) of the
//! gradient buffer, in bucket `bucket`; `source` is its offset in a flat buffer in definition
//! order without padding (what optim/ and a user's model hold).
struct param_slot {
  std::size_t bucket = 0;
  std::size_t start = 0;
  std::size_t count = 0;
  std::size_t source = 0;
  [[nodiscard]] constexpr std::size_t end() const noexcept { return start + count; }
};

//! One bucket: [start, end) of the gradient buffer, padding included; its parameters end at
//! data_end; `params` are their indices in layout order (reverse definition order).
struct bucket {
  std::size_t start = 0;
  std::size_t end = 0;
  std::size_t data_end = 0;
  std::vector<std::size_t> params;
  [[nodiscard]] constexpr std::size_t size() const noexcept { return end - start; }
};

//! The part of parameter `param` a rank owns: elements [offset, offset + count) of the parameter,
//! at `buffer` in the gradient buffer and at `source` in the definition-order flat buffer.
struct owned_piece {
  std::size_t param = 0;
  std::size_t offset = 0;
  std::size_t count = 0;
  std::size_t buffer = 0;
  std::size_t source = 0;
};

//! What one rank owns of one bucket under ZeRO-1: [start, end) of the gradient buffer (the
//! bucket cut into dp equal ranges, ignoring parameter boundaries) and the parameter pieces in
//! it, in buffer order (padding belongs to no piece).
struct owned_range {
  std::size_t bucket = 0;
  std::size_t start = 0;
  std::size_t end = 0;
  std::vector<owned_piece> pieces;
  [[nodiscard]] constexpr std::size_t size() const noexcept { return end - start; }
};

//! The layout of a data-parallel gradient buffer (and, under ZeRO-1, of the parameter buffer the
//! updated shards are all-gathered into), computed from the parameters in definition order as
//! Megatron's `_compute_per_buffer_param_layout` does:
//! - parameters are laid out in reverse definition order, the order backward produces their
//!   gradients, so the first bucket is complete first;
//! - a bucket closes once end − bucket start >= bucket_size (after the parameter that reaches it);
//! - with `shard`: starts padded to 64 elements, bucket ends to lcm(dp, 128), tied parameters
//!   alone in their bucket (else a reduce-scatter gives the two copies' pieces to different
//!   ranks and the pipeline sum of the tied gradient adds unrelated halves: Megatron-LM#844).
//!
//! The buffer it describes is not the user's flat buffer: parameters are reversed and, under
//! ZeRO-1, padded. parallel::grad_sync owns a buffer in this layout and hands out per-parameter
//! views of it (the backward writes there, as Megatron's `main_grad`); pack and unpack move data
//! between it and a flat definition-order buffer (padding reads as zero).
//!
//! Example (the reference note's golden): a = 100, b = 300, c = 50, d = 200, bucket_size 250.
//! Replicated: {d[0,200) c[200,250)}, {b[250,550)}, {a[550,650)}. ZeRO-1 at dp = 4: d[0,200)
//! c[256,306) in [0,384); b[384,684) in [384,768); a[768,868) in [768,896); bucket 0 owned as
//! r0 d[0:96], r1 d[96:192], r2 d[192:200] + c[0:32], r3 c[32:50].
class bucket_plan {
 public:
  bucket_plan() = default;

  //! Throws invalid_argument_error for dp < 1, or pad_for_high_nccl_busbw without shard.
  explicit bucket_plan(std::span<param_info const> params, bucket_options const& options = {})
      : params_(params.begin(), params.end()), options_(options) {
    WEFT_EXPECTS(options.dp >= 1, "bucket_options::dp", ">= 1", options.dp);
    WEFT_EXPECTS(options.shard || !options.pad_for_high_nccl_busbw,
                 "bucket_options::pad_for_high_nccl_busbw", "false unless shard is true",
                 options.pad_for_high_nccl_busbw);
    layout();
  }

  [[nodiscard]] std::span<param_info const> params() const noexcept { return params_; }
  [[nodiscard]] bucket_options const& options() const noexcept { return options_; }
  [[nodiscard]] int dp() const noexcept { return options_.dp; }
  [[nodiscard]] bool sharded() const noexcept { return options_.shard; }
  //! Elements of the gradient buffer, padding included.
  [[nodiscard]] std::size_t buffer_size() const noexcept {
    return buckets_.empty() ? 0 : buckets_.back().end;
  }
  //! Elements of the flat definition-order buffer: the sum of the counts.
  [[nodiscard]] std::size_t source_size() const noexcept { return source_size_; }
  [[nodiscard]] std::span<bucket const> buckets() const noexcept { return buckets_; }
  [[nodiscard]] std::span<param_slot const> slots() const noexcept { return slots_; }
  [[nodiscard]] param_slot const& slot(std::size_t param) const {
    WEFT_EXPECTS(param < slots_.size(), "param",
                 ::weft::detail::concat("a parameter index < ", slots_.size()), param);
    return slots_[param];
  }

  //! Elements every rank owns under ZeRO-1: buffer_size() / dp (padding included).
  [[nodiscard]] std::size_t shard_size() const {
    expect_sharded("shard_size");
    return buffer_size() / static_cast<std::size_t>(dp());
  }

  //! The range of bucket `b` that DP rank `rank` owns and the parameter pieces in it (Megatron's
  //! `_build_model_gbuf_range`). Only for a sharded plan; invalid_argument_error otherwise.
  [[nodiscard]] owned_range owned(std::size_t b, int rank) const {
    expect_sharded("owned");
    WEFT_EXPECTS(b < buckets_.size(), "bucket",
                 ::weft::detail::concat("a bucket index < ", buckets_.size()), b);
    WEFT_EXPECTS(rank >= 0 && rank < dp(), "rank", ::weft::detail::concat("in [0, ", dp(), ")"),
                 rank);
    auto const& bk = buckets_[b];
    std::size_t const part = bk.size() / static_cast<std::size_t>(dp());
    owned_range r;
    r.bucket = b;
    r.start = bk.start + static_cast<std::size_t>(rank) * part;
    r.end = r.start + part;
    for (std::size_t const p : bk.params) {
      auto const& s = slots_[p];
      std::size_t const lo = std::max(s.start, r.start), hi = std::min(s.end(), r.end);
      if (lo >= hi) continue;
      r.pieces.push_back({p, lo - s.start, hi - lo, lo, s.source + (lo - s.start)});
    }
    return r;
  }

  //! Every piece `rank` owns, bucket by bucket, in buffer order.
  [[nodiscard]] std::vector<owned_piece> owned_pieces(int rank) const {
    std::vector<owned_piece> out;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      auto r = owned(b, rank);
      out.insert(out.end(), r.pieces.begin(), r.pieces.end());
    }
    return out;
  }

  //! Copies a flat definition-order buffer (source_size() elements) into a buffer in this layout
  //! (buffer_size() elements); padding is set to zero. shape_error for other sizes.
  template <class T>
  void pack(std::span<T const> flat, std::span<T> buffer) const {
    expect_sizes(flat.size(), buffer.size());
    std::fill(buffer.begin(), buffer.end(), T(0));
    for (auto const& s : slots_)
      std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(s.source), s.count,
                  buffer.begin() + static_cast<std::ptrdiff_t>(s.start));
  }

  //! Copies a buffer in this layout back into a flat definition-order buffer.
  template <class T>
  void unpack(std::span<T const> buffer, std::span<T> flat) const {
    expect_sizes(flat.size(), buffer.size());
    for (auto const& s : slots_)
      std::copy_n(buffer.begin() + static_cast<std::ptrdiff_t>(s.start), s.count,
                  flat.begin() + static_cast<std::ptrdiff_t>(s.source));
  }

 private:
  static constexpr std::size_t round_up(std::size_t x, std::size_t a) noexcept {
    return (x + a - 1) / a * a;
  }

  void expect_sharded(char const* what) const {
    WEFT_EXPECTS(sharded(), what, "a sharded plan (bucket_options::shard = true)",
                 "a replicated plan");
  }

  void expect_sizes(std::size_t flat, std::size_t buffer) const {
    WEFT_EXPECTS_SHAPE(flat == source_size_, "flat",
                       ::weft::detail::concat(source_size_, " elements (the sum of the counts)"),
                       ::weft::detail::concat(flat, " elements"));
    WEFT_EXPECTS_SHAPE(buffer == buffer_size(), "buffer",
                       ::weft::detail::concat(buffer_size(), " elements (the plan's buffer_size)"),
                       ::weft::detail::concat(buffer, " elements"));
  }

  void layout() {
    std::size_t const n = params_.size();
    slots_.assign(n, {});
    for (std::size_t i = 0, off = 0; i < n; ++i) {
      slots_[i].source = off;
      slots_[i].count = params_[i].count;
      off += params_[i].count;
      source_size_ = off;
    }
    bool const shard = sharded();
    std::size_t const start_align = shard ? 64 : 1;
    std::size_t end_align = 1;
    if (shard) {
      end_align = std::lcm(static_cast<std::size_t>(dp()), std::size_t{128});
      if (options_.pad_for_high_nccl_busbw) end_align = std::lcm(end_align, std::size_t{1} << 16);
    }
    std::size_t const limit = options_.bucket_size;

    bucket current;
    std::size_t next = 0;  // where the next parameter may start
    std::size_t last_end = 0;
    auto close = [&](std::size_t data_end) {
      current.data_end = last_end;
      current.end = round_up(data_end, end_align);
      std::size_t const end = current.end;
      buckets_.push_back(std::move(current));
      current = bucket{};
      current.start = end;
      return end;
    };
    for (std::size_t k = n; k-- > 0;) {
      bool const alone = shard && optim::is_tied(params_[k]);
      next = round_up(next, start_align);
      // A tied parameter starts a bucket of its own: close what came before it.
      if (alone && !current.params.empty()) next = close(next);
      auto& s = slots_[k];
      s.start = next;
      s.bucket = buckets_.size();
      current.params.push_back(k);
      last_end = s.end();
      if ((limit != 0 && s.end() - current.start >= limit) || alone)
        next = close(s.end());
      else
        next = s.end();
    }
    if (!current.params.empty()) close(last_end);
  }

  std::vector<param_info> params_;
  bucket_options options_;
  std::vector<param_slot> slots_;
  std::vector<bucket> buckets_;
  std::size_t source_size_ = 0;
};

}  // namespace weft::parallel
