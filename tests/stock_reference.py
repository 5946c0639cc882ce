"""Stock's CUDA backward taps and weights, written from upstream's source
(aten/src/ATen/native/cuda/GridSampler.cu, GridSampler.cuh, UpSample.cuh),
independent of detgrid's kernel code.

How stock's grid_sampler_{2d,3d}_backward_kernel forms a point's taps:
  bilinear, nearest: grid_sampler_compute_source_index_set_grad (unnormalize,
    clip or reflect-then-clip, safe_downgrade_to_int_range: a value beyond
    int's range or not finite becomes -100, out of bounds), then floor (or
    nearbyint) converted to int;
  bicubic: the unnormalized coordinate, ix_nw = floor(ix), and per tap the
    position ix_nw - 1 + i in scalar_t, padded by compute_coordinates (clip,
    or reflect then clip; then safe_downgrade_to_int_range) and converted to
    int (add_value_bounded, get_value_bounded). compute_coordinates clips
    with ::min and ::max, which take a NaN to the edge: a bicubic point with
    a non-finite coordinate has NaN coefficients, and under border or
    reflection padding its taps land on an edge pixel.
reflect_coordinates counts flips with static_cast<int>(floor(in / span)), a
conversion the GPU saturates at INT_MIN and INT_MAX and takes NaN to 0
(gpu_int). C++ leaves it undefined past int's range, so a host build of
stock's helpers (the core's) may take other taps there than the GPU.
Tricubic (5-D bicubic) taps are padded by compute_coordinates_sized (torch
2.15's helper of resolve_cubic_taps), whose fold takes the parity of its flip
count from fmod: no float is converted to int, on the GPU and the host alike.

Stock's coordinate helpers compute in scalar_t. For Half and BFloat16 every
operator of c10::Half / c10::BFloat16 computes in float and rounds the result
to the 16-bit type; `_Arith` does the same with numpy float32 arithmetic and a
dtype cast (torch's). For float32 and float64 the rounding is the identity.
Stock's unnormalize is float arithmetic whose result is returned as scalar_t,
here without FMA contraction (fma_unnormalize contracts it, exactly for
float32 grids): a build that contracts it (nvcc, the core's host build) may
move a huge float64 coordinate by an ulp, and so its taps, under
align_corners=False where the size is no power of two.

Two declared departures, detgrid's: a tricubic (5-D bicubic) point with a
coordinate that is not finite has no tap (the core's rule, tricubic_records in
GridSamplerDeterministic.cu: padding would place its NaN coefficients on an
edge); and the grid gradient of a bicubic point with a coordinate that is not
finite is 0 (aten_kernels/extension/GridGradient.cu), in both ranks.
"""

import numpy as np
import torch

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS, BORDER, REFLECTION = 0, 1, 2
INT_MAX, INT_MIN = 2 ** 31 - 1, -2 ** 31
# safe_downgrade_to_int_range's stand-in for a coordinate beyond int range.
DOWNGRADED = -100.0


