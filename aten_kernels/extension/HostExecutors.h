#pragma once
// The host executors of GridSamplerDeterministicPipeline.cuh's pipeline (and
// of the extension's exact accumulation, which runs on the same executors):
// HostExecutor runs every stage, CountingExecutor none. See
// GridSamplerDeterministicCPU.cpp.

#include "GridSamplerDeterministicCPU.h"

#include <ATen/Parallel.h>
#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

namespace detgrid {

constexpr int64_t kDefaultGrainSize = 1024;

struct HostExecutor {
  int64_t grain_size;

  template <typename count_t, typename Stage>
  void for_each(count_t count, const Stage& stage) const {
    if (count == 0) {
      return;
    }
    at::parallel_for(0, count, grain_size, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        stage(static_cast<count_t>(i));
      }
    });
  }

  template <typename row_t, typename col_t, typename Stage>
  void for_each_row(row_t rows, col_t cols, const Stage& stage) const {
    if (rows == 0 || cols == 0) {
      return;
    }
    const int64_t width = cols;
    at::parallel_for(
        0, int64_t{rows} * width, grain_size, [&](int64_t begin, int64_t end) {
          int64_t i = begin;
          while (i < end) {
            const int64_t r = i / width;
            const auto row = stage.row(static_cast<row_t>(r));
            for (int64_t c = i - r * width; c < width && i < end; ++c, ++i) {
              stage(row, static_cast<col_t>(c));
            }
          }
        });
  }

  template <typename key_t>
  void stable_sort_pairs(
      const key_t* keys_in,
      key_t* keys_out,
      const int32_t* values_in,
      int32_t* values_out,
      int32_t count,
      int /*end_bit: every key is below 2^end_bit*/) const {
    if (count == 0) {
      return;
    }
    std::vector<int32_t> order(count);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return keys_in[a] < keys_in[b];
    });
    for (int32_t i = 0; i < count; ++i) {
      keys_out[i] = keys_in[order[i]];
      values_out[i] = values_in[order[i]];
    }
  }

  template <typename Term>
  void inclusive_sum(int32_t count, const Term& term, int32_t* out) const {
    int32_t sum = 0;
    for (int32_t i = 0; i < count; ++i) {
      sum += term(i);
      out[i] = sum;
    }
  }

  c10::DataPtr allocate(size_t bytes) const {
    return c10::GetCPUAllocator()->allocate(bytes);
  }

  void zero(void* data, size_t bytes) const {
    if (bytes > 0) {
      std::memset(data, 0, bytes);
    }
  }
};

// The dense reduces that take a thread per grad_input element swept (the
// exact accumulation's say so with a kSweepsElements member; the channel
// groups' count theirs in CountingExecutor::note).
template <typename Stage>
struct SweepsElements
    : std::bool_constant<requires { Stage::kSweepsElements; }> {};
template <typename Fold>
struct SweepsElements<
    at::native::grid_sampler_deterministic::ReduceDenseChannelsFastest<Fold>>
    : std::true_type {};

// The points of the chunk being reduced, and its sorted items.
struct ChunkItems {
  int64_t first_point = 0;
  int64_t points = 0;
  int64_t points_per_image = 1;
  int64_t items = 0;

  int64_t of_image(int64_t n) const {
    const int64_t begin = std::max(first_point, n * points_per_image);
    const int64_t end =
        std::min(first_point + points, (n + 1) * points_per_image);
    return end > begin ? (end - begin) * (items / points) : 0;
  }
  // One pass per (n, c) row of [row_begin, row_end), C channels per image.
  int64_t over_rows(int64_t row_begin, int64_t row_end, int64_t channels)
      const {
    int64_t merges = 0;
    const int64_t last_image = (first_point + points - 1) / points_per_image;
    for (int64_t n = first_point / points_per_image; n <= last_image; ++n) {
      const int64_t rows = std::min(row_end, (n + 1) * channels) -
          std::max(row_begin, n * channels);
      merges += rows > 0 ? rows * of_image(n) : 0;
    }
    return merges;
  }
};

// Integer atomics a stage issues per item at most (its kAtomicsPerItem).
template <typename Stage>
constexpr int64_t atomics_per_item() {
  if constexpr (requires { Stage::kAtomicsPerItem; }) {
    return Stage::kAtomicsPerItem;
  } else {
    return 0;
  }
}

// Runs nothing; counts what the CUDA executor would launch, sort and
// allocate for the same call (every count is a pure function of the shapes).
struct CountingExecutor {
  WorkCounters* counters;
  // The chunk of the last point pass and sort, for channel_merges.
  mutable ChunkItems chunk{};

  void launch() const {
    ++counters->launches;
    if (counters->chunks == 1) {
      ++counters->launches_per_chunk;
    }
  }

