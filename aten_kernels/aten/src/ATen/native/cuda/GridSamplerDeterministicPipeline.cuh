#pragma once
// The stages of the deterministic grid_sampler backward and their order,
// written once over an executor. The CUDA launcher
// (GridSamplerDeterministic.cu) calls run_deterministic_backward() below
// with its executor; an executor that runs the stages on the CPU gives the
// same bits, since only how a stage is run differs. The per-point math and the canonical reduction order are in
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

// Point pass: the records of points [first_point, first_point + count), and
// their grid gradient when requested.
template <int kTaps, typename Args>
struct PointPass {
  using index_t = typename Args::index_type;
  Args args;
  ChunkRecords<typename Args::opmath_t, index_t> chunk;
  index_t first_point;

  C10_HOST_DEVICE void operator()(index_t i) const {
    process_point<kTaps>(args, first_point + i, i, chunk);
  }
};

// Dense reduction, step 1: segments[k] bounds the sorted records of key k,
// a destination (PerTap) or a cell (PerCell); both were zero-filled before,
// so an untouched key has an empty range. One thread per sorted record,
// O(records): only the first and the last record of each key write.
struct MarkDestinationSegments {
  ChunkKeys keys;
  int32_t count;
  int64_t nowhere;
  SegmentBounds* segments;

