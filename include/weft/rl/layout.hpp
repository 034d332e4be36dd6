// weft/rl/layout.hpp — forwarding header, kept for one release: the RL token layout moved to
// weft/rl/token_layout.hpp (the name says what it holds). Include that header instead.
#pragma once

#include <weft/rl/token_layout.hpp>
