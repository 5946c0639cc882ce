#define TORCH_ASSERT_NO_OPERATORS
#include <ATen/native/cuda/GridSampler.h>

#include <ATen/Dispatch.h>
#include <ATen/NumericUtils.h>
#include <ATen/OpMathType.h>
#include <ATen/ceil_div.h>
#include <ATen/core/TensorBase.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/detail/KernelUtils.h>
#include <ATen/native/CanUse32BitIndexMath.h>
#include <ATen/native/GridSamplerUtils.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/macros/Macros.h>
#include <ATen/cuda/cub.cuh>
#include <ATen/cuda/detail/IndexUtils.cuh>
#include <ATen/cuda/detail/TensorInfo.cuh>
#include <ATen/native/cuda/GridSampler.cuh>
#include <ATen/native/cuda/UpSample.cuh>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

// Note [Deterministic grid_sampler backward]
// The existing backward kernels scatter grad_input's terms with atomicAdd,
// so each sum's order changes from run to run. Here each term is formed as
// the existing kernel forms it, and each element's terms are added in an
// order fixed by the shapes and the grid, per chunk of kMaxChunkRecords:
//   1. A thread per output point writes a record per tap, keyed by the
//      grad_input position it lands on (`nowhere` when out of bounds) and
//      valued by its id, point * taps + tap. Bicubic taps go x offset
//      outermost, then y, then z: tap 16 * i + 4 * j + k of a tricubic point
//      is x offset i, y offset j, z offset k.
//   2. A stable radix sort by key leaves each position's records in
//      ascending id; unique_by_key finds where each run of one key begins.
//   3. Runs are summed in partials of kPartialRecords records; those after a
//      run's first are summed in parallel, so that a constant grid's run of
//      a million records is no one thread's work.
//   4. A thread per run and channel adds its partials in order to what the
//      earlier chunks left. Sums are in opmath_t, rounded once (Half and
//      BFloat16 sums over several chunks wait in a float scratch).
// The existing kernel's terms; the sums differ in order and FMA contraction.

