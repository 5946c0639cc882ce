#pragma once
// torch's ATen/native/cuda/GridSampler.cuh, plus the coordinate helpers that
// torch 2.15 added to it and the deterministic backward's tricubic taps call
// (resolve_cubic_taps and the compute_coordinates_sized it pads with), for the
// torch releases before 2.15 that lack them. Not part of the upstream patch:
// the kit puts this folder ahead of torch's headers in its own builds (the
// extension's CUDA build, the host build, the nvcc checks, and the in-tree
// check's compile of the core against the v2.6.0 stand-in tree), so that the
// core's file compiles unchanged on every release the kit supports; against
// 2.15 and later it adds nothing, and torch's own helpers are the ones called.
#include_next <ATen/native/cuda/GridSampler.cuh>

// The release: from <torch/version.h>, which wheels ship and a CMake build
// generates; a source tree that was never configured has none, and its compile
// must then pass TORCH_VERSION_MAJOR and TORCH_VERSION_MINOR (the in-tree check,
// detgrid.kit.intree_compile, passes them from the tree's version.txt).
#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif
#if !defined(TORCH_VERSION_MAJOR) || !defined(TORCH_VERSION_MINOR)
#error "detgrid compat GridSampler.cuh: no <torch/version.h>; define TORCH_VERSION_MAJOR and TORCH_VERSION_MINOR (the tree's version.txt)"
#endif

#include <cmath>
#include <limits>

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 15

#include <ATen/native/cuda/UpSample.cuh>

namespace at::native {

// compute_coordinates with the extent in index_t: border clips to
// [0, size - 1]; reflection folds into [low, low + span] (low 0 or -0.5,
// span size - 1 or size by align_corners), the fold's parity from fmod, so no
// float is converted to an integer, then clips. No downgrade to int's range.
template <typename scalar_t, typename index_t>
__forceinline__ __device__ scalar_t compute_coordinates_sized(
    scalar_t coord,
    index_t size,
    GridSamplerPadding padding_mode,
    bool align_corners) {
  const scalar_t upper = static_cast<scalar_t>(size - 1);
  if (padding_mode == GridSamplerPadding::Border) {
    coord = ::min(upper, ::max(coord, static_cast<scalar_t>(0)));
  } else if (padding_mode == GridSamplerPadding::Reflection) {
    const scalar_t low =
        align_corners ? static_cast<scalar_t>(0) : static_cast<scalar_t>(-0.5);
    const scalar_t span =
        static_cast<scalar_t>(align_corners ? size - 1 : size);
    if (span == 0) {
      coord = 0;
    } else {
      const scalar_t distance = ::fabs(coord - low);
      const scalar_t rest = ::fmod(distance, span);
      const bool flipped =
          ::fmod(::floor(distance / span), static_cast<scalar_t>(2)) != 0;
      coord = flipped ? span - rest + low : rest + low;
    }
    coord = ::min(upper, ::max(coord, static_cast<scalar_t>(0)));
  }
  return coord;
}

// The bicubic taps of one axis at source coordinate `coord`: the cubic
// convolution coefficients of offsets -1 .. 2 from floor(coord) (and their
// derivatives when coeffs_grad is not null), and each tap's padded index, -1
// where the tap falls outside [0, size) or is not finite.
template <typename scalar_t, typename index_t>
__forceinline__ __device__ void resolve_cubic_taps(
    scalar_t coord,
    index_t size,
    GridSamplerPadding padding_mode,
    bool align_corners,
    scalar_t coeffs[4],
    scalar_t* coeffs_grad,
    index_t indices[4]) {
  const scalar_t floor_coord = ::floor(coord);
  get_cubic_upsampling_coefficients<scalar_t>(coeffs, coord - floor_coord);
  if (coeffs_grad != nullptr) {
    get_cubic_coefficients_grad<scalar_t>(coeffs_grad, coord - floor_coord);
  }
  // Past index_t's largest value (NaN included) no conversion is made.
  const scalar_t largest =
      static_cast<scalar_t>(std::numeric_limits<index_t>::max());
#pragma unroll 4
  for (int k = 0; k < 4; ++k) {
    const scalar_t padded = compute_coordinates_sized(
        floor_coord - 1 + k, size, padding_mode, align_corners);
    const bool convertible = padded >= 0 && padded < largest;
    const index_t index = convertible ? static_cast<index_t>(padded) : -1;
    indices[k] = index < size ? index : -1;
  }
}

} // namespace at::native

#endif
