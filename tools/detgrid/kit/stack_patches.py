"""Writes patches/stack/: the upstream change as a stack of patches (detgrid.levels.UPSTREAM_STACK).

01-core.patch is `detgrid patch --upto core` on a fresh copy of the cached v2.6.0 tree: the new
GridSamplerDeterministic.cu, its declaration, the dispatch in both launchers and the core's tests.
02-cudnn.patch is `detgrid patch --upto cudnn` on the same tree, the core committed: `detgrid
patch` finds every core edit present, so the commit holds the cuDNN route alone (the composite's
choice, the cuDNN backward's alert, their tests, the docs). Each speed level after them
(03-grouped-channels.patch, ...) is `detgrid patch --upto LEVEL` on the same tree: the core's
GridSamplerDeterministic.cu as the stack up to that level has it (stack.core_sources), alone.
Beside each patch its body (NN-name.md) says what it changes and what it breaks: the core's and
the cuDNN route's are BODIES below, a speed level's is aten_kernels/levels/<name>/BODY.md.
Applying the patches in name order gives patches/v2.6.0.patch's tree.

    python -m detgrid.kit.stack_patches --write patches/stack
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional

from detgrid.kit import stack

STACK_DIR = Path("patches") / "stack"
REGENERATE = "python -m detgrid.kit.stack_patches --write patches/stack"

# Each patch's body (NN-name.md): what it changes, then what a user may notice (BC notes). A speed
# level's body is its own file, beside its diff (BODY_FILE).
BODY_FILE = "BODY.md"
BODIES: Dict[str, str] = {
    "core": """\
Under `torch.use_deterministic_algorithms(True)` the CUDA backward of `grid_sample` (4-D and
5-D input) no longer alerts when grad_input is requested: the new
`GridSamplerDeterministic.cu` computes grad_input without atomics (Note [Deterministic
grid_sampler backward]). Per chunk of at most 2^19 records, each tap becomes a record keyed by
the grad_input position it lands on; `at::cuda::cub` radix-sorts the records and
`unique_by_key` finds each position's run; runs are summed in 256-record partials, then a
thread per (run, channel) adds them in order: the existing kernel's terms, up to FMA
contraction, summed in another order. The existing kernel then computes grad_grid alone.
Keys and index math are 32-bit where `canUse32BitIndexMath` allows. Sort buffers stay within
64 MiB per chunk (CUB's temporary storage aside); Half and BFloat16 sums over several chunks
take a float scratch of grad_input's size. The alert tests expect no alert; `test_nn.py` gains
the deterministic backward's tests.

**BC notes**

- `warn_only=True` takes the new path too: no warning, new bits.
- Calls with only grad_grid requested keep the existing kernel and no longer alert.
- Half/BFloat16 grad_input is summed in float and rounded once, where the existing kernel
  rounds at each atomic add: its values move by the rounding that no longer happens.
- Outside deterministic mode nothing changes.
""",
    "cudnn": """\
With the core alone, `grid_sample` on a cuDNN-eligible input (bilinear, zeros padding,
`align_corners=True`) still runs cuDNN, whose backward is nondeterministic. This patch makes
the composite `grid_sampler` skip cuDNN in deterministic mode, so `grid_sample`'s backward is
the deterministic one on every route. `cudnn_grid_sampler_backward`, reached only by a direct
`torch.cudnn_grid_sampler` call, alerts in deterministic mode (the alert is added where the
tree lacks it). `test_torch.py`'s cuDNN alert test calls `torch.cudnn_grid_sampler` itself; a
new test checks that `grid_sample` on a cuDNN-eligible input does not alert. The docstring of
`use_deterministic_algorithms` and the reproducibility notes list `grid_sample`'s CUDA backward
as deterministic: only true from this patch on.

**BC notes**

- In deterministic mode (`warn_only` included) the forward leaves cuDNN for `grid_sampler_2d`:
  its output bits can change from the default mode's.
- A direct `torch.cudnn_grid_sampler` backward in deterministic mode raises (warns with
  `warn_only`).
""",
}


def write_patches(out_dir: Path, name: str, email: str, kit: Optional[Path] = None) -> int:
    """The stack's patches, from a fresh copy of the cached v2.6.0 tree (never the cache):
    `detgrid patch --upto NAME` for each patch in order, on the same tree."""
    from detgrid.kit import patch, upstream_tree

    kit = patch.kit_root(kit)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="detgrid-stack-") as tmp:
        tree = upstream_tree.fresh_git_copy(Path(tmp) / "pytorch")
        for key, value in (("user.name", name), ("user.email", email)):
            subprocess.run(["git", "-C", str(tree), "config", key, value], check=True)
        for part in stack.UPSTREAM_STACK:
            head = patch.patch_apply.git(tree, "rev-parse", "HEAD")
            rc = patch.main(["patch", "--pytorch", str(tree), "--upto", part.name,
                             "--out", str(out_dir / f"{part.patch}.patch")])
            if rc != 0:
                return rc
            if patch.patch_apply.git(tree, "rev-parse", "HEAD") == head:
                print(f"detgrid stack_patches: {part.name}: nothing to commit", file=sys.stderr)
                return 1
    return 0


def body_source(part: stack.UpstreamPatch, kit: Optional[Path] = None) -> Path:
    """Where a speed level's body is: aten_kernels/levels/<name>/BODY.md of the kit."""
    from detgrid.kit import patch

    return patch.kit_root(kit) / stack.LEVELS_ROOT / part.name / BODY_FILE


def body(part: stack.UpstreamPatch, kit: Optional[Path] = None) -> str:
    """NN-name.md: the patch's subject, then what it changes and its BC notes (a speed level's
    from its BODY.md)."""
    text = body_source(part, kit).read_text() if part.speed_level else BODIES[part.name]
    return f"# {part.title}\n\n{text}"


def write_bodies(out_dir: Path, kit: Optional[Path] = None) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for part in stack.UPSTREAM_STACK:
        (out_dir / f"{part.patch}.md").write_text(body(part, kit))


def main(argv=None) -> int:
    from detgrid.kit import upstream_tree

    parser = argparse.ArgumentParser(prog="python -m detgrid.kit.stack_patches")
    parser.add_argument("--write", metavar="DIR", required=True, type=Path,
                        help="where the patches and their bodies go (patches/stack)")
    parser.add_argument("--bodies-only", action="store_true",
                        help="only the bodies (no upstream tree needed)")
    args = parser.parse_args(argv)
    if not args.bodies_only:
        try:
            ident = upstream_tree._kit_author()
            upstream_tree.fetch()
        except upstream_tree.Unavailable as e:
            print(f"detgrid stack_patches: {e}", file=sys.stderr)
            return 3
        rc = write_patches(args.write, *ident)
        if rc != 0:
            return rc
    write_bodies(args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