  C10_HOST_DEVICE void operator()(int32_t i) const {
    const int64_t d = keys[i];
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
struct MarkRunHeads {
  ChunkKeys keys;
  int32_t* heads;

  C10_HOST_DEVICE void operator()(int32_t i) const {
    heads[i] = i == 0 || keys[i] != keys[i - 1];
  }
};

// Sparse reduction, step 2, after run_number = inclusive_sum(heads): run j
// is [run_begin[j], run_begin[j + 1]), for j < *num_runs.
struct RecordRunStarts {
  ChunkKeys keys;
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
// and by record id the weights and, by point, the grad_output offsets;
// 2^tap_bits taps per point.
template <typename scalar_t, typename index_t>
struct SortedRecords {
  const int32_t* ids;
  const at::opmath_type<scalar_t>* weights;
  const index_t* gout_offsets;
  const scalar_t* grad_output;
  index_t gout_stride_c;
  int tap_bits;

  // One wide multiply-add: the product is formed in 64 bits rather than
  // sign-extended after.
  C10_HOST_DEVICE const scalar_t* gout_channel(index_t c) const {
    return grad_output + static_cast<int64_t>(c) * gout_stride_c;
  }
  template <typename RecordIds, typename T>
  C10_HOST_DEVICE T fold(RecordIds records, const scalar_t* gout_channel, T acc)
      const {
    return fold_records(
        records, weights, gout_offsets, gout_channel, tap_bits, acc);
  }
};

// The first position in [begin, end) of ascending ids whose id is at least
// `bound` (end if none is).
C10_HOST_DEVICE inline int32_t first_id_at_least(
    const int32_t* ids,
    int32_t begin,
    int32_t end,
    uint32_t bound) {
  while (begin < end) {
    const int32_t middle = begin + (end - begin) / 2;
    if (static_cast<uint32_t>(ids[middle]) < bound) {
      begin = middle + 1;
    } else {
      end = middle;
    }
  }
  return begin;
}


// Where the dense reduce finds one destination's records, from the segment
// bounds of step 1. PerTap: the destination's own segment.
template <typename index_t>
struct DestinationSegments {
  // Keys per destination: its own.
  static constexpr int kWays = 1;
  const int32_t* ids;
  const SegmentBounds* segments;
  index_t destinations_per_image;

  C10_HOST_DEVICE SortedRecordIds of(index_t n, index_t s) const {
    const SegmentBounds bounds = segments[n * destinations_per_image + s];
    return SortedRecordIds{ids, bounds.begin, bounds.end};
  }

  // What the hot fold (HotFold) needs of the keys. The ids are record ids,
  // 2^tap_bits per point; a destination's one key is its own.
  static C10_HOST_DEVICE int tile_bits(int tap_bits) {
    return tap_bits + kTilePointsLog2;
  }
  C10_HOST_DEVICE const int32_t* sorted_ids() const {
    return ids;
  }
  C10_HOST_DEVICE int64_t key_of(index_t n, index_t s, int /*way*/) const {
    return int64_t{n} * destinations_per_image + s;
  }
  C10_HOST_DEVICE bool
  destination_of(int64_t key, int /*way*/, index_t& n, index_t& s) const {
    n = static_cast<index_t>(key / destinations_per_image);
    s = static_cast<index_t>(key - int64_t{n} * destinations_per_image);
    return true;
  }
  C10_HOST_DEVICE SortedRecordIds
  records_in(const SegmentBounds (&ranges)[kWays]) const {
    return SortedRecordIds{ids, ranges[0].begin, ranges[0].end};
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

template <typename index_t>
Divider<index_t> divider(int64_t divisor) {
  return Divider<index_t>(static_cast<std::make_unsigned_t<index_t>>(divisor));
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

  // What the hot fold (HotFold) needs of the keys. The ids are point
  // numbers, whatever the taps; way k of destination (n, s) is the cell
  // base_cell(n, s) + way_offset(k).
  static C10_HOST_DEVICE int tile_bits(int /*tap_bits*/) {
    return kTilePointsLog2;
  }
  C10_HOST_DEVICE const int32_t* sorted_ids() const {
    return point_ids;
  }
  C10_HOST_DEVICE int64_t key_of(index_t n, index_t s, int way) const {
    return base_cell(n, s) + way_offset(way);
  }
  // The destination whose way `way` cell `key` is, if there is one: the
  // cell's corner, in its image and within the input.
  C10_HOST_DEVICE bool
  destination_of(int64_t key, int way, index_t& n, index_t& s) const {
    const int64_t base = key - way_offset(way);
    if (base < 0 || base / cells_per_image != key / cells_per_image) {
      return false;
    }
    n = static_cast<index_t>(base / cells_per_image);
    int32_t cell = static_cast<int32_t>(base - int64_t{n} * cells_per_image);
    int64_t position = 0;
    for (int a = 0; a < kDims; ++a) {
      // The cells along axis a: one more than the input's size.
      const int32_t cells =
          (a == 0 ? cells_per_image : cell_stride[a - 1]) / cell_stride[a];
      const int32_t coordinate = cell / cell_stride[a];
      cell -= coordinate * cell_stride[a];
      if (coordinate >= cells - 1) {
        return false;
      }
      position = position * (cells - 1) + coordinate;
    }
    s = static_cast<index_t>(position);
    return true;
  }
  C10_HOST_DEVICE MergedCellRecords<kWays>
  records_in(const SegmentBounds (&ranges)[kWays]) const {
    return MergedCellRecords<kWays>(point_ids, ranges);
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
    segments.by_axis[a] = divider<index_t>(inp_size.v[a]);
  }
  return segments;
}

// A block of grad_input's elements, viewed as rows (n, c), n * C + c, of
// destinations_per_image columns s each: rows [row_begin, row_end) by
// columns [col_begin, col_end). A reduce reads and writes only the elements
// of its block.
template <typename index_t>
struct ElementBlock {
  index_t row_begin;
  index_t row_end;
  index_t col_begin;
  index_t col_end;

  C10_HOST_DEVICE bool holds(index_t row, index_t s) const {
    return row >= row_begin && row < row_end && s >= col_begin && s < col_end;
  }
  C10_HOST_DEVICE index_t width() const {
    return col_end - col_begin;
  }
  C10_HOST_DEVICE index_t numel() const {
    return (row_end - row_begin) * width();
  }
};

// The place of element (row, s) of a block in a buffer that holds the block
// alone: row * width + s - origin, one multiply-add per element.
template <typename index_t>
struct BlockOffsets {
  index_t width;
  index_t origin;

  explicit BlockOffsets(const ElementBlock<index_t>& block)
      : width(block.width()),
        origin(block.row_begin * block.width() + block.col_begin) {}
  C10_HOST_DEVICE index_t operator()(index_t row, index_t s) const {
    return row * width + s - origin;
  }
};

// Where a reduce finds the running sums of earlier chunks and puts its
// results. Sums are opmath values laid out as the block (ElementBlock::
// offset): grad_input itself for float and double (whose block is all of
// it), a float carry for Half/BFloat16 while an element's records span
// chunks. `sums_in` is read for the images that earlier chunks reached;
// results go to `sums_out`, or, where that is null, rounded to grad_input.
template <typename scalar_t, typename index_t>
struct ReduceOutput {
  using T = at::opmath_type<scalar_t>;
  scalar_t* grad_input;
  const T* sums_in;
  T* sums_out;
  ElementBlock<index_t> block;
  BlockOffsets<index_t> offset;
  index_t destinations_per_image;

  ReduceOutput(
      scalar_t* grad_input,
      const T* sums_in,
      T* sums_out,
      const ElementBlock<index_t>& block,
      index_t destinations_per_image)
      : grad_input(grad_input),
        sums_in(sums_in),
        sums_out(sums_out),
        block(block),
        offset(block),
        destinations_per_image(destinations_per_image) {}

  C10_HOST_DEVICE T running_sum(index_t row, index_t s) const {
    return sums_in[offset(row, s)];
  }
  C10_HOST_DEVICE void write(index_t row, index_t s, T sum) const {
    if (sums_out != nullptr) {
      sums_out[offset(row, s)] = sum;
    } else {
      grad_input[row * destinations_per_image + s] = static_cast<scalar_t>(sum);
    }
  }
};

// Dense reduction, step 2: what both thread orders below share. The single
// writer of element (n, c, s) folds the records of destination (n, s) for
// channel c, its row being n * C + c. Images before first_fresh_image hold
// running sums of earlier chunks; images from it on start from zero.
// Untouched elements are written (their zeros, or running sums rounded into
// grad_input) from image first_written_image on, and left as they are
// before it.
template <typename Segments, typename scalar_t, typename index_t>
struct DenseFold {
  using T = at::opmath_type<scalar_t>;
  using scalar_type = scalar_t;
  using index_type = index_t;
  SortedRecords<scalar_t, index_t> records;
  Segments segments;
  ReduceOutput<scalar_t, index_t> out;
  index_t channels;
  index_t destinations_per_image;
  index_t first_fresh_image;
  index_t first_written_image;

  C10_HOST_DEVICE T initial_sum(index_t n, index_t row, index_t s) const {
    return n < first_fresh_image ? out.running_sum(row, s) : static_cast<T>(0);
  }

  C10_HOST_DEVICE void fold_into(
      index_t n,
      index_t row,
      index_t s,
      const scalar_t* gout_channel) const {
    const auto ids = segments.of(n, s);
    if (ids.done() && n < first_written_image) {
      return;
    }
    out.write(row, s, records.fold(ids, gout_channel, initial_sum(n, row, s)));
  }
};

// The parallel fold of hot destinations. One thread folds every record of a
// (destination, channel) pair, so a destination with a million records (a
// constant grid puts every point on one pixel) would cost its threads a
// million dependent loads and adds. A partial never straddles a tile, so the
// tiles of a hot destination are folded in parallel, and their partials are
// then added in order: the same partials and the same additions as
// fold_records makes, so the same bits.
//
// A key (a destination's own segment, or one of its cells) is hot when it
// holds more than key_limit = kHotRecords / kWays records, and a destination
// is hot when one of its keys is; its hot way of least index owns it. A hot
// key beginning at sorted position b has slot b / (key_limit + 1), which no
// other hot key shares, and a hot destination has a group per tile from the
// tile of its first record to that of its last. Per dense chunk:
//   kMarkSegments   a thread per sorted record, as MarkDestinationSegments,
//                   but a hot key gets the empty bounds {end, end}, so that
//                   the reduce folds none of its records, and the thread of
//                   its last record counts the groups of the destinations
//                   it owns into its slot.
//   (an inclusive sum of the slots' groups numbers the groups)
//   kStorePartials  a thread per (channel, group) stores its group's
//                   partials, and one per (channel, hot destination) its
//                   running sum, which the reduce may overwrite.
//   (the dense reduce)
//   kAddPartials    a thread per (channel, hot destination) adds the stored
//                   partials to the running sum, in order, and writes the
//                   element; where its groups did not fit `pool_groups`, it
//                   folds the destination's records serially instead.
// A destination with no hot key folds at most kHotRecords records in the
// reduce; a hot one at most a tile's in kStorePartials and its partials in
// kAddPartials. Everything is found from the sorted keys, by binary search
// where a bound was hidden, with no atomics: the groups' numbering is a
// function of the sorted keys alone. The tables live in the chunk's unsorted
// keys and ids, which are dead after the sort, and the slots' counts beside
// the segment table, whose zero fill clears them.
constexpr int32_t kHotRecords = 4096;
// The most bytes of slot counts a chunk needs: a chunk item takes 24 bytes
// of the workspace at least (chunk_bytes_per_point), and a hot key more
// than kHotRecords / 8 items.
constexpr int64_t kHotSlotBytes =
    (kWorkspaceBytes / 24 / (kHotRecords / 8 + 1) + 1) *
    int64_t{sizeof(int32_t)};

enum class HotStep : int8_t { kMarkSegments, kStorePartials, kAddPartials };

template <typename Fold>
struct HotFold {
  using Segments = decltype(Fold::segments);
  using T = typename Fold::T;
  using index_t = typename Fold::index_type;
  using scalar_t = typename Fold::scalar_type;
  static constexpr int kWays = Segments::kWays;
  // Above every record id: the bound of a destination's whole range.
  static constexpr uint32_t kEveryId = std::numeric_limits<uint32_t>::max();
  static_assert(
      std::is_same_v<index_t, int32_t>,
      "hot destinations fold in parallel with 32-bit indices only");
  Fold fold;
  MarkDestinationSegments marks; // the sorted keys, and the table
  HotStep step;
  int tile_bits;
  int32_t key_limit; // a key with more records is hot
  int32_t num_slots;
  int32_t* slot_groups; // zero-filled with the table
  int32_t* slot_ends; // inclusive sums of slot_groups
  int32_t pool_groups;
  int32_t partials_per_group;
  T* partials; // [channel][group][partial]
  int32_t* partial_counts; // [group]
  T* running_sums; // [channel][hot destination]

  struct Row {
    index_t channel;
    const scalar_t* gout_channel;
  };

  C10_HOST_DEVICE Row row(index_t c) const {
    return Row{c, fold.records.gout_channel(c)};
  }

  C10_HOST_DEVICE void operator()(const Row& row, int32_t i) const {
    switch (step) {
      case HotStep::kMarkSegments:
        mark_segments(i);
        return;
      case HotStep::kStorePartials:
        store_partials(row, i);
        return;
      case HotStep::kAddPartials:
        add_partials(row, i);
        return;
    }
  }

  // Hot destinations are numbered slot * kWays + way, for the way of their
  // owner.
  C10_HOST_DEVICE int32_t max_hot_destinations() const {
    return num_slots * kWays;
  }
  C10_HOST_DEVICE int32_t total_groups() const {
    return slot_ends[num_slots - 1];
  }

  // The sorted position of key k's first record (or of the first greater
  // key), and whether k is hot.
  C10_HOST_DEVICE int32_t key_begin(int64_t k) const {
    int32_t low = 0;
    int32_t high = marks.count;
    while (low < high) {
      const int32_t middle = low + (high - low) / 2;
      if (marks.keys[middle] < k) {
        low = middle + 1;
      } else {
        high = middle;
      }
    }
    return low;
  }
  C10_HOST_DEVICE bool is_hot(int64_t k, int32_t begin) const {
    return begin + key_limit < marks.count && marks.keys[begin + key_limit] == k;
  }

  // The hot key of slot `slot`, if it has one: a hot key beginning in the
  // slot holds its last position, being longer than the slot.
  C10_HOST_DEVICE bool hot_key_of(int32_t slot, int64_t& key) const {
    const int32_t last = std::min(
        (slot + 1) * (key_limit + 1) - 1, marks.count - 1);
    key = marks.keys[last];
    if (key == marks.nowhere) {
      return false;
    }
    const int32_t begin = key_begin(key);
    return begin / (key_limit + 1) == slot && is_hot(key, begin);
  }

  // The destination that hot key `key` is way `way` of, where that way
  // owns it: none of its ways before is hot.
  C10_HOST_DEVICE bool
  owned_destination(int64_t key, int way, index_t& n, index_t& s) const {
    if (!fold.segments.destination_of(key, way, n, s)) {
      return false;
    }
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < way; ++w) {
      const int64_t other = fold.segments.key_of(n, s, w);
      if (is_hot(other, key_begin(other))) {
        return false;
      }
    }
    return true;
  }

  // Where destination (n, s)'s records are, found from the keys (the table
  // hides a hot key's bounds): way w's sorted positions whose ids are in
  // [first_id, end_id), and the tiles of its first and last record.
  C10_HOST_DEVICE SegmentBounds way_range(
      index_t n,
      index_t s,
      int way,
      uint32_t first_id,
      uint32_t end_id) const {
    const int64_t key = fold.segments.key_of(n, s, way);
    const int32_t begin = key_begin(key);
    const int32_t end = key_begin(key + 1);
    const int32_t* ids = fold.segments.sorted_ids();
    return SegmentBounds{
        first_id_at_least(ids, begin, end, first_id),
        first_id_at_least(ids, begin, end, end_id)};
  }
  struct TileSpan {
    int32_t first;
    int32_t last;
  };
  C10_HOST_DEVICE TileSpan tiles_of(index_t n, index_t s) const {
    const int32_t* ids = fold.segments.sorted_ids();
    TileSpan tiles{std::numeric_limits<int32_t>::max(), -1};
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < kWays; ++w) {
      const int64_t key = fold.segments.key_of(n, s, w);
      const int32_t begin = key_begin(key);
      const int32_t end = key_begin(key + 1);
      if (begin < end) {
        tiles.first = std::min(tiles.first, ids[begin] >> tile_bits);
        tiles.last = std::max(tiles.last, ids[end - 1] >> tile_bits);
      }
    }
    return tiles;
  }
  C10_HOST_DEVICE int32_t groups_of(index_t n, index_t s) const {
    const TileSpan tiles = tiles_of(n, s);
    return tiles.last - tiles.first + 1;
  }
  // Destination (n, s)'s records whose ids are in [first_id, end_id), in
  // the canonical order. The searches run in a loop, and their results go
  // to the ways' ranges by selects, which keeps the ranges in registers.
  C10_HOST_DEVICE auto
  records_in(index_t n, index_t s, uint32_t first_id, uint32_t end_id) const {
    SegmentBounds ranges[kWays] = {};
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < kWays; ++w) {
      const SegmentBounds range = way_range(n, s, w, first_id, end_id);
      GRID_SAMPLER_DET_UNROLL
      for (int k = 0; k < kWays; ++k) {
        ranges[k] = k == w ? range : ranges[k];
      }
    }
    return fold.segments.records_in(ranges);
  }

  // Hot destination h, if slot h / kWays's hot key owns it through way
  // h % kWays; and the number of its first group.
  struct HotDestination {
    bool valid;
    index_t n;
    index_t s;
    int32_t first_group;
  };
  C10_HOST_DEVICE HotDestination hot_destination(int32_t h) const {
    HotDestination hot{false, 0, 0, 0};
    const int32_t slot = h / kWays;
    const int way = h - slot * kWays;
    int64_t key;
    if (!hot_key_of(slot, key) || !owned_destination(key, way, hot.n, hot.s)) {
      return hot;
    }
    hot.valid = true;
    hot.first_group = slot == 0 ? 0 : slot_ends[slot - 1];
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < way; ++w) {
      index_t n;
      index_t s;
      if (owned_destination(key, w, n, s)) {
        hot.first_group += groups_of(n, s);
      }
    }
    return hot;
  }

  // kMarkSegments: sorted record i.
  C10_HOST_DEVICE void mark_segments(int32_t i) const {
    const int64_t key = marks.keys[i];
    const bool first = i == 0 || marks.keys[i - 1] != key;
    const bool last = i == marks.count - 1 || marks.keys[i + 1] != key;
    if (key == marks.nowhere || !(first || last)) {
      return;
    }
    const bool hot = first
        ? is_hot(key, i)
        : i >= key_limit && marks.keys[i - key_limit] == key;
    if (!hot) {
      marks(i);
      return;
    }
    if (!last) {
      return;
    }
    marks.segments[key] = SegmentBounds{i + 1, i + 1};
    int32_t groups = 0;
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < kWays; ++w) {
      index_t n;
      index_t s;
      if (owned_destination(key, w, n, s)) {
        groups += groups_of(n, s);
      }
    }
    slot_groups[key_begin(key) / (key_limit + 1)] = groups;
  }

