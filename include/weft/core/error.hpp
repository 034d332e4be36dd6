// weft/core/error.hpp — the one exception hierarchy every weft area throws, and the checking
// macros that build messages naming the argument, the expected and the actual value.
// Host code throws; device code uses WEFT_ASSERT (debug only).
#pragma once

#include <weft/core/config.hpp>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if WEFT_HAS_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif
#if WEFT_HAS_NCCL
#include <nccl.h>
#endif
#if WEFT_HAS_MPI
#include <mpi.h>
#endif

namespace weft {

// std::source_location where the library provides it. libstdc++ 12 hides it from clang 14 (it
// needs __builtin_source_location, which clang gained in 15), so weft carries an equivalent built
// on the __builtin_FILE/LINE/FUNCTION intrinsics that every supported compiler has.
#if defined(__cpp_lib_source_location)
using source_location = std::source_location;
#else
struct source_location {
  static constexpr source_location current(char const* file = __builtin_FILE(),
                                           char const* function = __builtin_FUNCTION(),
                                           std::uint_least32_t line = __builtin_LINE()) noexcept {
    source_location loc;
    loc.file_ = file;
    loc.function_ = function;
    loc.line_ = line;
    return loc;
  }
  constexpr char const* file_name() const noexcept { return file_; }
  constexpr char const* function_name() const noexcept { return function_; }
  constexpr std::uint_least32_t line() const noexcept { return line_; }
  constexpr std::uint_least32_t column() const noexcept { return 0; }

 private:
  char const* file_ = "";
  char const* function_ = "";
  std::uint_least32_t line_ = 0;
};
#endif

//! What went wrong, coarsely; one value per class of the hierarchy below.
enum class errc : std::uint8_t {
  invalid_argument,
  shape,
  comm,
  timeout,
  peer_aborted,
  mismatch,
  backend,
  schedule,
  unsupported,
  internal,
};

constexpr std::string_view to_string(errc c) noexcept {
  switch (c) {
    case errc::invalid_argument: return "invalid_argument";
    case errc::shape: return "shape";
    case errc::comm: return "comm";
    case errc::timeout: return "timeout";
    case errc::peer_aborted: return "peer_aborted";
    case errc::mismatch: return "mismatch";
    case errc::backend: return "backend";
    case errc::schedule: return "schedule";
    case errc::unsupported: return "unsupported";
    case errc::internal: return "internal";
  }
  return "unknown";
}

//! Base of every weft exception: a code and the caller's source location. `what()` is the full
//! message including the location; `message()` is the message alone.
class error : public std::runtime_error {
 public:
  error(errc code, std::string const& message, source_location where = source_location::current())
      : std::runtime_error(compose(message, where)),
        code_(code),
        where_(where),
        message_(message) {}

  [[nodiscard]] errc code() const noexcept { return code_; }
  [[nodiscard]] source_location const& where() const noexcept { return where_; }
  [[nodiscard]] std::string const& message() const noexcept { return message_; }

 private:
  static std::string compose(std::string const& message, source_location const& where) {
    std::string out = "weft: ";
    out += message;
    out += " [at ";
    out += short_file(where.file_name());
    out += ':';
    out += std::to_string(where.line());
    std::string const fn = short_function(where.function_name());
    if (!fn.empty()) {
      out += " in ";
      out += fn;
    }
    out += ']';
    return out;
  }

 public:
  //! The file as messages show it: from `weft/` for weft's headers
  //! ("weft/comm/mpi/communicator.hpp"), the file name alone otherwise.
  static std::string_view short_file(std::string_view file) noexcept {
    if (auto const p = file.rfind("include/weft/"); p != std::string_view::npos)
      return file.substr(p + 8);
    if (auto const p = file.find_last_of("/\\"); p != std::string_view::npos)
      return file.substr(p + 1);
    return file;
  }

