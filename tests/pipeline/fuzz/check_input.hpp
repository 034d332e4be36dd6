// What every schedule file, valid or not, must give: a schedule or a weft::schedule_error from the
// text and CSV parsers, and then from validate, simulate and lower; nothing else thrown, no crash.
// Shared by the libFuzzer targets and the regression test that replays their corpus.
#pragma once

#include <weft/core/error.hpp>
#include <weft/pipeline/lower.hpp>
#include <weft/pipeline/simulate.hpp>
#include <weft/pipeline/text.hpp>
#include <weft/pipeline/validate.hpp>

#include <string_view>

namespace weft_fuzz {

//! Runs parse (text form) -> validate -> simulate -> lower -> simulate on `bytes`. Returns normally
//! when each step gave its result or a schedule_error; anything else propagates.
inline void check_text(std::string_view bytes) {
  using namespace weft::pipeline;
  schedule s;
  try {
    s = parse_schedule(bytes);
  } catch (weft::schedule_error const&) {
    return;
  }
  // A parsed schedule prints and parses back to itself.
  if (!(parse_schedule(to_text(s)) == s))
    throw std::logic_error("text round trip changed a schedule");
  bool const valid = check(s).ok;
  try {
    validate(s);
  } catch (weft::schedule_error const&) {}
  try {
    (void)simulate(s);
  } catch (weft::schedule_error const&) {}
  if (valid && !s.has_p2p()) {
    auto const low = lower(s);
    validate(low);  // lowering a valid schedule gives a valid one: a schedule_error here is a bug
  } else {
    try {
      (void)lower(s);
    } catch (weft::schedule_error const&) {}
  }
}

//! The same through the CSV parser; the CSV of a parsed schedule parses back to it.
inline void check_csv(std::string_view bytes) {
  using namespace weft::pipeline;
  schedule s;
  try {
    s = parse_csv(bytes);
  } catch (weft::schedule_error const&) {
    return;
  }
  csv_options same;
  same.stages = s.num_stages();
  same.microbatches = s.num_microbatches();
  same.placement_override = static_cast<int>(s.style());
  same.vocab_override = static_cast<int>(s.vocab());
  if (!(parse_csv(to_csv(s), same) == s))
    throw std::logic_error("CSV round trip changed a schedule");
  try {
    validate(s);
  } catch (weft::schedule_error const&) {}
  try {
    (void)simulate(s);
  } catch (weft::schedule_error const&) {}
  try {
    (void)lower(s);
  } catch (weft::schedule_error const&) {}
}

}  // namespace weft_fuzz
