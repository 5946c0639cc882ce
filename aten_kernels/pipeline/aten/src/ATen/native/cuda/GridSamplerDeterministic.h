#pragma once
#include <cstdint>

namespace at {
class TensorBase;
}

namespace at::native {

// The arguments of launch_grid_sampler_{2d,3d}_backward_kernel
// (GridSampler.h), bundled as the deterministic pipeline takes them.
struct GridSamplerBackwardCall {
  const TensorBase& grad_input;
  const TensorBase& grad_output;
  const TensorBase& input;
  const TensorBase& grid;
  int64_t interpolation_mode;
  int64_t padding_mode;
  bool align_corners;
};

// grad_input of launch_grid_sampler_2d_backward_kernel (4-D input) or
// launch_grid_sampler_3d_backward_kernel (5-D input) without floating-point
// atomics: bitwise reproducible. Every element of grad_input is written (it
// need not be zeroed) and must be contiguous, as GridSampler.cpp allocates
// it. grad_grid is left to the existing kernel, which, asked for grad_grid
// alone, has one writer per element.
void launch_grid_sampler_backward_deterministic_kernel(
    const GridSamplerBackwardCall& call);

} // namespace at::native
