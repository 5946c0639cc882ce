#pragma once
// The extension's operators: the deterministic backward on each device, and
// the routing behind detgrid.enable().

#include <ATen/Context.h>
#include <ATen/DeviceGuard.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "GridGradient.h"
#include "routing.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>

namespace detgrid {

// Same checks as stock grid_sampler_{2d,3d}_backward (spatial_dims 2 or 3),
// plus dtype and mode checks that stock leaves to the kernel.
void check_backward_inputs(
    int64_t spatial_dims,
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode);

// The check of stock's own backward that detgrid's operators relax: 5-D
// bicubic input, which torch rejects before 2.15 (its forward does too). A
// routed aten call is refused where stock's would be.
void check_as_stock_backward(
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode);

// grad_input / grad_grid with stock's sizes and contiguous strides;
// undefined when not asked. They are allocated without the fill that
// at::empty gives in deterministic mode
// (torch.utils.deterministic.fill_uninitialized_memory): the grid gradient
// writes every element of grad_grid, and grad_input is zeroed before the
// core adds to it, so that fill would be a second write of every element,
// for nothing.
std::tuple<at::Tensor, at::Tensor> allocate_gradients(
    const at::Tensor& input,
    const at::Tensor& grid,
    std::array<bool, 2> output_mask);

// The kernel signature of aten::grid_sampler_{2d,3d}_backward.
using AtenBackwardFn = std::tuple<at::Tensor, at::Tensor> (*)(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask);

// The grid gradient alone (GridGradient.cu), as a kernel: checked
// arguments in, a contiguous grad_grid out.
using GridGradientFn = at::Tensor (*)(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners);

// grad_grid of a grid-only call (checked arguments of either rank), as
// allocate_gradients allocates it, written in full by `launch`, the grid
// gradient's launcher on one device.
template <at::native::GridGradientLaunch* launch>
at::Tensor grid_gradient_by(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  const at::Tensor grad_grid =
      std::get<1>(allocate_gradients(input, grid, {false, true}));
  launch(
      grad_grid,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners);
  return grad_grid;
}

at::Tensor grid_gradient_cpu(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners);

// What detgrid's backward gives a call that does not request grad_input:
// nothing for a call that requests nothing; grad_grid from stock's kernel
// where backward_route gives a deterministic call to stock (CPU), from
// detgrid's grid gradient, with stock's CUDA arithmetic, otherwise;
// nullopt when grad_input is requested, for the core to compute.
template <AtenBackwardFn stock, GridGradientFn grid_gradient>
std::optional<std::tuple<at::Tensor, at::Tensor>> unless_grad_input_requested(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask) {
  if (output_mask[0]) {
    return std::nullopt;
  }
  if (!output_mask[1]) {
    return std::tuple<at::Tensor, at::Tensor>{};
  }
  const BackwardRoute route = backward_route(
      input.device().type(),
      /*deterministic=*/true,
      /*warn_only=*/false,
      output_mask);
  if (route == BackwardRoute::Stock) {
    return stock(
        grad_output,
        input,
        grid,
        interpolation_mode,
        padding_mode,
        align_corners,
        output_mask);
  }
  return std::tuple<at::Tensor, at::Tensor>{
      at::Tensor(),
      grid_gradient(
          grad_output,
          input,
          grid,
          interpolation_mode,
          padding_mode,
          align_corners)};
}

// grad_input by the build of the core that the whole upstream stack gives
// (core_ops.cpp), on the tensors' device, for checked arguments: a
// contiguous tensor of the input's sizes.
at::Tensor stack_grad_input(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners);

// detgrid's backward of kDims spatial dimensions on one device, as the
// patched GridSampler.cu gives it: grad_input from the core, grad_grid
// from the grid gradient (upstream, stock's kernel writes it).
template <int kDims, AtenBackwardFn stock, GridGradientFn grid_gradient>
std::tuple<at::Tensor, at::Tensor> deterministic_backward(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask) {
  check_backward_inputs(
      kDims, grad_output, input, grid, interpolation_mode, padding_mode);
  if (auto result = unless_grad_input_requested<stock, grid_gradient>(
          grad_output,
          input,
          grid,
          interpolation_mode,
          padding_mode,
          align_corners,
          output_mask)) {
    return *result;
  }
  at::Tensor grad_grid;
  if (output_mask[1]) {
    grad_grid = grid_gradient(
        grad_output,
        input,
        grid,
        interpolation_mode,
        padding_mode,
        align_corners);
  }
  return {
      stack_grad_input(
          grad_output,
          input,
          grid,
          interpolation_mode,
          padding_mode,
          align_corners),
      grad_grid};
}

// aten's grid_sampler backward kernels return a grad_grid whatever
// output_mask says (stock's compute it anyway, the meta kernel allocates
// it), and C++ callers read it (cpp-wrapper fallbacks, functorch's batch
// rule); its values are no part of the contract. A routed call that did not
// request it returns zeros: the same bits on every run, for one fill.
inline std::tuple<at::Tensor, at::Tensor> with_aten_grad_grid(
    std::tuple<at::Tensor, at::Tensor> gradients,
    const at::Tensor& grid) {
  at::Tensor& grad_grid = std::get<1>(gradients);
  if (!grad_grid.defined()) {
    grad_grid = at::zeros_like(grid, at::MemoryFormat::Contiguous);
  }
  return gradients;
}

// A routed call runs inside the aten op's own profiler range, which looks
// the same whether stock or detgrid ran; this range, named after the
// operator torch.ops.detgrid exposes, shows a trace that detgrid ran.
#define DETGRID_RECORD_ROUTED(spatial_dims, grad_output, input, grid) \
  RECORD_FUNCTION(                                                    \
      (spatial_dims) == 3 ? "detgrid::grid_sampler_3d_backward"       \
                          : "detgrid::grid_sampler_2d_backward",      \
      std::vector<c10::IValue>({grad_output, input, grid}))

// aten::grid_sampler_{2d,3d}_backward on a device where detgrid is enabled:
// `deterministic` or `stock` as backward_route says, from one reading of
// the deterministic-algorithms state.
template <AtenBackwardFn deterministic, AtenBackwardFn stock>
std::tuple<at::Tensor, at::Tensor> routed_backward(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask) {
  const at::Context& context = at::globalContext();
  const BackwardRoute route = backward_route(
      input.device().type(),
      context.deterministicAlgorithms(),
      context.deterministicAlgorithmsWarnOnly(),
      output_mask);
  if (route == BackwardRoute::Stock) {
    return stock(
        grad_output,
        input,
        grid,
        interpolation_mode,
        padding_mode,
        align_corners,
        output_mask);
  }
  check_as_stock_backward(input, grid, interpolation_mode);
  DETGRID_RECORD_ROUTED(input.dim() - 2, grad_output, input, grid);
  return with_aten_grad_grid(
      deterministic(
          grad_output,
          input,
          grid,
          interpolation_mode,
          padding_mode,
          align_corners,
          output_mask),
      grid);
}

// The generated wrapper (RegisterCPU.cpp, RegisterCUDA.cpp) of the aten
// kernel an override replaces: its name and its tensor arguments' names in
// schema order, which stock's device-check error reports.
struct GeneratedWrapper {
  const char* name;
  std::array<const char*, 3> tensors;
};

// The device of a call's first tensor argument, which the generated
// wrappers make current.
template <typename... Args>
std::optional<c10::Device> device_of_first_tensor(const Args&... args) {
  std::optional<c10::Device> device;
  auto consider = [&](const auto& arg) {
    if constexpr (std::is_same_v<std::decay_t<decltype(arg)>, at::Tensor>) {
      if (!device) {
        device = at::device_of(arg);
      }
    }
  };
  (consider(args), ...);
  return device;
}

// `kernel` as an override of `wrapper`'s kernel: what the generated CUDA
// wrapper does before its kernel, done before any routing. It checks that
// the call's tensors share a device, with stock's error (a direct aten call
// with grad_output on another device must not reach a kernel with a foreign
// pointer), then makes that device current (stock's kernels and cuDNN
// launch on the current device: tensors on cuda:1 while cuda:0 is
// current). The CPU wrapper does neither, and both are no-ops for any call
// the dispatcher sends to CPU; the CPU overrides take them all the same, so
// that CPU tests reach the path of the CUDA ones.
template <auto kernel, const GeneratedWrapper& wrapper>
struct AsGeneratedWrapper;

template <
    typename Result,
    typename... Args,
    Result (*kernel)(Args...),
    const GeneratedWrapper& wrapper>
struct AsGeneratedWrapper<kernel, wrapper> {
  static_assert(
      (std::is_same_v<std::decay_t<Args>, at::Tensor> + ...) ==
      wrapper.tensors.size());

  static Result call(Args... args) {
    std::optional<c10::Device> common_device;
    size_t tensor_index = 0;
    auto check = [&](const auto& arg) {
      if constexpr (std::is_same_v<std::decay_t<decltype(arg)>, at::Tensor>) {
        c10::impl::check_and_update_common_device(
            common_device, arg, wrapper.name, wrapper.tensors[tensor_index++]);
      }
    };
    (check(args), ...);
    const c10::OptionalDeviceGuard device_guard(
        device_of_first_tensor(args...));
    return kernel(args...);
  }
};

#ifdef DETGRID_WITH_CUDA
at::Tensor grid_gradient_cuda(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners);

// The deterministic backward of kDims spatial dimensions on CUDA.
template <int kDims>
std::tuple<at::Tensor, at::Tensor> backward_cuda(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask);

// Registers, on `aten_cuda`, the CUDA kernels of grid_sampler_2d_backward,
// grid_sampler_3d_backward and cudnn_grid_sampler_backward that pick the
// deterministic backward when deterministic algorithms are on, and the stock
// kernels otherwise.
void register_cuda_overrides(torch::Library& aten_cuda);
#endif

} // namespace detgrid
