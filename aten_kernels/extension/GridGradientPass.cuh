#pragma once
// The grid gradient alone, for a call that requests grad_grid and not
// grad_input, written once over an executor (the pipeline's), so that the
// host runs what CUDA runs.
//
// Why the extension needs it: stock's CUDA kernel already writes grad_grid
// once per point, but every released torch alerts in
// launch_grid_sampler_{2d,3d}_backward_kernel before it looks at
// output_mask, so in deterministic mode stock cannot serve such a call (see
// routing.h). Upstream needs none of this: there the deterministic branch
// comes before the alert, and stock's kernel keeps serving these calls.
// The arithmetic is stock's (point_grid_gradient), the same the point pass
// uses when grad_input is requested too, so grad_grid's bits never depend on
// output_mask[0].

#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>

namespace detgrid::grid_only {

namespace gsd = at::native::grid_sampler_deterministic;

// One thread per point: its taps, then its grid gradient.
template <int kTaps, typename Args>
struct GridGradientPass {
  using index_t = typename Args::index_type;
  Args args;

  C10_HOST_DEVICE void operator()(index_t point) const {
    index_t n;
    gsd::Spatial<index_t, Args::dims> out_position;
    const auto taps =
        gsd::locate_point_taps<kTaps>(args, point, &n, &out_position);
    gsd::write_grid_gradient(args, taps, n, out_position);
  }
};

// Writes every element of call.grad_grid (defined and contiguous) for a
// call of checked arguments with output_mask {false, true}; grad_input is
// not touched. Nearest sampling's grid gradient is zero: a fill, no pass.
template <typename Executor>
void run_grid_gradient_pass(
    const Executor& ex,
    const at::native::GridSamplerBackwardCall& call) {
  TORCH_INTERNAL_ASSERT(!call.output_mask[0] && call.output_mask[1]);
  TORCH_INTERNAL_ASSERT(call.grad_grid.is_contiguous());
  if (call.grad_grid.numel() == 0) {
    return;
  }
  gsd::dispatch_backward_types(
      call,
      gsd::fits_32bit_indexing(call),
      [&](auto scalar, auto index, auto dims) {
        using scalar_t = decltype(scalar);
        using index_t = decltype(index);
        constexpr int kDims = decltype(dims)::value;
        const auto args = gsd::make_backward_args<scalar_t, index_t, kDims>(
            call.grad_grid,
            call.grad_output,
            call.input,
            call.grid,
            call.interpolation_mode,
            call.padding_mode,
            call.align_corners,
            /*grid_grad_requested=*/true);
        gsd::dispatch_taps_per_axis(args.interpolation_mode, [&](auto taps) {
          constexpr int kTaps = decltype(taps)::value;
          if constexpr (kTaps == 1) {
            ex.zero(call.grad_grid.data_ptr(), call.grad_grid.nbytes());
          } else {
            ex.for_each(
                args.num_points(),
                GridGradientPass<kTaps, std::decay_t<decltype(args)>>{args});
          }
        });
      });
}

} // namespace detgrid::grid_only
