// weft/rl/dapo.hpp — forwarding header, kept for one release: dynamic sampling and overlong shaping
// moved to weft/rl/dynamic_sampling.hpp (the name says what it holds). Include that header instead.
#pragma once

#include <weft/rl/dynamic_sampling.hpp>
