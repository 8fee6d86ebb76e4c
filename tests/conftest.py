import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainplan.spec import Job, validate
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step


class AtenOps(TorchDispatchMode):
    """The aten ops run under it, in order, each as (name, arguments, result); `prim.device`, a
    query of a tensor's device that launches nothing, is left out."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is not torch.ops.prim.device.default:
            self.calls.append((func._overloadpacket.__name__, args, out))
        return out

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.calls]


SBH = 512 * 8 * 1024  # BERT-large, batch 8, seq 512: s*b*h elements


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/* from the current code (then review the diff); "
                          "or set TRAINPLAN_UPDATE_GOLDEN=1")


def _run_dir(tmp_path_factory, name: str):
    """A folder for the whole test run: under pytest-xdist (`-n`), one shared by every worker
    (their base temporaries sit side by side in the run's), so what one traces or imports the
    others read, as `trainplan` processes sharing a home do (the store writes whole files)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    path = base / name
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session", autouse=True)
def _session_trace_store(tmp_path_factory):
    """One disk store of traces for the whole session (trace/store.py): tests that trace the
    same job, in process or through the CLI, read it as a user's second run does. Its keys
    cover trainplan's code, so a test only ever reads what this code traced."""
    mp = pytest.MonkeyPatch()
    keep = os.environ.get("TRAINPLAN_TEST_TRACE_CACHE")   # a developer's store kept across runs
    mp.setenv("TRAINPLAN_TRACE_CACHE", keep or str(_run_dir(tmp_path_factory, "traces")))
    mp.setenv("TRAINPLAN_TEST_RUN", str(_run_dir(tmp_path_factory, "run")))  # plan_examples.py
    yield
    mp.undo()


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory):
    """$TRAINPLAN_HOME/cache for the whole session: what can be rebuilt (transformers' import
    table, models/hf_import.py) is built once per run, by the first process that needs it, and
    read by every test and every `trainplan` process the tests start after it."""
    return _run_dir(tmp_path_factory, "trainplan_cache")


@pytest.fixture(autouse=True)
def _isolated_trainplan_home(tmp_path_factory, monkeypatch, _session_cache):
    """A developer's own `trainplan calibrate` file must not change what the tests see: each
    test has its own empty home (measurements, calibration), its cache/ the session's."""
    home = tmp_path_factory.mktemp("trainplan_home")
    (home / "cache").symlink_to(_session_cache, target_is_directory=True)
    monkeypatch.setenv("TRAINPLAN_HOME", str(home))


@pytest.fixture(scope="session")
def bert_large_traces():
    """BERT-large, pure fp16, b8 s512, traced once per attention kernel (shared by tests)."""
    job = validate(Job(model="hf:google-bert/bert-large-uncased", batch_size=8, seq_len=512,
                       precision="fp16"))
    return {att: trace_step(job, KernelSemantics(attention=att)) for att in ("eager", "flash")}


def tiny_job(**kw) -> Job:
    """A small reference transformer (nanoGPT-sized) that traces in well under a second; any
    TransformerDims field among `kw` (num_layers, kind, vocab_size, loss...) sets its dimensions,
    the rest the job."""
    from dataclasses import fields

    from trainplan.models.reference import TransformerDims
    dims = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, vocab_size=256,
                kind="decoder")
    dims.update({f.name: kw.pop(f.name) for f in fields(TransformerDims) if f.name in kw})
    base = dict(model="transformer", transformer=TransformerDims(**dims), batch_size=2, seq_len=32)
    base.update(kw)
    return validate(Job(**base))


def trace(job, attention="efficient", autocast=None, batch=None):
    return trace_step(job, KernelSemantics(attention=attention, autocast_dtype=autocast), batch)


def shallow(model_id: str, layers: int | None = 8,
            vision: tuple[int, list[int]] | None = None, **config) -> str:
    """`hf:` reference of a bundled model's own config.json with `layers` blocks instead of its
    own: the same blocks and head, fewer of them. Checks of a derivation in which the block
    count is a parameter (trace/derive/stitch.py reads L off the model) compare a cut trace with
    a full one of a model this deep, at a fraction of a 16- or 24-block trace's cost. `vision`
    (depth, full-attention block indexes): a Qwen2.5-VL vision tower this deep, with full
    attention in these blocks and windows in the others (`layers` None: the text stack's own
    depth). `config`: other keys of the config set (a sliding window, say). Written once to one
    folder every pytest-xdist worker shares (a trace's store key holds its path)."""
    import hashlib
    import json
    import tempfile
    from pathlib import Path

    from trainplan.models.hf_names import DEPTH_KEYS, load_config_dict
    cfg = dict(load_config_dict(model_id)[0])
    keys = [k for k in DEPTH_KEYS if isinstance(cfg.get(k), int)]
    assert keys, f"{model_id}: no block count in its config"
    for k in keys if layers is not None else ():
        cfg[k] = layers
    if vision is not None:
        depth, full = vision
        cfg["vision_config"] = {**cfg["vision_config"], "depth": depth,
                                "fullatt_block_indexes": list(full)}
    cfg.update(config)
    text = json.dumps(cfg, indent=1, sort_keys=True)
    folder = Path(tempfile.gettempdir()) / f"trainplan-tests-{os.getuid()}" / "shallow"
    folder.mkdir(parents=True, exist_ok=True)
    # named by its content: test runs of two checkouts at once never rewrite each other's
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = folder / f"{model_id.replace('/', '--')}-{layers or 'own'}-blocks-{digest}.json"
    if not path.exists():                                   # whole or absent
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return f"hf:{path}"
