// grad_input as the existing CUDA backward kernels (GridSampler.cu's
// grid_sampler_{2d,3d}_backward_kernel) make it, run serially on the host:
// the same helpers from the installed torch (GridSampler.cuh, UpSample.cuh),
// the same taps and terms, each term added to its element in scalar_t, as
// their atomicAdd does, in point order. Compiled with hostify's prelude (see
// prelude.h), so the helpers see what the deterministic kernel's host build
// sees: the tests compare the two where coordinates are NaN, infinite or
// huge, and stock's CPU kernel is no reference (it crashes on NaN with
// border padding, pytorch#24823).

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/GridSamplerUtils.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/native/cuda/GridSampler.cuh>
#include <ATen/native/cuda/UpSample.cuh>

#include <cmath>

namespace hostify {
namespace {

using at::native::GridSamplerInterpolation;
using at::native::GridSamplerPadding;

template <typename scalar_t>
void add_2d(
    scalar_t* grad_input_nc,
    int64_t H,
    int64_t W,
    int64_t y,
    int64_t x,
    scalar_t delta) {
  if (at::native::within_bounds_2d(y, x, H, W)) {
    scalar_t& element = grad_input_nc[y * W + x];
    element = element + delta;
  }
}

template <typename scalar_t>
void add_3d(
    scalar_t* grad_input_nc,
    int64_t D,
    int64_t H,
    int64_t W,
    int64_t z,
    int64_t y,
    int64_t x,
    scalar_t delta) {
  if (at::native::within_bounds_3d(z, y, x, D, H, W)) {
    scalar_t& element = grad_input_nc[(z * H + y) * W + x];
    element = element + delta;
  }
}

template <typename scalar_t>
void reference_2d(
    const at::Tensor& grad_output,
    const at::Tensor& grid,
    at::Tensor& grad_input,
    GridSamplerInterpolation mode,
    GridSamplerPadding padding,
    bool align) {
  const int64_t N = grad_input.size(0), C = grad_input.size(1);
  const int64_t H = grad_input.size(2), W = grad_input.size(3);
  const auto g = grid.accessor<scalar_t, 4>();
  const auto go = grad_output.accessor<scalar_t, 4>();
  scalar_t* out = grad_input.data_ptr<scalar_t>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t h = 0; h < grid.size(1); ++h) {
      for (int64_t w = 0; w < grid.size(2); ++w) {
        const scalar_t x = g[n][h][w][0];
        const scalar_t y = g[n][h][w][1];
        scalar_t gx, gy;
        const scalar_t ix = at::native::grid_sampler_compute_source_index_set_grad(
            x, W, padding, align, &gx);
        const scalar_t iy = at::native::grid_sampler_compute_source_index_set_grad(
            y, H, padding, align, &gy);
        for (int64_t c = 0; c < C; ++c) {
          const scalar_t gOut = go[n][c][h][w];
          scalar_t* nc = out + (n * C + c) * H * W;
          if (mode == GridSamplerInterpolation::Bilinear) {
            const int64_t ix_nw = static_cast<int64_t>(std::floor(ix));
            const int64_t iy_nw = static_cast<int64_t>(std::floor(iy));
            const int64_t ix_se = ix_nw + 1, iy_se = iy_nw + 1;
            add_2d(nc, H, W, iy_nw, ix_nw, (ix_se - ix) * (iy_se - iy) * gOut);
            add_2d(nc, H, W, iy_nw, ix_se, (ix - ix_nw) * (iy_se - iy) * gOut);
            add_2d(nc, H, W, iy_se, ix_nw, (ix_se - ix) * (iy - iy_nw) * gOut);
            add_2d(nc, H, W, iy_se, ix_se, (ix - ix_nw) * (iy - iy_nw) * gOut);
          } else if (mode == GridSamplerInterpolation::Nearest) {
            add_2d(
                nc,
                H,
                W,
                static_cast<int64_t>(std::nearbyint(iy)),
                static_cast<int64_t>(std::nearbyint(ix)),
                gOut);
          } else {
            const scalar_t bx = at::native::grid_sampler_unnormalize_set_grad(
                x, W, align, &gx);
            const scalar_t by = at::native::grid_sampler_unnormalize_set_grad(
                y, H, align, &gy);
            const scalar_t ix_nw = std::floor(bx);
            const scalar_t iy_nw = std::floor(by);
            scalar_t xc[4], yc[4];
            at::native::get_cubic_upsampling_coefficients<scalar_t>(xc, bx - ix_nw);
            at::native::get_cubic_upsampling_coefficients<scalar_t>(yc, by - iy_nw);
            for (int i = 0; i < 4; ++i) {
              for (int j = 0; j < 4; ++j) {
                const int px = static_cast<int>(at::native::compute_coordinates(
                    ix_nw - 1 + i, W, padding, align));
                const int py = static_cast<int>(at::native::compute_coordinates(
                    iy_nw - 1 + j, H, padding, align));
                add_2d(nc, H, W, py, px, gOut * xc[i] * yc[j]);
              }
            }
          }
        }
      }
    }
  }
}

