#pragma once
// The stages of the deterministic grid_sampler backward and their order,
// written once over an executor. The CUDA launcher
// (GridSamplerDeterministic.cu) and the kit's host executor both call
// run_deterministic_backward() below; they differ only in how an executor
// runs a stage. The per-point math and the canonical reduction order are in
// GridSamplerDeterministic.cuh.
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
//   inclusive_sum(in, out, count) of int32 values.
//   allocate(bytes) -> c10::DataPtr, zero(data, bytes).
//   begin_chunk()                 marks where a chunk's stages begin (for
//                                 work counters and profiler ranges).
// Each of these is one launch (or one CUB call) on CUDA; none is called with
// a count of zero. Stages are plain structs with C10_HOST_DEVICE call
// operators, passed by value, so a CUDA launch takes no parameter's address.

#include <ATen/native/cuda/GridSamplerDeterministic.cuh>
#include <ATen/native/cuda/GridSamplerDeterministic.h>

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/native/CanUse32BitIndexMath.h>
#include <c10/core/Allocator.h>

#include <algorithm>
#include <array>
#include <limits>
#include <type_traits>

namespace at::native::grid_sampler_deterministic {

// Point pass: the grid gradient of points [first_point, first_point + count)
// and, with kEmitRecords, their records.
template <
    int kTaps,
    bool kEmitRecords,
    Keying kKeying,
    typename Args,
    typename key_t>
struct PointPass {
  using index_t = typename Args::index_type;
  Args args;
  ChunkRecords<key_t, typename Args::opmath_t, index_t> chunk;
  index_t first_point;

  C10_HOST_DEVICE void operator()(index_t i) const {
    process_point<kTaps, kEmitRecords, kKeying>(args, first_point + i, i, chunk);
  }
};

// Dense reduction, step 1: segments[k] bounds the sorted records of key k,
// a destination (PerTap) or a cell (PerCell); both were zero-filled before, so an untouched key has an empty range. One thread per
// sorted record, O(records): only the first and the last record of each key
// write.
template <typename key_t>
struct MarkDestinationSegments {
  const key_t* keys;
  int32_t count;
  key_t nowhere;
  SegmentBounds* segments;

  C10_HOST_DEVICE void operator()(int32_t i) const {
    const key_t d = keys[i];
    if (d == nowhere) {
      return;
    }
    if (i == 0 || keys[i - 1] != d) {
      segments[d].begin = i;
    }
    if (i == count - 1 || keys[i + 1] != d) {
      segments[d].end = i + 1;
    }
  }
};

// Sparse reduction, step 1: 1 where a run of one destination's sorted
// records begins, else 0.
template <typename key_t>
struct MarkRunHeads {
  const key_t* keys;
  int32_t* heads;

  C10_HOST_DEVICE void operator()(int32_t i) const {
    heads[i] = i == 0 || keys[i] != keys[i - 1];
  }
};

// Sparse reduction, step 2, after run_number = inclusive_sum(heads): run j
// is [run_begin[j], run_begin[j + 1]), for j < *num_runs.
template <typename key_t>
struct RecordRunStarts {
  const key_t* keys;
  const int32_t* run_number;
  int32_t count;
  int32_t* run_begin;
  int32_t* num_runs;

  C10_HOST_DEVICE void operator()(int32_t i) const {
    if (i == 0 || keys[i] != keys[i - 1]) {
      run_begin[run_number[i] - 1] = i;
    }
    if (i == count - 1) {
      run_begin[run_number[i]] = count;
      *num_runs = run_number[i];
    }
  }
};

// What the reduce reads of a sorted chunk: the record ids in sorted order,
// and by record id the weights and, by point, the grad_output offsets.
template <typename scalar_t, typename index_t>
struct SortedRecords {
  const int32_t* ids;
  const at::opmath_type<scalar_t>* weights;
  const index_t* gout_offsets;
  const scalar_t* grad_output;
  index_t gout_stride_c;

  // One wide multiply-add: the product is formed in 64 bits rather than
  // sign-extended after.
  C10_HOST_DEVICE const scalar_t* gout_channel(index_t c) const {
    return grad_output + static_cast<int64_t>(c) * gout_stride_c;
  }
};

// Where the dense reduce finds one destination's records, from the segment
// bounds of step 1. PerTap: the destination's own segment.
template <typename index_t>
struct DestinationSegments {
  const int32_t* ids;
  const SegmentBounds* segments;
  index_t destinations_per_image;

  C10_HOST_DEVICE SortedRecordIds of(index_t n, index_t s) const {
    const SegmentBounds bounds = segments[n * destinations_per_image + s];
    return SortedRecordIds{ids, bounds.begin, bounds.end};
  }
};

// Division by a divisor fixed at launch, by a multiply and a shift for
// 32-bit indices (IntDivider; dividends are below 2^31 there), a plain
// division for 64-bit ones. Per-element index math divides only with these.
template <typename index_t>
using Divider = at::cuda::detail::IntDivider<std::make_unsigned_t<index_t>>;

template <typename index_t>
C10_HOST_DEVICE inline index_t divide(index_t n, const Divider<index_t>& by) {
  return static_cast<index_t>(
      by.div(static_cast<std::make_unsigned_t<index_t>>(n)));
}

// PerCell: the segments of the destination's 2^kDims neighbouring cells,
// merged. Dense tables hold at most 2^31 cells, so cell numbers are int32.
template <typename index_t, int kDims>
struct CellSegments {
  static constexpr int kWays = 1 << kDims;
  const int32_t* point_ids;
  const SegmentBounds* segments;
  int32_t cells_per_image;
  // Row-major strides of the cells of an image, whose every axis is one
  // longer than the input's.
  int32_t cell_stride[kDims];
  // by_axis[a] divides by the input's size along axis a (a > 0).
  Divider<index_t> by_axis[kDims];

