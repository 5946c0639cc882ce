#pragma once
// accumulate="exact": the grad_input reduction with order-free sums
// (ExactSum.cuh), in two variants that give the same bits:
//   sorted  the ordered path's point pass, sort and segment marking, then a
//           reduce that sums each element's records in any order (per-cell
//           keys read their ways one after another, with no merge);
//   atomic  the point pass, then one thread per (record, channel) adding
//           its term's words to the element's slices with integer atomics:
//           no sort, no segments.
// Stages come from GridSamplerDeterministicPipeline.cuh where they are the
// same, and run on any of its executors. Extension-only: upstream's files
// know nothing of this.
//
// Stage order, per call:
//   1. bound pre-pass over grad_output (ExactSum.cuh's scale);
//   2. per block of grad_input elements, whose slices fit kSlicesBytes
//      (whole images where one image fits, else whole channel planes of one
//      image, at least one plane): a zero fill of the slices, then per
//      chunk of the block's points the point pass and the sorted or atomic
//      reduce into the slices, then one rounding pass into grad_input.
// Memory: the ordered path's chunk buffers (less the sort's for the atomic
// variant), plus 8 * kWords + 4 bytes per grad_input element of a block:
// at most kSlicesBytes, or one channel plane's when that is more. Blocks of
// channels repeat the point pass (and the sort) of their image once each.

#include "ExactSum.cuh"

#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>

#include <algorithm>

namespace detgrid::exact {

namespace gsd = at::native::grid_sampler_deterministic;

// The budget of a block's slices.
constexpr int64_t kSlicesBytes = int64_t{64} << 20;
// grad_output values one pre-pass thread reads.
constexpr int64_t kBoundValuesPerThread = 64;

// Stage 1: stored_bound = max over finite non-zero grad_output values g of
// magnitude_bound(g) - kNoBound (0, as zero-filled, when there is none). One
// row per (image, channel), one thread per run of kBoundValuesPerThread
// output positions; one atomic per thread.
template <typename scalar_t, typename index_t, int kDims>
struct FindGradOutputBound {
  using T = at::opmath_type<scalar_t>;
  static constexpr int64_t kAtomicsPerItem = 1;
  gsd::View<const scalar_t, index_t, kDims> grad_output;
  gsd::Spatial<index_t, kDims> out_size;
  index_t channels;
  int32_t* stored_bound;

  struct Row {
    index_t n;
    index_t c;
  };

  C10_HOST_DEVICE Row row(index_t r) const {
    const index_t n = r / channels;
    return Row{n, r - n * channels};
  }

  C10_HOST_DEVICE void operator()(const Row& row, index_t run) const {
    const index_t points = static_cast<index_t>(gsd::spatial_numel(out_size));
    const index_t begin = run * static_cast<index_t>(kBoundValuesPerThread);
    const index_t end = std::min<index_t>(
        points, begin + static_cast<index_t>(kBoundValuesPerThread));
    int32_t stored = 0;
    for (index_t p = begin; p < end; ++p) {
      const T g = static_cast<T>(
          grad_output.at(row.n, row.c, gsd::unravel(p, out_size)));
      const bool finite = g == g && g != std::numeric_limits<T>::infinity() &&
          g != -std::numeric_limits<T>::infinity();
      if (finite && g != static_cast<T>(0)) {
        const int32_t candidate = magnitude_bound(g) - kNoBound;
        stored = candidate > stored ? candidate : stored;
      }
    }
    if (stored > 0) {
      atomic_max(stored_bound, stored);
    }
  }
};

// The term of record `id` for one channel, as the ordered fold forms it.
template <int kTapsPerPoint, typename scalar_t, typename index_t>
C10_HOST_DEVICE inline at::opmath_type<scalar_t> record_term(
    const gsd::SortedRecords<scalar_t, index_t>& records,
    const scalar_t* gout_channel,
    uint32_t id) {
  using T = at::opmath_type<scalar_t>;
  const T gout =
      static_cast<T>(gout_channel[records.gout_offsets[id / kTapsPerPoint]]);
  return gsd::mul_rn(records.weights[id], gout);
}

// Where a block's elements lie: the block is channels [first_channel,
// first_channel + channels) of images from first_image on, and element
// ((n - first_image) * channels + k) * destinations_per_image + s holds
// (n, first_channel + k, s). Stages number a block's channels k from 0.
template <typename index_t>
struct BlockLayout {
  index_t first_image;
  index_t first_channel;
  index_t channels;
  index_t destinations_per_image;

