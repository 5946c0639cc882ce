#define TORCH_ASSERT_NO_OPERATORS
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/TensorBase.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/detail/KernelUtils.h>
#include <ATen/native/CanUse32BitIndexMath.h>
#include <ATen/native/GridSamplerUtils.h>
#include <c10/cuda/CUDAException.h>
#include <c10/macros/Macros.h>
#include <ATen/cuda/detail/IndexUtils.cuh>
#include <ATen/cuda/detail/TensorInfo.cuh>
#include <ATen/native/cuda/GridSampler.cuh>
#include <ATen/native/cuda/UpSample.cuh>

#include <cmath>
#include <limits>

// Note [grad_grid alone]
// The extension's grad_grid: the existing backward kernels' grid gradient,
// for every call that requests it. Upstream, deterministic mode leaves
// grad_grid to the existing kernel, which has one writer per grid point;
// the extension cannot call it, because every released launcher alerts in
// deterministic mode before it looks at output_mask. So this file forms it
// as the existing grid_sampler_{2d,3d}_backward_kernel do, from the same
// helpers, one thread per output point, and its bits never depend on
// whether grad_input is requested.
//
// The order is the existing kernels': per point, the sums start at 0 and
// take each channel in ascending order, and within a channel each tap in
// the order those kernels visit them (nw, ne, sw, se; tnw .. bse; bicubic:
// x offset outermost, then y, then z); each term is
// ((value * d weight along its axis) * the other axes' weights, x first)
// * grad_output in scalar_t, and the result is the coordinate's multiplier
// times the sum. Bilinear skips a tap out of bounds; bicubic reads 0 there.
//
// Every operation is rounded on its own: the extension builds this file
// with -fmad=false (nvcc) and -ffp-contract=off (its host build), so that
// the host and the GPU give the same bits, and the tests' reference
// (tests/stock_reference.py) models them. The existing kernels' fp32 and
// fp64 builds may contract a multiply into an add instead.
//
// Reflection's flip count is converted to int as the GPU converts it
// (reflect_set_grad), so that the host build gives the GPU's bits for
// infinite and huge coordinates too.
//
// One departure from the existing kernel: a point with a non-finite bicubic
// or tricubic coordinate has no tap (the bilinear kernel's rule,
// safe_downgrade_to_int_range), where the existing kernel would pad the
// NaN onto an edge pixel. Its coefficients are zero and its taps read 0.
// The deterministic grad_input takes the same rule for tricubic only; its
// 2-D bicubic follows the existing kernel.