  // The cell at destination s of an image: s, plus one cell for every row
  // before s (cell rows are one longer), plus in 3-D one row of cells for
  // every plane before s. With the input's sizes (D, H, W):
  // s + s / W + (s / (H * W)) * (W + 1), which needs no remainder.
  C10_HOST_DEVICE int32_t cell_of(index_t s) const {
    index_t outer = divide(s, by_axis[kDims - 1]);
    int32_t cell = static_cast<int32_t>(s + outer);
    for (int a = kDims - 2; a > 0; --a) {
      outer = divide(outer, by_axis[a]);
      cell += static_cast<int32_t>(outer) * cell_stride[a];
    }
    return cell;
  }

  // Cell-number offset of way k's corner (MergedCellRecords). The x step
  // is the literal 1, so ways k and k + 1 load side by side.
  C10_HOST_DEVICE int32_t way_offset(int k) const {
    int32_t offset = k & 1;
    for (int a = 0; a < kDims - 1; ++a) {
      offset += ((k >> (kDims - 1 - a)) & 1) * cell_stride[a];
    }
    return offset;
  }

  // Cell number of the lowest corner of destination s of image n.
  C10_HOST_DEVICE int32_t base_cell(index_t n, index_t s) const {
    return static_cast<int32_t>(n) * cells_per_image + cell_of(s);
  }

  C10_HOST_DEVICE MergedCellRecords<kWays> of(index_t n, index_t s) const {
    int32_t way_offsets[kWays];
    for (int k = 0; k < kWays; ++k) {
      way_offsets[k] = way_offset(k);
    }
    return MergedCellRecords<kWays>(
        point_ids, segments, base_cell(n, s), way_offsets);
  }
};

template <typename index_t, int kDims>
CellSegments<index_t, kDims> make_cell_segments(
    const int32_t* point_ids,
    const SegmentBounds* bounds,
    const Spatial<index_t, kDims>& inp_size) {
  CellSegments<index_t, kDims> segments{point_ids, bounds, 1, {}, {}};
  for (int a = kDims - 1; a >= 0; --a) {
    segments.cell_stride[a] = segments.cells_per_image;
    segments.cells_per_image *= static_cast<int32_t>(inp_size.v[a]) + 1;
    segments.by_axis[a] = Divider<index_t>(
        static_cast<std::make_unsigned_t<index_t>>(inp_size.v[a]));
  }
  return segments;
}

// Dense reduction, step 2: what both thread orders below share. The single
// writer of element (n, c, s) of a contiguous (N, C, spatial...) output folds
// the records of destination (n, s) for channel c. `carry` (same layout)
// holds the sums of earlier chunks for images before first_fresh_image;
// images from it on start from zero. Untouched elements are written (their
// zeros, or a float carry rounded into grad_input) from image
// first_written_image on, and left as they are before it.
template <
    int kTapsPerPoint,
    typename Segments,
    typename scalar_t,
    typename index_t,
    typename out_t>
struct DenseFold {
  using T = at::opmath_type<scalar_t>;
  using scalar_type = scalar_t;
  using index_type = index_t;
  SortedRecords<scalar_t, index_t> records;
  Segments segments;
  out_t* out;
  const T* carry;
  index_t channels;
  index_t destinations_per_image;
  index_t first_fresh_image;
  index_t first_written_image;

  // element = (n * channels + c) * destinations_per_image + s.
  C10_HOST_DEVICE void fold_into(
      index_t n,
      index_t s,
      const scalar_t* gout_channel,
      index_t element) const {
    const auto ids = segments.of(n, s);
    if (ids.done() && n < first_written_image) {
      return;
    }
    const T initial =
        n < first_fresh_image ? carry[element] : static_cast<T>(0);
    out[element] = static_cast<out_t>(fold_records<kTapsPerPoint>(
        ids, records.weights, records.gout_offsets, gout_channel, initial));
  }
};

// Destinations fastest: thread (row (n - first_image) * C + c, column =
// spatial index s), so a warp's lanes take consecutive destinations of one
// channel: their segment bounds load coalesced, their writes are contiguous,
// and neighbouring destinations' sorted records lie side by side.
template <typename Fold>
struct ReduceDense {
  using index_t = typename Fold::index_type;
  Fold fold;
  index_t first_image;

  struct Row {
    index_t n;
    const typename Fold::scalar_type* gout_channel;
    index_t first_element;
  };

  C10_HOST_DEVICE Row row(index_t r) const {
    const index_t image = r / fold.channels;
    const index_t c = r - image * fold.channels;
    const index_t n = first_image + image;
    return Row{
        n,
        fold.records.gout_channel(c),
        (n * fold.channels + c) * fold.destinations_per_image};
  }

