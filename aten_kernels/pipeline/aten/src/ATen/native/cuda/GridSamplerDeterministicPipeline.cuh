#pragma once
// The stages of the deterministic grid_sampler backward and their order,
// written once over an executor. GridSamplerDeterministic.cu runs them with
// the CUDA executor. Why the seam: an executor that runs the same stages on
// the CPU gives the same bits, so the sums can be checked where no GPU is.
//
// An Executor provides:
//   for_each(count, stage)        stage(i) for every i in [0, count), in any
//                                 order and in parallel; i has count's type.
//   for_each_row(rows, cols, stage)
//                                 stage(stage.row(r), c) for every r in
//                                 [0, rows) and c in [0, cols); row(r) holds
//                                 what all of a row's elements share.
//   stable_sort_pairs(keys_in, keys_out, values_in, values_out, count,
//                     end_bit)    by key (whose bits above end_bit are zero),
//                                 equal keys keeping their order.
// [stack: hot-fold]
//   inclusive_sum(count, term, out)
//                                 out[i] = term(0) + ... + term(i) for
//                                 every i in [0, count), of int32 values.
// [end stack: hot-fold]
//   allocate(bytes) -> c10::DataPtr, zero(data, bytes).
// Each is one launch or CUB call on CUDA, never with a count of zero.
// Stages are plain structs with C10_HOST_DEVICE call operators.

#include <ATen/native/cuda/GridSamplerDeterministic.cuh>
#include <ATen/native/cuda/GridSamplerDeterministic.h>
#include <ATen/native/cuda/GridSamplerDeterministicDense.cuh> // [stack: dense]
#include <ATen/native/cuda/GridSamplerDeterministicCells.cuh> // [stack: cells]
#include <ATen/native/cuda/GridSamplerDeterministicChannelsFastest.cuh> // [stack: channels-fastest]
#include <ATen/native/cuda/GridSamplerDeterministicHotFold.cuh> // [stack: hot-fold]
#include <ATen/native/cuda/GridSamplerDeterministicChannelGroups.cuh> // [stack: channel-groups]
#include <ATen/native/cuda/GridSamplerDeterministicFusedFills.cuh> // [stack: fused-fills]

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/native/CanUse32BitIndexMath.h> // [stack: index32]
#include <c10/core/Allocator.h>
#include <c10/util/llvmMathExtras.h>

#include <algorithm>
#include <limits>
#include <type_traits>

namespace at::native::grid_sampler_deterministic {

// Point pass: the records of points [first_point, first_point + count), one
// thread per point; kTaps must match args.interpolation_mode.
template <int kTaps, typename Args>
struct PointPass {
  using index_t = typename Args::index_type;
  Args args;
  ChunkRecords<typename Args::opmath_t, index_t> chunk;
  index_t first_point;
  PointFills<typename Args::scalar_type, index_t> fills; // [stack: fused-fills]

  C10_HOST_DEVICE void operator()(index_t i) const {
    index_t n;
    Spatial<index_t, Args::dims> out_position;
    const auto taps =
        locate_point_taps<kTaps>(args, first_point + i, &n, &out_position);
    emit_records(args, taps, n, i, chunk); // [stack: index32 replaces: emit_tap_records<int64_t>(args, taps, n, i, chunk);]
    chunk.gout_offsets[i] = args.grad_output.offset(n, 0, out_position);
    fills(i, chunk.gout_offsets[i]); // [stack: fused-fills]
  }
};

// Whether sorted record i begins a run of one key, and where that run ends.
template <typename Keys>
C10_HOST_DEVICE inline bool begins_run(const Keys& keys, int32_t i) {
  return i == 0 || keys[i - 1] != keys[i];
}
template <typename Keys>
C10_HOST_DEVICE inline int32_t run_end(
    const Keys& keys,
    int32_t begin,
    int32_t count) {
  const auto key = keys[begin];
  int32_t end = begin + 1;
  while (end < count && keys[end] == key) {
    ++end;
  }
  return end;
}

// Sparse reduction: one thread per (channel, sorted record); the thread of
// a run's first record folds the run, one destination's records, into sums
// zero-filled before. Runs that land nowhere or outside the block are
// skipped.
template <typename scalar_t, typename index_t>
struct ReduceSparse {
  using T = at::opmath_type<scalar_t>;
  SortedRecords<scalar_t, index_t> records;
  ChunkKeys keys;
  int32_t count;
  int64_t nowhere;
  ReduceOutput<scalar_t, index_t> out;
  index_t channels;
  Divider<index_t> by_image_size; // [stack: index32]

  struct Row {
    index_t channel;
    const scalar_t* gout_channel;
  };

  C10_HOST_DEVICE Row row(index_t c) const {
    return Row{c, records.gout_channel(c)};
  }

  C10_HOST_DEVICE void operator()(const Row& row, int32_t i) const {
    const int64_t destination = keys[i];
    if (destination == nowhere || !begins_run(keys, i)) {
      return;
    }
    const index_t d = static_cast<index_t>(destination);
    const index_t n = divide(d, by_image_size); // [stack: index32 replaces: const index_t n = d / out.destinations_per_image;]
    const index_t s = d - n * out.destinations_per_image;
    const index_t element_row = n * channels + row.channel;
    if (!out.block.holds(element_row, s)) {
      return;
    }
    const T initial = out.sums_in != nullptr ? out.running_sum(element_row, s)
                                             : static_cast<T>(0);
    out.write(
        element_row,
        s,
        records.fold(
            SortedRecordIds{records.ids, i, run_end(keys, i, count)},
            row.gout_channel,
            initial));
  }
};

// Rounds a block's finished carry into grad_input.
template <typename scalar_t, typename index_t>
struct RoundCarry {
  ReduceOutput<scalar_t, index_t> out;

  C10_HOST_DEVICE index_t row(index_t r) const {
    return out.block.row_begin + r;
  }

