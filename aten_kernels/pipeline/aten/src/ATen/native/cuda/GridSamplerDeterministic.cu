// Deterministic CUDA backward of grid_sampler_2d and grid_sampler_3d:
// grad_input without floating-point atomics. grad_grid stays the existing
// kernel's, which has one writer per element.
//
// Pipeline (GridSamplerDeterministicPipeline.cuh; this file holds its CUDA
// executor), per chunk of points (whole tiles of kTilePoints points):
//   1. grid_sampler_point_records_kernel, one thread per point: the weight
//      of every tap, the point's grad_output offset, and one sort item per
//      tap keyed by its destination in grad_input, or "nowhere".
// [stack: index32]
//      Keys are 32 bits wide where the key space fits, else 64.
// [end stack: index32]
// [stack: cells]
//      Bilinear and trilinear sampling with a dense reduction sort one item
//      per point instead, keyed by its cell (the position of its lowest tap,
//      plus one): see GridSamplerDeterministicCells.cuh.
// [end stack: cells]
//   2. stable radix sort of the items by key (at::cuda::cub), so each key's
//      records are in ascending record id (point * taps + tap).
//   3. reduce: a zero fill, then one thread per (sorted record, channel)
//      (sum_runs_kernel); the thread of a run's first record folds the run.
// [stack: dense]
//      Dense instead where the table of keys has no more entries than a
//      chunk has records (mark_segment_bounds_kernel, then one thread per
//      (destination, channel) of the images the chunk's points lie in: see
//      GridSamplerDeterministicDense.cuh).
// [end stack: dense]
// [stack: channels-fastest]
//      From 16 channels the dense reduce's threads take channels fastest
//      (sum_segments_channels_fastest_kernel; see
//      GridSamplerDeterministicChannelsFastest.cuh).
// [end stack: channels-fastest]
// [stack: hot-fold]
//      Where a key may be hot (more than 4096 records), a sum over the
//      chunk's slots (at::cuda::cub) numbers the hot destinations' partials,
//      and fold_hot_destinations_kernel marks the segments in place of
//      mark_segment_bounds_kernel and stores the partials of their tiles in
//      parallel; the reduce adds them in order
//      (GridSamplerDeterministicHotFold.cuh).
// [end stack: hot-fold]
//
// Invariants:
// (a) Canonical order. grad_input[n][c][position] is
//       fold_+ over partials P of (fold_+ over the records r in P of
//       round(weight(r) * grad_output(r, c)))
//     from zero, over the records that land on (n, position) in ascending
//     record id; a partial is a run of at most kRecordsPerPartial of them
//     within a tile. Sums are in opmath_type, rounded once to the output
//     dtype. So the order depends on the shapes and the grid alone: not on
//     GPU model, SM count, block size, chunk size, stream or free memory.
// (b) Bounded workspace: at most kWorkspaceBytes (64 MiB) whatever the
//     input: per chunk, sort keys and payloads, CUB's scratch, the weight
//     of every tap and a grad_output offset per point.
// [stack: dense]
//     The dense reduction's segment table.
// [end stack: dense]
// [stack: channels-fastest]
//     When its threads take channels fastest over a grad_output whose
//     channel stride is not 1, a channels-last copy of the chunk's
//     grad_output.
// [end stack: channels-fastest]
// [stack: hot-fold]
//     The hot fold's tables reuse the unsorted sort items.
// [end stack: hot-fold]
//     Half/BFloat16 sums over several chunks wait in a float carry of at
//     most kCarryBytes; beyond it grad_input is made block by block, each
//     block re-running its images' chunks.
// (c) Safe coordinates and (d) fidelity: no index comes from a non-finite
//     or huge value; taps and weights are the existing backward's.

#define TORCH_ASSERT_NO_OPERATORS
#include <ATen/native/cuda/GridSamplerDeterministic.h>

#include <ATen/core/TensorBase.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/cub.cuh>
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/macros/Macros.h>
#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>

#include <algorithm>
#include <iterator> // [stack: hot-fold]
#include <type_traits>

