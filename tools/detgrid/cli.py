"""The kit's command line: thin argparse subcommands over plain functions."""

import argparse
import json
import sys
from typing import List, Optional

import torch


def _verify(args: argparse.Namespace) -> int:
    from detgrid import verify

    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    result = verify.verify(device=args.device, runs=args.runs, dtype=dtype)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(verify.format_result(result))
    return 0 if result.ok else 1


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
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
