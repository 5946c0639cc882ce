# Owner(s): ["module: nn"]
"""detgrid under torch.compile (inductor), on the CPU switch: README's note.

Inductor decomposes grid_sample's forward but has no lowering for
aten::grid_sampler_2d_backward: it calls the aten op (a "fallback"), so the
dispatcher, and with it detgrid's override, still sees the backward. The
profiler shows the call in the compiled backward, and the gradients carry
detgrid's bits, which differ from stock's on this problem (asserted)."""

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.testing._internal.common_utils import DeterministicGuard, run_tests

import detgrid
from detgrid_testing import (
    BILINEAR,
    ZEROS,
    DetgridTestCase,
    assert_bitwise_equal,
    detgrid_backward,
    make_zoom_problem,
    same_bits,
    stock_backward,
)


def _sample(inp, grid):
    return F.grid_sample(inp, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


class TestCompileOnCPU(DetgridTestCase):
    def test_inductor_backward_reaches_the_override(self):
        grad_output, inp, grid = make_zoom_problem(1, 2, 6, 7, 40, 40, dtype=torch.float32, seed=3)
        ours = detgrid_backward(grad_output, inp, grid, BILINEAR, ZEROS, False, (True, True))
        stock = stock_backward(grad_output, inp, grid, BILINEAR, ZEROS, False, (True, True))
        self.assertFalse(same_bits(ours[0], stock[0]), "precondition: the bits tell them apart")
        compiled = torch.compile(_sample, backend="inductor", fullgraph=True)

        def grads():
            x, g = inp.clone().requires_grad_(), grid.clone().requires_grad_()
            compiled(x, g).backward(grad_output)
            return x.grad, g.grad

        with detgrid.enabled("cpu"), DeterministicGuard(True):
            grads()  # compiles, outside the profile: tracing records aten ops too
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                input_grad, grid_grad = grads()
        called = {e.key for e in prof.key_averages()}
        self.assertIn("aten::grid_sampler_2d_backward", called)
        assert_bitwise_equal(self, input_grad, ours[0], "input.grad")
        assert_bitwise_equal(self, grid_grad, ours[1], "grid.grad")


if __name__ == "__main__":
    run_tests()