  C10_HOST_DEVICE T* partials_of(index_t channel, int32_t group) const {
    return partials +
        (int64_t{channel} * pool_groups + group) * int64_t{partials_per_group};
  }
  C10_HOST_DEVICE T& running_sum(index_t channel, int32_t h) const {
    return running_sums[int64_t{channel} * max_hot_destinations() + h];
  }

  // The hot destination and tile of group g (< total_groups()).
  C10_HOST_DEVICE void
  group_tile(int32_t g, index_t& n, index_t& s, int32_t& tile) const {
    int32_t low = 0;
    int32_t high = num_slots - 1;
    while (low < high) {
      const int32_t middle = low + (high - low) / 2;
      if (slot_ends[middle] > g) {
        high = middle;
      } else {
        low = middle + 1;
      }
    }
    int32_t first = low == 0 ? 0 : slot_ends[low - 1];
    int64_t key;
    hot_key_of(low, key);
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < kWays; ++w) {
      if (owned_destination(key, w, n, s)) {
        const TileSpan tiles = tiles_of(n, s);
        const int32_t groups = tiles.last - tiles.first + 1;
        if (g < first + groups) {
          tile = tiles.first + (g - first);
          return;
        }
        first += groups;
      }
    }
  }

  // kStorePartials: group i's partials for channel c, and hot destination
  // i's running sum.
  C10_HOST_DEVICE void store_partials(const Row& row, int32_t i) const {
    if (i < std::min(total_groups(), pool_groups)) {
      index_t n;
      index_t s;
      int32_t tile;
      group_tile(i, n, s, tile);
      auto in_tile = records_in(
          n,
          s,
          static_cast<uint32_t>(tile) << tile_bits,
          static_cast<uint32_t>(tile + 1) << tile_bits);
      T* partial = partials_of(row.channel, i);
      int32_t stored = 0;
      while (!in_tile.done()) {
        partial[stored++] = next_partial(
            in_tile,
            fold.records.weights,
            fold.records.gout_offsets,
            row.gout_channel,
            fold.records.tap_bits);
      }
      if (row.channel == 0) {
        partial_counts[i] = stored;
      }
    }
    if (i < max_hot_destinations()) {
      const HotDestination hot = hot_destination(i);
      const index_t element_row = hot.n * fold.channels + row.channel;
      if (hot.valid && fold.out.block.holds(element_row, hot.s)) {
        running_sum(row.channel, i) =
            fold.initial_sum(hot.n, element_row, hot.s);
      }
    }
  }

  // kAddPartials: hot destination h's element of channel c.
  C10_HOST_DEVICE void add_partials(const Row& row, int32_t h) const {
    const HotDestination hot = hot_destination(h);
    const index_t element_row = hot.n * fold.channels + row.channel;
    if (!hot.valid || !fold.out.block.holds(element_row, hot.s)) {
      return;
    }
    const int32_t groups = groups_of(hot.n, hot.s);
    T sum = running_sum(row.channel, h);
    if (hot.first_group + groups <= pool_groups) {
      for (int32_t g = hot.first_group; g < hot.first_group + groups; ++g) {
        const T* partial = partials_of(row.channel, g);
        for (int32_t k = 0; k < partial_counts[g]; ++k) {
          sum = add_rn(sum, partial[k]);
        }
      }
    } else {
      // Its groups did not all fit: its records, serially.
      sum = fold.records.fold(
          records_in(hot.n, hot.s, 0, kEveryId),
          row.gout_channel,
          sum);
    }
    fold.out.write(element_row, hot.s, sum);
  }
};

