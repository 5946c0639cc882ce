"""Writes patches/stack/: the upstream change as a stack of patches (detgrid.kit.stack).

01-core.patch is `detgrid patch --upto core` on a fresh copy of the cached v2.6.0 tree: the
dispatch, docs, tests and the core's kernel files. Each later patch is one level's commit on top
of the ones before it: its own files added, the core's seams cut to it. Beside each patch its
body (NN-name.md) says what the step changes and, in a <details> table, what its exact work
counters change on the benchmark shapes at full size (detgrid.ops.work_counters, level= the
level before it and the level itself). Applying the patches in name order gives
patches/v2.6.0.patch's tree.

    python -m detgrid.kit.stack_patches --write patches/stack
"""

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from detgrid.kit import stack

STACK_DIR = Path("patches") / "stack"
REGENERATE = "python -m detgrid.kit.stack_patches --write patches/stack"
COUNTERS = ("launches", "launches_per_chunk", "items_sorted", "channel_merges", "elements_swept",
            "workspace_bytes", "longest_fold")
# longest_fold depends on where the points land, so it is measured by running the call on the
# host, at the benchmark's "small" size (the others are exact at full size, from the shapes).
FOLD_SIZE = "small"

# What each level changes, for its commit message and body (the core's is the PR body).
SUMMARIES: Dict[str, str] = {
    "index32": (
        "Sort keys and index math are 32 bits wide wherever the problem fits them (keys below "
        "2^31 - 1, tensors that can use 32-bit index math); division by a launch-time divisor "
        "becomes IntDivider's multiply and shift. 3-D bicubic keeps 64-bit index math only. "
        "Narrower keys halve the sort's key bytes and let CUB look at fewer bits."),
    "dense": (
        "Where a chunk's table of keys has no more entries than the chunk has records, the reduce "
        "takes a segment table (two int32 per key, zero-filled, then marked by one thread per "
        "sorted record): one thread per grad_input element of the chunk's images folds its "
        "segment, where the sparse reduce ran one thread per (sorted record, channel) that found "
        "its run's end by comparing keys and idled unless its record began a run. Two launches "
        "more per chunk; the first chunk to reach an image writes its untouched elements, so the "
        "zero fill of grad_input goes. The later steps build on the table."),
    "cells": (
        "Bilinear and trilinear sampling with a dense reduction sort one item per point, keyed by "
        "its cell, instead of one per tap: a destination merges its 2^dims neighbouring cells in "
        "ascending point number, which is the per-tap order exactly, because a point's taps are "
        "distinct pixels."),
    "channels-fastest": (
        "From 16 channels the dense reduce's threads take channels fastest, so a warp shares one "
        "walk of a destination's records and reads grad_output at consecutive channels, from a "
        "channels-last copy of the chunk's grad_output where its channel stride is not 1."),
    "hot-fold": (
        "A destination whose key holds more than 4096 records (4096 / 2^dims per cell) is folded "
        "tile by tile in parallel, and the reduce adds the tiles' partials in order: the serial "
        "fold's partials and additions, so its bits, without one thread's long chain of loads. "
        "A CUB sum over the chunk's slots numbers the partials (G + R / 256 for G groups and R "
        "records); one launch then marks the segment "
        "table in the plain marking's place (a hot key's entry {end, ~begin} reads as empty), "
        "stores the partials, and makes any channels-last copy of grad_output that no other "
        "launch makes. One launch more per chunk that may hold a hot key. 32-bit indices only."),
    "channel-groups": (
        "A thread of the dense reduce (destinations fastest) and of the hot fold takes a group of "
        "up to 16 channels (8 in double) of its destination and walks its records once for all "
        "of them, where it took one channel per walk: below 16 channels a destination's records "
        "are merged once, not once per channel. Each channel keeps its own partials and "
        "additions. Its kernels take the per-channel reduce's place, one for one."),
    "fused-fills": (
        "The point pass zero-fills a dense chunk's segment table (a slice per point) and, up to "
        "64 channels, copies its point's row of grad_output channels last, where each was a "
        "launch of its own: one launch fewer per dense chunk, two where the reduce reads the "
        "copy. Nothing reads the table before the sort, nor the copy before the reduce. Beyond "
        "64 channels the copy stays a launch, a thread per element (the hot fold's, in a chunk "
        "that may hold a hot key)."),
}

CORE_SUMMARY = (
    "The deterministic backward itself: per chunk of whole tiles of points, one thread per point "
    "forms its taps and weights (the existing kernel's arithmetic in every dtype) and one sort "
    "item per tap keyed by its grad_input destination; a stable radix sort; then one thread per "
    "(sorted record, channel), of which the thread at the first record of a destination's run "
    "folds the run in the canonical order: three launches per chunk. Half/BFloat16 sums that "
    "span chunks wait in a float carry, in blocks within "
    "the 64 MiB workspace. 64-bit keys and index math, the sparse reduce, hot destinations folded "
    "serially. See PR.md.")


