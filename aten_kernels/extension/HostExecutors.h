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

  void inclusive_sum(const int32_t* in, int32_t* out, int32_t count) const {
    std::partial_sum(in, in + count, out);
  }

  c10::DataPtr allocate(size_t bytes) const {
    return c10::GetCPUAllocator()->allocate(bytes);
  }

  void zero(void* data, size_t bytes) const {
    if (bytes > 0) {
      std::memset(data, 0, bytes);
    }
  }

  void begin_chunk() const {}
};

// The dense reduces: a thread of theirs per grad_input element swept (the
// exact accumulation's say so with a kSweepsElements member).
template <typename Stage>
struct SweepsElements
    : std::bool_constant<requires { Stage::kSweepsElements; }> {};
template <typename Fold>
struct SweepsElements<at::native::grid_sampler_deterministic::ReduceDense<Fold>>
    : std::true_type {};
template <typename Fold>
struct SweepsElements<
    at::native::grid_sampler_deterministic::ReduceDenseChannelsFastest<Fold>>
    : std::true_type {};

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

  void launch() const {
    ++counters->launches;
    if (counters->chunks == 1) {
      ++counters->launches_per_chunk;
    }
  }

  template <typename count_t, typename Stage>
  void for_each(count_t count, const Stage& /*stage*/) const {
    if (count != 0) {
      launch();
      if constexpr (SweepsElements<Stage>::value) {
        counters->elements_swept += count;
      }
      counters->atomics += int64_t{count} * atomics_per_item<Stage>();
    }
  }

  template <typename row_t, typename col_t, typename Stage>
  void for_each_row(row_t rows, col_t cols, const Stage& /*stage*/) const {
    if (rows != 0 && cols != 0) {
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
    counters->items_sorted += count;
    counters->key_bits = end_bit;
    counters->key_bytes = sizeof(key_t);
    counters->sort_scratch_bytes = std::max<int64_t>(
        counters->sort_scratch_bytes,
        int64_t{count} * static_cast<int64_t>(sizeof(key_t) + sizeof(int32_t)));
  }

  void inclusive_sum(
      const int32_t* /*in*/,
      int32_t* /*out*/,
      int32_t count) const {
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

  void begin_chunk() const {
    ++counters->chunks;
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
