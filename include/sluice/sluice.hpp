#pragma once
// The umbrella header: everything sluice offers on this build.

#include <sluice/core/bytes.hpp>
#include <sluice/core/channel.hpp>
#include <sluice/core/error.hpp>
#include <sluice/core/pipeline.hpp>
#include <sluice/core/record.hpp>
#include <sluice/core/runtime.hpp>
#include <sluice/core/stage.hpp>
#include <sluice/core/stats.hpp>
#include <sluice/core/task.hpp>
#include <sluice/cuda/dlpack.hpp>
#include <sluice/cuda/engine.hpp>
#include <sluice/cuda/slab_pool.hpp>
#include <sluice/cuda/to_device.hpp>
#include <sluice/formats/crc32c.hpp>
#include <sluice/formats/decode.hpp>
#include <sluice/formats/lines.hpp>
#include <sluice/formats/raw.hpp>
#include <sluice/formats/recordio.hpp>
#include <sluice/formats/tar.hpp>
#include <sluice/formats/tfrecord.hpp>
#include <sluice/io/http.hpp>
#include <sluice/io/list.hpp>
#include <sluice/io/local.hpp>
#include <sluice/io/s3.hpp>
#include <sluice/ops/batch.hpp>
#include <sluice/ops/from.hpp>
#include <sluice/ops/map.hpp>
#include <sluice/ops/plan.hpp>
#include <sluice/ops/shuffle.hpp>
#if defined(SLUICE_HAVE_CUDA)  // set by the sluice::cuda target
#include <sluice/cuda/cuda.hpp>
#endif

// With sluice::compiled linked (SLUICE_COMPILED), the library's own stages and
// pipelines are compiled once in it rather than in every translation unit.
#include <sluice/detail/compiled_parts.hpp>
