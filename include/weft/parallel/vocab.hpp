// weft/parallel/vocab.hpp — vocabulary parallelism over a tensor-parallel group: Megatron's padded
// vocabulary size, the vocabulary-parallel input embedding (masked lookup, then all-reduce or
// reduce-scatter) and the output layer's cross-entropy over rl::vocab_shard columns.
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/core/error.hpp>
#include <weft/core/memory.hpp>
#include <weft/core/tensor/view.hpp>
#include <weft/nn/linear.hpp>
#include <weft/parallel/detail/tp_matrix.hpp>
#include <weft/parallel/linear.hpp>
#include <weft/parallel/mappings.hpp>
#include <weft/rl/logprobs.hpp>
#include <weft/rl/token_layout.hpp>
#include <weft/rl/vocab_parallel.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace weft::parallel {

// Shards. A rank holds the vocabulary rows (embedding) or columns (output layer, logits) of its
// rl::vocab_shard: vocab_shard::even(V, tp, r) gives the first V % tp ranks one entry more, so any
// V works on any tp, and where tp divides V (always after vocab_size_with_padding) it is exactly
// Megatron's VocabUtility split [r V/tp, (r+1) V/tp). The same struct drives rl's log-probs, so
// the embedding, the output layer and the loss agree on who holds what by construction.

using rl::vocab_shard;