  //! The function as messages show it: its name and the enclosing class or function, without
  //! namespaces, return type, parameters or template arguments, which in a template's signature
  //! ("... [with T = ...; Body = ...]") run to hundreds of characters:
  //!   "void weft::comm::threads::communicator::run(call&, P&&, B&&) [with P = ...]" ->
  //!   "communicator::run".
  static std::string short_function(std::string_view f) {
    // 1. GCC's " [with ...]" and clang's " [T = ...]" suffixes.
    if (!f.empty() && f.back() == ']')
      if (auto const p = f.rfind(" ["); p != std::string_view::npos) f = f.substr(0, p);
    // 2. Trailing qualifiers, then the parameter list.
    for (bool again = true; again;) {
      again = false;
      for (std::string_view q : {" const", " volatile", " noexcept", " &&", " &"})
        if (f.size() > q.size() && f.substr(f.size() - q.size()) == q) {
          f.remove_suffix(q.size());
          again = true;
        }
    }
    if (!f.empty() && f.back() == ')') {
      int depth = 0;
      std::size_t i = f.size();
      while (i-- > 0) {
        if (f[i] == ')') ++depth;
        if (f[i] == '(' && --depth == 0) break;
      }
      // "operator()" alone (clang's short names) keeps its brackets.
      if (i < f.size()) f = f.substr(0, f.substr(0, i).ends_with("operator") ? i + 2 : i);
    }
    // 3. Template arguments out ("<lambda(int)>" and clang's "(lambda at ...)" become "lambda"),
    //    components split at "::" outside brackets, the return type dropped.
    std::vector<std::string> parts(1);
    int angle = 0;
    int paren = 0;
    std::size_t const op = f.rfind("operator");
    for (std::size_t i = 0; i < f.size(); ++i) {
      char const ch = f[i];
      if (op != std::string_view::npos && i >= op) {  // "operator<", "operator()": verbatim
        parts.back() += ch;
        continue;
      }
      if (ch == '<') {
        if (angle++ == 0 && f.substr(i, 7) == "<lambda") parts.back() += "lambda";
        continue;
      }
      if (ch == '>' && angle > 0) {
        --angle;
        continue;
      }
      if (angle > 0) continue;
      if (ch == '(') {
        if (paren++ == 0 && f.substr(i, 7) == "(lambda") parts.back() += "lambda";
        if (paren == 1 && f.substr(i, 11) == "(anonymous ") parts.back() += "(anonymous)";
      }
      if (paren > 0) {
        if (ch == ')') --paren;
        continue;
      }
      if (ch == ':' && i + 1 < f.size() && f[i + 1] == ':') {
        parts.emplace_back();
        ++i;
      } else if (ch == ' ') {
        parts.assign(1, std::string());  // what came before was the return type
      } else {
        parts.back() += ch;
      }
    }
    // Anonymous namespaces: clang's "(anonymous namespace)", GCC's "{anonymous}", and nvcc's
    // front end's "_GLOBAL__N__<hash>_<file>_<hash>" (what a .cu translation unit reports).
    std::erase_if(parts, [](std::string const& x) {
      return x.empty() || x == "(anonymous)" || x == "{anonymous}" || x.starts_with("_GLOBAL__N_");
    });
    if (parts.empty()) return std::string(f.substr(0, std::min<std::size_t>(f.size(), 60)));
    std::string out = parts.back();
    if (parts.size() >= 2) out = parts[parts.size() - 2] + "::" + out;
    return out;
  }

 private:
  errc code_;
  source_location where_;
  std::string message_;
};

//! A caller passed a value outside the contract of a public entry point.
class invalid_argument_error : public error {
 public:
  explicit invalid_argument_error(std::string const& message,
                                  source_location where = source_location::current())
      : error(errc::invalid_argument, message, where) {}

 protected:
  invalid_argument_error(errc code, std::string const& message, source_location where)
      : error(code, message, where) {}
};

//! Extents, strides, dtypes or layouts of tensors that do not fit together.
class shape_error : public invalid_argument_error {
 public:
  explicit shape_error(std::string const& message,
                       source_location where = source_location::current())
      : invalid_argument_error(errc::shape, message, where) {}
};

//! A communication failure. After one, the communicator that raised it is dead (poisoned).
class comm_error : public error {
 public:
  explicit comm_error(std::string const& message,
                      source_location where = source_location::current())
      : error(errc::comm, message, where) {}

 protected:
  comm_error(errc code, std::string const& message, source_location where)
      : error(code, message, where) {}
};

//! Peers did not arrive before the deadline; `missing_ranks()` names them.
class timeout_error : public comm_error {
 public:
  timeout_error(std::string const& message, std::vector<int> missing_ranks = {},
                source_location where = source_location::current())
      : comm_error(errc::timeout, message, where), missing_(std::move(missing_ranks)) {}
  [[nodiscard]] std::vector<int> const& missing_ranks() const noexcept { return missing_; }

 private:
  std::vector<int> missing_;
};

//! Another rank failed or aborted the communicator; `origin_rank()` is the rank that did.
class peer_aborted_error : public comm_error {
 public:
  peer_aborted_error(std::string const& message, int origin_rank,
                     source_location where = source_location::current())
      : comm_error(errc::peer_aborted, message, where), origin_(origin_rank) {}
  [[nodiscard]] int origin_rank() const noexcept { return origin_; }

 private:
  int origin_;
};

//! Ranks called different collectives (op, dtype, count, root or sequence differ).
class mismatch_error : public comm_error {
 public:
  explicit mismatch_error(std::string const& message,
                          source_location where = source_location::current())
      : comm_error(errc::mismatch, message, where) {}
};

//! A backend library (CUDA, NCCL, MPI) returned an error code.
class backend_error : public comm_error {
 public:
  backend_error(std::string const& message, std::string_view backend, long long backend_code,
                source_location where = source_location::current())
      : comm_error(errc::backend, message, where), backend_(backend), backend_code_(backend_code) {}
  [[nodiscard]] std::string const& backend() const noexcept { return backend_; }
  [[nodiscard]] long long backend_code() const noexcept { return backend_code_; }