  C10_HOST_DEVICE void operator()(index_t row, index_t col) const {
    const index_t s = out.block.col_begin + col;
    out.grad_input[row * out.destinations_per_image + s] =
        static_cast<scalar_t>(out.running_sum(row, s));
  }
};

// Bits a radix sort must look at for keys in [0, max_key] (at least one).
inline int bits_for(int64_t max_key) {
  return max_key > 1 ? static_cast<int>(c10::llvm::Log2_64(max_key)) + 1 : 1;
}

template <typename T>
T* as(const c10::DataPtr& data) {
  return static_cast<T*>(data.get());
}

// A chunk's record ids are int32 sort payloads and uint32 tile ends; a
// chunk is whole tiles, so at most kMaxChunkRecords records keeps both
// below 2^31.
constexpr int64_t kMaxChunkRecords = std::numeric_limits<int32_t>::max();
// [stack: cells]
// MergedCellRecords' kExhausted must lie above every record id and tile end,
// and a dense table has no more entries than a chunk has records, so its
// cell numbers (n * cells_per_image + cell) are int32 too.
static_assert(
    kMaxChunkRecords < int64_t{MergedCellRecords<4>::kExhausted},
    "kExhausted must exceed every record id and tile end");
// [end stack: cells]
// A record's key and payload fill kWorkspaceBytes long before that.
static_assert(
    kWorkspaceBytes / (2 * int64_t{sizeof(int32_t)}) < kMaxChunkRecords,
    "the workspace budget must bound a chunk below kMaxChunkRecords");

// How a chunk is reduced and how its sums are carried.
// [stack: dense]
// Dense where its table has no more entries than a chunk has taps, so that
// a pass over every element costs no more than folding the chunk's records,
// and where it fits the workspace beside the chunk (see
// GridSamplerDeterministicDense.cuh).
// [end stack: dense]
struct ChunkPlan {
  int64_t chunk_points; // whole tiles
  bool dense; // [stack: dense]
  // [stack: channels-fastest]
  // Dense only: ReduceDenseChannelsFastest, reading a GatherChannelsLast copy
  // of each chunk's grad_output when copy_grad_output.
  bool channels_fastest = false;
  bool copy_grad_output = false;
  // [end stack: channels-fastest]
  // The float carry's elements (with_carry); 0 where there is none.
  int64_t carry_elements = 0;
};

// Workspace per point of a chunk: sort keys and payloads in and out, and
// CUB's ping-pong copy of both; each tap's weight; the grad_output offset.
inline int64_t chunk_bytes_per_point(
    int64_t items_per_point,
    int64_t taps_per_point,
    int64_t key_bytes,
    int64_t weight_bytes,
    int64_t index_bytes) {
  return items_per_point * 3 * (key_bytes + int64_t{sizeof(int32_t)}) +
      taps_per_point * weight_bytes + index_bytes;
}

// Kept for CUB's histograms and tile states, which grow slowly with items.
constexpr int64_t kSortScratchSlack = int64_t{1} << 20;

// Points per chunk: as many whole tiles as fit the workspace.
// [stack: dense]
// A dense reduction takes its table beside them.
// [end stack: dense]
// [stack: channels-fastest]
// And dense_bytes_per_point more per point (a channels-last copy).
// [end stack: channels-fastest]
inline ChunkPlan plan_chunks(
    int64_t num_points, // [stack: dense]
    int64_t taps_per_point, // [stack: dense]
    int64_t table_entries, // [stack: dense]
    int64_t bytes_per_point,
    int64_t dense_bytes_per_point, // [stack: channels-fastest]
    int64_t workspace_bytes = kWorkspaceBytes) {
  auto tiles_within = [&](int64_t bytes, int64_t per_point) {
    return std::max<int64_t>(bytes, 0) / (per_point * kTilePoints);
  };
  const int64_t budget = workspace_bytes - kSortScratchSlack;
  // [stack: dense]
  const int64_t table_bytes =
      table_entries * 2 * int64_t{sizeof(int32_t)};
  const int64_t dense_tiles = tiles_within(
      budget - table_bytes,
      bytes_per_point + dense_bytes_per_point); // [stack: channels-fastest replaces: bytes_per_point);]
  if (dense_tiles > 0 &&
      dense_table_fits(
          table_entries,
          num_points,
          dense_tiles * kTilePoints,
          taps_per_point)) {
    return {dense_tiles * kTilePoints, true};
  }
  // [end stack: dense]
  const int64_t tiles =
      std::max<int64_t>(tiles_within(budget, bytes_per_point), 1);
  return {tiles * kTilePoints, false}; // [stack: dense replaces: return {tiles * kTilePoints};]
}

// Threads per block and a cap on blocks per launch of the CUDA executor's
// grid-stride loops.
constexpr int64_t kDefaultBlockSize = 256;
constexpr int64_t kMaxBlockSize = 512;
constexpr int64_t kDefaultMaxBlocks = int64_t{1} << 20;

// Every choice a backward call runs with, made from the shapes by
// plan_backward(). Any plan within the asserted limits gives the same bits.
struct BackwardPlan {
  bool index_32bit = true; // [stack: index32]
  Keying keying = Keying::PerTap; // [stack: cells]
  bool key_32bit = true; // [stack: index32]
  ChunkPlan chunks{kTilePoints, false}; // [stack: dense replaces: ChunkPlan chunks{kTilePoints};]
  // [stack: hot-fold]
  // Whether dense chunks fold hot destinations' tiles in parallel (HotFold,
  // built for 32-bit index math alone) where its tables fit; otherwise every
  // destination folds serially, with the same bits.
  bool hot_fold = false;
  // [end stack: hot-fold]
  // [stack: channel-groups]
  // Whether a dense reduce thread folds a group of channels (kChannelGroup)
  // of its destination rather than one channel. plan_backward() always
  // groups; without groups (the step before them) the bits are the same.
  bool channel_groups = true;
  // [end stack: channel-groups]
  // [stack: fused-fills]
  // Whether the point pass zero-fills a dense chunk's segment table and
  // makes its channels-last copy of grad_output (up to kFusedGatherChannels
  // channels) rather than launches of their own. plan_backward() always
  // fuses them; apart (the step before), the bits are the same.
  bool fused_fills = true;
  // [end stack: fused-fills]
};

// [stack: index32]
// Whether the sampler with taps_per_axis taps per axis in dims spatial
// dimensions is built with 32-bit index math as well as 64-bit. All are but
// 3-D bicubic (tricubic): its point pass, 64 taps per point, is several
// times the size of any other, and it is built once per dtype, with the
// 64-bit index math that addresses a problem of any size, which keeps the
// CUDA unit within its machine-code budget.
// [stack: hot-fold]
// Its calls also fold hot destinations serially (HotFold runs with 32-bit
// indices only), with the same bits.
// [end stack: hot-fold]
constexpr bool has_32bit_index_math(int taps_per_axis, int dims) {
  return !(taps_per_axis == 4 && dims == 3);
}

// table_entries itself is a key: it marks records that land nowhere.
inline bool keys_fit_32bit(int64_t table_entries) {
  return table_entries < std::numeric_limits<int32_t>::max();
}
// [end stack: index32]

// The blocks of grad_input a float carry of carry_elements holds in turn:
// runs of whole rows where a row fits, else of one row's columns; one
// block without a carry.
template <typename index_t>
struct CarryBlocks {
  index_t rows;
  index_t cols;
  int64_t rows_per_block;
  int64_t cols_per_block;

