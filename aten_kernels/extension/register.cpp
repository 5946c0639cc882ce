// Registers the detgrid operators and the switch behind detgrid.enable().
// The kernels never know how they are registered; this file is the only
// place that touches the dispatcher.

#include <Python.h>

#include "GridSamplerDeterministicCPU.h"
#include "ops.h"

#include <ATen/ops/grid_sampler_2d_backward_native.h>
#include <ATen/ops/grid_sampler_3d_backward_native.h>
#include <ATen/ops/empty.h>
#include <c10/util/strides.h>
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
      grad_output, input, grid, interpolation_mode, padding_mode, align_corners);
}

template <int kDims>
std::tuple<at::Tensor, at::Tensor> backward_cpu(
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
  constexpr AtenBackwardFn stock = kDims == 2
      ? at::native::grid_sampler_2d_backward_cpu
      : at::native::grid_sampler_3d_backward_cpu;
  if (auto result = unless_grad_input_requested<stock, grid_gradient_cpu>(
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
  const auto plan = plan_with_knobs(call, options);
  write_requested_grad_grid<at::native::launch_grid_sampler_grid_gradient_host>(
      call);
  if (options.accumulate == kAccumulateOrdered) {
    grid_sampler_backward_executor(call, plan, options.grain_size);
  } else {
    grid_sampler_backward_exact_executor(
        call,
        plan,
        options.accumulate == kAccumulateExactAtomic,
        options.grain_size);
  }
  return {grad_input, grad_grid};
}

namespace {

template <BackwardWithOptionsFn backward>
std::tuple<at::Tensor, at::Tensor> backward_with_options(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    int64_t chunk_points,
    int64_t block_size,
    int64_t max_blocks,
    int64_t grain_size,
    int64_t key_bits,
    int64_t index_bits,
    int64_t keying,
    int64_t gather,
    int64_t accumulate,
    int64_t serial_fold,
    int64_t reduce,
    int64_t channel_group,
    int64_t separate_fills,
    int64_t carry_elements) {
  return backward(
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners,
      output_mask,
      BackwardOptions{
          chunk_points,
          block_size,
          max_blocks,
          grain_size,
          key_bits,
          index_bits,
          keying,
          gather,
          accumulate,
          serial_fold,
          reduce,
          channel_group,
          separate_fills,
          carry_elements});
}

// A CPU tensor with these sizes and strides over one element of storage.
// The counting executor reads no data, but the pipeline takes data pointers,
// which a meta tensor refuses to give.
at::Tensor shell(
    at::IntArrayRef sizes,
    at::IntArrayRef strides,
    at::ScalarType dtype) {
  at::Tensor t = at::empty({1}, at::TensorOptions().dtype(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  return t;
}

at::Tensor shell_like(const at::Tensor& t) {
  return shell(t.sizes(), t.strides(), t.scalar_type());
}

// A gradient as allocate_gradients makes it (contiguous), or undefined.
at::Tensor gradient_shell(const at::Tensor& like, bool requested) {
  if (!requested) {
    return at::Tensor();
  }
  return shell(
      like.sizes(),
      c10::contiguous_strides(like.sizes()),
      like.scalar_type());
}

// The ordered pipeline's longest fold, which follows from where the grid's
// points land: measured by running the call on the host where the tensors
// are CPU tensors with data (its gradients are computed and dropped); -1 for
// meta tensors, or an exact accumulation, which has no folds.
int64_t longest_fold_of(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    const detgrid::BackwardCall& shells,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan,
    int64_t accumulate) {
  if (accumulate != kAccumulateOrdered || !grid.is_cpu()) {
    return -1;
  }
  // As GridSampler.cpp allocates it: contiguous, not zeroed.
  const at::Tensor grad_input = at::empty(
      input.sizes(), at::TensorOptions().dtype(input.scalar_type()));
  const detgrid::BackwardCall call{
      {grad_input,
       grad_output,
       input,
       grid,
       shells.interpolation_mode,
       shells.padding_mode,
       shells.align_corners},
      at::Tensor(),
      {true, false}};
  return longest_fold(call, plan);
}

// detgrid.ops.work_counters: what the CUDA pipeline would do for these
// tensors (their sizes, strides and dtype; meta tensors will do), counted by
// running it with the counting executor: the values of WORK_COUNTER_FIELDS
// (tools/detgrid/ops.py), in its order.
std::vector<int64_t> backward_work_counters(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    int64_t chunk_points,
    int64_t key_bits,
    int64_t index_bits,
    int64_t keying,
    int64_t gather,
    int64_t accumulate,
    int64_t serial_fold,
    int64_t reduce,
    int64_t channel_group,
    int64_t separate_fills,
    int64_t carry_elements) {
  const int64_t spatial_dims = input.dim() - 2;
  check_backward_inputs(
      spatial_dims, grad_output, input, grid, interpolation_mode, padding_mode);
  const at::Tensor grad_input_shell = gradient_shell(input, output_mask[0]);
  const at::Tensor grad_grid_shell = gradient_shell(grid, output_mask[1]);
  const at::Tensor grad_output_shell = shell_like(grad_output);
  const at::Tensor input_shell = shell_like(input);
  const at::Tensor grid_shell = shell_like(grid);
  const detgrid::BackwardCall call{
      {grad_input_shell,
       grad_output_shell,
       input_shell,
       grid_shell,
       interpolation_mode,
       padding_mode,
       align_corners},
      grad_grid_shell,
      output_mask};
  if (!output_mask[0]) {
    // On CUDA a deterministic call for grad_grid alone takes the grid
    // gradient's kernel (routing.h): launches, and no chunk, sort,
    // workspace or fold.
    const int64_t launches =
        output_mask[1] ? count_grid_gradient_work(call).launches : 0;
    return {launches, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  }
  BackwardOptions knobs;
  knobs.chunk_points = chunk_points;
  knobs.key_bits = key_bits;
  knobs.index_bits = index_bits;
  knobs.keying = keying;
  knobs.gather = gather;
  knobs.accumulate = accumulate;
  knobs.serial_fold = serial_fold;
  knobs.reduce = reduce;
  knobs.channel_group = channel_group;
  knobs.separate_fills = separate_fills;
  knobs.carry_elements = carry_elements;
  const auto plan = plan_with_knobs(call, knobs);
  const WorkCounters counters = accumulate == kAccumulateOrdered
      ? count_backward_work(call, plan)
      : count_exact_backward_work(
            call, plan, accumulate == kAccumulateExactAtomic);
  // The grid gradient's launch comes before grad_input's, outside its
  // chunks.
  const int64_t grid_launches =
      output_mask[1] ? count_grid_gradient_work(call).launches : 0;
  return {
      grid_launches + counters.launches,
      counters.chunks,
      counters.launches_per_chunk,
      counters.items_sorted,
      counters.key_bits,
      counters.key_bytes,
      counters.workspace_bytes,
      counters.sort_scratch_bytes,
      counters.elements_swept,
      counters.atomics,
      longest_fold_of(grad_output, input, grid, call, plan, accumulate),
      accumulate == kAccumulateOrdered ? counters.channel_merges : -1,
      counters.longest_fill};
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
      grad_output, input, grid, interpolation_mode, padding_mode, align_corners);
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
                      with_default_options<backward_cpu<2>>,
                      at::native::grid_sampler_2d_backward_cpu>,
                  kCpuBackward2d>::call)));
    library->impl(
        "grid_sampler_3d_backward",
        TORCH_FN((AsGeneratedWrapper<
                  &routed_backward<
                      with_default_options<backward_cpu<3>>,
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
      "_grid_sampler_2d_backward_with_options(Tensor grad_output, "
      "Tensor input, Tensor grid, int interpolation_mode, int padding_mode, "
      "bool align_corners, bool[2] output_mask, int chunk_points, "
      "int block_size, int max_blocks, int grain_size, int key_bits, "
      "int index_bits, int keying, int gather, int accumulate, int serial_fold, "
      "int reduce, int channel_group, int separate_fills, int carry_elements) "
      "-> (Tensor, Tensor)");
  m.def(
      "_grid_sampler_3d_backward_with_options(Tensor grad_output, "
      "Tensor input, Tensor grid, int interpolation_mode, int padding_mode, "
      "bool align_corners, bool[2] output_mask, int chunk_points, "
      "int block_size, int max_blocks, int grain_size, int key_bits, "
      "int index_bits, int keying, int gather, int accumulate, int serial_fold, "
      "int reduce, int channel_group, int separate_fills, int carry_elements) "
      "-> (Tensor, Tensor)");
  m.def(
      "_backward_work_counters(Tensor grad_output, Tensor input, "
      "Tensor grid, int interpolation_mode, int padding_mode, "
      "bool align_corners, bool[2] output_mask, int chunk_points, "
      "int key_bits, int index_bits, int keying, int gather, int accumulate, "
      "int serial_fold, int reduce, int channel_group, int separate_fills, "
      "int carry_elements) -> int[]",
      &backward_work_counters);
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
  m.def(
      "_point_taps(Tensor grid, int[] input_size, int interpolation_mode, "
      "int padding_mode, bool align_corners) -> (Tensor, Tensor, Tensor)",
      &point_taps);
}

// Registers one device's 2-D and 3-D backward and grid gradient.
template <
    BackwardWithOptionsFn backward_2d,
    BackwardWithOptionsFn backward_3d,
    GridGradientFn grid_gradient>
void impl_backward(torch::Library& m) {
  m.impl("_grid_gradient", TORCH_FN(checked_grid_gradient<grid_gradient>));
  m.impl(
      "grid_sampler_2d_backward", TORCH_FN(with_default_options<backward_2d>));
  m.impl(
      "grid_sampler_3d_backward", TORCH_FN(with_default_options<backward_3d>));
  m.impl(
      "_grid_sampler_2d_backward_with_options",
      TORCH_FN(backward_with_options<backward_2d>));
  m.impl(
      "_grid_sampler_3d_backward_with_options",
      TORCH_FN(backward_with_options<backward_3d>));
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