namespace at::native {
namespace {

using namespace grid_sampler_deterministic;

// gridDim.y's limit; rows beyond it are taken by the grid-stride loop.
constexpr int64_t kMaxGridRows = 65535;

// Point passes keep a point's taps in registers (64 in tricubic sampling):
// built for kPointPassBlockSize threads, they may take 255 registers and
// spill nothing. The other stages are built for kMaxBlockSize.
constexpr int kPointPassBlockSize = 256;

// Grid-stride loops with unsigned counters: count < 2^31 (or 2^63) and the
// stride is at most 2^29, so i + stride never wraps, and 32-bit counts keep
// a 32-bit loop.
template <typename Stage, typename count_t>
__device__ __forceinline__ void grid_stride_loop(
    const Stage& stage,
    count_t count) {
  using ucount_t = std::make_unsigned_t<count_t>;
  const ucount_t stride = static_cast<ucount_t>(blockDim.x) * gridDim.x;
  const ucount_t first =
      static_cast<ucount_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (ucount_t i = first; i < static_cast<ucount_t>(count); i += stride) {
    stage(static_cast<count_t>(i));
  }
}

// Rows along gridDim.y, columns along the grid-stride loop of gridDim.x.
template <typename Stage, typename row_t, typename col_t>
__device__ __forceinline__ void grid_stride_rows(
    const Stage& stage,
    row_t rows,
    col_t cols) {
  using urow_t = std::make_unsigned_t<row_t>;
  using ucol_t = std::make_unsigned_t<col_t>;
  const ucol_t stride = static_cast<ucol_t>(blockDim.x) * gridDim.x;
  for (urow_t r = blockIdx.y; r < static_cast<urow_t>(rows); r += gridDim.y) {
    const auto row = stage.row(static_cast<row_t>(r));
    for (ucol_t c = static_cast<ucol_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         c < static_cast<ucol_t>(cols);
         c += stride) {
      stage(row, static_cast<col_t>(c));
    }
  }
}

// One kernel per stage of the pipeline, named after what it computes.

template <typename Pass, typename count_t>
C10_LAUNCH_BOUNDS_2(kPointPassBlockSize, 1)
__global__ void grid_sampler_point_records_kernel(
    const Pass pass,
    count_t count) {
  grid_stride_loop(pass, count);
}

// [stack: dense]
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void mark_segment_bounds_kernel(
    const MarkDestinationSegments stage,
    int32_t count) {
  grid_stride_loop(stage, count);
}
// [end stack: dense]

// [stack: channels-fastest]
template <typename Stage, typename row_t, typename col_t>
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void gather_grad_output_channels_last_kernel(
    const Stage stage,
    row_t rows,
    col_t cols) {
  grid_stride_rows(stage, rows, cols);
}
// [end stack: channels-fastest]

// [stack: hot-fold]
template <typename Stage>
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void fold_hot_destinations_kernel(
    const Stage stage,
    int32_t rows,
    int32_t cols) {
  grid_stride_rows(stage, rows, cols);
}
// [end stack: hot-fold]

// [stack: dense]
template <typename Reduce, typename row_t, typename col_t>
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void sum_segments_per_destination_kernel(
    const Reduce reduce,
    row_t rows,
    col_t cols) {
  grid_stride_rows(reduce, rows, cols);
}
// [end stack: dense]

// [stack: channels-fastest]
template <typename Reduce, typename count_t>
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void sum_segments_channels_fastest_kernel(
    const Reduce reduce,
    count_t count) {
  grid_stride_loop(reduce, count);
}
// [end stack: channels-fastest]

template <typename Reduce, typename row_t, typename col_t>
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void sum_runs_kernel(const Reduce reduce, row_t rows, col_t cols) {
  grid_stride_rows(reduce, rows, cols);
}

template <typename Stage, typename row_t, typename col_t>
C10_LAUNCH_BOUNDS_2(kMaxBlockSize, 1)
__global__ void round_float_sums_kernel(
    const Stage stage,
    row_t rows,
    col_t cols) {
  grid_stride_rows(stage, rows, cols);
}

// The kernel of each stage, and for 1-D stages the most threads per block
// it is built for.
template <typename Stage>
struct StageKernel;

template <int kTaps, typename Args>
struct StageKernel<PointPass<kTaps, Args>> {
  static constexpr int kMaxThreads = kPointPassBlockSize;
  template <typename count_t>
  static constexpr auto kernel =
      &grid_sampler_point_records_kernel<PointPass<kTaps, Args>, count_t>;
};

// [stack: dense]
template <>
struct StageKernel<MarkDestinationSegments> {
  static constexpr int kMaxThreads = kMaxBlockSize;
  template <typename count_t>
  static constexpr auto kernel = &mark_segment_bounds_kernel;
};
// [end stack: dense]

// [stack: channels-fastest]
template <typename scalar_t, typename index_t>
struct StageKernel<GatherChannelsLast<scalar_t, index_t>> {
  template <typename row_t, typename col_t>
  static constexpr auto kernel = &gather_grad_output_channels_last_kernel<
      GatherChannelsLast<scalar_t, index_t>,
      row_t,
      col_t>;
};
// [end stack: channels-fastest]

// [stack: hot-fold]
template <typename Fold>
struct StageKernel<HotFold<Fold>> {
  template <typename row_t, typename col_t>
  static constexpr auto kernel = &fold_hot_destinations_kernel<HotFold<Fold>>;
};
// [end stack: hot-fold]

// [stack: dense]
template <typename Fold>
struct StageKernel<ReduceDense<Fold>> {
  template <typename row_t, typename col_t>
  static constexpr auto kernel =
      &sum_segments_per_destination_kernel<ReduceDense<Fold>, row_t, col_t>;
};
// [end stack: dense]

// [stack: channel-groups]
template <typename Fold>
struct StageKernel<ReduceDenseChannelGroups<Fold>> {
  template <typename row_t, typename col_t>
  static constexpr auto kernel = &sum_segments_per_destination_kernel<
      ReduceDenseChannelGroups<Fold>,
      row_t,
      col_t>;
};
// [end stack: channel-groups]

// [stack: channels-fastest]
template <typename Fold>
struct StageKernel<ReduceDenseChannelsFastest<Fold>> {
  static constexpr int kMaxThreads = kMaxBlockSize;
  template <typename count_t>
  static constexpr auto kernel =
      &sum_segments_channels_fastest_kernel<
          ReduceDenseChannelsFastest<Fold>,
          count_t>;
};
// [end stack: channels-fastest]

template <typename scalar_t, typename index_t>
struct StageKernel<ReduceSparse<scalar_t, index_t>> {
  template <typename row_t, typename col_t>
  static constexpr auto kernel =
      &sum_runs_kernel<ReduceSparse<scalar_t, index_t>, row_t, col_t>;
};

template <typename scalar_t, typename index_t>
struct StageKernel<RoundCarry<scalar_t, index_t>> {
  template <typename row_t, typename col_t>
  static constexpr auto kernel =
      &round_float_sums_kernel<RoundCarry<scalar_t, index_t>, row_t, col_t>;
};

// Threads per block (at most kMaxBlockSize) and blocks per launch (at most
// kDefaultMaxBlocks).
struct LaunchConfig {
  int64_t block_size;
  int64_t max_blocks;

