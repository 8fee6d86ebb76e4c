"""The bundled example jobs planned once per test run, exactly as
`trainplan plan examples/NAME.yaml --format json` prints them (shared by the golden, report and
browser tests, so each example is planned once however many of those run, and on however many
pytest-xdist workers: the first to need it plans it and leaves its JSON in the run's folder,
$TRAINPLAN_TEST_RUN (tests/conftest.py); a worker that needs it meanwhile waits for it)."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import json
import os
from pathlib import Path

from trainplan.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("graphmer-se", "glf-cr-2xt4", "chart-rvr-grpo")
# the other plans scripts/bench_plan.py times (issue 41: a plan's numbers stay what they were
# while it gets faster), each as `trainplan plan ARGS --format json`; SLOW_BENCH ones take
# seconds to minutes from a cold store and are compared only where TRAINPLAN_SLOW_GOLDEN=1
# (the suite stays within CI's 8 minutes)
_LLM = ["--seq-len", "2048", "--precision", "bf16-amp", "--steps", "1000", "--platforms", "all"]
BENCH = {
    "llama3-8b-multinode-h100x16": ["examples/llama3-8b-multinode.yaml", "--gpu", "h100-sxm",
                                    "--gpus", "16"],
}
SLOW_BENCH = {       # GraphMER-SE over every platform: 26 traces no other test makes (~6 s)
    "graphmer-se-all-platforms": ["examples/graphmer-se.yaml", "--platforms", "all"],
    "llama-3.2-1b-all-platforms": ["--model", "hf:meta-llama/Llama-3.2-1B", "--batch-size", "8"]
                                  + _LLM,
    "llama-3.1-70b-all-platforms": ["--model", "hf:meta-llama/Llama-3.1-70B", "--batch-size",
                                    "1"] + _LLM,
}
# a job that plans in seconds (two-layer, 64-wide transformer)
TINY = """\
name: tiny
model: {hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128, vocab_size: 256}
training_data: {max_seq_len: 32, micro_batch_size: 4}
run: {mixed_precision: fp16}
steps: 100
"""


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `trainplan ARGV` run in-process."""
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@contextlib.contextmanager
def planning(name: str):
    """Held while this process makes NAME, an example's plan (its JSON, or in process as
    test_estimate_plan_agree.py does) or other work shared by the run (`made_once`): another
    pytest-xdist worker making it waits, then reads what this one made (a plan's traces are in
    the run's shared store) instead of doing the same work at the same time (chart-rvr's cold
    plan is about two minutes on 2 cores). Yields where the made text is kept."""
    run = os.environ.get("TRAINPLAN_TEST_RUN")
    if not run:
        yield None
        return
    with open(Path(run) / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield Path(run) / f"{name}.json"
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def made_once(name: str, make) -> str:
    """The text `make()` returns, made once a test run: by the first process to ask, under
    `planning(name)`, and kept in the run's folder (whole or absent: written, then renamed),
    where every later asker reads it."""
    with planning(name) as kept:
        if kept is not None and kept.exists():
            return kept.read_text()
        text = make()
        if kept is not None:
            tmp = kept.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, kept)
        return text


def _argv(name: str) -> list[str]:
    """`trainplan plan` arguments of an example (examples/NAME.yaml) or of a bench plan."""
    args = {**BENCH, **SLOW_BENCH}.get(name)
    if args is None:
        return [str(ROOT / "examples" / f"{name}.yaml")]
    return [str(ROOT / a) if a.startswith("examples/") else a for a in args]


@functools.cache
def example_json(name: str) -> str:
    def plan() -> str:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["plan", *_argv(name), "--format", "json"])
        assert code == 0, err.getvalue()
        return out.getvalue()
    return made_once(name, plan)


def example_doc(name: str) -> dict:
    return json.loads(example_json(name))
