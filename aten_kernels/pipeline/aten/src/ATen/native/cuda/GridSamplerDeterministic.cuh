#pragma once
// Per-point math and the canonical reduction order of the deterministic
// grid_sampler backward (GridSamplerDeterministic.cu: pipeline, invariants).
//
// Everything here is C10_HOST_DEVICE: the CUDA kernels and a host executor
// run the same functions, every floating-point operation rounded explicitly
// (no FMA contraction), so both give the same bits in every dtype.
//
// Taps and weights are stock's CUDA backward's for every finite coordinate.
// Its coordinate helpers compute in scalar_t, which Half and BFloat16 round
// after every operation; the *_s operations below do the same. A float to
// int conversion is the GPU's (gpu_float_to_int). Residual: stock's fp32
// and fp64 builds may contract unnormalize into an FMA (about an ulp).
//
// Non-finite coordinates get no tap, stock's bilinear backward rule
// (safe_downgrade_to_int_range), after Border clamps +-Inf to the border.
// Stock's other paths differ on NaN (its forward's clip turns it into 0,
// its bicubic backward would scatter NaN onto an edge pixel); this takes
// the bilinear backward's rule in every mode.

#include <ATen/OpMathType.h>
#include <ATen/core/TensorBase.h>
#include <ATen/native/cuda/GridSamplerDeterministic.h>
#include <ATen/cuda/detail/IntegerDivider.cuh> // [stack: index32]
#include <ATen/native/GridSamplerUtils.h>
#include <c10/macros/Macros.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

// Loops over axes and taps unroll on the GPU, or their arrays spill to local
// memory; ROLLED keeps one rolled where unrolling only multiplies its code.
// GridSamplerDeterministicPipeline.cuh undefines both.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define GRID_SAMPLER_DET_UNROLL _Pragma("unroll")
#define GRID_SAMPLER_DET_ROLLED _Pragma("unroll 1")
#else
#define GRID_SAMPLER_DET_UNROLL
#define GRID_SAMPLER_DET_ROLLED
#endif

namespace at::native::grid_sampler_deterministic {

using detail::GridSamplerInterpolation;
using detail::GridSamplerPadding;

// A tile is a fixed run of points. Partial sums never straddle a tile and
// chunks are whole tiles, so the chunk size cannot change the sums' order.
constexpr int kTilePointsLog2 = 12;
constexpr int64_t kTilePoints = int64_t{1} << kTilePointsLog2;
// Longest run of one destination's records summed into a single partial.
constexpr int64_t kRecordsPerPartial = 256;
// What one chunk's buffers may take, CUB's sort scratch included.
constexpr int64_t kWorkspaceBytes = int64_t{64} << 20;
// Bilinear and nearest coordinates become integers only inside this range;
// padded first, only a zeros-padded one far outside the image lies beyond.
constexpr double kMaxSafeCoordinate = 1099511627776.0; // 2^40
// Stock converts padded positions and flip counts to int; the GPU's
// conversion saturates at int's bounds, +-2^31 in any floating type.
constexpr double kIntRange = 2147483648.0; // 2^31

// Explicitly rounded products and quotients: nvcc contracts a * b + c into
// an FMA, the host (-ffp-contract=off) does not, and a product rounded by
// __fmul_rn never joins one; __fdiv_rn rounds whatever -prec-div says.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
C10_HOST_DEVICE inline float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
C10_HOST_DEVICE inline float div_rn(float a, float b) {
  return __fdiv_rn(a, b);
}
C10_HOST_DEVICE inline double mul_rn(double a, double b) {
  return __dmul_rn(a, b);
}
C10_HOST_DEVICE inline double div_rn(double a, double b) {
  return __ddiv_rn(a, b);
}
#else
template <typename T>
inline T mul_rn(T a, T b) {
  return a * b;
}
template <typename T>
inline T div_rn(T a, T b) {
  return a / b;
}
#endif

// An opmath_type result rounded to scalar_t, as c10::Half and c10::BFloat16
// round every result of their arithmetic; the identity for float and double.
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T round_to_scalar(T x) {
  if constexpr (std::is_same_v<scalar_t, T>) {
    return x;
  } else {
    return static_cast<T>(static_cast<scalar_t>(x));
  }
}

// scalar_t arithmetic carried out in T = opmath_type<scalar_t>.
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T add_s(T a, T b) {
  return round_to_scalar<scalar_t>(a + b);
}
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T sub_s(T a, T b) {
  return round_to_scalar<scalar_t>(a - b);
}
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T mul_s(T a, T b) {
  return round_to_scalar<scalar_t>(mul_rn(a, b));
}
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T div_s(T a, T b) {
  return round_to_scalar<scalar_t>(div_rn(a, b));
}
// scalar_t's value of an integer (static_cast<scalar_t>(int) in stock).
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T integer_s(int64_t i) {
  return round_to_scalar<scalar_t>(static_cast<T>(i));
}

// A grid coordinate in [-1, 1] in pixel units, computed in opmath and
// returned as scalar_t, as stock does.
// Not stock's unnormalize: __device__ only, and nvcc may fuse it to an FMA.
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T
unnormalize(T coord, int64_t size, bool align_corners) {
  const T one = static_cast<T>(1);
  const T half = static_cast<T>(0.5);
  const T extent = static_cast<T>(align_corners ? size - 1 : size);
  if (align_corners) {
    return round_to_scalar<scalar_t>(mul_rn(mul_rn(coord + one, half), extent));
  }
  return round_to_scalar<scalar_t>(
      mul_rn(mul_rn(coord + one, extent) - one, half));
}

// Clamps to [0, size - 1] (size - 1 as scalar_t holds it); NaN stays NaN.
// Not stock's clip_coordinates_set_grad: __device__ only.
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T clip(T coord, int64_t size) {
  const T upper = integer_s<scalar_t, T>(size - 1);
  if (coord <= static_cast<T>(0)) {
    return static_cast<T>(0);
  }
  return coord >= upper ? upper : coord;
}

// static_cast<int>(x) as the GPU computes it (cvt.rzi.s32): truncating,
// saturating, NaN to 0; C++ leaves an out-of-range conversion undefined.
template <typename T>
C10_HOST_DEVICE inline int32_t gpu_float_to_int(T x) {
  if (x != x) {
    return 0;
  }
  if (x >= static_cast<T>(kIntRange)) {
    return std::numeric_limits<int32_t>::max();
  }
  if (x <= static_cast<T>(-kIntRange)) {
    return std::numeric_limits<int32_t>::min();
  }
  return static_cast<int32_t>(x);
}

// Half of an integer in scalar_t, scalar_t(twice) * 0.5, as stock forms
// reflection's bounds.
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T half_of(int64_t twice) {
  return mul_s<scalar_t>(integer_s<scalar_t, T>(twice), static_cast<T>(0.5));
}

// Reflects into [twice_low / 2, twice_high / 2] in scalar_t arithmetic, as
// stock's reflect_coordinates does. The flip count is stock's, floor of the
// rounded quotient converted as the GPU converts it: beyond 2^31 spans it
// saturates at INT_MAX (odd). fmod is exact.
// Not stock's reflect_coordinates: __device__ only; its int cast is UB here.
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T
reflect(T coord, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) {
    return static_cast<T>(0);
  }
  const T low = half_of<scalar_t, T>(twice_low);
  const T span = half_of<scalar_t, T>(twice_high - twice_low);
  const T distance = std::fabs(sub_s<scalar_t>(coord, low));
  const T extra = std::fmod(distance, span);
  const int32_t flips =
      gpu_float_to_int(std::floor(div_s<scalar_t>(distance, span)));
  if (flips % 2 == 0) {
    return add_s<scalar_t>(extra, low);
  }
  return add_s<scalar_t>(sub_s<scalar_t>(span, extra), low);
}