  template <typename count_t, typename Stage>
  void for_each(count_t count, const Stage& stage) const {
    if (count != 0) {
      note(stage, int64_t{count});
      launch();
      if constexpr (SweepsElements<Stage>::value) {
        counters->elements_swept += count;
      }
      counters->atomics += int64_t{count} * atomics_per_item<Stage>();
    }
  }

  template <typename row_t, typename col_t, typename Stage>
  void for_each_row(row_t rows, col_t cols, const Stage& stage) const {
    if (rows != 0 && cols != 0) {
      note(stage, int64_t{rows});
      launch();
      if constexpr (SweepsElements<Stage>::value) {
        counters->elements_swept += int64_t{rows} * int64_t{cols};
      }
      counters->atomics +=
          int64_t{rows} * int64_t{cols} * atomics_per_item<Stage>();
    }
  }

  template <typename key_t>
  void stable_sort_pairs(
      const key_t* /*keys_in*/,
      key_t* /*keys_out*/,
      const int32_t* /*values_in*/,
      int32_t* /*values_out*/,
      int32_t count,
      int end_bit) const {
    if (count == 0) {
      return;
    }
    launch();
    chunk.items = count;
    counters->items_sorted += count;
    counters->key_bits = end_bit;
    counters->key_bytes = sizeof(key_t);
    counters->sort_scratch_bytes = std::max<int64_t>(
        counters->sort_scratch_bytes,
        int64_t{count} * static_cast<int64_t>(sizeof(key_t) + sizeof(int32_t)));
  }

  template <typename Term>
  void inclusive_sum(int32_t count, const Term& /*term*/, int32_t* /*out*/)
      const {
    if (count != 0) {
      launch();
    }
  }

  c10::DataPtr allocate(size_t bytes) const {
    // Every buffer lives for the whole call, so the peak is the sum.
    counters->workspace_bytes += static_cast<int64_t>(bytes);
    return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
  }

  void zero(void* /*data*/, size_t bytes) const {
    if (bytes > 0) {
      launch();
    }
  }

 private:
  // What a stage tells the counters before its launch: a point pass begins
  // a chunk (every chunk has one) and the chunk channel_merges counts, a
  // reduce its passes over the chunk's records. A reduce that sweeps part
  // of its rows' columns (a float carry's block of columns) counts them
  // where its block begins at column 0, so that a row's blocks count it once.
  template <typename Stage>
  void note(const Stage& /*stage*/, int64_t /*rows*/) const {}

  template <int kTaps, typename Args>
  void note(
      const at::native::grid_sampler_deterministic::PointPass<kTaps, Args>&
          pass,
      int64_t count) const {
    ++counters->chunks;
    const auto& fills = pass.fills;
    counters->longest_fill = std::max(
        counters->longest_fill,
        std::min(fills.words_per_point, fills.table_words));
    chunk = ChunkItems{
        int64_t{pass.first_point},
        count,
        int64_t{pass.args.points_per_image()},
        0};
  }

  template <typename Fold>
  void note(
      const at::native::grid_sampler_deterministic::ReduceDenseChannelGroups<
          Fold>& stage,
      int64_t rows) const {
    if (stage.first_col != 0) {
      return;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const auto group = stage.row(static_cast<typename Fold::index_type>(r));
      counters->channel_merges += group.count > 0 ? chunk.of_image(group.n) : 0;
    }
    // A thread per group and column, each sweeping its group's elements.
    counters->elements_swept +=
        int64_t{stage.groups.row_end - stage.groups.row_begin} *
        stage.fold.out.block.width();
  }

  template <typename Fold>
  void note(
      const at::native::grid_sampler_deterministic::ReduceDenseChannelsFastest<
          Fold>& stage,
      int64_t count) const {
    const int64_t channels = stage.fold.channels;
    const int64_t first_row = stage.first_pair / stage.fold.destinations_per_image;
    counters->channel_merges += chunk.over_rows(
        first_row, first_row + count / stage.fold.destinations_per_image, channels);
  }

  template <typename scalar_t, typename index_t>
  void note(
      const at::native::grid_sampler_deterministic::ReduceSparse<
          scalar_t,
          index_t>& stage,
      int64_t /*rows*/) const {
    const auto& block = stage.out.block;
    if (block.col_begin == 0) {
      counters->channel_merges +=
          chunk.over_rows(block.row_begin, block.row_end, stage.channels);
    }
  }
};

// The records a reduce thread folds: a segment's, or the ways' of a merge.
inline int64_t record_count(
    const at::native::grid_sampler_deterministic::SortedRecordIds& ids) {
  return ids.end - ids.next;
}
template <int kWays>
int64_t record_count(
    const at::native::grid_sampler_deterministic::MergedCellRecords<kWays>&
        ids) {
  int64_t records = 0;
  for (int k = 0; k < kWays; ++k) {
    records += ids.end[k] - ids.next[k];
  }
  return records;
}

