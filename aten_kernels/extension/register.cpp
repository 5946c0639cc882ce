// Registers the detgrid operators and the switch behind detgrid.enable().
// The kernels never know how they are registered; this file is the only
// place that touches the dispatcher.

#include <Python.h>

#include "ops.h"

#include <ATen/ops/grid_sampler_2d_backward_native.h>
#include <ATen/ops/grid_sampler_3d_backward_native.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

namespace detgrid {

at::Tensor grid_gradient_cpu(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  return grid_gradient_by<at::native::launch_grid_sampler_grid_gradient_host>(
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners);
}

namespace {

template <int kDims>
std::tuple<at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask) {
  constexpr AtenBackwardFn stock = kDims == 2
      ? at::native::grid_sampler_2d_backward_cpu
      : at::native::grid_sampler_3d_backward_cpu;
  return deterministic_backward<kDims, stock, grid_gradient_cpu>(
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners,
      output_mask);
}

// detgrid.ops.backward_route: the route of routing.h, by name.
std::string backward_route_name(
    const std::string& device,
    bool deterministic,
    bool warn_only,
    std::array<bool, 2> output_mask) {
  TORCH_CHECK(
      device == "cpu" || device == "cuda",
      "detgrid: device must be 'cpu' or 'cuda', got '",
      device,
      "'");
  const BackwardRoute route = backward_route(
      device == "cpu" ? c10::DeviceType::CPU : c10::DeviceType::CUDA,
      deterministic,
      warn_only,
      output_mask);
  return route == BackwardRoute::Stock ? "stock" : "detgrid";
}

// detgrid::_grid_gradient: the grid gradient a grid-only call takes on the
// detgrid route, after the backward's checks.
template <GridGradientFn grid_gradient>
at::Tensor checked_grid_gradient(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  check_backward_inputs(
      input.dim() - 2,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode);
  return grid_gradient(
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners);
}

// Replacing aten's kernel is the point of the switch, so the dispatcher's
// "Overriding a previously registered kernel" warning is dropped while we
// register; every other warning goes on to the handler that was in place.
class DropOverrideWarning : public c10::WarningHandler {
 public:
  explicit DropOverrideWarning(c10::WarningHandler* next) : next_(next) {}

  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") ==
        std::string::npos) {
      next_->process(warning);
    }
  }

 private:
  c10::WarningHandler* next_;
};

// The generated wrappers the CPU overrides replace.
constexpr GeneratedWrapper kCpuBackward2d{
    "wrapper_CPU__grid_sampler_2d_backward",
    {"grad_output", "input", "grid"}};
constexpr GeneratedWrapper kCpuBackward3d{
    "wrapper_CPU__grid_sampler_3d_backward",
    {"grad_output", "input", "grid"}};

// Registrations on the aten namespace live exactly as long as these
// libraries; dropping one restores the stock kernels.
std::unique_ptr<torch::Library>& override_slot(c10::DispatchKey key) {
  static std::unique_ptr<torch::Library> cpu;
  static std::unique_ptr<torch::Library> cuda;
  return key == c10::DispatchKey::CPU ? cpu : cuda;
}

void set_aten_override(const std::string& device, bool enabled) {
  TORCH_CHECK(
      device == "cpu" || device == "cuda",
      "detgrid: device must be 'cpu' or 'cuda', got '",
      device,
      "'");
  const auto key =
      device == "cpu" ? c10::DispatchKey::CPU : c10::DispatchKey::CUDA;
  auto& slot = override_slot(key);
  if (!enabled) {
    slot.reset();
    return;
  }
  if (slot) {
    return;
  }
#ifndef DETGRID_WITH_CUDA
  TORCH_CHECK(
      key == c10::DispatchKey::CPU,
      "detgrid: this build has no CUDA kernels (torch or nvcc had no CUDA "
      "when it was built)");
#endif
  DropOverrideWarning handler(c10::WarningUtils::get_warning_handler());
  const c10::WarningUtils::WarningHandlerGuard guard(&handler);
  auto library = std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
  if (key == c10::DispatchKey::CPU) {
    // Stock's CPU backward is deterministic already; routing it lets the
    // switch itself be tested on machines without a GPU.
    library->impl(
        "grid_sampler_2d_backward",
        TORCH_FN((AsGeneratedWrapper<
                  &routed_backward<
                      backward_cpu<2>,
                      at::native::grid_sampler_2d_backward_cpu>,
                  kCpuBackward2d>::call)));
    library->impl(
        "grid_sampler_3d_backward",
        TORCH_FN((AsGeneratedWrapper<
                  &routed_backward<
                      backward_cpu<3>,
                      at::native::grid_sampler_3d_backward_cpu>,
                  kCpuBackward3d>::call)));
  }
#ifdef DETGRID_WITH_CUDA
  else {
    register_cuda_overrides(*library);
  }
#endif
  slot = std::move(library);
}

bool has_cuda_kernels() {
#ifdef DETGRID_WITH_CUDA
  return true;
#else
  return false;
#endif
}

} // namespace

TORCH_LIBRARY(detgrid, m) {
  m.def(
      "grid_sampler_2d_backward(Tensor grad_output, Tensor input, "
      "Tensor grid, int interpolation_mode, int padding_mode, "
      "bool align_corners, bool[2] output_mask) -> (Tensor, Tensor)");
  m.def(
      "grid_sampler_3d_backward(Tensor grad_output, Tensor input, "
      "Tensor grid, int interpolation_mode, int padding_mode, "
      "bool align_corners, bool[2] output_mask) -> (Tensor, Tensor)");
  m.def(
      "_grid_gradient(Tensor grad_output, Tensor input, Tensor grid, "
      "int interpolation_mode, int padding_mode, bool align_corners) -> Tensor");
  m.def(
      "_backward_route(str device, bool deterministic, bool warn_only, "
      "bool[2] output_mask) -> str",
      &backward_route_name);
  m.def(
      "_set_aten_override(str device, bool enabled) -> ()", &set_aten_override);
  m.def("_has_cuda_kernels() -> bool", &has_cuda_kernels);
}

// Registers one device's 2-D and 3-D backward and grid gradient.
template <
    AtenBackwardFn backward_2d,
    AtenBackwardFn backward_3d,
    GridGradientFn grid_gradient>
void impl_backward(torch::Library& m) {
  m.impl("_grid_gradient", TORCH_FN(checked_grid_gradient<grid_gradient>));
  m.impl("grid_sampler_2d_backward", TORCH_FN(backward_2d));
  m.impl("grid_sampler_3d_backward", TORCH_FN(backward_3d));
}

TORCH_LIBRARY_IMPL(detgrid, CPU, m) {
  impl_backward<backward_cpu<2>, backward_cpu<3>, grid_gradient_cpu>(m);
}

#ifdef DETGRID_WITH_CUDA
TORCH_LIBRARY_IMPL(detgrid, CUDA, m) {
  impl_backward<backward_cuda<2>, backward_cuda<3>, grid_gradient_cuda>(m);
}
#endif

} // namespace detgrid

// The operators register when the library loads; `import detgrid._C` is
// all Python needs, so the module itself is empty.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1};
  return PyModule_Create(&module);
}
