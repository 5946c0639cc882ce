"""The kit's command line: thin argparse subcommands over plain functions.

Nothing here imports torch at import time: `patch` and `report` must start in
a PyTorch checkout, whose uninstalled torch/ shadows the installed one under
`python -m detgrid` (see detgrid.kit.installed_torch); the verbs that need
torch load it through installed_torch and fail in one line without it."""

import argparse
import json
import math
import sys
from typing import Callable, List, Optional

from detgrid.kit import installed_torch
from detgrid.kit.parsing import ArgumentParser


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in "invalid integer value"
    return parse


def _finite(*, positive: bool) -> Callable[[str], float]:
    """An argparse type: a finite float, > 0 (positive) or >= 0."""
    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            bound = "> 0" if positive else ">= 0"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


class _VersionAction(argparse.Action):
    """--version: the package and the build it is (the torch it was made for,
    its CUDA kernels), on one line; argparse's own would wrap it."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and the torch this build is for, and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        import detgrid
        from detgrid import buildinfo

        print(f"detgrid {detgrid.__version__}: {buildinfo.summary()}")
        parser.exit()


VERIFY_DTYPES = ("float32", "float64", "float16", "bfloat16")


def _cuda_unusable() -> Optional[str]:
    """Why --device cuda cannot run here, or None."""
    from detgrid import ops

    if not installed_torch.load().cuda.is_available():
        return "torch sees no CUDA device"
    if not ops.has_cuda_kernels():
        return "this detgrid build has no CUDA kernels"
    return None


def _fail(verb: str, message: str) -> int:
    print(f"detgrid {verb}: {message}", file=sys.stderr)
    return 2


def _verify(args: argparse.Namespace) -> int:
    torch = installed_torch.load()
    from detgrid.kit import verify

    if args.device == "cuda" and (reason := _cuda_unusable()):
        return _fail("verify", f"--device cuda, but {reason}")
    results = verify.verify(device=args.device, runs=args.runs,
                            dtype=getattr(torch, args.dtype))
    if args.json:
        print(json.dumps([result.to_dict() for result in results], indent=2))
    else:
        print("\n".join(verify.format_result(result) for result in results))
    return 0 if all(result.ok for result in results) else 1


def _bench(args: argparse.Namespace) -> int:
    torch = installed_torch.load()  # the harness imports it
    from detgrid.bench import matrix as bench

    if args.render:
        return _render(args.render)
    names = [n for n in (args.workloads or "").split(",") if n] or None
    try:
        names = bench.resolve_names(names)
    except ValueError as e:
        return _fail("bench", str(e))
    if args.list:
        for r in (row for row in bench.listing() if row["name"] in names):
            settings = f"{r['mode']}/{r['padding']}/ac={r['align_corners']}"
            print(f"#{r['row']:<3}{r['name']:<24}{str(tuple(r['input_shape'])):<24}"
                  f"{str(tuple(r['grid_shape'])):<23}{settings:<29}{r['taps']:>2} taps/point "
                  f"{r['records']:>11,} records  stock aten::{r['stock_op']}")
        return 0
    if args.counters:
        print(bench.counters_markdown(bench.counter_rows(names)), end="")
        return 0
    device = args.device
    if device == "auto":
        from detgrid import ops

        device = "cuda" if torch.cuda.is_available() and ops.has_cuda_kernels() else "cpu"
    if device == "cuda" and (reason := _cuda_unusable()):
        return _fail("bench", f"--device cuda, but {reason}")
    # The output paths are checked before the run, which takes minutes.
    if args.out:
        try:
            bench.check_out(args.out)
        except ValueError as e:
            return _fail("bench", f"--out {args.out}: {e}")
    config = bench.default_config(device, quick=args.quick)
    config.names = names
    for key in ("warmup", "reps", "scale", "seed", "budget_s"):
        if getattr(args, key) is not None:
            setattr(config, key, getattr(args, key))
    result = bench.run_bench(config, on_row=_bench_progress)
    out = args.out or bench.default_out(result)
    paths = bench.write_outputs(result, out)
    print(bench.markdown(result))
    print("wrote " + ", ".join(p for p in paths.values() if p))
    if paths["png"] is None:
        print("detgrid bench: no matplotlib here, so no PNG; draw it elsewhere with "
              f"`detgrid bench --render {out}`", file=sys.stderr)
    summary = result["summary"]
    # Speed targets are benchmarks (reported, never the exit code); a wrong
    # result or a failing variant is an error.
    return 1 if summary["incorrect"] or summary["errors"] else 0


def _bench_progress(done: int, total: int, row: dict) -> None:
    """One line per finished workload on stderr: a CUDA run takes minutes."""
    if row["status"] == "measured":
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3g}"
        outcome = f"det/stock {ratio}" + ("" if row["correct"] else ", WRONG RESULT")
    else:
        outcome = row["status"]
    print(f"detgrid bench: [{done}/{total}] {row['name']}: {outcome}", file=sys.stderr,
          flush=True)


def _render(path: str) -> int:
    """`bench --render FILE.json`: FILE.md and FILE.png from an earlier run."""
    installed_torch.load()  # the harness imports it
    from detgrid.bench import matrix as bench

    try:
        with open(path) as f:
            result = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        return _fail("bench", f"cannot read {path} as JSON: {e}")
    try:
        paths = bench.render(result, path)
    except (KeyError, TypeError, AttributeError) as e:
        return _fail("bench", f"{path} is not a detgrid bench result "
                     f"({type(e).__name__}: {e})")
    except OSError as e:
        return _fail("bench", f"cannot write next to {path}: {e}")
    print("wrote " + ", ".join(p for p in paths.values() if p))
    return 0 if paths["png"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="detgrid",
        description="Deterministic grid_sample backward: kernel, patch and issue kit.",
    )
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser(
        "verify",
        help="run the deterministic backward on the embedded default case: "
        "hashes over repeated runs, agreement with stock",
    )
    verify.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda when torch sees a GPU and this build has CUDA kernels")
    verify.add_argument("--runs", type=_count(2), default=10,
                        help="repeated runs per case, hashed (two at least: one hash has "
                        "nothing to agree with)")
    verify.add_argument("--dtype", choices=VERIFY_DTYPES, default="float32",
                        help="dtype of the cases; float16 and bfloat16 are checked against "
                        "stock in float64, as detgrid sums in float32 and rounds once")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.set_defaults(handler=_verify)

    bench = commands.add_parser(
        "bench",
        help="time stock vs deterministic backward on the BENCHMARKS.md workload matrix; "
        "writes FILE.json, FILE.md and FILE.png",
    )
    bench.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                       help="cuda: full-size workloads; cpu: the host builds vs stock CPU "
                       "on small shapes (a smoke test of the harness)")
    bench.add_argument("--quick", action="store_true",
                       help="shapes scaled way down (CPU: the whole run in < 60 s)")
    bench.add_argument("--workloads", metavar="NAMES",
                       help="comma-separated workload names (default: all; see --list)")
    bench.add_argument("--out", metavar="FILE.json",
                       help="default: benchmarks/results/<device-name>-<date>[-quick].json; "
                       "FILE.md and FILE.png go next to it")
    bench.add_argument("--budget-s", type=_finite(positive=False), default=None,
                       help="start no workload after this many seconds (default 420); "
                       "the rest are recorded as skipped")
    bench.add_argument("--warmup", type=_count(0), default=None)
    bench.add_argument("--reps", type=_count(1), default=None, help="timed calls per variant")
    bench.add_argument("--scale", type=_finite(positive=True), default=None,
                       help="one scale for every workload's shapes (overrides the sizes)")
    bench.add_argument("--seed", type=int, default=None)
    bench.add_argument("--list", action="store_true", help="list the workloads and exit")
    bench.add_argument("--counters", action="store_true",
                       help="print the workloads' exact work counters at full size at "
                       "every build of the stack (no inputs, no timing, no GPU needed) and exit")
    bench.add_argument("--render", metavar="FILE.json",
                       help="only redraw FILE.md and FILE.png from an earlier FILE.json")
    bench.set_defaults(handler=_bench)
    from detgrid.kit import build as build_command
    from detgrid.kit import patch as patch_command
    from detgrid.kit import report as report_command

    build_command.register(commands)
    patch_command.register(commands)
    report_command.register(commands)
    return parser


def _needs_source_tree(args: argparse.Namespace) -> Optional[str]:
    """Why the verb cannot run from this (installed) copy, or None."""
    import os

    from detgrid.kit import sourcetree

    if args.command == "report":
        return sourcetree.needs_source_tree("report")
    if args.command == "patch":
        # patch may take aten_kernels/ from another checkout (DETGRID_KIT_ROOT)
        return sourcetree.needs_source_tree(
            "patch", os.environ.get("DETGRID_KIT_ROOT") or sourcetree.KIT_ROOT)
    return None  # build --mode extension checks in its plan (detgrid.kit.build)


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    problem = _needs_source_tree(args)
    if problem:
        return _fail(args.command, problem)
    try:
        return args.handler(args)
    except installed_torch.TorchUnusable as e:
        return _fail(args.command, str(e))


if __name__ == "__main__":
    sys.exit(main())