  CarryBlocks(index_t rows, index_t cols, int64_t carry_elements)
      : rows(rows), cols(cols) {
    const int64_t capacity =
        carry_elements > 0 ? carry_elements : int64_t{rows} * cols;
    rows_per_block =
        std::max<int64_t>(1, capacity / std::max<index_t>(cols, 1));
    cols_per_block = std::max<int64_t>(1, std::min<int64_t>(cols, capacity));
  }
  int64_t blocks_per_row() const {
    return (cols + cols_per_block - 1) / cols_per_block;
  }
  int64_t count() const {
    return ((rows + rows_per_block - 1) / rows_per_block) * blocks_per_row();
  }
  ElementBlock<index_t> block(int64_t b) const {
    const int64_t per_row = std::max<int64_t>(1, blocks_per_row());
    const int64_t row = (b / per_row) * rows_per_block;
    const int64_t col = (b % per_row) * cols_per_block;
    return ElementBlock<index_t>{
        static_cast<index_t>(std::min<int64_t>(rows, row)),
        static_cast<index_t>(std::min<int64_t>(rows, row + rows_per_block)),
        static_cast<index_t>(std::min<int64_t>(cols, col)),
        static_cast<index_t>(std::min<int64_t>(cols, col + cols_per_block))};
  }
};

// grad_input of the backward (contiguous): per block of grad_input, per
// chunk of the points of the block's images: point pass, sort, reduce.
// [stack: cells]
// Records are keyed as plan.keying says (PerCell needs bilinear or
// trilinear sampling and a dense reduction).
// [end stack: cells]
// [stack: index32]
// Keys are as wide as plan.key_32bit says.
// [end stack: index32]
template <
    int kTaps,
    typename Executor,
    typename scalar_t,
    typename index_t,
    int kDims>
void reduce_grad_input(
    const Executor& ex,
    const BackwardArgs<scalar_t, index_t, kDims>& args,
    scalar_t* grad_input,
    const BackwardPlan& plan) {
  using Args = BackwardArgs<scalar_t, index_t, kDims>;
  using T = at::opmath_type<scalar_t>;
  constexpr int kTapsPerPoint = taps_per_point(kTaps, kDims);
  constexpr bool kReducedPrecision = !std::is_same_v<scalar_t, T>;
  const ChunkPlan& chunking = plan.chunks;
  // [stack: cells]
  const bool per_cell = plan.keying == Keying::PerCell;
  TORCH_INTERNAL_ASSERT(!per_cell || (kTaps == 2 && chunking.dense));
  // [end stack: cells]

  const int64_t chunk_points = chunking.chunk_points;
  const bool dense = chunking.dense; // [stack: dense]
  const int64_t num_points = args.num_points();
  const index_t channels = args.channels;
  const index_t image_size = args.destinations_per_image();
  const index_t numel = args.batch * channels * image_size;
  if (num_points == 0 || numel == 0) {
    // Nothing lands anywhere; below, every chunk has points and every block
    // elements.
    ex.zero(grad_input, numel * sizeof(scalar_t));
    return;
  }
  const int64_t items_per_point = per_cell ? 1 : kTapsPerPoint; // [stack: cells replaces: const int64_t items_per_point = kTapsPerPoint;]
  const int64_t key_bytes = plan.key_32bit ? 4 : 8; // [stack: index32 replaces: const int64_t key_bytes = 8;]
  const int64_t points_per_chunk = std::min(num_points, chunk_points);
  const int64_t capacity = points_per_chunk * items_per_point;
  // The keys are 0 .. table_entries - 1; table_entries itself is "nowhere".
  const int64_t table_entries = per_cell // [stack: cells replaces: const int64_t table_entries =]
      ? args.num_cells() // [stack: cells]
      : static_cast<int64_t>(args.num_destinations()); // [stack: cells replaces: static_cast<int64_t>(args.num_destinations());]
  // The numbering limits of kMaxChunkRecords, which plan_chunks keeps.
  TORCH_INTERNAL_ASSERT(
      chunk_points % kTilePoints == 0 &&
      chunk_points * kTapsPerPoint <= kMaxChunkRecords);
  // [stack: dense]
  TORCH_INTERNAL_ASSERT(
      !dense || table_entries <= chunk_points * kTapsPerPoint);
  // [end stack: dense]
  // [stack: index32]
  // 32-bit keys that cannot hold the key space would collide.
  TORCH_INTERNAL_ASSERT(!plan.key_32bit || keys_fit_32bit(table_entries));
  // [end stack: index32]
  // Half/BFloat16 sums span chunks in a float carry, or are rounded at once.
  const bool float_carry = chunking.carry_elements > 0;
  TORCH_INTERNAL_ASSERT(
      float_carry ==
      (kReducedPrecision && chunk_points < num_points && numel > 0));
  const CarryBlocks<index_t> blocks(
      args.batch * channels, image_size, chunking.carry_elements);
  // [stack: channels-fastest]
  // Threads that take channels fastest sweep whole images.
  TORCH_INTERNAL_ASSERT(!chunking.channels_fastest || blocks.count() == 1);
  // [end stack: channels-fastest]

  // [stack: hot-fold]
  // Dense chunks whose keys may be hot fold those in parallel (HotFold)
  // where the plan says (32-bit indices only, which keeps the unit within
  // its machine-code budget: larger calls fold serially, with the same
  // bits).
  const int32_t hot_key_limit =
      kHotRecords / (per_cell ? int32_t{1} << kDims : 1);
  const int64_t hot_ways = per_cell ? int64_t{1} << kDims : 1;
  TORCH_INTERNAL_ASSERT(
      !plan.hot_fold || (dense && std::is_same_v<index_t, int32_t>));
  const bool hot_capable =
      plan.hot_fold && numel > 0 && capacity > hot_key_limit;
  const int64_t hot_slots =
      hot_capable ? capacity / (hot_key_limit + 1) + 1 : 0;
  // The hot fold's units per hot destination and partials live in the dead
  // keys, which may grow into the workspace that the plan kept for points a
  // single chunk lacks, as far as the most units its hot destinations take:
  // each at most G + R / kRecordsPerPartial, its G groups no more than the
  // chunk's tiles, and the chunk's records counted once per way.
  auto hot_pool_need = [&]() -> int64_t {
    const int64_t destinations = std::min<int64_t>(
        hot_slots * hot_ways, int64_t{args.batch} * image_size);
    const int64_t tiles = (points_per_chunk + kTilePoints - 1) / kTilePoints;
    const int64_t units =
        destinations * tiles + capacity * hot_ways / kRecordsPerPartial;
    return hot_slots * hot_ways * static_cast<int64_t>(sizeof(HotUnits)) +
        units * channels * static_cast<int64_t>(sizeof(T));
  };
  const int64_t spare_bytes = (chunk_points - points_per_chunk) *
      chunk_bytes_per_point(
          items_per_point,
          kTapsPerPoint,
          key_bytes,
          sizeof(T),
          sizeof(index_t));
  const int64_t hot_pool_extra = hot_capable
      ? std::clamp<int64_t>(
            hot_pool_need() - capacity * key_bytes, 0, spare_bytes)
      : 0;
  // [end stack: hot-fold]
  const auto keys = ex.allocate(capacity * key_bytes + hot_pool_extra); // [stack: hot-fold replaces: const auto keys = ex.allocate(capacity * key_bytes);]
  const auto sorted_keys = ex.allocate(capacity * key_bytes);
  const auto ids = ex.allocate(capacity * sizeof(int32_t));
  const auto sorted_ids = ex.allocate(capacity * sizeof(int32_t));
  const auto weights =
      ex.allocate(points_per_chunk * kTapsPerPoint * sizeof(T));
  const auto gout_offsets = ex.allocate(points_per_chunk * sizeof(index_t));
  // [stack: dense]
  // Dense: the segment table, one fill per chunk.
  const int64_t table_bytes = table_entries * sizeof(SegmentBounds);
  const auto segments = ex.allocate(dense ? table_bytes : 0);
  // [end stack: dense]
  // [stack: channel-groups]
  const int64_t group_width = plan.channel_groups ? kChannelGroup<T> : 1;
  // [end stack: channel-groups]
  // [stack: channels-fastest]
  const bool copy = chunking.copy_grad_output;
  const auto gathered =
      ex.allocate(copy ? points_per_chunk * channels * sizeof(scalar_t) : 0);
  const auto gathered_offsets =
      ex.allocate(copy ? points_per_chunk * sizeof(index_t) : 0);
  // [end stack: channels-fastest]
  const auto carry_storage =
      ex.allocate(float_carry ? chunking.carry_elements * sizeof(T) : 0);
  // Where sums live between chunks: grad_input itself when it holds opmath
  // values, else the carry (none with a single chunk).
  T* const sums = kReducedPrecision ? static_cast<T*>(carry_storage.get())
                                    : reinterpret_cast<T*>(grad_input);

  const ChunkRecords<T, index_t> chunk{
      ChunkKeys{keys.get(), !plan.key_32bit}, // [stack: index32 replaces: ChunkKeys{keys.get()},]
      plan.keying, // [stack: cells]
      as<int32_t>(ids),
      as<T>(weights),
      as<index_t>(gout_offsets)};
  const ChunkKeys sorted_chunk_keys{sorted_keys.get(), !plan.key_32bit}; // [stack: index32 replaces: const ChunkKeys sorted_chunk_keys{sorted_keys.get()};]
  constexpr int kTapBits = log2_taps_per_point(kTaps, kDims);
  SortedRecords<scalar_t, index_t> sorted{
      as<int32_t>(sorted_ids),
      as<T>(weights),
      as<index_t>(gout_offsets),
      args.grad_output.data,
      args.grad_output.stride_c,
      kTapBits};
  const SortedRecords<scalar_t, index_t> sorted_in_place = sorted; // [stack: hot-fold]
  // [stack: channels-fastest]
  if (copy) {
    sorted.gout_offsets = as<index_t>(gathered_offsets);
    sorted.grad_output = as<scalar_t>(gathered);
    sorted.gout_stride_c = 1;
  }
  // [end stack: channels-fastest]
  SegmentBounds* const segment_table = as<SegmentBounds>(segments); // [stack: dense]
  const int end_bit = bits_for(table_entries);
  const int64_t points_per_image = args.points_per_image();

  // [stack: dense]
  auto marks_of = [&](int32_t num_items) {
    return MarkDestinationSegments{
        sorted_chunk_keys, num_items, table_entries, segment_table};
  };
  // [end stack: dense]

  auto sort_items = [&](int32_t num_items) {
    // [stack: index32]
    if (plan.key_32bit) {
      ex.stable_sort_pairs(
          as<int32_t>(keys), as<int32_t>(sorted_keys), as<int32_t>(ids),
          as<int32_t>(sorted_ids), num_items, end_bit);
      return;
    }
    // [end stack: index32]
    ex.stable_sort_pairs(
        as<int64_t>(keys), as<int64_t>(sorted_keys), as<int32_t>(ids),
        as<int32_t>(sorted_ids), num_items, end_bit);
  };

  // [stack: fused-fills]
  // What the point pass of a chunk of `count` points fills besides the
  // records (PointFills): the dense table where each thread's share stays
  // within kFusedFillWordsPerTap words per tap.
  const int64_t table_words =
      table_bytes / static_cast<int64_t>(sizeof(int32_t));
  auto fuses_table = [&](int64_t count) {
    return plan.fused_fills && dense &&
        table_words <= count * kTapsPerPoint * kFusedFillWordsPerTap;
  };
  const bool fuse_gather =
      plan.fused_fills && copy && channels <= kFusedGatherChannels;
  auto point_fills = [&](int64_t count) {
    PointFills<scalar_t, index_t> fills;
    if (fuses_table(count)) {
      fills.table = reinterpret_cast<int32_t*>(segment_table);
      fills.table_words = table_words;
      fills.words_per_point = (table_words + count - 1) / count;
    }
    if (fuse_gather) {
      fills.grad_output = args.grad_output.data;
      fills.stride_c = args.grad_output.stride_c;
      fills.channels = channels;
      fills.gathered = as<scalar_t>(gathered);
      fills.gathered_offsets = as<index_t>(gathered_offsets);
    }
    return fills;
  };
  // [end stack: fused-fills]

  // [stack: channels-fastest]
  // Whether a launch of its own copies a chunk's grad_output channels last,
  // and the copy.
  const bool gather_apart = copy && !fuse_gather; // [stack: fused-fills replaces: const bool gather_apart = copy;]
  auto gather_stage = [&] {
    using element_t = CopiedAs<scalar_t>;
    return GatherChannelsLast<element_t, index_t>{
        reinterpret_cast<const element_t*>(args.grad_output.data),
        as<index_t>(gout_offsets),
        args.grad_output.stride_c,
        channels,
        as<element_t>(gathered),
        as<index_t>(gathered_offsets)};
  };
  // [end stack: channels-fastest]
  // [stack: hot-fold]
  // The hot fold's units of stored partials for a chunk of `count` points:
  // as many as fit the chunk's unsorted keys and ids beside its slots' unit
  // ends and hot destinations' units; 0 where no key can be hot (it runs
  // not at all).
  auto hot_slots_of = [&](int64_t count) {
    return (count * items_per_point + hot_key_limit) / (hot_key_limit + 1);
  };
  auto hot_pool_units = [&](int64_t count) -> int64_t {
    if (!hot_capable || count * items_per_point <= hot_key_limit) {
      return 0;
    }
    const int64_t slots = hot_slots_of(count);
    const int64_t units_bytes =
        slots * hot_ways * static_cast<int64_t>(sizeof(HotUnits));
    const int64_t unit_bytes = channels * static_cast<int64_t>(sizeof(T));
    return std::max<int64_t>(
        0,
        std::min<int64_t>(
            {(capacity * key_bytes + hot_pool_extra - units_bytes) / unit_bytes,
             capacity - slots,
             std::numeric_limits<int32_t>::max() / channels}));
  };
  // The hot fold of a chunk of `count` points, which marks its segments
  // too; returns what the dense reduce reads of it.
  auto fold_hot = [&](const auto& fold, int64_t count, int64_t pool_units) {
    using Fold = std::decay_t<decltype(fold)>;
    using Segments = decltype(Fold::segments);
    const int32_t num_items = static_cast<int32_t>(count * items_per_point);
    const int64_t slots = hot_slots_of(count);
    const int64_t rows = (channels + group_width - 1) / group_width; // [stack: channel-groups replaces: const int64_t rows = channels;]
    const int64_t marks_per_row = (num_items + rows - 1) / rows;
    const int64_t copy_elements = gather_apart ? count * channels : 0;
    const int64_t copies_per_row = (copy_elements + rows - 1) / rows;
    const HotKeys<Segments> hot_keys{
        fold.segments,
        marks_of(num_items),
        Segments::tile_bits(kTapBits),
        hot_key_limit,
        static_cast<int32_t>(slots),
        as<int32_t>(ids),
        static_cast<int32_t>(pool_units)};
    ex.inclusive_sum(static_cast<int32_t>(slots), hot_keys, as<int32_t>(ids));
    HotUnits* const units = static_cast<HotUnits*>(keys.get());
    const HotFold<Fold> hot{
        fold,
        sorted_in_place,
        hot_keys,
        static_cast<int32_t>(marks_per_row),
        gather_stage(),
        copy_elements,
        static_cast<int32_t>(copies_per_row),
        reinterpret_cast<T*>(units + slots * hot_ways),
        as<int32_t>(ids) + slots,
        units, // [stack: channel-groups replaces: units};]
        static_cast<int32_t>(group_width)}; // [stack: channel-groups]
    ex.for_each_row(
        static_cast<int32_t>(rows),
        static_cast<int32_t>(std::max<int64_t>(
            {marks_per_row, copies_per_row, pool_units, slots * hot_ways})),
        hot);
    return hot.stored();
  };
  // [end stack: hot-fold]

  // One chunk's records, sorted by key.
  // [stack: dense]
  // A dense chunk's segment table too.
  // [end stack: dense]
  auto point_pass_and_sort = [&](int64_t first_point, int64_t count) {
    const int32_t num_items = static_cast<int32_t>(count * items_per_point);
    ex.for_each(
        static_cast<index_t>(count),
        PointPass<kTaps, Args>{ // [stack: fused-fills replaces: PointPass<kTaps, Args>{args, chunk, static_cast<index_t>(first_point)});]
            args, // [stack: fused-fills]
            chunk, // [stack: fused-fills]
            static_cast<index_t>(first_point), // [stack: fused-fills]
            point_fills(count)}); // [stack: fused-fills]
    sort_items(num_items);
    // [stack: dense]
    // Dense: the segment table's zero fill, then the bounds of every key.
    if (dense) {
      ex.zero(segment_table, fuses_table(count) ? 0 : table_bytes); // [stack: fused-fills replaces: ex.zero(segment_table, table_bytes);]
    }
    // [end stack: dense]
    // [stack: hot-fold]
    if (hot_pool_units(count) > 0) {
      return; // the hot fold marks the segments, and copies grad_output
    }
    // [end stack: hot-fold]
    // [stack: channels-fastest]
    if (gather_apart) {
      ex.for_each_row(static_cast<index_t>(count), channels, gather_stage());
    }
    // [end stack: channels-fastest]
    // [stack: dense]
    if (dense) {
      ex.for_each(num_items, marks_of(num_items));
    }
    // [end stack: dense]
  };

  // [stack: dense]
  // The dense reduce of rows [row_from, row_to) of `out`'s block, after a
  // chunk of `count` points.
  auto reduce_dense = [&](const ReduceOutput<scalar_t, index_t>& out,
                          int64_t row_from,
                          int64_t row_to,
                          int64_t count, // [stack: hot-fold]
                          int64_t first_fresh_image) {
    auto sweep = [&](const auto& segments_of) {
      using Segments = std::decay_t<decltype(segments_of)>;
      using Fold = DenseFold<Segments, scalar_t, index_t>;
      Fold fold{
          sorted,
          segments_of,
          out,
          channels,
          image_size,
          static_cast<index_t>(first_fresh_image),
          /*first_written_image=*/out.sums_out != out.sums_in
              ? 0
              : static_cast<index_t>(first_fresh_image)};
      auto reduce = [&] {
        // [stack: channels-fastest]
        if (chunking.channels_fastest) {
          ex.for_each(
              static_cast<index_t>((row_to - row_from) * image_size),
              ReduceDenseChannelsFastest<Fold>(
                  fold, static_cast<index_t>(row_from / channels)));
          return;
        }
        // [end stack: channels-fastest]
        reduce_channel_groups(ex, fold, row_from, row_to, group_width); // [stack: channel-groups replaces: reduce_destinations_fastest(ex, fold, row_from, row_to);]
      };
      // [stack: hot-fold]
      if constexpr (std::is_same_v<index_t, int32_t>) {
        const int64_t pool_units = hot_pool_units(count);
        if (pool_units > 0) {
          fold.stored = fold_hot(fold, count, pool_units);
        }
      }
      // [end stack: hot-fold]
      reduce();
    };
    // [stack: cells]
    if constexpr (kTaps == 2) {
      if (per_cell) {
        sweep(make_cell_segments(sorted.ids, segment_table, args.inp_size));
        return;
      }
    }
    // [end stack: cells]
    sweep(DestinationSegments<index_t>{sorted.ids, segment_table, image_size});
  };
  // [end stack: dense]

  // Sparse: every element of a block starts at zero; chunks then touch only
  // the destinations they have records for.
  auto zero_sums = [&](const ElementBlock<index_t>& block) {
    // [stack: dense]
    if (dense) {
      return; // the first chunk to reach an image writes its zeros
    }
    // [end stack: dense]
    ex.zero(
        float_carry ? static_cast<void*>(sums) : static_cast<void*>(grad_input),
        float_carry ? block.numel() * sizeof(T) : numel * sizeof(scalar_t));
  };

  // Each block of grad_input takes the chunks of the points of its images
  // (a chunk that serves two blocks runs twice).
  for (int64_t b = 0; b < blocks.count(); ++b) {
    const ElementBlock<index_t> block = blocks.block(b);
    const int64_t first_block_image = block.row_begin / channels;
    const int64_t end_block_image = (block.row_end - 1) / channels + 1;
    const int64_t first_chunk =
        first_block_image * points_per_image / chunk_points;
    const int64_t end_chunk =
        (end_block_image * points_per_image - 1) / chunk_points + 1;
    zero_sums(block);
    // [stack: dense]
    // Images from first_fresh_image on hold no running sums yet.
    int64_t first_fresh_image = first_block_image;
    // [end stack: dense]
    for (int64_t k = first_chunk; k < end_chunk; ++k) {
      const int64_t first_point = k * chunk_points;
      const int64_t count = std::min(chunk_points, num_points - first_point);
      point_pass_and_sort(first_point, count);
      // Sums are read where earlier chunks left them, and written there.
      // [stack: dense]
      // But a float carry's last dense chunk rounds the whole block into
      // grad_input.
      // [end stack: dense]
      const bool round_now = float_carry && dense && k == end_chunk - 1; // [stack: dense]
      const ReduceOutput<scalar_t, index_t> out(
          grad_input,
          kReducedPrecision && !float_carry ? nullptr : sums,
          kReducedPrecision && (!float_carry || round_now) ? nullptr : sums, // [stack: dense replaces: kReducedPrecision && !float_carry ? nullptr : sums,]
          block,
          image_size);
      // [stack: dense]
      if (dense) {
        // Points are numbered image by image, so this chunk's records land
        // in images [first_image, end_image) only: a dense reduce sweeps
        // their rows of the block, or all of the block's rows up to them
        // when it rounds the block.
        const int64_t first_image = first_point / points_per_image;
        const int64_t end_image =
            (first_point + count - 1) / points_per_image + 1;
        reduce_dense(
            out,
            round_now
                ? int64_t{block.row_begin}
                : std::max<int64_t>(first_image * channels, block.row_begin),
            std::min<int64_t>(end_image * channels, block.row_end),
            count, // [stack: hot-fold]
            first_fresh_image);
        first_fresh_image = end_image;
        continue;
      }
      // [end stack: dense]
      ex.for_each_row(
          channels,
          static_cast<int32_t>(count * items_per_point),
          ReduceSparse<scalar_t, index_t>{
              sorted,
              sorted_chunk_keys,
              static_cast<int32_t>(count * items_per_point),
              table_entries,
              out,
              channels, // [stack: index32 replaces: channels});]
              divider<index_t>(image_size)}); // [stack: index32]
    }
    if constexpr (kReducedPrecision) {
      if (float_carry && !dense) { // [stack: dense replaces: if (float_carry) {]
        // With 64-bit index math whatever the call's: one pass over the
        // block's memory, built once per dtype.
        const ElementBlock<int64_t> wide_block{
            block.row_begin, block.row_end, block.col_begin, block.col_end};
        ex.for_each_row(
            static_cast<int64_t>(block.row_end - block.row_begin),
            static_cast<int64_t>(block.width()),
            RoundCarry<scalar_t, int64_t>{ReduceOutput<scalar_t, int64_t>(
                grad_input,
                sums,
                nullptr,
                wide_block,
                static_cast<int64_t>(image_size))});
      }
    }
  }
}

// What the planner reads of a backward call: shapes, strides and element
// sizes, never data.
struct BackwardProblem {
  // [stack: index32]
  int64_t dims; // spatial: 2 for a 4-D input, 3 for a 5-D one
  int64_t taps_per_axis;
  // [end stack: index32]
  int64_t taps_per_point;
  int64_t num_points;
  int64_t channels;
  int64_t num_destinations;
  int64_t num_cells; // [stack: cells]
  int64_t grad_output_stride_c; // [stack: channels-fastest]
  int64_t scalar_bytes;
  int64_t opmath_bytes;
  bool index_fits_32bit; // [stack: index32]
  // [stack: index32]

