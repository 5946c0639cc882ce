#pragma once
#include <array>
#include <cstdint>

namespace at {
class TensorBase;
}

namespace at::native {

// The arguments of one backward call, as the launchers below receive them;
// the executors of the deterministic pipeline take them bundled.
struct GridSamplerBackwardCall {
  const TensorBase& grad_input;
  const TensorBase& grad_grid;
  const TensorBase& grad_output;
  const TensorBase& input;
  const TensorBase& grid;
  int64_t interpolation_mode;
  int64_t padding_mode;
  bool align_corners;
  std::array<bool, 2> output_mask;
};

// Same contracts as launch_grid_sampler_{2d,3d}_backward_kernel
// (GridSampler.h), without floating-point atomics: the result is bitwise
// reproducible. Every element of grad_input is written (it need not be
// zeroed) and must be contiguous, as GridSampler.cpp allocates it. The grid
// gradient is computed only when output_mask[1] is set; otherwise a defined
// (contiguous) grad_grid is filled with zeros.
void launch_grid_sampler_2d_backward_deterministic_kernel(
    const TensorBase& grad_input,
    const TensorBase& grad_grid,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask);

void launch_grid_sampler_3d_backward_deterministic_kernel(
    const TensorBase& grad_input,
    const TensorBase& grad_grid,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask);

} // namespace at::native
