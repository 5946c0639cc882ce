#pragma once
#include <ATen/core/Tensor.h>
#include "BackwardCall.h"

#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>

#include <array>
#include <cstdint>
#include <tuple>

namespace detgrid {

// The extension's grad_input for the call's CPU tensors (2-D for a 4-D
// input, 3-D for a 5-D one), as the pipeline's
// at::native::launch_grid_sampler_backward_deterministic_kernel writes it
// (every element, contiguous); grad_grid is the caller's (GridGradient.cu).
// The caller checks the arguments as for those, and makes the plan;
// grain_size is at::parallel_for's (0 for the default).
void grid_sampler_backward_executor(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan,
    int64_t grain_size = 0);

// What one call of the CUDA pipeline does, counted exactly by running the
// pipeline with an executor that runs nothing: the tensors need only their
// sizes, strides and dtype (meta tensors will do). A CUB call counts as one
// launch; workspace_bytes is detgrid's own buffers, sort_scratch_bytes an
// estimate of CUB's scratch for the largest sort: its own copy of the keys
// and payloads (the histograms and tile states beyond it are kept within
// kSortScratchSlack of the pipeline's budget).
struct WorkCounters {
  int64_t launches = 0;
  int64_t chunks = 0;
  int64_t launches_per_chunk = 0; // those of the first chunk
  int64_t items_sorted = 0;
  int64_t key_bits = 0; // bits the radix sort looks at
  int64_t key_bytes = 0; // sizeof the sort key
  int64_t workspace_bytes = 0;
  int64_t sort_scratch_bytes = 0;
  // grad_input elements the dense reduces' threads visit, over all chunks
  // (the sparse reduction visits only its runs, after a zero fill).
  int64_t elements_swept = 0;
  // Integer atomics issued at most (accumulate="exact" only; the ordered
  // pipeline has none): per term of the atomic variant, the words a term
  // can span; one per thread of the exact pre-pass.
  int64_t atomics = 0;
  // Record merges of the ordered pipeline's reduces, summed over channel
  // passes: per chunk, its sorted items (those that land nowhere too) times
  // the threads that walk a destination's records, one per channel, or one
  // per channel group (ReduceDenseChannelGroups). The hot fold walks a hot
  // destination's records in the reduce's stead, with its passes. -1 for an
  // exact accumulation.
  int64_t channel_merges = 0;
  // The most words of a dense chunk's segment table that one thread of a
  // point pass zero-fills (PointFills), over the chunks; 0 where no point
  // pass fills it (the executor's zero fill does).
  int64_t longest_fill = 0;
};

// What launch_grid_sampler_grid_gradient_kernel launches for a call with
// output_mask[1] (launches only), counted by running its host build with
// hostify's launches counted, not run: the tensors need only their sizes,
// strides and dtype, and a data pointer.
WorkCounters count_grid_gradient_work(
    const detgrid::BackwardCall& call);

// grad_input's pipeline alone: the grid gradient's launches are
// count_grid_gradient_work's.
WorkCounters count_backward_work(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan);

// The most records, or stored partials, one thread of the pipeline's
// reduces folds in sequence for this call, measured by running it on the
// host (grad_input requested; the data of the grid decide it).
int64_t longest_fold(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan);

// accumulate="exact" (aten_kernels/extension/exact/): the same contracts,
// with order-free sums; atomic selects the variant without a sort, which
// needs a plan keyed per tap.
void grid_sampler_backward_exact_executor(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan,
    bool atomic,
    int64_t grain_size = 0);

WorkCounters count_exact_backward_work(
    const detgrid::BackwardCall& call,
    const at::native::grid_sampler_deterministic::BackwardPlan& plan,
    bool atomic);

// Tests read the shared math's taps through this: for each point of `grid`
// ((points, dims) coordinates in grid order, x first) over an input of
// spatial size `input_size` (outermost first), every tap's position
// ((points, taps, dims), outermost first), whether it is in bounds
// ((points, taps)) and the weight a record of it carries ((points, taps),
// opmath dtype), as the point pass computes them.
std::tuple<at::Tensor, at::Tensor, at::Tensor> point_taps(
    const at::Tensor& grid,
    at::IntArrayRef input_size,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners);

} // namespace detgrid