namespace at::native {
namespace {

using at::cuda::detail::GET_BLOCKS;
using at::cuda::detail::getTensorInfo;
using at::cuda::detail::TensorInfo;

// Launched with kThreads per block; one resident block per SM is the floor
// ptxas plans registers for: with the block size alone, it held the Half
// kernels with 64-bit indices to 80 and 128 registers and spilled.
constexpr int kThreads = 256;

// Reflection as reflect_coordinates_set_grad reflects, with its flip count,
// floor(|in - low| / span), converted to int as the GPU converts it: past
// int's range the GPU saturates (INT_MAX: odd flips; NaN: 0), where C++
// leaves static_cast<int> undefined (x86 gives INT_MIN: even), so that the
// host build gives the GPU's bits for infinite and huge coordinates too.
template <typename scalar_t>
__device__ scalar_t reflect_set_grad(
    scalar_t in,
    int twice_low,
    int twice_high,
    scalar_t* grad_in) {
  if (twice_low == twice_high) {
    *grad_in = static_cast<scalar_t>(0);
    return static_cast<scalar_t>(0);
  }
  const scalar_t low = static_cast<scalar_t>(twice_low) / 2;
  const scalar_t span = static_cast<scalar_t>(twice_high - twice_low) / 2;
  in = in - low;
  const bool negative = in < static_cast<scalar_t>(0);
  if (negative) {
    in = -in;
  }
  const scalar_t extra = ::fmod(in, span);
  const auto flips = ::floor(in / span);
  const bool odd =
      flips >= 2147483648.0 || (flips >= 0 && static_cast<int>(flips) % 2 != 0);
  *grad_in = static_cast<scalar_t>(negative != odd ? -1 : 1);
  return odd ? span - extra + low : extra + low;
}

// Reflection by the image's bounds, as the existing helpers call it.
template <typename scalar_t>
__device__ scalar_t reflect_in_image_set_grad(
    scalar_t in,
    int size,
    bool align_corners,
    scalar_t* grad_in) {
  return align_corners ? reflect_set_grad(in, 0, 2 * (size - 1), grad_in)
                       : reflect_set_grad(in, -1, 2 * size - 1, grad_in);
}

// grid_sampler_compute_source_index_set_grad, reflecting by
// reflect_set_grad.
template <typename scalar_t>
__device__ scalar_t source_index_set_grad(
    scalar_t coord,
    int size,
    GridSamplerPadding padding_mode,
    bool align_corners,
    scalar_t* grad_in) {
  if (padding_mode != GridSamplerPadding::Reflection) {
    return grid_sampler_compute_source_index_set_grad(
        coord, size, padding_mode, align_corners, grad_in);
  }
  scalar_t grad_refl, grad_clip;
  coord =
      grid_sampler_unnormalize_set_grad(coord, size, align_corners, grad_in);
  coord = reflect_in_image_set_grad(coord, size, align_corners, &grad_refl);
  coord = clip_coordinates_set_grad(coord, size, &grad_clip);
  *grad_in = (*grad_in) * grad_refl * grad_clip;
  return safe_downgrade_to_int_range(coord);
}

// compute_coordinates, reflecting by reflect_set_grad.
template <typename scalar_t>
__device__ scalar_t padded_coordinate(
    scalar_t coord,
    int size,
    GridSamplerPadding padding_mode,
    bool align_corners) {
  if (padding_mode != GridSamplerPadding::Reflection) {
    return compute_coordinates(coord, size, padding_mode, align_corners);
  }
  scalar_t grad_refl;
  coord = reflect_in_image_set_grad(coord, size, align_corners, &grad_refl);
  return safe_downgrade_to_int_range(clip_coordinates(coord, size));
}

// Bilinear weights of the low and the high tap along one axis, as the
// existing kernel forms them: (i_se - i) and (i - i_nw) in scalar_t.
template <typename scalar_t, typename index_t>
struct LinearAxis {
  index_t low;
  scalar_t weight[2];
};

// The downgrade lets 2^31 through in float, where converting it to int is
// undefined on the host (the GPU saturates): a coordinate past index_t's
// range takes its largest low tap but one, which, like the GPU's, leaves
// both taps out of bounds.
template <typename scalar_t, typename index_t>
__device__ LinearAxis<scalar_t, index_t> linear_axis(scalar_t coord) {
  constexpr index_t kLast = std::numeric_limits<index_t>::max();
  const scalar_t floored = ::floor(coord);
  const index_t low = floored < static_cast<scalar_t>(kLast)
      ? static_cast<index_t>(floored)
      : kLast - 1;
  return {low, {(low + 1) - coord, coord - low}};
}

// One bicubic axis: its taps' pixels (-1 outside the input) and their
// coefficients and d coefficient / d coordinate. The pixels are found as
// get_value_bounded finds them (compute_coordinates, then a cast to int);
// that helper offsets in int, which 64-bit indexing outgrows, and has no
// 3-D twin. An unusable axis (see the Note) gets zeros and no pixel.
template <typename scalar_t>
struct CubicAxis {
  int index[4];
  scalar_t coeffs[4];
  scalar_t coeffs_grad[4];
};

template <typename scalar_t>
__device__ CubicAxis<scalar_t> cubic_axis(
    scalar_t coord,
    int size,
    bool usable,
    GridSamplerPadding padding_mode,
    bool align_corners) {
  CubicAxis<scalar_t> axis;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    axis.index[i] = -1;
    axis.coeffs[i] = axis.coeffs_grad[i] = static_cast<scalar_t>(0);
  }
  if (!usable) {
    return axis;
  }
  const scalar_t nw = ::floor(coord);
  get_cubic_upsampling_coefficients<scalar_t>(axis.coeffs, coord - nw);
  get_cubic_coefficients_grad<scalar_t>(axis.coeffs_grad, coord - nw);
  // One copy of the padding, most of the kernel's code, for the four taps;
  // the results go by selects, as an array indexed at run time would live
  // in local memory.
#pragma unroll 1
  for (int i = 0; i < 4; ++i) {
    // A padded tap is a whole number or the downgrade's -100, but one at
    // 2^31 passes the downgrade, where a float-to-int conversion is
    // undefined on the host: the bounds are tested before converting.
    const scalar_t padded =
        padded_coordinate(nw - 1 + i, size, padding_mode, align_corners);
    const int index = padded >= 0 && padded < static_cast<scalar_t>(size)
        ? static_cast<int>(padded)
        : -1;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      axis.index[k] = k == i ? index : axis.index[k];
    }
  }
  return axis;
}

