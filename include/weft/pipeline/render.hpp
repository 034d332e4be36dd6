// weft/pipeline/render.hpp — drawings of a simulated schedule: an SVG in the style of the
// pipeline papers' figures (one row per rank, boxes coloured by op and labelled by microbatch, a
// time axis, the bubble in the title) and a compact text rendering for terminals.
#pragma once

#include <weft/pipeline/action.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/simulate.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace weft::pipeline {

struct svg_options {
  std::string title;             //!< shown before the makespan and bubble
  double width = 1200;           //!< pixels for the whole picture
  double row_height = 26;        //!< pixels per rank
  bool show_collectives = true;  //!< a last row with the collective stream
};

struct text_options {
  std::string title;
  double step = 0;    //!< time per character; 0 picks one that fits `columns`
  int columns = 120;  //!< target width of the timeline when step is 0
};

namespace detail {

inline std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

inline std::string fmt(double x, int digits = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  std::string s = buf;
  if (s.find('.') != std::string::npos) {
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
  }
  return s;
}

//! Fill colour per op (PyTorch's visualiser: F blue, I teal, W green, B orange; vocabulary passes
//! purple and pink, embedding passes grey); later chunks are drawn lighter.
inline std::string op_colour(op k, int chunk) {
  int r = 0, g = 0, b = 0;
  switch (k) {
    case op::forward: r = 66, g = 133, b = 244; break;
    case op::backward_input: r = 0, g = 150, b = 136; break;
    case op::backward_weight: r = 76, g = 175, b = 80; break;
    case op::backward: r = 255, g = 152, b = 0; break;
    case op::vocab_forward: r = 156, g = 39, b = 176; break;
    case op::vocab_backward: r = 233, g = 30, b = 99; break;
    case op::input_forward:
    case op::input_backward: r = 120, g = 120, b = 120; break;
    default: r = 0, g = 0, b = 0; break;
  }
  double const mix = std::min(0.6, 0.3 * chunk);  // toward white
  auto lift = [mix](int c) { return static_cast<int>(std::lround(c + (255 - c) * mix)); };
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", lift(r), lift(g), lift(b));
  return buf;
}

inline std::string summary(std::string const& title, simulation const& sim) {
  std::string t = title.empty() ? std::string() : title + ": ";
  return t + "makespan " + fmt(sim.makespan) + ", bubble " + fmt(100.0 * sim.bubble_fraction, 1) +
         "% of busy time (rate " + fmt(100.0 * sim.bubble_rate, 1) + "%)";
}

}  // namespace detail

