// The operators of the upstream core (aten_kernels/aten/: the patch's
// GridSamplerDeterministic.cu) on the host: its CUDA source compiled through
// hostify (aten_kernels/hostify/prelude.h), which setup.py builds as objects
// of their own and links in; and on CUDA, its nvcc build.

#include "ops.h"

#include "../hostify/control.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <iterator>
#include <string>
#include <vector>

#ifdef DETGRID_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

// The builds of the core's file that level= runs (detgrid.levels.CORE_BUILDS):
// the core, then each prefix of the stack that ends with a speed level.
// setup.py compiles each one for the host through hostify, naming its
// launcher launch_grid_sampler_backward_deterministic_host_<build>, and on
// CUDA with nvcc: the core's as launch_..._kernel, a level's as
// launch_..._kernel_<build>.
#define DETGRID_CORE_BUILDS(_) \
  _(core, "core", kernel)      \
  _(grouped_channels, "grouped-channels", kernel_grouped_channels)

#define DETGRID_DECLARE_LAUNCHER(name) \
  void name(                           \
      const TensorBase& grad_input,    \
      const TensorBase& grad_output,   \
      const TensorBase& input,         \
      const TensorBase& grid,          \
      int64_t interpolation_mode,      \
      int64_t padding_mode,            \
      bool align_corners);