def gpu_int(x):
    """static_cast<int>(x) on the GPU (cvt.rzi.s32): truncation toward zero,
    saturating at INT_MIN and INT_MAX, NaN to 0; as int64."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        clipped = np.clip(np.nan_to_num(x, nan=0.0), INT_MIN, INT_MAX)
    return np.trunc(clipped).astype(np.int64)


class _Arith:
    """scalar_t arithmetic on numpy arrays holding scalar_t values."""

    def __init__(self, dtype, fma_unnormalize=False):
        self.dtype = dtype
        self.opmath = np.float64 if dtype == torch.float64 else np.float32
        self.fma_unnormalize = fma_unnormalize

    def round(self, x):
        x = np.asarray(x, dtype=self.opmath)
        if self.dtype in (torch.float32, torch.float64):
            return x
        return torch.from_numpy(x.copy()).to(self.dtype).to(torch.float32).numpy()

    def const(self, value):
        """static_cast<scalar_t>(value)."""
        return self.round(np.asarray(value, dtype=self.opmath))

    def add(self, a, b):
        return self.round(np.add(a, b, dtype=self.opmath))

    def sub(self, a, b):
        return self.round(np.subtract(a, b, dtype=self.opmath))

    def mul(self, a, b):
        return self.round(np.multiply(a, b, dtype=self.opmath))

    def div(self, a, b):
        return self.round(np.divide(a, b, dtype=self.opmath))

    def unnormalize(self, coord, size, align_corners):
        f = self.opmath
        coord = np.asarray(coord, dtype=f)
        with np.errstate(invalid="ignore", over="ignore"):
            if align_corners:
                value = ((coord + f(1)) / f(2)) * f(size - 1)
            elif self.fma_unnormalize:
                # (coord + 1) * size - 1 as one fused multiply-add: the exact
                # product minus one (exact in double), rounded once.
                fused = (coord + f(1)).astype(np.float64) * size - 1.0
                value = fused.astype(f) / f(2)
            else:
                value = ((coord + f(1)) * f(size) - f(1)) / f(2)
        return self.round(value)

    def clip(self, coord, size):
        """clip_coordinates_set_grad: (coordinate, derivative); the borders
        count as outside."""
        upper = self.const(size - 1)
        with np.errstate(invalid="ignore"):
            inside = (coord > 0) & (coord < upper)
            return np.where(coord <= 0, self.opmath(0), np.where(coord >= upper, upper, coord)), \
                inside.astype(np.float64)

    def clip_coordinates(self, coord, size):
        """clip_coordinates: ::min(size - 1, ::max(coord, 0)), which take a
        NaN to 0 (fminf and fmaxf return the operand that is a number)."""
        return np.fmin(self.const(size - 1), np.fmax(coord, self.opmath(0)))

    def reflect(self, coord, twice_low, twice_high, exact_parity=False):
        """reflect_coordinates_set_grad: (coordinate, derivative); the
        coordinate is also reflect_coordinates'. The flip count is the GPU's
        int conversion of floor(in / span), in / span a scalar_t quotient;
        with exact_parity, floor(in / span) itself (compute_coordinates_sized:
        its parity by fmod)."""
        if twice_low == twice_high:
            return np.zeros_like(coord), np.zeros(coord.shape)
        low = self.div(self.const(twice_low), self.opmath(2))
        span = self.div(self.const(twice_high - twice_low), self.opmath(2))
        with np.errstate(invalid="ignore", over="ignore"):
            distance = self.sub(coord, low)
            sign = np.where(distance < 0, -1.0, 1.0)
            distance = np.abs(distance)
            extra = np.fmod(distance, span)
            flips = np.floor(self.div(distance, span))
            if not exact_parity:
                flips = gpu_int(flips)
            even = np.fmod(flips, 2) == 0
            return (np.where(even, self.add(extra, low), self.add(self.sub(span, extra), low)),
                    np.where(even, sign, -sign))

    def pad(self, coord, size, padding, align_corners):
        """The padding of grid_sampler_compute_source_index_set_grad:
        clip_coordinates_set_grad, or reflect then clip; with the derivative
        of the padding."""
        if padding == BORDER:
            return self.clip(coord, size)
        if padding == REFLECTION:
            if align_corners:
                coord, d_reflect = self.reflect(coord, 0, 2 * (size - 1))
            else:
                coord, d_reflect = self.reflect(coord, -1, 2 * size - 1)
            coord, d_clip = self.clip(coord, size)
            return coord, d_reflect * d_clip
        return coord, np.ones(coord.shape)

    def compute_coordinates(self, coord, size, padding, align_corners, sized=False):
        """compute_coordinates before its downgrade: clip_coordinates, or
        reflect_coordinates then clip_coordinates; sized:
        compute_coordinates_sized, the same but for the flip count's parity
        (see reflect)."""
        if padding == REFLECTION:
            twice_low, twice_high = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
            coord = self.reflect(coord, twice_low, twice_high, exact_parity=sized)[0]
        if padding in (BORDER, REFLECTION):
            coord = self.clip_coordinates(coord, size)
        return coord

    def downgrade(self, coord):
        """safe_downgrade_to_int_range: -100 beyond int's range (INT_MAX - 1
        and INT_MIN as scalar_t compares them: 2^31 and -2^31 in float) or
        when not finite."""
        bound = np.asarray(INT_MAX - 1, dtype=self.opmath)
        with np.errstate(invalid="ignore"):
            bad = (coord > bound) | (coord < self.opmath(INT_MIN)) | ~np.isfinite(coord)
        return np.where(bad, self.opmath(DOWNGRADED), coord)

    def cubic_coefficients(self, t):
        """get_cubic_upsampling_coefficients<scalar_t>, A = -0.75."""
        A = self.const(-0.75)

        def near(x):  # ((A + 2) * x - (A + 3)) * x * x + 1
            return self.add(self.mul(self.mul(self.sub(self.mul(self.add(A, 2), x),
                                                       self.add(A, 3)), x), x), 1)

        def far(x):  # ((A * x - 5 * A) * x + 8 * A) * x - 4 * A
            return self.sub(self.mul(self.add(self.mul(self.sub(self.mul(A, x), self.mul(5, A)),
                                                       x), self.mul(8, A)), x), self.mul(4, A))

        one_minus_t = self.sub(1, t)
        return [far(self.add(t, 1)), near(t), near(one_minus_t), far(self.add(one_minus_t, 1))]

    def cubic_coefficient_derivatives(self, t):
        """d coefficient / d t: the negated get_cubic_coefficients_grad<scalar_t>
        terms (written there in the tap-to-point distance x)."""
        A = self.const(-0.75)
        x = self.sub(-1, t)
        g0 = self.sub(self.mul(self.sub(self.mul(self.mul(-3, A), x), self.mul(10, A)), x),
                      self.mul(8, A))
        x = -t
        g1 = self.mul(self.sub(self.mul(self.mul(-3, self.add(A, 2)), x),
                               self.mul(2, self.add(A, 3))), x)
        x = self.sub(1, t)
        g2 = self.mul(self.sub(self.mul(self.mul(3, self.add(A, 2)), x),
                               self.mul(2, self.add(A, 3))), x)
        x = self.sub(2, t)
        g3 = self.add(self.mul(self.sub(self.mul(self.mul(3, A), x), self.mul(10, A)), x),
                      self.mul(8, A))
        return [-g0, -g1, -g2, -g3]


def axis_taps(arith, coord, size, mode, padding, align_corners, sized=False):
    """Per point of one axis: indices [P, K], in_bounds [P, K], weights and
    their derivatives by the pixel coordinate [P, K] (scalar_t values), the
    derivative of the pixel coordinate by the grid coordinate [P] (exact)
    and finite [P]: False where a bicubic coordinate is not finite (its
    coefficients are NaN; bilinear and nearest padding downgrades such a
    coordinate out of bounds, so they are always True). sized: bicubic taps
    padded by compute_coordinates_sized, as tricubic grad_input's are."""
    mult = np.full(coord.shape, (size - 1) / 2 if align_corners else size / 2)
    source = arith.unnormalize(coord, size, align_corners)
    if mode == BICUBIC:
        finite = np.isfinite(source)
        with np.errstate(invalid="ignore"):
            base = np.floor(source)
            t = arith.sub(source, base)
            weights = np.stack(arith.cubic_coefficients(t), axis=1)
            dweights = np.stack(arith.cubic_coefficient_derivatives(t), axis=1)
            # (ix_nw - 1) + i in scalar_t, compute_coordinates, static_cast<int>.
            positions = [arith.add(arith.sub(base, 1), k) for k in range(4)]
            padded = [arith.downgrade(arith.compute_coordinates(p, size, padding,
                                                                align_corners, sized))
                      for p in positions]
        indices = np.stack([gpu_int(p) for p in padded], axis=1)
    else:
        source, d_pad = arith.pad(source, size, padding, align_corners)
        mult = mult * d_pad
        source = arith.downgrade(source)
        finite = np.ones(source.shape, dtype=bool)
        if mode == NEAREST:
            indices = gpu_int(np.rint(source))[:, None]
            weights = np.ones_like(source)[:, None]
            dweights = np.zeros_like(weights)
        else:
            low = gpu_int(np.floor(source))
            indices = np.stack([low, low + 1], axis=1)
            # (ix_se - ix) and (ix - ix_nw): an int converted to scalar_t.
            weights = np.stack([arith.sub(arith.const(low + 1), source),
                                arith.sub(source, arith.const(low))], axis=1)
            dweights = np.broadcast_to(np.array([-1.0, 1.0]), weights.shape)
    in_bounds = (indices >= 0) & (indices < size)
    return indices, in_bounds, weights, finite, dweights, mult


