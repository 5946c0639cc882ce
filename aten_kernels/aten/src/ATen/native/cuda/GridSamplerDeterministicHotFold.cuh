#pragma once
// Speed step of the deterministic grid_sampler backward: hot destinations,
// whose records would make one thread's fold long, are folded tile by tile
// in parallel, and their tiles' partials then added in order: the same
// partials and additions as the serial fold, so the same bits.

#include <ATen/native/cuda/GridSamplerDeterministicDense.cuh>
#include <ATen/native/cuda/GridSamplerDeterministicChannelGroups.cuh> // [stack: channel-groups]

namespace at::native::grid_sampler_deterministic {

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
// tile of its first record to that of its last.
//
// A group of r records forms ceil(r / kRecordsPerPartial) partials, so a hot
// destination with G groups and R records takes G + R / kRecordsPerPartial
// partial slots ("units"): group j's partials start at unit
// j + R_j / kRecordsPerPartial of its destination, R_j its records in the
// groups before j, and end before group j + 1's start. Slots are sized per
// record, not per tile: a line of pixels each hot in every tile (tensorf's
// 300 x 245 groups of about 27 records) takes 1.1 units per group, where 16
// per group (a whole tile's partials) overflowed the pool. Per dense chunk:
//   kMarkSegments   a thread per sorted record, as MarkDestinationSegments,
//                   but a hot key gets the empty bounds {end, end}, so that
//                   the reduce folds none of its records, and the thread of
//                   its last record counts the units of the destinations
//                   it owns into its slot.
//   (an inclusive sum of the slots' units numbers the units)
//   kStorePartials  a thread per (channel, unit): the first unit of a group
//                   stores the group's partials from there on, and one
//                   thread per (channel, hot destination) its running sum,
//                   which the reduce may overwrite.
//   (the dense reduce)
//   kAddPartials    a thread per (channel, hot destination) adds the stored
//                   partials to the running sum, in order, and writes the
//                   element; where its units did not fit `pool_units`, it
//                   folds the destination's records serially instead.
// A destination with no hot key folds at most kHotRecords records in the
// reduce; a hot one at most a tile's in kStorePartials and its partials in
// kAddPartials. Everything is found from the sorted keys, by binary search
// where a bound was hidden, with no atomics: the units' numbering is a
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
  int32_t* slot_units; // zero-filled with the table
  int32_t* slot_ends; // inclusive sums of slot_units
  int32_t pool_units;
  T* partials; // [channel][unit]
  int32_t* partial_counts; // [unit]: a group's partials at its first unit, else 0
  T* running_sums; // [channel][hot destination]
  // [stack: channel-groups]
  // A row of kStorePartials and kAddPartials is a group of Row::channels
  // channels from Row::channel, group_width at most: a thread's walk of a
  // tile serves all of them.
  static constexpr int kGroup = kChannelGroup<T>;
  int32_t group_width;
  // [end stack: channel-groups]

  // A row of kStorePartials and kAddPartials: a channel.
  struct Row {
    index_t channel;
    const scalar_t* gout_channel;
    int32_t channels; // [stack: channel-groups]
  };

  C10_HOST_DEVICE Row row(index_t r) const {
    return channel_group(r); // [stack: channel-groups replaces: return Row{r, fold.records.gout_channel(r)};]
  }

  C10_HOST_DEVICE void operator()(const Row& row, int32_t i) const {
    switch (step) {
      case HotStep::kMarkSegments:
        mark_segments(i);
        return;
      case HotStep::kStorePartials:
        store_group_partials(row, i); // [stack: channel-groups replaces: store_partials(row, i);]
        return;
      case HotStep::kAddPartials:
        add_group_partials(row, i); // [stack: channel-groups replaces: add_partials(row, i);]
        return;
    }
  }

