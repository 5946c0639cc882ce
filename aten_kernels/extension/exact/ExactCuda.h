#pragma once
// The extension's CUDA entry points beside the launchers of
// GridSamplerDeterministic.h (ExactCuda.cu): a plan of the knobs', and
// accumulate="exact".

#include "../BackwardCall.h"

#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>

namespace detgrid::exact {

// The block_size and max_blocks knobs (the executor's LaunchConfig).
struct LaunchShape {
  int64_t block_size = at::native::grid_sampler_deterministic::kDefaultBlockSize;
  int64_t max_blocks = at::native::grid_sampler_deterministic::kDefaultMaxBlocks;
};

// run_exact_backward on the current stream, after the checks of the
// launchers of GridSamplerDeterministic.h, for a 4-D (kDims 2) or 5-D
// (kDims 3) input, with the launch shape of the block_size and max_blocks
// knobs.
template <int kDims>
void launch_cuda_exact_backward(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan,
    const LaunchShape& shape,
    bool atomic);

// run_deterministic_backward with `plan` and `shape` on the current stream,
// after the same checks; upstream's launchers always run plan_backward()'s
// plan with the default launch shape.
template <int kDims>
void launch_cuda_backward_with_plan(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan,
    const LaunchShape& shape);

} // namespace detgrid::exact
