"""`--to torchrun`: the launch command (nodes, processes per node, c10d rendezvous) and the
environment the plan assumes, as `torchrun.sh`."""
from __future__ import annotations

import shlex

from .common import DEFAULT_PORT, Launch


def torchrun_args(ln: Launch, endpoint: str = f"${{MASTER_ADDR:-127.0.0.1}}:${{MASTER_PORT:-{DEFAULT_PORT}}}",
                  node_rank: str = "${NODE_RANK:-0}", rdzv_id: str | None = None) -> list[str]:
    """torchrun's arguments (before the script). One node: standalone rendezvous."""
    if ln.nodes == 1:
        return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(ln.procs_per_node)]
    return ["--nnodes", str(ln.nodes), "--nproc-per-node", str(ln.procs_per_node),
            "--node-rank", node_rank, "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", rdzv_id or "${TRAINPLAN_RDZV_ID:-" + _slug(ln.job_name) + "}"]


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s.lower()).strip("-") or "job"


def _shell(args: list[str]) -> str:
    """Quote for the shell, leaving ${VAR...} expansions live."""
    return " ".join(a if a.startswith("${") or "${" in a and "'" not in a and " " not in a
                    else shlex.quote(a) for a in args)


def env_lines(ln: Launch) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in ln.env().items())


def render(ln: Launch) -> dict[str, str]:
    multi = ln.nodes > 1
    body = ["#!/usr/bin/env bash", ln.header(), "set -euo pipefail",
            'cd "$(dirname "$0")"', "", "# The environment the plan assumes (read by the script "
            "and by trainplan.guard)", env_lines(ln)]
    if multi:
        body += ["# Multi-node: run this on every node with NODE_RANK=0..%d and MASTER_ADDR set to "
                 "node 0's address (c10d rendezvous on node 0)." % (ln.nodes - 1),
                 ': "${MASTER_ADDR:?set MASTER_ADDR to node 0}"', ""]
    body += ["exec torchrun " + _shell(torchrun_args(ln)) + " " + _shell(ln.script_command())
             + ' "$@"', ""]
    return {"torchrun.sh": "\n".join(body)}
