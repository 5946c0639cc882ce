#pragma once
// Speed step of the deterministic grid_sampler backward: from 16 channels,
// the dense reduce's threads take channels fastest, so the lanes of a warp
// share one walk of a destination's records and read grad_output at
// consecutive channels (of a channels-last copy of the chunk's grad_output
// where its channel stride is not 1). Each element's fold is unchanged.

#include <ATen/native/cuda/GridSamplerDeterministicDense.cuh>

namespace at::native::grid_sampler_deterministic {

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
using CopiedAs = std::conditional_t<
    sizeof(scalar_t) == sizeof(uint16_t),
    uint16_t,
    scalar_t>;
static_assert(
    std::is_standard_layout_v<c10::Half> && sizeof(c10::Half) == 2 &&
        std::is_standard_layout_v<c10::BFloat16> && sizeof(c10::BFloat16) == 2,
    "Half and BFloat16 must be one uint16_t each to be copied as one");

// Channels fastest pays from this many channels on: at fp32, 16 lanes on
// one point read 64 contiguous bytes (two 32-byte sectors) where 16 lanes on
// 16 destinations read 16 sectors, and the lanes share one merge. Below it a
// warp spans more destinations than it saves sectors, and its writes,
// strided by the image size, cost a sector per lane either way.
constexpr int64_t kChannelsFastestFrom = 16;

inline bool prefers_channels_fastest(int64_t channels) {
  return channels >= kChannelsFastestFrom;
}

} // namespace at::native::grid_sampler_deterministic
