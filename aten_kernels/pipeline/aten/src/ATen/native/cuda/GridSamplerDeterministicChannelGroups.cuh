#pragma once
// Speed step of the deterministic grid_sampler backward: a dense reduce
// thread folds a group of channels (up to 16) of one destination, so a
// destination's records are walked, and its cells merged, once per group
// rather than once per channel. Each channel's partials and additions are
// the serial fold's, so the sums are the same bits. The hot fold's threads
// take the same groups; a hot destination's stored partials are added one
// channel at a time.

#include <ATen/native/cuda/GridSamplerDeterministicDense.cuh>

namespace at::native::grid_sampler_deterministic {

// Channels one thread folds at most: its sums live in registers, two per
// channel (the running sum and the open partial).
template <typename T>
constexpr int kChannelGroup = sizeof(T) == sizeof(double) ? 8 : 16;

// next_partial() for channels [0, count) of a group (count <= kGroup),
// channel k's grad_output at gout_first + k * records.gout_stride_c: the
// next partial of every channel, from one walk of the records.
template <
    int kGroup,
    typename RecordIds,
    typename T,
    typename scalar_t,
    typename index_t>
C10_HOST_DEVICE inline void next_group_partial(
    RecordIds& ids,
    const SortedRecords<scalar_t, index_t>& records,
    const scalar_t* gout_first,
    int32_t count,
    T (&partial)[kGroup]) {
  const int tap_bits = records.tap_bits;
  const int tile_bits = tap_bits + kTilePointsLog2;
  const uint32_t tile_end = ((ids.front() >> tile_bits) + 1) << tile_bits;
  GRID_SAMPLER_DET_UNROLL
  for (int k = 0; k < kGroup; ++k) {
    partial[k] = static_cast<T>(0);
  }
  ids.start_partial(kRecordsPerPartial);
  while (ids.in_partial()) {
    const uint32_t id = ids.front();
    if (id >= tile_end) {
      break;
    }
    const T weight = records.weights[id];
    const scalar_t* gout = gout_first + records.gout_offsets[id >> tap_bits];
    // A uniform exit: a group of c channels pays for c of them.
    GRID_SAMPLER_DET_UNROLL
    for (int k = 0; k < kGroup; ++k) {
      if (k == count) {
        break;
      }
      const T g = static_cast<T>(gout[k * records.gout_stride_c]);
      partial[k] += mul_rn(weight, g);
    }
    ids.pop();
  }
}

// fold_records() for channels [0, count) of a group: every partial of
// every channel added to its running sum in acc.
template <
    int kGroup,
    typename RecordIds,
    typename T,
    typename scalar_t,
    typename index_t>
C10_HOST_DEVICE inline void fold_group(
    RecordIds ids,
    const SortedRecords<scalar_t, index_t>& records,
    const scalar_t* gout_first,
    int32_t count,
    T (&acc)[kGroup]) {
  while (!ids.done()) {
    T partial[kGroup];
    next_group_partial<kGroup>(ids, records, gout_first, count, partial);
    GRID_SAMPLER_DET_UNROLL
    for (int k = 0; k < kGroup; ++k) {
      if (k == count) {
        break;
      }
      acc[k] += partial[k];
    }
  }
}

// The channel groups of rows [row_begin, row_end) of grad_input's (n, c)
// rows: image n's channels split at multiples of `width` (1 to kGroup),
// clipped to the rows; group r is the r % per_image-th of image
// first_image + r / per_image, and may be empty.
template <typename index_t>
struct ChannelGroups {
  index_t row_begin;
  index_t row_end;
  index_t channels;
  index_t width;
  index_t first_image;
  index_t per_image;

  ChannelGroups(
      int64_t row_begin,
      int64_t row_end,
      int64_t channels,
      int64_t width)
      : row_begin(static_cast<index_t>(row_begin)),
        row_end(static_cast<index_t>(row_end)),
        channels(static_cast<index_t>(channels)),
        width(static_cast<index_t>(width)),
        first_image(static_cast<index_t>(row_begin / channels)),
        per_image(static_cast<index_t>((channels + width - 1) / width)) {}

