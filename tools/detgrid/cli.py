"""The kit's command line: thin argparse subcommands over plain functions."""

import argparse
import json
import sys
from typing import List, Optional

import torch


def _verify(args: argparse.Namespace) -> int:
    from detgrid import verify

    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    results = verify.verify(device=args.device, runs=args.runs, dtype=dtype)
    if args.json:
        print(json.dumps([result.to_dict() for result in results], indent=2))
    else:
        print("\n".join(verify.format_result(result) for result in results))
    return 0 if all(result.ok for result in results) else 1


def _bench(args: argparse.Namespace) -> int:
    from detgrid import bench

    if args.render:
        with open(args.render) as f:
            result = json.load(f)
        paths = bench.render(result, args.render)
        print("wrote " + ", ".join(p for p in paths.values() if p))
        return 0 if paths["png"] else 1
    if args.list:
        for r in bench.listing():
            settings = f"{r['mode']}/{r['padding']}/ac={r['align_corners']}"
            print(f"#{r['row']:<3}{r['name']:<24}{str(tuple(r['input_shape'])):<24}"
                  f"{str(tuple(r['grid_shape'])):<23}{settings:<29}{r['taps']:>2} taps/point "
                  f"{r['records']:>11,} records  stock aten::{r['stock_op']}")
        return 0
    device = args.device
    if device == "auto":
        from detgrid import ops

        device = "cuda" if torch.cuda.is_available() and ops.has_cuda_kernels() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("detgrid bench: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    config = bench.default_config(device, quick=args.quick)
    names = [n for n in (args.workloads or "").split(",") if n] or None
    try:
        config.names = bench.resolve_names(names)
    except ValueError as e:
        print(f"detgrid bench: {e}", file=sys.stderr)
        return 2
    for key in ("warmup", "reps", "scale", "seed", "budget_s"):
        if getattr(args, key) is not None:
            setattr(config, key, getattr(args, key))
    result = bench.run_bench(config)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="detgrid",
        description="Deterministic grid_sample backward: kernel, patch and issue kit.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser(
        "verify",
        help="run the deterministic backward on the embedded default case: "
        "hashes over repeated runs, agreement with stock",
    )
    verify.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    verify.add_argument("--runs", type=int, default=10)
    verify.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.set_defaults(handler=_verify)

    bench = commands.add_parser(
        "bench",
        help="time stock vs deterministic backward on the BENCHMARKS.md workload matrix; "
        "writes FILE.json, FILE.md and FILE.png",
    )
    bench.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                       help="cuda: full-size workloads; cpu: the host executor vs stock CPU "
                       "on small shapes (a smoke test of the harness)")
    bench.add_argument("--quick", action="store_true",
                       help="shapes scaled way down (CPU: the whole run in < 60 s)")
    bench.add_argument("--workloads", metavar="NAMES",
                       help="comma-separated workload names (default: all; see --list)")
    bench.add_argument("--out", metavar="FILE.json",
                       help="default: benchmarks/results/<device-name>-<date>[-quick].json; "
                       "FILE.md and FILE.png go next to it")
    bench.add_argument("--budget-s", type=float, default=None,
                       help="start no workload after this many seconds (default 420); "
                       "the rest are recorded as skipped")
    bench.add_argument("--warmup", type=int, default=None)
    bench.add_argument("--reps", type=int, default=None, help="timed calls per variant")
    bench.add_argument("--scale", type=float, default=None,
                       help="one scale for every workload's shapes (overrides the sizes)")
    bench.add_argument("--seed", type=int, default=None)
    bench.add_argument("--list", action="store_true", help="list the workloads and exit")
    bench.add_argument("--render", metavar="FILE.json",
                       help="only redraw FILE.md and FILE.png from an earlier FILE.json")
    bench.set_defaults(handler=_bench)
    from detgrid import build as build_command
    from detgrid import patch as patch_command
    from detgrid import report as report_command

    build_command.register(commands)
    patch_command.register(commands)
    report_command.register(commands)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