// values[i] for an i known only at run time, by selects: an array indexed
// at run time would live in local memory.
template <typename T>
__device__ T pick(const T (&values)[4], int i) {
  return i == 0 ? values[0]
      : i == 1  ? values[1]
      : i == 2  ? values[2]
                : values[3];
}

template <typename scalar_t>
__device__ bool is_finite(scalar_t x) {
  return ::isfinite(static_cast<at::opmath_type<scalar_t>>(x));
}

template <typename scalar_t, typename index_t>
C10_LAUNCH_BOUNDS_2(kThreads, 1)
__global__ void grid_sampler_2d_grid_gradient_kernel(
    const index_t nthreads,
    TensorInfo<const scalar_t, index_t> grad_output,
    TensorInfo<const scalar_t, index_t> input,
    TensorInfo<const scalar_t, index_t> grid,
    scalar_t* grad_grid,
    const GridSamplerInterpolation interpolation_mode,
    const GridSamplerPadding padding_mode,
    const bool align_corners) {
  const index_t C = input.sizes[1];
  const index_t inp_H = input.sizes[2];
  const index_t inp_W = input.sizes[3];
  const index_t out_H = grid.sizes[1];
  const index_t out_W = grid.sizes[2];
  const index_t inp_sC = input.strides[1];
  const index_t inp_sH = input.strides[2];
  const index_t inp_sW = input.strides[3];
  const index_t gOut_sC = grad_output.strides[1];
  CUDA_KERNEL_LOOP_TYPE(index, nthreads, index_t) {
    const index_t w = index % out_W;
    const index_t h = (index / out_W) % out_H;
    const index_t n = index / (out_H * out_W);
    const index_t grid_offset =
        n * grid.strides[0] + h * grid.strides[1] + w * grid.strides[2];
    const scalar_t x = grid.data[grid_offset];
    const scalar_t y = grid.data[grid_offset + grid.strides[3]];
    const scalar_t* const gOut_ptr = grad_output.data +
        n * grad_output.strides[0] + h * grad_output.strides[2] +
        w * grad_output.strides[3];
    const scalar_t* const inp_ptr_N = input.data + n * input.strides[0];
    scalar_t* const gGrid_ptr = grad_grid + 2 * index;
    if (interpolation_mode == GridSamplerInterpolation::Nearest) {
      // Piecewise constant: written without reading grad_output.
      gGrid_ptr[0] = static_cast<scalar_t>(0);
      gGrid_ptr[1] = static_cast<scalar_t>(0);
      continue;
    }
    scalar_t gix_mult, giy_mult;
    scalar_t gix = static_cast<scalar_t>(0);
    scalar_t giy = static_cast<scalar_t>(0);
    if (interpolation_mode == GridSamplerInterpolation::Bilinear) {
      const auto ax = linear_axis<scalar_t, index_t>(source_index_set_grad(
          x, inp_W, padding_mode, align_corners, &gix_mult));
      const auto ay = linear_axis<scalar_t, index_t>(source_index_set_grad(
          y, inp_H, padding_mode, align_corners, &giy_mult));
      for (index_t c = 0; c < C; ++c) {
        const scalar_t gOut = gOut_ptr[c * gOut_sC];
        const scalar_t* const inp_ptr_NC = inp_ptr_N + c * inp_sC;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const int dx = t & 1;
          const int dy = t >> 1;
          const index_t ix = ax.low + dx;
          const index_t iy = ay.low + dy;
          if (!within_bounds_2d(iy, ix, inp_H, inp_W)) {
            continue;
          }
          const scalar_t val = inp_ptr_NC[iy * inp_sH + ix * inp_sW];
          const scalar_t gx = val * ay.weight[dy] * gOut;
          const scalar_t gy = val * ax.weight[dx] * gOut;
          gix = dx ? gix + gx : gix - gx;
          giy = dy ? giy + gy : giy - gy;
        }
      }
    } else {
      const scalar_t ix =
          grid_sampler_unnormalize_set_grad(x, inp_W, align_corners, &gix_mult);
      const scalar_t iy =
          grid_sampler_unnormalize_set_grad(y, inp_H, align_corners, &giy_mult);
      const bool usable = is_finite(ix) && is_finite(iy);
      const auto ax =
          cubic_axis(ix, inp_W, usable, padding_mode, align_corners);
      const auto ay =
          cubic_axis(iy, inp_H, usable, padding_mode, align_corners);
      for (index_t c = 0; c < C; ++c) {
        const scalar_t gOut = gOut_ptr[c * gOut_sC];
        const scalar_t* const inp_ptr_NC = inp_ptr_N + c * inp_sC;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const bool inside = ax.index[i] >= 0 && ay.index[j] >= 0;
            const scalar_t val = inside
                ? inp_ptr_NC[ay.index[j] * inp_sH + ax.index[i] * inp_sW]
                : static_cast<scalar_t>(0);
            gix -= val * ax.coeffs_grad[i] * ay.coeffs[j] * gOut;
            giy -= val * ay.coeffs_grad[j] * ax.coeffs[i] * gOut;
          }
        }
      }
    }
    gGrid_ptr[0] = gix_mult * gix;
    gGrid_ptr[1] = giy_mult * giy;
  }
}