  int64_t count() const {
    const int64_t images = (row_end - 1) / channels + 1 - first_image;
    return images * per_image;
  }

  struct Group {
    index_t n;
    index_t row; // its first row, n * C + its first channel
    int32_t count; // its channels; 0 for a group outside the rows
  };
  C10_HOST_DEVICE Group group(index_t r) const {
    const index_t image = r / per_image;
    const index_t n = first_image + image;
    const index_t image_row = n * channels;
    const index_t first = image_row + (r - image * per_image) * width;
    const index_t begin = first > row_begin ? first : row_begin;
    const index_t image_end = image_row + channels;
    index_t end = first + width < image_end ? first + width : image_end;
    end = end < row_end ? end : row_end;
    return Group{n, begin, end > begin ? static_cast<int32_t>(end - begin) : 0};
  }
};

// Destinations fastest, as ReduceDense, with a thread per (channel group,
// destination): the group's channels of one destination from one walk of
// its records.
template <typename Fold>
struct ReduceDenseChannelGroups {
  using index_t = typename Fold::index_type;
  using scalar_t = typename Fold::scalar_type;
  using T = typename Fold::T;
  static constexpr int kGroup = kChannelGroup<T>;
  Fold fold;
  ChannelGroups<index_t> groups;
  index_t first_col;

  using Row = typename ChannelGroups<index_t>::Group;

  C10_HOST_DEVICE Row row(index_t r) const {
    return groups.group(r);
  }

  C10_HOST_DEVICE void operator()(const Row& group, index_t col) const {
    const index_t s = first_col + col;
    const index_t c = group.row - group.n * fold.channels;
    if (group.count <= 1) {
      // One channel (C = 1, or a group of one): the per-channel fold, with
      // no sums to move through registers.
      if (group.count == 1) {
        fold.fold_into(group.n, group.row, s, fold.records.gout_channel(c));
      }
      return;
    }
    const auto ids = fold.segments.of(group.n, s);
    const bool hot = fold.is_hot(ids);
    if (ids.done() && group.n < fold.first_written_image && !hot) {
      return;
    }
    // The sums enter and leave the registers by a rolled loop of selects:
    // one copy of a channel's load or store, where an unrolled loop would
    // hold kGroup of them (and an array indexed at run time would live in
    // local memory).
    T acc[kGroup] = {};
    GRID_SAMPLER_DET_ROLLED
    for (int k = 0; k < group.count; ++k) {
      const T sum = fold.initial_sum(group.n, group.row + k, s);
      GRID_SAMPLER_DET_UNROLL
      for (int j = 0; j < kGroup; ++j) {
        acc[j] = j == k ? sum : acc[j];
      }
    }
    fold_group<kGroup>(
        ids, fold.records, fold.records.gout_channel(c), group.count, acc);
    if (hot) {
      // The group's channels share the destination, so its units too.
      const HotUnits units = fold.hot_units(group.n, s);
      GRID_SAMPLER_DET_ROLLED
      for (int k = 0; k < group.count; ++k) {
        fold.finish_hot(units, group.n, group.row + k, s);
      }
      return;
    }
    GRID_SAMPLER_DET_ROLLED
    for (int k = 0; k < group.count; ++k) {
      fold.out.write(group.row + k, s, select_tap(acc, k));
    }
  }
};

// The dense reduce of rows [row_from, row_to) of the fold's block, channel
// groups `width` wide (1: a thread per element, as before this step).
template <typename Executor, typename Fold>
void reduce_channel_groups(
    const Executor& ex,
    const Fold& fold,
    int64_t row_from,
    int64_t row_to,
    int64_t width) {
  using index_t = typename Fold::index_type;
  const ChannelGroups<index_t> groups(row_from, row_to, fold.channels, width);
  ex.for_each_row(
      static_cast<index_t>(groups.count()),
      fold.out.block.width(),
      ReduceDenseChannelGroups<Fold>{fold, groups, fold.out.block.col_begin});
}

} // namespace at::native::grid_sampler_deterministic
