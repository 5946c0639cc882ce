#pragma once
// Speed step of the deterministic grid_sampler backward: the dense reduce.
// Where a chunk's table of keys has no more entries than the chunk has
// records, the reduce need not find runs with a scan: a segment table
// bounds each key's sorted records, and one thread per grad_input element of
// the chunk's images folds its destination's segment (no zero fill: the
// first chunk to reach an image writes its untouched elements). The records
// and their order are the core's, so the sums are the same bits.

#include <ATen/native/cuda/GridSamplerDeterministic.cuh>

namespace at::native::grid_sampler_deterministic {

// The sorted records [begin, end) of one key of a dense reduction, side by
// side so that a destination's reduce loads both in one access.
struct alignas(8) SegmentBounds {
  int32_t begin;
  int32_t end;
};

// Dense reduction, step 1: segments[k] bounds the sorted records of key k.
// [stack: cells]
// A key is a destination (PerTap) or a cell (PerCell).
// [end stack: cells]
// The segments were zero-filled before, so an untouched key has an empty
// range. One thread per sorted record, O(records): only the first and the
// last record of each key write.
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

// [stack: hot-fold]
// A hot destination's stored partials (HotFold): units [first, first +
// count) of the pool; none where its units did not fit and HotFold folded
// its records.
struct HotUnits {
  int32_t first;
  int32_t count;
};

// What the dense reduce reads of the hot fold (HotFold, in
// GridSamplerDeterministicHotFold.cuh). HotFold marks a hot key's table
// entry {end, ~begin}: it reads as no records (its begin is not below its
// end), and its negative end tells it apart. The destination that a hot key
// beginning at sorted position b owns through way w is hot destination
// (b / (key_limit + 1)) * kWays + w, whose partials units[h] locates.
template <typename T>
struct StoredPartials {
  const T* partials = nullptr; // [channel][unit], pool_units per channel
  const int32_t* partial_counts = nullptr; // [unit]: a group's, at its first
  const HotUnits* units = nullptr; // [hot destination]
  int32_t pool_units = 0;
  int32_t key_limit = 0;

  // `sum` plus channel c's partials of `hot`, in order.
  C10_HOST_DEVICE T add(int64_t c, const HotUnits& hot, T sum) const {
    const T* partial = partials + c * pool_units;
    const int32_t end = hot.first + hot.count;
    for (int32_t u = hot.first; u < end;) {
      const int32_t count = partial_counts[u];
      for (int32_t k = 0; k < count; ++k) {
        sum += partial[u + k];
      }
      u += count > 0 ? count : 1;
    }
    return sum;
  }
};

// Whether a destination's records are a hot key's (negative end).
C10_HOST_DEVICE inline bool holds_hot_key(const SortedRecordIds& ids) {
  return ids.end < 0;
}
// [end stack: hot-fold]

// Where the dense reduce finds one destination's records, from the segment
// bounds of step 1: with a key per tap, the destination's own segment.
template <typename index_t>
struct DestinationSegments {
  // [stack: hot-fold]
  // Keys per destination: its own.
  static constexpr int kWays = 1;
  // [end stack: hot-fold]
  const int32_t* ids;
  const SegmentBounds* segments;
  index_t destinations_per_image;

  C10_HOST_DEVICE SortedRecordIds of(index_t n, index_t s) const {
    const SegmentBounds bounds = segments[n * destinations_per_image + s];
    return SortedRecordIds{ids, bounds.begin, bounds.end};
  }

  // [stack: hot-fold]
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
  // [end stack: hot-fold]
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
  StoredPartials<T> stored = {}; // [stack: hot-fold]

  C10_HOST_DEVICE T initial_sum(index_t n, index_t row, index_t s) const {
    return n < first_fresh_image ? out.running_sum(row, s) : static_cast<T>(0);
  }

  C10_HOST_DEVICE void fold_into(
      index_t n,
      index_t row,
      index_t s,
      const scalar_t* gout_channel) const {
    const auto ids = segments.of(n, s);
    const bool hot = is_hot(ids); // [stack: hot-fold]
    if (ids.done() && n < first_written_image && !hot) { // [stack: hot-fold replaces: if (ids.done() && n < first_written_image) {]
      return;
    }
    const T sum = records.fold(ids, gout_channel, initial_sum(n, row, s));
    // [stack: hot-fold]
    // The fold read a hot key as empty.
    if (hot) {
      finish_hot(hot_units(n, s), n, row, s);
      return;
    }
    // [end stack: hot-fold]
    out.write(row, s, sum);
  }

  // [stack: hot-fold]
  // Whether a destination's records `ids` hide a hot key (HotFold runs with
  // 32-bit indices only).
  template <typename RecordIds>
  C10_HOST_DEVICE bool is_hot(const RecordIds& ids) const {
    if constexpr (std::is_same_v<index_t, int32_t>) {
      return holds_hot_key(ids);
    }
    return false;
  }
  // Hot destination (n, s)'s element of row `row`: its running sum plus its
  // stored partials (`units`, hot_units(n, s)), in order; HotFold wrote it
  // where they did not fit.
  C10_HOST_DEVICE void finish_hot(
      const HotUnits& units,
      index_t n,
      index_t row,
      index_t s) const {
    if (units.count > 0) {
      const int64_t c = row - int64_t{n} * channels;
      out.write(row, s, stored.add(c, units, initial_sum(n, row, s)));
    }
  }
  // Its units: those of the hot destination its hot way of least index
  // owns it as.
  C10_HOST_DEVICE HotUnits hot_units(index_t n, index_t s) const {
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < Segments::kWays; ++w) {
      const SegmentBounds bounds =
          segments.segments[segments.key_of(n, s, w)];
      if (bounds.end < 0) {
        const int32_t slot = ~bounds.end / (stored.key_limit + 1);
        return stored.units[slot * Segments::kWays + w];
      }
    }
    return HotUnits{0, 0};
  }
  // [end stack: hot-fold]
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

// The dense reduce of rows [row_from, row_to) of the fold's block.
template <typename Executor, typename Fold>
void reduce_destinations_fastest(
    const Executor& ex,
    const Fold& fold,
    int64_t row_from,
    int64_t row_to) {
  using index_t = typename Fold::index_type;
  ex.for_each_row(
      static_cast<index_t>(row_to - row_from),
      fold.out.block.width(),
      ReduceDense<Fold>{
          fold, static_cast<index_t>(row_from), fold.out.block.col_begin});
}

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

} // namespace at::native::grid_sampler_deterministic