// Pads a pixel coordinate as stock's compute_coordinates does.
// Not stock's compute_coordinates: __device__ only.
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T pad_coordinate(
    T coord,
    int64_t size,
    GridSamplerPadding padding_mode,
    bool align_corners) {
  if (padding_mode == GridSamplerPadding::Reflection) {
    coord = align_corners ? reflect<scalar_t>(coord, 0, 2 * (size - 1))
                          : reflect<scalar_t>(coord, -1, 2 * size - 1);
  }
  return padding_mode == GridSamplerPadding::Zeros
      ? coord
      : clip<scalar_t>(coord, size);
}

// Cubic convolution (A = -0.75) weights of the taps at offsets -1 .. 2 from
// floor(coord), t = coord - floor, in scalar_t arithmetic as stock's
// backward instantiates get_cubic_upsampling_coefficients.
// Not stock's get_cubic_upsampling_coefficients: __device__ only.
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline void cubic_weights(T t, T weight[4]) {
  // a x + b in scalar_t arithmetic, rounded twice as stock's expressions are
  auto mul_add = [](T a, T x, T b) {
    return add_s<scalar_t>(mul_s<scalar_t>(a, x), b);
  };
  // ((A + 2) x - (A + 3)) x x + 1 for |x| <= 1
  auto near = [&](T x) {
    const T inner = mul_add(static_cast<T>(1.25), x, static_cast<T>(-2.25));
    return mul_add(mul_s<scalar_t>(inner, x), x, static_cast<T>(1));
  };
  // ((A x - 5A) x + 8A) x - 4A for 1 < |x| < 2
  auto far = [&](T x) {
    const T inner = mul_add(static_cast<T>(-0.75), x, static_cast<T>(3.75));
    return mul_add(mul_add(inner, x, static_cast<T>(-6)), x, static_cast<T>(3));
  };
  const T one = static_cast<T>(1);
  const T one_minus_t = sub_s<scalar_t>(one, t);
  weight[0] = far(add_s<scalar_t>(t, one));
  weight[1] = near(t);
  weight[2] = near(one_minus_t);
  weight[3] = far(add_s<scalar_t>(one_minus_t, one));
}

// The taps of one point along one spatial axis; kTaps is 1 (nearest),
// 2 (bilinear) or 4 (bicubic), a constant so that the arrays stay in
// registers. A point's taps are the product of its axes' taps.
template <typename T, int kTaps>
struct AxisTaps {
  static constexpr int count = kTaps;
  int64_t index[kTaps];
  bool in_bounds[kTaps];
  T weight[kTaps]; // interpolation weight along this axis
  // false when the coordinate is NaN or infinite, or (bilinear and
  // nearest) when its padded value lies beyond kMaxSafeCoordinate; as in
  // AxisTaps{}, an unusable axis has no tap in bounds and zero weights
  bool usable;
};

