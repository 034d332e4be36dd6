// weft/pipeline/text.hpp — serialising schedules: weft's text form (a header line, then one line
// of PyTorch-style action tokens per rank) and CSV (one row per rank, one action per cell, as
// PyTorch pipelining's `_dump_csv`/`_load_csv`), both round-tripping exactly.
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/action.hpp>
#include <weft/pipeline/schedule.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace weft::pipeline {

namespace detail {

inline std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

inline std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    auto const nl = text.find('\n');
    out.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return out;
}

inline int header_int(std::string_view header, std::string_view key) {
  auto const at = header.find(key);
  if (at == std::string_view::npos)
    WEFT_THROW(schedule_error, "argument `text`: expected `", key,
               "<n>` in the header line, actual `", header, "`");
  auto rest = header.substr(at + key.size());
  rest = rest.substr(0, rest.find(' '));
  int v = 0;
  if (!parse_int(rest, v))
    WEFT_THROW(schedule_error, "argument `text`: expected a number after `", key, "`, actual `",
               rest, "`");
  return v;
}

inline std::string_view header_word(std::string_view header, std::string_view key) {
  auto const at = header.find(key);
  if (at == std::string_view::npos)
    WEFT_THROW(schedule_error, "argument `text`: expected `", key,
               "...` in the header line, actual `", header, "`");
  auto rest = header.substr(at + key.size());
  return rest.substr(0, rest.find(' '));
}

}  // namespace detail

//! Weft's text form:
//!   weft-schedule ranks=4 stages=4 microbatches=8 placement=loop vocab=none
//!   0: 0F0 0SEND_F0 0F1 ...
//!   1: 1RECV_F0 1F0 ...
inline std::string to_text(schedule const& s) {
  std::string out = "weft-schedule ranks=" + std::to_string(s.num_ranks()) +
                    " stages=" + std::to_string(s.num_stages()) +
                    " microbatches=" + std::to_string(s.num_microbatches()) +
                    " placement=" + std::string(to_string(s.style())) +
                    " vocab=" + std::string(to_string(s.vocab())) + "\n";
  for (int r = 0; r < s.num_ranks(); ++r) {
    out += std::to_string(r) + ":";
    for (auto const& a : s.actions(r)) {
      out += ' ';
      out += to_string(a);
    }
    out += '\n';
  }
  return out;
}

//! Parses `to_text`'s output; `chunk` and `peer` are derived from the stage mapping.
inline schedule parse_schedule(std::string_view text) {
  auto lines = detail::split_lines(text);
  std::vector<std::string_view> body;
  for (auto l : lines) {
    l = detail::trim(l);
    if (!l.empty() && l.front() != '#') body.push_back(l);
  }
  if (body.empty() || body.front().substr(0, 13) != "weft-schedule")
    WEFT_THROW(schedule_error,
               "argument `text`: expected a first line `weft-schedule ranks=...`, actual `",
               body.empty() ? std::string_view{} : body.front(), "`");
  auto const header = body.front();
  int const ranks = detail::header_int(header, "ranks=");
  int const stages = detail::header_int(header, "stages=");
  int const mbs = detail::header_int(header, "microbatches=");
  auto const style_word = detail::header_word(header, "placement=");
  auto const vocab_word = detail::header_word(header, "vocab=");
  placement style = placement::loop;
  if (style_word == "v")
    style = placement::v;
  else if (style_word != "loop")
    WEFT_THROW(schedule_error, "argument `placement`: expected `loop` or `v`, actual `", style_word,
               "`");
  vocab_variant vocab = vocab_variant::none;
  if (vocab_word == "1-barrier")
    vocab = vocab_variant::one_barrier;
  else if (vocab_word == "2-barrier")
    vocab = vocab_variant::two_barrier;
  else if (vocab_word != "none")
    WEFT_THROW(schedule_error,
               "argument `vocab`: expected `none`, `1-barrier` or `2-barrier`, actual `",
               vocab_word, "`");
  // The rank lines are counted before the schedule is built: `ranks=` sizes it, and a header
  // alone must not make a short text allocate gigabytes.
  if (body.size() - 1 != static_cast<std::size_t>(ranks))
    WEFT_THROW(schedule_error, "argument `text`: expected ", ranks,
               " rank lines (the header's `ranks=`), actual ", body.size() - 1);
  schedule s(ranks, stages, mbs, style, vocab);
  for (int r = 0; r < ranks; ++r) {
    auto line = body[static_cast<std::size_t>(r) + 1];
    auto const colon = line.find(':');
    int rank = -1;
    if (colon == std::string_view::npos ||
        !detail::parse_int(detail::trim(line.substr(0, colon)), rank) || rank != r)
      WEFT_THROW(schedule_error, "argument `text`: expected line `", r, ": ...`, actual `", line,
                 "`");
    line.remove_prefix(colon + 1);
    while (!line.empty()) {
      line = detail::trim(line);
      if (line.empty()) break;
      auto const sp = line.find(' ');
      auto a = parse_action(line.substr(0, sp));
      s.resolve(a);
      s.push(r, a);
      if (sp == std::string_view::npos) break;
      line.remove_prefix(sp);
    }
  }
  return s;
}

