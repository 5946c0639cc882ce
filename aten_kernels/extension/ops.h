#pragma once
// The extension's operators: the deterministic backward on each device, and
// the switch that routes stock aten kernels to it (detgrid.enable()).

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <tuple>

namespace detgrid {

// Knobs the tests turn; see GridSamplerDeterministicOptions/ExecutorOptions.
struct BackwardOptions {
  int64_t chunk_points = 0;
  int64_t block_size = 0;
  int64_t max_blocks = 0;
  int64_t grain_size = 0;
};

// Same checks as stock grid_sampler_2d_backward, plus dtype and mode checks
// that stock leaves to the kernel.
void check_backward_inputs(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode);

// grad_input / grad_grid as stock allocates them; undefined when not asked.
std::tuple<at::Tensor, at::Tensor> allocate_gradients(
    const at::Tensor& input,
    const at::Tensor& grid,
    std::array<bool, 2> output_mask);

std::tuple<at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const BackwardOptions& options = {});

#ifdef DETGRID_WITH_CUDA
std::tuple<at::Tensor, at::Tensor> backward_cuda(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const BackwardOptions& options = {});

// Registers, on `aten_cuda`, the CUDA kernels of grid_sampler_2d_backward and
// cudnn_grid_sampler_backward that pick the deterministic backward when
// deterministic algorithms are on, and the stock kernels otherwise.
void register_cuda_overrides(torch::Library& aten_cuda);
#endif

} // namespace detgrid