C10_HOST_DEVICE inline int taps_per_axis(
    GridSamplerInterpolation interpolation_mode) {
  switch (interpolation_mode) {
    case GridSamplerInterpolation::Nearest:
      return 1;
    case GridSamplerInterpolation::Bicubic:
      return 4;
    default:
      return 2;
  }
}

// Calls fn(std::integral_constant<int, taps per axis>) for the mode.
template <typename Fn>
inline void dispatch_taps_per_axis(
    GridSamplerInterpolation interpolation_mode,
    const Fn& fn) {
  switch (taps_per_axis(interpolation_mode)) {
    case 1:
      return fn(std::integral_constant<int, 1>{});
    case 4:
      return fn(std::integral_constant<int, 4>{});
    default:
      return fn(std::integral_constant<int, 2>{});
  }
}

// Whether a padded tap position is in bounds, and its pixel, as stock
// decides: beyond int's range is out, static_cast<int> truncates (so
// (-1, 0) is pixel 0), and only a position within int's range is converted.
// Not stock's within_bounds_2d: it tests an int; this refuses NaN first.
template <typename T>
C10_HOST_DEVICE inline bool tap_index(
    T position,
    int64_t size,
    int64_t* index) {
  *index = 0;
  if (!(position > static_cast<T>(-1) &&
        position < static_cast<T>(kIntRange))) {
    return false;
  }
  *index = static_cast<int64_t>(position);
  return *index < size;
}

// Bicubic: four taps around floor(coord), each padded on its own, as stock
// does. Only a non-finite source coordinate voids the axis.
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline AxisTaps<T, 4> cubic_axis_taps(
    T grid_coord,
    int64_t size,
    GridSamplerPadding padding_mode,
    bool align_corners) {
  AxisTaps<T, 4> taps{};
  const T coord = unnormalize<scalar_t>(grid_coord, size, align_corners);
  if (!(std::fabs(coord) <= std::numeric_limits<T>::max())) {
    return taps;
  }
  taps.usable = true;
  const T base = std::floor(coord);
  cubic_weights<scalar_t>(sub_s<scalar_t>(coord, base), taps.weight);
  const T base_minus_one = sub_s<scalar_t>(base, static_cast<T>(1));
  // One copy of the padding, the bulk of the code, for the four taps;
  // results go by selects, as an array indexed at run time would spill.
  GRID_SAMPLER_DET_ROLLED
  for (int k = 0; k < 4; ++k) {
    // Stock's position (base - 1) + k in scalar_t, which rounds where
    // scalar_t's integers are sparse, padded like a coordinate.
    const T position = pad_coordinate<scalar_t>(
        add_s<scalar_t>(base_minus_one, static_cast<T>(k)),
        size,
        padding_mode,
        align_corners);
    int64_t index;
    const bool in_bounds = tap_index(position, size, &index);
    GRID_SAMPLER_DET_UNROLL
    for (int j = 0; j < 4; ++j) {
      taps.index[j] = j == k ? index : taps.index[j];
      taps.in_bounds[j] = j == k ? in_bounds : taps.in_bounds[j];
    }
  }
  return taps;
}

// The taps along one axis. Bilinear takes the two pixels around the padded
// source coordinate, nearest the one at it (rounded half to even); NaN or
// one beyond kMaxSafeCoordinate voids the axis and never becomes an index.
// Not stock's grid_sampler_compute_source_index: __device__ only.
template <typename scalar_t, int kTaps, typename T>
C10_HOST_DEVICE inline AxisTaps<T, kTaps> compute_axis_taps(
    T grid_coord,
    int64_t size,
    GridSamplerPadding padding_mode,
    bool align_corners) {
  if constexpr (kTaps == 4) {
    return cubic_axis_taps<scalar_t>(
        grid_coord, size, padding_mode, align_corners);
  } else {
    AxisTaps<T, kTaps> taps{};
    const T coord = pad_coordinate<scalar_t>(
        unnormalize<scalar_t>(grid_coord, size, align_corners),
        size,
        padding_mode,
        align_corners);
    taps.usable = coord >= static_cast<T>(-kMaxSafeCoordinate) &&
        coord <= static_cast<T>(kMaxSafeCoordinate);
    if (!taps.usable) {
      return taps;
    }
    if constexpr (kTaps == 1) {
      taps.index[0] = static_cast<int64_t>(std::nearbyint(coord));
      taps.in_bounds[0] = taps.index[0] >= 0 && taps.index[0] < size;
      taps.weight[0] = static_cast<T>(1);
    } else {
      const int64_t low = static_cast<int64_t>(std::floor(coord));
      for (int k = 0; k < 2; ++k) {
        taps.index[k] = low + k;
        taps.in_bounds[k] = low + k >= 0 && low + k < size;
      }
      // Same expressions as stock, in scalar_t: (low + 1 - coord) and
      // (coord - low); low + 1 rounds where scalar_t's integers are sparse.
      taps.weight[0] = sub_s<scalar_t>(integer_s<scalar_t, T>(low + 1), coord);
      taps.weight[1] = sub_s<scalar_t>(coord, integer_s<scalar_t, T>(low));
    }
    return taps;
  }
}

// A spatial position or extent, outermost axis first, x last; linear
// indices are row-major over it.
template <typename index_t, int kDims>
struct Spatial {
  index_t v[kDims];
};

