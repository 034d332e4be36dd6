// weft/comm/threads/options.hpp — the settings of a threads-backend world: the default deadline
// of every blocking wait, the length of each communicator's operation history, and the size
// below which all_reduce goes through staging buffers in a single barrier, and the size from which
// its zero-copy path writes by non-temporal stores.
#pragma once

#include <chrono>
#include <cstddef>

namespace weft::comm::threads {

struct options {
  //! Deadline of every wait for peers unless a call passes op_options::timeout. A rank that does
  //! not arrive within it makes the others throw timeout_error naming it.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  //! How many operations history() keeps per communicator (0 keeps none).
  std::size_t history_size = 64;
  //! all_reduce of at most this many bytes copies its input to a staging buffer and completes
  //! after one barrier (every rank reduces everything); larger ones are zero-copy: rank r reduces
  //! slice r of all inputs and writes it into every rank's output (a reduce-scatter fused with a
  //! pushed all-gather; two barriers). 0 always takes the latter.
  std::size_t small_message_bytes = 64 * 1024;
  //! The zero-copy all_reduce of at least this many bytes writes the reduced slices into the
  //! ranks' outputs by non-temporal stores (x86; elsewhere ordinary ones): no read for ownership
  //! of the destination lines, which a message larger than the caches would fetch from DRAM
  //! only to overwrite them, but the outputs are not left in cache either. 0: always;
  //! SIZE_MAX: never.
  std::size_t streaming_store_bytes = std::size_t{4} << 20;
};

}  // namespace weft::comm::threads
