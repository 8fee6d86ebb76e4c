"""Third-party noise (issue 18): transformers', huggingface_hub's and torch's warnings reach the
user only with --verbose; trainplan's own output is unchanged. Set up once, in `main`
(models/hf_import.py `third_party_output`), and inherited by forked trace workers."""
from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
import warnings

import pytest

from trainplan.models.hf_import import third_party_output

GPT2 = ["--model", "hf:openai-community/gpt2", "--gpu", "t4", "--seq-len", "512",
        "--batch-size", "8", "--precision", "fp16-amp"]
NOISE = ("[transformers]", "Warning:", "warnings.warn", "huggingface_hub")


def estimate(argv: list[str], jobs: int, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRANSFORMERS_VERBOSITY", "HF_HUB_VERBOSITY", "PYTHONWARNINGS")}
    env["TRAINPLAN_JOBS"] = str(jobs)       # 2: traces in forked workers, even on one core
    env["TRAINPLAN_TRACE_CACHE"] = "off"    # trace here: a stored trace builds no model to warn
    return subprocess.run([sys.executable, "-m", "trainplan.cli.main", *flags, "estimate", *argv],
                          capture_output=True, text=True, timeout=600, env=env)


def test_estimate_stderr_is_quiet_unless_verbose():
    r = estimate(GPT2, 2)                                # traces in forked workers
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr                      # no transformers/torch warnings
    assert "fit" in r.stdout.lower()
    v = estimate(GPT2, 1, "--verbose")
    assert v.returncode == 0, v.stderr
    assert "`loss_type=None` was set in the config but it is unrecognized" in v.stderr
    assert "[transformers]" in v.stderr
    assert v.stdout == r.stdout                          # the same estimate either way


@pytest.mark.parametrize("verbose", [False, True])
def test_vlm_config_warnings_only_when_verbose(verbose):
    """Qwen2.5-VL's config warns about rope_scaling/mrope as transformers builds it (six times in
    a plan of examples/chart-rvr-grpo.yaml before): heard only with --verbose. In a fresh
    process: transformers warns once per process."""
    code = ("from trainplan.models.hf import make_config\n"
            "from trainplan.models.hf_names import load_config_dict\n"
            "from trainplan.models.hf_import import third_party_output\n"
            f"with third_party_output({verbose}):\n"
            "    make_config(load_config_dict('Qwen/Qwen2.5-VL-3B-Instruct')[0])\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRANSFORMERS_VERBOSITY", "HF_HUB_VERBOSITY", "PYTHONWARNINGS")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert ("rope" in r.stderr) == verbose, r.stderr


def _library_noise() -> None:
    logging.getLogger("transformers.configuration_utils").warning("[transformers] from a library")
    logging.getLogger("timm.models").warning("handler-less log warning")
    warnings.warn("a Python warning", UserWarning)
    warnings.warn("a deprecation", FutureWarning)


def _forked(target) -> None:
    p = multiprocessing.get_context("fork").Process(target=target)
    p.start()
    p.join(30)
    assert p.exitcode == 0


def _print(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@pytest.fixture
def printed_warnings(monkeypatch):
    """Python warnings printed to stderr, as outside pytest (which records them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        monkeypatch.setattr(warnings, "showwarning", _print)
        yield


@pytest.fixture
def library_loggers(printed_warnings):
    """transformers as if imported: its root logger with a stderr handler, level WARNING."""
    root = logging.getLogger("transformers")
    handler = logging.StreamHandler(sys.stderr)
    old = root.level, root.propagate
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    root.propagate = False
    yield
    root.removeHandler(handler)
    root.setLevel(old[0])
    root.propagate = old[1]


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_quiet_in_process_and_in_forked_workers(capfd, monkeypatch, library_loggers):
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    monkeypatch.setattr(sys, "warnoptions", [])
    torch_level = logging.getLogger("torch").level
    capfd.readouterr()
    with third_party_output(verbose=False):
        assert logging.getLogger("torch._dynamo").getEffectiveLevel() == logging.ERROR
        _library_noise()
        _forked(_library_noise)
        assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"   # for an import inside
    assert capfd.readouterr().err == ""
    # put back afterwards: levels, the environment, warning filters
    assert "TRANSFORMERS_VERBOSITY" not in os.environ
    assert logging.getLogger("transformers").level == logging.WARNING
    assert logging.getLogger("timm").level == logging.NOTSET
    assert logging.getLogger("torch").level == torch_level
    _library_noise()
    err = capfd.readouterr().err
    assert "[transformers] from a library" in err and "a Python warning" in err


def test_verbose_changes_nothing(capfd, library_loggers):
    capfd.readouterr()
    with third_party_output(verbose=True):
        _library_noise()
        if "fork" in multiprocessing.get_all_start_methods():
            _forked(_library_noise)          # a worker's warnings reach the same stderr
    err = capfd.readouterr().err
    assert err.count("UserWarning: a Python warning") == (2 if "fork" in multiprocessing.get_all_start_methods()
                                             else 1)
    for text in ("[transformers] from a library", "a Python warning", "a deprecation"):
        assert text in err


def test_a_verbosity_the_user_set_is_kept(capfd, monkeypatch, library_loggers):
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "warning")
    with third_party_output(verbose=False):
        logging.getLogger("transformers.modeling_utils").warning("asked for")
    assert "asked for" in capfd.readouterr().err
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "warning"
