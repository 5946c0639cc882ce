#pragma once
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace detgrid {

// Knobs that must not change the executor's result (tests turn them).
struct ExecutorOptions {
  int64_t chunk_points = 0; // multiple of the tile size; 0 = default
  int64_t grain_size = 0; // at::parallel_for grain; 0 = default
};

// Contract of at::native::launch_grid_sampler_{2d,3d}_backward_deterministic_
// kernel on CPU tensors (2-D for a 4-D input, 3-D for a 5-D one): writes every
// element of grad_input when output_mask[0], and grad_grid when
// output_mask[1]. The caller checks the arguments as for those.
void grid_sampler_backward_executor(
    const at::Tensor& grad_input,
    const at::Tensor& grad_grid,
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const ExecutorOptions& options = {});

} // namespace detgrid
