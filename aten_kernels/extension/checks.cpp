#include "ops.h"

#include <ATen/EmptyTensor.h>
#include <ATen/native/GridSamplerUtils.h>
#include <torch/version.h>
#ifdef DETGRID_WITH_CUDA
#include <ATen/cuda/EmptyTensor.h>
#endif

#include <vector>

namespace detgrid {
namespace {

using at::native::detail::GridSamplerInterpolation;

// A contiguous tensor like `t`, its memory left as the allocator gives it.
at::Tensor empty_unfilled_like(const at::Tensor& t) {
#ifdef DETGRID_WITH_CUDA
  if (t.is_cuda()) {
    return at::Tensor(
        at::detail::empty_cuda(
            t.sizes(), t.scalar_type(), t.device(), std::nullopt));
  }
#endif
  TORCH_INTERNAL_ASSERT(t.is_cpu());
  return at::Tensor(at::detail::empty_cpu(t.sizes(), t.scalar_type()));
}

const char* backward_op_name(int64_t spatial_dims) {
  return spatial_dims == 2 ? "grid_sampler_2d_backward()"
                           : "grid_sampler_3d_backward()";
}

} // namespace

void check_backward_inputs(
    int64_t spatial_dims,
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode) {
  const char* op = backward_op_name(spatial_dims);
  TORCH_CHECK(
      grad_output.defined(), op, ": expected grad_output to not be undefined");
  at::native::check_grid_sampler_common(input, grid);
  if (spatial_dims == 2) {
    at::native::check_grid_sampler_2d(input, grid);
  } else {
    // Only the shape half of stock's check: detgrid samples 5-D input
    // tricubically too, as torch 2.15 does (earlier releases reject that in
    // the forward already).
    at::native::check_grid_sampler_3d(
        input, grid, static_cast<int64_t>(GridSamplerInterpolation::Bilinear));
  }
  TORCH_CHECK(
      grad_output.device() == input.device(),
      op,
      ": expected grad_output and input to be on the same device, but "
      "grad_output is on ",
      grad_output.device(),
      " and input is on ",
      input.device());
  TORCH_CHECK(
      grad_output.layout() == at::kStrided,
      op,
      ": expected grad_output to have torch.strided layout, but got ",
      grad_output.layout());
  TORCH_CHECK(
      at::isFloatingType(input.scalar_type()),
      op,
      ": expected a floating-point input, but got ",
      input.scalar_type());
  TORCH_CHECK(
      grid.scalar_type() == input.scalar_type() &&
          grad_output.scalar_type() == input.scalar_type(),
      op,
      ": expected input, grid and grad_output to have the same dtype, but "
      "got ",
      input.scalar_type(),
      ", ",
      grid.scalar_type(),
      " and ",
      grad_output.scalar_type());
  // (N, C, grid's spatial sizes...)
  std::vector<int64_t> expected{input.size(0), input.size(1)};
  for (int64_t a = 1; a <= spatial_dims; ++a) {
    expected.push_back(grid.size(a));
  }
  TORCH_CHECK(
      grad_output.sizes() == at::IntArrayRef(expected),
      op,
      ": expected grad_output to have sizes ",
      at::IntArrayRef(expected),
      " but got grad_output with sizes ",
      grad_output.sizes());
  TORCH_CHECK(
      interpolation_mode >= 0 && interpolation_mode <= 2,
      op,
      ": interpolation_mode must be 0 (bilinear), 1 (nearest) or 2 "
      "(bicubic), but got ",
      interpolation_mode);
  TORCH_CHECK(
      padding_mode >= 0 && padding_mode <= 2,
      op,
      ": padding_mode must be 0 (zeros), 1 (border) or 2 (reflection), but "
      "got ",
      padding_mode);
}

void check_as_stock_backward(
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode) {
  // torch 2.15 samples 5-D input bicubically, forward and backward. Before
  // it, check_grid_sampler_3d with the mode is stock's own refusal; from it
  // on that overload is kept for out-of-tree backends and still refuses, so
  // it is called only where stock's backward calls it.
  constexpr bool kStockHasTricubic = TORCH_VERSION_MAJOR > 2 ||
      (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15);
  if (!kStockHasTricubic && input.dim() == 5) {
    at::native::check_grid_sampler_3d(input, grid, interpolation_mode);
  }
}

std::tuple<at::Tensor, at::Tensor> allocate_gradients(
    const at::Tensor& input,
    const at::Tensor& grid,
    std::array<bool, 2> output_mask) {
  at::Tensor grad_input =
      output_mask[0] ? empty_unfilled_like(input) : at::Tensor();
  at::Tensor grad_grid =
      output_mask[1] ? empty_unfilled_like(grid) : at::Tensor();
  return {grad_input, grad_grid};
}

} // namespace detgrid
