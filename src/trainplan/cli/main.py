"""`trainplan`: will it fit, how fast, where, at what cost, and what to change.

Bad input (unknown names, malformed files, impossible settings) prints one message and exits 2;
a job that does not fit is a result (exit 0).
"""
from __future__ import annotations

import argparse
import atexit
import os
import sys

from ..errors import TrainplanError
from .calibrate_cmd import calibrate_command_parser
from .catalog_cmd import catalog_command_parser
from .estimate_cmd import estimate_command_parser
from .inspect_cmd import inspect_command_parser
from .probe_cmd import probe_command_parser
from .measure_cmd import measure_command_parser
from .plan_cmd import plan_command_parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainplan", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    inspect_command_parser(sub)
    estimate_command_parser(sub)
    catalog_command_parser(sub)
    probe_command_parser(sub)
    measure_command_parser(sub)
    calibrate_command_parser(sub)
    plan_command_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]   # recorded by `measure`
    try:
        return args.func(args) or 0
    except TrainplanError as e:
        print(f"trainplan: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def run() -> None:
    """Console-script entry: `main()`, then end the process without tearing the interpreter down.

    Once a step has been traced, Python's shutdown (freeing torch's and transformers' modules and
    the trace's objects one by one) takes 0.3-0.8 s on a 2-core machine, as long as some commands'
    whole work. Nothing needs it: every file is written inside a `with` block. So output is
    flushed and atexit handlers run (they stop worker pools), then `os._exit` ends the process.
    Exceptions and argparse's SystemExit take the normal path.
    """
    code = main()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # reader gone (`| head`) or stream closed
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