  C10_HOST_DEVICE index_t element(index_t n, index_t k, index_t s) const {
    return ((n - first_image) * channels + k) * destinations_per_image + s;
  }
};

// What the stages over per-tap keys share: a row per channel of the block,
// and keys that are destinations n * destinations_per_image + s (or
// nowhere).
template <typename scalar_t, typename index_t, typename key_t>
struct ChannelRowsOverKeys {
  using T = at::opmath_type<scalar_t>;
  gsd::SortedRecords<scalar_t, index_t> records;
  const key_t* keys;
  key_t nowhere;
  gsd::Divider<index_t> by_image_size;
  BlockLayout<index_t> layout;
  Slices<T, index_t> slices;
  const int32_t* stored_bound;

  struct Row {
    index_t k; // the block's channel
    const scalar_t* gout_channel;
  };

  C10_HOST_DEVICE Row row(index_t k) const {
    return Row{k, records.gout_channel(layout.first_channel + k)};
  }

  // The block's element of destination `key` for the block's channel k.
  C10_HOST_DEVICE index_t element_of(key_t key, index_t k) const {
    const index_t d = static_cast<index_t>(key);
    const index_t n = gsd::divide(d, by_image_size);
    return layout.element(n, k, d - n * layout.destinations_per_image);
  }
};

// Atomic variant, after the point pass of a chunk keyed per tap: thread
// (row k of the block's channels, record r) adds record r's term to its
// destination's slices (records' ids are unused: r is its own id). Records
// that land nowhere add nothing.
template <int kTapsPerPoint, int kDims, typename scalar_t, typename index_t, typename key_t>
struct ScatterTerms : ChannelRowsOverKeys<scalar_t, index_t, key_t> {
  using Base = ChannelRowsOverKeys<scalar_t, index_t, key_t>;
  using T = typename Base::T;
  static constexpr int64_t kAtomicsPerItem = Format<T>::kWordsPerTerm;

  C10_HOST_DEVICE void operator()(const typename Base::Row& row, int32_t r) const {
    const key_t key = this->keys[r];
    if (key == this->nowhere) {
      return;
    }
    this->slices.add_atomic(
        this->element_of(key, row.k),
        record_term<kTapsPerPoint>(
            this->records, row.gout_channel, static_cast<uint32_t>(r)),
        scale_from<T>(*this->stored_bound, kDims));
  }
};

// Sorted variant, the records of one destination in any order: visit(id)
// for each; false when it has none. Per tap: its segment.
template <typename index_t, typename Visit>
C10_HOST_DEVICE inline bool visit_records(
    const gsd::DestinationSegments<index_t>& segments,
    index_t n,
    index_t s,
    const Visit& visit) {
  const gsd::SortedRecordIds ids = segments.of(n, s);
  for (int32_t i = ids.next; i < ids.end; ++i) {
    visit(static_cast<uint32_t>(ids.ids[i]));
  }
  return ids.next < ids.end;
}

// Per cell: each neighbouring cell's points in turn, through the tap that
// reaches the destination; no merge, since the order is free.
template <typename index_t, int kDims, typename Visit>
C10_HOST_DEVICE inline bool visit_records(
    const gsd::CellSegments<index_t, kDims>& cells,
    index_t n,
    index_t s,
    const Visit& visit) {
  constexpr int kWays = 1 << kDims;
  const int32_t base = cells.base_cell(n, s);
  bool any = false;
#pragma unroll
  for (int k = 0; k < kWays; ++k) {
    const gsd::SegmentBounds bounds = cells.segments[base + cells.way_offset(k)];
    const uint32_t tap = kWays - 1 - k;
    for (int32_t i = bounds.begin; i < bounds.end; ++i) {
      visit(static_cast<uint32_t>(cells.point_ids[i]) * kWays + tap);
    }
    any = any || bounds.begin < bounds.end;
  }
  return any;
}

// Sorted variant, dense: thread (row (n - first_swept) * channels + k,
// column s) sums destination (n, s)'s records of this chunk for the block's
// channel k and adds
// the sum to the element's slices; destinations without records write
// nothing.
template <int kTapsPerPoint, int kDims, typename Segments, typename scalar_t, typename index_t>
struct ReduceExactDense {
  using T = at::opmath_type<scalar_t>;
  static constexpr bool kSweepsElements = true;
  gsd::SortedRecords<scalar_t, index_t> records;
  Segments segments;
  BlockLayout<index_t> layout;
  index_t first_swept;
  Slices<T, index_t> slices;
  const int32_t* stored_bound;

