// weft/pipeline/action.hpp — one step of a pipeline schedule: the `op` kinds (compute, vocabulary
// passes, point-to-point send/recv, collectives), the `action` value, and its compact text form,
// which follows PyTorch pipelining's letters (`2F0`, `1I3`, `3RECV_F1`) plus `S`, `T`, `IF`, `IB`
// and collective tags (`*C0:5`).
#pragma once

#include <weft/core/error.hpp>

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace weft::pipeline {

//! What an action does. The text letters are PyTorch's where PyTorch has the op.
enum class op : std::uint8_t {
  forward,          //!< F: forward of (stage, microbatch)
  backward_input,   //!< I: backward for the input gradient only (zero-bubble split)
  backward_weight,  //!< W: backward for the weight gradient, after I of the same (stage,
                    //!< microbatch)
  backward,         //!< B: full (fused) backward = I + W
  vocab_forward,    //!< S: output-layer shard pass (logits, softmax stats; in the 1-barrier variant
                    //!<    also the input-gradient partial); `stage` holds the rank
  vocab_backward,   //!< T: output-layer shard weight-gradient pass; `stage` holds the rank
  input_forward,    //!< IF: input-embedding shard lookup; `stage` holds the rank
  input_backward,   //!< IB: input-embedding shard weight gradient; `stage` holds the rank
  send_forward,     //!< SEND_F: stage sends its forward output to stage + 1
  recv_forward,     //!< RECV_F: stage receives its forward input from stage - 1
  send_backward,    //!< SEND_B: stage sends its input gradient to stage - 1
  recv_backward,    //!< RECV_B: stage receives its output gradient from stage + 1
  collective,       //!< a collective over all pipeline ranks; `tag` says which
};

//! The collectives of the vocabulary-parallel schedules. Each runs over all pipeline ranks (on its
//! own communicator and stream) and appears once per rank, in the same order on every rank.
enum class collective_kind : std::uint8_t {
  none,
  broadcast_output,  //!< BX:i  last stage broadcasts X_i (the output layer's input) and g_{i-1};
                     //!<       BX:m carries only g_{m-1}
  c0,            //!< C0:i  all-reduce of the S results (max, sum-exp, target logit[, input grad])
  c1,            //!< C1:i  all-reduce of the T input-gradient partials (2-barrier variant)
  reduce_input,  //!< RE:i  all-reduce of the IF partial embeddings; stage 0 consumes the sum
  broadcast_input,  //!< BE:i  stage 0 broadcasts the embedding-output gradient for IB
};

//! One step of a rank's program. `stage` is the global (virtual) stage for compute and
//! point-to-point ops and the rank for the vocabulary passes; `chunk` is the model chunk the stage
//! is on its rank (stage / ranks); `peer` is the other rank of a send or recv. Collectives carry
//! only `tag` and `microbatch`. Plain data: compare with ==.
struct action {
  op kind = op::forward;
  int stage = -1;
  int microbatch = -1;
  int chunk = 0;
  int peer = -1;
  collective_kind tag = collective_kind::none;

  friend bool operator==(action const&, action const&) = default;
};

constexpr bool is_transformer_compute(op k) noexcept {
  return k == op::forward || k == op::backward_input || k == op::backward_weight ||
         k == op::backward;
}
constexpr bool is_vocab_compute(op k) noexcept {
  return k == op::vocab_forward || k == op::vocab_backward || k == op::input_forward ||
         k == op::input_backward;
}
//! Compute runs on the rank's main stream and takes time; everything else is communication.
constexpr bool is_compute(op k) noexcept {
  return is_transformer_compute(k) || is_vocab_compute(k);
}
constexpr bool is_p2p(op k) noexcept {
  return k == op::send_forward || k == op::recv_forward || k == op::send_backward ||
         k == op::recv_backward;
}
constexpr bool is_send(op k) noexcept { return k == op::send_forward || k == op::send_backward; }
constexpr bool is_recv(op k) noexcept { return k == op::recv_forward || k == op::recv_backward; }

//! The letters of the text form (`F`, `I`, `W`, `B`, `S`, `T`, `IF`, `IB`, `SEND_F`, ...).
constexpr std::string_view to_string(op k) noexcept {
  switch (k) {
    case op::forward: return "F";
    case op::backward_input: return "I";
    case op::backward_weight: return "W";
    case op::backward: return "B";
    case op::vocab_forward: return "S";
    case op::vocab_backward: return "T";
    case op::input_forward: return "IF";
    case op::input_backward: return "IB";
    case op::send_forward: return "SEND_F";
    case op::recv_forward: return "RECV_F";
    case op::send_backward: return "SEND_B";
    case op::recv_backward: return "RECV_B";
    case op::collective: return "*";
  }
  return "?";
}

constexpr std::string_view to_string(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::none: return "-";
    case collective_kind::broadcast_output: return "BX";
    case collective_kind::c0: return "C0";
    case collective_kind::c1: return "C1";
    case collective_kind::reduce_input: return "RE";
    case collective_kind::broadcast_input: return "BE";
  }
  return "?";
}