  // The keys are 0 .. table_entries - 1; table_entries itself is "nowhere".
  int64_t table_entries(Keying keying) const { // [stack: cells replaces: int64_t table_entries() const {]
    return keying == Keying::PerTap ? num_destinations : num_cells; // [stack: cells replaces: return num_destinations;]
  }
  // [end stack: index32]
};

// [stack: index32]
inline bool fits_32bit_indexing(const TensorBase& t) {
  return !t.defined() || canUse32BitIndexMath(t);
}

inline bool fits_32bit_indexing(const GridSamplerBackwardCall& call) {
  return fits_32bit_indexing(call.input) && fits_32bit_indexing(call.grid) &&
      fits_32bit_indexing(call.grad_output) &&
      fits_32bit_indexing(call.grad_input);
}
// [end stack: index32]

// For a call of checked arguments.
inline BackwardProblem describe_backward(const GridSamplerBackwardCall& call) {
  const int64_t dims = call.input.dim() - 2;
  const int64_t taps = taps_per_axis(
      static_cast<GridSamplerInterpolation>(call.interpolation_mode));
  const int64_t batch = call.input.size(0);
  BackwardProblem problem{
      dims, // [stack: index32]
      taps, // [stack: index32]
      taps_per_point(static_cast<int>(taps), static_cast<int>(dims)),
      batch,
      call.input.size(1),
      batch,
      batch, // [stack: cells]
      call.grad_output.stride(1), // [stack: channels-fastest]
      static_cast<int64_t>(call.input.element_size()),
      static_cast<int64_t>(
          c10::elementSize(at::toOpMathType(call.input.scalar_type()))), // [stack: index32 replaces: c10::elementSize(at::toOpMathType(call.input.scalar_type())))};]
      fits_32bit_indexing(call)}; // [stack: index32]
  for (int64_t a = 0; a < dims; ++a) {
    problem.num_points *= call.grid.size(1 + a);
    problem.num_destinations *= call.input.size(2 + a);
    problem.num_cells *= call.input.size(2 + a) + 1; // [stack: cells]
  }
  return problem;
}

// [stack: channels-fastest]
// The thread order of a dense reduce, and the channels-last copy it reads
// when its threads take channels fastest over a grad_output whose channel
// stride is not 1. A sparse reduce has one order.
inline ChunkPlan with_thread_order(
    ChunkPlan chunks,
    bool channels_fastest,
    const BackwardProblem& problem) {
  chunks.channels_fastest = chunks.dense && channels_fastest;
  chunks.copy_grad_output =
      chunks.channels_fastest && problem.grad_output_stride_c > 1;
  return chunks;
}
// [end stack: channels-fastest]

// Chunks sized to `workspace_bytes` for the problem's records.
inline ChunkPlan plan_reduction_within(
    const BackwardProblem& problem,
    Keying keying, // [stack: cells]
    bool key_32bit, // [stack: index32]
    bool index_32bit, // [stack: index32]
    bool channels_fastest, // [stack: channels-fastest]
    int64_t workspace_bytes) {
  const int64_t index_bytes = index_32bit ? 4 : 8; // [stack: index32 replaces: const int64_t index_bytes = 8;]
  const int64_t key_bytes = key_32bit ? 4 : 8; // [stack: index32 replaces: const int64_t key_bytes = 8;]
  // [stack: dense]
  const int64_t table_entries = problem.table_entries(keying); // [stack: cells replaces: const int64_t table_entries = problem.table_entries();]
  // [end stack: dense]
  auto chunks_with = [&](bool copy) { // [stack: channels-fastest replaces: auto chunks_with = [&] {]
    return plan_chunks(
        problem.num_points, // [stack: dense]
        problem.taps_per_point, // [stack: dense]
        table_entries, // [stack: dense]
        chunk_bytes_per_point(
            keying == Keying::PerTap ? problem.taps_per_point : 1, // [stack: cells replaces: problem.taps_per_point,]
            problem.taps_per_point,
            key_bytes,
            problem.opmath_bytes,
            index_bytes),
        copy ? problem.channels * problem.scalar_bytes + index_bytes : 0, // [stack: channels-fastest]
        workspace_bytes);
  };
  // [stack: channels-fastest]
  if (channels_fastest) {
    const bool copy = problem.grad_output_stride_c > 1;
    const ChunkPlan chunks =
        with_thread_order(chunks_with(copy), true, problem);
    if (copy && chunks.chunk_points < problem.num_points) {
      // The copy's bytes never split a problem that fits one chunk without
      // them (every extra chunk is a sort and a sweep more): the reduce then
      // reads grad_output where it lies.
      ChunkPlan uncopied = chunks_with(false);
      if (uncopied.dense && uncopied.chunk_points >= problem.num_points) {
        uncopied.channels_fastest = true;
        return uncopied;
      }
    }
    return chunks;
  }
  // [end stack: channels-fastest]
  return chunks_with(false); // [stack: channels-fastest replaces: return chunks_with();]
}

// The most a float carry takes of the workspace.
constexpr int64_t kCarryBytes = kWorkspaceBytes / 2;

// The float carry of Half/BFloat16 sums over several chunks: all of
// grad_input where it fits kCarryBytes, else blocks of it
// (reduce_grad_input repeats the chunks of a block's images for each).
inline ChunkPlan with_carry(ChunkPlan chunks, const BackwardProblem& problem) {
  const int64_t numel = problem.num_destinations * problem.channels;
  const bool needed = problem.scalar_bytes < problem.opmath_bytes &&
      chunks.chunk_points < problem.num_points && numel > 0;
  chunks.carry_elements =
      needed ? std::min(numel, kCarryBytes / problem.opmath_bytes) : 0;
  // [stack: channels-fastest]
  // Blocks of rows are taken destinations fastest.
  if (needed && chunks.carry_elements < numel) {
    chunks.channels_fastest = false;
    chunks.copy_grad_output = false;
  }
  // [end stack: channels-fastest]
  return chunks;
}

// Chunks sized to the workspace, a float carry included.
inline ChunkPlan plan_reduction( // [stack: index32 replaces: inline ChunkPlan plan_reduction(const BackwardProblem& problem) {]
    bool key_32bit, // [stack: index32]
    bool index_32bit, // [stack: index32]
    bool channels_fastest, // [stack: channels-fastest]
    Keying keying, // [stack: cells]
    const BackwardProblem& problem) { // [stack: index32]
  auto within = [&](int64_t workspace_bytes, bool channels_fastest) { // [stack: channels-fastest replaces: auto within = [&](int64_t workspace_bytes) {]
    return with_carry( // [stack: index32 replaces: return with_carry(plan_reduction_within(problem, workspace_bytes), problem);]
        plan_reduction_within( // [stack: index32]
            problem, // [stack: index32]
            keying, // [stack: cells]
            key_32bit, // [stack: index32]
            index_32bit, // [stack: index32]
            channels_fastest, // [stack: channels-fastest]
            workspace_bytes), // [stack: index32]
        problem); // [stack: index32]
  };
  const ChunkPlan chunks = within(kWorkspaceBytes, channels_fastest); // [stack: channels-fastest replaces: const ChunkPlan chunks = within(kWorkspaceBytes);]
  if (chunks.carry_elements == 0) {
    return chunks;
  }
  // Several chunks of Half/BFloat16: the carry takes its share first.
  // [stack: channels-fastest]
  // Where it holds grad_input in blocks, the threads take destinations
  // fastest (so the chunks need no channels-last copy).
  const bool blocked =
      chunks.carry_elements < problem.num_destinations * problem.channels;
  // [end stack: channels-fastest]
  return within(
      kWorkspaceBytes - chunks.carry_elements * problem.opmath_bytes, // [stack: channels-fastest replaces: kWorkspaceBytes - chunks.carry_elements * problem.opmath_bytes);]
      channels_fastest && !blocked); // [stack: channels-fastest]
}

// [stack: index32]
// A plan with index math as wide as `index_32bit` says.
inline BackwardPlan plan_keyed(
    bool index_32bit,
    Keying keying, // [stack: cells]
    const BackwardProblem& problem) {
  BackwardPlan plan;
  plan.index_32bit = index_32bit;
  plan.keying = keying; // [stack: cells]
  plan.key_32bit = keys_fit_32bit(problem.table_entries(keying)); // [stack: cells replaces: plan.key_32bit = keys_fit_32bit(problem.table_entries());]
  plan.chunks = plan_reduction(
      plan.key_32bit,
      index_32bit,
      prefers_channels_fastest(problem.channels), // [stack: channels-fastest]
      keying, // [stack: cells]
      problem);
  plan.hot_fold = index_32bit && plan.chunks.dense; // [stack: hot-fold]
  return plan;
}
// [end stack: index32]

// [stack: index32]
// Whether 32-bit index math may run the problem: where it fits, and the
// sampler is built with it (has_32bit_index_math).
inline bool index_32bit_for(const BackwardProblem& problem) {
  return problem.index_fits_32bit &&
      has_32bit_index_math(
          static_cast<int>(problem.taps_per_axis),
          static_cast<int>(problem.dims));
}
// [end stack: index32]

// The default plan: one sort item per tap, chunks as large as the workspace
// allows.
// [stack: index32]
// 32-bit keys and index math wherever they fit (index math where the
// sampler is built with it, too).
// [end stack: index32]
// [stack: cells]
// One sort item per point wherever bilinear or trilinear sampling reduces
// densely.
// [end stack: cells]
inline BackwardPlan plan_backward(const BackwardProblem& problem) {
  const bool index_32bit = index_32bit_for(problem); // [stack: index32]
  // [stack: cells]
  if (problem.taps_per_axis == 2) {
    BackwardPlan plan = plan_keyed(index_32bit, Keying::PerCell, problem);
    if (plan.chunks.dense) {
      return plan;
    }
  }
  // [end stack: cells]
  return plan_keyed( // [stack: index32 replaces: return BackwardPlan{plan_reduction(problem)};]
      index_32bit, // [stack: index32]
      Keying::PerTap, // [stack: cells]
      problem); // [stack: index32]
}

// Calls fn(scalar_t(), index_t(), std::integral_constant<int, kDims>()) with
// the call's dtype, the index type and its spatial dimensionality (2 for a
// 4-D input, 3 for a 5-D one).
// [stack: index32]
// The index type is int32_t where index_32bit, else int64_t.
// [end stack: index32]
template <typename Fn>
void dispatch_backward_types(
    const GridSamplerBackwardCall& call,
    bool index_32bit, // [stack: index32]
    const Fn& fn) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      ScalarType::Half,
      ScalarType::BFloat16,
      call.input.scalar_type(),
      "grid_sampler_backward_deterministic",
      [&] {
        auto with_index = [&](auto dims) {
          // [stack: index32]
          if (index_32bit) {
            fn(scalar_t(), int32_t(), dims);
            return;
          }
          // [end stack: index32]
          fn(scalar_t(), int64_t(), dims);
        };
        if (call.input.dim() == 4) {
          with_index(std::integral_constant<int, 2>{});
        } else {
          with_index(std::integral_constant<int, 3>{});
        }
      });
}