//! An SVG picture of `sim` (from simulate(s, ...)): a row per rank, a box per compute action from
//! its start to its finish, labelled with its microbatch, a time axis and the bubble in the title.
inline std::string render_svg(schedule const& s, simulation const& sim, svg_options const& o = {}) {
  int const p = s.num_ranks();
  double const left = 56, right = 16, top = 40, axis = 28;
  bool const colls = o.show_collectives && !sim.collective_order.empty();
  int const rows = p + (colls ? 1 : 0);
  double const height = top + rows * o.row_height + axis + 8;
  double const span = sim.makespan > 0 ? sim.makespan : 1.0;
  double const scale = (o.width - left - right) / span;
  auto x = [&](double t) { return left + t * scale; };
  std::string out;
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + detail::fmt(o.width) +
         "\" height=\"" + detail::fmt(height) + "\" viewBox=\"0 0 " + detail::fmt(o.width) + " " +
         detail::fmt(height) + "\" font-family=\"sans-serif\">\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out += "<text x=\"" + detail::fmt(left) + "\" y=\"22\" font-size=\"15\">" +
         detail::xml_escape(detail::summary(o.title, sim)) + "</text>\n";
  for (int r = 0; r < rows; ++r) {
    double const y = top + r * o.row_height;
    out += "<text x=\"" + detail::fmt(left - 8) + "\" y=\"" + detail::fmt(y + o.row_height * 0.65) +
           "\" font-size=\"12\" text-anchor=\"end\">" +
           (r < p ? "rank " + std::to_string(r) : std::string("coll")) + "</text>\n";
    out += "<rect x=\"" + detail::fmt(left) + "\" y=\"" + detail::fmt(y + 2) + "\" width=\"" +
           detail::fmt(span * scale) + "\" height=\"" + detail::fmt(o.row_height - 4) +
           "\" fill=\"#f3f3f3\"/>\n";
  }
  for (int r = 0; r < p; ++r) {
    double const y = top + r * o.row_height;
    auto const& prog = s.actions(r);
    for (std::size_t i = 0; i < prog.size(); ++i) {
      auto const& a = prog[i];
      if (!is_compute(a.kind)) continue;
      auto const& t = sim.times[static_cast<std::size_t>(r)][i];
      double const w = std::max((t.finish - t.start) * scale, 0.5);
      out += "<rect x=\"" + detail::fmt(x(t.start)) + "\" y=\"" + detail::fmt(y + 2) +
             "\" width=\"" + detail::fmt(w) + "\" height=\"" + detail::fmt(o.row_height - 4) +
             "\" fill=\"" + detail::op_colour(a.kind, a.chunk) +
             "\" stroke=\"white\" stroke-width=\"0.6\"><title>" + detail::xml_escape(to_string(a)) +
             " [" + detail::fmt(t.start) + ", " + detail::fmt(t.finish) + "]</title></rect>\n";
      std::string const label = std::to_string(a.microbatch);
      if (w >= 7.0 * static_cast<double>(label.size()) + 2)
        out += "<text x=\"" + detail::fmt(x(t.start) + w / 2) + "\" y=\"" +
               detail::fmt(y + o.row_height * 0.65) +
               "\" font-size=\"11\" text-anchor=\"middle\" fill=\"white\">" + label + "</text>\n";
    }
  }
  if (colls) {
    double const y = top + p * o.row_height;
    for (std::size_t k = 0; k < sim.collective_order.size(); ++k) {
      auto const& t = sim.collective_times[k];
      double const w = std::max((t.finish - t.start) * scale, 1.5);
      out += "<rect x=\"" + detail::fmt(x(t.start)) + "\" y=\"" + detail::fmt(y + 6) +
             "\" width=\"" + detail::fmt(w) + "\" height=\"" + detail::fmt(o.row_height - 12) +
             "\" fill=\"#333333\"><title>" +
             detail::xml_escape(to_string(sim.collective_order[k])) + "</title></rect>\n";
    }
  }
  // Time axis: about ten ticks at a round step.
  double const raw = span / 10.0;
  double const mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (f * mag >= raw) {
      step = f * mag;
      break;
    }
  double const ya = top + rows * o.row_height + 4;
  out += "<line x1=\"" + detail::fmt(left) + "\" y1=\"" + detail::fmt(ya) + "\" x2=\"" +
         detail::fmt(x(span)) + "\" y2=\"" + detail::fmt(ya) + "\" stroke=\"black\"/>\n";
  for (double t = 0; t <= span + 1e-9; t += step) {
    out += "<line x1=\"" + detail::fmt(x(t)) + "\" y1=\"" + detail::fmt(ya) + "\" x2=\"" +
           detail::fmt(x(t)) + "\" y2=\"" + detail::fmt(ya + 5) + "\" stroke=\"black\"/>\n";
    out += "<text x=\"" + detail::fmt(x(t)) + "\" y=\"" + detail::fmt(ya + 18) +
           "\" font-size=\"11\" text-anchor=\"middle\">" + detail::fmt(t) + "</text>\n";
  }
  out += "</svg>\n";
  return out;
}

//! A compact text picture: one line per rank, one character per `step` of time. A box shows its
//! op letter (lower case for odd chunks; S, T and `i`/`e` for IF/IB) followed by its microbatch
//! when it fits and `-` after; `.` is idle.
inline std::string render_text(schedule const& s, simulation const& sim,
                               text_options const& o = {}) {
  int const p = s.num_ranks();
  double step = o.step;
  if (step <= 0) step = sim.makespan > 0 ? sim.makespan / std::max(1, o.columns) : 1.0;
  auto const cols = static_cast<std::size_t>(std::ceil(sim.makespan / step - 1e-9));
  std::string out =
      detail::summary(o.title, sim) + " [one character = " + detail::fmt(step, 3) + "]\n";
  for (int r = 0; r < p; ++r) {
    std::string row(cols, '.');
    auto const& prog = s.actions(r);
    for (std::size_t i = 0; i < prog.size(); ++i) {
      auto const& a = prog[i];
      if (!is_compute(a.kind)) continue;
      auto const& t = sim.times[static_cast<std::size_t>(r)][i];
      auto const c0 = static_cast<std::size_t>(std::lround(t.start / step));
      auto c1 = static_cast<std::size_t>(std::lround(t.finish / step));
      if (c1 <= c0) continue;  // shorter than half a character
      c1 = std::min(c1, cols);
      char letter = '?';
      switch (a.kind) {
        case op::input_forward: letter = 'i'; break;
        case op::input_backward: letter = 'e'; break;
        default: letter = to_string(a.kind)[0];
      }
      if (a.chunk % 2 == 1 && letter >= 'A' && letter <= 'Z')
        letter = static_cast<char>(letter - 'A' + 'a');
      std::string label(1, letter);
      label += std::to_string(a.microbatch);
      for (std::size_t c = c0; c < c1; ++c) {
        std::size_t const k = c - c0;
        row[c] = (label.size() <= c1 - c0 && k < label.size()) ? label[k] : (k == 0 ? letter : '-');
      }
    }
    out += (r < 10 ? " " : "") + std::to_string(r) + " |" + row + "|\n";
  }
  return out;
}

}  // namespace weft::pipeline
