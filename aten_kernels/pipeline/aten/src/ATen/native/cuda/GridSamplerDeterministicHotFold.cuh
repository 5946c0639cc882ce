#pragma once
// Speed step of the deterministic grid_sampler backward: hot destinations,
// whose records would make one thread's fold long, are folded tile by tile
// in parallel, and the dense reduce then adds their tiles' partials in
// order: the same partials and additions as the serial fold, so the same
// bits.

#include <ATen/native/cuda/GridSamplerDeterministicDense.cuh>
#include <ATen/native/cuda/GridSamplerDeterministicChannelsFastest.cuh>
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
// other hot key shares, and the destination it owns through way w is hot
// destination slot * kWays + w. A hot destination has a group per tile from
// the tile of its first record to that of its last.
//
// A group of r records forms ceil(r / kRecordsPerPartial) partials, so a hot
// destination with G groups and R records takes G + R / kRecordsPerPartial
// partial slots ("units"): group j's partials start at unit
// j + R_j / kRecordsPerPartial of its destination, R_j its records in the
// groups before j, and end before group j + 1's start. Units are counted
// per record, not per tile: a line of pixels each hot in every tile
// (tensorf's 300 x 245 groups of about 27 records) takes 1.1 units per
// group, where 16 per group (a whole tile's partials) overflowed the pool.
// Per dense chunk that may hold a hot key, an inclusive sum over the slots
// of their hot keys' units (HotKeys) numbers the units; a destination whose
// units do not fit the pool is folded serially. Then one launch (HotFold),
// a thread per (channel, column):
//   - marks the segment table as MarkDestinationSegments does, but a hot
//     key's entry {end, ~begin}: the reduce reads it as empty, and knows
//     the destination is hot (StoredPartials);
//   - stores the partials of the group whose first unit is its column;
//   - notes hot destination h's units (HotUnits), or where they do not fit,
//     folds its records serially and writes its element;
//   - copies the chunk's grad_output channels last where the reduce reads
//     a copy and no other launch makes it.
// The dense reduce then adds a hot destination's stored partials to its
// running sum, in order (DenseFold::finish_hot). A destination with no hot
// key folds at most kHotRecords records in the reduce; a hot one at most a
// tile's in HotFold and its partials in the reduce. Everything is found
// from the sorted keys, by binary search where the table has no bound yet,
// with no atomics: the numbering is a function of the sorted keys alone.
// The tables live in the chunk's unsorted keys and ids, which are dead
// after the sort.
constexpr int32_t kHotRecords = 4096;

// The hot keys of a chunk and the units of the destinations they own,
// read from its sorted keys and ids.
template <typename Segments>
struct HotKeys {
  using index_t = int32_t;
  static constexpr int kWays = Segments::kWays;
  // Above every record id: the bound of a destination's whole range.
  static constexpr uint32_t kEveryId = std::numeric_limits<uint32_t>::max();
  Segments segments;
  MarkDestinationSegments marks; // the sorted keys, and the table
  int tile_bits;
  int32_t key_limit; // a key with more records is hot
  int32_t num_slots;
  const int32_t* slot_ends; // inclusive sums of the terms below
  int32_t pool_units; // units of partials per channel

  // As a term of the inclusive sum over the slots (slot_ends): the units of
  // slot `slot`'s hot key's owned destinations (0 where it has none). Not
  // inlined: CUB's scan unrolls its loads of the terms.
  C10_NOINLINE C10_HOST_DEVICE int32_t operator()(int32_t slot) const {
    int64_t key;
    return hot_key_of(slot, key) ? owned_units(key, kWays) : 0;
  }

