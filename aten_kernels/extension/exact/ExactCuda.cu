// The CUDA side of accumulate="exact" and of the knobs' plans, and the
// extension's one CUDA translation unit. The CUDA executor is private to
// GridSamplerDeterministic.cu (upstream has no other user for it), so this
// translation unit includes that file whole, and the extension compiles it
// in that file's place: one executor and one set of kernels for both ways
// of accumulating.
#include <ATen/native/cuda/GridSamplerDeterministic.cu>

#include "ExactBackward.cuh"
#include "ExactCuda.h"

namespace at::native {
namespace {

// The exact stages' kernels, named after what they compute as the
// pipeline's are, and their StageKernel entries, which the executor looks
// up (so the specializations live in StageKernel's namespace). Launch
// bounds as the pipeline's non-point stages: at most kMaxBlockSize threads,
// one resident block per SM (without that floor ptxas held the row kernels
// to 32-40 registers and spilled in the sparse reduce with 64-bit indices).

template <typename Stage, typename row_t, typename col_t>
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void find_grad_output_bound_kernel(
    const Stage stage,
    row_t rows,
    col_t cols) {
  grid_stride_rows(stage, rows, cols);
}

template <typename Stage, typename row_t, typename col_t>
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void scatter_exact_terms_kernel(
    const Stage stage,
    row_t rows,
    col_t cols) {
  grid_stride_rows(stage, rows, cols);
}

template <typename Stage, typename row_t, typename col_t>
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void sum_segments_exact_kernel(
    const Stage stage,
    row_t rows,
    col_t cols) {
  grid_stride_rows(stage, rows, cols);
}

template <typename Stage, typename row_t, typename col_t>
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void sum_runs_exact_kernel(
    const Stage stage,
    row_t rows,
    col_t cols) {
  grid_stride_rows(stage, rows, cols);
}

template <typename Stage, typename count_t>
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void round_exact_sums_kernel(const Stage stage, count_t count) {
  grid_stride_loop(stage, count);
}

template <typename scalar_t, typename index_t, int kDims>
struct StageKernel<detgrid::exact::FindGradOutputBound<scalar_t, index_t, kDims>> {
  template <typename row_t, typename col_t>
  static constexpr auto kernel = &find_grad_output_bound_kernel<
      detgrid::exact::FindGradOutputBound<scalar_t, index_t, kDims>,
      row_t,
      col_t>;
};

template <
    int kTapsPerPoint,
    int kDims,
    typename scalar_t,
    typename index_t,
    typename key_t>
struct StageKernel<
    detgrid::exact::ScatterTerms<kTapsPerPoint, kDims, scalar_t, index_t, key_t>> {
  template <typename row_t, typename col_t>
  static constexpr auto kernel = &scatter_exact_terms_kernel<
      detgrid::exact::
          ScatterTerms<kTapsPerPoint, kDims, scalar_t, index_t, key_t>,
      row_t,
      col_t>;
};

template <
    int kTapsPerPoint,
    int kDims,
    typename Segments,
    typename scalar_t,
    typename index_t>
struct StageKernel<detgrid::exact::ReduceExactDense<
    kTapsPerPoint,
    kDims,
    Segments,
    scalar_t,
    index_t>> {
  template <typename row_t, typename col_t>
  static constexpr auto kernel = &sum_segments_exact_kernel<
      detgrid::exact::
          ReduceExactDense<kTapsPerPoint, kDims, Segments, scalar_t, index_t>,
      row_t,
      col_t>;
};

template <
    int kTapsPerPoint,
    int kDims,
    typename scalar_t,
    typename index_t,
    typename key_t>
struct StageKernel<detgrid::exact::ReduceExactSparse<
    kTapsPerPoint,
    kDims,
    scalar_t,
    index_t,
    key_t>> {
  template <typename row_t, typename col_t>
  static constexpr auto kernel = &sum_runs_exact_kernel<
      detgrid::exact::
          ReduceExactSparse<kTapsPerPoint, kDims, scalar_t, index_t, key_t>,
      row_t,
      col_t>;
};

template <int kDims, typename scalar_t, typename index_t>
struct StageKernel<detgrid::exact::RoundSums<kDims, scalar_t, index_t>> {
  static constexpr int kMaxThreads = kMaxBlockSize;
  template <typename count_t>
  static constexpr auto kernel = &round_exact_sums_kernel<
      detgrid::exact::RoundSums<kDims, scalar_t, index_t>,
      count_t>;
};

} // namespace
} // namespace at::native

namespace detgrid::exact {
namespace {

// The executor's launch configuration; launch_with_knobs (cuda_ops.cpp) has
// checked the knobs against its limits.
at::native::LaunchConfig launch_config(const LaunchShape& shape) {
  TORCH_INTERNAL_ASSERT(
      shape.block_size > 0 && shape.block_size <= gsd::kMaxBlockSize &&
      shape.max_blocks > 0 && shape.max_blocks <= gsd::kDefaultMaxBlocks);
  return {shape.block_size, shape.max_blocks};
}

} // namespace

template <int kDims>
void launch_cuda_exact_backward(
    const detgrid::BackwardCall& call,
    const gsd::BackwardPlan& plan,
    const LaunchShape& shape,
    bool atomic) {
  const at::native::CudaExecutor executor{
      launch_config(shape),
      at::cuda::getCurrentCUDAStream()};
  run_exact_backward(executor, call, plan, atomic);
}

template void launch_cuda_exact_backward<2>(
    const detgrid::BackwardCall&,
    const gsd::BackwardPlan&,
    const LaunchShape&,
    bool);
template void launch_cuda_exact_backward<3>(
    const detgrid::BackwardCall&,
    const gsd::BackwardPlan&,
    const LaunchShape&,
    bool);

template <int kDims>
void launch_cuda_backward_with_plan(
    const detgrid::BackwardCall& call,
    const gsd::BackwardPlan& plan,
    const LaunchShape& shape) {
  const at::native::CudaExecutor executor{
      launch_config(shape),
      at::cuda::getCurrentCUDAStream()};
  gsd::run_deterministic_backward(executor, call, plan);
}

template void launch_cuda_backward_with_plan<2>(
    const detgrid::BackwardCall&,
    const gsd::BackwardPlan&,
    const LaunchShape&);
template void launch_cuda_backward_with_plan<3>(
    const detgrid::BackwardCall&,
    const gsd::BackwardPlan&,
    const LaunchShape&);

} // namespace detgrid::exact