// Destinations fastest: thread (row first_row + r, column first_col + s'),
// so a warp's lanes take consecutive destinations of one channel: their
// segment bounds load coalesced, their writes are contiguous, and
// neighbouring destinations' sorted records lie side by side.
template <typename Fold>
struct ReduceDense {
  using index_t = typename Fold::index_type;
  Fold fold;
  index_t first_row;
  index_t first_col;

  struct Row {
    index_t n;
    index_t row;
    const typename Fold::scalar_type* gout_channel;
  };

  C10_HOST_DEVICE Row row(index_t r) const {
    const index_t row = first_row + r;
    const index_t n = row / fold.channels;
    const index_t c = row - n * fold.channels;
    return Row{n, row, fold.records.gout_channel(c)};
  }

  C10_HOST_DEVICE void operator()(const Row& row, index_t s) const {
    fold.fold_into(row.n, row.row, first_col + s, row.gout_channel);
  }
};

// Channels fastest: thread i takes pair p = first_pair + i, destination
// p / channels and channel p % channels, so a warp's lanes fold the same
// records (the merge and the loads of ids, weights and offsets are the same
// for all of them) and read grad_output at consecutive channels of one
// point: contiguous when its channel stride is 1, which GatherChannelsLast
// provides when grad_output's own is not. Sweeps whole images, so it runs
// only where the block is all of grad_input. A 1-D launch: as a row per
// image (n without a division), sm_90 code recomputed values in the fold's
// record loop that it could no longer keep in registers (57 instructions
// per record instead of 46).
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
        by_channels(divider<index_t>(fold.channels)),
        by_image_size(divider<index_t>(fold.destinations_per_image)) {}

  C10_HOST_DEVICE void operator()(index_t i) const {
    const index_t destination = divide(first_pair + i, by_channels);
    const index_t c = first_pair + i - destination * fold.channels;
    const index_t n = divide(destination, by_image_size);
    const index_t s = destination - n * fold.destinations_per_image;
    fold.fold_into(
        n, n * fold.channels + c, s, fold.records.gout_channel(c));
  }
};

// A chunk's grad_output, channels last: row p (a point of the chunk) holds
// its channels contiguously, and gathered_offsets[p] = p * channels is where.
// scalar_t is what an element is copied as (CopiedAs), which changes none
// of its bits.
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

// What GatherChannelsLast copies an element of scalar_t as: Half and
// BFloat16 as the uint16_t that is each one's only member, so that one
// kernel per index width copies both; other types as themselves.
template <typename scalar_t>
using CopiedAs =
    std::conditional_t<sizeof(scalar_t) == sizeof(uint16_t), uint16_t, scalar_t>;
static_assert(
    std::is_standard_layout_v<c10::Half> && sizeof(c10::Half) == 2 &&
        std::is_standard_layout_v<c10::BFloat16> && sizeof(c10::BFloat16) == 2,
    "Half and BFloat16 must be one uint16_t each to be copied as one");

// Sparse reduction, step 3: one thread per (channel row c, run j): lanes take
// consecutive runs of one channel, whose sorted records are contiguous. The
// sums were zero-filled; runs of taps that land nowhere, or outside the
// block, are skipped.
template <typename scalar_t, typename index_t>
struct ReduceSparse {
  using T = at::opmath_type<scalar_t>;
  SortedRecords<scalar_t, index_t> records;
  ChunkKeys keys;
  const int32_t* run_begin;
  const int32_t* num_runs;
  int64_t nowhere;
  ReduceOutput<scalar_t, index_t> out;
  index_t channels;
  Divider<index_t> by_image_size;

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
    const int64_t destination = keys[begin];
    if (destination == nowhere) {
      return;
    }
    const index_t d = static_cast<index_t>(destination);
    const index_t n = divide(d, by_image_size);
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
            SortedRecordIds{records.ids, begin, run_begin[j + 1]},
            row.gout_channel,
            initial));
  }
};

