// weft/mesh/mesh.hpp — the mesh area in one include: the pure layout arithmetic (ravel, unravel,
// groups_along, Megatron order strings) and device_mesh, which turns it into communicators.
#pragma once

#include <weft/mesh/device_mesh.hpp>
#include <weft/mesh/layout.hpp>
