#pragma once
// Speed step of the deterministic grid_sampler backward: one sort item per
// point for bilinear and trilinear sampling (Keying::PerCell). A point's
// taps are distinct pixels, so the records of a destination are those of
// its 2^dims neighbouring cells, one tap each; merging the cells' sorted
// points in ascending point number gives the core's per-tap order exactly,
// with 4 (8) times fewer items to sort.

#include <ATen/native/cuda/GridSamplerDeterministicDense.cuh>

namespace at::native::grid_sampler_deterministic {

// PerCell: the records of destination d, merged from its kWays = 2^kDims
// neighbouring cells. Way k is the cell at d's position plus the k-th
// corner of the unit cube (row-major, x fastest); that cell's points reach d
// through tap kWays - 1 - k. Each way's sorted point numbers ascend, and a
// point lies in one cell only, so the smallest head is the next record.
// Heads live in registers: every loop over the ways unrolls. When all ways
// are exhausted front() is kExhausted, above every tile end, so a fold's
// tile test ends the partial and in_partial() need only count.
template <int kWays>
struct MergedCellRecords {
  static constexpr uint32_t kExhausted = 0xffffffffu;
  const int32_t* point_ids;
  int32_t next[kWays];
  int32_t end[kWays];
  uint32_t head[kWays]; // record id of way k's next record, or kExhausted
  uint32_t current;
  int32_t partial_left = 0;

  C10_HOST_DEVICE MergedCellRecords(
      const int32_t* sorted_point_ids,
      const SegmentBounds* segments,
      int32_t base_cell,
      const int32_t (&way_offsets)[kWays])
      : point_ids(sorted_point_ids) {
    GRID_SAMPLER_DET_UNROLL
    for (int k = 0; k < kWays; ++k) {
      const SegmentBounds bounds = segments[base_cell + way_offsets[k]];
      next[k] = bounds.begin;
      end[k] = bounds.end;
      load_head(k);
    }
    find_current();
  }
  // [stack: hot-fold]
  // The merge of the given sorted ranges of the ways' point numbers.
  C10_HOST_DEVICE MergedCellRecords(
      const int32_t* sorted_point_ids,
      const SegmentBounds (&ranges)[kWays])
      : point_ids(sorted_point_ids) {
    GRID_SAMPLER_DET_UNROLL
    for (int k = 0; k < kWays; ++k) {
      next[k] = ranges[k].begin;
      end[k] = ranges[k].end;
      load_head(k);
    }
    find_current();
  }
  // [end stack: hot-fold]
  // The record id at `position` of a way whose records reach the
  // destination through `tap`, or kExhausted at its end.
  C10_HOST_DEVICE uint32_t
  head_at(int32_t position, int32_t limit, uint32_t tap) const {
    // Reads an id either way (index 0 past the end: a chunk has at least
    // one sorted point), so that the load needs no branch.
    const bool valid = position < limit;
    const uint32_t id = static_cast<uint32_t>(point_ids[valid ? position : 0]);
    return valid ? id * kWays + tap : kExhausted;
  }
  C10_HOST_DEVICE void load_head(int k) {
    head[k] = head_at(next[k], end[k], kWays - 1 - k);
  }
  C10_HOST_DEVICE void find_current() {
    current = head[0];
    GRID_SAMPLER_DET_UNROLL
    for (int k = 1; k < kWays; ++k) {
      current = head[k] < current ? head[k] : current;
    }
  }
  C10_HOST_DEVICE bool done() const {
    return current == kExhausted;
  }
  C10_HOST_DEVICE void start_partial(int32_t records) {
    partial_left = records;
  }
  C10_HOST_DEVICE bool in_partial() const {
    return partial_left > 0;
  }
  C10_HOST_DEVICE uint32_t front() const {
    return current;
  }
  // The way that holds the current record is known from its tap (its low
  // bits), so a pop gathers that way's cursor with selects, loads one id
  // and scatters the cursor back: one load per record, not one per way.
  C10_HOST_DEVICE void pop() {
    --partial_left;
    const uint32_t tap = current & (kWays - 1);
    const int way = kWays - 1 - static_cast<int>(tap);
    int32_t position = next[0];
    int32_t limit = end[0];
    GRID_SAMPLER_DET_UNROLL
    for (int k = 1; k < kWays; ++k) {
      position = k == way ? next[k] : position;
      limit = k == way ? end[k] : limit;
    }
    ++position;
    const uint32_t way_head = head_at(position, limit, tap);
    GRID_SAMPLER_DET_UNROLL
    for (int k = 0; k < kWays; ++k) {
      next[k] = k == way ? position : next[k];
      head[k] = k == way ? way_head : head[k];
    }
    find_current();
  }
};

// [stack: hot-fold]
// Whether one of the ways is a hot key (negative end, StoredPartials): one
// sign test of the ends' bitwise or.
template <int kWays>
C10_HOST_DEVICE bool holds_hot_key(const MergedCellRecords<kWays>& ids) {
  int32_t ends = 0;
  GRID_SAMPLER_DET_UNROLL
  for (int k = 0; k < kWays; ++k) {
    ends |= ids.end[k];
  }
  return ends < 0;
}
// [end stack: hot-fold]

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

  // [stack: hot-fold]
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
  // [end stack: hot-fold]
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

} // namespace at::native::grid_sampler_deterministic
