// weft/pipeline/schedule.hpp — a pipeline schedule as a value: one action list per rank plus the
// stage-to-rank mapping (looped or V-shaped). The validator, simulator, renderers and lowering take
// this one type (`schedule const&`); there is no Schedule concept until something generic needs
// one.
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/action.hpp>

#include <concepts>
#include <cstddef>
#include <ranges>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::pipeline {

//! How global stages map to ranks. `loop`: stage s on rank s % p (Megatron's interleaving).
//! `v`: chunk c = s / p runs left to right on even chunks and right to left on odd ones, so rank r
//! holds stages r and 2p-1-r (ZBV, V-Half); the turn of the V is a local hand-over.
enum class placement : std::uint8_t { loop, v };

//! Whether the output and input layers are vocabulary-parallel, and with how many all-reduce
//! barriers on the output side (C0 only, or C0 and C1). Named by barrier count on purpose: the
//! paper's "Vocab-1" is the 2-barrier variant.
enum class vocab_variant : std::uint8_t { none, one_barrier, two_barrier };

constexpr std::string_view to_string(placement p) noexcept {
  return p == placement::loop ? "loop" : "v";
}
constexpr std::string_view to_string(vocab_variant v) noexcept {
  switch (v) {
    case vocab_variant::none: return "none";
    case vocab_variant::one_barrier: return "1-barrier";
    case vocab_variant::two_barrier: return "2-barrier";
  }
  return "?";
}

//! Rank of global stage `stage` under `style` with `ranks` ranks.
constexpr int stage_to_rank(placement style, int ranks, int stage) noexcept {
  int const chunk = stage / ranks;
  int const within = stage % ranks;
  if (style == placement::v && chunk % 2 == 1) return ranks - 1 - within;
  return within;
}

//! A pipeline schedule: for every rank, the ordered actions it performs. A schedule is either
//! compute-only (no SEND/RECV: cross-rank data moves implicitly) or lowered (every cross-rank
//! dependency goes through a SEND/RECV pair, see lower.hpp). Invariants checked here: ranks >= 1,
//! stages a positive multiple of ranks, microbatches >= 1; everything else is `validate`'s job.
class schedule {
 public:
  schedule() = default;
  schedule(int ranks, int stages, int microbatches, placement style = placement::loop,
           vocab_variant vocab = vocab_variant::none)
      : ranks_(ranks), stages_(stages), microbatches_(microbatches), style_(style), vocab_(vocab) {
    if (ranks < 1)
      WEFT_THROW(schedule_error,
                 ::weft::detail::expectation_message("ranks >= 1", "ranks", ">= 1", ranks));
    if (stages < ranks || stages % ranks != 0)
      WEFT_THROW(schedule_error,
                 ::weft::detail::expectation_message(
                     "stages % ranks == 0", "stages",
                     ::weft::detail::concat("a positive multiple of ranks (", ranks, ")"), stages));
    if (microbatches < 1)
      WEFT_THROW(schedule_error, ::weft::detail::expectation_message(
                                     "microbatches >= 1", "microbatches", ">= 1", microbatches));
    programs_.resize(static_cast<std::size_t>(ranks));
  }

  [[nodiscard]] int num_ranks() const noexcept { return ranks_; }
  [[nodiscard]] int num_stages() const noexcept { return stages_; }
  [[nodiscard]] int num_microbatches() const noexcept { return microbatches_; }
  //! Model chunks (virtual stages) per rank.
  [[nodiscard]] int num_chunks() const noexcept { return ranks_ > 0 ? stages_ / ranks_ : 0; }
  [[nodiscard]] placement style() const noexcept { return style_; }
  [[nodiscard]] vocab_variant vocab() const noexcept { return vocab_; }

