#pragma once
// Speed step of the deterministic grid_sampler backward: the point pass also
// zero-fills a dense chunk's segment table and, up to 64 channels, makes the
// chunk's channels-last copy of grad_output, so that neither is a launch of
// its own. Nothing reads the table before the sort is done, nor the copy
// before the reduce; the records and their order are unchanged, so the sums
// are the same bits.

#include <ATen/native/cuda/GridSamplerDeterministicChannelsFastest.cuh>

namespace at::native::grid_sampler_deterministic {

// What thread i of a point pass fills besides its point's records: words
// [i * words_per_point, (i + 1) * words_per_point) of the table, with zeros,
// and row i of the channels-last copy of grad_output (GatherChannelsLast's
// layout). A null table or copy is not filled.
template <typename scalar_t, typename index_t>
struct PointFills {
  int32_t* table = nullptr;
  int64_t table_words = 0;
  int64_t words_per_point = 0;
  const scalar_t* grad_output = nullptr;
  index_t stride_c = 0;
  index_t channels = 0;
  scalar_t* gathered = nullptr;
  index_t* gathered_offsets = nullptr;

  // gout_offset: where the point's grad_output[n][0][position] lies. The
  // loops stay rolled: unrolled, they grew every point pass by a third.
  C10_HOST_DEVICE void operator()(index_t i, index_t gout_offset) const {
    if (table != nullptr) {
      const int64_t begin = int64_t{i} * words_per_point;
      const int64_t end = begin + words_per_point < table_words
          ? begin + words_per_point
          : table_words;
      GRID_SAMPLER_DET_ROLLED
      for (int64_t w = begin; w < end; ++w) {
        table[w] = 0;
      }
    }
    if (gathered != nullptr) {
      const index_t row = i * channels;
      GRID_SAMPLER_DET_ROLLED
      for (index_t c = 0; c < channels; ++c) {
        gathered[row + c] = grad_output[gout_offset + c * stride_c];
      }
      gathered_offsets[i] = row;
    }
  }
};

// A point's thread zero-fills at most a full dense chunk's share of the
// table per tap (dense_table_fits: one SegmentBounds per tap at most); where
// a short chunk's share is larger, the executor's zero fill clears it.
constexpr int64_t kFusedFillWordsPerTap =
    sizeof(SegmentBounds) / sizeof(int32_t);

// Up to this many channels a point's thread copies its row of grad_output
// (its loads coalesce across the warp's points, channel by channel); beyond
// it the copy stays a launch of its own (GatherChannelsLast), a thread per
// element, so that no thread copies a thousand values in sequence.
constexpr int64_t kFusedGatherChannels = 64;

} // namespace at::native::grid_sampler_deterministic
