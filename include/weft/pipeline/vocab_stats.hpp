// weft/pipeline/vocab_stats.hpp — combining the S pass's statistics ([max | sumexp | target | G |
// H], pipeline::VocabShard) of vocabulary shards over a group: the executor's C0 over the pipeline
// ranks, and a shard that splits its rows again (over tp, say) before handing them to C0.
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/error.hpp>

#include <cmath>
#include <cstddef>
#include <span>

namespace weft::pipeline {

//! Combines the S statistics of n tokens over the shards of `group`, in two deterministic rounds:
//! a MAX all-reduce of the shards' maxima into `max` (n elements; stats' own maxima stay), each
//! shard's sums and (one barrier, `width` = h) G rows rescaled by exp(own max - group max), then
//! one SUM all-reduce of stats[n, count): the sums, the target logits and G, H. Afterwards every
//! rank holds the statistics of the union of the shards' rows. Collective over `group`;
//! shape_error where stats is not 3n + 2n·width elements or max not n.
template <comm::CollectiveIn<host_space> G, class F>
void combine_vocab_stats(G& group, std::span<F> stats, std::span<F> max, std::size_t n,
                         std::size_t width, comm::op_options o = {}) {
  WEFT_EXPECTS_SHAPE(stats.size() == 3 * n + 2 * n * width, "stats",
                     ::weft::detail::concat(3 * n + 2 * n * width, " elements (3n + 2n width)"),
                     stats.size());
  WEFT_EXPECTS_SHAPE(max.size() == n, "max", ::weft::detail::concat(n, " elements"), max.size());
  F* st = stats.data();
  for (std::size_t t = 0; t < n; ++t) max[t] = st[t];
  comm::all_reduce(group, max, comm::reduce_kind::max, o).wait();
  for (std::size_t t = 0; t < n; ++t) {
    F const f = std::exp(st[t] - max[t]);
    st[n + t] *= f;
    for (std::size_t k = 0; k < width; ++k) st[3 * n + t * width + k] *= f;
  }
  comm::all_reduce(group, stats.subspan(n), comm::reduce_kind::sum, o).wait();
}

}  // namespace weft::pipeline
