# Owner(s): ["module: nn"]
"""The seeds' recipe in the runtime package (detgrid.seeding):
seed_everything, dataloader_kwargs and check_determinism, which tells a
function that returns the same bits on every call from one that does not,
a whole training step (loss, backward, gradients) included. repro/ loads
this same file, and its docstring's example runs as written."""

import os
import random
import re
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.testing._internal.common_utils import DeterministicGuard, TestCase, run_tests

import detgrid
from detgrid import seeding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "repro"))
import seeding as repro_seeding  # noqa: E402


def cudnn_flags_mutable():
    """common_utils freezes torch.backends.cudnn's global flags for tests; the
    recipe sets them as a user script does, so lift the freeze around it."""
    return getattr(torch.backends, "__allow_nonbracketed_mutation")()


def training_step(*, reseed):
    """One step of a small conv + grid_sample model: its loss and gradients.
    reseed=False leaves the dropout mask to whatever the generator holds."""
    if reseed:
        torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 12, 12, generator=generator)
    grid = torch.rand(2, 20, 20, 2, generator=generator) * 2 - 1
    model = torch.nn.Conv2d(3, 4, 3, padding=1)
    torch.nn.init.normal_(model.weight, generator=generator)
    features = F.dropout(model(x), p=0.5)
    loss = F.grid_sample(features, grid, align_corners=False).square().mean()
    loss.backward()
    return [loss] + [p.grad for p in model.parameters()]


class TestSeeding(TestCase):
    def setUp(self):
        self.saved = (torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled(),
                      torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)

    def tearDown(self):
        torch.use_deterministic_algorithms(self.saved[0], warn_only=self.saved[1])
        with cudnn_flags_mutable():
            torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = self.saved[2:]

    def test_the_package_exports_the_recipe(self):
        self.assertIs(detgrid.seed_everything, seeding.seed_everything)
        self.assertIs(detgrid.dataloader_kwargs, seeding.dataloader_kwargs)
        self.assertIs(detgrid.check_determinism, seeding.check_determinism)

    def test_repro_scripts_load_the_package_file(self):
        self.assertEqual(os.path.realpath(repro_seeding.recipe.__file__),
                         os.path.realpath(seeding.__file__))

    def test_check_determinism_detects_an_unseeded_random_fn(self):
        result = detgrid.check_determinism(lambda: torch.randn(16), runs=3)
        self.assertFalse(result["deterministic"])
        self.assertEqual(result["distinct"], 3)

    def test_check_determinism_passes_a_deterministic_fn(self):
        def seeded():
            torch.manual_seed(0)
            return torch.randn(16), torch.arange(4)

        result = detgrid.check_determinism(seeded, runs=4)
        self.assertTrue(result["deterministic"])
        self.assertEqual(len(result["hashes"]), 4)

    def test_check_determinism_passes_a_reseeded_training_step(self):
        with detgrid.enabled("cpu"), DeterministicGuard(True):
            result = detgrid.check_determinism(lambda: training_step(reseed=True), runs=3)
        self.assertTrue(result["deterministic"], result["hashes"])

    def test_check_determinism_fails_a_training_step_with_fresh_dropout(self):
        with detgrid.enabled("cpu"), DeterministicGuard(True):
            result = detgrid.check_determinism(lambda: training_step(reseed=False), runs=3)
        self.assertFalse(result["deterministic"])
        self.assertEqual(result["distinct"], 3)

    def test_check_determinism_needs_two_runs(self):
        with self.assertRaisesRegex(ValueError, "at least 2 runs"):
            detgrid.check_determinism(lambda: torch.zeros(1), runs=1)

    def test_hash_sees_bits_dtype_and_shape(self):
        self.assertNotEqual(seeding.sha256(torch.zeros(4)), seeding.sha256(torch.zeros(2, 2)))
        self.assertNotEqual(seeding.sha256(torch.zeros(4)), seeding.sha256(-torch.zeros(4)))
        self.assertEqual(seeding.sha256(torch.ones(3)[1:]), seeding.sha256(torch.ones(2)))

    def test_seed_everything_applies_the_recipe(self):
        with cudnn_flags_mutable():
            applied = detgrid.seed_everything(7, warn_only=True)
        self.assertTrue(torch.are_deterministic_algorithms_enabled())
        self.assertTrue(torch.is_deterministic_algorithms_warn_only_enabled())
        self.assertFalse(torch.backends.cudnn.benchmark)
        self.assertTrue(torch.backends.cudnn.deterministic)
        self.assertIn(os.environ["CUBLAS_WORKSPACE_CONFIG"], (":4096:8", ":16:8"))
        self.assertEqual(applied["seed"], 7)

    def test_seed_everything_makes_python_numpy_and_torch_draws_repeat(self):
        def draws():
            with cudnn_flags_mutable():
                detgrid.seed_everything(3, deterministic=False)
            import numpy
            return random.random(), float(numpy.random.rand()), torch.rand(2).tolist()

        self.assertEqual(draws(), draws())

    def test_dataloader_kwargs_make_shuffling_and_workers_repeat(self):
        class Noisy(torch.utils.data.Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return torch.tensor([float(i), random.random(), torch.rand(()).item()])

        def epoch():
            loader = torch.utils.data.DataLoader(Noisy(), batch_size=2, shuffle=True,
                                                 num_workers=2,
                                                 **detgrid.dataloader_kwargs(5))
            return torch.cat(list(loader))

        self.assertEqual(epoch(), epoch(), atol=0, rtol=0)

    def test_docstring_example_runs_as_written(self):
        # The indented block of the module docstring, in a fresh interpreter.
        block = re.search(r"\n\n((?:    .*\n|\n)+)", seeding.__doc__).group(1)
        code = "\n".join(line[4:] for line in block.splitlines())
        proc = subprocess.run([sys.executable, "-W", "error", "-c", code],
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("check_determinism(train_step", code)


if __name__ == "__main__":
    run_tests()