template <typename index_t, int kDims>
C10_HOST_DEVICE inline int64_t spatial_numel(const Spatial<index_t, kDims>& s) {
  int64_t numel = 1;
  GRID_SAMPLER_DET_UNROLL
  for (int a = 0; a < kDims; ++a) {
    numel *= s.v[a];
  }
  return numel;
}

// The position of row-major index `linear` in an extent of these sizes.
template <typename index_t, int kDims>
C10_HOST_DEVICE inline Spatial<index_t, kDims> unravel(
    index_t linear,
    const Spatial<index_t, kDims>& sizes) {
  Spatial<index_t, kDims> position;
  GRID_SAMPLER_DET_UNROLL
  for (int a = kDims - 1; a >= 0; --a) {
    position.v[a] = linear % sizes.v[a];
    linear /= sizes.v[a];
  }
  return position;
}

// The row-major index of `position` (in range) in an extent of `sizes`.
template <typename out_t, typename position_t, typename index_t, int kDims>
C10_HOST_DEVICE inline out_t ravel(
    const Spatial<position_t, kDims>& position,
    const Spatial<index_t, kDims>& sizes) {
  out_t linear = 0;
  GRID_SAMPLER_DET_UNROLL
  for (int a = 0; a < kDims; ++a) {
    linear = linear * static_cast<out_t>(sizes.v[a]) +
        static_cast<out_t>(position.v[a]);
  }
  return linear;
}

// log2 of the taps per point: the folds divide a record id with a shift.
C10_HOST_DEVICE constexpr int log2_taps_per_point(int taps_per_axis, int dims) {
  return dims * (taps_per_axis == 4 ? 2 : taps_per_axis - 1);
}
C10_HOST_DEVICE constexpr int taps_per_point(int taps_per_axis, int dims) {
  return 1 << log2_taps_per_point(taps_per_axis, dims);
}

// The taps of one point, numbered row-major over the axes (nw, ne, sw, se
// in 2-D; tnw .. bse in 3-D), the order stock's kernels visit them.
template <typename T, int kTaps, int kDims>
struct PointTaps {
  static constexpr int count = taps_per_point(kTaps, kDims);
  AxisTaps<T, kTaps> axis[kDims]; // outermost first; axis[kDims - 1] is x

  // Which of axis a's taps tap t uses: its base-kTaps digit, shifts and
  // masks that fold to constants once the loops unroll.
  static constexpr int kDigitBits = log2_taps_per_point(kTaps, 1);
  C10_HOST_DEVICE static int tap_along(int t, int a) {
    return (t >> (kDigitBits * (kDims - 1 - a))) & (kTaps - 1);
  }
  C10_HOST_DEVICE bool in_bounds(int t) const {
    bool inside = true;
    GRID_SAMPLER_DET_UNROLL
    for (int a = 0; a < kDims; ++a) {
      inside = inside && axis[a].in_bounds[tap_along(t, a)];
    }
    return inside;
  }
  C10_HOST_DEVICE Spatial<int64_t, kDims> position(int t) const {
    Spatial<int64_t, kDims> position;
    GRID_SAMPLER_DET_UNROLL
    for (int a = 0; a < kDims; ++a) {
      position.v[a] = axis[a].index[tap_along(t, a)];
    }
    return position;
  }
  // The weight the forward gives tap t: the axes' weights multiplied from
  // x outwards ((wx * wy) * wz), in scalar_t for bilinear as stock does. The
  // bicubic forward interpolates one axis at a time, so its product is
  // formed in opmath (exact in 2-D for Half and BFloat16).
  template <typename scalar_t>
  C10_HOST_DEVICE T sample_weight(int t) const {
    T product = axis[kDims - 1].weight[tap_along(t, kDims - 1)];
    GRID_SAMPLER_DET_UNROLL
    for (int a = kDims - 2; a >= 0; --a) {
      const T factor = axis[a].weight[tap_along(t, a)];
      product = kTaps == 2 ? mul_s<scalar_t>(product, factor)
                           : mul_rn(product, factor);
    }
    return product;
  }
};

// values[i] for an i known only at run time, by selects (see above).
template <typename V, int kTaps>
C10_HOST_DEVICE inline V select_tap(const V (&values)[kTaps], int i) {
  V value = values[0];
  GRID_SAMPLER_DET_UNROLL
  for (int k = 1; k < kTaps; ++k) {
    value = i == k ? values[k] : value;
  }
  return value;
}

// The taps whose outermost digit is `plane`, as taps 0 .. count / kTaps - 1
// of the result (its outermost axis repeats the plane's tap).
template <typename T, int kTaps, int kDims>
C10_HOST_DEVICE inline PointTaps<T, kTaps, kDims> plane_of(
    const PointTaps<T, kTaps, kDims>& taps,
    int plane) {
  PointTaps<T, kTaps, kDims> result = taps;
  AxisTaps<T, kTaps>& outer = result.axis[0];
  const int64_t index = select_tap(taps.axis[0].index, plane);
  const bool in_bounds = select_tap(taps.axis[0].in_bounds, plane);
  const T weight = select_tap(taps.axis[0].weight, plane);
  GRID_SAMPLER_DET_UNROLL
  for (int k = 0; k < kTaps; ++k) {
    outer.index[k] = index;
    outer.in_bounds[k] = in_bounds;
    outer.weight[k] = weight;
  }
  return result;
}

