#pragma once
// The grid-gradient pass's kernel and launcher. Included by
// exact/ExactCuda.cu after GridSamplerDeterministic.cu, whose CUDA executor
// it launches with: the extension has one CUDA translation unit.

#include "GridGradientCuda.h"
#include "GridGradientPass.cuh"

namespace at::native {
namespace {

template <typename Pass, typename count_t>
C10_LAUNCH_BOUNDS_2(kPointPassBlockSize, 1)
__global__ void grid_sampler_grid_gradient_kernel(
    const Pass pass,
    count_t count) {
  grid_stride_loop(pass, count);
}

// Built for the point passes' block size: a bicubic point keeps its taps in
// registers, as in the point pass.
template <int kTaps, typename Args>
struct StageKernel<detgrid::grid_only::GridGradientPass<kTaps, Args>> {
  static constexpr int kMaxThreads = kPointPassBlockSize;
  template <typename count_t>
  static constexpr auto kernel = &grid_sampler_grid_gradient_kernel<
      detgrid::grid_only::GridGradientPass<kTaps, Args>,
      count_t>;
};

} // namespace
} // namespace at::native

namespace detgrid::grid_only {

void launch_cuda_grid_gradient(
    const detgrid::BackwardCall& call) {
  const at::native::CudaExecutor executor{
      at::native::LaunchConfig{gsd::kDefaultBlockSize, gsd::kDefaultMaxBlocks},
      at::cuda::getCurrentCUDAStream()};
  run_grid_gradient_pass(executor, call);
}

} // namespace detgrid::grid_only
