// weft/comm/nccl/communicator.cuh — kept so that existing includes keep working: the NCCL backend
// holds no kernel, so it lives in communicator.hpp (which g++ compiles too); include that instead.
#pragma once

#include <weft/comm/nccl/communicator.hpp>
