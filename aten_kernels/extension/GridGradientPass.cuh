#pragma once
// grad_grid in stock's arithmetic, written once over an executor (the
// pipeline's), so that the host runs what CUDA runs.
//
// Why the extension needs it: upstream, deterministic mode leaves grad_grid
// to stock's kernel, which asked for grad_grid alone has one writer per
// element (GridSampler.cu runs it after the deterministic grad_input). The
// extension cannot call that kernel: every released torch alerts in
// launch_grid_sampler_{2d,3d}_backward_kernel before it looks at
// output_mask. So the extension computes grad_grid here, with the
// arithmetic of stock's kernel, for every call that requests it, with or
// without grad_input, and its bits never depend on output_mask[0].

#include "BackwardCall.h"

#include <ATen/native/cuda/GridSamplerDeterministicPipeline.cuh>

// As GRID_SAMPLER_DET_UNROLL and _ROLLED, which the pipeline's headers
// undefine at their end.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define DETGRID_UNROLL _Pragma("unroll")
#define DETGRID_ROLLED _Pragma("unroll 1")
#else
#define DETGRID_UNROLL
#define DETGRID_ROLLED
#endif

namespace at::native::grid_sampler_deterministic {

// The pipeline's arguments, and views of the input (which grad_input never
// reads) and of grad_grid.
template <typename scalar_t, typename index_t, int kDims>
struct GridGradientArgs : BackwardArgs<scalar_t, index_t, kDims> {
  View<const scalar_t, index_t, kDims> input;
  View<scalar_t, index_t, kDims> grad_grid;
};

// The tap stock's backward visits s-th when it forms the grid gradient.
// Bilinear and trilinear: record order (nw, ne, sw, se; tnw .. bse).
// Bicubic: the x offset outermost (`for i: for j:` over x_coeffs[i] and
// y_coeffs[j]), so axis a's digit of s has weight kTaps^a (the outermost
// axis varies fastest); for 3-D this extends the 2-D loops, x outermost.
template <int kTaps, int kDims>
C10_HOST_DEVICE constexpr int stock_grid_tap(int s) {
  if constexpr (kTaps != 4) {
    return s;
  } else {
    int t = 0;
    for (int a = 0; a < kDims; ++a) {
      const int digit = (s >> (2 * a)) & 3;
      t |= digit << (2 * (kDims - 1 - a));
    }
    return t;
  }
}

// d weight / d source coordinate of an axis's taps, as stock's backward
// forms it: -1 and 1 in bilinear sampling; in bicubic, at t = coord -
// floor(coord), the negation of each get_cubic_coefficients_grad term (which
// is written in the distance x from the tap to the point), in scalar_t.
// Zero on an unusable axis, whose bicubic taps read 0: a NaN derivative
// would still make their terms NaN. The coordinate is unnormalized again
// here, not kept in AxisTaps, so that the ATen taps carry nothing that only
// this pass reads.
template <typename scalar_t, typename T, int kTaps>
C10_HOST_DEVICE inline void weight_derivatives(
    const AxisTaps<T, kTaps>& taps,
    T grid_coord,
    int64_t size,
    bool align_corners,
    T (&dweight)[kTaps]) {
  DETGRID_UNROLL
  for (int k = 0; k < kTaps; ++k) {
    dweight[k] = static_cast<T>(0);
  }
  if (!taps.usable) {
    return;
  }
  if constexpr (kTaps == 2) {
    dweight[0] = static_cast<T>(-1);
    dweight[1] = static_cast<T>(1);
  } else if constexpr (kTaps == 4) {
    const T coord = unnormalize<scalar_t>(grid_coord, size, align_corners);
    const T t = sub_s<scalar_t>(coord, std::floor(coord));
    const T one = static_cast<T>(1);
    T x = sub_s<scalar_t>(-one, t);
    dweight[0] = -sub_s<scalar_t>(
        mul_s<scalar_t>(
            add_s<scalar_t>(
                mul_s<scalar_t>(static_cast<T>(2.25), x), static_cast<T>(7.5)),
            x),
        static_cast<T>(-6));
    x = -t;
    dweight[1] = -mul_s<scalar_t>(
        sub_s<scalar_t>(
            mul_s<scalar_t>(static_cast<T>(-3.75), x), static_cast<T>(4.5)),
        x);
    x = sub_s<scalar_t>(one, t);
    dweight[2] = -mul_s<scalar_t>(
        sub_s<scalar_t>(
            mul_s<scalar_t>(static_cast<T>(3.75), x), static_cast<T>(4.5)),
        x);
    x = sub_s<scalar_t>(static_cast<T>(2), t);
    dweight[3] = -add_s<scalar_t>(
        mul_s<scalar_t>(
            sub_s<scalar_t>(
                mul_s<scalar_t>(static_cast<T>(-2.25), x),
                static_cast<T>(-7.5)),
            x),
        static_cast<T>(-6));
  }
}

// The derivative of clip at `coord`: 0 on and beyond the borders, as stock's
// clip_coordinates_set_grad gives it; 1 for NaN.
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T clip_derivative(T coord, int64_t size) {
  const bool border_or_beyond =
      coord <= static_cast<T>(0) || coord >= integer_s<scalar_t, T>(size - 1);
  return static_cast<T>(border_or_beyond ? 0 : 1);
}

// The derivative of reflect at `coord`, as stock's
// reflect_coordinates_set_grad gives it: the sign of the distance from the
// low bound, negated by an odd number of flips (counted as reflect does).
template <typename scalar_t, typename T>
C10_HOST_DEVICE inline T reflect_derivative(
    T coord,
    int64_t twice_low,
    int64_t twice_high) {
  if (twice_low == twice_high) {
    return static_cast<T>(0);
  }
  const T distance = sub_s<scalar_t>(coord, half_of<scalar_t, T>(twice_low));
  const T span = half_of<scalar_t, T>(twice_high - twice_low);
  const int32_t flips =
      gpu_float_to_int(std::floor(div_s<scalar_t>(std::fabs(distance), span)));
  const bool negative = (distance < static_cast<T>(0)) != (flips % 2 != 0);
  return static_cast<T>(negative ? -1 : 1);
}

// d source coordinate / d grid coordinate of one axis, as stock's
// grid_sampler_unnormalize_set_grad and (bilinear sampling) the padding's
// *_set_grad helpers form it: scalar_t(size - 1) / 2 or scalar_t(size) / 2
// in scalar_t (bfloat16 holds 257 as 256, so its multiplier is 128), times
// the padding's derivative. Bicubic sampling pads each tap, not the
// coordinate, so its multiplier is unnormalize's alone.
template <typename scalar_t, typename T, int kTaps>
C10_HOST_DEVICE inline T coordinate_multiplier(
    T grid_coord,
    int64_t size,
    GridSamplerPadding padding_mode,
    bool align_corners) {
  const T mult = half_of<scalar_t, T>(align_corners ? size - 1 : size);
  if (kTaps == 4 || padding_mode == GridSamplerPadding::Zeros) {
    return mult;
  }
  const T coord = unnormalize<scalar_t>(grid_coord, size, align_corners);
  if (padding_mode == GridSamplerPadding::Border) {
    return mul_rn(mult, clip_derivative<scalar_t>(coord, size));
  }
  const int64_t twice_low = align_corners ? 0 : -1;
  const int64_t twice_high = align_corners ? 2 * (size - 1) : 2 * size - 1;
  const T reflected = reflect<scalar_t>(coord, twice_low, twice_high);
  return mul_rn(
      mul_rn(mult, reflect_derivative<scalar_t>(coord, twice_low, twice_high)),
      clip_derivative<scalar_t>(reflected, size));
}

// d loss / d grid of one point, single writer, in the grid's coordinate
// order (x first), with the arithmetic of stock's backward kernels, which
// already write grad_grid once per point: scalar_t sums over channels in
// ascending order and over taps in stock's order (stock_grid_tap), each term
// ((value * d weight along the coordinate's axis) * the other axes' weights,
// x first) * grad_output in scalar_t, and the sum times stock's scalar_t
// multiplier. dweight[a] and mult[a] are axis a's weight_derivatives and
// coordinate_multiplier.
// Bilinear and trilinear skip a tap out of bounds; bicubic reads 0 for it
// (get_value_bounded) and adds its term.
// Residual: stock's fp32 and fp64 builds may contract a term's last multiply
// into the add (one FMA); every operation here is rounded on its own.
template <typename scalar_t, typename index_t, typename T, int kTaps, int kDims>
C10_HOST_DEVICE inline void point_grid_gradient(
    const PointTaps<T, kTaps, kDims>& taps,
    const T (&dweight)[kDims][kTaps],
    const T (&mult)[kDims],
    View<const scalar_t, index_t, kDims> input,
    View<const scalar_t, index_t, kDims> grad_output,
    index_t n,
    const Spatial<index_t, kDims>& out_position,
    index_t channels,
    T (&grad)[kDims]) {
  using Taps = PointTaps<T, kTaps, kDims>;
  if constexpr (kTaps == 1) {
    // Nearest sampling is piecewise constant: the grid gradient is zero, and
    // written without reading grad_output, so an Inf there cannot make NaN.
    DETGRID_UNROLL
    for (int k = 0; k < kDims; ++k) {
      grad[k] = static_cast<T>(0);
    }
  } else {
    T sum[kDims];
    DETGRID_UNROLL
    for (int k = 0; k < kDims; ++k) {
      sum[k] = static_cast<T>(0);
    }
    // The terms of the s-th tap stock visits. Its axes' values are picked by
    // selects, which fold to constants where the loop below unrolls and keep
    // the taps in registers where it does not.
    auto add_terms = [&](index_t c, T gout, int s) {
      const int t = stock_grid_tap<kTaps, kDims>(s);
      int digit[kDims];
      bool inside = true;
      Spatial<int64_t, kDims> position;
      DETGRID_UNROLL
      for (int a = 0; a < kDims; ++a) {
        digit[a] = Taps::tap_along(t, a);
        inside = inside && select_tap(taps.axis[a].in_bounds, digit[a]);
        position.v[a] = select_tap(taps.axis[a].index, digit[a]);
      }
      if (kTaps == 2 && !inside) {
        return;
      }
      const T value = inside ? static_cast<T>(input.at(n, c, position))
                             : static_cast<T>(0);
      DETGRID_UNROLL
      for (int k = 0; k < kDims; ++k) {
        const int along = kDims - 1 - k;
        T term = mul_s<scalar_t>(
            value, select_tap(dweight[along], digit[along]));
        DETGRID_UNROLL
        for (int a = kDims - 1; a >= 0; --a) {
          if (a != along) {
            term = mul_s<scalar_t>(
                term, select_tap(taps.axis[a].weight, digit[a]));
          }
        }
        sum[k] = add_s<scalar_t>(sum[k], mul_s<scalar_t>(term, gout));
      }
    };
    for (index_t c = 0; c < channels; ++c) {
      const T gout = static_cast<T>(grad_output.at(n, c, out_position));
      if constexpr (kTaps == 4 && kDims == 3) {
        // Tricubic: 64 taps, each three terms; unrolled, they would make its
        // point pass the largest kernel of the unit by a third again.
        DETGRID_ROLLED
        for (int s = 0; s < Taps::count; ++s) {
          add_terms(c, gout, s);
        }
      } else {
        DETGRID_UNROLL
        for (int s = 0; s < Taps::count; ++s) {
          add_terms(c, gout, s);
        }
      }
    }
    DETGRID_UNROLL
    for (int k = 0; k < kDims; ++k) {
      grad[k] = mul_s<scalar_t>(mult[kDims - 1 - k], sum[k]);
    }
  }
}

// Writes the grid gradient of one point.
template <typename scalar_t, typename index_t, int kDims, typename T, int kTaps>
C10_HOST_DEVICE inline void write_grid_gradient(
    const GridGradientArgs<scalar_t, index_t, kDims>& args,
    const PointTaps<T, kTaps, kDims>& taps,
    index_t n,
    const Spatial<index_t, kDims>& out_position) {
  T dweight[kDims][kTaps];
  T mult[kDims];
  DETGRID_UNROLL
  for (int a = 0; a < kDims; ++a) {
    const T grid_coord =
        static_cast<T>(args.grid.at(n, kDims - 1 - a, out_position));
    const int64_t size = static_cast<int64_t>(args.inp_size.v[a]);
    weight_derivatives<scalar_t>(
        taps.axis[a], grid_coord, size, args.align_corners, dweight[a]);
    mult[a] = coordinate_multiplier<scalar_t, T, kTaps>(
        grid_coord, size, args.padding_mode, args.align_corners);
  }
  T grad[kDims];
  point_grid_gradient(
      taps,
      dweight,
      mult,
      args.input,
      args.grad_output,
      n,
      out_position,
      args.channels,
      grad);
  DETGRID_UNROLL
  for (int k = 0; k < kDims; ++k) {
    args.grad_grid.at(n, k, out_position) = static_cast<scalar_t>(grad[k]);
  }
}

} // namespace at::native::grid_sampler_deterministic

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
// call of checked arguments with output_mask[1]; grad_input is not
// touched. Nearest sampling's grid gradient is zero: a fill, no pass.
template <typename Executor>
void run_grid_gradient_pass(const Executor& ex, const BackwardCall& call) {
  TORCH_INTERNAL_ASSERT(call.output_mask[1]);
  TORCH_INTERNAL_ASSERT(call.grad_grid.is_contiguous());
  if (call.grad_grid.numel() == 0) {
    return;
  }
  gsd::dispatch_backward_types(
      call,
      gsd::fits_32bit_indexing(call) &&
          gsd::fits_32bit_indexing(call.grad_grid),
      [&](auto scalar, auto index, auto dims) {
        using scalar_t = decltype(scalar);
        using index_t = decltype(index);
        constexpr int kDims = decltype(dims)::value;
        const gsd::GridGradientArgs<scalar_t, index_t, kDims> args{
            gsd::make_backward_args<scalar_t, index_t, kDims>(call),
            gsd::strided_view<index_t, kDims>(
                call.input.const_data_ptr<scalar_t>(), call.input.strides()),
            gsd::strided_view<index_t, kDims>(
                call.grad_grid.data_ptr<scalar_t>(),
                call.grad_grid.strides(),
                /*coordinate_last=*/true)};
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

// The extension's whole backward on `ex`: grad_grid by the pass above where
// requested, then grad_input by `grad_input_pass` (the pipeline, or the
// exact accumulation), as upstream's launcher runs the deterministic
// grad_input and stock's grad_grid. The grid pass comes first so that the
// work counters' per-chunk launches stay the pipeline's.
template <typename Executor, typename GradInputPass>
void run_backward(
    const Executor& ex,
    const BackwardCall& call,
    const GradInputPass& grad_input_pass) {
  TORCH_INTERNAL_ASSERT(call.output_mask[0]);
  if (call.output_mask[1]) {
    run_grid_gradient_pass(ex, call);
  }
  grad_input_pass();
}

} // namespace detgrid::grid_only

#undef DETGRID_UNROLL
#undef DETGRID_ROLLED
