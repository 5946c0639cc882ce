// Host executors of the deterministic grid_sampler_2d/3d backward.
//
// Both run run_deterministic_backward() of ATen/native/cuda/GridSampler
// DeterministicPipeline.cuh, the function the CUDA launcher runs, for every
// interpolation mode (the same ones), with the same stage order and the
// same key and index types; only the primitives differ:
// at::parallel_for where CUDA launches a grid-stride kernel, std::stable_sort
// where CUDA calls CUB's stable radix sort, a sequential scan for CUB's. The
// result therefore follows the canonical order documented in the .cu file,
// and for float and double equals the CUDA kernel's bit for bit. This is what
// lets the kernel's numerics, and its orchestration, be proven on machines
// without a GPU; it is also a deterministic CPU backward in its own right.
//
// The counting executor runs the same pipeline without running any stage:
// it only counts what a run would do (launches, items sorted, workspace).

#include "GridSamplerDeterministicCPU.h"
#include "../hostify/control.h"
#include "GridGradient.h"
#include "HostExecutors.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

namespace detgrid {
namespace {

using at::native::detail::GridSamplerInterpolation;
using at::native::detail::GridSamplerPadding;
namespace gsd = at::native::grid_sampler_deterministic;

template <typename scalar_t, int kTaps, int kDims>
void fill_point_taps(
    const at::Tensor& grid,
    at::IntArrayRef input_size,
    GridSamplerPadding padding_mode,
    bool align_corners,
    const at::Tensor& index,
    const at::Tensor& in_bounds,
    const at::Tensor& weight) {
  using T = at::opmath_type<scalar_t>;
  using at::native::grid_sampler_deterministic::Spatial;
  Spatial<int64_t, kDims> sizes;
  for (int a = 0; a < kDims; ++a) {
    sizes.v[a] = input_size[a];
  }
  const auto coords = grid.accessor<scalar_t, 2>();
  auto index_out = index.accessor<int64_t, 3>();
  auto in_bounds_out = in_bounds.accessor<bool, 2>();
  auto weight_out = weight.accessor<T, 2>();
  for (int64_t p = 0; p < grid.size(0); ++p) {
    T coord[kDims];
    for (int k = 0; k < kDims; ++k) {
      coord[k] = static_cast<T>(coords[p][k]);
    }
    const auto taps =
        at::native::grid_sampler_deterministic::compute_point_taps<
            kTaps,
            scalar_t>(
            coord, sizes, padding_mode, align_corners);
    for (int t = 0; t < taps.count; ++t) {
      const auto position = taps.position(t);
      for (int a = 0; a < kDims; ++a) {
        index_out[p][t][a] = position.v[a];
      }
      in_bounds_out[p][t] = taps.in_bounds(t);
      weight_out[p][t] = taps.template sample_weight<scalar_t>(t);
    }
  }
}

} // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> point_taps(
    const at::Tensor& grid,
    at::IntArrayRef input_size,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  const int64_t dims = static_cast<int64_t>(input_size.size());
  TORCH_CHECK(
      (dims == 2 || dims == 3) && grid.dim() == 2 && grid.size(1) == dims &&
          grid.device().is_cpu(),
      "_point_taps: expected a CPU grid of shape (points, ",
      dims,
      ") and 2 or 3 input sizes");
  const auto mode = static_cast<GridSamplerInterpolation>(interpolation_mode);
  const auto padding = static_cast<GridSamplerPadding>(padding_mode);
  const int64_t taps = at::native::grid_sampler_deterministic::taps_per_point(
      at::native::grid_sampler_deterministic::taps_per_axis(mode),
      static_cast<int>(dims));
  const at::Tensor coords = grid.contiguous();
  const at::Tensor index =
      at::empty({grid.size(0), taps, dims}, grid.options().dtype(at::kLong));
  const at::Tensor in_bounds =
      at::empty({grid.size(0), taps}, grid.options().dtype(at::kBool));
  const at::Tensor weight = at::empty(
      {grid.size(0), taps},
      grid.options().dtype(at::toOpMathType(grid.scalar_type())));
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grid.scalar_type(), "_point_taps", [&] {
        at::native::grid_sampler_deterministic::dispatch_taps_per_axis(
            mode, [&](auto taps_per_axis) {
              constexpr int kTaps = decltype(taps_per_axis)::value;
              if (dims == 2) {
                fill_point_taps<scalar_t, kTaps, 2>(
                    coords, input_size, padding, align_corners, index,
                    in_bounds, weight);
              } else {
                fill_point_taps<scalar_t, kTaps, 3>(
                    coords, input_size, padding, align_corners, index,
                    in_bounds, weight);
              }
            });
      });
  return {index, in_bounds, weight};
}

void grid_sampler_backward_executor(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan,
    int64_t grain_size) {
  check_grain_size(grain_size);
  check_rank(call.input);
  gsd::run_deterministic_backward(
      HostExecutor{grain_size > 0 ? grain_size : kDefaultGrainSize},
      call,
      plan);
}

int64_t longest_fold(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan) {
  check_rank(call.input);
  int64_t longest = 0;
  gsd::run_deterministic_backward(
      FoldLengthExecutor{{kDefaultGrainSize}, &longest}, call, plan);
  return longest;
}

namespace {

// Sets hostify's launches to be counted, not run, for one call, and puts
// back the Config in place before it.
class CountOnly {
 public:
  CountOnly() : saved_(hostify::config()) {
    hostify::config() = hostify::Config{};
    hostify::config().run = false;
    hostify::counters() = hostify::Counters{};
  }
  ~CountOnly() {
    hostify::config() = saved_;
  }

 private:
  hostify::Config saved_;
};

} // namespace

WorkCounters count_grid_gradient_work(
    const detgrid::BackwardCall& call) {
  check_rank(call.input);
  const CountOnly count_only;
  at::native::launch_grid_sampler_grid_gradient_host(
      call.grad_grid,
      call.grad_output,
      call.input,
      call.grid,
      call.interpolation_mode,
      call.padding_mode,
      call.align_corners);
  WorkCounters counters;
  counters.launches = hostify::counters().launches;
  return counters;
}

WorkCounters count_backward_work(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan) {
  check_rank(call.input);
  WorkCounters counters;
  gsd::run_deterministic_backward(CountingExecutor{&counters}, call, plan);
  return counters;
}

} // namespace detgrid
