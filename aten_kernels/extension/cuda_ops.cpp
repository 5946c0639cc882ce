// CUDA side of the extension: the deterministic backward on CUDA tensors,
// and the overrides that route stock aten kernels while detgrid is enabled.

#include "ops.h"

#include <ATen/ops/cudnn_grid_sampler_backward_native.h>
#include <ATen/ops/grid_sampler_2d_backward_native.h>
#include <ATen/ops/grid_sampler_3d_backward_native.h>
#include <c10/cuda/CUDAGuard.h>

namespace detgrid {

at::Tensor grid_gradient_cuda(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  return grid_gradient_by<at::native::launch_grid_sampler_grid_gradient_kernel>(
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners);
}

template <int kDims>
std::tuple<at::Tensor, at::Tensor> backward_cuda(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask) {
  // Stock's CUDA kernels, named here: a call for grad_grid alone outside
  // the detgrid route takes them (unless_grad_input_requested).
  constexpr AtenBackwardFn stock = kDims == 2
      ? at::native::grid_sampler_2d_backward_cuda
      : at::native::grid_sampler_3d_backward_cuda;
  return deterministic_backward<kDims, stock, grid_gradient_cuda>(
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners,
      output_mask);
}

template std::tuple<at::Tensor, at::Tensor> backward_cuda<2>(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    int64_t,
    int64_t,
    bool,
    std::array<bool, 2>);
template std::tuple<at::Tensor, at::Tensor> backward_cuda<3>(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    int64_t,
    int64_t,
    bool,
    std::array<bool, 2>);

namespace {

// grid_sample takes cuDNN for bilinear, zeros padding and align_corners=True;
// in deterministic mode its backward ends in the same deterministic kernel.
std::tuple<at::Tensor, at::Tensor> aten_cudnn_backward(
    const at::Tensor& input,
    const at::Tensor& grid,
    const at::Tensor& grad_output) {
  const at::Context& context = at::globalContext();
  const BackwardRoute route = backward_route(
      c10::DeviceType::CUDA,
      context.deterministicAlgorithms(),
      context.deterministicAlgorithmsWarnOnly(),
      {true, true});
  if (route == BackwardRoute::Stock) {
    return at::native::cudnn_grid_sampler_backward(input, grid, grad_output);
  }
  DETGRID_RECORD_ROUTED(2, grad_output, input, grid);
  constexpr int64_t kBilinear = 0;
  constexpr int64_t kZeros = 0;
  return backward_cuda<2>(
      grad_output,
      input,
      grid,
      kBilinear,
      kZeros,
      /*align_corners=*/true,
      {true, true});
}

// The generated wrappers the overrides replace.
constexpr GeneratedWrapper kBackward2d{
    "wrapper_CUDA__grid_sampler_2d_backward",
    {"grad_output", "input", "grid"}};
constexpr GeneratedWrapper kBackward3d{
    "wrapper_CUDA__grid_sampler_3d_backward",
    {"grad_output", "input", "grid"}};
constexpr GeneratedWrapper kCudnnBackward{
    "wrapper_CUDA__cudnn_grid_sampler_backward",
    {"self", "grid", "grad_output"}};

} // namespace

void register_cuda_overrides(torch::Library& aten_cuda) {
  aten_cuda.impl(
      "grid_sampler_2d_backward",
      TORCH_FN((AsGeneratedWrapper<
                &routed_backward<
                    backward_cuda<2>,
                    at::native::grid_sampler_2d_backward_cuda>,
                kBackward2d>::call)));
  aten_cuda.impl(
      "grid_sampler_3d_backward",
      TORCH_FN((AsGeneratedWrapper<
                &routed_backward<
                    backward_cuda<3>,
                    at::native::grid_sampler_3d_backward_cuda>,
                kBackward3d>::call)));
  aten_cuda.impl(
      "cudnn_grid_sampler_backward",
      TORCH_FN(
          (AsGeneratedWrapper<&aten_cudnn_backward, kCudnnBackward>::call)));
}

} // namespace detgrid
