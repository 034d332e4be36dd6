// weft/optim/param.hpp — param_info, what the optimizer and gradient clipping know of one
// parameter of a flat parameter buffer: its element count, whether it is sharded over tensor
// parallelism, whether it is the secondary copy of a tied weight, and whether AdamW decays it.
// It lives here (weft::optim::param_info) so optim/ needs nothing above it; weft/parallel/ uses
// the same type (parallel/buckets.hpp: `using optim::param_info`).
#pragma once

#include <weft/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace weft::optim {

//! One parameter of a flat buffer; a buffer is described by a span of them, in buffer order, whose
//! counts add up to the buffer's size.
//! - `tp_sharded`: every tensor-parallel rank holds a different piece (column/row-parallel
//!   weights, vocabulary shards); a parameter that is not sharded is replicated over tp and counts
//!   once, on tp rank 0, in the gradient norm.
//! - `sequence_parallel_grad`: a replicated parameter whose gradient is partial per tp rank under
//!   sequence parallelism (norm weights); parallel/ sums it over tp. The optimizer ignores it.
//! - `tied_secondary`: the second copy of a tied weight (the output layer on the last pipeline
//!   stage tied to the input embedding); its gradient is the same sum, counted once, on the
//!   primary.
//! - `decay`: AdamW applies weight decay (step 1 of the update) to this parameter. Megatron and
//!   nanoGPT decay matrices and embeddings, not biases or norm weights.
//! - `init_stream`: the random stream parallel/ initialises it from (unused here).
//! - `tied`: one copy of a weight tied across pipeline stages (the input embedding and the output
//!   layer), the primary as well as the secondary (`tied_secondary` implies it). parallel/'s
//!   ZeRO-1 bucket plan gives such a parameter a bucket of its own, so both copies shard alike
//!   and their owned gradient pieces can be summed over the embedding group (Megatron's
//!   `shared_embedding`); nothing else reads it.
struct param_info {
  std::size_t count = 0;
  bool tp_sharded = false;
  bool sequence_parallel_grad = false;
  bool tied_secondary = false;
  bool decay = true;
  std::uint64_t init_stream = 0;
  bool tied = false;
};

//! Whether `p` is either copy of a tied weight.
[[nodiscard]] constexpr bool is_tied(param_info const& p) noexcept {
  return p.tied || p.tied_secondary;
}

//! The number of elements the parameters describe: the size their flat buffer must have.
[[nodiscard]] inline std::size_t total_count(std::span<param_info const> params) noexcept {
  std::size_t n = 0;
  for (auto const& p : params) n += p.count;
  return n;
}

namespace detail {
//! Throws shape_error unless `size` (the size of the buffer named `name`) is the total count of
//! `params`.
inline void expect_buffer_matches(std::span<param_info const> params, std::size_t size,
                                  char const* name) {
  std::size_t const n = total_count(params);
  WEFT_EXPECTS_SHAPE(size == n, name,
                     ::weft::detail::concat(n, " elements (the sum of the param_info counts)"),
                     ::weft::detail::concat(size, " elements"));
}
}  // namespace detail

}  // namespace weft::optim