//! Text form: `{stage}{letters}{microbatch}` (`2F0`, `3RECV_F1`, `0IF3`) or `*{tag}:{microbatch}`
//! (`*C0:5`). `chunk` and `peer` are not written: a schedule derives them from its stage mapping.
inline std::string to_string(action const& a) {
  std::string out;
  if (a.kind == op::collective) {
    out += '*';
    out += to_string(a.tag);
    out += ':';
    out += std::to_string(a.microbatch);
    return out;
  }
  out += std::to_string(a.stage);
  out += to_string(a.kind);
  out += std::to_string(a.microbatch);
  return out;
}

namespace detail {

inline bool parse_int(std::string_view s, int& out) noexcept {
  if (s.empty()) return false;
  auto const* first = s.data();
  auto const* last = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(first, last, out);
  return ec == std::errc{} && ptr == last && out >= 0;
}

[[noreturn]] inline void bad_action_text(std::string_view text) {
  WEFT_THROW(schedule_error,
             "argument `text`: expected an action such as `2F0`, `1I3`, `0W3`, `3RECV_F1`, "
             "`0IF3` or `*C0:5`, actual `",
             text, "`");
}

}  // namespace detail

//! Parses the text form written by `to_string(action)`. `chunk` and `peer` are left at their
//! defaults (0, -1); `parse_schedule` fills them in from the stage mapping.
inline action parse_action(std::string_view text) {
  action a;
  if (!text.empty() && text.front() == '*') {
    auto const colon = text.find(':');
    if (colon == std::string_view::npos) detail::bad_action_text(text);
    auto const tag = text.substr(1, colon - 1);
    a.kind = op::collective;
    if (tag == "BX")
      a.tag = collective_kind::broadcast_output;
    else if (tag == "C0")
      a.tag = collective_kind::c0;
    else if (tag == "C1")
      a.tag = collective_kind::c1;
    else if (tag == "RE")
      a.tag = collective_kind::reduce_input;
    else if (tag == "BE")
      a.tag = collective_kind::broadcast_input;
    else
      detail::bad_action_text(text);
    if (!detail::parse_int(text.substr(colon + 1), a.microbatch)) detail::bad_action_text(text);
    return a;
  }
  std::size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  std::size_t j = i;
  while (j < text.size() && ((text[j] >= 'A' && text[j] <= 'Z') || text[j] == '_')) ++j;
  if (!detail::parse_int(text.substr(0, i), a.stage) ||
      !detail::parse_int(text.substr(j), a.microbatch))
    detail::bad_action_text(text);
  auto const letters = text.substr(i, j - i);
  constexpr op all[] = {op::forward,       op::backward_input, op::backward_weight,
                        op::backward,      op::vocab_forward,  op::vocab_backward,
                        op::input_forward, op::input_backward, op::send_forward,
                        op::recv_forward,  op::send_backward,  op::recv_backward};
  for (op k : all) {
    if (to_string(k) == letters) {
      a.kind = k;
      return a;
    }
  }
  detail::bad_action_text(text);
}

}  // namespace weft::pipeline