  C10_HOST_DEVICE void operator()(const Row& row, index_t s) const {
    fold.fold_into(row.n, s, row.gout_channel, row.first_element + s);
  }
};

// Channels fastest: thread i takes pair p = first_pair + i, destination
// p / channels and channel p % channels, so a warp's lanes fold the same
// records (the merge and the loads of ids, weights and offsets are the same
// for all of them) and read grad_output at consecutive channels of one
// point: contiguous when its channel stride is 1, which GatherChannelsLast
// provides when grad_output's own is not. A 1-D launch: as a row per image
// (n without a division), sm_90 code recomputed values in the fold's record
// loop that it could no longer keep in registers (57 instructions per
// record instead of 46).
template <typename Fold>
struct ReduceDenseChannelsFastest {
  using index_t = typename Fold::index_type;
  Fold fold;
  // The pairs of the images before the first one swept.
  index_t first_pair;
  Divider<index_t> by_channels;
  Divider<index_t> by_image_size;

  ReduceDenseChannelsFastest(const Fold& fold, index_t first_image)
      : fold(fold),
        first_pair(first_image * fold.channels * fold.destinations_per_image),
        by_channels(static_cast<std::make_unsigned_t<index_t>>(fold.channels)),
        by_image_size(static_cast<std::make_unsigned_t<index_t>>(
            fold.destinations_per_image)) {}

  C10_HOST_DEVICE void operator()(index_t i) const {
    const index_t destination = divide(first_pair + i, by_channels);
    const index_t c = first_pair + i - destination * fold.channels;
    const index_t n = divide(destination, by_image_size);
    const index_t s = destination - n * fold.destinations_per_image;
    fold.fold_into(
        n,
        s,
        fold.records.gout_channel(c),
        (n * fold.channels + c) * fold.destinations_per_image + s);
  }
};

// A chunk's grad_output, channels last: row p (a point of the chunk) holds
// its channels contiguously, and gathered_offsets[p] = p * channels is where.
template <typename scalar_t, typename index_t>
struct GatherChannelsLast {
  const scalar_t* grad_output;
  const index_t* gout_offsets;
  index_t stride_c;
  index_t channels;
  scalar_t* gathered;
  index_t* gathered_offsets;

  struct Row {
    index_t point;
    index_t source;
  };

  C10_HOST_DEVICE Row row(index_t p) const {
    return Row{p, gout_offsets[p]};
  }

  C10_HOST_DEVICE void operator()(const Row& row, index_t c) const {
    const index_t target = row.point * channels;
    gathered[target + c] = grad_output[row.source + c * stride_c];
    if (c == 0) {
      gathered_offsets[row.point] = target;
    }
  }
};

// Sparse reduction, step 3: one thread per (channel row c, run j): lanes take
// consecutive runs of one channel, whose sorted records are contiguous. The
// output was zero-filled; runs of taps that land nowhere are skipped.
template <
    int kTapsPerPoint,
    typename scalar_t,
    typename index_t,
    typename key_t,
    typename out_t>
struct ReduceSparse {
  using T = at::opmath_type<scalar_t>;
  SortedRecords<scalar_t, index_t> records;
  const key_t* keys;
  const int32_t* run_begin;
  const int32_t* num_runs;
  key_t nowhere;
  out_t* out;
  index_t channels;
  index_t destinations_per_image;
  Divider<index_t> by_image_size;
  bool has_carry;

  struct Row {
    index_t channel;
    const scalar_t* gout_channel;
  };

  C10_HOST_DEVICE Row row(index_t c) const {
    return Row{c, records.gout_channel(c)};
  }

  C10_HOST_DEVICE void operator()(const Row& row, int32_t j) const {
    if (j >= *num_runs) {
      return;
    }
    const int32_t begin = run_begin[j];
    const key_t destination = keys[begin];
    if (destination == nowhere) {
      return;
    }
    const index_t d = static_cast<index_t>(destination);
    const index_t n = divide(d, by_image_size);
    // (n, c, s) of the output, s = d - n * destinations_per_image.
    out_t& element = out
        [(n * channels + row.channel) * destinations_per_image +
         (d - n * destinations_per_image)];
    const T initial =
        has_carry ? static_cast<T>(element) : static_cast<T>(0);
    element = static_cast<out_t>(fold_records<kTapsPerPoint>(
        SortedRecordIds{records.ids, begin, run_begin[j + 1]},
        records.weights,
        records.gout_offsets,
        row.gout_channel,
        initial));
  }
};

// Rounds a finished float carry into grad_input, element by element (both
// contiguous).
template <typename scalar_t, typename index_t>
struct RoundCarry {
  const at::opmath_type<scalar_t>* carry;
  scalar_t* grad_input;

