// weft/parallel/dp.hpp — data parallelism: the bucketed gradient-buffer layout (bucket_plan),
// gradient reduction during backward (grad_sync) and ZeRO-1 AdamW (zero1).
#pragma once

#include <weft/parallel/buckets.hpp>
#include <weft/parallel/grad_sync.hpp>
#include <weft/parallel/zero1.hpp>
