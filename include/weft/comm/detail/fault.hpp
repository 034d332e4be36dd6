// weft/comm/detail/fault.hpp — why a communicator is dead, and the one mapping from that record to
// the exception every backend throws (timeout_error, peer_aborted_error, mismatch_error,
// backend_error, comm_error), including the one message of a call after a local abort().
#pragma once

#include <weft/core/error.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace weft::comm::detail {

//! The first fault of a communicator. `origin` is the rank that caused or detected it (-1 when
//! unknown), `missing` the ranks a timeout waited for, `backend` and `code` the failing library
//! and its result for errc::backend.
struct fault {
  errc kind = errc::comm;
  std::string message;
  int origin = -1;
  std::vector<int> missing;
  std::string backend;
  long long code = 0;
};

//! Throws the exception of `f`, its message prefixed by `context` ("all_reduce on rank 1 (seq 4)";
//! none when empty). `where` is the backend's call site, which the message shows.
[[noreturn]] inline void rethrow(fault const& f, std::string_view context,
                                 source_location where = source_location::current()) {
  std::string_view const text =
      f.message.empty() ? std::string_view("the communicator is poisoned") : f.message;
  std::string const msg =
      context.empty() ? std::string(text) : weft::detail::concat(context, ": ", text);
  switch (f.kind) {
    case errc::timeout: throw timeout_error(msg, f.missing, where);
    case errc::peer_aborted: throw peer_aborted_error(msg, f.origin, where);
    case errc::mismatch: throw mismatch_error(msg, where);
    case errc::backend:
      throw backend_error(msg, f.backend.empty() ? std::string_view("unknown") : f.backend, f.code,
                          where);
    default: throw comm_error(msg, where);
  }
}

//! The fault a local abort() leaves: every later call on every backend throws peer_aborted_error
//! naming this rank as the origin ("rank 2 called abort()").
inline fault aborted_fault(std::string_view who, int rank) {
  return fault{errc::peer_aborted, weft::detail::concat(who, " called abort()"), rank, {}, {}, 0};
}

//! The exception of any call on a communicator that abort() was called on locally.
[[noreturn]] inline void throw_aborted(std::string_view context, std::string_view who, int rank,
                                       source_location where = source_location::current()) {
  rethrow(aborted_fault(who, rank), weft::detail::concat(context, " on an aborted communicator"),
          where);
}

}  // namespace weft::comm::detail
