// weft/parallel/gpt_shard.hpp — which piece of nn::gpt's parameters a rank holds: of a tensor-
// parallel group, Megatron's GPT layout (vocabulary-parallel embedding and head, column-parallel
// Q/K/V and MLP-in by output rows, row-parallel out projections by input columns, the rest
// whole); of a pipeline, a contiguous range of blocks (the first stage also the embeddings, the
// last the final norm and head). The shard's param_layout, and its initialisation and loading,
// bitwise the single device's slice.
#pragma once

#include <weft/attention/sharding.hpp>
#include <weft/comm/collectives.hpp>
#include <weft/core/error.hpp>
#include <weft/core/random.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/nn/params.hpp>
#include <weft/optim/param.hpp>
#include <weft/parallel/sharding.hpp>
#include <weft/rl/vocab_parallel.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weft::parallel {

//! How a GPT is split. `tp` ranks share every layer (heads, kv_heads and the MLP width must be
//! multiples of tp; the vocabulary need not be: vocab_shard::even); `sequence_parallel` keeps
//! the activations between the tensor-parallel layers as token slices (Megatron's
//! --sequence-parallel; the rows a rank holds, B·S/cp, must be a multiple of tp). `cp` ranks each
//! hold 2 zigzag chunks of every sequence (S a multiple of 2·cp) and run ring attention. `pp`
//! pipeline stages each hold a contiguous range of the blocks (gpt_stage_layers; pp <= layers),
//! the first also the token and position embeddings, the last the final LayerNorm and the head.
//! `vocab_pipeline` is the layout of the vocabulary-balanced schedules (pipeline::
//! vocab_one_f_one_b): the token embedding "wte" and the output layer "head" are then sharded
//! by vocabulary rows over the pp ranks and again over each one's tp ranks (gpt_vocab_shard,
//! gpt_vocab_rows, gpt_vocab_layout), and no stage holds them; the first stage takes the embedded
//! tokens as its input, the last hands the final norm's output on (all of the microbatch's rows,
//! under sequence parallelism too). It needs vocab >= pp · tp; any tp, sequence parallelism, cp.
struct gpt_parallelism {
  int tp = 1;
  int tp_rank = 0;
  bool sequence_parallel = false;
  int cp = 1;
  int cp_rank = 0;
  int pp = 1;
  int pp_rank = 0;
  bool vocab_pipeline = false;

  [[nodiscard]] constexpr bool first_stage() const noexcept { return pp_rank == 0; }
  [[nodiscard]] constexpr bool last_stage() const noexcept { return pp_rank == pp - 1; }
};

namespace detail {
//! Calls f(row, src, position) for every row cp rank p.cp_rank holds of `seqs` sequences of `s`
//! tokens (gpt's row order: sequence by sequence, each sequence's seq_layout::zigzag(cp, s)
//! positions of the rank): row is the local row, src = sequence * s + position the global one.
template <class F>
void for_each_cp_row(index_t seqs, index_t s, gpt_parallelism const& p, F&& f) {
  std::optional<attention::seq_layout> lay;
  if (p.cp > 1) lay = attention::seq_layout::zigzag(p.cp, s);
  index_t const c = s / p.cp;
  for (index_t n = 0; n < seqs; ++n)
    for (index_t i = 0; i < c; ++i) {
      index_t const pos = lay ? lay->global_position(p.cp_rank, i) : i;
      f(static_cast<std::size_t>(n * c + i), static_cast<std::size_t>(n * s + pos), pos);
    }
}
}  // namespace detail

//! The blocks [first, last) pipeline stage `pp_rank` of `pp` holds: layers / pp each, the first
//! layers % pp stages one more (Megatron needs pp to divide the layers; weft does not).
struct gpt_layer_range {
  index_t first = 0;
  index_t last = 0;
  [[nodiscard]] constexpr index_t size() const noexcept { return last - first; }
  [[nodiscard]] constexpr bool contains(index_t l) const noexcept { return l >= first && l < last; }
};