  C10_HOST_DEVICE void operator()(index_t i) const {
    grad_input[i] = static_cast<scalar_t>(carry[i]);
  }
};

// Bits a radix sort must look at for keys in [0, max_key] (at least one).
inline int bits_for(int64_t max_key) {
  int bits = 1;
  while (max_key > 1) {
    max_key >>= 1;
    ++bits;
  }
  return bits;
}

inline bool fits_32bit_indexing(const TensorBase& t) {
  return !t.defined() || canUse32BitIndexMath(t);
}

template <typename T>
T* as(const c10::DataPtr& data) {
  return static_cast<T*>(data.get());
}

// The numbering a chunk relies on. Its record ids (point * taps + tap) are
// int32 in the sort payloads and segment tables, and uint32 in fold_records'
// tile ends and in MergedCellRecords, whose kExhausted must lie above every
// record id and tile end. A chunk is whole tiles, so its record count is a
// multiple of a tile's records and no tile end exceeds it: at most
// kMaxChunkRecords records per chunk keeps all of them below 2^31. A dense
// table has no more entries than a chunk has records, so its cell numbers
// (n * cells_per_image + cell) are int32 too.
constexpr int64_t kMaxChunkRecords = std::numeric_limits<int32_t>::max();
static_assert(
    kMaxChunkRecords < int64_t{MergedCellRecords<4>::kExhausted},
    "kExhausted must exceed every record id and tile end");
// The default chunk is sized by kWorkspaceBytes, which a record's key and
// payload (8 bytes at least) fill long before kMaxChunkRecords.
static_assert(
    kWorkspaceBytes / (2 * int64_t{sizeof(int32_t)}) < kMaxChunkRecords,
    "the workspace budget must bound a chunk below kMaxChunkRecords");

// Two ways to reach every grad_input element, with the same sums. Dense:
// a table of segment bounds over every key (destination or cell), then one
// thread per element of the images the chunk's points lie in, the first
// chunk to reach an image writing its zeros too (no memset).
// Sparse (PerTap only): a zero fill, then one thread per (run of one
// destination's records, channel). Dense is chosen when its table has no
// more entries than a chunk has taps, so that a pass over every element
// costs no more than folding the chunk's records, and when it fits the
// workspace beside the chunk; sparse otherwise. Either way the work and the
// workspace are bounded by a chunk, not by the size of the input.
struct ChunkPlan {
  int64_t chunk_points; // whole tiles
  bool dense;
  // Dense only: ReduceDenseChannelsFastest, reading a GatherChannelsLast copy
  // of each chunk's grad_output when copy_grad_output.
  bool channels_fastest = false;
  bool copy_grad_output = false;
};

// Channels fastest pays from this many channels on: at fp32, 16 lanes on
// one point read 64 contiguous bytes (two 32-byte sectors) where 16 lanes on
// 16 destinations read 16 sectors, and the lanes share one merge. Below it a
// warp spans more destinations than it saves sectors, and its writes,
// strided by the image size, cost a sector per lane either way.
constexpr int64_t kChannelsFastestFrom = 16;

inline bool prefers_channels_fastest(int64_t channels) {
  return channels >= kChannelsFastestFrom;
}

// Bytes of workspace per point of a chunk: sort keys and payloads, in and
// out, and CUB's scratch, which holds one more copy of both (the radix sort
// with separate input and output buffers ping-pongs through its own); the
// weight of every tap; the grad_output offset.
inline int64_t chunk_bytes_per_point(
    int64_t items_per_point,
    int64_t taps_per_point,
    int64_t key_bytes,
    int64_t weight_bytes,
    int64_t index_bytes) {
  return items_per_point * 3 * (key_bytes + int64_t{sizeof(int32_t)}) +
      taps_per_point * weight_bytes + index_bytes;
}

// Kept free of the budget for CUB's histograms and tile states, which grow
// with the number of items far more slowly than its copy of them.
constexpr int64_t kSortScratchSlack = int64_t{1} << 20;

// Whether a dense reduction may run on chunks of chunk_points points: its
// table of keys has no more entries than a chunk has records, which keeps a
// pass over every element as cheap as folding the chunk, and every cell
// number within a chunk's int32 record numbering.
inline bool dense_table_fits(
    int64_t table_entries,
    int64_t num_points,
    int64_t chunk_points,
    int64_t taps_per_point) {
  return table_entries <= std::min(num_points, chunk_points) * taps_per_point;
}

// Points per chunk and the reduction: as many whole tiles as fit
// kWorkspaceBytes with the dense table, if dense, beside them, and
// dense_bytes_per_point more per point in a dense reduction. Chunks
// must be whole tiles, or the chunk size would change the partials and so
// the result; a chunk's sort items are counted in int32.
inline ChunkPlan plan_chunks(
    int64_t num_points,
    int64_t taps_per_point,
    int64_t table_entries,
    int64_t bytes_per_point,
    int64_t dense_bytes_per_point) {
  auto dense_with = [&](int64_t chunk_points) {
    return dense_table_fits(
        table_entries, num_points, chunk_points, taps_per_point);
  };
  auto tiles_within = [&](int64_t bytes, int64_t per_point) {
    return std::max<int64_t>(bytes, 0) / (per_point * kTilePoints);
  };
  // Less the fixed bytes of a chunk: the extra record id and the run count.
  const int64_t budget =
      kWorkspaceBytes - kSortScratchSlack - 2 * int64_t{sizeof(int32_t)};
  const int64_t table_bytes = table_entries * 2 * int64_t{sizeof(int32_t)};
  const int64_t dense_tiles = tiles_within(
      budget - table_bytes, bytes_per_point + dense_bytes_per_point);
  if (dense_tiles > 0 && dense_with(dense_tiles * kTilePoints)) {
    return {dense_tiles * kTilePoints, true};
  }
  return {
      std::max<int64_t>(tiles_within(budget, bytes_per_point), 1) * kTilePoints,
      false};
}

// The grad_input half of the backward for contiguous grad_input, chunk by
// chunk: point pass, stable sort, reduce (see the .cu file's pipeline), with
// records keyed by kKeying; PerCell needs plan.dense.
template <
    int kTaps,
    Keying kKeying,
    typename key_t,
    typename Executor,
    typename scalar_t,
    typename index_t,
    int kDims>
void reduce_grad_input(
    const Executor& ex,
    const BackwardArgs<scalar_t, index_t, kDims>& args,
    scalar_t* grad_input,
    const ChunkPlan& plan) {
  using Args = BackwardArgs<scalar_t, index_t, kDims>;
  using T = at::opmath_type<scalar_t>;
  constexpr int kTapsPerPoint = ipow(kTaps, kDims);
  constexpr int kItemsPerPoint = kKeying == Keying::PerCell ? 1 : kTapsPerPoint;
  constexpr bool kReducedPrecision = !std::is_same_v<scalar_t, T>;
  constexpr bool kPerTap = kKeying == Keying::PerTap;
  TORCH_INTERNAL_ASSERT(kPerTap || plan.dense);

  const int64_t chunk_points = plan.chunk_points;
  const bool dense = plan.dense;
  const int64_t num_points = args.num_points();
  const index_t channels = args.channels;
  const index_t image_size = args.destinations_per_image();
  const index_t numel = args.batch * channels * image_size;
  if (num_points == 0) {
    // Nothing lands anywhere; below, every chunk has points.
    ex.zero(grad_input, numel * sizeof(scalar_t));
    return;
  }
  const int64_t num_chunks =
      std::max<int64_t>(1, (num_points + chunk_points - 1) / chunk_points);
  const int64_t points_per_chunk = std::min(num_points, chunk_points);
  const int64_t capacity = points_per_chunk * kItemsPerPoint;
  // The keys are 0 .. table_entries - 1; table_entries itself is "nowhere".
  const int64_t table_entries = kPerTap ? args.num_destinations() : args.num_cells();
  const key_t nowhere = static_cast<key_t>(table_entries);
  // The numbering limits of kMaxChunkRecords, which plan_chunks keeps.
  TORCH_INTERNAL_ASSERT(
      chunk_points % kTilePoints == 0 &&
      chunk_points * kTapsPerPoint <= kMaxChunkRecords &&
      (!dense || table_entries <= chunk_points * kTapsPerPoint));

  // After the sort the unsorted keys and ids are dead until the next chunk's
  // point pass, so the sparse reduce keeps its int32 bookkeeping there
  // (heads, run numbers, run starts).
  const auto keys = ex.allocate(capacity * sizeof(key_t));
  const auto sorted_keys = ex.allocate(capacity * sizeof(key_t));
  const auto ids = ex.allocate((capacity + 1) * sizeof(int32_t));
  const auto sorted_ids = ex.allocate(capacity * sizeof(int32_t));
  const auto weights = ex.allocate(points_per_chunk * kTapsPerPoint * sizeof(T));
  const auto gout_offsets = ex.allocate(points_per_chunk * sizeof(index_t));
  // Dense: the segment table, one fill per chunk.
  const auto segments =
      ex.allocate(dense ? table_entries * sizeof(SegmentBounds) : 0);
  const auto num_runs = ex.allocate(dense ? 0 : sizeof(int32_t));
  const bool copy = plan.copy_grad_output;
  const auto gathered =
      ex.allocate(copy ? points_per_chunk * channels * sizeof(scalar_t) : 0);
  const auto gathered_offsets =
      ex.allocate(copy ? points_per_chunk * sizeof(index_t) : 0);
  // Running sums between chunks live in grad_input itself when it holds
  // opmath values, else in a float buffer of its size.
  const bool float_carry = kReducedPrecision && num_chunks > 1;
  const auto carry_storage = ex.allocate(float_carry ? numel * sizeof(T) : 0);
  T* const carry = as<T>(carry_storage);

  const ChunkRecords<key_t, T, index_t> chunk{
      as<key_t>(keys), as<int32_t>(ids), as<T>(weights), as<index_t>(gout_offsets)};
  const SortedRecords<scalar_t, index_t> sorted = copy
      ? SortedRecords<scalar_t, index_t>{
            as<int32_t>(sorted_ids),
            as<T>(weights),
            as<index_t>(gathered_offsets),
            as<scalar_t>(gathered),
            1}
      : SortedRecords<scalar_t, index_t>{
            as<int32_t>(sorted_ids),
            as<T>(weights),
            as<index_t>(gout_offsets),
            args.grad_output.data,
            args.grad_output.stride_c};
  SegmentBounds* const segment_table = as<SegmentBounds>(segments);
  int32_t* const bookkeeping_a = as<int32_t>(ids);
  int32_t* const bookkeeping_b = reinterpret_cast<int32_t*>(as<key_t>(keys));

  if (!dense) {
    // Sparse: every element starts at zero; chunks then touch only the
    // destinations they have records for.
    if (float_carry) {
      ex.zero(carry, numel * sizeof(T));
    } else {
      ex.zero(grad_input, numel * sizeof(scalar_t));
    }
  }
  const int end_bit = bits_for(table_entries);
  const int64_t points_per_image = args.points_per_image();
  // Images before first_fresh_image had points in an earlier chunk: they
  // hold running sums.
  int64_t first_fresh_image = 0;
  for (int64_t k = 0; k < num_chunks; ++k) {
    const int64_t first_point = k * chunk_points;
    const int64_t count = std::min(chunk_points, num_points - first_point);
    const int32_t num_items = static_cast<int32_t>(count * kItemsPerPoint);
    const bool last = k == num_chunks - 1;
    // Points are numbered image by image, so this chunk's records land in
    // images [first_image, end_image) only. A dense reduce sweeps just those,
    // but for the last chunk of a float carry, which rounds the images
    // finished before it into grad_input too.
    const int64_t first_image = first_point / points_per_image;
    const int64_t end_image = (first_point + count - 1) / points_per_image + 1;
    const int64_t sweep_from = float_carry && last ? 0 : first_image;
    ex.begin_chunk();
    ex.for_each(
        static_cast<index_t>(count),
        PointPass<kTaps, true, kKeying, Args, key_t>{
            args, chunk, static_cast<index_t>(first_point)});
    ex.stable_sort_pairs(
        as<key_t>(keys),
        as<key_t>(sorted_keys),
        as<int32_t>(ids),
        as<int32_t>(sorted_ids),
        num_items,
        end_bit);

    // Where this chunk's reduce writes (out) and reads the sums of earlier
    // chunks (in): grad_input itself when it holds opmath values; for
    // Half/BFloat16 the float carry while there is one, except that the last
    // chunk of a dense reduction rounds straight into grad_input.
    auto reduce_into = [&](auto* out, const T* in) {
      using out_t = std::remove_pointer_t<decltype(out)>;
      auto reduce_dense = [&](const auto& segments_of) {
        using Segments = std::decay_t<decltype(segments_of)>;
        using Fold =
            DenseFold<kTapsPerPoint, Segments, scalar_t, index_t, out_t>;
        const Fold fold{
            sorted,
            segments_of,
            out,
            in,
            channels,
            image_size,
            static_cast<index_t>(first_fresh_image),
            /*first_written_image=*/static_cast<const void*>(out) != in
                ? 0
                : static_cast<index_t>(first_fresh_image)};
        const index_t first_swept = static_cast<index_t>(sweep_from);
        const index_t rows_swept =
            static_cast<index_t>(end_image - sweep_from) * channels;
        if (plan.channels_fastest) {
          ex.for_each(
              rows_swept * image_size,
              ReduceDenseChannelsFastest<Fold>(fold, first_swept));
        } else {
          ex.for_each_row(
              rows_swept, image_size, ReduceDense<Fold>{fold, first_swept});
        }
      };
      if constexpr (kPerTap) {
        if (dense) {
          reduce_dense(DestinationSegments<index_t>{
              sorted.ids, segment_table, image_size});
        } else {
          ex.for_each_row(
              channels,
              num_items,
              ReduceSparse<kTapsPerPoint, scalar_t, index_t, key_t, out_t>{
                  sorted,
                  as<key_t>(sorted_keys),
                  bookkeeping_a,
                  as<int32_t>(num_runs),
                  nowhere,
                  out,
                  channels,
                  image_size,
                  Divider<index_t>(
                      static_cast<std::make_unsigned_t<index_t>>(image_size)),
                  static_cast<const void*>(out) == in});
        }
      } else {
        reduce_dense(make_cell_segments(
            sorted.ids, segment_table, args.inp_size));
      }
    };
    if (copy) {
      ex.for_each_row(
          static_cast<index_t>(count),
          channels,
          GatherChannelsLast<scalar_t, index_t>{
              args.grad_output.data,
              as<index_t>(gout_offsets),
              args.grad_output.stride_c,
              channels,
              as<scalar_t>(gathered),
              as<index_t>(gathered_offsets)});
    }
    if (dense) {
      ex.zero(segment_table, table_entries * sizeof(SegmentBounds));
      ex.for_each(
          num_items,
          MarkDestinationSegments<key_t>{
              as<key_t>(sorted_keys), num_items, nowhere, segment_table});
    } else if (num_items > 0) {
      ex.for_each(
          num_items,
          MarkRunHeads<key_t>{as<key_t>(sorted_keys), bookkeeping_a});
      ex.inclusive_sum(bookkeeping_a, bookkeeping_b, num_items);
      ex.for_each(
          num_items,
          RecordRunStarts<key_t>{
              as<key_t>(sorted_keys),
              bookkeeping_b,
              num_items,
              bookkeeping_a,
              as<int32_t>(num_runs)});
    } else {
      continue;
    }
    if constexpr (!kReducedPrecision) {
      reduce_into(grad_input, grad_input);
    } else if (!float_carry) {
      reduce_into(grad_input, nullptr);
    } else if (dense && last) {
      reduce_into(grad_input, carry);
    } else {
      reduce_into(carry, carry);
    }
    first_fresh_image = end_image;
  }
  if (!dense && float_carry) {
    ex.for_each(numel, RoundCarry<scalar_t, index_t>{carry, grad_input});
  }
}

// What the planner reads of a backward call: shapes, strides and element
// sizes, never data.
struct BackwardProblem {
  int64_t taps_per_axis;
  int64_t taps_per_point;
  int64_t num_points;
  int64_t channels;
  int64_t num_destinations;
  int64_t num_cells;
  int64_t grad_output_stride_c;
  int64_t scalar_bytes;
  int64_t opmath_bytes;
  bool index_fits_32bit;