// grid_coord is in the grid's own order (x first); inp_size outermost first.
template <int kTaps, typename scalar_t, int kDims, typename T, typename index_t>
C10_HOST_DEVICE inline PointTaps<T, kTaps, kDims> compute_point_taps(
    const T (&grid_coord)[kDims],
    const Spatial<index_t, kDims>& inp_size,
    GridSamplerPadding padding_mode,
    bool align_corners) {
  PointTaps<T, kTaps, kDims> taps;
  bool usable = true;
  // One copy of the coordinate math, most of a point pass's code, for all
  // axes; operands and results move by selects.
  GRID_SAMPLER_DET_ROLLED
  for (int a = 0; a < kDims; ++a) {
    const AxisTaps<T, kTaps> axis = compute_axis_taps<scalar_t, kTaps>(
        select_tap(grid_coord, kDims - 1 - a),
        static_cast<int64_t>(select_tap(inp_size.v, a)),
        padding_mode,
        align_corners);
    GRID_SAMPLER_DET_UNROLL
    for (int b = 0; b < kDims; ++b) {
      if (b == a) {
        taps.axis[b] = axis;
      }
    }
    usable = usable && axis.usable;
  }
  // A point with one unusable coordinate has no tap in bounds at all.
  if (!usable) {
    taps = PointTaps<T, kTaps, kDims>{};
  }
  return taps;
}

// Strided view of an (N, C, spatial...) tensor, or of an (N, spatial...,
// kDims) grid with the coordinate axis as C.
template <typename scalar_t, typename index_t, int kDims>
struct View {
  scalar_t* data;
  index_t stride_n;
  index_t stride_c;
  index_t stride[kDims];

  template <typename position_t>
  C10_HOST_DEVICE index_t offset(
      index_t n,
      index_t c,
      const Spatial<position_t, kDims>& position) const {
    index_t offset = n * stride_n + c * stride_c;
    GRID_SAMPLER_DET_UNROLL
    for (int a = 0; a < kDims; ++a) {
      offset += static_cast<index_t>(position.v[a]) * stride[a];
    }
    return offset;
  }
  template <typename position_t>
  C10_HOST_DEVICE scalar_t& at(
      index_t n,
      index_t c,
      const Spatial<position_t, kDims>& position) const {
    return data[offset(n, c, position)];
  }
};

// View from data and strides, of a grid with `coordinate_last`.
template <typename index_t, int kDims, typename scalar_t>
View<scalar_t, index_t, kDims> strided_view(
    scalar_t* data,
    c10::IntArrayRef strides,
    bool coordinate_last = false) {
  const int channel_dim = coordinate_last ? kDims + 1 : 1;
  const int first_spatial_dim = coordinate_last ? 1 : 2;
  View<scalar_t, index_t, kDims> view{
      data,
      static_cast<index_t>(strides[0]),
      static_cast<index_t>(strides[channel_dim]),
      {}};
  GRID_SAMPLER_DET_UNROLL
  for (int a = 0; a < kDims; ++a) {
    view.stride[a] = static_cast<index_t>(strides[first_spatial_dim + a]);
  }
  return view;
}

// What a stage knows of a backward call. Points are numbered
// n * points_per_image() + output position, destinations (grad_input's
// spatial elements) n * destinations_per_image() + input position. index_t
// types every offset and count derived from the tensors.
template <typename scalar_t, typename index_t, int kDims>
struct BackwardArgs {
  using opmath_t = at::opmath_type<scalar_t>;
  using index_type = index_t;
  using scalar_type = scalar_t; // [stack: fused-fills]
  static constexpr int dims = kDims;

  View<const scalar_t, index_t, kDims> grad_output;
  View<const scalar_t, index_t, kDims> grid;
  index_t batch;
  index_t channels;
  Spatial<index_t, kDims> inp_size;
  Spatial<index_t, kDims> out_size;
  GridSamplerInterpolation interpolation_mode;
  GridSamplerPadding padding_mode;
  bool align_corners;

  static constexpr const char* op_name() {
    return kDims == 2 ? "grid_sampler_2d_backward" : "grid_sampler_3d_backward";
  }
  C10_HOST_DEVICE index_t points_per_image() const {
    return static_cast<index_t>(spatial_numel(out_size));
  }
  C10_HOST_DEVICE index_t destinations_per_image() const {
    return static_cast<index_t>(spatial_numel(inp_size));
  }
  C10_HOST_DEVICE index_t num_points() const {
    return batch * points_per_image();
  }
  C10_HOST_DEVICE index_t num_destinations() const {
    return batch * destinations_per_image();
  }
  // [stack: cells]
  // Cells (see Keying) of one image: one more than the pixels along every
  // axis, for base taps at -1.
  C10_HOST_DEVICE Spatial<index_t, kDims> cell_size() const {
    Spatial<index_t, kDims> size;
    GRID_SAMPLER_DET_UNROLL
    for (int a = 0; a < kDims; ++a) {
      size.v[a] = inp_size.v[a] + 1;
    }
    return size;
  }
  C10_HOST_DEVICE int64_t num_cells() const {
    return batch * spatial_numel(cell_size());
  }
  // [end stack: cells]
};