  [[nodiscard]] int stage_to_rank(int stage) const noexcept {
    return pipeline::stage_to_rank(style_, ranks_, stage);
  }
  [[nodiscard]] int chunk_of(int stage) const noexcept { return stage / ranks_; }
  //! The stage that chunk `chunk` of rank `rank` is (the inverse of stage_to_rank and chunk_of):
  //! chunk * ranks + rank, or chunk * ranks + ranks - 1 - rank on an odd chunk of a V.
  //! schedule_error unless 0 <= rank < num_ranks() and 0 <= chunk < num_chunks().
  [[nodiscard]] int stage_at(int rank, int chunk) const {
    check_rank(rank);
    if (chunk < 0 || chunk >= num_chunks())
      WEFT_THROW(schedule_error, ::weft::detail::expectation_message(
                                     "0 <= chunk < num_chunks", "chunk",
                                     ::weft::detail::concat("in [0, ", num_chunks(), ")"), chunk));
    bool const reversed = style_ == placement::v && chunk % 2 == 1;
    return chunk * ranks_ + (reversed ? ranks_ - 1 - rank : rank);
  }

  //! Rank `rank`'s program; schedule_error unless 0 <= rank < num_ranks().
  [[nodiscard]] std::vector<action> const& actions(int rank) const {
    check_rank(rank);
    return programs_[static_cast<std::size_t>(rank)];
  }
  [[nodiscard]] std::vector<action>& actions(int rank) {
    check_rank(rank);
    return programs_[static_cast<std::size_t>(rank)];
  }

  //! A compute or point-to-point action on `stage` with `chunk` and `peer` derived from the
  //! mapping.
  [[nodiscard]] action make(op kind, int stage, int microbatch) const {
    action a{kind, stage, microbatch, 0, -1, collective_kind::none};
    resolve(a);
    return a;
  }
  [[nodiscard]] static action make_collective(collective_kind tag, int microbatch) noexcept {
    return action{op::collective, -1, microbatch, 0, -1, tag};
  }

  //! Fills the derived fields (`chunk`, `peer`) of an action from the stage mapping, as written by
  //! the generators; the text form omits them.
  void resolve(action& a) const noexcept {
    a.chunk = 0;
    a.peer = -1;
    if (a.kind == op::collective) {
      a.stage = -1;
      return;
    }
    if (is_vocab_compute(a.kind)) return;  // stage is the rank; chunk stays 0
    a.chunk = a.stage >= 0 ? chunk_of(a.stage) : 0;
    // A stage outside [0, stages) (a parsed file may hold one) gets no peer: `validate` reports it,
    // and stage + 1 cannot overflow.
    if (a.stage < 0 || a.stage >= stages_) return;
    if (a.kind == op::send_forward || a.kind == op::recv_backward)
      a.peer = stage_to_rank(a.stage + 1);
    if (a.kind == op::recv_forward || a.kind == op::send_backward)
      a.peer = stage_to_rank(a.stage - 1);
  }

  void push(int rank, action a) { actions(rank).push_back(a); }

  //! True when some rank holds a SEND or RECV (the lowered form).
  [[nodiscard]] bool has_p2p() const noexcept {
    for (auto const& prog : programs_)
      for (auto const& a : prog)
        if (is_p2p(a.kind)) return true;
    return false;
  }

  [[nodiscard]] std::size_t total_actions() const noexcept {
    std::size_t n = 0;
    for (auto const& prog : programs_) n += prog.size();
    return n;
  }

  friend bool operator==(schedule const&, schedule const&) = default;

 private:
  void check_rank(int rank) const {
    if (rank < 0 || rank >= ranks_)
      WEFT_THROW(schedule_error, ::weft::detail::expectation_message(
                                     "0 <= rank < num_ranks", "rank",
                                     ::weft::detail::concat("in [0, ", ranks_, ")"), rank));
  }

  int ranks_ = 0;
  int stages_ = 0;
  int microbatches_ = 0;
  placement style_ = placement::loop;
  vocab_variant vocab_ = vocab_variant::none;
  std::vector<std::vector<action>> programs_;
};

}  // namespace weft::pipeline
