#pragma once
// The extension's grad_grid (GridGradient.cu, Note [grad_grid alone]) and its
// host build, which setup.py makes from the same source through hostify
// under the name launch_grid_sampler_grid_gradient_host.

#include <ATen/core/TensorBase.h>

#include <cstdint>

namespace at::native {

// Writes every element of grad_grid (contiguous, the grid's sizes) for
// checked arguments of grid_sampler_{2d,3d}_backward: one launch, none for
// an empty grid.
using GridGradientLaunch = void(
    const TensorBase& grad_grid,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners);

GridGradientLaunch launch_grid_sampler_grid_gradient_host;
#ifdef DETGRID_WITH_CUDA
GridGradientLaunch launch_grid_sampler_grid_gradient_kernel;
#endif

} // namespace at::native