namespace at::native {
namespace {

using at::cuda::detail::GET_BLOCKS;
using at::cuda::detail::getTensorInfo;
using at::cuda::detail::TensorInfo;

constexpr int kThreads = 256;
// Records summed by one thread before its sum is added to the element.
constexpr int64_t kPartialRecords = 256;
// Records per chunk: the workspace of a chunk stays within 64 MiB with
// 64-bit keys, 16 MiB of it the partials of up to 256 channels; beyond 256
// channels, chunks shrink to keep that share.
constexpr int64_t kMaxChunkRecords = int64_t{1} << 19;
constexpr int64_t kPartialBytes = int64_t{16} << 20;
// Blocks of the run sums, which loop over a run count only the device knows:
// a chunk of few runs (a constant grid's) launches few threads.
constexpr int64_t kMaxRunSumBlocks = 4096;

// a + b, never fused with a product in b: the existing kernel rounds a
// term's product before its atomicAdd, where nvcc might fuse it here.
__device__ float add_unfused(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ double add_unfused(double a, double b) {
  return __dadd_rn(a, b);
}

// Record r of a chunk belongs to point r >> tap_bits, whose taps are visited
// in the existing kernel's order: for bicubic, x outermost; otherwise nw,
// ne, sw, se (tnw .. bse in 3-D).
template <typename scalar_t, typename index_t>
struct ChunkRecords {
  index_t* keys;
  int32_t* ids;
  // Per record its weight; per bicubic point its four x, four y (and four z)
  // coefficients.
  scalar_t* weights;
  index_t* gout_offsets;
  index_t nowhere;

  // A tap's record, keyed by the grad_input position it lands on or by
  // `nowhere`: a position is formed only in bounds, where it fits index_t.
  __device__ void tap(int32_t record, index_t key) const {
    keys[record] = key;
    ids[record] = record;
  }
};

template <typename scalar_t, typename index_t>
C10_LAUNCH_BOUNDS_1(kThreads)
__global__ void grid_sampler_2d_records_kernel(
    const index_t count,
    const index_t first_point,
    TensorInfo<const scalar_t, index_t> input,
    TensorInfo<const scalar_t, index_t> grid,
    TensorInfo<const scalar_t, index_t> grad_output,
    const GridSamplerInterpolation interpolation_mode,
    const GridSamplerPadding padding_mode,
    const bool align_corners,
    ChunkRecords<scalar_t, index_t> chunk) {
  const index_t inp_H = input.sizes[2];
  const index_t inp_W = input.sizes[3];
  const index_t out_H = grid.sizes[1];
  const index_t out_W = grid.sizes[2];
  CUDA_KERNEL_LOOP_TYPE(i, count, index_t) {
    const index_t index = first_point + i;
    const index_t w = index % out_W;
    const index_t h = (index / out_W) % out_H;
    const index_t n = index / (out_H * out_W);
    const index_t grid_offset =
        n * grid.strides[0] + h * grid.strides[1] + w * grid.strides[2];
    const scalar_t x = grid.data[grid_offset];
    const scalar_t y = grid.data[grid_offset + grid.strides[3]];
    chunk.gout_offsets[i] = n * grad_output.strides[0] +
        h * grad_output.strides[2] + w * grad_output.strides[3];
    const index_t image = n * inp_H * inp_W;
    const int32_t first = static_cast<int32_t>(i);
    scalar_t gix_mult, giy_mult;
    if (interpolation_mode == GridSamplerInterpolation::Bicubic) {
      const scalar_t ix =
          grid_sampler_unnormalize_set_grad(x, inp_W, align_corners, &gix_mult);
      const scalar_t iy =
          grid_sampler_unnormalize_set_grad(y, inp_H, align_corners, &giy_mult);
      const scalar_t ix_nw = std::floor(ix);
      const scalar_t iy_nw = std::floor(iy);
      scalar_t* coeffs = chunk.weights + 8 * i;
      get_cubic_upsampling_coefficients<scalar_t>(coeffs, ix - ix_nw);
      get_cubic_upsampling_coefficients<scalar_t>(coeffs + 4, iy - iy_nw);
      // The positions add_value_bounded gives the taps: tap (t, u) lies at
      // column px of x offset t and row py[u] of y offset u.
      int py[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        py[u] = static_cast<int>(compute_coordinates(
            iy_nw - 1 + u, inp_H, padding_mode, align_corners));
      }
#pragma unroll 1
      for (int t = 0; t < 4; ++t) {
        const int px = static_cast<int>(compute_coordinates(
            ix_nw - 1 + t, inp_W, padding_mode, align_corners));
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const bool in_bounds = within_bounds_2d(py[u], px, inp_H, inp_W);
          chunk.tap(
              16 * first + 4 * t + u,
              in_bounds ? image + py[u] * inp_W + px : chunk.nowhere);
        }
      }
      continue;
    }
    const scalar_t ix = grid_sampler_compute_source_index_set_grad(
        x, inp_W, padding_mode, align_corners, &gix_mult);
    const scalar_t iy = grid_sampler_compute_source_index_set_grad(
        y, inp_H, padding_mode, align_corners, &giy_mult);
    if (interpolation_mode == GridSamplerInterpolation::Nearest) {
      const index_t ix_nearest = static_cast<index_t>(std::nearbyint(ix));
      const index_t iy_nearest = static_cast<index_t>(std::nearbyint(iy));
      const bool in_bounds =
          within_bounds_2d(iy_nearest, ix_nearest, inp_H, inp_W);
      chunk.tap(
          first,
          in_bounds ? image + iy_nearest * inp_W + ix_nearest : chunk.nowhere);
      continue;
    }
    const index_t ix_nw = static_cast<index_t>(std::floor(ix));
    const index_t iy_nw = static_cast<index_t>(std::floor(iy));
    const index_t ix_se = ix_nw + 1;
    const index_t iy_se = iy_nw + 1;
    // The surfaces as the existing kernel forms them: nw, ne, sw, se.
    const scalar_t weight[4] = {
        (ix_se - ix) * (iy_se - iy),
        (ix - ix_nw) * (iy_se - iy),
        (ix_se - ix) * (iy - iy_nw),
        (ix - ix_nw) * (iy - iy_nw)};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const index_t tx = ix_nw + (t & 1);
      const index_t ty = iy_nw + (t >> 1);
      chunk.weights[4 * first + t] = weight[t];
      const bool in_bounds = within_bounds_2d(ty, tx, inp_H, inp_W);
      chunk.tap(
          4 * first + t, in_bounds ? image + ty * inp_W + tx : chunk.nowhere);
    }
  }
}

// a[i] for an i known only at run time, by selects: a register array
// indexed at run time would live in local memory.
template <typename T>
__device__ T pick(const T (&a)[4], int i) {
  return i == 0 ? a[0] : (i == 1 ? a[1] : (i == 2 ? a[2] : a[3]));
}

// The 64 records of a tricubic point whose grid coordinates (x, y, z) are
// `coord` apart by `stride`, from record `first`; its 12 coefficients go to
// `coeffs`. A point with a coordinate that is not finite gets no tap, as in
// the bilinear modes: padding would place its NaN coefficients on an edge.
template <typename scalar_t, typename index_t>
__device__ void tricubic_records(
    const scalar_t* coord,
    index_t stride,
    index_t inp_D,
    index_t inp_H,
    index_t inp_W,
    GridSamplerPadding padding_mode,
    bool align_corners,
    index_t image,
    int32_t first,
    scalar_t* coeffs,
    const ChunkRecords<scalar_t, index_t>& chunk) {
  // Each axis's taps: x's columns, y's rows, z's layers. The axes are a
  // loop, for one copy of the padding's code; constant indices keep the
  // arrays in registers.
  index_t columns[4], rows[4], layers[4];
  bool finite = true;
#pragma unroll 1
  for (int axis = 0; axis < 3; ++axis) {
    const index_t size = axis == 0 ? inp_W : (axis == 1 ? inp_H : inp_D);
    // Unnormalized in float arithmetic as the 2-D taps are (Half and
    // BFloat16 rounded once, not per operation).
    scalar_t multiplier;
    const scalar_t source = grid_sampler_unnormalize_set_grad(
        coord[axis * stride], size, align_corners, &multiplier);
    finite = finite && !at::_isnan(source) && !at::_isinf(source);
    index_t taps[4];
    resolve_cubic_taps(
        source,
        size,
        padding_mode,
        align_corners,
        coeffs + 4 * axis,
        static_cast<scalar_t*>(nullptr),
        taps);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      columns[t] = axis == 0 ? taps[t] : columns[t];
      rows[t] = axis == 1 ? taps[t] : rows[t];
      layers[t] = axis == 2 ? taps[t] : layers[t];
    }
  }
#pragma unroll 1
  for (int i = 0; i < 4; ++i) {
#pragma unroll 1
    for (int j = 0; j < 4; ++j) {
      const index_t px = pick(columns, i);
      const index_t py = pick(rows, j);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const bool in_bounds = finite && px >= 0 && py >= 0 && layers[k] >= 0;
        chunk.tap(
            first + 16 * i + 4 * j + k,
            in_bounds ? image + (layers[k] * inp_H + py) * inp_W + px
                      : chunk.nowhere);
      }
    }
  }
}

