// The CUDA side of accumulate="exact". The CUDA executor is private to
// GridSamplerDeterministic.cu (upstream has no other user for it), so this
// translation unit includes that file whole, and the extension compiles it
// in that file's place: one executor and one set of kernels for both ways
// of accumulating.
#include <ATen/native/cuda/GridSamplerDeterministic.cu>

#include "ExactBackward.cuh"
#include "ExactCuda.h"

namespace detgrid::exact {

template <int kDims>
void launch_cuda_exact_backward(
    const at::native::GridSamplerBackwardCall& call,
    const gsd::BackwardPlan& plan,
    bool atomic) {
  at::native::check_input_and_grid<kDims>(call);
  const at::native::CudaExecutor executor{
      at::native::make_launch_config(plan.launch),
      at::cuda::getCurrentCUDAStream()};
  run_exact_backward(executor, call, plan, atomic);
}

template void launch_cuda_exact_backward<2>(
    const at::native::GridSamplerBackwardCall&,
    const gsd::BackwardPlan&,
    bool);
template void launch_cuda_exact_backward<3>(
    const at::native::GridSamplerBackwardCall&,
    const gsd::BackwardPlan&,
    bool);

} // namespace detgrid::exact