  int64_t blocks_for(int64_t work_items) const {
    return std::min(max_blocks, (work_items + block_size - 1) / block_size);
  }
  LaunchConfig at_most(int64_t threads) const {
    return {std::min(block_size, threads), max_blocks};
  }
};

// [stack: hot-fold]
// The values term(0), term(1), ... as CUB reads its input: a random-access
// iterator whose element i is computed where it is read.
template <typename Term>
struct TermIterator {
  using value_type = int32_t;
  using reference = int32_t;
  using pointer = void;
  using difference_type = std::ptrdiff_t;
  using iterator_category = std::random_access_iterator_tag;
  Term term;
  difference_type offset;

  __host__ __device__ int32_t operator*() const {
    return term(static_cast<int32_t>(offset));
  }
  __host__ __device__ int32_t operator[](difference_type i) const {
    return term(static_cast<int32_t>(offset + i));
  }
  __host__ __device__ TermIterator operator+(difference_type i) const {
    return TermIterator{term, offset + i};
  }
};
// [end stack: hot-fold]

// The executor of GridSamplerDeterministicPipeline.cuh on one CUDA stream.
struct CudaExecutor {
  LaunchConfig config;
  cudaStream_t stream;

  template <typename count_t, typename Stage>
  void for_each(count_t count, const Stage& stage) const {
    if (count == 0) {
      return;
    }
    const LaunchConfig launch = config.at_most(StageKernel<Stage>::kMaxThreads);
    StageKernel<Stage>::template kernel<count_t><<<
        launch.blocks_for(count),
        launch.block_size,
        0,
        stream>>>(stage, count);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  template <typename row_t, typename col_t, typename Stage>
  void for_each_row(row_t rows, col_t cols, const Stage& stage) const {
    if (rows == 0 || cols == 0) {
      return;
    }
    const int64_t columns = config.blocks_for(cols);
    const int64_t grid_rows = std::min<int64_t>(
        {static_cast<int64_t>(rows),
         kMaxGridRows,
         std::max<int64_t>(1, config.max_blocks / columns)});
    const dim3 grid(
        static_cast<unsigned>(columns), static_cast<unsigned>(grid_rows));
    StageKernel<Stage>::template kernel<row_t, col_t>
        <<<grid, config.block_size, 0, stream>>>(stage, rows, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  template <typename key_t>
  void stable_sort_pairs(
      const key_t* keys_in,
      key_t* keys_out,
      const int32_t* values_in,
      int32_t* values_out,
      int32_t count,
      int end_bit) const {
    if (count == 0) {
      return;
    }
    at::cuda::cub::radix_sort_pairs(
        keys_in,
        keys_out,
        values_in,
        values_out,
        count,
        /*descending=*/false,
        /*begin_bit=*/0,
        end_bit);
  }

  // [stack: hot-fold]
  template <typename Term>
  void inclusive_sum(int32_t count, const Term& term, int32_t* out) const {
    if (count == 0) {
      return;
    }
    CUB_WRAPPER(
        NO_ROCM(at_cuda_detail)::cub::DeviceScan::InclusiveSum,
        TermIterator<Term>{term, 0},
        out,
        count,
        stream);
  }
  // [end stack: hot-fold]

  c10::DataPtr allocate(size_t bytes) const {
    return at::cuda::getCUDADeviceAllocator()->allocate(bytes);
  }

  void zero(void* data, size_t bytes) const {
    if (bytes == 0) {
      return;
    }
    C10_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream));
  }
};

} // namespace

// The default plan on the current stream, for arguments that the caller,
// GridSampler.cu's launcher, has checked.
void launch_grid_sampler_backward_deterministic_kernel(
    const GridSamplerBackwardCall& call) {
  const CudaExecutor executor{
      LaunchConfig{kDefaultBlockSize, kDefaultMaxBlocks},
      at::cuda::getCurrentCUDAStream()};
  run_deterministic_backward(
      executor, call, plan_backward(describe_backward(call)));
}

} // namespace at::native