 private:
  std::string backend_;
  long long backend_code_;
};

//! A pipeline schedule or its configuration breaks a rule (names rank, action and rule).
class schedule_error : public error {
 public:
  explicit schedule_error(std::string const& message,
                          source_location where = source_location::current())
      : error(errc::schedule, message, where) {}
};

namespace detail {

template <class T>
void append_value(std::ostringstream& os, T const& v) {
  if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "true" : "false");
  } else if constexpr (std::is_same_v<T, signed char> || std::is_same_v<T, unsigned char> ||
                       std::is_same_v<T, char8_t>) {
    os << static_cast<int>(v);
  } else if constexpr (requires { os << v; }) {
    os << v;
  } else {
    os << "<unprintable>";
  }
}

template <class... Args>
std::string concat(Args const&... args) {
  std::ostringstream os;
  (append_value(os, args), ...);
  return os.str();
}

//! "argument `name`: expected E, actual A (requirement `cond` failed)"
template <class Expected, class Actual>
std::string expectation_message(std::string_view condition, std::string_view name,
                                Expected const& expected, Actual const& actual) {
  return concat("argument `", name, "`: expected ", expected, ", actual ", actual,
                " (requirement `", condition, "` failed)");
}

template <class Error, class Expected, class Actual>
[[noreturn]] void fail_expectation(source_location where, std::string_view condition,
                                   std::string_view name, Expected const& expected,
                                   Actual const& actual) {
  throw Error(expectation_message(condition, name, expected, actual), where);
}

#if WEFT_HAS_CUDA_RUNTIME
inline void cuda_check(cudaError_t code, char const* expr, source_location where) {
  if (code == cudaSuccess) return;
  throw backend_error(concat("CUDA call `", expr, "` failed: ", cudaGetErrorName(code), " (",
                             cudaGetErrorString(code), ")"),
                      "cuda", static_cast<long long>(code), where);
}
#endif
#if WEFT_HAS_NCCL
inline void nccl_check(ncclResult_t code, char const* expr, source_location where) {
  if (code == ncclSuccess || code == ncclInProgress) return;
  throw backend_error(concat("NCCL call `", expr, "` failed: ", ncclGetErrorString(code)), "nccl",
                      static_cast<long long>(code), where);
}
#endif
#if WEFT_HAS_MPI
inline void mpi_check(int code, char const* expr, source_location where) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  throw backend_error(concat("MPI call `", expr, "` failed: ", std::string_view(text, len)), "mpi",
                      static_cast<long long>(code), where);
}
#endif

}  // namespace detail
}  // namespace weft

//! Precondition at a public entry point: throws weft::invalid_argument_error whose message names
//! the argument, the expected and the actual value. The source location is taken here, in the
//! macro, so the error points at the checking function, not at a helper.
#define WEFT_EXPECTS(cond, name, expected, actual)                                  \
  do {                                                                              \
    if (!(cond)) [[unlikely]]                                                       \
      ::weft::detail::fail_expectation<::weft::invalid_argument_error>(             \
          ::weft::source_location::current(), #cond, (name), (expected), (actual)); \
  } while (0)

//! As WEFT_EXPECTS for extents, strides and layouts: throws weft::shape_error.
#define WEFT_EXPECTS_SHAPE(cond, name, expected, actual)                                          \
  do {                                                                                            \
    if (!(cond)) [[unlikely]]                                                                     \
      ::weft::detail::fail_expectation<::weft::shape_error>(::weft::source_location::current(),   \
                                                            #cond, (name), (expected), (actual)); \
  } while (0)

//! Throws `ErrorType` with a message made by streaming the remaining arguments.
#define WEFT_THROW(ErrorType, ...) \
  throw ErrorType(::weft::detail::concat(__VA_ARGS__), ::weft::source_location::current())

//! Internal invariant; debug builds only, usable in device code.
#define WEFT_ASSERT(cond) assert(cond)

#if WEFT_HAS_CUDA_RUNTIME
#define WEFT_CUDA_TRY(expr) \
  ::weft::detail::cuda_check((expr), #expr, ::weft::source_location::current())
#else
#define WEFT_CUDA_TRY(expr)         \
  static_assert(sizeof(#expr) == 0, \
                "weft: WEFT_CUDA_TRY needs WEFT_HAS_CUDA_RUNTIME (link weft::cuda)")
#endif
#if WEFT_HAS_NCCL
#define WEFT_NCCL_TRY(expr) \
  ::weft::detail::nccl_check((expr), #expr, ::weft::source_location::current())
#else
#define WEFT_NCCL_TRY(expr) \
  static_assert(sizeof(#expr) == 0, "weft: WEFT_NCCL_TRY needs WEFT_HAS_NCCL (link weft::nccl)")
#endif
#if WEFT_HAS_MPI
#define WEFT_MPI_TRY(expr) \
  ::weft::detail::mpi_check((expr), #expr, ::weft::source_location::current())
#else
#define WEFT_MPI_TRY(expr) \
  static_assert(sizeof(#expr) == 0, "weft: WEFT_MPI_TRY needs WEFT_HAS_MPI (link weft::mpi)")
#endif
