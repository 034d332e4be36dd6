// examples/common/cli.hpp — what the example programs' command lines share: the exception a bad
// flag raises (the message names the flag, the expected and the actual value; the programs print
// it with their usage and exit 2) and the checked parse of a numeric flag value.
#pragma once

#include <charconv>
#include <string>
#include <string_view>
#include <system_error>

namespace weft::examples {

//! A command line the program cannot run: `message` says which flag, what was expected and what
//! was given.
struct bad_argument {
  std::string message;
};

//! n as the shortest text that reads back as n (`0.3`, not std::to_string's `0.300000`).
template <class N>
std::string number_text(N n) {
  char buf[64];
  auto const [end, ec] = std::to_chars(buf, buf + sizeof buf, n);
  return ec == std::errc{} ? std::string(buf, end) : std::string("?");
}

//! The value of `flag` as an N in [lo, hi]: the whole text must be the number.
template <class N>
N parse_number(std::string_view flag, std::string_view text, N lo, N hi) {
  N value{};
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || !(value >= lo) || !(value <= hi))
    throw bad_argument{"argument `" + std::string(flag) + "`: expected a number in [" +
                       number_text(lo) + ", " + number_text(hi) + "], actual `" +
                       std::string(text) + "`"};
  return value;
}

//! The value after flag argv[i] (advancing i), or bad_argument naming the flag.
inline std::string_view flag_value(int argc, char** argv, int& i) {
  std::string_view const flag = argv[i];
  if (i + 1 >= argc) throw bad_argument{"argument `" + std::string(flag) + "`: expected a value"};
  return argv[++i];
}

}  // namespace weft::examples