// The arguments of one call; every tensor may have any strides.
template <typename scalar_t, typename index_t, int kDims>
BackwardArgs<scalar_t, index_t, kDims> make_backward_args(
    const GridSamplerBackwardCall& call) {
  const TensorBase& grad_output = call.grad_output;
  const TensorBase& input = call.input;
  const TensorBase& grid = call.grid;
  BackwardArgs<scalar_t, index_t, kDims> args;
  args.grad_output = strided_view<index_t, kDims>(
      grad_output.const_data_ptr<scalar_t>(), grad_output.strides());
  args.grid = strided_view<index_t, kDims>(
      grid.const_data_ptr<scalar_t>(),
      grid.strides(),
      /*coordinate_last=*/true);
  args.batch = static_cast<index_t>(input.size(0));
  args.channels = static_cast<index_t>(input.size(1));
  GRID_SAMPLER_DET_UNROLL
  for (int a = 0; a < kDims; ++a) {
    args.inp_size.v[a] = static_cast<index_t>(input.size(2 + a));
    args.out_size.v[a] = static_cast<index_t>(grid.size(1 + a));
  }
  args.interpolation_mode =
      static_cast<GridSamplerInterpolation>(call.interpolation_mode);
  args.padding_mode = static_cast<GridSamplerPadding>(call.padding_mode);
  args.align_corners = call.align_corners;
  return args;
}

// A chunk's records: one per tap, keyed by its destination, or "nowhere"
// (num_destinations, sorting last) when out of bounds; its sort payload is
// its record id, chunk point * taps + tap. Beside the keys: each record's
// weight and each point's grad_output offset, so the reduce never divides.
// [stack: cells]
// How a chunk's records are keyed: PerTap, as above, or
//   PerCell (bilinear and trilinear only): one record per point, keyed by
//     its cell, the position of its lowest tap plus one along every axis
//     (lowest taps range over -1 .. size - 1), numbered n * cells_per_image
//     + row-major position in the (size + 1)^kDims cells of an image; or
//     "nowhere" (num_cells) when no tap is in bounds. Its payload is the
//     chunk's point number. The taps of a point are distinct pixels under
//     every padding mode (the coordinate is padded before the taps are
//     formed), so the records of destination d are those of d's 2^kDims
//     neighbouring cells, each through one tap, and merging those cells in
//     ascending point number gives d's records in PerTap order exactly.
//     Bicubic taps are padded one by one and may coincide, so bicubic
//     sampling is always PerTap; nearest has one tap, its own cell.
enum class Keying { PerTap, PerCell };
// [end stack: cells]

// Sort keys of a chunk, 64 bits wide.
// [stack: index32]
// Or 32 where the key space fits. The width is a run-time choice: a uniform
// branch per store or load costs nothing beside a record's other work,
// where a template parameter would double every kernel that touches keys.
// [end stack: index32]
struct ChunkKeys {
  void* data;
  bool wide; // [stack: index32]

  template <typename key_t>
  C10_HOST_DEVICE key_t* as() const {
    return static_cast<key_t*>(data);
  }
  C10_HOST_DEVICE int64_t operator[](int32_t i) const {
    return wide ? as<int64_t>()[i] : as<int32_t>()[i]; // [stack: index32 replaces: return as<int64_t>()[i];]
  }
};

template <typename T, typename index_t>
struct ChunkRecords {
  ChunkKeys keys;
  Keying keying; // [stack: cells]
  int32_t* record_ids;
  T* weights;
  index_t* gout_offsets;
};

// [stack: cells]
// The PerCell key of a point's taps (see Keying).
template <typename key_t, typename T, int kDims, typename index_t>
C10_HOST_DEVICE inline key_t cell_key(
    const PointTaps<T, 2, kDims>& taps,
    index_t n,
    const Spatial<index_t, kDims>& cell_size,
    key_t nowhere) {
  Spatial<int64_t, kDims> cell;
  GRID_SAMPLER_DET_UNROLL
  for (int a = 0; a < kDims; ++a) {
    // Some tap along every axis in bounds, or none of the point's is.
    if (!taps.axis[a].in_bounds[0] && !taps.axis[a].in_bounds[1]) {
      return nowhere;
    }
    cell.v[a] = taps.axis[a].index[0] + 1;
  }
  return static_cast<key_t>(n) * static_cast<key_t>(spatial_numel(cell_size)) +
      ravel<key_t>(cell, cell_size);
}

// The PerCell record of point `chunk_point`: its cell's key, its point
// number as the payload, and the weights of its taps.
template <
    typename key_t,
    typename scalar_t,
    typename index_t,
    int kDims,
    typename T>
C10_HOST_DEVICE inline void emit_cell_record(
    const BackwardArgs<scalar_t, index_t, kDims>& args,
    const PointTaps<T, 2, kDims>& taps,
    index_t n,
    index_t chunk_point,
    const ChunkRecords<T, index_t>& chunk) {
  const int32_t first_record = static_cast<int32_t>(chunk_point) * taps.count;
  chunk.keys.template as<key_t>()[chunk_point] = cell_key(
      taps, n, args.cell_size(), static_cast<key_t>(args.num_cells()));
  chunk.record_ids[chunk_point] = static_cast<int32_t>(chunk_point);
  GRID_SAMPLER_DET_UNROLL
  for (int t = 0; t < taps.count; ++t) {
    chunk.weights[first_record + t] = taps.template sample_weight<scalar_t>(t);
  }
}

// [end stack: cells]

// The records of point `chunk_point`, one per tap. Tricubic sampling's 64
// taps go a plane of 16 at a time: unrolled, they took four times the
// machine code and more registers than there are.
template <
    typename key_t,
    typename scalar_t,
    typename index_t,
    int kDims,
    typename T,
    int kTaps>