[[nodiscard]] constexpr gpt_layer_range gpt_stage_layers(index_t layers, int pp,
                                                         int pp_rank) noexcept {
  index_t const base = layers / pp, extra = layers % pp, r = pp_rank;
  index_t const first = r * base + std::min(r, extra);
  return {first, first + base + (r < extra ? 1 : 0)};
}

namespace detail {

//! One parameter of the global layout: its global shape and how a tp rank holds it (dim -1:
//! replicated; otherwise the pieces of dimension `dim`).
struct gpt_piece {
  std::vector<index_t> global_shape;
  int dim = -1;
  std::vector<shard_piece> pieces;
};

enum class gpt_split : std::uint8_t { replicated, rows, columns, vocab };

inline gpt_split split_of(std::string_view name) {
  auto ends = [&](std::string_view s) {
    return name.size() >= s.size() && name.substr(name.size() - s.size()) == s;
  };
  if (name == "wte" || name == "head") return gpt_split::vocab;
  if (ends(".q.w") || ends(".q.b") || ends(".k.w") || ends(".k.b") || ends(".v.w") ||
      ends(".v.b") || ends(".fc.w") || ends(".fc.b"))
    return gpt_split::rows;
  if (ends(".o.w") || ends(".proj.w")) return gpt_split::columns;
  return gpt_split::replicated;
}

inline void check_parallelism(nn::gpt_config const& c, gpt_parallelism const& p) {
  nn::validate(c);
  WEFT_EXPECTS(p.tp >= 1, "gpt_parallelism::tp", ">= 1", p.tp);
  WEFT_EXPECTS(p.tp_rank >= 0 && p.tp_rank < p.tp, "gpt_parallelism::tp_rank",
               ::weft::detail::concat("in [0, ", p.tp, ")"), p.tp_rank);
  WEFT_EXPECTS(p.cp >= 1, "gpt_parallelism::cp", ">= 1", p.cp);
  WEFT_EXPECTS(p.cp_rank >= 0 && p.cp_rank < p.cp, "gpt_parallelism::cp_rank",
               ::weft::detail::concat("in [0, ", p.cp, ")"), p.cp_rank);
  WEFT_EXPECTS(c.heads % p.tp == 0, "gpt_config::heads",
               ::weft::detail::concat("a multiple of tp = ", p.tp), c.heads);
  WEFT_EXPECTS(
      c.kv() % p.tp == 0, "gpt_config::kv_heads",
      ::weft::detail::concat("a multiple of tp = ", p.tp, " (each rank holds whole KV heads)"),
      c.kv());
  WEFT_EXPECTS(c.vocab >= p.tp, "gpt_config::vocab",
               ::weft::detail::concat(">= tp = ", p.tp, " (every rank holds vocabulary rows)"),
               c.vocab);
  WEFT_EXPECTS(c.hidden() % p.tp == 0, "gpt_config::mlp_hidden",
               ::weft::detail::concat("a multiple of tp = ", p.tp), c.hidden());
  WEFT_EXPECTS(
      p.pp >= 1 && p.pp <= c.layers, "gpt_parallelism::pp",
      ::weft::detail::concat("in [1, layers = ", c.layers, "] (every stage holds a block)"), p.pp);
  WEFT_EXPECTS(p.pp_rank >= 0 && p.pp_rank < p.pp, "gpt_parallelism::pp_rank",
               ::weft::detail::concat("in [0, ", p.pp, ")"), p.pp_rank);
  if (p.vocab_pipeline)
    WEFT_EXPECTS(c.vocab >= p.pp * p.tp, "gpt_config::vocab",
                 ::weft::detail::concat(">= pp * tp = ", p.pp * p.tp,
                                        " under vocab_pipeline (every rank holds vocabulary rows)"),
                 c.vocab);
}

//! Whether pipeline stage p.pp_rank holds the parameter `name` of nn::gpt_layout.
inline bool stage_holds(std::string_view name, nn::gpt_config const& c, gpt_parallelism const& p) {
  if (p.vocab_pipeline && (name == "wte" || name == "head")) return false;  // gpt_vocab_layout
  if (name == "wte" || name == "wpe") return p.first_stage();
  if (name == "head" || name.starts_with("lnf.")) return p.last_stage();
  if (name.size() > 1 && name[0] == 'h') {
    index_t l = 0;
    std::size_t i = 1;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) l = l * 10 + (name[i] - '0');
    if (i > 1 && i < name.size() && name[i] == '.')
      return gpt_stage_layers(c.layers, p.pp, p.pp_rank).contains(l);
  }
  return true;
}

