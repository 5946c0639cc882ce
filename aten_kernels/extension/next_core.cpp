// The operators of the next core (aten_kernels/next/: the deterministic
// backward in PyTorch's own idiom, issue 59) on the host: its CUDA source
// compiled through hostify (aten_kernels/hostify/prelude.h), which setup.py
// builds as objects of their own and links in.

#include "ops.h"

#include "../hostify/control.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <string>
#include <vector>

#ifdef DETGRID_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace at::native {
#ifdef DETGRID_WITH_CUDA
// The CUDA build (nvcc) of the same source.
void launch_grid_sampler_backward_deterministic_kernel(
    const TensorBase& grad_input,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners);
#endif
// The host build's name for launch_grid_sampler_backward_deterministic_kernel
// (setup.py renames it, so that a CUDA build holds both).
void launch_grid_sampler_backward_deterministic_host_kernel(
    const TensorBase& grad_input,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners);
} // namespace at::native

namespace hostify {
extern const char* const kHostifiedSourceSha256;
at::Tensor existing_kernel_grad_input(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners);
} // namespace hostify

namespace detgrid {
namespace {

// Sets hostify's launch shape for one call and restores the default after.
class LaunchShape {
 public:
  LaunchShape(int64_t block_size, int64_t grid_size, int64_t shuffle_seed, bool run) {
    TORCH_CHECK(
        block_size >= 0 && grid_size >= 0 && shuffle_seed >= 0,
        "next core: block_size, grid_size and shuffle_seed must be 0 or "
        "positive, got ",
        block_size,
        ", ",
        grid_size,
        ", ",
        shuffle_seed);
    hostify::config() = hostify::Config{
        block_size, grid_size, static_cast<uint64_t>(shuffle_seed), run};
    hostify::counters() = hostify::Counters{};
  }
  ~LaunchShape() {
    hostify::config() = hostify::Config{};
  }
};

at::Tensor zeroed_grad_input(const at::Tensor& input) {
  return at::zeros(input.sizes(), input.options());
}

// The CUDA build's grad_input; the launch shape is the kernel's own there.
at::Tensor cuda_grad_input(
    const at::Tensor& grad_input,
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    bool launch_shape_given) {
  TORCH_CHECK(
      !launch_shape_given,
      "next core: block_size, grid_size and shuffle_seed shape the host "
      "build's launches only");
#ifdef DETGRID_WITH_CUDA
  const c10::cuda::CUDAGuard guard(input.device());
  at::native::launch_grid_sampler_backward_deterministic_kernel(
      grad_input,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners);
  return grad_input;
#else
  TORCH_CHECK(false, "next core: this build of detgrid has no CUDA kernels");
#endif
}

at::Tensor next_core_grad_input(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    int64_t block_size,
    int64_t grid_size,
    int64_t shuffle_seed) {
  check_backward_inputs(
      input.dim() - 2, grad_output, input, grid, interpolation_mode, padding_mode);
  at::Tensor grad_input = zeroed_grad_input(input);
  if (input.is_cuda()) {
    return cuda_grad_input(
        grad_input,
        grad_output,
        input,
        grid,
        interpolation_mode,
        padding_mode,
        align_corners,
        block_size != 0 || grid_size != 0 || shuffle_seed != 0);
  }
  TORCH_CHECK(
      input.device().is_cpu(),
      "next core: expected CPU or CUDA tensors, got ",
      input.device());
  const LaunchShape shape(block_size, grid_size, shuffle_seed, /*run=*/true);
  at::native::launch_grid_sampler_backward_deterministic_host_kernel(
      grad_input,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners);
  return grad_input;
}

// A CPU tensor of t's sizes, strides and dtype over no memory: a count-only
// run (hostify::Config::run false) reads its shape and never its data, as
// meta tensors would give it, which have no data pointer to pass.
at::Tensor shape_only(const at::Tensor& t) {
  alignas(16) static char nothing;
  return at::from_blob(
      &nothing, t.sizes(), t.strides(), t.options().device(at::kCPU));
}

// What the CUDA build would launch, sort and allocate for this call, from the
// shapes alone (meta tensors will do): launches, items sorted, the sort's
// end bit, key bytes, peak workspace bytes, threads launched.
std::vector<int64_t> next_core_counters(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  check_backward_inputs(
      input.dim() - 2, grad_output, input, grid, interpolation_mode, padding_mode);
  const at::Tensor grad_input = shape_only(input.contiguous());
  const LaunchShape shape(0, 0, 0, /*run=*/false);
  at::native::launch_grid_sampler_backward_deterministic_host_kernel(
      grad_input,
      shape_only(grad_output),
      shape_only(input),
      shape_only(grid),
      interpolation_mode,
      padding_mode,
      align_corners);
  const hostify::Counters& c = hostify::counters();
  return {
      c.launches,
      c.items_sorted,
      c.sort_end_bit,
      c.key_bytes,
      c.workspace_bytes,
      c.threads};
}

at::Tensor existing_kernel_reference(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  check_backward_inputs(
      input.dim() - 2, grad_output, input, grid, interpolation_mode, padding_mode);
  TORCH_CHECK(
      input.device().is_cpu(), "existing kernel reference: takes CPU tensors");
  return hostify::existing_kernel_grad_input(
      grad_output, input, grid, interpolation_mode, padding_mode, align_corners);
}

} // namespace

TORCH_LIBRARY_FRAGMENT(detgrid, m) {
  m.def(
      "_next_core_grad_input(Tensor grad_output, Tensor input, Tensor grid, "
      "int interpolation_mode, int padding_mode, bool align_corners, "
      "int block_size=0, int grid_size=0, int shuffle_seed=0) -> Tensor",
      &next_core_grad_input);
  m.def(
      "_next_core_counters(Tensor grad_output, Tensor input, Tensor grid, "
      "int interpolation_mode, int padding_mode, bool align_corners) -> int[]",
      &next_core_counters);
  m.def(
      "_existing_kernel_reference(Tensor grad_output, Tensor input, Tensor grid, "
      "int interpolation_mode, int padding_mode, bool align_corners) -> Tensor",
      &existing_kernel_reference);
  m.def("_next_core_source_sha256() -> str", [] {
    return std::string(hostify::kHostifiedSourceSha256);
  });
  m.def("_next_core_host_contracts() -> bool", [] {
    return hostify::contracts_multiply_adds();
  });
}

} // namespace detgrid