C10_HOST_DEVICE inline void emit_tap_records(
    const BackwardArgs<scalar_t, index_t, kDims>& args,
    const PointTaps<T, kTaps, kDims>& taps,
    index_t n,
    index_t chunk_point,
    const ChunkRecords<T, index_t>& chunk) {
  const int32_t first_record = static_cast<int32_t>(chunk_point) * taps.count;
  const key_t image_base =
      static_cast<key_t>(n) * static_cast<key_t>(args.destinations_per_image());
  const key_t nowhere = static_cast<key_t>(args.num_destinations());
  key_t* const keys = chunk.keys.template as<key_t>();
  auto emit = [&](const PointTaps<T, kTaps, kDims>& from, int t, int32_t r) {
    keys[r] = from.in_bounds(t)
        ? image_base + ravel<key_t>(from.position(t), args.inp_size)
        : nowhere;
    chunk.record_ids[r] = r;
    chunk.weights[r] = from.template sample_weight<scalar_t>(t);
  };
  if constexpr (kTaps == 4 && kDims == 3) {
    constexpr int kPlaneTaps = PointTaps<T, kTaps, kDims>::count / kTaps;
    GRID_SAMPLER_DET_ROLLED
    for (int plane = 0; plane < kTaps; ++plane) {
      const auto plane_taps = plane_of(taps, plane);
      GRID_SAMPLER_DET_UNROLL
      for (int t = 0; t < kPlaneTaps; ++t) {
        emit(plane_taps, t, first_record + plane * kPlaneTaps + t);
      }
    }
  } else {
    GRID_SAMPLER_DET_UNROLL
    for (int t = 0; t < taps.count; ++t) {
      emit(taps, t, first_record + t);
    }
  }
}

// [stack: index32]
// The records of one point. Its keys are as wide as the chunk says: a
// uniform branch, as every point of a launch takes the same way.
// [stack: cells]
// Keyed as the chunk says.
// [end stack: cells]
template <typename scalar_t, typename index_t, int kDims, typename T, int kTaps>
C10_HOST_DEVICE inline void emit_records(
    const BackwardArgs<scalar_t, index_t, kDims>& args,
    const PointTaps<T, kTaps, kDims>& taps,
    index_t n,
    index_t chunk_point,
    const ChunkRecords<T, index_t>& chunk) {
  // [stack: cells]
  if constexpr (kTaps == 2) {
    if (chunk.keying == Keying::PerCell) {
      if (chunk.keys.wide) {
        emit_cell_record<int64_t>(args, taps, n, chunk_point, chunk);
      } else {
        emit_cell_record<int32_t>(args, taps, n, chunk_point, chunk);
      }
      return;
    }
  }
  // [end stack: cells]
  if (!chunk.keys.wide) {
    emit_tap_records<int32_t>(args, taps, n, chunk_point, chunk);
    return;
  }
  emit_tap_records<int64_t>(args, taps, n, chunk_point, chunk);
}
// [end stack: index32]

// The taps of point `point`, its image *n and its output position.
template <int kTaps, typename scalar_t, typename index_t, int kDims>
C10_HOST_DEVICE inline PointTaps<at::opmath_type<scalar_t>, kTaps, kDims>
locate_point_taps(
    const BackwardArgs<scalar_t, index_t, kDims>& args,
    index_t point,
    index_t* n,
    Spatial<index_t, kDims>* out_position) {
  using T = at::opmath_type<scalar_t>;
  const index_t points_per_image = args.points_per_image();
  *n = point / points_per_image;
  *out_position = unravel(point - *n * points_per_image, args.out_size);
  T grid_coord[kDims];
  GRID_SAMPLER_DET_UNROLL
  for (int k = 0; k < kDims; ++k) {
    grid_coord[k] = static_cast<T>(args.grid.at(*n, k, *out_position));
  }
  return compute_point_taps<kTaps, scalar_t>(
      grid_coord,
      args.inp_size,
      args.padding_mode,
      args.align_corners);
}

// One destination's record ids in ascending order, as a fold reads them:
// start_partial(n) opens a partial of at most n records, in_partial() says
// whether it takes one more, front(). Here, a range of the stable sort's.
struct SortedRecordIds {
  const int32_t* ids;
  int32_t next;
  int32_t end;
  int32_t partial_end = 0;

  C10_HOST_DEVICE bool done() const {
    return next >= end; // [stack: hot-fold replaces: return next == end;]
  }
  C10_HOST_DEVICE void start_partial(int32_t records) {
    partial_end = end - next < records ? end : next + records;
  }
  C10_HOST_DEVICE bool in_partial() const {
    return next < partial_end;
  }
  C10_HOST_DEVICE uint32_t front() const {
    return static_cast<uint32_t>(ids[next]);
  }
  C10_HOST_DEVICE void pop() {
    ++next;
  }
};