// Rounds a block's finished float sums into grad_input, one thread per
// (row, column) of the block.
template <typename scalar_t, typename index_t>
struct RoundCarry {
  const at::opmath_type<scalar_t>* carry;
  scalar_t* grad_input;
  ElementBlock<index_t> block;
  BlockOffsets<index_t> offset;
  index_t destinations_per_image;

  RoundCarry(
      const at::opmath_type<scalar_t>* carry,
      scalar_t* grad_input,
      const ElementBlock<index_t>& block,
      index_t destinations_per_image)
      : carry(carry),
        grad_input(grad_input),
        block(block),
        offset(block),
        destinations_per_image(destinations_per_image) {}

  C10_HOST_DEVICE index_t row(index_t r) const {
    return block.row_begin + r;
  }

  C10_HOST_DEVICE void operator()(index_t row, index_t col) const {
    const index_t s = block.col_begin + col;
    grad_input[row * destinations_per_image + s] =
        static_cast<scalar_t>(carry[offset(row, s)]);
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
  // Half/BFloat16 over several chunks: the float carry's size in elements
  // (see plan_carry); 0 where sums need no carry.
  int64_t carry_elements = 0;
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
    int64_t dense_bytes_per_point,
    int64_t workspace_bytes = kWorkspaceBytes) {
  auto dense_with = [&](int64_t chunk_points) {
    return dense_table_fits(
        table_entries, num_points, chunk_points, taps_per_point);
  };
  auto tiles_within = [&](int64_t bytes, int64_t per_point) {
    return std::max<int64_t>(bytes, 0) / (per_point * kTilePoints);
  };
  // Less the fixed bytes of a chunk: the extra record id and the run count.
  const int64_t budget =
      workspace_bytes - kSortScratchSlack - 2 * int64_t{sizeof(int32_t)};
  const int64_t table_bytes =
      table_entries * 2 * int64_t{sizeof(int32_t)} + kHotSlotBytes;
  const int64_t dense_tiles = tiles_within(
      budget - table_bytes, bytes_per_point + dense_bytes_per_point);
  if (dense_tiles > 0 && dense_with(dense_tiles * kTilePoints)) {
    return {dense_tiles * kTilePoints, true};
  }
  return {
      std::max<int64_t>(tiles_within(budget, bytes_per_point), 1) * kTilePoints,
      false};
}

// Threads per block and a cap on blocks per launch of the CUDA executor's
// grid-stride loops.
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
  // Dense chunks fold hot destinations' tiles in parallel (HotFold) where
  // the tables fit; off, every destination folds serially, with the same
  // bits.
  bool hot_fold = true;
  LaunchShape launch;
};

// Whether the sampler with taps_per_axis taps per axis in dims spatial
// dimensions is built with 32-bit index math as well as 64-bit. All are but
// 3-D bicubic (tricubic): its point pass, 64 taps per point, is several
// times the size of any other, and it is built once per dtype, with the
// 64-bit index math that addresses a problem of any size, which keeps the
// CUDA unit within its machine-code budget. Its calls also fold hot
// destinations serially (HotFold runs with 32-bit indices only), with the
// same bits.
constexpr bool has_32bit_index_math(int taps_per_axis, int dims) {
  return !(taps_per_axis == 4 && dims == 3);
}

// table_entries itself is a key: it marks records that land nowhere.
inline bool keys_fit_32bit(int64_t table_entries) {
  return table_entries < std::numeric_limits<int32_t>::max();
}

