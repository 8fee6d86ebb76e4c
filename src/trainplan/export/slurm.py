"""`--to slurm`: an sbatch script. One task per node; srun starts torchrun on every node with
the c10d rendezvous on the job's first node. Time limit: the plan's time to finish plus a margin
(`MARGIN`); requeue on preemption, with a signal before the limit so the guard saves first.

Quoting: the job name is `safe_name`d (an #SBATCH line ends at a newline: a name with one would
end the directives and run the rest); the per-node command is a constant single-quoted `bash
-c` body whose variables each node expands, and the script and its arguments follow it as
shell-quoted positional arguments."""
from __future__ import annotations

import math
import shlex

from .common import DEFAULT_PORT, Launch, safe_name
from .torchrun import _shell, env_lines

MARGIN = 0.15            # 15 % over the plan's time to finish
MARGIN_MIN_S = 600.0     # and at least 10 minutes (start-up, the last checkpoint)
SIGNAL_BEFORE_S = 300    # SIGUSR1 this long before the limit: the guard checkpoints and exits


def time_limit_s(ln: Launch) -> float:
    return ln.finish_s + max(MARGIN * ln.finish_s, MARGIN_MIN_S)


def fmt_slurm_time(s: float) -> str:
    """Slurm's days-hours:minutes:seconds, rounded up to the minute."""
    m = math.ceil(s / 60)
    d, m = divmod(m, 24 * 60)
    h, m = divmod(m, 60)
    return f"{d}-{h:02d}:{m:02d}:00"


def node_command(ln: Launch) -> str:
    """What each node runs (expanded there): torchrun with the node's rank, then "$@"."""
    return ("exec torchrun --nnodes " + str(ln.nodes) + " --nproc-per-node "
            + str(ln.procs_per_node) + ' --node-rank "$SLURM_NODEID" --rdzv-backend c10d '
            f'--rdzv-endpoint "$HEAD_NODE:{DEFAULT_PORT}" --rdzv-id "$SLURM_JOB_ID" "$@"')


def render(ln: Launch) -> dict[str, str]:
    limit = time_limit_s(ln)
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={safe_name(ln.job_name)}",
        f"#SBATCH --nodes={ln.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={ln.procs_per_node}",
        f"#SBATCH --time={fmt_slurm_time(limit)}",
        "#SBATCH --requeue",
        f"#SBATCH --signal=B:USR1@{SIGNAL_BEFORE_S}",
        "#SBATCH --open-mode=append",
        "#SBATCH --output=%x-%j.out",
        ln.header().rstrip("\n"),
        f"# Time limit: the plan's {ln.finish_s:.0f} s to finish + max({MARGIN:.0%}, "
        f"{MARGIN_MIN_S:.0f} s) = {limit:.0f} s.",
        "# Requeued on preemption or at the limit; trainplan.guard resumes from the newest "
        "checkpoint.",
        "set -euo pipefail",
        "",
        env_lines(ln).rstrip("\n"),
        'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export HEAD_NODE",
        "",
        "# Before the limit (and on preemption), stop the step and requeue: srun passes SIGTERM",
        "# to torchrun, torchrun to every worker, and the guard saves before it stops.",
        'requeue() { echo "trainplan: requeue $SLURM_JOB_ID"; kill -TERM "$SRUN_PID" 2>/dev/null;'
        ' wait "$SRUN_PID"; scontrol requeue "$SLURM_JOB_ID"; }',
        "trap requeue USR1",
        "",
        "# Each node's shell expands the single-quoted command; the script and its arguments",
        "# follow it as data.",
        "# shellcheck disable=SC2016",
        "srun --kill-on-bad-exit=1 bash -c " + shlex.quote(node_command(ln)) + " trainplan-node "
        + _shell(ln.script_command()) + " &",
        "SRUN_PID=$!",
        'wait "$SRUN_PID"',
        "",
    ]
    return {"train.sbatch": "\n".join(lines)}
