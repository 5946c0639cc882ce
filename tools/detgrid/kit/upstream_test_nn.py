# Owner(s): ["module: nn"]
"""The tests `detgrid patch` adds to PyTorch's test/test_nn.py, written as upstream's code.

The methods of TestNNDeviceType below go into test_nn.py's class of that name as they are written
here, decorators and comments included: detgrid.kit.patch reads this file and cuts each method out
by its line numbers (it never imports it: `detgrid patch` imports no torch). The helpers go in
only with a test that calls them, and the imports below only for the names the added methods use
and the checkout lacks. ADDED, at the end, is the rest the kit needs to know per test.
tests/test_upstream_tests.py runs the same methods through the extension, on CPU and CUDA.
"""
# In the kit package, not tests/: pip installs ship it (--tests-only reads it), pytest never collects it.

import unittest
from itertools import product

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import DeterministicGuard
from torch.testing._internal.common_cuda import TEST_CUDNN
from torch.testing._internal.common_nn import NNTestCase
from torch.testing._internal.common_device_type import dtypes, largeTensorTest, onlyCUDA


class TestNNDeviceType(NNTestCase):
    def _grid_sample_grads(self, input, grid, grad_output, **kwargs):
        input = input.detach().clone().requires_grad_()
        grid = grid.detach().clone().requires_grad_()
        out = F.grid_sample(input, grid, **kwargs)
        out.backward(grad_output)
        return input.grad, grid.grad

    def _check_grid_sample_backward_reproducible(self, input, grid, grad_output, modes):
        # Repeated runs in deterministic mode must agree bit for bit.
        for mode, padding_mode, align_corners in product(
                modes, ('zeros', 'border', 'reflection'), (False, True)):
            kwargs = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
            with DeterministicGuard(True):
                expected = self._grid_sample_grads(input, grid, grad_output, **kwargs)
                for _ in range(3):
                    actual = self._grid_sample_grads(input, grid, grad_output, **kwargs)
                    self.assertEqual(actual[0], expected[0], atol=0, rtol=0)
                    self.assertEqual(actual[1], expected[1], atol=0, rtol=0)

    def _grid_sample_grads_of(self, input, grid, grad_output, **kwargs):
        # Both gradients of the given tensors as they are: expanded and strided
        # inputs reach the backward with their strides (a clone would not keep them).
        input = input.detach().requires_grad_()
        grid = grid.detach().requires_grad_()
        return torch.autograd.grad(F.grid_sample(input, grid, **kwargs), (input, grid), grad_output)

    def _check_grid_sample_backward_matches_default(self, input, grid, grad_output, modes):
        # The two backwards round differently (the default one may contract into
        # FMAs and accumulates grad_grid in the input's dtype), and grad_grid sums
        # terms that cancel (bicubic: 16 taps per channel), so they can differ by
        # several ulps of its largest element. Both are measured against a
        # float64 oracle instead (in float64 the oracle is the default backward
        # itself): the deterministic gradients must be as accurate as the default
        # ones, up to a factor of two and 16 ulps of the largest element; a
        # misplaced tap is off by O(1).
        eps = torch.finfo(input.dtype).eps
        for mode, padding_mode, align_corners in product(
                modes, ('zeros', 'border', 'reflection'), (False, True)):
            kwargs = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
            oracle = self._grid_sample_grads(
                input.double(), grid.double(), grad_output.double(), **kwargs)
            expected = self._grid_sample_grads(input, grid, grad_output, **kwargs)
            with DeterministicGuard(True):
                actual = self._grid_sample_grads(input, grid, grad_output, **kwargs)
            for name, a, e, o in zip(('grad_input', 'grad_grid'), actual, expected, oracle):
                default_error = (e.double() - o).abs().max().item()
                bound = 2 * default_error + 16 * eps * o.abs().max().item()
                self.assertLessEqual(
                    (a.double() - o).abs().max().item(), bound, msg=f"{name}, {kwargs}")

    def _check_grid_sample_backward_kernels(self, dims, grads, masks):
        # The deterministic backward's kernels (GridSamplerDeterministic.cu) run
        # exactly when grad_input is requested in deterministic mode. What the
        # profiler cannot show is that the atomicAdd kernel added nothing to
        # grad_input: that kernel runs under its own name for grad_grid either way.
        for deterministic, mask in product((False, True), masks):
            with DeterministicGuard(deterministic):
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    grads(mask)
                    torch.cuda.synchronize()
            names = ' '.join(event.name for event in prof.events())
            for kernel in (f'grid_sampler_{dims}d_records_kernel', 'sum_runs_kernel'):
                self.assertEqual(kernel in names, deterministic and mask[0],
                                 msg=f'{dims}D, {kernel}, deterministic={deterministic}, mask={mask}')

    @onlyCUDA
    @dtypes(torch.half, torch.bfloat16, torch.float, torch.double)
    def test_grid_sample_2d_backward_deterministic(self, device, dtype):
        # A zoom-in grid: many samples land on each input pixel, which is where
        # atomicAdd ordering would show.
        torch.manual_seed(0)
        input = torch.randn(2, 3, 7, 9, device=device, dtype=dtype)
        grid = torch.rand(2, 40, 37, 2, device=device, dtype=dtype) * 0.6 - 0.3
        grad_output = torch.randn(2, 3, 40, 37, device=device, dtype=dtype)
        self._check_grid_sample_backward_reproducible(
            input, grid, grad_output, ('bilinear', 'nearest', 'bicubic'))

    @onlyCUDA
    @dtypes(torch.half, torch.bfloat16, torch.float, torch.double)
    def test_grid_sample_3d_backward_deterministic(self, device, dtype):
        # A zoom-in grid: many samples land on each input voxel.
        torch.manual_seed(0)
        input = torch.randn(2, 3, 4, 5, 6, device=device, dtype=dtype)
        grid = torch.rand(2, 9, 11, 10, 3, device=device, dtype=dtype) * 0.6 - 0.3
        grad_output = torch.randn(2, 3, 9, 11, 10, device=device, dtype=dtype)
        self._check_grid_sample_backward_reproducible(
            input, grid, grad_output, ('bilinear', 'nearest'))

    @onlyCUDA
    @dtypes(torch.half, torch.bfloat16, torch.float, torch.double)
    def test_grid_sample_2d_backward_deterministic_matches_default(self, device, dtype):
        torch.manual_seed(0)
        input = torch.randn(2, 4, 11, 6, device=device, dtype=dtype)
        grid = torch.rand(2, 23, 29, 2, device=device, dtype=dtype) * 2.4 - 1.2
        grad_output = torch.randn(2, 4, 23, 29, device=device, dtype=dtype)
        self._check_grid_sample_backward_matches_default(
            input, grid, grad_output, ('bilinear', 'nearest', 'bicubic'))

    @onlyCUDA
    @dtypes(torch.half, torch.bfloat16, torch.float, torch.double)
    def test_grid_sample_3d_backward_deterministic_matches_default(self, device, dtype):
        torch.manual_seed(0)
        input = torch.randn(2, 4, 5, 7, 6, device=device, dtype=dtype)
        grid = torch.rand(2, 8, 9, 7, 3, device=device, dtype=dtype) * 2.4 - 1.2
        grad_output = torch.randn(2, 4, 8, 9, 7, device=device, dtype=dtype)
        self._check_grid_sample_backward_matches_default(
            input, grid, grad_output, ('bilinear', 'nearest'))

    @onlyCUDA
    @unittest.skipIf(not TEST_CUDNN, 'CUDNN not available')
    def test_grid_sample_2d_backward_deterministic_cudnn(self, device):
        # Bilinear, zeros, align_corners=True is the combination the composite
        # grid_sampler hands to cuDNN outside deterministic mode. In it, the
        # composite keeps to the native path, whose backward is deterministic.
        # (A direct cudnn_grid_sampler call keeps cuDNN and its alert:
        # test_torch.py's test_nondeterministic_alert_grid_sample_2d_cudnn.)
        torch.manual_seed(0)
        input = torch.randn(2, 3, 8, 8, device=device)
        grid = torch.rand(2, 32, 32, 2, device=device) * 0.5 - 0.25
        grad_output = torch.randn(2, 3, 32, 32, device=device)
        kwargs = dict(mode='bilinear', padding_mode='zeros', align_corners=True)
        with DeterministicGuard(True):
            expected = self._grid_sample_grads(input, grid, grad_output, **kwargs)
            for _ in range(3):
                actual = self._grid_sample_grads(input, grid, grad_output, **kwargs)
                self.assertEqual(actual, expected, atol=0, rtol=0)

    @onlyCUDA
    def test_grid_sample_backward_deterministic_grid_only(self, device):
        # Without grad_input the default backward has one writer per grad_grid
        # element: deterministic mode keeps it, so it runs without an alert and
        # gives the same bits as with deterministic mode off.
        torch.manual_seed(0)
        for dims in (2, 3):
            input = torch.randn((2, 3) + (5,) * dims, device=device)
            grid = torch.rand((2,) + (7,) * dims + (dims,), device=device) * 0.6 - 0.3
            grid.requires_grad_()
            grad_output = torch.randn((2, 3) + (7,) * dims, device=device)

            def grad_grid():
                output = F.grid_sample(input, grid, align_corners=False)
                return torch.autograd.grad(output, grid, grad_output)[0]

            expected = grad_grid()
            for warn_only in (False, True):
                with DeterministicGuard(True, warn_only=warn_only):
                    self.assertNotWarn(grad_grid, f'{dims}D grid-only backward alerted')
                    actual = grad_grid()
                self.assertEqual(actual, expected, atol=0, rtol=0)

    @onlyCUDA
    @dtypes(torch.float, torch.double)
    def test_grid_sample_backward_deterministic_sparse_reduction(self, device, dtype):
        # Far fewer taps than pixels: the deterministic backward zero-fills
        # grad_input and reduces per run of one pixel's records instead of
        # passing over every pixel.
        torch.manual_seed(0)
        input = torch.randn(1, 3, 300, 200, device=device, dtype=dtype)
        grid = torch.rand(1, 5, 6, 2, device=device, dtype=dtype) * 2 - 1
        grad_output = torch.randn(1, 3, 5, 6, device=device, dtype=dtype)
        modes = ('bilinear', 'nearest', 'bicubic')
        self._check_grid_sample_backward_reproducible(input, grid, grad_output, modes)
        for mode, padding_mode in product(modes, ('zeros', 'border', 'reflection')):
            kwargs = dict(mode=mode, padding_mode=padding_mode, align_corners=False)
            expected = self._grid_sample_grads(input, grid, grad_output, **kwargs)[0]
            with DeterministicGuard(True):
                actual = self._grid_sample_grads(input, grid, grad_output, **kwargs)[0]
            self.assertEqual(actual, expected)

    @onlyCUDA
    @dtypes(torch.half, torch.bfloat16, torch.float)
    def test_grid_sample_backward_deterministic_several_chunks(self, device, dtype):
        # The deterministic backward takes a record per tap, at most
        # kMaxChunkRecords = 2^19 of them per chunk (GridSamplerDeterministic.cu):
        # 1.7M bilinear points (4 taps) take 13 chunks, 0.2M bicubic ones (16
        # taps) 7. Half and bfloat16 carry their running sums in float from
        # chunk to chunk.
        torch.manual_seed(0)
        max_chunk_records = 2 ** 19
        input = torch.randn(1, 1, 16, 16, device=device, dtype=dtype)
        for mode, size, taps in (('bilinear', 1300, 4), ('bicubic', 450, 16)):
            # points x taps records: three chunks or more
            self.assertGreater(size * size * taps, 2 * max_chunk_records)
            grid = torch.rand(1, size, size, 2, device=device, dtype=dtype) * 2 - 1
            grad_output = torch.randn(1, 1, size, size, device=device, dtype=dtype)
            kwargs = dict(mode=mode, padding_mode='zeros', align_corners=False)
            with DeterministicGuard(True):
                actual = self._grid_sample_grads(input, grid, grad_output, **kwargs)
                again = self._grid_sample_grads(input, grid, grad_output, **kwargs)
            self.assertEqual(again, actual, atol=0, rtol=0)
            expected = self._grid_sample_grads(
                input.double(), grid.double(), grad_output.double(), **kwargs)[0]
            # thousands of samples per pixel: a tolerance on the scale of the sums
            self.assertEqual(actual[0].double(), expected,
                             atol=2e-2 * expected.abs().max().item(), rtol=0)

    @onlyCUDA
    @dtypes(torch.float, torch.double)
    def test_grid_sample_backward_deterministic_many_channels(self, device, dtype):
        # From 16 channels the deterministic reduce takes channels fastest, from
        # a channels-last copy of grad_output unless its channel stride is 1
        # already: neither the copy nor the channel count changes the bits.
        torch.manual_seed(0)
        for channels in (15, 16, 40):
            input = torch.randn(2, channels, 9, 8, device=device, dtype=dtype)
            grid = torch.rand(2, 20, 21, 2, device=device, dtype=dtype) * 2.4 - 1.2
            grad_output = torch.randn(2, channels, 20, 21, device=device, dtype=dtype)
            last = grad_output.contiguous(memory_format=torch.channels_last)
            for mode in ('bilinear', 'bicubic'):
                kwargs = dict(mode=mode, padding_mode='zeros', align_corners=False)
                with DeterministicGuard(True):
                    plain = self._grid_sample_grads_of(input, grid, grad_output, **kwargs)
                    copied = self._grid_sample_grads_of(input, grid, last, **kwargs)
                    first = self._grid_sample_grads_of(
                        input[:, :1], grid, grad_output[:, :1].contiguous(), **kwargs)
                self.assertEqual(copied, plain, atol=0, rtol=0)
                self.assertEqual(first[0], plain[0][:, :1], atol=0, rtol=0)
                default = self._grid_sample_grads_of(input, grid, grad_output, **kwargs)
                self.assertEqual(plain[0], default[0])

    @onlyCUDA
    # The peak is the second half: a half input and its grad_input of 2^31 + 2^16
    # elements (2 bytes each), plus up to 4 bytes of workspace per element.
    @largeTensorTest('18GB', device='cuda')
    def test_grid_sample_backward_deterministic_large_index(self, device):
        # 64-bit index math: a view whose last element lies beyond 2^31 (as in
        # test_grid_sample_large_index_2d) gives the bits of its contiguous copy.
        torch.manual_seed(0)
        image = torch.zeros(1, 1, 32769, 65536, device=device)
        large_view = image[..., 127::128]
        small_image = torch.rand_like(large_view)
        large_view[...] = small_image
        self.assertGreaterEqual(
            sum(i * s for i, s in zip(large_view.size(), large_view.stride())), 2 ** 31)
        grid = torch.rand(1, 4, 4, 2, device=device) * 2 - 1
        grad_output = torch.randn(1, 1, 4, 4, device=device)
        for mode in ('nearest', 'bilinear', 'bicubic'):
            kwargs = dict(mode=mode, padding_mode='zeros', align_corners=False)
            with DeterministicGuard(True):
                large = self._grid_sample_grads_of(large_view, grid, grad_output, **kwargs)
                small = self._grid_sample_grads_of(small_image, grid, grad_output, **kwargs)
            self.assertEqual(large, small, atol=0, rtol=0)
        del image, large_view, small_image
        # 64-bit sort keys: an input gradient of 2^31 + 2^16 elements, sampled
        # (nearest, align_corners=True) at its four corners.
        input = torch.zeros(1, 1, 32769, 65536, device=device, dtype=torch.half)
        corners = torch.tensor([[[[-1., -1.], [1., -1.]], [[-1., 1.], [1., 1.]]]],
                               device=device, dtype=torch.half)
        grad_output = torch.arange(1., 5., device=device, dtype=torch.half).view(1, 1, 2, 2)
        with DeterministicGuard(True):
            grad_input = self._grid_sample_grads_of(
                input, corners, grad_output, mode='nearest', align_corners=True)[0]
        self.assertEqual(grad_input[0, 0, [0, 0, -1, -1], [0, -1, 0, -1]], grad_output.flatten(),
                         atol=0, rtol=0)
        self.assertEqual(grad_input.count_nonzero().item(), 4)

    @onlyCUDA
    def test_grid_sample_backward_deterministic_expanded_and_strided(self, device):
        # The order of the sums depends on shapes and values only, so strides
        # change no bit: expanded input and grad_output, a transposed grid.
        torch.manual_seed(0)
        for dims in (2, 3):
            input = torch.randn((1, 3) + (6,) * dims, device=device).expand((4, 3) + (6,) * dims)
            grid = torch.rand((4,) + (9,) * (dims - 1) + (11, dims), device=device) * 2.4 - 1.2
            grid = grid.transpose(1, 2).contiguous().transpose(1, 2)
            grad_output = torch.randn((1, 3) + (9,) * (dims - 1) + (11,), device=device)
            grad_output = grad_output.expand((4, 3) + (9,) * (dims - 1) + (11,))
            modes = ('bilinear', 'nearest', 'bicubic') if dims == 2 else ('bilinear', 'nearest')
            for mode in modes:
                kwargs = dict(mode=mode, padding_mode='border', align_corners=False)
                with DeterministicGuard(True):
                    strided = self._grid_sample_grads_of(input, grid, grad_output, **kwargs)
                    contiguous = self._grid_sample_grads_of(
                        input.contiguous(), grid.contiguous(), grad_output.contiguous(), **kwargs)
                self.assertEqual(strided, contiguous, atol=0, rtol=0)

    @onlyCUDA
    def test_grid_sample_backward_deterministic_side_stream_and_graph(self, device):
        # The deterministic backward runs on the current stream, allocates from
        # the caching allocator and never waits for the host: it runs on a side
        # stream and can be captured in a CUDA graph, with the eager bits. Dense
        # and sparse reductions both.
        torch.manual_seed(0)
        for size in (9, 300):
            input = torch.randn(2, 3, size, size, device=device)
            grid = torch.rand(2, 30, 31, 2, device=device) * 0.6 - 0.3
            grad_output = torch.randn(2, 3, 30, 31, device=device)

            def backward():
                return torch.ops.aten.grid_sampler_2d_backward(
                    grad_output, input, grid, 0, 0, False, [True, True])

            with DeterministicGuard(True):
                expected = backward()
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    on_stream = backward()  # also the warm-up before the capture
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    captured = backward()
                graph.replay()
                torch.cuda.synchronize()
            self.assertEqual(on_stream, expected, atol=0, rtol=0)
            self.assertEqual(captured, expected, atol=0, rtol=0)

    @onlyCUDA
    def test_grid_sample_backward_deterministic_gradcheck(self, device):
        torch.manual_seed(0)
        for dims, modes in ((2, ('bilinear', 'nearest', 'bicubic')), (3, ('bilinear', 'nearest'))):
            input = torch.randn((1, 2) + (4,) * dims, device=device, dtype=torch.double)
            grid = torch.rand((1,) + (3,) * dims + (dims,), device=device, dtype=torch.double)
            inputs = (input.requires_grad_(), (grid * 2.2 - 1.1).requires_grad_())
            for mode, padding_mode in product(modes, ('zeros', 'border', 'reflection')):
                def fn(input, grid):
                    return F.grid_sample(input, grid, mode=mode, padding_mode=padding_mode,
                                         align_corners=False)

                with DeterministicGuard(True):
                    self.assertTrue(torch.autograd.gradcheck(fn, inputs, nondet_tol=0))

    @onlyCUDA
    def test_grid_sample_backward_deterministic_gradgradcheck(self, device):
        torch.manual_seed(0)
        input = torch.randn(1, 2, 4, 4, device=device, dtype=torch.double, requires_grad=True)
        grid = torch.rand(1, 3, 3, 2, device=device, dtype=torch.double) * 2.2 - 1.1
        grid.requires_grad_()
        for padding_mode in ('zeros', 'border', 'reflection'):
            def fn(input, grid):
                return F.grid_sample(input, grid, padding_mode=padding_mode, align_corners=False)

            with DeterministicGuard(True):
                self.assertTrue(torch.autograd.gradgradcheck(fn, (input, grid), nondet_tol=0))

    @onlyCUDA
    def test_grid_sample_backward_deterministic_dispatch(self, device):
        # Deterministic mode never alerts, whichever gradients are requested, and
        # the requested ones repeat bit for bit; grad_input does not depend on
        # whether grad_grid is requested too. The kernels that ran show which
        # backward made grad_input.
        torch.manual_seed(0)
        masks = ((True, True), (True, False), (False, True))
        for dims in (2, 3):
            input = torch.randn((2, 3) + (6,) * dims, device=device)
            grid = torch.rand((2,) + (9,) * dims + (dims,), device=device) * 0.6 - 0.3
            grad_output = torch.randn((2, 3) + (9,) * dims, device=device)
            backward = getattr(torch.ops.aten, f'grid_sampler_{dims}d_backward')

            def grads(mask):
                return backward(grad_output, input, grid, 0, 0, False, list(mask))

            for warn_only, mask in product((False, True), masks):
                with DeterministicGuard(True, warn_only=warn_only):
                    self.assertNotWarn(lambda mask=mask: grads(mask), f'{dims}D, {mask} alerted')
                    first, again = grads(mask), grads(mask)
                for requested, a, b in zip(mask, first, again):
                    if requested:
                        self.assertEqual(a, b, atol=0, rtol=0)
            with DeterministicGuard(True):
                both, input_only = grads((True, True)), grads((True, False))
            self.assertEqual(input_only[0], both[0], atol=0, rtol=0)
            self._check_grid_sample_backward_kernels(dims, grads, masks)

    @onlyCUDA
    def test_grid_sample_backward_deterministic_input_only(self, device):
        # Only grad_input requested (output_mask (True, False), as autograd asks
        # when the grid needs no gradient): the deterministic grad_input repeats
        # bit for bit and is what autograd returns, and grad_grid is what the
        # default backward gives: None through autograd, and from the op defined
        # or not as the default op's is (the op returns a grad_grid whatever
        # output_mask says; the values of one not requested are no part of its
        # contract).
        torch.manual_seed(0)
        for dims in (2, 3):
            input = torch.randn((2, 3) + (6,) * dims, device=device)
            grid = torch.rand((2,) + (9,) * dims + (dims,), device=device) * 0.6 - 0.3
            grad_output = torch.randn((2, 3) + (9,) * dims, device=device)
            backward = getattr(torch.ops.aten, f'grid_sampler_{dims}d_backward')
            modes = ('bilinear', 'nearest', 'bicubic') if dims == 2 else ('bilinear', 'nearest')
            for mode_enum, mode in enumerate(modes):
                args = (grad_output, input, grid, mode_enum, 0, False, [True, False])

                def autograd_grads():
                    i = input.detach().requires_grad_()
                    g = grid.detach()
                    F.grid_sample(i, g, mode=mode, align_corners=False).backward(grad_output)
                    return i.grad, g.grad

                expected, expected_autograd = backward(*args), autograd_grads()
                with DeterministicGuard(True):
                    first, again = backward(*args), backward(*args)
                    actual_autograd = autograd_grads()
                msg = f'{dims}D, {mode}'
                self.assertEqual(again[0], first[0], atol=0, rtol=0, msg=msg)
                self.assertEqual(actual_autograd[0], first[0], atol=0, rtol=0, msg=msg)
                self.assertEqual(first[0], expected[0], msg=msg)
                self.assertIsNone(expected_autograd[1], msg=msg)
                self.assertIsNone(actual_autograd[1], msg=msg)
                self.assertEqual(first[1] is None, expected[1] is None, msg=msg)

    @onlyCUDA
    @dtypes(torch.float, torch.double)
    def test_grid_sample_backward_deterministic_non_finite_grid(self, device, dtype):
        # NaN and +-Inf coordinates, some in x alone and some in y alone: the
        # default backward's gradients, with NaN and Inf in the same elements
        # (compared bit for bit) and the finite values equal up to summation
        # order. Bicubic with border or reflection padding puts a non-finite
        # coordinate's NaN terms on an edge pixel of grad_input.
        # 3-D takes NaN only: #24823 reports +-Inf coordinates corrupting CUDA
        # memory in the 3-D kernel (NaN did not), so there the default backward
        # is no safe reference for them. 5-D bicubic is left out: there a
        # point with a non-finite coordinate gets no tap, where the default
        # backward pads its NaN terms onto an edge voxel (test_..._5d_bicubic
        # covers finite grids).
        torch.manual_seed(0)
        eps = torch.finfo(dtype).eps
        non_finite_grad_input = False
        for dims in (2, 3):
            specials = (float('nan'), float('inf'), -float('inf')) if dims == 2 else (float('nan'),)
            input = torch.randn((2, 3) + (5,) * dims, device=device, dtype=dtype)
            grid = torch.rand((2,) + (6,) * dims + (dims,), device=device, dtype=dtype) * 2.4 - 1.2
            pick = torch.randint(0, 4 * len(specials), grid.shape, device=device)
            for k, value in enumerate(specials):
                grid[pick == k] = value
            grad_output = torch.randn((2, 3) + (6,) * dims, device=device, dtype=dtype)
            backward = getattr(torch.ops.aten, f'grid_sampler_{dims}d_backward')
            modes = (0, 1, 2) if dims == 2 else (0, 1)  # bilinear, nearest, bicubic
            for mode, padding_mode, align_corners in product(modes, (0, 1, 2), (False, True)):
                args = (grad_output, input, grid, mode, padding_mode, align_corners, [True, True])
                expected = backward(*args)
                with DeterministicGuard(True):
                    actual = backward(*args)
                for name, a, e in zip(('grad_input', 'grad_grid'), actual, expected):
                    msg = f'{dims}D {name}, mode={mode}, padding_mode={padding_mode}, align_corners={align_corners}'
                    finite = e.isfinite()
                    self.assertEqual(a.isfinite(), finite, msg=msg)
                    self.assertEqual(a[~finite], e[~finite], atol=0, rtol=0, msg=msg)
                    # a term's rounding, added in another order: a misplaced tap is off by O(1)
                    scale = e[finite].abs().max().item() if finite.any() else 0
                    self.assertEqual(a[finite], e[finite], atol=64 * eps * max(scale, 1), rtol=0, msg=msg)
                non_finite_grad_input |= not expected[0].isfinite().all().item()
        self.assertTrue(non_finite_grad_input)

    @onlyCUDA
    @dtypes(torch.float, torch.double)
    def test_grid_sample_backward_deterministic_5d_bicubic(self, device, dtype):
        # Bicubic sampling of 5-D input (64 taps a point), where torch has it:
        # the same bits on every run, and the default backward's gradients up
        # to summation order.
        torch.manual_seed(0)
        input = torch.randn(2, 3, 4, 5, 6, device=device, dtype=dtype)
        grid = torch.rand(2, 3, 4, 5, 3, device=device, dtype=dtype) * 2.4 - 1.2
        try:
            F.grid_sample(input, grid, mode='bicubic', align_corners=False)
        except RuntimeError as e:
            raise unittest.SkipTest(f'no bicubic interpolation of 5-D input in this torch: {e}') from None
        grad_output = torch.randn(2, 3, 3, 4, 5, device=device, dtype=dtype)
        for padding_mode, align_corners in product((0, 1, 2), (False, True)):
            args = (grad_output, input, grid, 2, padding_mode, align_corners, [True, True])
            expected = torch.ops.aten.grid_sampler_3d_backward(*args)
            with DeterministicGuard(True):
                first = torch.ops.aten.grid_sampler_3d_backward(*args)
                second = torch.ops.aten.grid_sampler_3d_backward(*args)
            msg = f'padding_mode={padding_mode}, align_corners={align_corners}'
            self.assertEqual(first[0], second[0], atol=0, rtol=0, msg=msg)
            self.assertEqual(first[0], expected[0], msg=msg)
            self.assertEqual(first[1], expected[1], msg=msg)

    @onlyCUDA
    @dtypes(torch.float, torch.double)
    def test_grid_sample_backward_deterministic_hot_run_across_chunks(self, device, dtype):
        # A constant grid: every point's taps land on the same pixels, so each
        # of them has a run of a record per point, longer than a chunk of
        # kMaxChunkRecords = 2^19 records (GridSamplerDeterministic.cu): the
        # run spans a chunk boundary and its sum carries from chunk to chunk.
        torch.manual_seed(0)
        max_chunk_records = 2 ** 19
        input = torch.randn(1, 2, 6, 7, device=device, dtype=dtype)
        grid = torch.full((1, 768, 768, 2), 0.1, device=device, dtype=dtype)
        grad_output = torch.randn(1, 2, 768, 768, device=device, dtype=dtype)
        self.assertGreater(768 * 768, max_chunk_records)
        for mode, taps in (('nearest', 1), ('bilinear', 4)):
            kwargs = dict(mode=mode, padding_mode='zeros', align_corners=False)
            with DeterministicGuard(True):
                actual = self._grid_sample_grads(input, grid, grad_output, **kwargs)
                again = self._grid_sample_grads(input, grid, grad_output, **kwargs)
            self.assertEqual(again, actual, atol=0, rtol=0)
            self.assertEqual(actual[0][0, 0].count_nonzero().item(), taps)
            # the default adds each hot pixel's 589,824 terms one by one
            expected = self._grid_sample_grads(input, grid, grad_output, **kwargs)
            for a, e in zip(actual, expected):
                self.assertEqual(a, e, atol=1e-3 * e.abs().max().item(), rtol=0)