template <typename scalar_t, typename index_t>
C10_LAUNCH_BOUNDS_1(kThreads)
__global__ void grid_sampler_3d_records_kernel(
    const index_t count,
    const index_t first_point,
    TensorInfo<const scalar_t, index_t> input,
    TensorInfo<const scalar_t, index_t> grid,
    TensorInfo<const scalar_t, index_t> grad_output,
    const GridSamplerInterpolation interpolation_mode,
    const GridSamplerPadding padding_mode,
    const bool align_corners,
    ChunkRecords<scalar_t, index_t> chunk) {
  const index_t inp_D = input.sizes[2];
  const index_t inp_H = input.sizes[3];
  const index_t inp_W = input.sizes[4];
  const index_t out_D = grid.sizes[1];
  const index_t out_H = grid.sizes[2];
  const index_t out_W = grid.sizes[3];
  CUDA_KERNEL_LOOP_TYPE(i, count, index_t) {
    const index_t index = first_point + i;
    const index_t w = index % out_W;
    const index_t h = (index / out_W) % out_H;
    const index_t d = (index / (out_H * out_W)) % out_D;
    const index_t n = index / (out_D * out_H * out_W);
    const index_t grid_offset = n * grid.strides[0] + d * grid.strides[1] +
        h * grid.strides[2] + w * grid.strides[3];
    chunk.gout_offsets[i] = n * grad_output.strides[0] +
        d * grad_output.strides[2] + h * grad_output.strides[3] +
        w * grad_output.strides[4];
    const index_t image = n * inp_D * inp_H * inp_W;
    const int32_t first = static_cast<int32_t>(i);
    if (interpolation_mode == GridSamplerInterpolation::Bicubic) {
      // The launcher indexes tricubic with int64_t only: one copy of its
      // code per dtype.
      if constexpr (std::is_same_v<index_t, int64_t>) {
        tricubic_records(
            grid.data + grid_offset,
            grid.strides[4],
            inp_D,
            inp_H,
            inp_W,
            padding_mode,
            align_corners,
            image,
            64 * first,
            chunk.weights + 12 * i,
            chunk);
      }
      continue;
    }
    auto source_index = [&](int axis, index_t size) {
      scalar_t multiplier;
      return grid_sampler_compute_source_index_set_grad(
          grid.data[grid_offset + axis * grid.strides[4]],
          size,
          padding_mode,
          align_corners,
          &multiplier);
    };
    const scalar_t ix = source_index(0, inp_W);
    const scalar_t iy = source_index(1, inp_H);
    const scalar_t iz = source_index(2, inp_D);
    if (interpolation_mode == GridSamplerInterpolation::Nearest) {
      const index_t ix_nearest = static_cast<index_t>(std::nearbyint(ix));
      const index_t iy_nearest = static_cast<index_t>(std::nearbyint(iy));
      const index_t iz_nearest = static_cast<index_t>(std::nearbyint(iz));
      const bool in_bounds = within_bounds_3d(
          iz_nearest, iy_nearest, ix_nearest, inp_D, inp_H, inp_W);
      chunk.tap(
          first,
          in_bounds
              ? image + (iz_nearest * inp_H + iy_nearest) * inp_W + ix_nearest
              : chunk.nowhere);
      continue;
    }
    const index_t ix_tnw = static_cast<index_t>(std::floor(ix));
    const index_t iy_tnw = static_cast<index_t>(std::floor(iy));
    const index_t iz_tnw = static_cast<index_t>(std::floor(iz));
    const index_t ix_bse = ix_tnw + 1;
    const index_t iy_bse = iy_tnw + 1;
    const index_t iz_bse = iz_tnw + 1;
    // The volumes as the existing kernel forms them: tnw, tne, tsw, tse,
    // bnw, bne, bsw, bse.
    const scalar_t weight[8] = {
        (ix_bse - ix) * (iy_bse - iy) * (iz_bse - iz),
        (ix - ix_tnw) * (iy_bse - iy) * (iz_bse - iz),
        (ix_bse - ix) * (iy - iy_tnw) * (iz_bse - iz),
        (ix - ix_tnw) * (iy - iy_tnw) * (iz_bse - iz),
        (ix_bse - ix) * (iy_bse - iy) * (iz - iz_tnw),
        (ix - ix_tnw) * (iy_bse - iy) * (iz - iz_tnw),
        (ix_bse - ix) * (iy - iy_tnw) * (iz - iz_tnw),
        (ix - ix_tnw) * (iy - iy_tnw) * (iz - iz_tnw)};
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const index_t tx = ix_tnw + (t & 1);
      const index_t ty = iy_tnw + ((t >> 1) & 1);
      const index_t tz = iz_tnw + (t >> 2);
      chunk.weights[8 * first + t] = weight[t];
      const bool in_bounds = within_bounds_3d(tz, ty, tx, inp_D, inp_H, inp_W);
      chunk.tap(
          8 * first + t,
          in_bounds ? image + (tz * inp_H + ty) * inp_W + tx : chunk.nowhere);
    }
  }
}