def _finite(axes):
    """Per point, whether every bicubic coordinate of it is finite."""
    return np.logical_and.reduce([axis[3] for axis in axes])


def _with_taps(axes, mode):
    """Per point, whether its in-bounds taps count: all but a tricubic point
    with a coordinate that is not finite (the module comment's departure)."""
    if mode == BICUBIC and len(axes) == 3:
        return _finite(axes)
    return np.ones(axes[0][3].shape, dtype=bool)


def point_taps(grid, input_size, mode, padding, align_corners, fma_unnormalize=False):
    """Stock's taps of every point of `grid` ((P, dims) in its dtype, x
    first) over an input of spatial size `input_size` (outermost first):
    positions (P, taps, dims) outermost first, in_bounds (P, taps), weights
    (P, taps) in opmath, taps numbered row-major with x fastest."""
    arith = _Arith(grid.dtype, fma_unnormalize)
    coords = grid.to(torch.float64).numpy()
    dims = len(input_size)
    tricubic = mode == BICUBIC and dims == 3
    axes = [axis_taps(arith, coords[:, dims - 1 - a].astype(arith.opmath), input_size[a],
                      mode, padding, align_corners, tricubic) for a in range(dims)]
    with_taps = _with_taps(axes, mode)
    per_axis = axes[0][0].shape[1]
    positions, in_bounds, weights = [], [], []
    for digits in np.ndindex(*(per_axis,) * dims):
        positions.append([axes[a][0][:, digits[a]] for a in range(dims)])
        in_bounds.append(np.logical_and.reduce([axes[a][1][:, digits[a]]
                                                for a in range(dims)]) & with_taps)
        # Multiplied from x outwards, ((wx * wy) * wz): in scalar_t for
        # bilinear and trilinear, as stock's kernels do; bicubic's forward
        # applies one axis at a time (and its backward multiplies
        # gOut * x_coeffs[i] * y_coeffs[j] in scalar_t), so the tap weight of
        # the function it computes is the plain product, in opmath.
        weight = axes[dims - 1][2][:, digits[dims - 1]]
        for a in range(dims - 2, -1, -1):
            factor = axes[a][2][:, digits[a]]
            if mode == BILINEAR:
                weight = arith.mul(weight, factor)
            else:
                weight = np.multiply(weight, factor, dtype=arith.opmath)
        weights.append(weight)
    positions = np.stack([np.stack(p, axis=1) for p in positions], axis=1)
    return positions, np.stack(in_bounds, axis=1), np.stack(weights, axis=1)


