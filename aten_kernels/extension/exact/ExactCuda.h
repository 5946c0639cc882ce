#pragma once
// accumulate="exact" on CUDA (ExactCuda.cu).

#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>

namespace detgrid::exact {

// run_exact_backward on the current stream, after the checks of the
// launchers of GridSamplerDeterministic.h, for a 4-D (kDims 2) or 5-D
// (kDims 3) input.
template <int kDims>
void launch_cuda_exact_backward(
    const at::native::GridSamplerBackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan,
    bool atomic);

} // namespace detgrid::exact