template <typename scalar_t, typename index_t>
C10_LAUNCH_BOUNDS_2(kThreads, 1)
__global__ void grid_sampler_3d_grid_gradient_kernel(
    const index_t nthreads,
    TensorInfo<const scalar_t, index_t> grad_output,
    TensorInfo<const scalar_t, index_t> input,
    TensorInfo<const scalar_t, index_t> grid,
    scalar_t* grad_grid,
    const GridSamplerInterpolation interpolation_mode,
    const GridSamplerPadding padding_mode,
    const bool align_corners) {
  const index_t C = input.sizes[1];
  const index_t inp_D = input.sizes[2];
  const index_t inp_H = input.sizes[3];
  const index_t inp_W = input.sizes[4];
  const index_t out_D = grid.sizes[1];
  const index_t out_H = grid.sizes[2];
  const index_t out_W = grid.sizes[3];
  const index_t inp_sC = input.strides[1];
  const index_t inp_sD = input.strides[2];
  const index_t inp_sH = input.strides[3];
  const index_t inp_sW = input.strides[4];
  const index_t gOut_sC = grad_output.strides[1];
  CUDA_KERNEL_LOOP_TYPE(index, nthreads, index_t) {
    const index_t w = index % out_W;
    const index_t h = (index / out_W) % out_H;
    const index_t d = (index / (out_H * out_W)) % out_D;
    const index_t n = index / (out_D * out_H * out_W);
    const index_t grid_offset = n * grid.strides[0] + d * grid.strides[1] +
        h * grid.strides[2] + w * grid.strides[3];
    const index_t grid_sCoor = grid.strides[4];
    const scalar_t x = grid.data[grid_offset];
    const scalar_t y = grid.data[grid_offset + grid_sCoor];
    const scalar_t z = grid.data[grid_offset + 2 * grid_sCoor];
    const scalar_t* const gOut_ptr = grad_output.data +
        n * grad_output.strides[0] + d * grad_output.strides[2] +
        h * grad_output.strides[3] + w * grad_output.strides[4];
    const scalar_t* const inp_ptr_N = input.data + n * input.strides[0];
    scalar_t* const gGrid_ptr = grad_grid + 3 * index;
    if (interpolation_mode == GridSamplerInterpolation::Nearest) {
      gGrid_ptr[0] = static_cast<scalar_t>(0);
      gGrid_ptr[1] = static_cast<scalar_t>(0);
      gGrid_ptr[2] = static_cast<scalar_t>(0);
      continue;
    }
    scalar_t gix_mult, giy_mult, giz_mult;
    scalar_t gix = static_cast<scalar_t>(0);
    scalar_t giy = static_cast<scalar_t>(0);
    scalar_t giz = static_cast<scalar_t>(0);
    if (interpolation_mode == GridSamplerInterpolation::Bilinear) {
      const auto ax = linear_axis<scalar_t, index_t>(source_index_set_grad(
          x, inp_W, padding_mode, align_corners, &gix_mult));
      const auto ay = linear_axis<scalar_t, index_t>(source_index_set_grad(
          y, inp_H, padding_mode, align_corners, &giy_mult));
      const auto az = linear_axis<scalar_t, index_t>(source_index_set_grad(
          z, inp_D, padding_mode, align_corners, &giz_mult));
      for (index_t c = 0; c < C; ++c) {
        const scalar_t gOut = gOut_ptr[c * gOut_sC];
        const scalar_t* const inp_ptr_NC = inp_ptr_N + c * inp_sC;
        // tnw, tne, tsw, tse, bnw, bne, bsw, bse
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          const int dx = t & 1;
          const int dy = (t >> 1) & 1;
          const int dz = t >> 2;
          const index_t ix = ax.low + dx;
          const index_t iy = ay.low + dy;
          const index_t iz = az.low + dz;
          if (!within_bounds_3d(iz, iy, ix, inp_D, inp_H, inp_W)) {
            continue;
          }
          const scalar_t val =
              inp_ptr_NC[iz * inp_sD + iy * inp_sH + ix * inp_sW];
          const scalar_t gx = val * ay.weight[dy] * az.weight[dz] * gOut;
          const scalar_t gy = val * ax.weight[dx] * az.weight[dz] * gOut;
          const scalar_t gz = val * ax.weight[dx] * ay.weight[dy] * gOut;
          gix = dx ? gix + gx : gix - gx;
          giy = dy ? giy + gy : giy - gy;
          giz = dz ? giz + gz : giz - gz;
        }
      }
    } else {
      const scalar_t ix =
          grid_sampler_unnormalize_set_grad(x, inp_W, align_corners, &gix_mult);
      const scalar_t iy =
          grid_sampler_unnormalize_set_grad(y, inp_H, align_corners, &giy_mult);
      const scalar_t iz =
          grid_sampler_unnormalize_set_grad(z, inp_D, align_corners, &giz_mult);
      const bool usable = is_finite(ix) && is_finite(iy) && is_finite(iz);
      const auto ax =
          cubic_axis(ix, inp_W, usable, padding_mode, align_corners);
      const auto ay =
          cubic_axis(iy, inp_H, usable, padding_mode, align_corners);
      const auto az =
          cubic_axis(iz, inp_D, usable, padding_mode, align_corners);
      for (index_t c = 0; c < C; ++c) {
        const scalar_t gOut = gOut_ptr[c * gOut_sC];
        const scalar_t* const inp_ptr_NC = inp_ptr_N + c * inp_sC;
        // 64 taps of three terms each: the x offset's loop stays rolled
        // (unrolled, the nest would multiply the kernel's code for no fewer
        // operations), its values picked once per offset.
#pragma unroll 1
        for (int i = 0; i < 4; ++i) {
          const int x_index = pick(ax.index, i);
          const scalar_t x_coeff = pick(ax.coeffs, i);
          const scalar_t x_coeff_grad = pick(ax.coeffs_grad, i);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const bool inside =
                  x_index >= 0 && ay.index[j] >= 0 && az.index[k] >= 0;
              const scalar_t val = inside
                  ? inp_ptr_NC
                        [az.index[k] * inp_sD + ay.index[j] * inp_sH +
                         x_index * inp_sW]
                  : static_cast<scalar_t>(0);
              gix -= val * x_coeff_grad * ay.coeffs[j] * az.coeffs[k] * gOut;
              giy -= val * ay.coeffs_grad[j] * x_coeff * az.coeffs[k] * gOut;
              giz -= val * az.coeffs_grad[k] * x_coeff * ay.coeffs[j] * gOut;
            }
          }
        }
      }
    }
    gGrid_ptr[0] = gix_mult * gix;
    gGrid_ptr[1] = giy_mult * giy;
    gGrid_ptr[2] = giz_mult * giz;
  }
}