//! Megatron's padded vocabulary (`_vocab_size_with_padding`): the smallest multiple of
//! divisor * tp that holds `vocab`, so that every tp rank holds the same number of rows and each
//! a multiple of `divisor`. GPT-2's 50257 becomes 50304, 50432, 50688 and 51200 at tp = 1, 2, 4
//! and 8. The padding rows are never looked up (ids stay below `vocab`); their logits take part in
//! the softmax as Megatron's do, so initialise them like the others or mask them by the caller.
[[nodiscard]] inline index_t vocab_size_with_padding(index_t vocab, int tp, index_t divisor = 128) {
  WEFT_EXPECTS(vocab >= 1, "vocab", ">= 1", vocab);
  WEFT_EXPECTS(tp >= 1, "tp", ">= 1", tp);
  WEFT_EXPECTS(divisor >= 1, "divisor", ">= 1", divisor);
  index_t const multiple = divisor * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

//! This rank's shard of a vocabulary of `vocab` entries over `tp` (vocab_shard::even).
template <comm::Group C>
[[nodiscard]] vocab_shard vocab_shard_of(C const& tp, index_t vocab) {
  return vocab_shard::even(vocab, tp.size(), tp.rank());
}

namespace detail {

template <class I>
void check_ids(std::span<I const> ids, index_t vocab) {
  for (std::size_t k = 0; k < ids.size(); ++k) {
    auto const id = static_cast<std::int64_t>(ids[k]);
    WEFT_EXPECTS(id >= 0 && id < vocab, "ids", ::weft::detail::concat("ids in [0, ", vocab, ")"),
                 ::weft::detail::concat(id, " at token ", k));
  }
}

// Checks shared by the embedding's forward and backward: the shard, the ids, the table's shape
// [shard.size, H] and the activation's [rows, H]. Every rank sees the same ids, so bad ids throw
// on every rank before anything is communicated.
template <class I, class Table, class Act>
void check_embedding(std::span<I const> ids, vocab_shard const& shard, Table const& table,
                     char const* table_name, Act const& act, index_t rows, char const* act_name) {
  shard.validate();
  check_ids(ids, shard.vocab);
  expect_extents(table, shard.size, table.extent(1), table_name);
  expect_extents(act, rows, table.extent(1), act_name);
}

// out[k] = table[ids[k] - shard.begin] for the ids this rank holds, 0 for the others.
template <class I, class T>
void masked_lookup(std::span<I const> ids, vocab_shard const& shard, tensor_view<T const, 2> table,
                   tensor_view<T, 2> out) {
  auto const h = static_cast<std::size_t>(table.extent(1));
  for (std::size_t k = 0; k < ids.size(); ++k) {
    auto const local = static_cast<index_t>(ids[k]) - shard.begin;
    T* row = out.data_handle() + k * h;
    if (local >= 0 && local < shard.size) {
      std::copy_n(table.data_handle() + static_cast<std::size_t>(local) * h, h, row);
    } else {
      std::fill_n(row, h, T(0));
    }
  }
}

// dtable[ids[k] - shard.begin] += dout[k] for the ids this rank holds, in token order (a fixed
// order: the same ids give the same bits, however they repeat).
template <class I, class T>
void scatter_add_rows(std::span<I const> ids, vocab_shard const& shard,
                      tensor_view<T const, 2> dout, tensor_view<T, 2> dtable) {
  auto const h = static_cast<std::size_t>(dtable.extent(1));
  for (std::size_t k = 0; k < ids.size(); ++k) {
    auto const local = static_cast<index_t>(ids[k]) - shard.begin;
    if (local < 0 || local >= shard.size) continue;
    T* row = dtable.data_handle() + static_cast<std::size_t>(local) * h;
    T const* g = dout.data_handle() + k * h;
    for (std::size_t j = 0; j < h; ++j) row[j] += g[j];
  }
}

}  // namespace detail

// ---- the input embedding ------------------------------------------------------------------

//! Forward of the vocabulary-parallel embedding (Megatron's VocabParallelEmbedding): `ids` [N]
//! are global token ids, the same on every rank; `table` [shard.size, H] holds this rank's rows;
//! `out` [N, H] receives the embeddings of all N tokens on every rank. Each rank looks up the ids
//! it holds (0 for the others), then one SUM all-reduce (g) completes every row: exactly the
//! dense lookup, since each row is one value plus zeros. Throws invalid_argument_error for an id
//! outside [0, shard.vocab) and shape_error for a shape mismatch, on every rank alike.
template <comm::CollectiveIn<host_space> C, rl::FlatArray IR, HostMatrix Table,
          MutableHostMatrix Out>
requires std::integral<rl::flat_value_t<IR>> &&
    std::same_as<matrix_value_t<Table>, matrix_value_t<Out>>
void vocab_parallel_embedding_forward(C& tp, IR&& ids, vocab_shard const& shard, Table&& table,
                                      Out&& out) {
  auto const idv = rl::as_flat_const(ids, "ids");
  auto const tv = detail::as_const_matrix(table, "table");
  auto const ov = detail::as_matrix(out, "out");
  detail::check_embedding(idv, shard, tv, "table", ov, static_cast<index_t>(idv.size()), "out");
  detail::masked_lookup(idv, shard, tv, ov);
  reduce_from_tp_forward(tp, ov);
}

//! Forward under sequence parallelism: as above, but the partial [N, H] is reduce-scattered, so
//! `out` [N/tp, H] receives this rank's tokens only (Megatron's reduce_scatter_embeddings). N must
//! be a multiple of tp.size().
template <comm::CollectiveIn<host_space> C, rl::FlatArray IR, HostMatrix Table,
          MutableHostMatrix Out>
requires std::integral<rl::flat_value_t<IR>> &&
    std::same_as<matrix_value_t<Table>, matrix_value_t<Out>>
void vocab_parallel_embedding_forward_sp(C& tp, IR&& ids, vocab_shard const& shard, Table&& table,
                                         Out&& out) {
  using T = matrix_value_t<Out>;
  auto const idv = rl::as_flat_const(ids, "ids");
  auto const tv = detail::as_const_matrix(table, "table");
  auto const ov = detail::as_matrix(out, "out");
  auto const n = static_cast<index_t>(idv.size());
  detail::expect_divisible(n, tp.size(), "ids", "size()");
  detail::check_embedding(idv, shard, tv, "table", ov, n / tp.size(), "out");
  std::vector<T> partial(static_cast<std::size_t>(n * tv.extent(1)));
  tensor_view<T, 2> const pv(partial.data(), n, tv.extent(1));
  detail::masked_lookup(idv, shard, tv, pv);
  reduce_scatter_to_sp_forward(tp, tensor_view<T const, 2>(pv), ov);
}

//! Backward of the embedding: dtable [shard.size, H] += the rows of dout [N, H] whose ids this
//! rank holds (scatter-add into its own rows only, in token order). No communication: g's
//! backward is the identity, so dout is every rank's whole gradient. ACCUMULATES into dtable.
template <rl::FlatArray IR, HostMatrix DOut, MutableHostMatrix DTable>
requires std::integral<rl::flat_value_t<IR>> &&
    std::same_as<matrix_value_t<DOut>, matrix_value_t<DTable>>
void vocab_parallel_embedding_backward(IR&& ids, vocab_shard const& shard, DOut&& dout,
                                       DTable&& dtable) {
  auto const idv = rl::as_flat_const(ids, "ids");
  auto const dv = detail::as_const_matrix(dout, "dout");
  auto const tv = detail::as_matrix(dtable, "dtable");
  detail::check_embedding(idv, shard, tv, "dtable", dv, static_cast<index_t>(idv.size()), "dout");
  detail::scatter_add_rows(idv, shard, dv, tv);
}

//! Backward under sequence parallelism: dout [N/tp, H] is this rank's tokens' gradient; it is
//! all-gathered (the adjoint of the forward's reduce-scatter), then scatter-added as above.
//! ACCUMULATES into dtable.
template <comm::CollectiveIn<host_space> C, rl::FlatArray IR, HostMatrix DOut,
          MutableHostMatrix DTable>
requires std::integral<rl::flat_value_t<IR>> &&
    std::same_as<matrix_value_t<DOut>, matrix_value_t<DTable>>
void vocab_parallel_embedding_backward_sp(C& tp, IR&& ids, vocab_shard const& shard, DOut&& dout,
                                          DTable&& dtable) {
  using T = matrix_value_t<DTable>;
  auto const idv = rl::as_flat_const(ids, "ids");
  auto const dv = detail::as_const_matrix(dout, "dout");
  auto const tv = detail::as_matrix(dtable, "dtable");
  auto const n = static_cast<index_t>(idv.size());
  detail::expect_divisible(n, tp.size(), "ids", "size()");
  detail::check_embedding(idv, shard, tv, "dtable", dv, n / tp.size(), "dout");
  std::vector<T> full(static_cast<std::size_t>(n * tv.extent(1)));
  tensor_view<T, 2> const fv(full.data(), n, tv.extent(1));
  reduce_scatter_to_sp_backward(tp, dv, fv);
  detail::scatter_add_rows(idv, shard, tensor_view<T const, 2>(fv), tv);
}

// ---- the output layer ---------------------------------------------------------------------------
// A column-parallel linear without bias whose output dimension is the vocabulary: rank r holds
// w_local [shard.size, H] (rows [shard.begin, shard.begin + shard.size) of W [V, H]) and computes
// its logits' columns [N, shard.size] = h · w_localᵀ. Its input gradient is summed over tp (f's
// backward), or reduce-scattered to the token slices under SP.

//! local_logits [N, shard.size] = h [N, H] · w_localᵀ (h replicated over tp). No communication.
template <comm::Group C, class H, class W, class L>
requires nn::HostArg<H, 2> && nn::HostArg<W, 2> && nn::HostArg<L, 2>
void vocab_parallel_output_forward(C& tp, H&& h, W&& w_local, L&& local_logits) {
  using T = detail::arg_value_t<W>;
  column_parallel_forward(tp, h, w_local, nn::no_bias<T>(), local_logits);
}

//! Under SP: h_local [N/tp, H] is all-gathered into h_total [N, H] (keep it for the weight
//! gradient), then local_logits [N, shard.size] = h_total · w_localᵀ.
template <comm::CollectiveIn<host_space> C, class H, class W, class HT, class L>
requires HostMatrix<H> && nn::HostArg<W, 2> && MutableHostMatrix<HT> && nn::HostArg<L, 2>
void vocab_parallel_output_forward_sp(C& tp, H&& h_local, W&& w_local, HT&& h_total,
                                      L&& local_logits) {
  using T = detail::arg_value_t<W>;
  column_parallel_forward_sp(tp, h_local, w_local, nn::no_bias<T>(), h_total, local_logits);
}

//! dh [N, H] = SUM over tp of local_dlogits [N, shard.size] · w_local (one SUM all-reduce).
template <comm::CollectiveIn<host_space> C, class G, class W, class DH>
requires nn::HostArg<G, 2> && nn::HostArg<W, 2> && MutableHostMatrix<DH>
void vocab_parallel_output_backward_input(C& tp, G&& local_dlogits, W&& w_local, DH&& dh) {
  column_parallel_backward_input(tp, local_dlogits, w_local, dh);
}

//! Under SP: dh_local [N/tp, H] = this rank's rows of that sum (one reduce-scatter).
template <comm::CollectiveIn<host_space> C, class G, class W, class DH>
requires nn::HostArg<G, 2> && nn::HostArg<W, 2> && MutableHostMatrix<DH>
void vocab_parallel_output_backward_input_sp(C& tp, G&& local_dlogits, W&& w_local, DH&& dh_local) {
  column_parallel_backward_input_sp(tp, local_dlogits, w_local, dh_local);
}

//! dw_local [shard.size, H] += local_dlogitsᵀ · h, where h is the forward's GEMM input (h, or
//! h_total under SP). No communication. ACCUMULATES.
template <class G, class H, class DW>
requires nn::HostArg<G, 2> && nn::HostArg<H, 2> && nn::HostArg<DW, 2>
void vocab_parallel_output_backward_weight(G&& local_dlogits, H&& h, DW&& dw_local) {
  using T = detail::arg_value_t<DW>;
  column_parallel_backward_weight(local_dlogits, h, dw_local, nn::no_bias_grad<T>());
}

// ---- the loss ---------------------------------------------------------------------------------
// The loss needs only per-token statistics across ranks: rl's vocab_parallel_log_prob_forward
// (two all-reduces: the max, then the packed sum and target logit) gives log p(target), and RL
// code calls rl's functions on the same local logits for log-probs and entropy. Every formula
// uses the global vocabulary shard.vocab, never the local shard size (Megatron-LM#737's
// label-smoothing bug).

//! Cross-entropy over vocabulary-sharded logits: losses[k] = lse_k - z_k[target_k] (that is,
//! -log p(target_k)), identical on every rank; `lse` [N] receives the log-sum-exp the backward
//! needs. `local_logits` is [N, shard.size]; `targets` are global ids, the same on every rank;
//! a target equal to opt.ignore_index gives loss 0 (and zero gradient). opt.temperature divides
//! the logits first, as in rl. Collective over `tp`; throws on every rank alike for bad shards
//! (they must tile [0, shard.vocab)), targets or shapes.
template <comm::CollectiveIn<host_space> C, HostMatrix L, rl::FlatArray IR,
          rl::MutableFlatArray LossR, rl::MutableFlatArray LseR>
requires std::integral<rl::flat_value_t<IR>> &&
    std::same_as<rl::flat_value_t<LossR>, rl::flat_value_t<LseR>>
void vocab_parallel_cross_entropy_forward(C& tp, L&& local_logits, vocab_shard const& shard,
                                          IR&& targets, LossR&& losses, LseR&& lse,
                                          rl::logprob_options const& opt = {}) {
  using T = rl::flat_value_t<LossR>;
  auto const lv = detail::as_const_matrix(local_logits, "local_logits");
  auto const tg = rl::as_flat_const(targets, "targets");
  auto const out = rl::as_flat(losses, "losses");
  auto const n = static_cast<index_t>(tg.size());
  detail::expect_extents(lv, n, shard.size, "local_logits");
  std::vector<T> entropy(tg.size());
  rl::vocab_parallel_log_prob_forward(
      tp, std::span<matrix_value_t<L> const>(lv.data_handle(), lv.size()), shard, tg, opt, out,
      entropy, rl::as_flat(lse, "lse"));
  for (auto& x : out) x = T(0) - x;  // 0 - 0 keeps ignored tokens at +0
}

//! Backward of the cross-entropy: local_dlogits [N, shard.size] = (softmax - onehot(target)) *
//! dloss[k] over this rank's columns (overwritten), from the forward's `lse`. No communication.
//! Then dh and dW_local come from the output layer's backward (parallel/linear.hpp).
template <HostMatrix L, rl::FlatArray IR, rl::FlatArray LseR, rl::FlatArray DLossR,
          MutableHostMatrix DL>
requires std::integral<rl::flat_value_t<IR>> &&
    std::same_as<rl::flat_value_t<LseR>, rl::flat_value_t<DLossR>> &&
    std::same_as<matrix_value_t<L>, matrix_value_t<DL>>
void vocab_parallel_cross_entropy_backward(L&& local_logits, vocab_shard const& shard, IR&& targets,
                                           LseR&& lse, DLossR&& dloss, DL&& local_dlogits,
                                           rl::logprob_options const& opt = {}) {
  using T = rl::flat_value_t<LseR>;
  auto const lv = detail::as_const_matrix(local_logits, "local_logits");
  auto const dv = detail::as_matrix(local_dlogits, "local_dlogits");
  auto const tg = rl::as_flat_const(targets, "targets");
  auto const dl = rl::as_flat_const(dloss, "dloss");
  auto const n = static_cast<index_t>(tg.size());
  detail::expect_extents(lv, n, shard.size, "local_logits");
  detail::expect_extents(dv, n, shard.size, "local_dlogits");
  WEFT_EXPECTS_SHAPE(dl.size() == tg.size(), "dloss", tg.size(), dl.size());
  // d loss / d logp = -dloss; the entropy term is off, so its input is never read for its value.
  std::vector<T> d_logp(tg.size()), zero(tg.size(), T(0));
  for (std::size_t k = 0; k < tg.size(); ++k) d_logp[k] = T(0) - dl[k];
  rl::vocab_parallel_log_prob_backward(
      std::span<matrix_value_t<L> const>(lv.data_handle(), lv.size()), shard, tg, opt,
      rl::as_flat_const(lse, "lse"), std::span<T const>(zero), std::span<T const>(d_logp),
      std::span<T const>{}, std::span<matrix_value_t<DL>>(dv.data_handle(), dv.size()));
}

}  // namespace weft::parallel