// The blocks of grad_input's elements that a float carry of
// carry_elements holds one at a time: runs of whole rows (n, c) where a row
// fits it, else runs of one row's columns. All of grad_input, one block,
// where there is no carry.
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
    rows_per_block = std::max<int64_t>(1, capacity / std::max<index_t>(cols, 1));
    cols_per_block = std::max<int64_t>(1, std::min<int64_t>(cols, capacity));
  }
  int64_t blocks_per_row() const {
    return (cols + cols_per_block - 1) / cols_per_block;
  }
  // At least one, so that an empty grad_input still gets its point passes
  // (which make grad_grid) from the one empty block.
  int64_t count() const {
    return std::max<int64_t>(
        1, ((rows + rows_per_block - 1) / rows_per_block) * blocks_per_row());
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

// The grad_input half of the backward for contiguous grad_input (see the .cu
// file's pipeline): per block of grad_input (one, but for a float carry
// smaller than grad_input), per chunk of the points whose images the block
// holds: point pass, stable sort, reduce into the block. Records are keyed
// as plan.keying says (PerCell needs bilinear or trilinear sampling and a
// dense reduction), with keys as wide as plan.key_32bit says.
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
  constexpr int kTapsPerPoint = ipow(kTaps, kDims);
  constexpr bool kReducedPrecision = !std::is_same_v<scalar_t, T>;
  const ChunkPlan& chunking = plan.chunks;
  const bool per_cell = plan.keying == Keying::PerCell;
  TORCH_INTERNAL_ASSERT(!per_cell || (kTaps == 2 && chunking.dense));

  const int64_t chunk_points = chunking.chunk_points;
  const bool dense = chunking.dense;
  const int64_t num_points = args.num_points();
  const index_t channels = args.channels;
  const index_t image_size = args.destinations_per_image();
  const index_t numel = args.batch * channels * image_size;
  if (num_points == 0) {
    // Nothing lands anywhere; below, every chunk has points.
    ex.zero(grad_input, numel * sizeof(scalar_t));
    return;
  }
  const int64_t items_per_point = per_cell ? 1 : kTapsPerPoint;
  const int64_t key_bytes = plan.key_32bit ? 4 : 8;
  const int64_t points_per_chunk = std::min(num_points, chunk_points);
  const int64_t capacity = points_per_chunk * items_per_point;
  // The keys are 0 .. table_entries - 1; table_entries itself is "nowhere".
  const int64_t table_entries =
      per_cell ? args.num_cells() : static_cast<int64_t>(args.num_destinations());
  // The numbering limits of kMaxChunkRecords, which plan_chunks keeps.
  TORCH_INTERNAL_ASSERT(
      chunk_points % kTilePoints == 0 &&
      chunk_points * kTapsPerPoint <= kMaxChunkRecords &&
      (!dense || table_entries <= chunk_points * kTapsPerPoint));
  // 32-bit keys that cannot hold the key space would collide.
  TORCH_INTERNAL_ASSERT(!plan.key_32bit || keys_fit_32bit(table_entries));
  // A float carry holds the sums of Half/BFloat16 elements whose records
  // span chunks; with one chunk every sum is rounded as it is made.
  const bool float_carry = chunking.carry_elements > 0;
  TORCH_INTERNAL_ASSERT(
      float_carry ==
      (kReducedPrecision && chunk_points < num_points && numel > 0));
  const CarryBlocks<index_t> blocks(
      args.batch * channels, image_size, chunking.carry_elements);
  // Threads that take channels fastest sweep whole images.
  TORCH_INTERNAL_ASSERT(!chunking.channels_fastest || blocks.count() == 1);

  // After the sort the unsorted keys and ids are dead until the next chunk's
  // point pass, so the sparse reduce keeps its int32 bookkeeping there
  // (heads, run numbers, run starts).
  const auto keys = ex.allocate(capacity * key_bytes);
  const auto sorted_keys = ex.allocate(capacity * key_bytes);
  const auto ids = ex.allocate((capacity + 1) * sizeof(int32_t));
  const auto sorted_ids = ex.allocate(capacity * sizeof(int32_t));
  const auto weights = ex.allocate(points_per_chunk * kTapsPerPoint * sizeof(T));
  const auto gout_offsets = ex.allocate(points_per_chunk * sizeof(index_t));
  // Dense chunks whose keys may be hot fold those in parallel (HotFold),
  // with 32-bit indices only, which keeps the unit within its machine-code
  // budget: larger calls fold serially, with the same bits. Beside the
  // segment table, the groups of each slot of a hot key.
  const int32_t hot_key_limit =
      kHotRecords / (per_cell ? int32_t{1} << kDims : 1);
  const int64_t hot_ways = per_cell ? int64_t{1} << kDims : 1;
  const bool hot_capable = plan.hot_fold && dense && numel > 0 &&
      std::is_same_v<index_t, int32_t> && capacity > hot_key_limit;
  const int64_t hot_slots =
      hot_capable ? capacity / (hot_key_limit + 1) + 1 : 0;
  // Dense: the segment table, one fill per chunk.
  const int64_t table_bytes = table_entries * sizeof(SegmentBounds) +
      hot_slots * static_cast<int64_t>(sizeof(int32_t));
  const auto segments = ex.allocate(dense ? table_bytes : 0);
  const auto num_runs = ex.allocate(dense ? 0 : sizeof(int32_t));
  const bool copy = chunking.copy_grad_output;
  const auto gathered =
      ex.allocate(copy ? points_per_chunk * channels * sizeof(scalar_t) : 0);
  const auto gathered_offsets =
      ex.allocate(copy ? points_per_chunk * sizeof(index_t) : 0);
  const auto carry_storage =
      ex.allocate(float_carry ? chunking.carry_elements * sizeof(T) : 0);
  // Where sums live between chunks: grad_input itself when it holds opmath
  // values, else the carry (none with a single chunk).
  T* const sums = kReducedPrecision ? static_cast<T*>(carry_storage.get())
                                    : reinterpret_cast<T*>(grad_input);

  const ChunkRecords<T, index_t> chunk{
      ChunkKeys{keys.get(), !plan.key_32bit},
      plan.keying,
      as<int32_t>(ids),
      as<T>(weights),
      as<index_t>(gout_offsets)};
  const ChunkKeys sorted_chunk_keys{sorted_keys.get(), !plan.key_32bit};
  constexpr int kTapBits = log2_taps_per_point(kTaps, kDims);
  const SortedRecords<scalar_t, index_t> sorted = copy
      ? SortedRecords<scalar_t, index_t>{
            as<int32_t>(sorted_ids),
            as<T>(weights),
            as<index_t>(gathered_offsets),
            as<scalar_t>(gathered),
            1,
            kTapBits}
      : SortedRecords<scalar_t, index_t>{
            as<int32_t>(sorted_ids),
            as<T>(weights),
            as<index_t>(gout_offsets),
            args.grad_output.data,
            args.grad_output.stride_c,
            kTapBits};
  SegmentBounds* const segment_table = as<SegmentBounds>(segments);
  int32_t* const bookkeeping_a = as<int32_t>(ids);
  int32_t* const bookkeeping_b = static_cast<int32_t*>(keys.get());
  const int end_bit = bits_for(table_entries);
  const int64_t points_per_image = args.points_per_image();
  const int64_t num_chunks = (num_points + chunk_points - 1) / chunk_points;

  // The hot fold's groups of stored partials for a chunk of `count` points:
  // as many as fit the chunk's unsorted keys and ids beside its slots' group
  // ends and running sums; 0 where no key can be hot (it runs not at all).
  const int64_t partials_per_group = kTilePoints / kRecordsPerPartial *
      // A bicubic point's taps may pad onto one pixel, all of them.
      (kTaps == 4 ? kTapsPerPoint : 1);
  auto hot_slots_of = [&](int64_t count) {
    return (count * items_per_point + hot_key_limit) / (hot_key_limit + 1);
  };
  auto hot_pool_groups = [&](int64_t count) -> int64_t {
    if (!hot_capable || count * items_per_point <= hot_key_limit) {
      return 0;
    }
    const int64_t slots = hot_slots_of(count);
    const int64_t sums_bytes =
        channels * slots * hot_ways * static_cast<int64_t>(sizeof(T));
    const int64_t group_bytes =
        channels * partials_per_group * static_cast<int64_t>(sizeof(T));
    return std::max<int64_t>(
        0,
        std::min<int64_t>(
            {(capacity * key_bytes - sums_bytes) / group_bytes,
             capacity + 1 - slots,
             std::numeric_limits<int32_t>::max() /
                 (channels * partials_per_group)}));
  };
  auto marks_of = [&](int32_t num_items) {
    return MarkDestinationSegments{
        sorted_chunk_keys, num_items, table_entries, segment_table};
  };
  auto run_hot_step = [&](auto hot, HotStep step, int64_t rows, int64_t cols) {
    hot.step = step;
    ex.for_each_row(static_cast<int32_t>(rows), static_cast<int32_t>(cols), hot);
  };

  // One chunk's records, sorted, with the bookkeeping its reduce reads:
  // segment bounds (dense) or runs of one destination (sparse).
  auto point_pass_and_sort = [&](const Args& point_args, int64_t first_point,
                                 int64_t count) {
    const int32_t num_items = static_cast<int32_t>(count * items_per_point);
    ex.begin_chunk();
    ex.for_each(
        static_cast<index_t>(count),
        PointPass<kTaps, Args>{
            point_args, chunk, static_cast<index_t>(first_point)});
    if (plan.key_32bit) {
      ex.stable_sort_pairs(
          as<int32_t>(keys), as<int32_t>(sorted_keys), as<int32_t>(ids),
          as<int32_t>(sorted_ids), num_items, end_bit);
    } else {
      ex.stable_sort_pairs(
          as<int64_t>(keys), as<int64_t>(sorted_keys), as<int32_t>(ids),
          as<int32_t>(sorted_ids), num_items, end_bit);
    }
    if (copy) {
      using element_t = CopiedAs<scalar_t>;
      ex.for_each_row(
          static_cast<index_t>(count),
          channels,
          GatherChannelsLast<element_t, index_t>{
              reinterpret_cast<const element_t*>(args.grad_output.data),
              as<index_t>(gout_offsets),
              args.grad_output.stride_c,
              channels,
              as<element_t>(gathered),
              as<index_t>(gathered_offsets)});
    }
    if (dense) {
      // Where the hot fold runs, its first step marks the segments.
      ex.zero(segment_table, table_bytes);
      if (hot_pool_groups(count) == 0) {
        ex.for_each(num_items, marks_of(num_items));
      }
      return;
    }
    ex.for_each(num_items, MarkRunHeads{sorted_chunk_keys, bookkeeping_a});
    ex.inclusive_sum(bookkeeping_a, bookkeeping_b, num_items);
    ex.for_each(
        num_items,
        RecordRunStarts{
            sorted_chunk_keys,
            bookkeeping_b,
            num_items,
            bookkeeping_a,
            as<int32_t>(num_runs)});
  };

  // The dense reduce of rows [row_from, row_to) of `out`'s block, after a
  // chunk of `count` points.
  auto reduce_dense = [&](const ReduceOutput<scalar_t, index_t>& out,
                          int64_t row_from,
                          int64_t row_to,
                          int64_t first_fresh_image,
                          int64_t count) {
    auto sweep = [&](const auto& segments_of) {
      using Fold = DenseFold<std::decay_t<decltype(segments_of)>, scalar_t, index_t>;
      const Fold fold{
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
        if (chunking.channels_fastest) {
          ex.for_each(
              static_cast<index_t>((row_to - row_from) * image_size),
              ReduceDenseChannelsFastest<Fold>(
                  fold, static_cast<index_t>(row_from / channels)));
        } else {
          ex.for_each_row(
              static_cast<index_t>(row_to - row_from),
              out.block.width(),
              ReduceDense<Fold>{
                  fold, static_cast<index_t>(row_from), out.block.col_begin});
        }
      };
      if constexpr (std::is_same_v<index_t, int32_t>) {
        const int64_t pool_groups = hot_pool_groups(count);
        if (pool_groups > 0) {
          using Segments = std::decay_t<decltype(segments_of)>;
          const int32_t num_items =
              static_cast<int32_t>(count * items_per_point);
          const int64_t slots = hot_slots_of(count);
          const int64_t hot_destinations = slots * hot_ways;
          T* const sums = static_cast<T*>(keys.get());
          const HotFold<Fold> hot{
              fold,
              marks_of(num_items),
              HotStep::kMarkSegments,
              Segments::tile_bits(kTapBits),
              hot_key_limit,
              static_cast<int32_t>(slots),
              reinterpret_cast<int32_t*>(segment_table + table_entries),
              bookkeeping_a,
              static_cast<int32_t>(pool_groups),
              static_cast<int32_t>(partials_per_group),
              sums + channels * hot_destinations,
              bookkeeping_a + slots,
              sums};
          run_hot_step(hot, HotStep::kMarkSegments, 1, num_items);
          ex.inclusive_sum(
              hot.slot_groups, hot.slot_ends, static_cast<int32_t>(slots));
          run_hot_step(
              hot,
              HotStep::kStorePartials,
              channels,
              std::max(pool_groups, hot_destinations));
          reduce();
          run_hot_step(hot, HotStep::kAddPartials, channels, hot_destinations);
          return;
        }
      }
      reduce();
    };
    if constexpr (kTaps == 2) {
      if (per_cell) {
        sweep(make_cell_segments(sorted.ids, segment_table, args.inp_size));
        return;
      }
    }
    sweep(DestinationSegments<index_t>{sorted.ids, segment_table, image_size});
  };

  // Each block of grad_input takes the chunks of the points of its images;
  // where a chunk serves two blocks, the first one computes its points'
  // grid gradient and the second re-runs its point pass for the records.
  Args records_only = args;
  records_only.grad_grid.data = nullptr;
  int64_t chunks_with_grid_gradient = 0;
  for (int64_t b = 0; b < blocks.count(); ++b) {
    const ElementBlock<index_t> block = blocks.block(b);
    // The images whose rows the block holds; all of them where grad_input
    // has no elements, whose one block holds no rows.
    const bool empty = block.numel() == 0;
    const int64_t first_block_image = empty ? 0 : block.row_begin / channels;
    const int64_t end_block_image =
        empty ? args.batch : (block.row_end - 1) / channels + 1;
    const int64_t first_chunk =
        first_block_image * points_per_image / chunk_points;
    const int64_t end_chunk =
        (end_block_image * points_per_image - 1) / chunk_points + 1;
    if (!dense) {
      // Sparse: every element starts at zero; chunks then touch only the
      // destinations they have records for.
      ex.zero(
          float_carry ? static_cast<void*>(sums) : static_cast<void*>(grad_input),
          float_carry ? block.numel() * sizeof(T) : numel * sizeof(scalar_t));
    }
    // Images from first_fresh_image on hold no running sums yet.
    int64_t first_fresh_image = first_block_image;
    for (int64_t k = first_chunk; k < end_chunk; ++k) {
      const int64_t first_point = k * chunk_points;
      const int64_t count = std::min(chunk_points, num_points - first_point);
      const bool last = k == end_chunk - 1;
      point_pass_and_sort(
          k < chunks_with_grid_gradient ? records_only : args, first_point, count);
      chunks_with_grid_gradient = std::max(chunks_with_grid_gradient, k + 1);
      // Sums are read where earlier chunks left them, and written there but
      // by a float carry's last dense chunk, which rounds the whole block
      // into grad_input.
      const bool round_now = float_carry && dense && last;
      const ReduceOutput<scalar_t, index_t> out(
          grad_input,
          kReducedPrecision && !float_carry ? nullptr : sums,
          kReducedPrecision && (!float_carry || round_now) ? nullptr : sums,
          block,
          image_size);
      if (dense) {
        // Points are numbered image by image, so this chunk's records land
        // in images [first_image, end_image) only: a dense reduce sweeps
        // their rows of the block, or all of the block's rows up to them
        // when it rounds the block.
        const int64_t first_image = first_point / points_per_image;
        const int64_t end_image = (first_point + count - 1) / points_per_image + 1;
        reduce_dense(
            out,
            round_now ? int64_t{block.row_begin}
                      : std::max<int64_t>(first_image * channels, block.row_begin),
            std::min<int64_t>(end_image * channels, block.row_end),
            first_fresh_image,
            count);
        first_fresh_image = end_image;
      } else {
        ex.for_each_row(
            channels,
            static_cast<int32_t>(count * items_per_point),
            ReduceSparse<scalar_t, index_t>{
                sorted,
                sorted_chunk_keys,
                bookkeeping_a,
                as<int32_t>(num_runs),
                table_entries,
                out,
                channels,
                divider<index_t>(image_size)});
      }
    }
    if constexpr (kReducedPrecision) {
      if (float_carry && !dense) {
        // With 64-bit index math whatever the call's: one pass over the
        // block's memory, built once per dtype.
        const ElementBlock<int64_t> wide_block{
            block.row_begin, block.row_end, block.col_begin, block.col_end};
        ex.for_each_row(
            static_cast<int64_t>(block.row_end - block.row_begin),
            static_cast<int64_t>(block.width()),
            RoundCarry<scalar_t, int64_t>{
                sums, grad_input, wide_block, static_cast<int64_t>(image_size)});
      }
    }
  }
  TORCH_INTERNAL_ASSERT(chunks_with_grid_gradient == num_chunks);
}

