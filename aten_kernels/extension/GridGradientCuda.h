#pragma once
// The grid-gradient pass on CUDA (GridGradientPass.cuh). Built in the
// extension's CUDA translation unit, exact/ExactCuda.cu, which holds the
// pipeline's CUDA executor.

#include "BackwardCall.h"

namespace detgrid::grid_only {

// run_grid_gradient_pass on the current stream, for checked arguments with
// output_mask {false, true} and a contiguous grad_grid on the current device.
void launch_cuda_grid_gradient(const detgrid::BackwardCall& call);

} // namespace detgrid::grid_only
