# Owner(s): ["module: nn"]
"""The direct ops detgrid.ops.* (torch.ops.detgrid.*) are a backward without
a derivative of their own: a call whose inputs require grad while grad mode
is on is refused with a clear error (rather than the dispatcher's warning and
a grad_fn that backpropagates nothing); every other call runs as before.
Differentiating a gradient goes through F.grid_sample with detgrid.enable()
(test_switch.py's double-backward tests)."""

import warnings

import torch
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)

from detgrid import ops
from detgrid_testing import (
    BILINEAR,
    ZEROS,
    DetgridTestCase,
    assert_pair_bitwise_equal,
    make_problem,
)

ARGUMENTS = ("grad_output", "input", "grid")


def _problem(dims):
    if dims == 2:
        return make_problem(1, 2, 4, 5, 3, 3, seed=5)
    return make_problem(1, 2, 4, 5, 3, 3, D=3, out_D=2, seed=5)


def _direct_ops(dims):
    """The plain op and the one with a level and a launch shape, as callables
    of the same arguments."""
    plain = getattr(ops, f"grid_sampler_{dims}d_backward")
    with_options = getattr(ops, f"grid_sampler_{dims}d_backward_with_options")
    return {"plain": plain,
            "with_options": lambda *args: with_options(*args, block_size=32, max_blocks=3,
                                                       level="core")}


# The operator of torch.ops.detgrid that each variant's call reaches first:
# with_options runs the core's grad_input, then the grid gradient.
REFUSING_OP = {"plain": "grid_sampler_{dims}d_backward", "with_options": "_core_grad_input"}


def _call(op, args):
    return op(*args, BILINEAR, ZEROS, False, (True, True))


class TestDirectOpsAutograd(DetgridTestCase):
    @parametrize("argument", ARGUMENTS)
    @parametrize("variant", ("plain", "with_options"))
    @parametrize("dims", (2, 3), name_fn=lambda dims: f"{dims}d")
    def test_input_requiring_grad_raises(self, dims, variant, argument):
        args = list(_problem(dims))
        args[ARGUMENTS.index(argument)].requires_grad_()
        op = _direct_ops(dims)[variant]
        name = REFUSING_OP[variant].format(dims=dims)
        message = (rf"^detgrid::{name} is a backward and has no "
                   r"derivative of its own.*torch\.no_grad\(\).*detgrid\.enable\(\)")
        with self.assertRaisesRegex(RuntimeError, message):
            _call(op, args)

    @parametrize("dims", (2, 3), name_fn=lambda dims: f"{dims}d")
    def test_input_requiring_grad_runs_under_no_grad(self, dims):
        args = _problem(dims)
        expected = _call(_direct_ops(dims)["plain"], args)
        with torch.no_grad():
            got = _call(_direct_ops(dims)["plain"],
                        [t.clone().requires_grad_() for t in args])
        assert_pair_bitwise_equal(self, got, expected)
        self.assertFalse(any(t.requires_grad for t in got))

    @parametrize("dims", (2, 3), name_fn=lambda dims: f"{dims}d")
    def test_inputs_without_grad_run_without_warning_or_grad_fn(self, dims):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            grads = _call(_direct_ops(dims)["plain"], _problem(dims))
        self.assertEqual([str(w.message) for w in caught], [])
        self.assertFalse(any(t.requires_grad or t.grad_fn for t in grads))

    @parametrize("dims", (2, 3), name_fn=lambda dims: f"{dims}d")
    def test_grid_only_call_with_options_is_refused_by_the_grid_gradient(self, dims):
        # No grad_input asked: the grid gradient is the only operator it reaches.
        args = list(_problem(dims))
        args[2].requires_grad_()
        with_options = getattr(ops, f"grid_sampler_{dims}d_backward_with_options")
        with self.assertRaisesRegex(RuntimeError, "^detgrid::_grid_gradient is a backward"):
            with_options(*args, BILINEAR, ZEROS, False, (False, True))

    def test_inference_mode_runs(self):
        args = _problem(2)
        expected = _call(ops.grid_sampler_2d_backward, args)
        with torch.inference_mode():
            got = _call(ops.grid_sampler_2d_backward, args)
        assert_pair_bitwise_equal(self, got, expected)

    def test_refused_call_through_torch_ops_names_the_op(self):
        grad_output, inp, grid = _problem(2)
        with self.assertRaisesRegex(RuntimeError, "^detgrid::grid_sampler_2d_backward is"):
            torch.ops.detgrid.grid_sampler_2d_backward(
                grad_output, inp, grid.requires_grad_(), BILINEAR, ZEROS, False, [True, True])


instantiate_parametrized_tests(TestDirectOpsAutograd)

if __name__ == "__main__":
    run_tests()