//! CSV as PyTorch pipelining writes it: one row per rank, one action per cell.
inline std::string to_csv(schedule const& s) {
  std::string out;
  for (int r = 0; r < s.num_ranks(); ++r) {
    bool first = true;
    for (auto const& a : s.actions(r)) {
      if (!first) out += ',';
      first = false;
      out += to_string(a);
    }
    out += '\n';
  }
  return out;
}

namespace detail {

//! One CSV cell into `row`: an action, or PyTorch's `(F;B)OVERLAP_F_B` pair as its two actions.
inline void push_csv_cell(std::vector<action>& row, std::string_view cell) {
  constexpr std::string_view overlap = ")OVERLAP_F_B";
  if (cell.front() != '(') {
    row.push_back(parse_action(cell));
    return;
  }
  auto const semicolon = cell.find(';');
  bool const shaped =
      cell.size() > overlap.size() && cell.substr(cell.size() - overlap.size()) == overlap &&
      semicolon != std::string_view::npos && semicolon < cell.size() - overlap.size();
  if (!shaped)
    WEFT_THROW(schedule_error,
               "argument `text`: expected an overlapped pair such as `(0F7;7B3)OVERLAP_F_B`, "
               "actual `",
               cell, "`");
  action const f = parse_action(cell.substr(1, semicolon - 1));
  action const b =
      parse_action(cell.substr(semicolon + 1, cell.size() - overlap.size() - semicolon - 1));
  if (f.kind != op::forward || (b.kind != op::backward && b.kind != op::backward_input))
    WEFT_THROW(schedule_error,
               "argument `text`: expected an overlapped pair of a forward and a backward (B or "
               "I), actual `",
               cell, "`");
  row.push_back(f);
  row.push_back(b);
}

}  // namespace detail

//! What a CSV does not say. Negative values (the defaults) are inferred: stages from the largest
//! stage index (rounded up to a multiple of the rank count), microbatches from the largest
//! microbatch, the placement from where the stages are, the vocabulary variant from the S/C1 ops.
struct csv_options {
  int stages = -1;
  int microbatches = -1;
  int placement_override = -1;  //!< -1 infer, else static_cast<int>(placement)
  int vocab_override = -1;      //!< -1 infer, else static_cast<int>(vocab_variant)
};