  // Hot destinations are numbered slot * kWays + way, for the way of their
  // owner.
  C10_HOST_DEVICE int32_t max_hot_destinations() const {
    return num_slots * kWays;
  }
  C10_HOST_DEVICE int32_t total_units() const {
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
  // Destination (n, s)'s records whose ids are below `end_id`.
  C10_HOST_DEVICE int32_t records_below(index_t n, index_t s, uint32_t end_id)
      const {
    const int32_t* ids = fold.segments.sorted_ids();
    int32_t records = 0;
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < kWays; ++w) {
      const int64_t key = fold.segments.key_of(n, s, w);
      const int32_t begin = key_begin(key);
      records +=
          first_id_at_least(ids, begin, key_begin(key + 1), end_id) - begin;
    }
    return records;
  }
  // The unit of group j's first partial, counted from its destination's.
  C10_HOST_DEVICE int32_t
  group_unit(index_t n, index_t s, const TileSpan& tiles, int32_t j) const {
    const uint32_t end_id = static_cast<uint32_t>(tiles.first + j) << tile_bits;
    return j + records_below(n, s, end_id) / kRecordsPerPartial;
  }
  C10_HOST_DEVICE int32_t units_of(index_t n, index_t s) const {
    const TileSpan tiles = tiles_of(n, s);
    return group_unit(n, s, tiles, tiles.last - tiles.first + 1);
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
  // h % kWays; and the number of its first unit.
  struct HotDestination {
    bool valid;
    index_t n;
    index_t s;
    int32_t first_unit;
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
    hot.first_unit = slot == 0 ? 0 : slot_ends[slot - 1];
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < way; ++w) {
      index_t n;
      index_t s;
      if (owned_destination(key, w, n, s)) {
        hot.first_unit += units_of(n, s);
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
    int32_t units = 0;
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < kWays; ++w) {
      index_t n;
      index_t s;
      if (owned_destination(key, w, n, s)) {
        units += units_of(n, s);
      }
    }
    slot_units[key_begin(key) / (key_limit + 1)] = units;
  }

  C10_HOST_DEVICE T* partials_of(index_t channel, int32_t unit) const {
    return partials + int64_t{channel} * pool_units + unit;
  }
  C10_HOST_DEVICE T& running_sum(index_t channel, int32_t h) const {
    return running_sums[int64_t{channel} * max_hot_destinations() + h];
  }

  // The group whose partials start at unit u (< total_units()), if one does
  // and its destination's units all fit the pool (else kAddPartials folds
  // its records): its destination and tile.
  struct UnitGroup {
    bool stores;
    index_t n;
    index_t s;
    int32_t tile;
  };
  C10_HOST_DEVICE UnitGroup unit_group(int32_t u) const {
    int32_t low = 0;
    int32_t high = num_slots - 1;
    while (low < high) {
      const int32_t middle = low + (high - low) / 2;
      if (slot_ends[middle] > u) {
        high = middle;
      } else {
        low = middle + 1;
      }
    }
    int32_t unit = u - (low == 0 ? 0 : slot_ends[low - 1]);
    int64_t key;
    hot_key_of(low, key);
    UnitGroup group{false, 0, 0, 0};
    TileSpan tiles{0, -1};
    int32_t end_unit = u - unit;
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < kWays; ++w) {
      if (!owned_destination(key, w, group.n, group.s)) {
        continue;
      }
      tiles = tiles_of(group.n, group.s); // units_of, keeping the tiles
      const int32_t units =
          group_unit(group.n, group.s, tiles, tiles.last - tiles.first + 1);
      end_unit += units;
      if (unit < units) {
        break;
      }
      unit -= units;
    }
    // The last group j whose first unit is at most `unit`: group_unit grows
    // by at least one per group, from 0 at group 0.
    low = 0;
    high = std::min(unit, tiles.last - tiles.first);
    int32_t low_unit = 0;
    while (low < high) {
      const int32_t middle = high - (high - low) / 2;
      const int32_t middle_unit = group_unit(group.n, group.s, tiles, middle);
      if (middle_unit <= unit) {
        low = middle;
        low_unit = middle_unit;
      } else {
        high = middle - 1;
      }
    }
    group.stores = low_unit == unit && end_unit <= pool_units;
    group.tile = tiles.first + low;
    return group;
  }

  // The records of group `group`: its destination's in its tile.
  C10_HOST_DEVICE auto tile_records(const UnitGroup& group) const {
    return records_in(
        group.n,
        group.s,
        static_cast<uint32_t>(group.tile) << tile_bits,
        static_cast<uint32_t>(group.tile + 1) << tile_bits);
  }