// The canonical order of one grad_input element, channel c. Record r of
// `records` (one destination's, ascending) contributes
// round(weights[r] * gout_channel[gout_offsets[r >> tap_bits]]), with
// 2^tap_bits taps per point (a run-time shift: one reduce kernel serves
// every mode). Records are summed left to right into partials, which end
// after kRecordsPerPartial records or at a tile boundary (a tile is
// taps * kTilePoints ids), and the partials left to right into `acc`,
// which carries over from earlier chunks.
// [stack: hot-fold]
// The parallel fold of hot destinations stores the partials of each tile
// instead, and adds them to `acc` in the same order after.
// [end stack: hot-fold]
template <typename RecordIds, typename T, typename scalar_t, typename index_t>
C10_HOST_DEVICE inline T next_partial(
    RecordIds& records,
    const T* weights,
    const index_t* gout_offsets,
    const scalar_t* gout_channel,
    int tap_bits) {
  const int tile_bits = tap_bits + kTilePointsLog2;
  const uint32_t tile_end = ((records.front() >> tile_bits) + 1) << tile_bits;
  T partial = static_cast<T>(0);
  records.start_partial(kRecordsPerPartial);
  while (records.in_partial()) {
    const uint32_t id = records.front();
    if (id >= tile_end) {
      break;
    }
    const T gout = static_cast<T>(gout_channel[gout_offsets[id >> tap_bits]]);
    partial += mul_rn(weights[id], gout);
    records.pop();
  }
  return partial;
}

template <typename RecordIds, typename T, typename scalar_t, typename index_t>
C10_HOST_DEVICE inline T fold_records(
    RecordIds records,
    const T* weights,
    const index_t* gout_offsets,
    const scalar_t* gout_channel,
    int tap_bits,
    T acc) {
  while (!records.done()) {
    acc += next_partial(records, weights, gout_offsets, gout_channel, tap_bits);
  }
  return acc;
}

// What the reduce reads of a sorted chunk.
template <typename scalar_t, typename index_t>
struct SortedRecords {
  const int32_t* ids;
  const at::opmath_type<scalar_t>* weights;
  const index_t* gout_offsets;
  const scalar_t* grad_output;
  index_t gout_stride_c;
  int tap_bits;

  // One wide multiply-add, not a product sign-extended after.
  C10_HOST_DEVICE const scalar_t* gout_channel(index_t c) const {
    return grad_output + static_cast<int64_t>(c) * gout_stride_c;
  }
  template <typename RecordIds, typename T>
  C10_HOST_DEVICE T fold(RecordIds records, const scalar_t* gout_channel, T acc)
      const {
    return fold_records(
        records, weights, gout_offsets, gout_channel, tap_bits, acc);
  }
};

// [stack: index32]
// Division by a divisor fixed at launch (IntDivider, a plain division for
// 64-bit indices). Per-element index math divides only with these. For
// 32-bit indices IntDivider multiplies and shifts (dividends are below 2^31
// there).
template <typename index_t>
using Divider = at::cuda::detail::IntDivider<std::make_unsigned_t<index_t>>;

template <typename index_t>
C10_HOST_DEVICE inline index_t divide(index_t n, const Divider<index_t>& by) {
  return static_cast<index_t>(
      by.div(static_cast<std::make_unsigned_t<index_t>>(n)));
}

template <typename index_t>
Divider<index_t> divider(int64_t divisor) {
  return Divider<index_t>(static_cast<std::make_unsigned_t<index_t>>(divisor));
}
// [end stack: index32]

// A block of grad_input viewed as rows n * C + c of destinations_per_image
// columns s. A reduce reads and writes only its block's elements.
template <typename index_t>
struct ElementBlock {
  index_t row_begin;
  index_t row_end;
  index_t col_begin;
  index_t col_end;

  C10_HOST_DEVICE bool holds(index_t row, index_t s) const {
    return row >= row_begin && row < row_end && s >= col_begin && s < col_end;
  }
  C10_HOST_DEVICE index_t width() const {
    return col_end - col_begin;
  }
  C10_HOST_DEVICE index_t numel() const {
    return (row_end - row_begin) * width();
  }
};

// Element (row, s) in a buffer of the block alone, one multiply-add.
template <typename index_t>
struct BlockOffsets {
  index_t width;
  index_t origin;

  explicit BlockOffsets(const ElementBlock<index_t>& block)
      : width(block.width()),
        origin(block.row_begin * block.width() + block.col_begin) {}
  C10_HOST_DEVICE index_t operator()(index_t row, index_t s) const {
    return row * width + s - origin;
  }
};

// Where a reduce finds earlier chunks' opmath sums (laid out as the block)
// and puts its own: grad_input itself for float and double, a float carry
// for Half/BFloat16 whose records span chunks. Results go to `sums_out`,
// or, where that is null, rounded to grad_input.
template <typename scalar_t, typename index_t>
struct ReduceOutput {
  using T = at::opmath_type<scalar_t>;
  scalar_t* grad_input;
  const T* sums_in;
  T* sums_out;
  ElementBlock<index_t> block;
  BlockOffsets<index_t> offset;
  index_t destinations_per_image;

  ReduceOutput(
      scalar_t* grad_input,
      const T* sums_in,
      T* sums_out,
      const ElementBlock<index_t>& block,
      index_t destinations_per_image)
      : grad_input(grad_input),
        sums_in(sums_in),
        sums_out(sums_out),
        block(block),
        offset(block),
        destinations_per_image(destinations_per_image) {}

  C10_HOST_DEVICE T running_sum(index_t row, index_t s) const {
    return sums_in[offset(row, s)];
  }
  C10_HOST_DEVICE void write(index_t row, index_t s, T sum) const {
    if (sums_out != nullptr) {
      sums_out[offset(row, s)] = sum;
    } else {
      grad_input[row * destinations_per_image + s] = static_cast<scalar_t>(sum);
    }
  }
};

} // namespace at::native::grid_sampler_deterministic
