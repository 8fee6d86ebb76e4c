"""`--to torchrun`: the launch command (nodes, processes per node, c10d rendezvous) and the
environment the plan assumes, as `torchrun.sh`.

Quoting: every value is quoted for the shell (`shq`); the few arguments that must expand where the script
runs (`${MASTER_ADDR:-127.0.0.1}:29500`, `$SLURM_NODEID`) are `Expand` strings, built here from
constants and `slug`, and written in double quotes. Nothing a user typed is ever expanded."""
from __future__ import annotations

import re
import shlex

from .common import DEFAULT_PORT, Launch, slug


class Expand(str):
    """Shell text to expand where it runs, written in double quotes: never user input."""

    def __new__(cls, text: str):
        if any(c in text for c in '"\\`') or "$(" in text:
            raise ValueError(f"not a plain expansion: {text!r}")
        return super().__new__(cls, text)


def _x(v: str) -> str:
    return Expand(v) if "$" in v else v


def torchrun_args(ln: Launch, endpoint: str = f"${{MASTER_ADDR:-127.0.0.1}}:${{MASTER_PORT:-{DEFAULT_PORT}}}",
                  node_rank: str = "${NODE_RANK:-0}", rdzv_id: str | None = None) -> list[str]:
    """torchrun's arguments (before the script). One node: standalone rendezvous."""
    if ln.nodes == 1:
        return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(ln.procs_per_node)]
    return ["--nnodes", str(ln.nodes), "--nproc-per-node", str(ln.procs_per_node),
            "--node-rank", _x(node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", _x(endpoint),
            "--rdzv-id", _x(rdzv_id or "${TRAINPLAN_RDZV_ID:-" + _slug(ln.job_name) + "}")]


def _slug(s: str) -> str:
    return slug(s, default="job")


def shq(text: str) -> str:
    """One word for the shell, never expanded: shlex.quote's single quotes, or, where the text
    holds `$` or a backquote, double quotes with those escaped (the same word, without
    shellcheck's SC2016 note that single quotes do not expand)."""
    if not any(c in text for c in "$`"):
        return shlex.quote(text)
    return '"' + re.sub(r'([\\"$`])', r"\\\1", text) + '"'


def _shell(args: list[str]) -> str:
    """Arguments for the shell: `Expand` ones in double quotes, the rest quoted by `shq`."""
    return " ".join(f'"{a}"' if isinstance(a, Expand) else shq(a) for a in args)


def env_lines(ln: Launch) -> str:
    return "".join(f"export {k}={shq(v)}\n" for k, v in ln.env().items())


def render(ln: Launch) -> dict[str, str]:
    multi = ln.nodes > 1
    body = ["#!/usr/bin/env bash", ln.header(), "set -euo pipefail",
            'cd "$(dirname "$0")"', "", "# The environment the plan assumes (read by the script "
            "and by trainplan.guard)", env_lines(ln)]
    if multi:
        body += ["# Multi-node: run this on every node with NODE_RANK=0..%d and MASTER_ADDR set to "
                 "node 0's address (c10d rendezvous on node 0)." % (ln.nodes - 1),
                 ': "${MASTER_ADDR:?set MASTER_ADDR to node 0}"', ""]
    body += ["# exec: torchrun itself gets the platform's SIGTERM and passes it to every worker",
             "exec torchrun " + _shell(torchrun_args(ln)) + " " + _shell(ln.script_command())
             + ' "$@"', ""]
    return {"torchrun.sh": "\n".join(body)}
