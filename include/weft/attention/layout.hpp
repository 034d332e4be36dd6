// weft/attention/layout.hpp — forwarding header, kept for one release: context-parallel sequence
// sharding moved to weft/attention/sharding.hpp (the name says what it holds). Include that header
// instead.
#pragma once

#include <weft/attention/sharding.hpp>
