// Deterministic CUDA backward of grid_sampler_2d and grid_sampler_3d:
// grad_input without floating-point atomics. One pipeline serves both; the
// spatial dimensionality is a template parameter of the shared math.
//
// Pipeline, per chunk of points (whole tiles of kTilePoints points):
//   1. point pass, one thread per point: source coordinates once, the grid
//      gradient (single writer), and one record per tap: key = destination
//      (n, y, x) or (n, z, y, x) of grad_input, or "none" when the tap is out
//      of bounds; value = record id (point * taps + tap); the tap weight beside
//      it.
//   2. stable radix sort of the records by key (at::cuda::cub), so each
//      destination's records are in ascending record id order.
//   3. reduce: the single writer of each grad_input element folds its
//      records in the canonical order; no atomics. Dense when grad_input
//      has no more destinations than a chunk has records: one thread per
//      (destination, channel) over all of grad_input, the first chunk
//      writing the zeros (no memset), starts found by binary search.
//      Sparse otherwise: a zero fill, then one thread per (touched
//      destination, channel), found at the first of its sorted records.
// When grad_input is not requested only the point pass runs: the grid
// gradient is single-writer already, so nothing needs grouping and the
// backward raises no determinism alert.
//
// Invariants (tested in the kit's tests against the host executor, which
// runs the same C10_HOST_DEVICE functions from GridSamplerDeterministic.cuh):
//
// (a) Canonical order. grad_input[n][c][position] is
//       fold_+ over partials P of (fold_+ over the records r in P of
//       round(weight(r) * grad_output(r, c)))
//     starting from zero, where the records are those whose tap lands on
//     (n, position) in ascending record id, and a partial is a run of at most
//     kRecordsPerPartial of them that does not cross a tile boundary. Sums
//     are in opmath_type (float for Half/BFloat16), rounded once to the
//     output dtype. grad_grid of a point sums channels in ascending order and
//     taps in record order. Every operation is explicitly rounded. The order
//     is a pure function of the shapes and the grid values: it does not
//     depend on GPU model, SM count, block size, chunk size (chunks are whole
//     tiles and carry the running sum), stream, free memory or thread count.
// (b) Bounded workspace, from the caching allocator, independent of the grid
//     values: with R = min(points, chunk_points) * taps records per chunk
//     (chunk_points defaults to about kChunkRecords / taps, so R <= 2^21):
//     keys 2 * R * sizeof(key) + record ids 2 * R * 4 + weights
//     R * sizeof(opmath) + CUB's radix-sort scratch (about R * (sizeof(key)
//     + 4)), plus in the dense reduction (destinations + 1) * 4 <= (R + 1)
//     * 4 bytes of segment starts (destinations = N * H_in * W_in, times
//     D_in in 3-D), plus, for Half/BFloat16 inputs that need more than one
//     chunk, a float carry the size of grad_input. With int32 keys and fp32
//     that is about 32 bytes per record of one chunk: at most 64 MiB,
//     whatever the input size.
// (c) Safe coordinates. No index is formed from a coordinate that is not
//     finite and within +-2^40 after unnormalizing and padding (the bicubic
//     taps are padded in integers). A point with such a coordinate (NaN,
//     +-Inf, +-1e38, ...) contributes nothing to grad_input and gets a zero
//     grad_grid; Border padding still clamps +-Inf to the border first, as
//     stock does.

#define TORCH_ASSERT_NO_OPERATORS
#include <ATen/native/cuda/GridSamplerDeterministic.h>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/TensorBase.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/cub.h>
#include <ATen/native/CanUse32BitIndexMath.h>
#include <ATen/native/GridSamplerUtils.h>
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/macros/Macros.h>
#include <ATen/native/cuda/GridSamplerDeterministic.cuh>

#include <algorithm>
#include <limits>

namespace at::native {
namespace {

using namespace grid_sampler_deterministic;

constexpr int64_t kDefaultBlockSize = 256;
constexpr int64_t kMaxBlockSize = 512;
constexpr int64_t kDefaultMaxBlocks = int64_t{1} << 20;

struct LaunchConfig {
  int64_t block_size;
  int64_t max_blocks;