// What the sums read of a sorted chunk, and grad_input's shape: `channels`
// rows of positions_per_image elements per image.
template <typename scalar_t, typename index_t>
struct SortedChunk {
  index_t channels;
  index_t positions_per_image;
  index_t nowhere;
  const index_t* keys;
  const int32_t* ids;
  const int32_t* run_begins;
  const int32_t* num_runs;
  int32_t count;
  const scalar_t* weights;
  const index_t* gout_offsets;
  const scalar_t* grad_output;
  index_t gout_stride_c;
  int tap_bits;
  GridSamplerInterpolation interpolation_mode;
  // Per channel, the stored partials of runs longer than kPartialRecords, by
  // slot (see sum_run_partials_kernel).
  at::opmath_type<scalar_t>* partials;
  int64_t slots;

  __device__ int32_t run_end(int32_t run) const {
    return run + 1 < *num_runs ? run_begins[run + 1] : count;
  }

  // The run that holds sorted position p: the last one beginning at p or
  // before (a binary search of the run begins).
  __device__ int32_t run_holding(int32_t p) const {
    int32_t low = 0;
    int32_t high = *num_runs;
    while (high - low > 1) {
      const int32_t middle = low + (high - low) / 2;
      if (run_begins[middle] <= p) {
        low = middle;
      } else {
        high = middle;
      }
    }
    return low;
  }

