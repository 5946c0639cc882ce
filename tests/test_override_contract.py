# Owner(s): ["module: nn"]
"""The aten overrides behind detgrid.enable() keep the contract of the
generated wrappers and kernels they replace: a call whose tensors lie on two
devices raises stock's error before any routing, and grad_grid is returned
whatever output_mask says (aten's CPU, CUDA and meta kernels always return
one, and C++ callers read it).

On a machine without a GPU the dispatcher sends no mixed call to the CPU
override (a meta tensor takes it to the meta kernel), so the CPU tests
redispatch to the CPU key, where stock's CPU kernel has no device check to
compare with: they pin the error's form. The CUDA tests compare with stock's
own error, and need a GPU and detgrid's CUDA kernels."""

import unittest

import torch
from torch.testing._internal.common_utils import (
    DeterministicGuard,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

import detgrid
from detgrid_testing import (
    BILINEAR,
    HAS_DETGRID_CUDA,
    ZEROS,
    DetgridTestCase,
    assert_bitwise_equal,
    depth_sizes,
    detgrid_backward,
    make_problem,
    stock_backward,
)

DIMS = (2, 3)
ARGUMENTS = ("grad_output", "input", "grid")


def _dims_name(dims):
    return f"{dims}d"


def _aten_backward(dims):
    return (torch.ops.aten.grid_sampler_3d_backward if dims == 3
            else torch.ops.aten.grid_sampler_2d_backward)


def _problem(dims, device="cpu"):
    return make_problem(1, 2, 4, 5, 3, 3, **depth_sizes(dims, 3, 2), device=device, seed=dims)


def _error(call):
    """The message of the RuntimeError that call() raises."""
    try:
        call()
    except RuntimeError as e:
        return str(e)
    raise AssertionError("no RuntimeError raised")


class TestOverrideContract(DetgridTestCase):

    @parametrize("deterministic", (False, True))
    @parametrize("moved", ARGUMENTS)
    @parametrize("dims", DIMS, name_fn=_dims_name)
    def test_mixed_devices_raise_the_generated_wrappers_error(self, dims, moved, deterministic):
        # grad_output (or input, or grid) on meta, the others on CPU, handed
        # to the CPU kernel as the dispatcher would hand a mixed call to the
        # CUDA one: the check runs before routing, in and out of
        # deterministic mode, and names the first argument off the first
        # tensor's device.
        args = list(_problem(dims))
        args[ARGUMENTS.index(moved)] = args[ARGUMENTS.index(moved)].to("meta")
        reported = "grid" if moved == "grid" else "input"
        op = _aten_backward(dims).default
        cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
        with detgrid.enabled(("cpu",)), DeterministicGuard(deterministic):
            message = _error(lambda: op.redispatch(cpu, *args, BILINEAR, ZEROS, False,
                                                   [True, True]))
        self.assertTrue(message.startswith(
            "Expected all tensors to be on the same device, but "), message)
        self.assertTrue(message.endswith(
            f"in method wrapper_CPU__grid_sampler_{dims}d_backward)"), message)
        self.assertRegex(message, rf"\b{reported}\b")
        self.assertIn("cpu", message)
        self.assertIn("meta", message)

    @parametrize("deterministic", (False, True))
    @parametrize("dims", DIMS, name_fn=_dims_name)
    def test_aten_call_for_grad_input_alone_returns_a_grad_grid(self, dims, deterministic):
        # Autograd discards it, but C++ callers of the op (cpp-wrapper
        # fallbacks, functorch's batch rule) read result[1]. In deterministic
        # mode detgrid serves the call and returns zeros; outside it stock
        # does.
        args = _problem(dims)
        with detgrid.enabled(("cpu",)), DeterministicGuard(deterministic):
            grad_input, grad_grid = _aten_backward(dims)(*args, BILINEAR, ZEROS, False,
                                                         [True, False])
        grid = args[2]
        self.assertIsNotNone(grad_grid)
        self.assertEqual(grad_grid.shape, grid.shape)
        self.assertEqual(grad_grid.dtype, grid.dtype)
        self.assertTrue(grad_grid.is_contiguous())
        if deterministic:
            ours = detgrid_backward(*args, BILINEAR, ZEROS, False, (True, False))
            assert_bitwise_equal(self, grad_input, ours[0], "grad_input")
            self.assertEqual(grad_grid, torch.zeros_like(grid), atol=0, rtol=0)

    @parametrize("dims", DIMS, name_fn=_dims_name)
    def test_aten_call_for_nothing_returns_stocks_grad_grid_on_cpu(self, dims):
        # Deterministic or not, stock's CPU kernel serves it (backward_route).
        args = _problem(dims)
        with detgrid.enabled(("cpu",)), DeterministicGuard(True):
            grad_input, grad_grid = _aten_backward(dims)(*args, BILINEAR, ZEROS, False,
                                                         [False, False])
        self.assertIsNone(grad_input)
        stock = stock_backward(*args, BILINEAR, ZEROS, False, (False, False))
        assert_bitwise_equal(self, grad_grid, stock[1], "grad_grid")


@unittest.skipUnless(HAS_DETGRID_CUDA, "needs a GPU and detgrid's CUDA kernels")
class TestOverrideContractOnCUDA(DetgridTestCase):

    def _stock_and_override_errors(self, call, deterministic):
        with DeterministicGuard(deterministic):
            stock = _error(call)
            with detgrid.enabled(("cuda",)):
                override = _error(call)
        return stock, override

    @parametrize("deterministic", (False, True))
    @parametrize("moved", ARGUMENTS)
    @parametrize("dims", DIMS, name_fn=_dims_name)
    def test_mixed_devices_raise_stocks_error(self, dims, moved, deterministic):
        # One argument left on the CPU: stock's wrapper raises before its
        # kernel (before its deterministic alert too); the override must not
        # hand the kernel a host pointer.
        args = list(_problem(dims, "cuda"))
        args[ARGUMENTS.index(moved)] = args[ARGUMENTS.index(moved)].cpu()
        stock, override = self._stock_and_override_errors(
            lambda: _aten_backward(dims)(*args, BILINEAR, ZEROS, False, [True, True]),
            deterministic)
        self.assertIn("Expected all tensors to be on the same device", stock)
        self.assertEqual(override, stock)

    @parametrize("deterministic", (False, True))
    def test_mixed_devices_raise_stocks_error_for_cudnn(self, deterministic):
        if not torch.backends.cudnn.is_available():
            self.skipTest("cuDNN is not available")
        grad_output, inp, grid = _problem(2, "cuda")
        stock, override = self._stock_and_override_errors(
            lambda: torch.ops.aten.cudnn_grid_sampler_backward(inp, grid, grad_output.cpu()),
            deterministic)
        self.assertIn("Expected all tensors to be on the same device", stock)
        self.assertEqual(override, stock)

    @parametrize("mask", ((True, False), (False, False)),
                 name_fn=lambda mask: "input_only" if mask[0] else "nothing")
    @parametrize("dims", DIMS, name_fn=_dims_name)
    def test_deterministic_aten_call_returns_a_grad_grid(self, dims, mask):
        args = _problem(dims, "cuda")
        with detgrid.enabled(("cuda",)), DeterministicGuard(True):
            _, grad_grid = _aten_backward(dims)(*args, BILINEAR, ZEROS, False, list(mask))
        self.assertIsNotNone(grad_grid)
        self.assertEqual(grad_grid, torch.zeros_like(args[2]), atol=0, rtol=0)


instantiate_parametrized_tests(TestOverrideContract)
instantiate_parametrized_tests(TestOverrideContractOnCUDA)

if __name__ == "__main__":
    run_tests()