template <typename scalar_t, typename index_t>
void grid_gradient(
    const TensorBase& grad_grid,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    GridSamplerInterpolation interpolation_mode,
    GridSamplerPadding padding_mode,
    bool align_corners) {
  const int64_t count = grid.numel() / grid.size(-1);
  const auto kernel = input.dim() == 4
      ? grid_sampler_2d_grid_gradient_kernel<scalar_t, index_t>
      : grid_sampler_3d_grid_gradient_kernel<scalar_t, index_t>;
  kernel<<<
      GET_BLOCKS(count, kThreads),
      kThreads,
      0,
      at::cuda::getCurrentCUDAStream()>>>(
      static_cast<index_t>(count),
      getTensorInfo<const scalar_t, index_t>(grad_output),
      getTensorInfo<const scalar_t, index_t>(input),
      getTensorInfo<const scalar_t, index_t>(grid),
      grad_grid.mutable_data_ptr<scalar_t>(),
      interpolation_mode,
      padding_mode,
      align_corners);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace

// grad_grid of grid_sampler_2d_backward (4-D input) or
// grid_sampler_3d_backward (5-D input), see Note [grad_grid alone]:
// one launch, one thread per grid point. grad_grid must be contiguous with
// the grid's sizes; every element of it is written.
void launch_grid_sampler_grid_gradient_kernel(
    const TensorBase& grad_grid,
    const TensorBase& grad_output,
    const TensorBase& input,
    const TensorBase& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  TORCH_INTERNAL_ASSERT(grad_grid.is_contiguous());
  if (grad_grid.numel() == 0) {
    return;
  }
  const bool index_32bit = canUse32BitIndexMath(input) &&
      canUse32BitIndexMath(grid) && canUse32BitIndexMath(grad_output);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      ScalarType::Half,
      ScalarType::BFloat16,
      input.scalar_type(),
      "grid_sampler_grid_gradient_cuda",
      [&] {
        const auto mode =
            static_cast<GridSamplerInterpolation>(interpolation_mode);
        const auto padding = static_cast<GridSamplerPadding>(padding_mode);
        if (index_32bit) {
          grid_gradient<scalar_t, int32_t>(
              grad_grid,
              grad_output,
              input,
              grid,
              mode,
              padding,
              align_corners);
        } else {
          grid_gradient<scalar_t, int64_t>(
              grad_grid,
              grad_output,
              input,
              grid,
              mode,
              padding,
              align_corners);
        }
      });
}

} // namespace at::native