inline gpt_piece piece_of(nn::param_entry const& e, nn::gpt_config const& c,
                          gpt_parallelism const& p) {
  gpt_piece out{e.shape, -1, {}};
  switch (split_of(e.name)) {
    case gpt_split::replicated: break;
    case gpt_split::rows:
      out.dim = 0;
      out.pieces = tp_shard_pieces(e.shape[0], p.tp, p.tp_rank);
      break;
    case gpt_split::columns:
      out.dim = 1;
      out.pieces = tp_shard_pieces(e.shape[1], p.tp, p.tp_rank);
      break;
    case gpt_split::vocab:
      out.dim = 0;
      out.pieces = {vocab_rows(rl::vocab_shard::even(c.vocab, p.tp, p.tp_rank))};
      break;
  }
  return out;
}

//! Copies parameter `e`'s shard between the whole tensor and the shard: whole -> shard when
//! `to_shard`, else shard -> whole (its places only).
template <class S, class D>
void copy_piece(nn::param_entry const& e, gpt_piece const& piece, S src, D dst, bool to_shard) {
  if (piece.dim < 0) {
    std::copy(src.begin(), src.end(), dst.begin());
    return;
  }
  index_t const cols = e.shape.size() == 2 ? e.shape[1] : 1;
  auto const shard_size = static_cast<index_t>(to_shard ? dst.size() : src.size());
  auto move = [&](index_t whole_at, index_t shard_at, index_t n) {
    if (to_shard)
      std::copy_n(src.begin() + whole_at, n, dst.begin() + shard_at);
    else
      std::copy_n(src.begin() + shard_at, n, dst.begin() + whole_at);
  };
  if (piece.dim == 0) {
    index_t at = 0;
    for (auto const& s : piece.pieces) {
      move(s.global_begin * cols, at * cols, s.size * cols);
      at += s.size;
    }
  } else {
    index_t const held = shard_size / e.shape[0];
    for (index_t r = 0; r < e.shape[0]; ++r)
      for (auto const& s : piece.pieces)
        move(r * cols + s.global_begin, r * held + s.local_begin, s.size);
  }
}

}  // namespace detail

//! This rank's parameters: those of its pipeline stage (all with pp = 1), nn::gpt_layout's names
//! in its order, each with the shape of the
//! rank's shard ("wte" and "head" [vocab rows held, d]; "q/k/v/fc.w" and their biases by output
//! rows; "o.w" and "proj.w" by input columns; everything else whole). param_info: tp_sharded for
//! the shards; sequence_parallel_grad, under sequence parallelism, for the parameters applied to
//! token slices (LayerNorms, "wpe"); init_stream the global parameter's, so gpt_init_shard gives
//! every shard the numbers of its slice of nn::gpt_init. The layout does not depend on cp.
inline nn::param_layout gpt_shard_layout(nn::gpt_config const& c, gpt_parallelism const& p) {
  detail::check_parallelism(c, p);
  nn::param_layout out;
  auto const global = nn::gpt_layout(c);
  for (auto const& e : global.entries()) {
    if (!detail::stage_holds(e.name, c, p)) continue;
    auto const piece = detail::piece_of(e, c, p);
    std::vector<index_t> shape = e.shape;
    optim::param_info info = e.info;
    info.count = 0;
    if (piece.dim >= 0) {
      index_t held = 0;
      for (auto const& s : piece.pieces) held += s.size;
      shape[static_cast<std::size_t>(piece.dim)] = held;
      info.tp_sharded = true;
    } else {
      bool const on_slices = e.name == "wpe" || e.name.find("ln") != std::string::npos;
      info.sequence_parallel_grad = p.sequence_parallel && on_slices;
    }
    out.add(e.name, std::move(shape), info);
  }
  return out;
}

