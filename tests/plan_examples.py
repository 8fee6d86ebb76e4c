"""The bundled example jobs planned once per test session, exactly as
`trainplan plan examples/NAME.yaml --format json` prints them (shared by the golden, report and
browser tests, so each example is planned once however many of those run)."""
from __future__ import annotations

import contextlib
import functools
import io
import json
from pathlib import Path

from trainplan.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("graphmer-se", "glf-cr-2xt4", "chart-rvr-grpo")
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


@functools.cache
def example_json(name: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", str(ROOT / "examples" / f"{name}.yaml"), "--format", "json"])
    assert code == 0, err.getvalue()
    return out.getvalue()


def example_doc(name: str) -> dict:
    return json.loads(example_json(name))