  struct Row {
    index_t n;
    const scalar_t* gout_channel;
    index_t first_element;
  };

  C10_HOST_DEVICE Row row(index_t r) const {
    const index_t image = r / layout.channels;
    const index_t k = r - image * layout.channels;
    const index_t n = first_swept + image;
    return Row{
        n,
        records.gout_channel(layout.first_channel + k),
        layout.element(n, k, 0)};
  }

  C10_HOST_DEVICE void operator()(const Row& row, index_t s) const {
    const Scale scale = scale_from<T>(*stored_bound, kDims);
    Accumulator<T> sum;
    const bool any = visit_records(segments, row.n, s, [&](uint32_t id) {
      sum.add(record_term<kTapsPerPoint>(records, row.gout_channel, id), scale);
    });
    if (any) {
      slices.add(row.first_element + s, sum);
    }
  }
};

// Sorted variant, sparse (per tap): thread (row k of the block's channels,
// sorted record i) sums the run of one destination's records that record i
// begins, as the pipeline's ReduceSparse does, and adds the sum to its
// slices.
template <int kTapsPerPoint, int kDims, typename scalar_t, typename index_t, typename key_t>
struct ReduceExactSparse : ChannelRowsOverKeys<scalar_t, index_t, key_t> {
  using Base = ChannelRowsOverKeys<scalar_t, index_t, key_t>;
  using T = typename Base::T;
  int32_t count;

  C10_HOST_DEVICE void operator()(const typename Base::Row& row, int32_t begin) const {
    const key_t destination = this->keys[begin];
    if (destination == this->nowhere || !gsd::begins_run(this->keys, begin)) {
      return;
    }
    const Scale scale = scale_from<T>(*this->stored_bound, kDims);
    Accumulator<T> sum;
    const int32_t end = gsd::run_end(this->keys, begin, count);
    for (int32_t i = begin; i < end; ++i) {
      sum.add(
          record_term<kTapsPerPoint>(
              this->records,
              row.gout_channel,
              static_cast<uint32_t>(this->records.ids[i])),
          scale);
    }
    this->slices.add(this->element_of(destination, row.k), sum);
  }
};

// Last stage of a block: every element's slices rounded into grad_input
// (out points at the block's first element).
template <int kDims, typename scalar_t, typename index_t>
struct RoundSums {
  using T = at::opmath_type<scalar_t>;
  Slices<T, index_t> slices;
  scalar_t* out;
  const int32_t* stored_bound;