//! nn::gpt_init for a shard laid out by gpt_shard_layout(c, p): every parameter bit for bit the
//! slice of the single-device initialisation with the same seed.
template <class T>
void gpt_init_shard(nn::param_store<T>& store, nn::gpt_config const& c, gpt_parallelism const& p,
                    std::uint64_t seed) {
  auto const global = nn::gpt_layout(c);
  WEFT_EXPECTS_SHAPE(store.layout().size() == gpt_shard_layout(c, p).size(), "store",
                     ::weft::detail::concat(gpt_shard_layout(c, p).size(),
                                            " elements (gpt_shard_layout(config, parallelism))"),
                     store.layout().size());
  double const std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  for (auto const& e : global.entries()) {
    if (!detail::stage_holds(e.name, c, p)) continue;
    std::string_view const n = e.name;
    auto ends = [&](std::string_view s) {
      return n.size() >= s.size() && n.substr(n.size() - s.size()) == s;
    };
    if (ends("ln1.w") || ends("ln2.w") || n == "lnf.w") {
      store.init_constant(n, 1.0);
    } else if (e.shape.size() == 1) {
      store.init_constant(n, 0.0);
    } else {
      double const s = ends("o.w") || ends("proj.w") ? proj_std : std;
      auto const piece = detail::piece_of(e, c, p);
      if (piece.dim < 0) {
        store.init_normal(n, seed, 0.0, s);
      } else {
        rng const gen(seed, store.layout().at(n).info.init_stream);
        fill_normal_shard(store.template param<2>(n), gen, 0.0, s, piece.global_shape, piece.dim,
                          piece.pieces);
      }
    }
  }
}

//! Copies this rank's shard of every parameter of its stage out of a single-device store laid out
//! by nn::gpt_layout(c) (to start a parallel run from a trained or checkpointed model).
template <class T>
void gpt_load_shard(nn::param_store<T>& shard, nn::param_store<T>& whole, nn::gpt_config const& c,
                    gpt_parallelism const& p) {
  auto const global = nn::gpt_layout(c);
  WEFT_EXPECTS_SHAPE(whole.layout().size() == global.size(), "whole",
                     ::weft::detail::concat(global.size(), " elements (gpt_layout(config))"),
                     whole.layout().size());
  WEFT_EXPECTS_SHAPE(shard.layout().size() == gpt_shard_layout(c, p).size(), "shard",
                     ::weft::detail::concat(gpt_shard_layout(c, p).size(),
                                            " elements (gpt_shard_layout(config, parallelism))"),
                     shard.layout().size());
  for (auto const& e : global.entries()) {
    if (!detail::stage_holds(e.name, c, p)) continue;
    detail::copy_piece(e, detail::piece_of(e, c, p), whole.param_span(e.name),
                       shard.param_span(e.name), true);
  }
}

//! The vocabulary rows the gpt_vocab_shard of pipeline rank p.pp_rank, tp rank p.tp_rank holds
//! under p.vocab_pipeline: the pipeline rank's vocab_shard::even(vocab, pp, pp_rank) (the first
//! vocab % pp ranks one row more, so the pipeline ranks' work differs by one row at most), split
//! evenly again over its tp ranks, contiguous in tp rank order.
[[nodiscard]] inline rl::vocab_shard gpt_vocab_rows(nn::gpt_config const& c,
                                                    gpt_parallelism const& p) {
  auto const stage = rl::vocab_shard::even(c.vocab, p.pp, p.pp_rank);
  auto const part = rl::vocab_shard::even(stage.size, p.tp, p.tp_rank);
  return {stage.begin + part.begin, part.size, c.vocab};
}