// Runs every stage as HostExecutor does, and after each fold measures the
// longest fold of its threads: the most records, or stored partials, that
// one thread adds in sequence (a pure function of the shapes and the grid,
// like the sums). Read by detgrid.ops.work_counters.
struct FoldLengthExecutor : HostExecutor {
  int64_t* longest;

  template <typename count_t, typename Stage>
  void for_each(count_t count, const Stage& stage) const {
    HostExecutor::for_each(count, stage);
    measure(stage, int64_t{count});
  }

  template <typename row_t, typename col_t, typename Stage>
  void for_each_row(row_t rows, col_t cols, const Stage& stage) const {
    HostExecutor::for_each_row(rows, cols, stage);
    measure(stage, int64_t{rows}, int64_t{cols});
  }

 private:
  void note(int64_t length) const {
    *longest = std::max(*longest, length);
  }

  // Every destination of images [first_image, end_image), columns
  // [first_col, end_col): the threads of their channels fold alike.
  template <typename Fold>
  void note_images(
      const Fold& fold,
      int64_t first_image,
      int64_t end_image,
      int64_t first_col,
      int64_t end_col) const {
    using index_t = typename Fold::index_type;
    for (index_t n = first_image; n < end_image; ++n) {
      for (index_t s = first_col; s < end_col; ++s) {
        const auto ids = fold.segments.of(n, s);
        note(
            fold.is_hot(ids) ? stored_partials(fold, n, s)
                             : record_count(ids));
      }
    }
  }
  // The partials a hot destination's reduce thread adds (none where
  // HotFold folded its records).
  template <typename Fold, typename index_t>
  static int64_t stored_partials(const Fold& fold, index_t n, index_t s) {
    const auto units = fold.hot_units(n, s);
    int64_t partials = 0;
    for (int32_t u = units.first; u < units.first + units.count; ++u) {
      partials += fold.stored.partial_counts[u];
    }
    return partials;
  }

  template <typename Stage>
  void measure(const Stage& /*stage*/, int64_t /*count*/) const {}
  template <typename Stage>
  void measure(const Stage& /*stage*/, int64_t /*rows*/, int64_t /*cols*/)
      const {}

  template <typename Fold>
  void measure(
      const at::native::grid_sampler_deterministic::ReduceDenseChannelGroups<
          Fold>& stage,
      int64_t /*rows*/,
      int64_t cols) const {
    const auto& groups = stage.groups;
    note_images(
        stage.fold,
        groups.first_image,
        (groups.row_end - 1) / groups.channels + 1,
        stage.first_col,
        stage.first_col + cols);
  }

  template <typename Fold>
  void measure(
      const at::native::grid_sampler_deterministic::ReduceDenseChannelsFastest<
          Fold>& stage,
      int64_t count) const {
    const int64_t pairs_per_image =
        int64_t{stage.fold.channels} * stage.fold.destinations_per_image;
    const int64_t first_image = stage.first_pair / pairs_per_image;
    note_images(
        stage.fold,
        first_image,
        first_image + count / pairs_per_image,
        0,
        stage.fold.destinations_per_image);
  }

  // The hot fold's threads: a group's records in its tile, or a hot
  // destination's, where its units did not fit.
  template <typename Fold>
  void measure(
      const at::native::grid_sampler_deterministic::HotFold<Fold>& hot,
      int64_t /*rows*/,
      int64_t /*cols*/) const {
    const auto& keys = hot.keys;
    for (int32_t u = 0; u < keys.pool_units; ++u) {
      const auto group = keys.unit_group(u);
      if (group.stores) {
        note(record_count(keys.tile_records(group)));
      }
    }
    for (int32_t h = 0; h < keys.max_hot_destinations(); ++h) {
      const auto destination = keys.hot_destination(h);
      if (destination.valid && !destination.fits) {
        note(record_count(keys.records_in(
            destination.n, destination.s, 0, keys.kEveryId)));
      }
    }
  }

  template <typename scalar_t, typename index_t>
  void measure(
      const at::native::grid_sampler_deterministic::ReduceSparse<
          scalar_t,
          index_t>& stage,
      int64_t /*rows*/,
      int64_t /*cols*/) const {
    namespace gsd = at::native::grid_sampler_deterministic;
    for (int32_t i = 0; i < stage.count; ++i) {
      if (gsd::begins_run(stage.keys, i) && stage.keys[i] != stage.nowhere) {
        note(gsd::run_end(stage.keys, i, stage.count) - i);
      }
    }
  }
};

inline void check_grain_size(int64_t grain_size) {
  TORCH_CHECK(
      grain_size >= 0,
      "grid_sampler backward (deterministic): grain_size must be positive, "
      "or 0 for the default, got ",
      grain_size);
}

inline void check_rank(const at::TensorBase& input) {
  TORCH_CHECK(
      input.dim() == 4 || input.dim() == 5,
      "grid_sampler backward (deterministic): expected a 4-D or 5-D input, "
      "got ",
      input.dim(),
      "-D");
}

} // namespace detgrid