def backward(grad_output, inp, grid, mode, padding, align_corners):
    """The gradients stock's CUDA backward's taps and weights give, exactly
    (float64 sums over stock's taps and weights), for any dtype: (grad_input,
    grad_grid) in float64. grad_grid multiplies the axes' weights and
    derivatives in float64 and uses the exact unnormalize factor; it takes
    the grid gradient's taps (GridGradient.cu pads tricubic taps as 2-D
    bicubic ones, by compute_coordinates) and is 0 for a bicubic point with a
    coordinate that is not finite (the module comment's departures)."""
    dims = inp.dim() - 2
    in_size = tuple(inp.shape[2:])
    N, C = inp.shape[:2]
    out_size = tuple(grid.shape[1:-1])
    points = grid.reshape(-1, dims)
    arith = _Arith(grid.dtype)
    coords = points.to(torch.float64).numpy()

    def every_axis(sized):
        return [axis_taps(arith, coords[:, dims - 1 - a].astype(arith.opmath), in_size[a],
                          mode, padding, align_corners, sized) for a in range(dims)]

    tricubic = mode == BICUBIC and dims == 3
    axes = every_axis(tricubic)
    grid_axes = every_axis(False) if tricubic else axes
    with_taps = _with_taps(axes, mode)
    n_of = np.repeat(np.arange(N), int(np.prod(out_size)))
    out_numel, in_numel = int(np.prod(out_size)), int(np.prod(in_size))
    gout = grad_output.double().reshape(N, C, out_numel).permute(0, 2, 1).reshape(
        N * out_numel, C).numpy()
    values = inp.double().reshape(N, C, in_numel).numpy()
    grad_input = np.zeros((N, C, int(np.prod(in_size))))
    grad_grid = np.zeros((len(coords), dims))
    per_axis = axes[0][0].shape[1]
    tap_weights = point_taps(points, in_size, mode, padding, align_corners)[2]

    def tap(axes, digits, mask):
        """(inside, flat index) of one tap of every point."""
        inside = np.logical_and.reduce([axes[a][1][:, digits[a]] for a in range(dims)]) & mask
        flat = np.zeros(len(coords), dtype=np.int64)
        for a in range(dims):
            flat = flat * in_size[a] + np.where(inside, axes[a][0][:, digits[a]], 0)
        return inside, flat

    finite = _finite(grid_axes)
    for number, digits in enumerate(np.ndindex(*(per_axis,) * dims)):
        inside, flat = tap(axes, digits, with_taps)
        weight = tap_weights[:, number].astype(np.float64)
        contribution = np.where(inside, weight, 0.0)[:, None] * gout
        np.add.at(grad_input, (n_of[:, None], np.arange(C)[None, :], flat[:, None]),
                  contribution)
        inside, flat = tap(grid_axes, digits, finite)
        tap_values = values[n_of, :, flat] * inside[:, None]
        factors = [grid_axes[a][2][:, digits[a]].astype(np.float64) for a in range(dims)]
        for a in range(dims):
            derivative = np.prod([grid_axes[b][4][:, digits[b]] if b == a else factors[b]
                                  for b in range(dims)], axis=0)
            grad_grid[:, dims - 1 - a] += np.where(
                finite, derivative * (tap_values * gout).sum(axis=1), 0.0)
    for a in range(dims):
        grad_grid[:, dims - 1 - a] *= grid_axes[a][5]
    return (torch.from_numpy(grad_input).reshape(N, C, *in_size),
            torch.from_numpy(grad_grid).reshape(*grid.shape))