// What the planner reads of a backward call: shapes, strides and element
// sizes, never data.
struct BackwardProblem {
  int64_t dims; // spatial: 2 for a 4-D input, 3 for a 5-D one
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
      dims,
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

// Chunks sized to `workspace_bytes` for records keyed by `keying`, with
// keys and index math of the given widths.
inline ChunkPlan plan_reduction_within(
    const BackwardProblem& problem,
    Keying keying,
    bool key_32bit,
    bool index_32bit,
    bool channels_fastest,
    int64_t workspace_bytes) {
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
        copy ? problem.channels * problem.scalar_bytes + index_bytes : 0,
        workspace_bytes);
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

// The most a float carry takes of the workspace.
constexpr int64_t kCarryBytes = kWorkspaceBytes / 2;

// The float carry of Half/BFloat16 sums over several chunks: all of
// grad_input where it fits kCarryBytes, else blocks of it
// (reduce_grad_input repeats the chunks of a block's images for each), whose
// rows the threads then take destinations fastest.
inline ChunkPlan with_carry(ChunkPlan chunks, const BackwardProblem& problem) {
  const int64_t numel = problem.num_destinations * problem.channels;
  const bool needed = problem.scalar_bytes < problem.opmath_bytes &&
      chunks.chunk_points < problem.num_points && numel > 0;
  chunks.carry_elements =
      needed ? std::min(numel, kCarryBytes / problem.opmath_bytes) : 0;
  if (needed && chunks.carry_elements < numel) {
    chunks.channels_fastest = false;
    chunks.copy_grad_output = false;
  }
  return chunks;
}

// Chunks sized to the workspace, a float carry included.
inline ChunkPlan plan_reduction(
    const BackwardProblem& problem,
    Keying keying,
    bool key_32bit,
    bool index_32bit,
    bool channels_fastest) {
  auto within = [&](int64_t workspace_bytes, bool channels_fastest) {
    return with_carry(
        plan_reduction_within(
            problem,
            keying,
            key_32bit,
            index_32bit,
            channels_fastest,
            workspace_bytes),
        problem);
  };
  const ChunkPlan chunks = within(kWorkspaceBytes, channels_fastest);
  if (chunks.carry_elements == 0) {
    return chunks;
  }
  // Several chunks of Half/BFloat16: the carry takes its share first, and
  // where it holds grad_input in blocks, the threads take destinations
  // fastest (so the chunks need no channels-last copy).
  const bool blocked =
      chunks.carry_elements < problem.num_destinations * problem.channels;
  return within(
      kWorkspaceBytes - chunks.carry_elements * problem.opmath_bytes,
      channels_fastest && !blocked);
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

// Whether 32-bit index math may run the problem: where it fits, and the
// sampler is built with it (has_32bit_index_math).
inline bool index_32bit_for(const BackwardProblem& problem) {
  return problem.index_fits_32bit &&
      has_32bit_index_math(
          static_cast<int>(problem.taps_per_axis), static_cast<int>(problem.dims));
}

// The default plan: 32-bit keys and index math wherever they fit (index
// math where the sampler is built with it, too), one sort item per point
// wherever bilinear or trilinear sampling reduces densely (one per tap
// otherwise), chunks as large as the workspace allows.
inline BackwardPlan plan_backward(const BackwardProblem& problem) {
  const bool index_32bit = index_32bit_for(problem);
  if (problem.taps_per_axis == 2) {
    BackwardPlan plan = plan_keyed(problem, Keying::PerCell, index_32bit);
    if (plan.chunks.dense) {
      return plan;
    }
  }
  return plan_keyed(problem, Keying::PerTap, index_32bit);
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

// For checked arguments with grad_input requested: calls
// fn(args, grad_input) with the call's BackwardArgs and grad_input's data,
// after zeroing a defined grad_grid that was not requested.
template <typename Executor, typename Fn>
void with_backward_args(
    const Executor& ex,
    const GridSamplerBackwardCall& call,
    const BackwardPlan& plan,
    const Fn& fn) {
  // A call for grad_grid alone has one writer per element and no alert: it
  // runs the stock kernel.
  TORCH_INTERNAL_ASSERT(call.output_mask[0]);
  // 32-bit index math over larger tensors would address out of bounds.
  TORCH_INTERNAL_ASSERT(!plan.index_32bit || fits_32bit_indexing(call));
  dispatch_backward_types(
      call, plan.index_32bit, [&](auto scalar, auto index, auto dims) {
        using scalar_t = decltype(scalar);
        using index_t = decltype(index);
        constexpr int kDims = decltype(dims)::value;
        using Args = BackwardArgs<scalar_t, index_t, kDims>;
        const TensorBase& grad_grid = call.grad_grid;
        if (!call.output_mask[1] && grad_grid.defined() && grad_grid.numel() > 0) {
          // Not asked for, so not computed (upstream #64977); a grid gradient
          // the caller allocated anyway is zeroed rather than left
          // uninitialized.
          TORCH_CHECK(
              grad_grid.is_contiguous(),
              Args::op_name(),
              " (deterministic): expected a contiguous grad_grid");
          ex.zero(grad_grid.data_ptr(), grad_grid.nbytes());
        }
        TORCH_CHECK(
            call.grad_input.is_contiguous(),
            Args::op_name(),
            " (deterministic): expected a contiguous grad_input");
        fn(make_backward_args<scalar_t, index_t, kDims>(
               call.grad_grid,
               call.grad_output,
               call.input,
               call.grid,
               call.interpolation_mode,
               call.padding_mode,
               call.align_corners,
               call.output_mask[1]),
           call.grad_input.data_ptr<scalar_t>());
      });
}

// The deterministic backward of grid_sampler_2d (4-D input) or
// grid_sampler_3d (5-D input) on `ex`, for checked arguments with grad_input
// requested, as `plan` says: writes every element of a contiguous
// grad_input, grad_grid when output_mask[1], and zeroes a defined grad_grid
// otherwise. Every interpolation mode of either rank, 3-D bicubic
// (tricubic, which grid_sampler_3d has from torch 2.15) included, with
// 64-bit index math only there (has_32bit_index_math). The CUDA launcher
// and the host executors run this one function.
template <typename Executor>
void run_deterministic_backward(
    const Executor& ex,
    const GridSamplerBackwardCall& call,
    const BackwardPlan& plan) {
  const auto mode =
      static_cast<GridSamplerInterpolation>(call.interpolation_mode);
  const int dims = static_cast<int>(call.input.dim()) - 2;
  TORCH_CHECK(
      !plan.index_32bit || has_32bit_index_math(taps_per_axis(mode), dims),
      "grid_sampler_3d_backward (deterministic): 3-D bicubic sampling runs "
      "with 64-bit index math only, but the plan asks for 32-bit");
  with_backward_args(ex, call, plan, [&](const auto& args, auto* grad_input) {
    using Args = std::decay_t<decltype(args)>;
    dispatch_taps_per_axis(args.interpolation_mode, [&](auto taps) {
      constexpr int kTaps = decltype(taps)::value;
      if constexpr (
          has_32bit_index_math(kTaps, Args::dims) ||
          !std::is_same_v<typename Args::index_type, int32_t>) {
        reduce_grad_input<kTaps>(ex, args, grad_input, plan);
      }
    });
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

#undef GRID_SAMPLER_DET_UNROLL
#undef GRID_SAMPLER_DET_ROLLED