//! The parameters of rank (p.pp_rank, p.tp_rank)'s vocabulary shard under p.vocab_pipeline (the
//! vocabulary-balanced schedules): "wte" and "head", each [gpt_vocab_rows(c, p).size, d_model],
//! the global parameters' rows, in nn::gpt_layout's order, with their param_info (init_stream the
//! global one's, so gpt_vocab_init gives nn::gpt_init's rows). invalid_argument_error without
//! vocab_pipeline.
inline nn::param_layout gpt_vocab_layout(nn::gpt_config const& c, gpt_parallelism const& p) {
  detail::check_parallelism(c, p);
  WEFT_EXPECTS(p.vocab_pipeline, "gpt_parallelism::vocab_pipeline",
               "true (the vocabulary shard of the vocabulary-balanced schedules)", "false");
  auto const rows = gpt_vocab_rows(c, p);
  nn::param_layout out;
  auto const global = nn::gpt_layout(c);
  for (auto const& e : global.entries()) {
    if (e.name != "wte" && e.name != "head") continue;
    optim::param_info info = e.info;
    info.count = 0;
    info.tp_sharded = p.tp > 1;  // each tp rank its own rows (the gradient norm counts them all)
    out.add(e.name, {rows.size, e.shape[1]}, info);
  }
  return out;
}

namespace detail {
// Copies the vocabulary rows of "wte" and "head" from `from` into `to`: the whole model into a
// vocabulary shard when `to_shard`, else the shard into the whole model.
template <class From, class To>
void copy_vocab_rows(From const& from, To& to, nn::gpt_config const& c, gpt_parallelism const& p,
                     bool to_shard) {
  auto const rows = gpt_vocab_rows(c, p);
  auto const global = nn::gpt_layout(c);
  for (auto const& e : global.entries()) {
    if (e.name != "wte" && e.name != "head") continue;
    gpt_piece const piece{e.shape, 0, {vocab_rows(rows)}};
    copy_piece(e, piece, from.param_span(e.name), to.param_span(e.name), to_shard);
  }
}
template <class T>
void expect_vocab_store(nn::param_store<T> const& store, nn::gpt_config const& c,
                        gpt_parallelism const& p, char const* what) {
  auto const want = gpt_vocab_layout(c, p).size();
  WEFT_EXPECTS_SHAPE(
      store.layout().size() == want, what,
      ::weft::detail::concat(want, " elements (gpt_vocab_layout(config, parallelism))"),
      store.layout().size());
}
}  // namespace detail

//! nn::gpt_init for a vocabulary shard laid out by gpt_vocab_layout(c, p): bit for bit the rows
//! of the single-device initialisation with the same seed.
template <class T>
void gpt_vocab_init(nn::param_store<T>& store, nn::gpt_config const& c, gpt_parallelism const& p,
                    std::uint64_t seed) {
  detail::expect_vocab_store(store, c, p, "store");
  auto const rows = gpt_vocab_rows(c, p);
  auto const global = nn::gpt_layout(c);
  for (auto const& e : global.entries()) {
    if (e.name != "wte" && e.name != "head") continue;
    rng const gen(seed, store.layout().at(e.name).info.init_stream);
    fill_normal_shard(store.template param<2>(e.name), gen, 0.0, 0.02, e.shape, 0,
                      std::vector<shard_piece>{vocab_rows(rows)});
  }
}

