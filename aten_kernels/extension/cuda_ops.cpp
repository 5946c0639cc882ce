// CUDA side of the extension: allocates, guards the device and calls the
// ATen-style launcher; routes stock aten kernels while detgrid is enabled.

#include "exact/ExactCuda.h"
#include "ops.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>
#include <ATen/ops/cudnn_grid_sampler_backward_native.h>
#include <ATen/ops/grid_sampler_2d_backward_native.h>
#include <ATen/ops/grid_sampler_3d_backward_native.h>
#include <c10/cuda/CUDAGuard.h>

namespace detgrid {
namespace {

namespace gsd = at::native::grid_sampler_deterministic;

// The launch shape the block_size and max_blocks knobs ask for.
exact::LaunchShape launch_with_knobs(
    const BackwardOptions& knobs,
    const char* op_name) {
  TORCH_CHECK(
      knobs.block_size >= 0 && knobs.max_blocks >= 0,
      op_name,
      " (deterministic): block_size and max_blocks must be positive, or 0 "
      "for the default");
  exact::LaunchShape shape;
  if (knobs.block_size > 0) {
    shape.block_size = knobs.block_size;
  }
  if (knobs.max_blocks > 0) {
    shape.max_blocks = std::min(knobs.max_blocks, gsd::kDefaultMaxBlocks);
  }
  TORCH_CHECK(
      shape.block_size % at::cuda::warp_size() == 0 &&
          shape.block_size <= gsd::kMaxBlockSize,
      op_name,
      " (deterministic): block_size must be a multiple of the warp size and "
      "at most ",
      gsd::kMaxBlockSize,
      ", got ",
      shape.block_size);
  return shape;
}

} // namespace

at::Tensor grid_gradient_cuda(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  return grid_gradient_by<at::native::launch_grid_sampler_grid_gradient_kernel>(
      grad_output, input, grid, interpolation_mode, padding_mode, align_corners);
}

template <int kDims>
std::tuple<at::Tensor, at::Tensor> backward_cuda(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const BackwardOptions& options) {
  check_backward_inputs(
      kDims, grad_output, input, grid, interpolation_mode, padding_mode);
  const c10::cuda::CUDAGuard device_guard(input.device());
  constexpr AtenBackwardFn stock = kDims == 2
      ? at::native::grid_sampler_2d_backward_cuda
      : at::native::grid_sampler_3d_backward_cuda;
  if (auto result =
          unless_grad_input_requested<stock, grid_gradient_cuda>(
              grad_output,
              input,
              grid,
              interpolation_mode,
              padding_mode,
              align_corners,
              output_mask)) {
    return *result;
  }
  auto [grad_input, grad_grid] = allocate_gradients(input, grid, output_mask);
  const detgrid::BackwardCall call{
      {grad_input,
       grad_output,
       input,
       grid,
       interpolation_mode,
       padding_mode,
       align_corners},
      grad_grid,
      output_mask};
  // The launchers of GridSamplerDeterministic.h run the default plan; the
  // knobs' plan reaches the same CUDA pipeline through the extension's CUDA
  // unit (ExactCuda.cu), which holds the ATen .cu whole.
  const gsd::BackwardPlan plan = plan_with_knobs(call, options);
  const exact::LaunchShape shape = launch_with_knobs(
      options,
      kDims == 2 ? "grid_sampler_2d_backward" : "grid_sampler_3d_backward");
  write_requested_grad_grid<
      at::native::launch_grid_sampler_grid_gradient_kernel>(call);
  if (options.accumulate == kAccumulateOrdered) {
    exact::launch_cuda_backward_with_plan<kDims>(call, plan, shape);
  } else {
    exact::launch_cuda_exact_backward<kDims>(
        call, plan, shape, options.accumulate == kAccumulateExactAtomic);
  }
  return {grad_input, grad_grid};
}

template std::tuple<at::Tensor, at::Tensor> backward_cuda<2>(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    int64_t,
    int64_t,
    bool,
    std::array<bool, 2>,
    const BackwardOptions&);
template std::tuple<at::Tensor, at::Tensor> backward_cuda<3>(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    int64_t,
    int64_t,
    bool,
    std::array<bool, 2>,
    const BackwardOptions&);

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
      {true, true},
      BackwardOptions{});
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
                     with_default_options<backward_cuda<2>>,
                     at::native::grid_sampler_2d_backward_cuda>,
                 kBackward2d>::call)));
  aten_cuda.impl(
      "grid_sampler_3d_backward",
      TORCH_FN((AsGeneratedWrapper<
                 &routed_backward<
                     with_default_options<backward_cuda<3>>,
                     at::native::grid_sampler_3d_backward_cuda>,
                 kBackward3d>::call)));
  aten_cuda.impl(
      "cudnn_grid_sampler_backward",
      TORCH_FN(
          (AsGeneratedWrapper<&aten_cudnn_backward, kCudnnBackward>::call)));
}

} // namespace detgrid