  // The term of record `id` in channel c, as the existing kernel forms it.
  __device__ scalar_t term(int32_t id, index_t c) const {
    const int32_t point = id >> tap_bits;
    const scalar_t gOut = grad_output[gout_offsets[point] + c * gout_stride_c];
    if (interpolation_mode == GridSamplerInterpolation::Nearest) {
      return gOut;
    }
    if (interpolation_mode == GridSamplerInterpolation::Bicubic) {
      // Four coefficients per axis, x first, and two bits of the tap.
      if (tap_bits == 6) {
        const int32_t tap = id & 63;
        const scalar_t* coeffs = weights + 12 * point;
        return gOut * coeffs[tap >> 4] * coeffs[4 + ((tap >> 2) & 3)] *
            coeffs[8 + (tap & 3)];
      }
      const int32_t tap = id & 15;
      return gOut * weights[8 * point + (tap >> 2)] *
          weights[8 * point + 4 + (tap & 3)];
    }
    return weights[id] * gOut;
  }

  // The partial of the records at sorted positions [begin, end).
  __device__ at::opmath_type<scalar_t> sum(
      int32_t begin,
      int32_t end,
      index_t c) const {
    at::opmath_type<scalar_t> partial = 0;
    for (int32_t k = begin; k < end; ++k) {
      partial = add_unfused(
          partial, static_cast<at::opmath_type<scalar_t>>(term(ids[k], c)));
    }
    return partial;
  }
};

// The partials after a run's first: the one starting at sorted position p
// is stored in slot p / kPartialRecords, which no other partial shares, as
// the kPartialRecords positions before p belong to the same run.
template <typename scalar_t, typename index_t>
C10_LAUNCH_BOUNDS_1(kThreads)
__global__ void sum_run_partials_kernel(SortedChunk<scalar_t, index_t> chunk) {
  CUDA_KERNEL_LOOP_TYPE(item, chunk.slots * chunk.channels, int64_t) {
    const int32_t slot = static_cast<int32_t>(item % chunk.slots);
    const index_t c = static_cast<index_t>(item / chunk.slots);
    const int32_t first = slot * static_cast<int32_t>(kPartialRecords);
    const int32_t r = chunk.run_holding(first);
    const int32_t begin = chunk.run_begins[r];
    const int32_t start = begin +
        (first - begin + kPartialRecords - 1) / kPartialRecords *
            kPartialRecords;
    const int32_t end = chunk.run_end(r);
    if (start == begin || start >= end || chunk.keys[begin] == chunk.nowhere) {
      continue;
    }
    chunk.partials[item] =
        chunk.sum(start, std::min<int32_t>(start + kPartialRecords, end), c);
  }
}