//! Copies a vocabulary shard's rows of "wte" and "head" out of a single-device store laid out by
//! nn::gpt_layout(c) (gpt_load_shard's counterpart for gpt_vocab_layout).
template <class T>
void gpt_vocab_load(nn::param_store<T>& shard, nn::param_store<T>& whole, nn::gpt_config const& c,
                    gpt_parallelism const& p) {
  WEFT_EXPECTS_SHAPE(
      whole.layout().size() == nn::gpt_layout(c).size(), "whole",
      ::weft::detail::concat(nn::gpt_layout(c).size(), " elements (gpt_layout(config))"),
      whole.layout().size());
  detail::expect_vocab_store(shard, c, p, "shard");
  detail::copy_vocab_rows(whole, shard, c, p, true);
}

namespace detail {
//! Chunk k of a rank's chunks (gpt_chunks) agrees with chunk 0 on everything but pp_rank and names
//! a stage no earlier chunk names; invalid_argument_error otherwise.
inline void check_chunk(std::vector<gpt_parallelism> const& chunks, std::size_t k) {
  auto const& q = chunks[k];
  auto const& q0 = chunks.front();
  WEFT_EXPECTS(
      q.tp == q0.tp && q.tp_rank == q0.tp_rank && q.sequence_parallel == q0.sequence_parallel &&
          q.cp == q0.cp && q.cp_rank == q0.cp_rank && q.pp == q0.pp &&
          q.vocab_pipeline == q0.vocab_pipeline,
      "chunks", "the same tp, cp, sequence parallelism, pp and vocab_pipeline in every chunk",
      ::weft::detail::concat("chunk ", k, " differs from chunk 0"));
  for (std::size_t j = 0; j < k; ++j)
    WEFT_EXPECTS(chunks[j].pp_rank != q.pp_rank, "chunks", "distinct stages (pp_rank)",
                 ::weft::detail::concat("stage ", q.pp_rank, " in chunks ", j, " and ", k));
}
}  // namespace detail

//! The whole model, laid out by nn::gpt_layout(c), on every rank of `model_group` from the
//! shards of a rank that holds several model chunks (virtual stages: gpt_chunks of an interleaved
//! or V-shape schedule, or the one chunk of a plain pipeline): chunk k's pieces come from
//! shards[k], laid out by gpt_shard_layout(c, chunks[k]). `model_group` holds one replica's
//! pieces: chunks.front().pp / chunks.size() pipeline ranks × tp (the mesh's flattened
//! {"pp", "tp"} group, or "tp" alone, or a group of one). Each rank writes its chunks' pieces into
//! zeros (a replicated parameter from tp rank 0 only), then one SUM all-reduce joins them: exact,
//! every element has one non-zero term (a -0.0 parameter arrives as +0.0). For generation on a
//! full replica after each optimizer step (a few hundred KiB for small models). Under
//! vocab_pipeline (one chunk a rank) `vocab` is the rank's gpt_vocab_shard store, whose rows of
//! "wte" and "head" join the same sum. Collective over `model_group`; invalid_argument_error
//! (before any communication) where the chunks disagree on anything but pp_rank, name a stage
//! twice, or a store is null or of another size.
template <comm::CollectiveIn<host_space> G, class T>
void gpt_gather_replica(G& model_group, std::vector<nn::param_store<T> const*> const& shards,
                        nn::param_store<T>& whole, nn::gpt_config const& c,
                        std::vector<gpt_parallelism> const& chunks,
                        nn::param_store<T> const* vocab = nullptr) {
  auto const global = nn::gpt_layout(c);
  WEFT_EXPECTS_SHAPE(whole.layout().size() == global.size(), "whole",
                     ::weft::detail::concat(global.size(), " elements (gpt_layout(config))"),
                     whole.layout().size());
  WEFT_EXPECTS(!chunks.empty(), "chunks", "at least one chunk", "none");
  WEFT_EXPECTS_SHAPE(shards.size() == chunks.size(), "shards",
                     ::weft::detail::concat(chunks.size(), " (one per chunk)"), shards.size());
  auto const& q0 = chunks.front();
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    auto const& q = chunks[k];
    detail::check_chunk(chunks, k);
    WEFT_EXPECTS(shards[k] != nullptr, "shards", "a store per chunk",
                 ::weft::detail::concat("null at chunk ", k));
    auto const want = gpt_shard_layout(c, q).size();
    WEFT_EXPECTS_SHAPE(shards[k]->layout().size() == want, "shards",
                       ::weft::detail::concat(want, " elements in chunk ", k,
                                              " (gpt_shard_layout(config, chunks[k]))"),
                       shards[k]->layout().size());
  }
  auto const n_chunks = static_cast<int>(chunks.size());
  if (q0.vocab_pipeline) {
    WEFT_EXPECTS(n_chunks == 1, "chunks", "one chunk a rank under vocab_pipeline", n_chunks);
    WEFT_EXPECTS(vocab != nullptr, "vocab", "the rank's vocabulary shard under vocab_pipeline",
                 "null");
    detail::expect_vocab_store(*vocab, c, q0, "vocab");
  } else {
    WEFT_EXPECTS(vocab == nullptr, "vocab", "null without vocab_pipeline", "a store");
  }
  WEFT_EXPECTS(q0.pp % n_chunks == 0, "chunks",
               ::weft::detail::concat("a number dividing pp = ", q0.pp), n_chunks);
  WEFT_EXPECTS(model_group.size() == q0.pp / n_chunks * q0.tp, "model_group.size()",
               ::weft::detail::concat("pp / chunks * tp = ", q0.pp / n_chunks * q0.tp),
               model_group.size());
  auto all = whole.params();
  std::fill(all.begin(), all.end(), T(0));
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    auto const& q = chunks[k];
    for (auto const& e : global.entries()) {
      if (!detail::stage_holds(e.name, c, q)) continue;
      auto const piece = detail::piece_of(e, c, q);
      if (piece.dim < 0 && q.tp_rank != 0) continue;
      detail::copy_piece(e, piece, shards[k]->param_span(e.name), whole.param_span(e.name), false);
    }
  }
  if (vocab != nullptr) detail::copy_vocab_rows(*vocab, whole, c, q0, false);
  if (model_group.size() > 1) comm::all_reduce(model_group, all, comm::reduce_kind::sum).wait();
}