template <typename scalar_t>
void reference_3d(
    const at::Tensor& grad_output,
    const at::Tensor& grid,
    at::Tensor& grad_input,
    GridSamplerInterpolation mode,
    GridSamplerPadding padding,
    bool align) {
  const int64_t N = grad_input.size(0), C = grad_input.size(1);
  const int64_t D = grad_input.size(2), H = grad_input.size(3);
  const int64_t W = grad_input.size(4);
  const auto g = grid.accessor<scalar_t, 5>();
  const auto go = grad_output.accessor<scalar_t, 5>();
  scalar_t* out = grad_input.data_ptr<scalar_t>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t d = 0; d < grid.size(1); ++d) {
      for (int64_t h = 0; h < grid.size(2); ++h) {
        for (int64_t w = 0; w < grid.size(3); ++w) {
          scalar_t gx, gy, gz;
          const scalar_t ix = at::native::grid_sampler_compute_source_index_set_grad(
              g[n][d][h][w][0], W, padding, align, &gx);
          const scalar_t iy = at::native::grid_sampler_compute_source_index_set_grad(
              g[n][d][h][w][1], H, padding, align, &gy);
          const scalar_t iz = at::native::grid_sampler_compute_source_index_set_grad(
              g[n][d][h][w][2], D, padding, align, &gz);
          for (int64_t c = 0; c < C; ++c) {
            const scalar_t gOut = go[n][c][d][h][w];
            scalar_t* nc = out + (n * C + c) * D * H * W;
            if (mode == GridSamplerInterpolation::Nearest) {
              add_3d(
                  nc,
                  D,
                  H,
                  W,
                  static_cast<int64_t>(std::nearbyint(iz)),
                  static_cast<int64_t>(std::nearbyint(iy)),
                  static_cast<int64_t>(std::nearbyint(ix)),
                  gOut);
              continue;
            }
            const int64_t x0 = static_cast<int64_t>(std::floor(ix));
            const int64_t y0 = static_cast<int64_t>(std::floor(iy));
            const int64_t z0 = static_cast<int64_t>(std::floor(iz));
            const int64_t x1 = x0 + 1, y1 = y0 + 1, z1 = z0 + 1;
            add_3d(nc, D, H, W, z0, y0, x0, (x1 - ix) * (y1 - iy) * (z1 - iz) * gOut);
            add_3d(nc, D, H, W, z0, y0, x1, (ix - x0) * (y1 - iy) * (z1 - iz) * gOut);
            add_3d(nc, D, H, W, z0, y1, x0, (x1 - ix) * (iy - y0) * (z1 - iz) * gOut);
            add_3d(nc, D, H, W, z0, y1, x1, (ix - x0) * (iy - y0) * (z1 - iz) * gOut);
            add_3d(nc, D, H, W, z1, y0, x0, (x1 - ix) * (y1 - iy) * (iz - z0) * gOut);
            add_3d(nc, D, H, W, z1, y0, x1, (ix - x0) * (y1 - iy) * (iz - z0) * gOut);
            add_3d(nc, D, H, W, z1, y1, x0, (x1 - ix) * (iy - y0) * (iz - z0) * gOut);
            add_3d(nc, D, H, W, z1, y1, x1, (ix - x0) * (iy - y0) * (iz - z0) * gOut);
          }
        }
      }
    }
  }
}

} // namespace

// grad_input of the existing CUDA kernel, serially, for CPU tensors of
// checked arguments.
at::Tensor existing_kernel_grad_input(
    const at::Tensor& grad_output,
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  at::Tensor grad_input = at::zeros_like(input, at::MemoryFormat::Contiguous);
  const auto mode = static_cast<GridSamplerInterpolation>(interpolation_mode);
  const auto padding = static_cast<GridSamplerPadding>(padding_mode);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "existing_kernel_grad_input", [&] {
        if (input.dim() == 4) {
          reference_2d<scalar_t>(grad_output, grid, grad_input, mode, padding, align_corners);
        } else {
          reference_3d<scalar_t>(grad_output, grid, grad_input, mode, padding, align_corners);
        }
      });
  return grad_input;
}

} // namespace hostify