// One writer per grad_input element: the sums of earlier chunks (in `sums`,
// or in grad_input where sums is null), plus the run's partials in order.
template <typename scalar_t, typename index_t>
C10_LAUNCH_BOUNDS_1(kThreads)
__global__ void sum_runs_kernel(
    SortedChunk<scalar_t, index_t> chunk,
    at::opmath_type<scalar_t>* sums,
    scalar_t* grad_input) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int32_t runs = *chunk.num_runs;
  CUDA_KERNEL_LOOP_TYPE(item, runs * chunk.channels, int64_t) {
    const int32_t r = static_cast<int32_t>(item % runs);
    const index_t c = static_cast<index_t>(item / runs);
    const int32_t begin = chunk.run_begins[r];
    const index_t key = chunk.keys[begin];
    if (key == chunk.nowhere) {
      continue;
    }
    const index_t positions = chunk.positions_per_image;
    const index_t n = key / positions;
    const index_t element =
        (n * chunk.channels + c) * positions + (key - n * positions);
    const int32_t end = chunk.run_end(r);
    opmath_t total = sums != nullptr
        ? sums[element]
        : static_cast<opmath_t>(grad_input[element]);
    int32_t start = std::min<int32_t>(begin + kPartialRecords, end);
    total += chunk.sum(begin, start, c);
    for (; start < end; start += kPartialRecords) {
      total += chunk.partials[c * chunk.slots + start / kPartialRecords];
    }
    if (sums != nullptr) {
      sums[element] = total;
    } else {
      grad_input[element] = static_cast<scalar_t>(total);
    }
  }
}

template <typename scalar_t>
C10_LAUNCH_BOUNDS_1(kThreads)
__global__ void round_float_sums_kernel(
    const int64_t numel,
    const at::opmath_type<scalar_t>* sums,
    scalar_t* grad_input) {
  CUDA_KERNEL_LOOP_TYPE(i, numel, int64_t) {
    grad_input[i] = static_cast<scalar_t>(sums[i]);
  }
}

// Device memory for `elements` of T, held by `workspace`.
template <typename T>
T* allocate(std::vector<c10::DataPtr>& workspace, int64_t elements) {
  workspace.push_back(
      c10::cuda::CUDACachingAllocator::get()->allocate(elements * sizeof(T)));
  return static_cast<T*>(workspace.back().get());
}