//! Parses a CSV schedule (PyTorch's compute-only or compute+comms files, or `to_csv`'s output).
//! Empty cells (PyTorch's idle slots) are skipped; every line, empty or not, is one rank. A cell
//! `(aFx;bBy)OVERLAP_F_B` (PyTorch's overlapped pair, as in its DualPipeV files) is read as its
//! two actions, the forward then the backward (B or I): weft runs such a pair one after the other.
inline schedule parse_csv(std::string_view text, csv_options const& opt = {}) {
  std::vector<std::vector<action>> rows;
  // Every line is a rank's row, an empty one included (a rank with nothing to do).
  for (auto line : detail::split_lines(text)) {
    line = detail::trim(line);
    std::vector<action> row;
    while (true) {
      auto const comma = line.find(',');
      auto cell = detail::trim(line.substr(0, comma));
      if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"')
        cell = cell.substr(1, cell.size() - 2);
      if (!cell.empty()) detail::push_csv_cell(row, cell);
      if (comma == std::string_view::npos) break;
      line.remove_prefix(comma + 1);
    }
    rows.push_back(std::move(row));
  }
  if (rows.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    WEFT_THROW(schedule_error, "argument `text`: expected fewer than 2^31 CSV rows, actual ",
               rows.size());
  int const ranks = static_cast<int>(rows.size());
  if (ranks < 1)
    WEFT_THROW(schedule_error, "argument `text`: expected at least one CSV row, actual 0");
  int max_stage = -1, max_mb = -1;
  bool has_s = false, has_c1 = false;
  for (auto const& row : rows)
    for (auto const& a : row) {
      if (a.kind != op::collective && !is_vocab_compute(a.kind))
        max_stage = std::max(max_stage, a.stage);
      if (a.kind != op::collective) max_mb = std::max(max_mb, a.microbatch);
      has_s = has_s || a.kind == op::vocab_forward;
      has_c1 = has_c1 || (a.kind == op::collective && a.tag == collective_kind::c1);
    }
  if (opt.placement_override < -1 || opt.placement_override > static_cast<int>(placement::v))
    WEFT_THROW(schedule_error, ::weft::detail::expectation_message(
                                   "placement_override in [-1, 1]", "opt.placement_override",
                                   "-1 (infer), 0 (loop) or 1 (v)", opt.placement_override));
  if (opt.vocab_override < -1 || opt.vocab_override > static_cast<int>(vocab_variant::two_barrier))
    WEFT_THROW(schedule_error,
               ::weft::detail::expectation_message(
                   "vocab_override in [-1, 2]", "opt.vocab_override",
                   "-1 (infer), 0 (none), 1 (1-barrier) or 2 (2-barrier)", opt.vocab_override));
  // Inferred sizes in 64 bits: a stage or microbatch index near INT_MAX must not overflow.
  long long stages = opt.stages;
  if (stages < 0)
    stages = std::max<long long>(ranks, ((max_stage + 1LL + ranks - 1) / ranks) * ranks);
  long long const mbs = opt.microbatches >= 0 ? opt.microbatches : std::max(1LL, max_mb + 1LL);
  if (stages > std::numeric_limits<int>::max() || mbs > std::numeric_limits<int>::max())
    WEFT_THROW(schedule_error, "argument `text`: expected stage and microbatch indices below ",
               std::numeric_limits<int>::max(), ", actual a CSV implying ", stages, " stages and ",
               mbs, " microbatches");
  placement style = placement::loop;
  if (opt.placement_override >= 0) {
    style = static_cast<placement>(opt.placement_override);
  } else {
    auto fits = [&](placement p) {
      for (int r = 0; r < ranks; ++r)
        for (auto const& a : rows[static_cast<std::size_t>(r)])
          if (a.kind != op::collective && !is_vocab_compute(a.kind) &&
              stage_to_rank(p, ranks, a.stage) != r)
            return false;
      return true;
    };
    if (fits(placement::loop))
      style = placement::loop;
    else if (fits(placement::v))
      style = placement::v;
    else
      WEFT_THROW(schedule_error,
                 "argument `text`: expected stages placed in a loop (s % p) or a V, actual a CSV "
                 "whose stages fit neither");
  }
  vocab_variant vocab = has_c1  ? vocab_variant::two_barrier
                        : has_s ? vocab_variant::one_barrier
                                : vocab_variant::none;
  if (opt.vocab_override >= 0) vocab = static_cast<vocab_variant>(opt.vocab_override);
  schedule s(ranks, static_cast<int>(stages), static_cast<int>(mbs), style, vocab);
  for (int r = 0; r < ranks; ++r)
    for (auto a : rows[static_cast<std::size_t>(r)]) {
      s.resolve(a);
      s.push(r, a);
    }
  return s;
}

}  // namespace weft::pipeline