def message(level: stack.Level) -> str:
    """The commit message of a level after the core."""
    return (f"{level.title}\n\n{_wrap(SUMMARIES[level.name])}\n\n"
            "A speed step only: grad_input's order of sums is canonical, so no bit of any result "
            "moves (the golden digests hold at this level and the one before it).\n")


def _wrap(text: str, width: int = 72) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def write_patches(out_dir: Path, name: str, email: str, kit: Optional[Path] = None) -> int:
    """The stack's patches, from a fresh copy of the cached v2.6.0 tree (never the cache)."""
    import subprocess

    from detgrid.kit import patch, patch_apply, upstream_tree

    kit = patch.kit_root(kit)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="detgrid-stack-") as tmp:
        tree = upstream_tree.fresh_git_copy(Path(tmp) / "pytorch")
        for key, value in (("user.name", name), ("user.email", email)):
            subprocess.run(["git", "-C", str(tree), "config", key, value], check=True)
        core = stack.LEVELS[0]
        rc = patch.main(["patch", "--pytorch", str(tree), "--upto", core.name,
                         "--out", str(out_dir / f"{core.patch}.patch")])
        if rc != 0:
            return rc
        for level in stack.LEVELS[1:]:
            new = {rel: text.encode("utf-8")
                   for rel, text in stack.kernel_sources(kit, level.name).items()}
            changed = {rel: data for rel, data in new.items()
                       if not (tree / rel).is_file() or (tree / rel).read_bytes() != data}
            patch_apply.apply(tree, changed, message(level), out_dir / f"{level.patch}.patch")
    return 0


def _counters(workload, level: str) -> dict:
    """Exact counters at full size, longest_fold measured at FOLD_SIZE on the host."""
    from detgrid.bench import matrix, workloads

    counters = workloads.full_size_work_counters(workload, "ordered", level=level)
    case = workload.build(scale=matrix.size_scale(workload, FOLD_SIZE))
    case.options = {**case.options, "level": level}
    counters["longest_fold"] = workloads.work_counters(case)["longest_fold"]
    return counters


def counter_rows(level: str) -> List[dict]:
    """Per benchmark row: the counters at the level before ``level`` and at ``level``."""
    from detgrid.bench import workloads

    before = stack.LEVEL_NAMES[stack.level_index(level) - 1]
    rows = []
    for workload in workloads.BENCH_WORKLOADS.values():
        if not workload.output_mask[0]:
            continue
        pair = [_counters(workload, lv) for lv in (before, level)]
        rows.append({"name": workload.name, "before": pair[0], "after": pair[1]})
    return rows


def _changed(rows: List[dict], counter: str) -> List[dict]:
    return [r for r in rows if r["before"][counter] != r["after"][counter]]


def body(level: stack.Level, rows: List[dict]) -> str:
    """NN-name.md: the step, its bits, its counters (the table in <details>)."""
    lines = [f"# {level.title}", "", SUMMARIES[level.name], "",
             "**No bit moves.** The order of grad_input's sums is canonical; the golden digests "
             "of grad_input hold with `level=\"" + level.name + "\"` and with the level before "
             "it (`tests/test_stack.py`).", "",
             f"**Counters** (`detgrid.ops.work_counters(..., level=...)`, {len(rows)} benchmark "
             f"rows at full size, `longest_fold` on the host at the {FOLD_SIZE} size; "
             "before → after):", ""]
    for counter in COUNTERS:
        moved = _changed(rows, counter)
        if not moved:
            lines.append(f"- `{counter}`: unchanged on every row.")
            continue
        if counter == "longest_fold":  # a latency: the worst row is what matters
            top = [max(r[k][counter] for r in rows) for k in ("before", "after")]
            lines.append(f"- `{counter}`: changes on {len(moved)} rows; the longest on any row "
                         f"{top[0]:,} → {top[1]:,}.")
            continue
        total = [sum(r[k][counter] for r in rows) for k in ("before", "after")]
        lines.append(f"- `{counter}`: changes on {len(moved)} rows; summed over all rows "
                     f"{total[0]:,} → {total[1]:,}.")
    lines += ["", "<details><summary>Per row</summary>", "",
              "| row | " + " | ".join(COUNTERS) + " |", "|---|" + "---|" * len(COUNTERS)]
    for r in rows:
        cells = [f"{r['before'][c]:,} → {r['after'][c]:,}" if r["before"][c] != r["after"][c]
                 else f"{r['after'][c]:,}" for c in COUNTERS]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def core_body() -> str:
    return "\n".join([f"# {stack.LEVELS[0].title}", "", CORE_SUMMARY, ""])


def write_bodies(out_dir: Path) -> None:
    out_dir = Path(out_dir)
    (out_dir / f"{stack.LEVELS[0].patch}.md").write_text(core_body())
    for level in stack.LEVELS[1:]:
        (out_dir / f"{level.patch}.md").write_text(body(level, counter_rows(level.name)))


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