// grad_input of the backward of grid_sampler_2d (4-D input) or
// grid_sampler_3d (5-D input) on `ex`, for checked arguments, as `plan`
// says: writes every element of a contiguous grad_input (grad_grid is the
// existing kernel's, which has one writer per element). Every
// interpolation mode of either rank, 3-D bicubic (tricubic, which
// grid_sampler_3d has from torch 2.15) included. The CUDA launcher and the
// host executors run this one function.
// [stack: index32]
// 3-D bicubic runs with 64-bit index math only (has_32bit_index_math).
// [end stack: index32]
template <typename Executor>
void run_deterministic_backward(
    const Executor& ex,
    const GridSamplerBackwardCall& call,
    const BackwardPlan& plan) {
  // [stack: index32]
  const auto mode =
      static_cast<GridSamplerInterpolation>(call.interpolation_mode);
  const int dims = static_cast<int>(call.input.dim()) - 2;
  TORCH_CHECK(
      !plan.index_32bit || has_32bit_index_math(taps_per_axis(mode), dims),
      "grid_sampler_3d_backward (deterministic): 3-D bicubic sampling runs "
      "with 64-bit index math only, but the plan asks for 32-bit");
  // 32-bit index math over larger tensors would address out of bounds.
  TORCH_INTERNAL_ASSERT(!plan.index_32bit || fits_32bit_indexing(call));
  // [end stack: index32]
  dispatch_backward_types(
      call,
      plan.index_32bit, // [stack: index32]
      [&](auto scalar, auto index, auto spatial_dims) {
        using scalar_t = decltype(scalar);
        using index_t = decltype(index);
        constexpr int kDims = decltype(spatial_dims)::value;
        using Args = BackwardArgs<scalar_t, index_t, kDims>;
        TORCH_CHECK(
            call.grad_input.is_contiguous(),
            Args::op_name(),
            " (deterministic): expected a contiguous grad_input");
        const Args args = make_backward_args<scalar_t, index_t, kDims>(call);
        scalar_t* const grad_input = call.grad_input.data_ptr<scalar_t>();
        dispatch_taps_per_axis(args.interpolation_mode, [&](auto taps) {
          constexpr int kTaps = decltype(taps)::value;
          // [stack: index32]
          if constexpr (
              !has_32bit_index_math(kTaps, kDims) &&
              std::is_same_v<index_t, int32_t>) {
            return; // not built; refused above
          } else
          // [end stack: index32]
          reduce_grad_input<kTaps>(ex, args, grad_input, plan);
        });
      });
}

} // namespace at::native::grid_sampler_deterministic

#undef GRID_SAMPLER_DET_UNROLL
#undef GRID_SAMPLER_DET_ROLLED