# Per test, what the kit needs beyond its code (a literal: the kit reads it with ast):
# - checks: the behaviour, in words (the notes `detgrid patch` prints);
# - covered_if: regexes that all match the source of a checkout's own deterministic grid_sample
#   test checking the same behaviour: the test is then not added (upstream main has six such
#   tests, from #196856). None: no upstream test can, the test checks this kernel's own paths
#   (its sparse reduction, its chunks, its channels-fastest reduce, its 64-bit keys);
# - needs_double_backward: it differentiates the backward, so it is added only where derivatives.yaml
#   differentiates grid_sampler_2d_backward (#177487);
# - in_tree_only_on_cuda: it claims the default kernel's grad_grid bits, which only a build where
#   that kernel makes both sides gives: the patched one (on CPU, stock's kernel both ways), not
#   the extension on CUDA (tests/test_upstream_tests.py says why).
ADDED = {
    "test_grid_sample_2d_backward_deterministic": {
        "checks": "2-D backward bitwise reproducible for every mode, padding and align_corners, "
                  "4 dtypes",
        # every padding mode, compared bit for bit
        "covered_if": (r"['\"]zeros['\"]", r"['\"]border['\"]", r"['\"]reflection['\"]",
                       r"atol=0, rtol=0|\.view\(torch\.u?int"),
    },
    "test_grid_sample_3d_backward_deterministic": {
        "checks": "3-D backward bitwise reproducible for every mode, padding and align_corners, "
                  "4 dtypes",
        "covered_if": (r"['\"]zeros['\"]", r"['\"]border['\"]", r"['\"]reflection['\"]",
                       r"atol=0, rtol=0|\.view\(torch\.u?int"),
    },
    "test_grid_sample_2d_backward_deterministic_matches_default": {
        "checks": "2-D deterministic gradients as accurate as the default backward's against a "
                  "float64 oracle, 4 dtypes",
        # a float64 (or CPU float64) oracle computed outside the guard
        "covered_if": (r"\.double\(\)",),
    },
    "test_grid_sample_3d_backward_deterministic_matches_default": {
        "checks": "3-D deterministic gradients as accurate as the default backward's against a "
                  "float64 oracle, 4 dtypes",
        "covered_if": (r"\.double\(\)",),
    },
    "test_grid_sample_2d_backward_deterministic_cudnn": {
        "checks": "the cuDNN route's backward is the deterministic one",
        "covered_if": (r"CudnnGridSamplerBackward|cudnn_grid_sampler\(",),
    },
    "test_grid_sample_backward_deterministic_grid_only": {
        "checks": "with only the grid gradient requested, no alert (warn_only included) and the "
                  "default backward's bits",
        # an output mask without grad_input, or an input that requires no gradient
        "covered_if": (r"\(\s*False\s*,\s*True\s*\)|requires_grad_\(False\)",),
        "in_tree_only_on_cuda": True,
    },
    "test_grid_sample_backward_deterministic_sparse_reduction": {
        "checks": "a few points on a large image (the sparse reduction) reproduce and match the "
                  "default",
        "covered_if": None,
    },
    "test_grid_sample_backward_deterministic_several_chunks": {
        "checks": "inputs needing several workspace chunks (float carry for half/bfloat16) "
                  "reproduce and match a float64 reference",
        "covered_if": None,
    },
    "test_grid_sample_backward_deterministic_many_channels": {
        "checks": "from 16 channels, with and without the channels-last copy of grad_output, the "
                  "same bits",
        "covered_if": None,
    },
    "test_grid_sample_backward_deterministic_large_index": {
        "checks": "64-bit index math and 64-bit sort keys (more than 2^31 elements)",
        "covered_if": None,
    },
    "test_grid_sample_backward_deterministic_expanded_and_strided": {
        "checks": "expanded (zero-stride) and non-contiguous inputs give their contiguous copies' "
                  "bits",
        "covered_if": (r"\.expand\(",),
    },
    "test_grid_sample_backward_deterministic_side_stream_and_graph": {
        "checks": "on a side stream and captured in a CUDA graph, the eager bits",
        "covered_if": (r"torch\.cuda\.graph\(|CUDAGraph",),
    },
    "test_grid_sample_backward_deterministic_gradcheck": {
        "checks": "gradcheck in float64 through the deterministic backward",
        "covered_if": (r"gradcheck\(",),
    },
    "test_grid_sample_backward_deterministic_gradgradcheck": {
        "checks": "gradgradcheck in float64 through the deterministic backward",
        "covered_if": (r"gradgradcheck\(",),
        "needs_double_backward": True,
    },
    "test_grid_sample_backward_deterministic_dispatch": {
        "checks": "no alert in deterministic mode (warn_only included) for every output mask, "
                  "repeated bits, grad_input's bits whether or not grad_grid is requested, and "
                  "the deterministic kernels in the profile exactly where grad_input is requested "
                  "in deterministic mode",
        # warn_only, and both masks with one gradient
        "covered_if": ("warn_only", r"\(\s*True\s*,\s*False\s*\)",
                       r"\(\s*False\s*,\s*True\s*\)|requires_grad_\(False\)"),
    },
    "test_grid_sample_backward_deterministic_input_only": {
        "checks": "with only grad_input requested, repeated bits, autograd's grad_input, and "
                  "grad_grid None or defined as the default backward's",
        # the input-only mask, and a look at the gradient left out
        "covered_if": (r"[\(\[]\s*True\s*,\s*False\s*[\)\]]", r"assertIsNone\(|is None"),
    },
    "test_grid_sample_backward_deterministic_non_finite_grid": {
        "checks": "NaN and +-Inf grids (3-D: NaN only, #24823): the default backward's gradients, "
                  "NaN and Inf in the same elements, finite values up to summation order",
        # NaN and infinite coordinates
        "covered_if": (r"float\(\s*['\"]nan['\"]\s*\)|torch\.nan|math\.nan",
                       r"float\(\s*['\"][+-]?inf['\"]\s*\)|torch\.inf|math\.inf"),
    },
    "test_grid_sample_backward_deterministic_5d_bicubic": {
        "checks": "5-D bicubic, where torch samples it: repeated bits, and the default backward's "
                  "gradients (skipped where torch has no 5-D bicubic)",
        "covered_if": None,
    },
    "test_grid_sample_backward_deterministic_hot_run_across_chunks": {
        "checks": "a constant grid, each hot pixel's run of records spanning a chunk boundary: "
                  "repeated bits, and the default backward's sums",
        "covered_if": None,
    },
}