  // kStorePartials: for channel c, the partials of the group that starts at
  // unit i, if one does, and hot destination i's running sum.
  C10_HOST_DEVICE void store_partials(const Row& row, int32_t i) const {
    if (i < std::min(total_units(), pool_units)) {
      const UnitGroup group = unit_group(i);
      const int32_t stored = group.stores ? store_tile(row, group, i) : 0;
      if (row.channel == 0) {
        partial_counts[i] = stored;
      }
    }
    store_running_sum(row.channel, i);
  }
  // Stores a group's partials from unit `unit` on; returns their number.
  C10_HOST_DEVICE int32_t
  store_tile(const Row& row, const UnitGroup& group, int32_t unit) const {
    auto in_tile = tile_records(group);
    T* partial = partials_of(row.channel, unit);
    int32_t stored = 0;
    while (!in_tile.done()) {
      partial[stored++] = next_partial(
          in_tile,
          fold.records.weights,
          fold.records.gout_offsets,
          row.gout_channel,
          fold.records.tap_bits);
    }
    return stored;
  }

  // kStorePartials: hot destination h's running sum of channel c, which the
  // reduce may overwrite.
  C10_HOST_DEVICE void store_running_sum(index_t channel, int32_t h) const {
    if (h < max_hot_destinations()) {
      const HotDestination hot = hot_destination(h);
      const index_t element_row = hot.n * fold.channels + channel;
      if (hot.valid && fold.out.block.holds(element_row, hot.s)) {
        running_sum(channel, h) = fold.initial_sum(hot.n, element_row, hot.s);
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
    const int32_t end_unit = hot.first_unit + units_of(hot.n, hot.s);
    T sum = running_sum(row.channel, h);
    if (end_unit <= pool_units) {
      for (int32_t u = hot.first_unit; u < end_unit;) {
        const int32_t count = partial_counts[u];
        const T* partial = partials_of(row.channel, u);
        for (int32_t k = 0; k < count; ++k) {
          sum = add_rn(sum, partial[k]);
        }
        u += count > 0 ? count : 1;
      }
    } else {
      // Its units did not all fit: its records, serially.
      sum = fold.records.fold(
          records_in(hot.n, hot.s, 0, kEveryId),
          row.gout_channel,
          sum);
    }
    fold.out.write(element_row, hot.s, sum);
  }

  // [stack: channel-groups]
  // Row r of kStorePartials and kAddPartials: channels [r * group_width,
  // (r + 1) * group_width), C at most.
  C10_HOST_DEVICE Row channel_group(index_t r) const {
    const index_t first = r * group_width;
    const index_t left = fold.channels - first;
    return Row{
        first,
        fold.records.gout_channel(first),
        static_cast<int32_t>(left < group_width ? left : group_width)};
  }
  // The rows of kStorePartials and kAddPartials.
  int64_t rows() const {
    return (int64_t{fold.channels} + group_width - 1) / group_width;
  }

  // kStorePartials for a row's channels: one walk of the tile of the group
  // that starts at unit i, if one does.
  C10_HOST_DEVICE void store_group_partials(const Row& row, int32_t i) const {
    if (i < std::min(total_units(), pool_units)) {
      const UnitGroup group = unit_group(i);
      const int32_t stored = group.stores ? store_group_tile(row, group, i) : 0;
      if (row.channel == 0) {
        partial_counts[i] = stored;
      }
    }
    for (int32_t k = 0; k < row.channels; ++k) {
      store_running_sum(row.channel + k, i);
    }
  }
  C10_HOST_DEVICE int32_t
  store_group_tile(const Row& row, const UnitGroup& group, int32_t unit) const {
    auto in_tile = tile_records(group);
    int32_t stored = 0;
    while (!in_tile.done()) {
      T partial[kGroup];
      next_group_partial<kGroup>(
          in_tile, fold.records, row.gout_channel, row.channels, partial);
      GRID_SAMPLER_DET_UNROLL
      for (int k = 0; k < kGroup; ++k) {
        if (k == row.channels) {
          break;
        }
        partials_of(row.channel + k, unit)[stored] = partial[k];
      }
      ++stored;
    }
    return stored;
  }

  // kAddPartials for a row's channels, one at a time (no walk of records
  // but where a destination's units did not all fit the pool).
  C10_HOST_DEVICE void add_group_partials(const Row& row, int32_t h) const {
    for (int32_t k = 0; k < row.channels; ++k) {
      const index_t c = row.channel + k;
      add_partials(Row{c, fold.records.gout_channel(c), 1}, h);
    }
  }
  // [end stack: channel-groups]
};

} // namespace at::native::grid_sampler_deterministic