template <typename scalar_t, typename index_t>
void sum_grad_input(
    const TensorBase& grad_input,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    GridSamplerInterpolation interpolation_mode,
    GridSamplerPadding padding_mode,
    bool align_corners) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int dims = input.dim() - 2;
  const bool bicubic = interpolation_mode == GridSamplerInterpolation::Bicubic;
  const bool nearest = interpolation_mode == GridSamplerInterpolation::Nearest;
  const int tap_bits = bicubic ? 2 * dims : (nearest ? 0 : dims);
  const int64_t channels = input.size(1);
  const int64_t positions_per_image =
      input.numel() / (input.size(0) * channels);
  const int64_t nowhere = input.size(0) * positions_per_image;
  const int64_t num_points = grid.numel() / dims;
  const int64_t chunk_records = kPartialRecords *
      std::clamp<int64_t>(kPartialBytes / (channels * sizeof(opmath_t)),
                          1,
                          kMaxChunkRecords / kPartialRecords);
  const int64_t chunk_points = std::max<int64_t>(chunk_records >> tap_bits, 1);
  const int64_t max_records = std::min(chunk_points, num_points) << tap_bits;

  std::vector<c10::DataPtr> workspace;
  index_t* const keys = allocate<index_t>(workspace, 2 * max_records);
  int32_t* const ids = allocate<int32_t>(workspace, 2 * max_records);
  const ChunkRecords<scalar_t, index_t> records{
      keys,
      ids,
      allocate<scalar_t>(
          workspace,
          bicubic ? (max_records >> tap_bits) * 4 * dims : max_records),
      allocate<index_t>(workspace, max_records >> tap_bits),
      static_cast<index_t>(nowhere)};
  SortedChunk<scalar_t, index_t> sorted{
      static_cast<index_t>(channels),
      static_cast<index_t>(positions_per_image),
      static_cast<index_t>(nowhere),
      keys + max_records,
      ids + max_records,
      allocate<int32_t>(workspace, max_records),
      allocate<int32_t>(workspace, 1),
      0,
      records.weights,
      records.gout_offsets,
      grad_output.const_data_ptr<scalar_t>(),
      static_cast<index_t>(grad_output.stride(1)),
      tap_bits,
      interpolation_mode,
      allocate<opmath_t>(
          workspace, ceil_div(max_records, kPartialRecords) * channels),
      0};
  const auto records_kernel = dims == 2
      ? grid_sampler_2d_records_kernel<scalar_t, index_t>
      : grid_sampler_3d_records_kernel<scalar_t, index_t>;

  // Half and BFloat16 sums over several chunks wait in float.
  opmath_t* sums = nullptr;
  const auto stream = at::cuda::getCurrentCUDAStream();
  if (!std::is_same_v<scalar_t, opmath_t> && num_points > chunk_points) {
    sums = allocate<opmath_t>(workspace, grad_input.numel());
    C10_CUDA_CHECK(cudaMemsetAsync(
        sums, 0, grad_input.numel() * sizeof(opmath_t), stream));
  }

  for (int64_t first = 0; first < num_points; first += chunk_points) {
    const int64_t points = std::min(chunk_points, num_points - first);
    const int64_t count = points << tap_bits;
    records_kernel<<<GET_BLOCKS(points, kThreads), kThreads, 0, stream>>>(
        static_cast<index_t>(points),
        static_cast<index_t>(first),
        getTensorInfo<const scalar_t, index_t>(input),
        getTensorInfo<const scalar_t, index_t>(grid),
        getTensorInfo<const scalar_t, index_t>(grad_output),
        interpolation_mode,
        padding_mode,
        align_corners,
        records);
    C10_CUDA_KERNEL_LAUNCH_CHECK();

    at::cuda::cub::radix_sort_pairs(
        keys,
        const_cast<index_t*>(sorted.keys),
        ids,
        const_cast<int32_t*>(sorted.ids),
        count,
        /*descending=*/false,
        /*begin_bit=*/0,
        /*end_bit=*/at::cuda::cub::get_num_bits(nowhere));
    // The unsorted ids are 0 .. count - 1: each run's first one is where
    // the run begins.
    at::cuda::cub::unique_by_key(
        sorted.keys,
        ids,
        const_cast<int32_t*>(sorted.run_begins),
        const_cast<int32_t*>(sorted.num_runs),
        count);
    sorted.count = static_cast<int32_t>(count);
    sorted.slots = ceil_div(count, kPartialRecords);
    sum_run_partials_kernel<scalar_t, index_t>
        <<<GET_BLOCKS(sorted.slots * channels, kThreads),
           kThreads,
           0,
           stream>>>(sorted);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int64_t run_blocks = std::min<int64_t>(
        GET_BLOCKS(std::min(count, nowhere + 1) * channels, kThreads),
        kMaxRunSumBlocks);
    sum_runs_kernel<scalar_t, index_t><<<run_blocks, kThreads, 0, stream>>>(
        sorted, sums, grad_input.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  if constexpr (!std::is_same_v<scalar_t, opmath_t>) {
    if (sums == nullptr) {
      return;
    }
    round_float_sums_kernel<scalar_t>
        <<<GET_BLOCKS(grad_input.numel(), kThreads), kThreads, 0, stream>>>(
            grad_input.numel(), sums, grad_input.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

} // namespace

// grad_input of grid_sampler_2d_backward (4-D input) or
// grid_sampler_3d_backward (5-D input) without atomics; see Note
// [Deterministic grid_sampler backward]. grad_input must be contiguous and
// zero-filled, as GridSampler.cpp allocates it.
void launch_grid_sampler_backward_deterministic_kernel(
    const TensorBase& grad_input,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  if (grad_output.numel() == 0 || input.numel() == 0) {
    return;
  }
  TORCH_INTERNAL_ASSERT(grad_input.is_contiguous());
  const bool tricubic = input.dim() == 5 &&
      interpolation_mode ==
          static_cast<int64_t>(GridSamplerInterpolation::Bicubic);
  const bool index_32bit = !tricubic && canUse32BitIndexMath(input) &&
      canUse32BitIndexMath(grid) && canUse32BitIndexMath(grad_output);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      ScalarType::Half,
      ScalarType::BFloat16,
      input.scalar_type(),
      "grid_sampler_backward_deterministic_cuda",
      [&] {
        const auto mode =
            static_cast<GridSamplerInterpolation>(interpolation_mode);
        const auto padding = static_cast<GridSamplerPadding>(padding_mode);
        const auto sum = index_32bit ? sum_grad_input<scalar_t, int32_t>
                                     : sum_grad_input<scalar_t, int64_t>;
        sum(grad_input, grad_output, input, grid, mode, padding, align_corners);
      });
}

} // namespace at::native