  // The keys are 0 .. table_entries - 1; table_entries itself is "nowhere".
  int64_t table_entries(Keying keying) const {
    return keying == Keying::PerTap ? num_destinations : num_cells;
  }
};

inline bool fits_32bit_indexing(const GridSamplerBackwardCall& call) {
  return fits_32bit_indexing(call.input) && fits_32bit_indexing(call.grid) &&
      fits_32bit_indexing(call.grad_output) &&
      (!call.output_mask[0] || fits_32bit_indexing(call.grad_input)) &&
      fits_32bit_indexing(call.grad_grid);
}

// For a call of checked arguments.
inline BackwardProblem describe_backward(const GridSamplerBackwardCall& call) {
  const int64_t dims = call.input.dim() - 2;
  const int64_t taps = taps_per_axis(
      static_cast<GridSamplerInterpolation>(call.interpolation_mode));
  const int64_t batch = call.input.size(0);
  BackwardProblem problem{
      taps,
      ipow(static_cast<int>(taps), static_cast<int>(dims)),
      batch,
      call.input.size(1),
      batch,
      batch,
      call.grad_output.stride(1),
      static_cast<int64_t>(call.input.element_size()),
      static_cast<int64_t>(
          c10::elementSize(at::toOpMathType(call.input.scalar_type()))),
      fits_32bit_indexing(call)};
  for (int64_t a = 0; a < dims; ++a) {
    problem.num_points *= call.grid.size(1 + a);
    problem.num_destinations *= call.input.size(2 + a);
    problem.num_cells *= call.input.size(2 + a) + 1;
  }
  return problem;
}

// Threads per block and a cap on blocks per launch of the CUDA executor's
// grid-stride loops; the host executor has no use for them.
constexpr int64_t kDefaultBlockSize = 256;
constexpr int64_t kMaxBlockSize = 512;
constexpr int64_t kDefaultMaxBlocks = int64_t{1} << 20;

struct LaunchShape {
  int64_t block_size = kDefaultBlockSize;
  int64_t max_blocks = kDefaultMaxBlocks;
};

// Every choice a backward call runs with, decided before it runs.
// plan_backward() makes them from the shapes; any plan that keeps the
// pipeline's limits (which it asserts) gives the same bits, because the
// canonical order depends on none of them.
struct BackwardPlan {
  bool index_32bit = true;
  Keying keying = Keying::PerTap;
  bool key_32bit = true;
  ChunkPlan chunks{kTilePoints, false};
  LaunchShape launch;
};

// table_entries itself is a key: it marks records that land nowhere.
inline bool keys_fit_32bit(int64_t table_entries) {
  return table_entries < std::numeric_limits<int32_t>::max();
}

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

// Chunks sized to the workspace for records keyed by `keying`, with keys and
// index math of the given widths.
inline ChunkPlan plan_reduction(
    const BackwardProblem& problem,
    Keying keying,
    bool key_32bit,
    bool index_32bit,
    bool channels_fastest) {
  const int64_t index_bytes = index_32bit ? 4 : 8;
  auto chunks_with = [&](bool copy) {
    return plan_chunks(
        problem.num_points,
        problem.taps_per_point,
        problem.table_entries(keying),
        chunk_bytes_per_point(
            keying == Keying::PerTap ? problem.taps_per_point : 1,
            problem.taps_per_point,
            key_32bit ? 4 : 8,
            problem.opmath_bytes,
            index_bytes),
        copy ? problem.channels * problem.scalar_bytes + index_bytes : 0);
  };
  const bool copy = channels_fastest && problem.grad_output_stride_c > 1;
  const ChunkPlan chunks =
      with_thread_order(chunks_with(copy), channels_fastest, problem);
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

inline BackwardPlan plan_keyed(
    const BackwardProblem& problem,
    Keying keying,
    bool index_32bit) {
  BackwardPlan plan;
  plan.index_32bit = index_32bit;
  plan.keying = keying;
  plan.key_32bit = keys_fit_32bit(problem.table_entries(keying));
  plan.chunks = plan_reduction(
      problem,
      keying,
      plan.key_32bit,
      index_32bit,
      prefers_channels_fastest(problem.channels));
  return plan;
}

// The default plan: 32-bit keys and index math wherever they fit, one sort
// item per point wherever bilinear or trilinear sampling reduces densely
// (one per tap otherwise), chunks as large as the workspace allows.
inline BackwardPlan plan_backward(const BackwardProblem& problem) {
  if (problem.taps_per_axis == 2) {
    BackwardPlan plan =
        plan_keyed(problem, Keying::PerCell, problem.index_fits_32bit);
    if (plan.chunks.dense) {
      return plan;
    }
  }
  return plan_keyed(problem, Keying::PerTap, problem.index_fits_32bit);
}

// Runs the grad_input reduction of `plan`, with records keyed by kKeying.
template <int kTaps, Keying kKeying, typename Executor, typename Args>
void reduce_grad_input_keyed(
    const Executor& ex,
    const Args& args,
    typename Args::scalar_type* grad_input,
    const BackwardPlan& plan) {
  const int64_t table_entries = kKeying == Keying::PerTap
      ? static_cast<int64_t>(args.num_destinations())
      : args.num_cells();
  // 32-bit keys that cannot hold the key space would collide.
  TORCH_INTERNAL_ASSERT(!plan.key_32bit || keys_fit_32bit(table_entries));
  if (plan.key_32bit) {
    reduce_grad_input<kTaps, kKeying, int32_t>(ex, args, grad_input, plan.chunks);
  } else {
    reduce_grad_input<kTaps, kKeying, int64_t>(ex, args, grad_input, plan.chunks);
  }
}

template <typename Executor, typename scalar_t, typename index_t, int kDims>
void run_backward_with_index(
    const Executor& ex,
    const GridSamplerBackwardCall& call,
    const BackwardPlan& plan) {
  using Args = BackwardArgs<scalar_t, index_t, kDims>;
  const auto args = make_backward_args<scalar_t, index_t, kDims>(
      call.grad_grid,
      call.grad_output,
      call.input,
      call.grid,
      call.interpolation_mode,
      call.padding_mode,
      call.align_corners,
      call.output_mask[1]);

  const TensorBase& grad_grid = call.grad_grid;
  if (!call.output_mask[1] && grad_grid.defined() && grad_grid.numel() > 0) {
    // Not asked for, so not computed (upstream #64977); a grid gradient the
    // caller allocated anyway is zeroed rather than left uninitialized.
    TORCH_CHECK(
        grad_grid.is_contiguous(),
        Args::op_name(),
        " (deterministic): expected a contiguous grad_grid");
    ex.zero(grad_grid.data_ptr(), grad_grid.nbytes());
  }
  const TensorBase& grad_input = call.grad_input;
  const bool reduce = call.output_mask[0] && grad_input.numel() > 0;
  if (!reduce && args.grad_grid.data == nullptr) {
    return;
  }
  dispatch_taps_per_axis(args.interpolation_mode, [&](auto taps_per_axis) {
    constexpr int kTaps = decltype(taps_per_axis)::value;
    if (!reduce) {
      // Grid gradient only: no records, no sort, nothing to group.
      ex.for_each(
          args.num_points(),
          PointPass<kTaps, false, Keying::PerTap, Args, int32_t>{args, {}, 0});
      return;
    }
    TORCH_CHECK(
        grad_input.is_contiguous(),
        Args::op_name(),
        " (deterministic): expected a contiguous grad_input");
    scalar_t* const grad_input_data = grad_input.data_ptr<scalar_t>();
    if (plan.keying == Keying::PerCell) {
      // Per-cell keys hold one of a point's taps only where they are a
      // cell's distinct corners (bilinear, trilinear).
      TORCH_INTERNAL_ASSERT(kTaps == 2);
      if constexpr (kTaps == 2) {
        reduce_grad_input_keyed<kTaps, Keying::PerCell>(
            ex, args, grad_input_data, plan);
      }
      return;
    }
    reduce_grad_input_keyed<kTaps, Keying::PerTap>(
        ex, args, grad_input_data, plan);
  });
}

// Calls fn(scalar_t(), index_t(), std::integral_constant<int, kDims>()) with
// the call's dtype, the index type (int32_t where index_32bit) and its
// spatial dimensionality (2 for a 4-D input, 3 for a 5-D one).
template <typename Fn>
void dispatch_backward_types(
    const GridSamplerBackwardCall& call,
    bool index_32bit,
    const Fn& fn) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      ScalarType::Half,
      ScalarType::BFloat16,
      call.input.scalar_type(),
      "grid_sampler_backward_deterministic",
      [&] {
        auto with_index = [&](auto dims) {
          if (index_32bit) {
            fn(scalar_t(), int32_t(), dims);
          } else {
            fn(scalar_t(), int64_t(), dims);
          }
        };
        if (call.input.dim() == 4) {
          with_index(std::integral_constant<int, 2>{});
        } else {
          with_index(std::integral_constant<int, 3>{});
        }
      });
}

