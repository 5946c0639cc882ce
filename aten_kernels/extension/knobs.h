#pragma once
// The knobs the tests turn. Upstream's files run the plan they make from the
// shapes (plan_backward in GridSamplerDeterministicPipeline.cuh); the
// extension alone lets a caller override its choices, to prove that none of
// them changes a bit of the result.

#include "BackwardCall.h"

#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>

#include <cstdint>

namespace detgrid {

// 0 everywhere means "as planned".
struct BackwardOptions {
  // Points per chunk of records; a multiple of the tile size (4096).
  int64_t chunk_points = 0;
  // CUDA: threads per block and a cap on blocks per launch.
  int64_t block_size = 0;
  int64_t max_blocks = 0;
  // Host executor: at::parallel_for's grain.
  int64_t grain_size = 0;
  // Width of the sort keys and of the index math: 32 or 64 (32 is an error
  // where the problem does not fit it).
  int64_t key_bits = 0;
  int64_t index_bits = 0;
  // 1: one sort key per tap everywhere.
  int64_t keying = 0;
  // Thread order of the dense reduce: 1 destinations fastest, 2 channels
  // fastest.
  int64_t gather = 0;
  // How grad_input's terms are summed: 0 in the canonical order (the
  // default, and upstream's only way); 1 exactly (exact/ExactSum.cuh) after
  // the sort; 2 exactly with integer atomics and no sort (keyed per tap).
  int64_t accumulate = 0;
  // 1: every destination folds its records serially, hot ones too
  // (BackwardPlan::hot_fold).
  int64_t serial_fold = 0;
  // 1: the sparse reduction everywhere, as the stack's levels before the
  // dense reduce run.
  int64_t reduce = 0;
  // 1: a dense reduce thread (destinations fastest) and a hot-fold thread
  // take one channel, as the stack's levels before channel groups do.
  int64_t channel_group = 0;
  // 1: a dense chunk's zero fill of its segment table and its channels-last
  // copy of grad_output are launches of their own, as the stack's levels
  // before fused fills have them.
  int64_t separate_fills = 0;
  // Half/BFloat16 over several chunks: at most this many elements of
  // float sums in the carry (ChunkPlan::carry_elements), so that a small
  // problem runs the carry in blocks as one over 8 Mi elements does.
  int64_t carry_elements = 0;
};

// accumulate's ends; 1, between them, is the sorted exact variant.
constexpr int64_t kAccumulateOrdered = 0;
constexpr int64_t kAccumulateExactAtomic = 2;

// The default plan of a call of checked arguments, with the knobs'
// overrides applied and every choice that depends on an overridden one made
// again; a knob out of range is a one-line error. The launch shape is not
// the plan's: launch_with_knobs (cuda_ops.cpp) makes it from block_size and
// max_blocks.
at::native::grid_sampler_deterministic::BackwardPlan plan_with_knobs(
    const detgrid::BackwardCall& call,
    const BackwardOptions& knobs);

} // namespace detgrid