//! The same over the stores as gpt_pipeline_chunks takes them (mutable pointers).
template <comm::CollectiveIn<host_space> G, class T>
void gpt_gather_replica(G& model_group, std::vector<nn::param_store<T>*> const& shards,
                        nn::param_store<T>& whole, nn::gpt_config const& c,
                        std::vector<gpt_parallelism> const& chunks,
                        nn::param_store<T> const* vocab = nullptr) {
  gpt_gather_replica(model_group,
                     std::vector<nn::param_store<T> const*>(shards.begin(), shards.end()), whole, c,
                     chunks, vocab);
}

//! gpt_gather_replica of a rank that holds one chunk: its stage of a plain pipeline (or the whole
//! model's layers, pp = 1). `model_group` holds pp × tp ranks.
template <comm::CollectiveIn<host_space> G, class T>
void gpt_gather_replica(G& model_group, nn::param_store<T> const& shard, nn::param_store<T>& whole,
                        nn::gpt_config const& c, gpt_parallelism const& p,
                        nn::param_store<T> const* vocab = nullptr) {
  WEFT_EXPECTS_SHAPE(shard.layout().size() == gpt_shard_layout(c, p).size(), "shard",
                     ::weft::detail::concat(gpt_shard_layout(c, p).size(),
                                            " elements (gpt_shard_layout(config, parallelism))"),
                     shard.layout().size());
  WEFT_EXPECTS(model_group.size() == p.pp * p.tp, "model_group.size()",
               ::weft::detail::concat("pp * tp = ", p.pp * p.tp), model_group.size());
  gpt_gather_replica(model_group, std::vector<nn::param_store<T> const*>{&shard}, whole, c,
                     std::vector<gpt_parallelism>{p}, vocab);
}

}  // namespace weft::parallel