  C10_HOST_DEVICE int32_t max_hot_destinations() const {
    return num_slots * kWays;
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
    return begin + key_limit < marks.count &&
        marks.keys[begin + key_limit] == k;
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
    if (!segments.destination_of(key, way, n, s)) {
      return false;
    }
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < way; ++w) {
      const int64_t other = segments.key_of(n, s, w);
      if (is_hot(other, key_begin(other))) {
        return false;
      }
    }
    return true;
  }

  // The units of the destinations that hot key `key` owns through its ways
  // before `end_way`.
  C10_HOST_DEVICE int32_t owned_units(int64_t key, int end_way) const {
    int32_t units = 0;
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < end_way; ++w) {
      index_t n;
      index_t s;
      if (owned_destination(key, w, n, s)) {
        units += units_of(n, s);
      }
    }
    return units;
  }

  // Where destination (n, s)'s records are, found from the keys: way w's
  // sorted positions whose ids are in [first_id, end_id), and the tiles of
  // its first and last record.
  C10_HOST_DEVICE SegmentBounds way_range(
      index_t n,
      index_t s,
      int way,
      uint32_t first_id,
      uint32_t end_id) const {
    const int64_t key = segments.key_of(n, s, way);
    const int32_t begin = key_begin(key);
    const int32_t end = key_begin(key + 1);
    const int32_t* ids = segments.sorted_ids();
    return SegmentBounds{
        first_id_at_least(ids, begin, end, first_id),
        first_id_at_least(ids, begin, end, end_id)};
  }
  struct TileSpan {
    int32_t first;
    int32_t last;
  };
  C10_HOST_DEVICE TileSpan tiles_of(index_t n, index_t s) const {
    const int32_t* ids = segments.sorted_ids();
    TileSpan tiles{std::numeric_limits<int32_t>::max(), -1};
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < kWays; ++w) {
      const int64_t key = segments.key_of(n, s, w);
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
    const int32_t* ids = segments.sorted_ids();
    int32_t records = 0;
    GRID_SAMPLER_DET_ROLLED
    for (int w = 0; w < kWays; ++w) {
      const int64_t key = segments.key_of(n, s, w);
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
    return segments.records_in(ranges);
  }

  // Hot destination h, if the hot key beginning in slot h / kWays owns it
  // through way h % kWays; its units, and whether they fit the pool.
  struct HotDestination {
    bool valid;
    bool fits;
    index_t n;
    index_t s;
    HotUnits units;
  };
  C10_HOST_DEVICE HotDestination hot_destination(int32_t h) const {
    HotDestination hot{false, false, 0, 0, HotUnits{0, 0}};
    const int32_t slot = h / kWays;
    const int way = h - slot * kWays;
    int64_t key;
    if (!hot_key_of(slot, key) || !owned_destination(key, way, hot.n, hot.s)) {
      return hot;
    }
    hot.valid = true;
    const int32_t first =
        (slot == 0 ? 0 : slot_ends[slot - 1]) + owned_units(key, way);
    hot.units = HotUnits{first, units_of(hot.n, hot.s)};
    hot.fits = first + hot.units.count <= pool_units;
    return hot;
  }

  // The group whose partials start at unit u, if one does and its
  // destination's units fit the pool: its destination and tile.
  struct UnitGroup {
    bool stores;
    index_t n;
    index_t s;
    int32_t tile;
  };
  C10_HOST_DEVICE UnitGroup unit_group(int32_t u) const {
    UnitGroup group{false, 0, 0, 0};
    if (u >= slot_ends[num_slots - 1]) {
      return group;
    }
    // The slot whose units hold u, then its owned destination's.
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
    int32_t end_unit = u - unit;
    TileSpan tiles{0, -1};
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
};

// The hot fold's one launch per chunk (see above).
template <typename Fold>
struct HotFold {
  using Segments = decltype(Fold::segments);
  using T = typename Fold::T;
  using index_t = typename Fold::index_type;
  using scalar_t = typename Fold::scalar_type;
  static_assert(
      std::is_same_v<index_t, int32_t>,
      "hot destinations fold in parallel with 32-bit indices only");
  Fold fold;
  // The records with grad_output itself, which the copy below may still be
  // writing while the partials are made.
  SortedRecords<scalar_t, index_t> records;
  HotKeys<Segments> keys;
  int32_t marks_per_row; // sorted records each row marks
  GatherChannelsLast<CopiedAs<scalar_t>, index_t> gather;
  int64_t copy_elements; // points x channels, or 0 where it copies nothing
  int32_t copies_per_row; // elements of the copy each row makes
  T* partials; // [channel][unit]
  int32_t* partial_counts; // [unit]: a group's partials at its first unit
  HotUnits* units; // [hot destination]
  // [stack: channel-groups]
  // A row is a group of Row::channels channels from Row::channel,
  // group_width at most: a thread's walk of a tile serves all of them.
  static constexpr int kGroup = kChannelGroup<T>;
  int32_t group_width;
  // [end stack: channel-groups]

  // Row r: a channel.
  struct Row {
    index_t index; // r
    index_t channel;
    const scalar_t* gout_channel;
    int32_t channels; // [stack: channel-groups]
  };

  C10_HOST_DEVICE Row row(index_t r) const {
    return channel_group(r); // [stack: channel-groups replaces: return Row{r, r, records.gout_channel(r)};]
  }

  C10_HOST_DEVICE void operator()(const Row& row, int32_t i) const {
    const int32_t marked = row.index * marks_per_row + i;
    if (i < marks_per_row && marked < keys.marks.count) {
      mark(marked);
    }
    if (i < copies_per_row) {
      copy_channels_last(int64_t{row.index} * copies_per_row + i);
    }
    if (i < keys.pool_units) {
      store_group_partials(row, i); // [stack: channel-groups replaces: store_partials(row, i);]
    }
    if (i < keys.max_hot_destinations()) {
      finish_destination(row, i);
    }
  }

  // The partials as the dense reduce reads them.
  StoredPartials<T> stored() const {
    return StoredPartials<T>{
        partials, partial_counts, units, keys.pool_units, keys.key_limit};
  }

  // Sorted record i's mark; a hot key's {end, ~begin}.
  C10_HOST_DEVICE void mark(int32_t i) const {
    const MarkDestinationSegments& marks = keys.marks;
    const int64_t key = marks.keys[i];
    const bool first = i == 0 || marks.keys[i - 1] != key;
    const bool last = i == marks.count - 1 || marks.keys[i + 1] != key;
    if (key == marks.nowhere || !(first || last)) {
      return;
    }
    const int32_t limit = keys.key_limit;
    const bool hot = first
        ? keys.is_hot(key, i)
        : i >= limit && marks.keys[i - limit] == key;
    if (!hot) {
      marks(i);
      return;
    }
    // A hot key's first record is never its last.
    if (first) {
      marks.segments[key].end = ~i;
    } else {
      marks.segments[key].begin = i + 1;
    }
  }

  // Element e of the channels-last copy: channel e % C of point e / C.
  C10_HOST_DEVICE void copy_channels_last(int64_t e) const {
    if (e < copy_elements) {
      const auto point = static_cast<index_t>(e / fold.channels);
      gather(
          gather.row(point),
          static_cast<index_t>(e - int64_t{point} * fold.channels));
    }
  }

  // Hot destination h: its units, for the reduce; or where they do not
  // fit, its row's elements, from its records in one thread.
  C10_HOST_DEVICE void finish_destination(const Row& row, int32_t h) const {
    const auto hot = keys.hot_destination(h);
    if (!hot.valid) {
      return;
    }
    if (row.index == 0) {
      units[h] = hot.fits ? hot.units : HotUnits{0, 0};
    }
    if (hot.fits) {
      return;
    }
    const int32_t channels = row.channels; // [stack: channel-groups replaces: const int32_t channels = 1;]
    for (int32_t k = 0; k < channels; ++k) {
      const index_t element_row = hot.n * fold.channels + row.channel + k;
      if (fold.out.block.holds(element_row, hot.s)) {
        fold.out.write(
            element_row,
            hot.s,
            records.fold(
                keys.records_in(hot.n, hot.s, 0, keys.kEveryId),
                records.gout_channel(row.channel + k),
                fold.initial_sum(hot.n, element_row, hot.s)));
      }
    }
  }

  C10_HOST_DEVICE T* partials_of(index_t channel, int32_t unit) const {
    return partials + int64_t{channel} * keys.pool_units + unit;
  }

  // Channel c's partials of the group that starts at unit i, if one does
  // and its destination's units fit.
  C10_HOST_DEVICE void store_partials(const Row& row, int32_t i) const {
    const auto group = keys.unit_group(i);
    int32_t stored = 0;
    if (group.stores) {
      auto in_tile = keys.tile_records(group);
      T* partial = partials_of(row.channel, i);
      while (!in_tile.done()) {
        partial[stored++] = next_partial(
            in_tile,
            records.weights,
            records.gout_offsets,
            row.gout_channel,
            records.tap_bits);
      }
    }
    if (row.index == 0) {
      partial_counts[i] = stored;
    }
  }

  // [stack: channel-groups]
  // Row r: channels [r * group_width, (r + 1) * group_width), C at most.
  C10_HOST_DEVICE Row channel_group(index_t r) const {
    const index_t first = r * group_width;
    const index_t left = fold.channels - first;
    return Row{
        r,
        first,
        records.gout_channel(first),
        static_cast<int32_t>(left < group_width ? left : group_width)};
  }

  // store_partials for a row's channels: one walk of the group's tile.
  C10_HOST_DEVICE void store_group_partials(const Row& row, int32_t i) const {
    const auto group = keys.unit_group(i);
    int32_t stored = 0;
    if (group.stores) {
      auto in_tile = keys.tile_records(group);
      while (!in_tile.done()) {
        T partial[kGroup];
        next_group_partial<kGroup>(
            in_tile, records, row.gout_channel, row.channels, partial);
        GRID_SAMPLER_DET_UNROLL
        for (int k = 0; k < kGroup; ++k) {
          if (k == row.channels) {
            break;
          }
          partials_of(row.channel + k, i)[stored] = partial[k];
        }
        ++stored;
      }
    }
    if (row.index == 0) {
      partial_counts[i] = stored;
    }
  }
  // [end stack: channel-groups]
};

} // namespace at::native::grid_sampler_deterministic
