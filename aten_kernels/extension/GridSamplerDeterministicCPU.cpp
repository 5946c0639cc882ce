// Host executor of the deterministic grid_sampler_2d/3d backward.
//
// It runs the stages of ATen/native/cuda/GridSamplerDeterministic.cu on the
// CPU, calling the same C10_HOST_DEVICE functions for every floating-point
// operation, with std::stable_sort where the CUDA path uses CUB's stable
// radix sort. It therefore computes the canonical order documented there,
// and for float and double its result equals the CUDA kernel's bit for bit.
// This is what lets the kernel's numerics be proven on machines without a
// GPU; it is also a deterministic CPU backward in its own right.

#include "GridSamplerDeterministicCPU.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/native/cuda/GridSamplerDeterministic.cuh>

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

namespace detgrid {
namespace {

using namespace at::native::grid_sampler_deterministic;

int64_t grain_or_default(int64_t grain_size, int64_t fallback) {
  return grain_size > 0 ? grain_size : fallback;
}

// Stage 2: the stable sort of the chunk's records by destination.
struct SortedRecords {
  std::vector<int64_t> keys;
  std::vector<int32_t> ids;
};

SortedRecords sort_records(const std::vector<int64_t>& keys, int64_t count) {
  SortedRecords sorted;
  sorted.ids.resize(count);
  std::iota(sorted.ids.begin(), sorted.ids.end(), 0);
  std::stable_sort(
      sorted.ids.begin(), sorted.ids.end(), [&](int32_t a, int32_t b) {
        return keys[a] < keys[b];
      });
  sorted.keys.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    sorted.keys[i] = keys[sorted.ids[i]];
  }
  return sorted;
}

// Stage 3 of the dense reduction: where each destination's records begin.
std::vector<int32_t> segment_starts(
    const SortedRecords& sorted,
    int64_t num_destinations,
    int64_t grain_size) {
  std::vector<int32_t> starts(num_destinations + 1);
  const int64_t count = static_cast<int64_t>(sorted.keys.size());
  at::parallel_for(
      0,
      num_destinations + 1,
      grain_or_default(grain_size, 4096),
      [&](int64_t begin, int64_t end) {
        for (int64_t d = begin; d < end; ++d) {
          starts[d] =
              static_cast<int32_t>(lower_bound(sorted.keys.data(), count, d));
        }
      });
  return starts;
}

template <typename scalar_t, int kDims>
void backward(
    const at::Tensor& grad_input,
    const at::Tensor& grad_grid,
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const ExecutorOptions& options) {
  using T = at::opmath_type<scalar_t>;
  constexpr bool kReducedPrecision = !std::is_same_v<scalar_t, T>;

  const auto args = make_backward_args<scalar_t, int64_t, kDims>(
      grad_grid,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners,
      output_mask[1]);
  using Args = decltype(args);

  const int64_t batch = input.size(0);
  const int64_t num_points = batch * args.points_per_image();
  const int64_t num_destinations = args.num_destinations(batch);
  const int64_t point_grain = grain_or_default(options.grain_size, 256);

  auto point_pass = [&](int64_t first, int64_t count, const auto* chunk) {
    dispatch_taps_per_axis(args.interpolation_mode, [&](auto taps_per_axis) {
      constexpr int kTaps = decltype(taps_per_axis)::value;
      at::parallel_for(0, count, point_grain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          process_point<kTaps>(args, first + i, num_destinations, chunk);
        }
      });
    });
  };

  if (!output_mask[0] || grad_input.numel() == 0) {
    point_pass(0, num_points, static_cast<ChunkRecords<int64_t, T>*>(nullptr));
    return;
  }

  const int64_t taps = args.taps_per_point();
  const int64_t chunk_points =
      resolve_chunk_points(options.chunk_points, taps, Args::op_name());
  const int64_t num_chunks =
      std::max<int64_t>(1, (num_points + chunk_points - 1) / chunk_points);
  const int64_t capacity = std::min(num_points, chunk_points) * taps;

  const bool dense = use_dense_reduction(num_destinations, capacity);

  std::vector<int64_t> keys(capacity);
  std::vector<int32_t> record_ids(capacity);
  std::vector<T> weights(capacity);
  // Running sums between chunks live in grad_input itself when it holds
  // opmath values, else in a float buffer of its size.
  const bool float_carry = kReducedPrecision && num_chunks > 1;
  at::Tensor carry_storage;
  if (float_carry) {
    carry_storage =
        at::empty(grad_input.sizes(), grad_input.options().dtype(at::kFloat));
  }
  const auto carry_buffer = float_carry
      ? image_view<int64_t, kDims>(
            carry_storage.data_ptr<T>(), carry_storage.strides())
      : View<T, int64_t, kDims>{nullptr, 0, 0, {}};
  const auto grad_input_view = image_view<int64_t, kDims>(
      grad_input.data_ptr<scalar_t>(), grad_input.strides());

  if (!dense) {
    (float_carry ? carry_storage : grad_input).zero_();
  }

  const int64_t channels = args.channels;
  for (int64_t k = 0; k < num_chunks; ++k) {
    const int64_t first_point = k * chunk_points;
    const int64_t count = std::min(chunk_points, num_points - first_point);
    const ChunkRecords<int64_t, T> chunk{
        first_point, keys.data(), record_ids.data(), weights.data()};
    point_pass(first_point, count, &chunk);
    const SortedRecords sorted = sort_records(keys, count * taps);
    const SortedChunk<int64_t> sorted_chunk{
        first_point, count * taps, sorted.keys.data(), sorted.ids.data()};
    const bool first = k == 0;
    const bool last = k == num_chunks - 1;

    if (dense) {
      const std::vector<int32_t> starts =
          segment_starts(sorted, num_destinations, options.grain_size);
      with_reduce_target(
          grad_input_view,
          carry_buffer,
          last && dense,
          [&](auto out, auto carry) {
            const bool write_untouched =
                first || static_cast<const void*>(out.data) != carry.data;
            at::parallel_for(
                0,
                num_destinations * channels,
                grain_or_default(options.grain_size, 1024),
                [&](int64_t begin, int64_t end) {
                  for (int64_t i = begin; i < end; ++i) {
                    reduce_dense_element(
                        args,
                        sorted_chunk,
                        starts.data(),
                        weights.data(),
                        i,
                        carry,
                        out,
                        /*has_carry=*/!first,
                        write_untouched);
                  }
                });
          });
    } else {
      with_reduce_target(
          grad_input_view,
          carry_buffer,
          last && dense,
          [&](auto out, auto carry) {
            const bool has_carry =
                static_cast<const void*>(out.data) == carry.data;
            at::parallel_for(
                0,
                count * taps * channels,
                grain_or_default(options.grain_size, 1024),
                [&](int64_t begin, int64_t end) {
                  for (int64_t i = begin; i < end; ++i) {
                    reduce_sparse_element(
                        args,
                        sorted_chunk,
                        weights.data(),
                        num_destinations,
                        i,
                        carry,
                        out,
                        has_carry);
                  }
                });
          });
    }
  }
  if (!dense && float_carry) {
    grad_input.copy_(carry_storage);
  }
}

} // namespace

void grid_sampler_backward_executor(
    const at::Tensor& grad_input,
    const at::Tensor& grad_grid,
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const ExecutorOptions& options) {
  TORCH_CHECK(
      options.grain_size >= 0,
      "grid_sampler backward (deterministic): grain_size must be positive, "
      "or 0 for the default, got ",
      options.grain_size);
  TORCH_CHECK(
      input.dim() == 4 || input.dim() == 5,
      "grid_sampler backward (deterministic): expected a 4-D or 5-D input, "
      "got ",
      input.dim(),
      "-D");
  if (!output_mask[0] && !output_mask[1]) {
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::ScalarType::Half,
      at::ScalarType::BFloat16,
      input.scalar_type(),
      "grid_sampler_backward_executor",
      [&] {
        const auto run =
            input.dim() == 4 ? backward<scalar_t, 2> : backward<scalar_t, 3>;
        run(grad_input,
            grad_grid,
            grad_output,
            input,
            grid,
            interpolation_mode,
            padding_mode,
            align_corners,
            output_mask,
            options);
      });
}

} // namespace detgrid
