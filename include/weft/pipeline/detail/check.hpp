// weft/pipeline/detail/check.hpp — the configuration check every schedule generator uses: a
// `schedule_error` whose message names the parameter, the expected and the actual value.
#pragma once

#include <weft/core/error.hpp>

#include <string_view>

namespace weft::pipeline::detail {

//! Throws schedule_error("argument `name`: expected E, actual A (requirement `rule` failed)")
//! unless `ok`. The location is the caller's (the generator), not this helper's.
template <class Expected, class Actual>
void require(bool ok, std::string_view name, Expected const& expected, Actual const& actual,
             std::string_view rule,
             ::weft::source_location where = ::weft::source_location::current()) {
  if (ok) [[likely]]
    return;
  throw schedule_error(::weft::detail::expectation_message(rule, name, expected, actual), where);
}

}  // namespace weft::pipeline::detail