  int64_t blocks_for(int64_t work_items) const {
    return std::min(max_blocks, (work_items + block_size - 1) / block_size);
  }
};

LaunchConfig make_launch_config(
    const GridSamplerDeterministicOptions& options,
    const char* op_name) {
  TORCH_CHECK(
      options.block_size >= 0 && options.max_blocks >= 0,
      op_name,
      " (deterministic): block_size and max_blocks must be positive, or 0 "
      "for the default");
  LaunchConfig config{
      options.block_size > 0 ? options.block_size : kDefaultBlockSize,
      options.max_blocks > 0 ? options.max_blocks : kDefaultMaxBlocks};
  TORCH_CHECK(
      config.block_size % at::cuda::warp_size() == 0 &&
          config.block_size <= kMaxBlockSize,
      op_name,
      " (deterministic): block_size must be a multiple of the warp size and "
      "at most ",
      kMaxBlockSize,
      ", got ",
      config.block_size);
  return config;
}

// The kernels are generic in Args (BackwardArgs of 2 or 3 spatial
// dimensions) and reach the math through process_point and the reduce
// functions of GridSamplerDeterministic.cuh.
template <int kTaps, typename Args, typename key_t>
C10_LAUNCH_BOUNDS_1(kMaxBlockSize)
__global__ void point_pass_kernel(
    const Args args,
    int64_t first_point,
    int64_t num_points,
    int64_t num_destinations,
    const ChunkRecords<key_t, typename Args::opmath_t> chunk,
    bool emit_records) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < num_points;
       i += stride) {
    process_point<kTaps>(
        args,
        first_point + i,
        num_destinations,
        emit_records ? &chunk : nullptr);
  }
}

// starts[d] = first sorted position whose key is >= d, for d in [0, D]:
// a binary search per destination, so no thread walks a long gap.
template <typename key_t>
C10_LAUNCH_BOUNDS_1(kMaxBlockSize)
__global__ void segment_starts_kernel(
    const key_t* sorted_keys,
    int64_t num_records,
    int64_t num_destinations,
    int32_t* starts) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       d <= num_destinations;
       d += stride) {
    starts[d] = static_cast<int32_t>(lower_bound(sorted_keys, num_records, d));
  }
}

// Dense reduction over all (destination, channel) elements of grad_input.
template <typename Args, typename key_t, typename CarryView, typename OutView>
C10_LAUNCH_BOUNDS_1(kMaxBlockSize)
__global__ void reduce_dense_kernel(
    const Args args,
    const SortedChunk<key_t> chunk,
    const int32_t* starts,
    const typename Args::opmath_t* weights,
    int64_t num_elements,
    const CarryView carry,
    const OutView out,
    bool has_carry,
    bool write_untouched) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < num_elements;
       i += stride) {
    reduce_dense_element(
        args,
        chunk,
        starts,
        weights,
        i,
        carry,
        out,
        has_carry,
        write_untouched);
  }
}

// Sparse reduction over (sorted record, channel) elements.
template <typename Args, typename key_t, typename CarryView, typename OutView>
C10_LAUNCH_BOUNDS_1(kMaxBlockSize)
__global__ void reduce_sparse_kernel(
    const Args args,
    const SortedChunk<key_t> chunk,
    const typename Args::opmath_t* weights,
    int64_t num_destinations,
    const CarryView carry,
    const OutView out,
    bool has_carry) {
  const int64_t num_elements = chunk.num_records * args.channels;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < num_elements;
       i += stride) {
    reduce_sparse_element(
        args, chunk, weights, num_destinations, i, carry, out, has_carry);
  }
}

// out = src (or zero when src.data is null), element by element over an
// (N, C, spatial...) view: the zero fill before a sparse reduction, the
// zeros of a grid gradient that was not asked for, and the final rounding
// of a float carry.
template <typename out_t, typename in_t, typename index_t, int kDims>
C10_LAUNCH_BOUNDS_1(kMaxBlockSize)
__global__ void copy_or_zero_kernel(
    const View<out_t, index_t, kDims> out,
    const View<const in_t, index_t, kDims> src,
    index_t channels,
    const Spatial<index_t, kDims> sizes,
    int64_t num_elements) {
  const int64_t image_size = spatial_numel(sizes);
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < num_elements;
       i += stride) {
    const auto position = unravel(i % image_size, sizes);
    const index_t c = static_cast<index_t>((i / image_size) % channels);
    const index_t n = static_cast<index_t>(i / (image_size * channels));
    out.at(n, c, position) = src.data == nullptr
        ? static_cast<out_t>(0)
        : static_cast<out_t>(src.at(n, c, position));
  }
}