def grid_gradient(grad_output, inp, grid, mode, padding, align_corners):
    """grad_grid as stock's CUDA backward kernels compute it, operation by
    operation in scalar_t (numpy arrays in opmath holding scalar_t values),
    for any dtype; a (grid's shape) float64 tensor of scalar_t values.

    Per point: gix = giy (= giz) = 0; per channel in ascending order, with
    gOut that channel's grad_output, per tap as stock's kernels visit them:
      bilinear, trilinear: nw, ne, sw, se (tnw .. bse), taps out of bounds
        skipped; gix -= val * w_y (* w_z) * gOut where the tap's x offset is
        0, += where it is 1; giy and giz alike with the other axes' weights
        in x, y, z order;
      bicubic: `for i (x offset): for j (y offset)` (then z in 3-D), val 0
        for a tap out of bounds (get_value_bounded);
        gix -= val * x_coeffs_grad[i] * y_coeffs[j] (* z_coeffs[k]) * gOut,
        giy -= val * y_coeffs_grad[j] * x_coeffs[i] (* z_coeffs[k]) * gOut,
        giz -= val * z_coeffs_grad[k] * x_coeffs[i] * y_coeffs[j] * gOut;
    then grad_grid = gix_mult * gix, gix_mult being scalar_t(size - 1) / 2
    (align_corners) or scalar_t(size) / 2, times the padding's derivative.
    Nearest writes 0. Each operation is rounded on its own: stock's fp32 and
    fp64 builds may contract a term's last multiply into the add (one FMA),
    which this reference does not model. A point with a non-finite
    coordinate gets 0 (the module comment's departure).
    """
    dims = inp.dim() - 2
    in_size = tuple(inp.shape[2:])
    N, C = inp.shape[:2]
    out_numel = int(np.prod(grid.shape[1:-1]))
    in_numel = int(np.prod(in_size))
    arith = _Arith(grid.dtype)
    points = grid.reshape(-1, dims)
    coords = points.to(torch.float64).numpy()
    axes = [axis_taps(arith, coords[:, dims - 1 - a].astype(arith.opmath), in_size[a],
                      mode, padding, align_corners) for a in range(dims)]
    finite = _finite(axes)
    grad = np.zeros((len(coords), dims), dtype=arith.opmath)
    if mode == NEAREST:
        return torch.from_numpy(grad.astype(np.float64)).reshape(*grid.shape)
    n_of = np.repeat(np.arange(N), out_numel)
    gout = grad_output.to(torch.float64).reshape(N, C, out_numel).permute(0, 2, 1).reshape(
        N * out_numel, C).numpy().astype(arith.opmath)
    values = inp.to(torch.float64).reshape(N, C, in_numel).numpy().astype(arith.opmath)
    per_axis = axes[0][0].shape[1]
    if mode == BICUBIC:
        # Digits of the x axis (axis dims - 1) outermost.
        visits = [tuple(reversed(d)) for d in np.ndindex(*(per_axis,) * dims)]
    else:
        visits = list(np.ndindex(*(per_axis,) * dims))
    sums = [arith.const(np.zeros(len(coords))) for _ in range(dims)]
    for c in range(C):
        g = gout[:, c]
        for digits in visits:
            inside = np.logical_and.reduce([axes[a][1][:, digits[a]] for a in range(dims)])
            flat = np.zeros(len(coords), dtype=np.int64)
            for a in range(dims):
                flat = flat * in_size[a] + np.where(inside, axes[a][0][:, digits[a]], 0)
            val = np.where(inside, values[n_of, c, flat], arith.opmath(0))
            for k in range(dims):  # grid order: x, y, z
                along = dims - 1 - k
                others = [axes[a][2][:, digits[a]] for a in range(dims - 1, -1, -1)
                          if a != along]
                if mode == BICUBIC:
                    term = arith.mul(val, -axes[along][4][:, digits[along]])
                    for w in others:
                        term = arith.mul(term, w)
                    updated = arith.sub(sums[k], arith.mul(term, g))
                else:
                    term = val
                    for w in others:
                        term = arith.mul(term, w)
                    term = arith.mul(term, g)
                    low = digits[along] == 0
                    updated = arith.sub(sums[k], term) if low else arith.add(sums[k], term)
                    updated = np.where(inside, updated, sums[k])
                sums[k] = updated
    for k in range(dims):
        a = dims - 1 - k
        extent = in_size[a] - 1 if align_corners else in_size[a]
        mult = arith.div(arith.const(extent), 2)
        if mode != BICUBIC and extent:
            # times the padding's derivative (0, 1 or -1, signed zeros kept)
            mult = mult * (axes[a][5] / (extent / 2))
        grad[:, k] = np.where(finite, arith.mul(mult, sums[k]), 0)
    return torch.from_numpy(grad.astype(np.float64)).reshape(*grid.shape)
