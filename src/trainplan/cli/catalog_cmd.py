"""`trainplan catalog [accelerators|platforms|models]`: what trainplan knows, with sources and dates."""
from __future__ import annotations

import argparse


def catalog_command_parser(sub) -> None:
    p = sub.add_parser("catalog", help="list accelerators, platforms or bundled models")
    p.add_argument("what", nargs="?", default="accelerators",
                   choices=("accelerators", "platforms", "models"))
    p.add_argument("--platforms-file", help="YAML file of your own platforms")
    p.add_argument("--format", choices=("text", "json", "md"), default="text",
                   help="md: a Markdown table (accelerators only; platforms and models print "
                        "text)")
    p.set_defaults(func=catalog_command)


def catalog_command(args: argparse.Namespace) -> int:
    from ..report.catalog_report import print_catalog
    print_catalog(args.what, args.format, getattr(args, "platforms_file", None))
    return 0