template <typename index_t, int kDims, typename scalar_t>
View<scalar_t, index_t, kDims> contiguous_view(
    scalar_t* data,
    const TensorBase& like) {
  View<scalar_t, index_t, kDims> view{data, 0, 0, {}};
  int64_t stride = 1;
  for (int a = kDims - 1; a >= 0; --a) {
    view.stride[a] = static_cast<index_t>(stride);
    stride *= like.size(2 + a);
  }
  view.stride_c = static_cast<index_t>(stride);
  view.stride_n = static_cast<index_t>(stride * like.size(1));
  return view;
}

template <typename index_t, int kDims, typename scalar_t>
View<scalar_t, index_t, kDims> mutable_image_view(const TensorBase& t) {
  return image_view<index_t, kDims>(t.data_ptr<scalar_t>(), t.strides());
}

template <int kDims, typename scalar_t, typename index_t, typename key_t>
void launch_point_pass(
    const BackwardArgs<scalar_t, index_t, kDims>& args,
    const LaunchConfig& config,
    int64_t first_point,
    int64_t num_points,
    int64_t num_destinations,
    const ChunkRecords<key_t, at::opmath_type<scalar_t>>& chunk,
    bool emit_records) {
  if (num_points == 0) {
    return;
  }
  dispatch_taps_per_axis(args.interpolation_mode, [&](auto taps_per_axis) {
    point_pass_kernel<decltype(taps_per_axis)::value>
        <<<config.blocks_for(num_points),
           config.block_size,
           0,
           at::cuda::getCurrentCUDAStream()>>>(
            args,
            first_point,
            num_points,
            num_destinations,
            chunk,
            emit_records);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// `like` is an (N, C, spatial...) tensor of the views' shape; a grid, laid
// out (N, spatial..., kDims), passes its coordinate axis as C.
template <typename out_t, typename in_t, typename index_t, int kDims>
void launch_copy_or_zero(
    const View<out_t, index_t, kDims>& out,
    const View<const in_t, index_t, kDims>& src,
    index_t channels,
    const Spatial<index_t, kDims>& sizes,
    int64_t num_elements,
    const LaunchConfig& config) {
  if (num_elements == 0) {
    return;
  }
  copy_or_zero_kernel<<<
      config.blocks_for(num_elements),
      config.block_size,
      0,
      at::cuda::getCurrentCUDAStream()>>>(
      out, src, channels, sizes, num_elements);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The whole grad_input pipeline for one key type.
template <typename scalar_t, typename index_t, int kDims, typename key_t>
void backward_with_records(
    const BackwardArgs<scalar_t, index_t, kDims>& args,
    const LaunchConfig& config,
    const TensorBase& grad_input,
    int64_t batch,
    int64_t chunk_points) {
  using opmath_t = at::opmath_type<scalar_t>;
  using ConstView = View<const opmath_t, index_t, kDims>;
  constexpr bool kReducedPrecision = !std::is_same_v<scalar_t, opmath_t>;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const int64_t taps = args.taps_per_point();
  const int64_t num_points = batch * args.points_per_image();
  const int64_t num_destinations = args.num_destinations(batch);
  const int64_t num_chunks =
      std::max<int64_t>(1, (num_points + chunk_points - 1) / chunk_points);
  const int64_t capacity = std::min(num_points, chunk_points) * taps;
  const bool dense = use_dense_reduction(num_destinations, capacity);

  auto& allocator = *at::cuda::getCUDADeviceAllocator();
  auto keys = allocator.allocate(capacity * sizeof(key_t));
  auto sorted_keys = allocator.allocate(capacity * sizeof(key_t));
  auto ids = allocator.allocate(capacity * sizeof(int32_t));
  auto sorted_ids = allocator.allocate(capacity * sizeof(int32_t));
  auto weights = allocator.allocate(capacity * sizeof(opmath_t));
  auto starts =
      allocator.allocate(dense ? (num_destinations + 1) * sizeof(int32_t) : 0);
  // Running sums between chunks live in grad_input itself when it holds
  // opmath values, else in a float buffer of its size.
  const bool float_carry = kReducedPrecision && num_chunks > 1;
  auto carry_storage = allocator.allocate(
      float_carry ? grad_input.numel() * sizeof(opmath_t) : 0);
  const int64_t C = args.channels;
  const auto carry_buffer = contiguous_view<index_t, kDims>(
      static_cast<opmath_t*>(carry_storage.get()), grad_input);
  const auto grad_input_view =
      mutable_image_view<index_t, kDims, scalar_t>(grad_input);
  auto fill_grad_input = [&](const auto& out, const auto& src) {
    launch_copy_or_zero(
        out, src, args.channels, args.inp_size, grad_input.numel(), config);
  };

  if (!dense) {
    // Sparse: every element starts at zero; chunks then touch only the
    // destinations they have records for.
    if (float_carry) {
      fill_grad_input(carry_buffer, ConstView{});
    } else {
      fill_grad_input(grad_input_view, View<const scalar_t, index_t, kDims>{});
    }
  }

  const ChunkRecords<key_t, opmath_t> records{
      0,
      static_cast<key_t*>(keys.get()),
      static_cast<int32_t*>(ids.get()),
      static_cast<opmath_t*>(weights.get())};
  const int end_bit = at::cuda::cub::get_num_bits(num_destinations);
  for (int64_t k = 0; k < num_chunks; ++k) {
    const int64_t first_point = k * chunk_points;
    const int64_t count = std::min(chunk_points, num_points - first_point);
    const int64_t num_records = count * taps;
    ChunkRecords<key_t, opmath_t> chunk = records;
    chunk.first_point = first_point;
    launch_point_pass(
        args, config, first_point, count, num_destinations, chunk, true);
    if (num_records > 0) {
      at::cuda::cub::radix_sort_pairs(
          static_cast<const key_t*>(keys.get()),
          static_cast<key_t*>(sorted_keys.get()),
          static_cast<const int32_t*>(ids.get()),
          static_cast<int32_t*>(sorted_ids.get()),
          num_records,
          /*descending=*/false,
          /*begin_bit=*/0,
          end_bit);
    }
    const SortedChunk<key_t> sorted{
        first_point,
        num_records,
        static_cast<const key_t*>(sorted_keys.get()),
        static_cast<const int32_t*>(sorted_ids.get())};
    const auto* weights_data = static_cast<const opmath_t*>(weights.get());
    const bool first = k == 0;
    const bool last = k == num_chunks - 1;

    if (dense) {
      segment_starts_kernel<key_t>
          <<<config.blocks_for(num_destinations + 1),
             config.block_size,
             0,
             stream>>>(
              sorted.keys,
              num_records,
              num_destinations,
              static_cast<int32_t*>(starts.get()));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      const int64_t num_elements = num_destinations * C;
      if (num_elements == 0) {
        continue;
      }
      with_reduce_target(
          grad_input_view,
          carry_buffer,
          last && dense,
          [&](auto out, auto carry) {
            // The first chunk writes every element (zeros included); so does
            // the last one when it rounds a float carry into grad_input.
            const bool write_untouched =
                first || static_cast<const void*>(out.data) != carry.data;
            reduce_dense_kernel<<<
                config.blocks_for(num_elements),
                config.block_size,
                0,
                stream>>>(
                args,
                sorted,
                static_cast<const int32_t*>(starts.get()),
                weights_data,
                num_elements,
                carry,
                out,
                /*has_carry=*/!first,
                write_untouched);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          });
    } else if (num_records > 0 && C > 0) {
      with_reduce_target(
          grad_input_view,
          carry_buffer,
          last && dense,
          [&](auto out, auto carry) {
            reduce_sparse_kernel<<<
                config.blocks_for(num_records * C),
                config.block_size,
                0,
                stream>>>(
                args,
                sorted,
                weights_data,
                num_destinations,
                carry,
                out,
                /*has_carry=*/static_cast<const void*>(out.data) == carry.data);
            C10_CUDA_KERNEL_LAUNCH_CHECK();
          });
    }
  }
  if (!dense && float_carry) {
    fill_grad_input(grad_input_view, as_const(carry_buffer));
  }
}

template <typename scalar_t, typename index_t, int kDims>
void backward(
    const TensorBase& grad_input,
    const TensorBase& grad_grid,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const GridSamplerDeterministicOptions& options) {
  using Args = BackwardArgs<scalar_t, index_t, kDims>;
  const auto args = make_backward_args<scalar_t, index_t, kDims>(
      grad_grid,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners,
      output_mask[1]);
  const LaunchConfig config = make_launch_config(options, Args::op_name());
  const int64_t batch = input.size(0);
  const int64_t num_points = batch * args.points_per_image();
  const int64_t num_destinations = args.num_destinations(batch);

  if (!output_mask[1] && grad_grid.defined()) {
    // Not asked for, so not computed (upstream #64977); a grid gradient the
    // caller allocated anyway is zeroed rather than left uninitialized.
    const auto grid_gradient = grid_view<index_t, kDims>(
        grad_grid.data_ptr<scalar_t>(), grad_grid.strides());
    launch_copy_or_zero(
        grid_gradient,
        View<const scalar_t, index_t, kDims>{},
        static_cast<index_t>(kDims),
        args.out_size,
        grad_grid.numel(),
        config);
  }
  if (!output_mask[0] || grad_input.numel() == 0) {
    // Grid gradient only: no records, no sort, nothing to group.
    launch_point_pass<kDims, scalar_t, index_t, int32_t>(
        args, config, 0, num_points, num_destinations, {}, false);
    return;
  }

  const int64_t taps = args.taps_per_point();
  const int64_t chunk_points =
      resolve_chunk_points(options.chunk_points, taps, Args::op_name());
  if (num_destinations < std::numeric_limits<int32_t>::max()) {
    backward_with_records<scalar_t, index_t, kDims, int32_t>(
        args, config, grad_input, batch, chunk_points);
  } else {
    backward_with_records<scalar_t, index_t, kDims, int64_t>(
        args, config, grad_input, batch, chunk_points);
  }
}

// The shape half of check_grid_sampler_3d. Bicubic (tricubic) sampling is
// supported: releases that reject it for 5-D input do so before a backward.
void check_5d_input_and_grid(const TensorBase& input, const TensorBase& grid) {
  TORCH_CHECK(
      input.dim() == 5 && input.dim() == grid.dim(),
      "grid_sampler(): expected 5D input and grid with same number of "
      "dimensions, but got input with sizes ",
      input.sizes(),
      " and grid with sizes ",
      grid.sizes());
}

bool fits_32bit_indexing(const TensorBase& t) {
  return !t.defined() || canUse32BitIndexMath(t);
}

template <int kDims>
void launch_backward(
    const TensorBase& grad_input,
    const TensorBase& grad_grid,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const GridSamplerDeterministicOptions& options) {
  // See NOTE [ grid_sampler Native Functions ].
  // Add checks here in case this is called instead of grid_sampler.
  check_grid_sampler_common(input, grid);
  if constexpr (kDims == 2) {
    check_grid_sampler_2d(input, grid);
  } else {
    check_5d_input_and_grid(input, grid);
  }
  if (!output_mask[0] && !output_mask[1]) {
    return;
  }
  const bool use_32bit = fits_32bit_indexing(input) &&
      fits_32bit_indexing(grid) && fits_32bit_indexing(grad_output) &&
      (!output_mask[0] || fits_32bit_indexing(grad_input)) &&
      fits_32bit_indexing(grad_grid);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      ScalarType::Half,
      ScalarType::BFloat16,
      input.scalar_type(),
      "grid_sampler_backward_deterministic_cuda",
      [&] {
        if (use_32bit) {
          backward<scalar_t, int, kDims>(
              grad_input,
              grad_grid,
              grad_output,
              input,
              grid,
              interpolation_mode,
              padding_mode,
              align_corners,
              output_mask,
              options);
        } else {
          backward<scalar_t, int64_t, kDims>(
              grad_input,
              grad_grid,
              grad_output,
              input,
              grid,
              interpolation_mode,
              padding_mode,
              align_corners,
              output_mask,
              options);
        }
      });
}

} // namespace

void launch_grid_sampler_2d_backward_deterministic_kernel(
    const TensorBase& grad_input,
    const TensorBase& grad_grid,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const GridSamplerDeterministicOptions& options) {
  launch_backward<2>(
      grad_input,
      grad_grid,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners,
      output_mask,
      options);
}

void launch_grid_sampler_3d_backward_deterministic_kernel(
    const TensorBase& grad_input,
    const TensorBase& grad_grid,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners,
    std::array<bool, 2> output_mask,
    const GridSamplerDeterministicOptions& options) {
  launch_backward<3>(
      grad_input,
      grad_grid,
      grad_output,
      input,
      grid,
      interpolation_mode,
      padding_mode,
      align_corners,
      output_mask,
      options);
}

} // namespace at::native
