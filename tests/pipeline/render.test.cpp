// Tests for weft/pipeline/render.hpp: the text picture against a hand-derived golden, and the SVG
// against the simulated timeline (one labelled box per compute action, at its start and width,
// the bubble in the title, a time axis, escaped text).
#include <weft/pipeline/render.hpp>
#include <weft/pipeline/schedules/one_f_one_b.hpp>
#include <weft/pipeline/schedules/vocab.hpp>
#include <weft/pipeline/simulate.hpp>

#include "pipeline/note_costs.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <string>

using namespace weft::pipeline;

namespace {
std::size_t count(std::string const& hay, std::string const& needle) {
  std::size_t n = 0;
  for (auto at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("render: text picture of 1F1B p=2, m=2 matches the hand-derived timeline") {
  // Rank 0: F0 [0,1] F1 [1,2] idle B0 [4,6] idle B1 [7,9]; rank 1: F0 [1,2] B0 [2,4] F1 [4,5]
  // B1 [5,7]; half a time unit per character.
  auto const s = one_f_one_b(2, 2);
  auto const text = render_text(s, simulate_note(s), {"1F1B", 0.5, 0});
  CHECK(text ==
        "1F1B: makespan 9, bubble 50% of busy time (rate 33.3%) [one character = 0.5]\n"
        " 0 |F0F1....B0--..B1--|\n"
        " 1 |..F0B0--F1B1--....|\n");
}

TEST_CASE("render: the SVG has one box per compute action where the simulation put it") {
  auto const s = one_f_one_b(4, 8);
  auto const sim = simulate_note(s);
  svg_options o;
  o.title = "1F1B <p=4>";
  o.width = 56 + 16 + 330;  // 10 pixels per time unit
  auto const svg = render_svg(s, sim, o);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") == svg.size() - 7);
  CHECK(count(svg, "<title>") == 64);  // 4 ranks x 8 microbatches x (F, B)
  CHECK(svg.find("1F1B &lt;p=4&gt;: makespan 33, bubble 37.5%") != std::string::npos);
  // Rank 3's B0 runs [4, 6]: x = 56 + 40, width 20, row 3 at y = 40 + 3*26 + 2.
  CHECK(svg.find("<rect x=\"96\" y=\"120\" width=\"20\" height=\"22\" fill=\"#ff9800\"") !=
        std::string::npos);
  CHECK(svg.find("<title>3B0 [4, 6]</title>") != std::string::npos);
  // Axis ticks every 5 units up to 30.
  CHECK(svg.find(">30</text>") != std::string::npos);
  CHECK(svg.find(">35</text>") == std::string::npos);
}

TEST_CASE("render: vocabulary schedules draw their passes and the collective stream") {
  auto const s = vocab_one_f_one_b(4, 8, vocab_variant::two_barrier);
  auto costs = unit_costs(s);
  costs.vocab_forward = 0.5;
  costs.vocab_backward = 0.5;
  costs.collective_latency = 0.1;
  auto const sim = simulate(s, costs);
  auto const svg = render_svg(s, sim, {"VP", 1200, 26, true});
  CHECK(svg.find(">coll</text>") != std::string::npos);
  CHECK(svg.find("<title>*C1:7</title>") != std::string::npos);
  CHECK(svg.find("#9c27b0") != std::string::npos);  // S
  auto const text = render_text(s, sim, {"VP", 0.25, 0});
  CHECK(count(text, "\n") == 5);
  CHECK(text.find("S0") != std::string::npos);
}