// The deterministic backward of grid_sampler_2d (4-D input) or
// grid_sampler_3d (5-D input) on `ex`, for checked arguments, as `plan`
// says: writes every element of a contiguous grad_input when
// output_mask[0], grad_grid when output_mask[1], and zeroes a defined
// grad_grid otherwise.
template <typename Executor>
void run_deterministic_backward(
    const Executor& ex,
    const GridSamplerBackwardCall& call,
    const BackwardPlan& plan) {
  if (!call.output_mask[0] && !call.output_mask[1]) {
    return;
  }
  // 32-bit index math over larger tensors would address out of bounds.
  TORCH_INTERNAL_ASSERT(!plan.index_32bit || fits_32bit_indexing(call));
  dispatch_backward_types(
      call, plan.index_32bit, [&](auto scalar, auto index, auto dims) {
        run_backward_with_index<
            Executor,
            decltype(scalar),
            decltype(index),
            decltype(dims)::value>(ex, call, plan);
      });
}

// The CUDA launch of run_deterministic_backward for a 4-D (kDims 2) or 5-D
// (kDims 3) input with a given plan, after the checks of GridSampler.cpp's
// native functions (GridSamplerDeterministic.cu). The launchers of
// GridSamplerDeterministic.h run plan_backward()'s plan.
template <int kDims>
void launch_cuda_backward_with_plan(
    const GridSamplerBackwardCall& call,
    const BackwardPlan& plan);

} // namespace at::native::grid_sampler_deterministic
