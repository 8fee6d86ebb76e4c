"""`trainplan`: will it fit, how fast, where, at what cost, and what to change.

Bad input (unknown names, malformed files, impossible settings) prints one message and exits 2;
a job that does not fit is a result (exit 0), or exit 1 with `plan --check` / `estimate --check`.

Output is trainplan's own: warnings of transformers, huggingface_hub and torch (their loggers and
Python warnings) are shown with --verbose only (models/hf_import.py `third_party_output`).
"""
from __future__ import annotations

import argparse
import atexit
import os
import sys

from ..errors import TrainplanError
from ..models.hf_import import third_party_output
from .calibrate_cmd import calibrate_command_parser
from .catalog_cmd import catalog_command_parser
from .estimate_cmd import estimate_command_parser
from .export_cmd import export_command_parser
from .inspect_cmd import inspect_command_parser
from .probe_cmd import probe_command_parser
from .measure_cmd import measure_command_parser
from .plan_cmd import plan_command_parser


VERBOSE_HELP = ("also show third-party warnings (transformers, huggingface_hub, torch), "
                "hidden by default")


def version() -> str:
    """The installed distribution's version, else `trainplan.__version__`, else "unknown"."""
    from importlib import metadata
    try:
        return metadata.version("trainplan")
    except metadata.PackageNotFoundError:
        import trainplan
        return str(getattr(trainplan, "__version__", "unknown"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainplan", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    p.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = p.add_subparsers(dest="command", required=True)
    inspect_command_parser(sub)
    estimate_command_parser(sub)
    catalog_command_parser(sub)
    probe_command_parser(sub)
    measure_command_parser(sub)
    calibrate_command_parser(sub)
    plan_command_parser(sub)
    export_command_parser(sub)
    for command in sub.choices.values():   # also after the command: `trainplan plan --verbose`
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help=VERBOSE_HELP)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]   # recorded by `measure`
    try:
        with third_party_output(args.verbose):
            return args.func(args) or 0
    except TrainplanError as e:
        print(_for_terminal(f"trainplan: error: {e}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _for_terminal(text: str) -> str:
    """An error's lines word-wrapped to the terminal's width on a terminal (paths, flags and
    ids are never split); piped or captured, as written, one line per part."""
    if not sys.stderr.isatty():
        return text
    import shutil
    import textwrap
    width = shutil.get_terminal_size((80, 24)).columns
    return "\n".join(textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False,
                                    subsequent_indent="  ") if len(line) > width else line
                      for line in text.splitlines())


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