  C10_HOST_DEVICE void operator()(index_t e) const {
    int64_t words[Format<T>::kWords];
#pragma unroll
    for (int i = 0; i < Format<T>::kWords; ++i) {
      words[i] = slices.words[i * slices.elements + e];
    }
    out[e] = round_sum<scalar_t, T>(
        words, slices.flags[e], scale_from<T>(*stored_bound, kDims));
  }
};

// The blocks' shape: as many whole images as kSlicesBytes holds; where one
// image's slices pass it, one image at a time in as many whole channel
// planes as it holds, at least one.
struct BlockShape {
  int64_t images;
  int64_t channels;
};

inline BlockShape plan_blocks(
    int64_t batch,
    int64_t channels,
    int64_t plane_elements,
    int64_t bytes_per_element) {
  const int64_t plane_bytes = std::max<int64_t>(1, plane_elements * bytes_per_element);
  const int64_t image_bytes = channels * plane_bytes;
  if (image_bytes <= kSlicesBytes) {
    return {std::clamp<int64_t>(kSlicesBytes / image_bytes, 1, batch), channels};
  }
  return {1, std::clamp<int64_t>(kSlicesBytes / plane_bytes, 1, channels)};
}

// The grad_input half of the backward with exact sums, for a contiguous
// grad_input, in the stage order of the file's comment: records keyed by
// kKeying in chunks of `plan` (sorted variant: densely or sparsely reduced
// as the plan says; atomic: PerTap keys, never sorted). The plan's thread
// order and channels-last copy play no part: an exact reduce's threads take
// destinations fastest.
template <
    int kTaps,
    gsd::Keying kKeying,
    typename key_t,
    typename Executor,
    typename scalar_t,
    typename index_t,
    int kDims>
void reduce_grad_input_exact(
    const Executor& ex,
    const gsd::BackwardArgs<scalar_t, index_t, kDims>& args,
    scalar_t* grad_input,
    const gsd::ChunkPlan& plan,
    bool atomic) {
  using Args = gsd::BackwardArgs<scalar_t, index_t, kDims>;
  using T = at::opmath_type<scalar_t>;
  constexpr int kWords = Format<T>::kWords;
  constexpr int kTapsPerPoint = gsd::taps_per_point(kTaps, kDims);
  constexpr bool kPerTap = kKeying == gsd::Keying::PerTap;
  constexpr int kItemsPerPoint = kPerTap ? kTapsPerPoint : 1;
  TORCH_INTERNAL_ASSERT(kPerTap || (plan.dense && !atomic));

  const index_t channels = args.channels;
  const index_t image_size = args.destinations_per_image();
  const int64_t image_elements = int64_t{channels} * image_size;
  const int64_t points_per_image = args.points_per_image();
  const int64_t num_points = args.num_points();
  if (num_points == 0) {
    ex.zero(grad_input, args.batch * image_elements * sizeof(scalar_t));
    return;
  }
  // Terms that may land on one element: those of one image's points.
  TORCH_CHECK(
      points_per_image * kTapsPerPoint <= kMaxTermsPerElement,
      Args::op_name(),
      " (deterministic): accumulate=\"exact\" sums at most 2^31 - 1 terms "
      "per grad_input element, but this call can put ",
      points_per_image * kTapsPerPoint,
      " on one");

  const BlockShape blocks = plan_blocks(
      args.batch,
      channels,
      image_size,
      kWords * sizeof(int64_t) + sizeof(uint32_t));
  const int64_t block_elements = blocks.images * blocks.channels * image_size;
  const auto words = ex.allocate(kWords * block_elements * sizeof(int64_t));
  const auto flags = ex.allocate(block_elements * sizeof(uint32_t));
  const auto bound = ex.allocate(sizeof(int32_t));
  int32_t* const stored_bound = gsd::as<int32_t>(bound);
  const Slices<T, index_t> slices{
      gsd::as<int64_t>(words),
      gsd::as<uint32_t>(flags),
      static_cast<index_t>(block_elements)};

  // The chunk buffers of the ordered path; the atomic variant sorts nothing.
  const int64_t chunk_points = plan.chunk_points;
  const int64_t capacity = std::min(num_points, chunk_points) * kItemsPerPoint;
  const bool sorted = !atomic;
  const bool dense = sorted && plan.dense;
  const int64_t table_entries =
      kPerTap ? args.num_destinations() : args.num_cells();
  const key_t nowhere = static_cast<key_t>(table_entries);
  const auto keys = ex.allocate(capacity * sizeof(key_t));
  const auto sorted_keys = ex.allocate(sorted ? capacity * sizeof(key_t) : 0);
  const auto ids = ex.allocate(capacity * sizeof(int32_t));
  const auto sorted_ids = ex.allocate(sorted ? capacity * sizeof(int32_t) : 0);
  const auto weights = ex.allocate(
      std::min(num_points, chunk_points) * kTapsPerPoint * sizeof(T));
  const auto gout_offsets =
      ex.allocate(std::min(num_points, chunk_points) * sizeof(index_t));
  const auto segments =
      ex.allocate(dense ? table_entries * sizeof(gsd::SegmentBounds) : 0);
  const gsd::ChunkRecords<T, index_t> chunk{
      gsd::ChunkKeys{keys.get(), /*wide=*/false},
      kKeying,
      gsd::as<int32_t>(ids),
      gsd::as<T>(weights),
      gsd::as<index_t>(gout_offsets)};
  const gsd::SortedRecords<scalar_t, index_t> records{
      gsd::as<int32_t>(sorted ? sorted_ids : ids),
      gsd::as<T>(weights),
      gsd::as<index_t>(gout_offsets),
      args.grad_output.data,
      args.grad_output.stride_c,
      gsd::log2_taps_per_point(kTaps, kDims)};
  const gsd::Divider<index_t> by_image_size(
      static_cast<std::make_unsigned_t<index_t>>(image_size));
  gsd::SegmentBounds* const segment_table = gsd::as<gsd::SegmentBounds>(segments);

  ex.zero(stored_bound, sizeof(int32_t));
  ex.for_each_row(
      args.batch * channels,
      static_cast<index_t>(
          (points_per_image + kBoundValuesPerThread - 1) / kBoundValuesPerThread),
      FindGradOutputBound<scalar_t, index_t, kDims>{
          args.grad_output, args.out_size, channels, stored_bound});

  auto over_keys = [&](const key_t* chunk_keys, const BlockLayout<index_t>& layout) {
    return ChannelRowsOverKeys<scalar_t, index_t, key_t>{
        records, chunk_keys, nowhere, by_image_size, layout, slices, stored_bound};
  };
  // One chunk of points [first_point, first_point + count) into a block's
  // slices: the point pass, then the scatter, or the sort and a reduce.
  auto reduce_chunk = [&](const BlockLayout<index_t>& layout,
                          int64_t first_point,
                          int64_t count) {
    const int32_t num_items = static_cast<int32_t>(count * kItemsPerPoint);
    ex.for_each(
        static_cast<index_t>(count),
        gsd::PointPass<kTaps, Args>{args, chunk, static_cast<index_t>(first_point)});
    if (atomic) {
      ex.for_each_row(
          layout.channels,
          num_items,
          ScatterTerms<kTapsPerPoint, kDims, scalar_t, index_t, key_t>{
              over_keys(gsd::as<key_t>(keys), layout)});
      return;
    }
    ex.stable_sort_pairs(
        gsd::as<key_t>(keys),
        gsd::as<key_t>(sorted_keys),
        gsd::as<int32_t>(ids),
        gsd::as<int32_t>(sorted_ids),
        num_items,
        gsd::bits_for(table_entries));
    if (dense) {
      ex.zero(segment_table, table_entries * sizeof(gsd::SegmentBounds));
      ex.for_each(
          num_items,
          gsd::MarkDestinationSegments{
              gsd::ChunkKeys{sorted_keys.get(), /*wide=*/false},
              num_items,
              nowhere,
              segment_table});
      // The images this chunk's points lie in (points are numbered image
      // by image).
      const int64_t swept_from = first_point / points_per_image;
      const int64_t swept_end = (first_point + count - 1) / points_per_image + 1;
      auto reduce = [&](const auto& segments_of) {
        using Segments = std::decay_t<decltype(segments_of)>;
        ex.for_each_row(
            static_cast<index_t>((swept_end - swept_from) * layout.channels),
            image_size,
            ReduceExactDense<kTapsPerPoint, kDims, Segments, scalar_t, index_t>{
                records,
                segments_of,
                layout,
                static_cast<index_t>(swept_from),
                slices,
                stored_bound});
      };
      if constexpr (kPerTap) {
        reduce(gsd::DestinationSegments<index_t>{
            records.ids, segment_table, image_size});
      } else {
        reduce(gsd::make_cell_segments(records.ids, segment_table, args.inp_size));
      }
      return;
    }
    ex.for_each_row(
        layout.channels,
        num_items,
        ReduceExactSparse<kTapsPerPoint, kDims, scalar_t, index_t, key_t>{
            over_keys(gsd::as<key_t>(sorted_keys), layout), num_items});
  };

  for (int64_t first_image = 0; first_image < args.batch;
       first_image += blocks.images) {
    const int64_t end_image =
        std::min<int64_t>(args.batch, first_image + blocks.images);
    for (int64_t first_channel = 0; first_channel < channels;
         first_channel += blocks.channels) {
      const BlockLayout<index_t> layout{
          static_cast<index_t>(first_image),
          static_cast<index_t>(first_channel),
          static_cast<index_t>(
              std::min<int64_t>(blocks.channels, channels - first_channel)),
          image_size};
      ex.zero(slices.words, kWords * block_elements * sizeof(int64_t));
      ex.zero(slices.flags, block_elements * sizeof(uint32_t));
      for (int64_t first_point = first_image * points_per_image;
           first_point < end_image * points_per_image;
           first_point += chunk_points) {
        const int64_t count =
            std::min(chunk_points, end_image * points_per_image - first_point);
        reduce_chunk(layout, first_point, count);
      }
      ex.for_each(
          static_cast<index_t>((end_image - first_image) * layout.channels * image_size),
          RoundSums<kDims, scalar_t, index_t>{
              slices,
              grad_input + (first_image * channels + first_channel) * image_size,
              stored_bound});
    }
  }
}

// grad_input with accumulate="exact" on `ex`, for checked arguments,
// following `plan`'s index width, keying and chunks (its keys must be
// 32-bit); atomic: the atomic variant, which needs a plan keyed per tap.
template <typename Executor>
void run_exact_backward(
    const Executor& ex,
    const at::native::GridSamplerBackwardCall& call,
    const gsd::BackwardPlan& plan,
    bool atomic) {
  if (call.grad_input.numel() == 0) {
    return; // no sums to make
  }
  TORCH_INTERNAL_ASSERT(!plan.index_32bit || gsd::fits_32bit_indexing(call));
  TORCH_INTERNAL_ASSERT(!atomic || plan.keying == gsd::Keying::PerTap);
  // Built for 32-bit keys only (plan_with_knobs plans them).
  TORCH_INTERNAL_ASSERT(plan.key_32bit);
  gsd::dispatch_backward_types(
      call, plan.index_32bit, [&](auto scalar, auto index, auto dims) {
        using scalar_t = decltype(scalar);
        using index_t = decltype(index);
        constexpr int kDims = decltype(dims)::value;
        const auto args = gsd::make_backward_args<scalar_t, index_t, kDims>(call);
        TORCH_CHECK(
            call.grad_input.is_contiguous(),
            decltype(args)::op_name(),
            " (deterministic): expected a contiguous grad_input");
        scalar_t* const grad_input = call.grad_input.data_ptr<scalar_t>();
        gsd::dispatch_taps_per_axis(args.interpolation_mode, [&](auto taps) {
          constexpr int kTaps = decltype(taps)::value;
          auto with_keys = [&](auto keying) {
            constexpr gsd::Keying kKeying = decltype(keying)::value;
            reduce_grad_input_exact<kTaps, kKeying, int32_t>(
                ex, args, grad_input, plan.chunks, atomic);
          };
          if constexpr (kTaps == 2) {
            if (plan.keying == gsd::Keying::PerCell) {
              with_keys(std::integral_constant<gsd::Keying, gsd::Keying::PerCell>{});
              return;
            }
          }
          TORCH_INTERNAL_ASSERT(plan.keying == gsd::Keying::PerTap);
          with_keys(std::integral_constant<gsd::Keying, gsd::Keying::PerTap>{});
        });
      });
}

} // namespace detgrid::exact
