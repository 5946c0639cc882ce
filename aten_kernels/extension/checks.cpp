#include "ops.h"

#include <ATen/native/GridSamplerUtils.h>
#include <ATen/ops/empty_like.h>

namespace detgrid {

void check_backward_inputs(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode) {
  TORCH_CHECK(
      grad_output.defined(),
      "grid_sampler_2d_backward(): expected grad_output to not be undefined");
  at::native::check_grid_sampler_common(input, grid);
  at::native::check_grid_sampler_2d(input, grid);
  TORCH_CHECK(
      grad_output.device() == input.device(),
      "grid_sampler_2d_backward(): expected grad_output and input to be on "
      "the same device, but grad_output is on ",
      grad_output.device(),
      " and input is on ",
      input.device());
  TORCH_CHECK(
      grad_output.layout() == at::kStrided,
      "grid_sampler_2d_backward(): expected grad_output to have torch.strided "
      "layout, but got ",
      grad_output.layout());
  TORCH_CHECK(
      at::isFloatingType(input.scalar_type()),
      "grid_sampler_2d_backward(): expected a floating-point input, but got ",
      input.scalar_type());
  TORCH_CHECK(
      grid.scalar_type() == input.scalar_type() &&
          grad_output.scalar_type() == input.scalar_type(),
      "grid_sampler_2d_backward(): expected input, grid and grad_output to "
      "have the same dtype, but got ",
      input.scalar_type(),
      ", ",
      grid.scalar_type(),
      " and ",
      grad_output.scalar_type());
  const std::array<int64_t, 4> expected{
      input.size(0), input.size(1), grid.size(1), grid.size(2)};
  TORCH_CHECK_VALUE(
      grad_output.sizes() == at::IntArrayRef(expected),
      "grid_sampler_2d_backward(): expected grad_output to have sizes ",
      at::IntArrayRef(expected),
      " but got grad_output with sizes ",
      grad_output.sizes());
  TORCH_CHECK(
      interpolation_mode >= 0 && interpolation_mode <= 2,
      "grid_sampler_2d_backward(): interpolation_mode must be 0 (bilinear), "
      "1 (nearest) or 2 (bicubic), but got ",
      interpolation_mode);
  TORCH_CHECK(
      padding_mode >= 0 && padding_mode <= 2,
      "grid_sampler_2d_backward(): padding_mode must be 0 (zeros), 1 "
      "(border) or 2 (reflection), but got ",
      padding_mode);
}

std::tuple<at::Tensor, at::Tensor> allocate_gradients(
    const at::Tensor& input,
    const at::Tensor& grid,
    std::array<bool, 2> output_mask) {
  at::Tensor grad_input = output_mask[0]
      ? at::empty_like(input, at::MemoryFormat::Contiguous)
      : at::Tensor();
  at::Tensor grad_grid = output_mask[1]
      ? at::empty_like(grid, at::MemoryFormat::Contiguous)
      : at::Tensor();
  return {grad_input, grad_grid};
}

} // namespace detgrid