namespace at::native {
#define DETGRID_DECLARE_HOST(symbol, build, cuda_symbol) \
  DETGRID_DECLARE_LAUNCHER(                              \
      launch_grid_sampler_backward_deterministic_host_##symbol)
DETGRID_CORE_BUILDS(DETGRID_DECLARE_HOST)
#ifdef DETGRID_WITH_CUDA
#define DETGRID_DECLARE_CUDA(symbol, build, cuda_symbol) \
  DETGRID_DECLARE_LAUNCHER(                              \
      launch_grid_sampler_backward_deterministic_##cuda_symbol)
DETGRID_CORE_BUILDS(DETGRID_DECLARE_CUDA)
#endif
} // namespace at::native

namespace hostify {
#define DETGRID_DECLARE_SHA(symbol, build, cuda_symbol) \
  extern const char* const kHostifiedSourceSha256_##symbol;
DETGRID_CORE_BUILDS(DETGRID_DECLARE_SHA)
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

using Launcher = void (*)(
    const at::TensorBase&,
    const at::TensorBase&,
    const at::TensorBase&,
    const at::TensorBase&,
    int64_t,
    int64_t,
    bool);

struct CoreBuild {
  const char* name;
  Launcher host;
  Launcher cuda; // null without CUDA kernels
  const char* const*
      source_sha256; // of the source its host build was made from
};

#ifdef DETGRID_WITH_CUDA
#define DETGRID_CUDA_LAUNCHER(cuda_symbol) \
  &at::native::launch_grid_sampler_backward_deterministic_##cuda_symbol
#else
#define DETGRID_CUDA_LAUNCHER(cuda_symbol) nullptr
#endif
#define DETGRID_BUILD_ENTRY(symbol, build, cuda_symbol)                      \
  CoreBuild{                                                                 \
      build,                                                                 \
      &at::native::launch_grid_sampler_backward_deterministic_host_##symbol, \
      DETGRID_CUDA_LAUNCHER(cuda_symbol),                                    \
      &hostify::kHostifiedSourceSha256_##symbol},

constexpr CoreBuild kCoreBuilds[] = {DETGRID_CORE_BUILDS(DETGRID_BUILD_ENTRY)};

const CoreBuild& core_build(const std::string& level) {
  for (const CoreBuild& build : kCoreBuilds) {
    if (level == build.name) {
      return build;
    }
  }
  std::string names;
  for (const CoreBuild& build : kCoreBuilds) {
    names += names.empty() ? build.name : std::string(", ") + build.name;
  }
  TORCH_CHECK(
      false,
      "core: no build of the core named '",
      level,
      "'; the builds are ",
      names);
}

// Sets hostify's launch shape for one call and restores the default after.
class LaunchShape {
 public:
  LaunchShape(
      int64_t block_size,
      int64_t grid_size,
      int64_t shuffle_seed,
      bool run) {
    TORCH_CHECK(
        block_size >= 0 && grid_size >= 0 && shuffle_seed >= 0,
        "core: block_size, grid_size and shuffle_seed must be 0 or "
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

// grad_input as GridSampler.cpp hands it to the core's launcher: zeros, and
// one write of them (allocate_gradients).
at::Tensor zeroed_grad_input(const at::Tensor& input) {
  return std::get<0>(allocate_gradients(input, at::Tensor(), {true, false}))
      .zero_();
}

// The CUDA build's grad_input; the launch shape is the kernel's own there.
at::Tensor cuda_grad_input(
    const CoreBuild& build,
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
      "core: block_size, grid_size and shuffle_seed shape the host "
      "build's launches only");
#ifdef DETGRID_WITH_CUDA
  const c10::cuda::CUDAGuard guard(input.device());
  build.cuda(
      grad_input,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners);
  return grad_input;
#else
  TORCH_CHECK(false, "core: this build of detgrid has no CUDA kernels");
#endif
}

// grad_input by `build` on the tensors' device, for checked arguments;
// block_size, grid_size and shuffle_seed shape the host build's launches (0:
// hostify's defaults).
at::Tensor build_grad_input(
    const CoreBuild& build,
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    int64_t block_size = 0,
    int64_t grid_size = 0,
    int64_t shuffle_seed = 0) {
  at::Tensor grad_input = zeroed_grad_input(input);
  if (input.is_cuda()) {
    return cuda_grad_input(
        build,
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
      "core: expected CPU or CUDA tensors, got ",
      input.device());
  const LaunchShape shape(block_size, grid_size, shuffle_seed, /*run=*/true);
  build.host(
      grad_input,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners);
  return grad_input;
}

at::Tensor core_grad_input(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    int64_t block_size,
    int64_t grid_size,
    int64_t shuffle_seed,
    const std::string& level) {
  const CoreBuild& build = core_build(level);
  check_backward_inputs(
      input.dim() - 2,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode);
  return build_grad_input(
      build,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners,
      block_size,
      grid_size,
      shuffle_seed);
}

// A CPU tensor of t's sizes, strides and dtype over no memory: a count-only
// run (hostify::Config::run false) reads its shape and never its data, as
// meta tensors would give it, which have no data pointer to pass.
at::Tensor shape_only(const at::Tensor& t) {
  alignas(16) static char nothing;
  return at::from_blob(
      &nothing, t.sizes(), t.strides(), t.options().device(at::kCPU));
}

// Where the core's out-of-bounds taps are keyed: one past the last
// grad_input position of one channel over the batch.
int64_t nowhere_key(const at::Tensor& input) {
  int64_t positions = 1;
  for (int64_t d = 2; d < input.dim(); ++d) {
    positions *= input.size(d);
  }
  return input.size(0) * positions;
}

// What the CUDA build would launch, sort and allocate for this call:
// launches, items sorted, the sort's end bit, key bytes, peak workspace
// bytes, threads launched, from the shapes alone (meta tensors will do); and
// what needs the grid's values, counted by running the host build where the
// tensors are CPU tensors, -1 otherwise: the longest run of one grad_input
// position in a chunk, then, summed over chunks, the runs unique_by_key
// found (the out-of-bounds taps' run included), the runs with a grad_input
// position (that run left out) and the records in those runs (see
// hostify::Counters). Last, from the shapes again, the radix sorts: one per
// chunk.
std::vector<int64_t> core_counters(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    const std::string& level) {
  const CoreBuild& build = core_build(level);
  check_backward_inputs(
      input.dim() - 2,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode);
  const bool run = input.device().is_cpu() && grid.device().is_cpu() &&
      grad_output.device().is_cpu();
  const auto operand = [run](const at::Tensor& t) {
    return run ? t : shape_only(t);
  };
  const at::Tensor grad_input =
      run ? zeroed_grad_input(input) : shape_only(input.contiguous());
  const LaunchShape shape(0, 0, 0, run);
  hostify::config().nowhere_key = nowhere_key(input);
  build.host(
      grad_input,
      operand(grad_output),
      operand(input),
      operand(grid),
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
      c.threads,
      run ? c.longest_run : -1,
      run ? c.runs : -1,
      run ? c.landed_runs : -1,
      run ? c.landed_records : -1,
      c.sorts};
}

at::Tensor existing_kernel_reference(
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
  TORCH_CHECK(
      input.device().is_cpu(), "existing kernel reference: takes CPU tensors");
  return hostify::existing_kernel_grad_input(
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners);
}

} // namespace

at::Tensor stack_grad_input(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  // The last build is the whole stack's.
  return build_grad_input(
      std::end(kCoreBuilds)[-1],
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners);
}

TORCH_LIBRARY_FRAGMENT(detgrid, m) {
  // A kernel of its own dispatch key, below Autograd: autograd.cpp's
  // refusal of a call that requires grad comes first (a kernel given with
  // the schema would be CompositeImplicitAutograd, which bypasses it).
  m.def(
      "_core_grad_input(Tensor grad_output, Tensor input, Tensor grid, "
      "int interpolation_mode, int padding_mode, bool align_corners, "
      "int block_size=0, int grid_size=0, int shuffle_seed=0, "
      "str level=\"core\") -> Tensor");
  m.impl(
      "_core_grad_input",
      torch::dispatch(
          c10::DispatchKey::CompositeExplicitAutograd,
          TORCH_FN(core_grad_input)));
  m.def(
      "_core_counters(Tensor grad_output, Tensor input, Tensor grid, "
      "int interpolation_mode, int padding_mode, bool align_corners, "
      "str level=\"core\") -> int[]",
      &core_counters);
  m.def(
      "_existing_kernel_reference(Tensor grad_output, Tensor input, Tensor grid, "
      "int interpolation_mode, int padding_mode, bool align_corners) -> Tensor",
      &existing_kernel_reference);
  m.def(
      "_core_source_sha256(str level=\"core\") -> str",
      [](const std::string& level) {
        return std::string(*core_build(level).source_sha256);
      });
  m.def("_core_builds() -> str[]", [] {
    std::vector<std::string> names;
    for (const CoreBuild& build : kCoreBuilds) {
      names.emplace_back(build.name);
    }
    return names;
  });
  m.def("_core_host_contracts() -> bool", [] {
    return hostify::contracts_multiply_adds();
  });
}

} // namespace detgrid
