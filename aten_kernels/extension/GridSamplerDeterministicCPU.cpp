// Host executors of the deterministic grid_sampler_2d/3d backward.
//
// Both run the one pipeline of ATen/native/cuda/GridSamplerDeterministic
// Pipeline.cuh, the code the CUDA launcher runs, with the same stage order
// and the same key and index types; only the primitives differ:
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
using at::native::grid_sampler_deterministic::run_deterministic_backward;

constexpr int64_t kDefaultGrainSize = 1024;

struct HostExecutor {
  int64_t grain_size;

  template <typename count_t, typename Stage>
  void for_each(count_t count, const Stage& stage) const {
    if (count == 0) {
      return;
    }
    at::parallel_for(0, count, grain_size, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        stage(static_cast<count_t>(i));
      }
    });
  }

  template <typename row_t, typename col_t, typename Stage>
  void for_each_row(row_t rows, col_t cols, const Stage& stage) const {
    if (rows == 0 || cols == 0) {
      return;
    }
    const int64_t width = cols;
    at::parallel_for(
        0, int64_t{rows} * width, grain_size, [&](int64_t begin, int64_t end) {
          int64_t i = begin;
          while (i < end) {
            const int64_t r = i / width;
            const auto row = stage.row(static_cast<row_t>(r));
            for (int64_t c = i - r * width; c < width && i < end; ++c, ++i) {
              stage(row, static_cast<col_t>(c));
            }
          }
        });
  }

  template <typename key_t>
  void stable_sort_pairs(
      const key_t* keys_in,
      key_t* keys_out,
      const int32_t* values_in,
      int32_t* values_out,
      int32_t count,
      int /*end_bit: every key is below 2^end_bit*/) const {
    if (count == 0) {
      return;
    }
    std::vector<int32_t> order(count);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return keys_in[a] < keys_in[b];
    });
    for (int32_t i = 0; i < count; ++i) {
      keys_out[i] = keys_in[order[i]];
      values_out[i] = values_in[order[i]];
    }
  }

  void inclusive_sum(const int32_t* in, int32_t* out, int32_t count) const {
    std::partial_sum(in, in + count, out);
  }

  c10::DataPtr allocate(size_t bytes) const {
    return c10::GetCPUAllocator()->allocate(bytes);
  }

  void zero(void* data, size_t bytes) const {
    if (bytes > 0) {
      std::memset(data, 0, bytes);
    }
  }

  void begin_chunk() const {}
};

// The dense reduces: a thread of theirs per grad_input element swept.
template <typename Stage>
struct SweepsElements : std::false_type {};
template <typename Fold>
struct SweepsElements<at::native::grid_sampler_deterministic::ReduceDense<Fold>>
    : std::true_type {};
template <typename Fold>
struct SweepsElements<
    at::native::grid_sampler_deterministic::ReduceDenseChannelsFastest<Fold>>
    : std::true_type {};

// Runs nothing; counts what the CUDA executor would launch, sort and
// allocate for the same call (every count is a pure function of the shapes).
struct CountingExecutor {
  WorkCounters* counters;

  void launch() const {
    ++counters->launches;
    if (counters->chunks == 1) {
      ++counters->launches_per_chunk;
    }
  }

  template <typename count_t, typename Stage>
  void for_each(count_t count, const Stage& /*stage*/) const {
    if (count != 0) {
      launch();
      if constexpr (SweepsElements<Stage>::value) {
        counters->elements_swept += count;
      }
    }
  }

  template <typename row_t, typename col_t, typename Stage>
  void for_each_row(row_t rows, col_t cols, const Stage& /*stage*/) const {
    if (rows != 0 && cols != 0) {
      launch();
      if constexpr (SweepsElements<Stage>::value) {
        counters->elements_swept += int64_t{rows} * int64_t{cols};
      }
    }
  }

  template <typename key_t>
  void stable_sort_pairs(
      const key_t* /*keys_in*/,
      key_t* /*keys_out*/,
      const int32_t* /*values_in*/,
      int32_t* /*values_out*/,
      int32_t count,
      int end_bit) const {
    if (count == 0) {
      return;
    }
    launch();
    counters->items_sorted += count;
    counters->key_bits = end_bit;
    counters->key_bytes = sizeof(key_t);
    counters->sort_scratch_bytes = std::max<int64_t>(
        counters->sort_scratch_bytes,
        int64_t{count} * static_cast<int64_t>(sizeof(key_t) + sizeof(int32_t)));
  }

  void inclusive_sum(
      const int32_t* /*in*/,
      int32_t* /*out*/,
      int32_t count) const {
    if (count != 0) {
      launch();
    }
  }

  c10::DataPtr allocate(size_t bytes) const {
    // Every buffer lives for the whole call, so the peak is the sum.
    counters->workspace_bytes += static_cast<int64_t>(bytes);
    return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
  }

  void zero(void* /*data*/, size_t bytes) const {
    if (bytes > 0) {
      launch();
    }
  }

  void begin_chunk() const {
    ++counters->chunks;
  }
};

void check_grain_size(int64_t grain_size) {
  TORCH_CHECK(
      grain_size >= 0,
      "grid_sampler backward (deterministic): grain_size must be positive, "
      "or 0 for the default, got ",
      grain_size);
}

void check_rank(const at::TensorBase& input) {
  TORCH_CHECK(
      input.dim() == 4 || input.dim() == 5,
      "grid_sampler backward (deterministic): expected a 4-D or 5-D input, "
      "got ",
      input.dim(),
      "-D");
}

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
  Spatial<double, kDims> inverse_periods;
  for (int a = 0; a < kDims; ++a) {
    sizes.v[a] = input_size[a];
    const int64_t period =
        at::native::grid_sampler_deterministic::reflection_period(
            input_size[a], align_corners);
    inverse_periods.v[a] = period > 0 ? 1.0 / static_cast<double>(period) : 0.0;
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
            coord, sizes, inverse_periods, padding_mode, align_corners);
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
  const int64_t taps = at::native::grid_sampler_deterministic::ipow(
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
    const at::native::GridSamplerBackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan,
    int64_t grain_size) {
  check_grain_size(grain_size);
  check_rank(call.input);
  const HostExecutor executor{grain_size > 0 ? grain_size : kDefaultGrainSize};
  run_deterministic_backward(executor, call, plan);
}

WorkCounters count_backward_work(
    const at::native::GridSamplerBackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan) {
  check_rank(call.input);
  WorkCounters counters;
  run_deterministic_backward(CountingExecutor{&counters}, call, plan);
  return counters;
}

} // namespace detgrid
