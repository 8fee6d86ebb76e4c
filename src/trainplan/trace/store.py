"""Traces kept on disk between runs, so that a job traced once is not traced again.

A trace is a pure function of what it is made from: the job as the tracer sees it, the kernel
semantics, the micro-batch and the blocks kept (tracer.py), and of the code that makes it. The
key is a SHA-256 over all of those: the job's repr, the resolved model config (a hub id's or a
local config.json's contents, not its name, so an edited file is a new key), trainplan's own
source and data files, and the versions of Python, torch, transformers, timm, torchvision and
kernels (whose presence makes some of transformers' functions modules, tracer.py `_Tracker`). A
changed line anywhere in trainplan, or an upgraded library, makes every key new; nothing stale is
ever read. A `py:` model's key has its file's path and contents; its trace also records every
.py file of the user's own that was loaded when it was made (models/custom.py `user_files`: what
the model imports from outside Python's installation), and is read back only while each of them
is unchanged. Code the model reads other than Python it imports (a YAML of sizes, an environment
variable) is not covered: the model's sizes belong in the job's `model_args`.

A trace is kept with what the prediction layer derived from it in the worker that made it (its
allocator replay, and a cut trace's phase peaks over one block more and the whole stack:
derive/replays.py `prepare`), so a warm plan replays nothing.

Files: zlib-compressed pickles (about 80 KB for a 1B-parameter LLM's trace; a few hundred bytes
for the peaks of a trace read off two, `.peaks`: derive/traces.py `between`) in
`paths.cache_dir()/traces`, written whole (a temporary file, renamed); past `MAX_BYTES` the least recently used are
removed (once per process). Set
`TRAINPLAN_TRACE_CACHE=off` to neither read nor write (tests do, conftest.py), or to a folder to
keep the traces there.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import sys
import zlib
from importlib import metadata
from pathlib import Path

from ..models.hf_names import is_local_ref, load_config_dict
from ..paths import cache_dir
from . import lazy

ENV = "TRAINPLAN_TRACE_CACHE"
KINDS = ("trace", "peaks")       # traces; an interpolated trace's peaks (derive/traces.py)
MAX_BYTES = 512 * 2**20
OFF = ("0", "off", "no", "false", "none")


def folder() -> Path | None:
    """Where traces are kept, or None when the store is off."""
    env = os.environ.get(ENV, "").strip()
    if env.lower() in OFF:
        return None
    return Path(env).expanduser() if env else cache_dir() / "traces"


@functools.cache
def code_fingerprint() -> str:
    """SHA-256 over trainplan's .py and data files and the libraries' versions."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".json", ".yaml")
                       and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    h.update(sys.version.encode())
    for dist in ("torch", "transformers", "timm", "torchvision", "kernels"):
        try:
            h.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=-".encode())
    return h.hexdigest()


def digests(paths) -> dict[str, str]:
    """Each file -> the SHA-256 of its contents (a file that cannot be read: "")."""
    out = {}
    for path in paths:
        try:
            out[str(path)] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            out[str(path)] = ""
    return out


def _model_fingerprint(job) -> str | None:
    """What the model is built from beyond the job's repr; None where it cannot be keyed."""
    if job.model.startswith("py:"):       # its file's path and contents; what it imports is
        from ..models.custom import entry_file      # checked on reading back (`load`)
        path = entry_file(job)
        return None if path is None else json.dumps(digests([path]))
    if job.model.startswith("hf:"):
        ref = job.model[3:]
        return _config_fingerprint(ref) if is_local_ref(ref) else _named_fingerprint(ref)
    return ""


def _config_fingerprint(ref: str) -> str | None:
    """The model's config as text (sorted keys), None where it cannot be read."""
    try:
        cfg = load_config_dict(ref)[0]
    except Exception:     # building the model will say why; nothing to store
        return None
    return json.dumps(cfg, sort_keys=True, default=str)


@functools.lru_cache(maxsize=256)
def _named_fingerprint(ref: str) -> str | None:
    """`_config_fingerprint` of a bundled or hub id, read once a process (a plan keys thousands
    of traces of one model); a local config.json is read each time (it may be edited)."""
    return _config_fingerprint(ref)


def key(job, sem, batch: int, depth: int | None) -> str | None:
    """The file name a trace of (job, sem, batch, depth) is kept under, or None (not stored)."""
    if folder() is None:
        return None
    model = _model_fingerprint(job)
    if model is None:
        return None
    h = hashlib.sha256()
    for part in (code_fingerprint(), repr(job), model, repr(sem), str(batch), str(depth)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def load(name: str | None, kind: str = "trace"):
    """The stored trace (or what else of `kind` is kept: "peaks", derive/traces.py), or None
    (not stored, unreadable, or the store off)."""
    where = folder()
    if name is None or where is None:
        return None
    path = where / f"{name}.{kind}"
    try:
        data = path.read_bytes()
        trace = pickle.loads(zlib.decompress(data))
    except (OSError, zlib.error, pickle.UnpicklingError, EOFError, AttributeError, ImportError,
            TypeError, ValueError):
        return None
    sources = getattr(trace, "sources", None) or {}
    if sources and digests(sources) != sources:     # a `py:` model's code changed since
        return None
    try:
        os.utime(path)          # recently used: pruned last
    except OSError:
        pass
    return trace


def save(name: str | None, trace, kind: str = "trace") -> None:
    """Keep `trace` (or what else of `kind`: `load`) under `name`; a store that cannot be
    written is skipped silently (it is a cache: the next run traces again). What is kept
    beside a trace carries the same `sources` where it rests on a `py:` model's code."""
    where = folder()
    if name is None or where is None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        data = zlib.compress(lazy.dumps(trace), 1)    # lists made on read (lazy.py)
        tmp = where / f".{name}.{os.getpid()}.tmp"     # then renamed: never a partial file
        tmp.write_bytes(data)
        os.replace(tmp, where / f"{name}.{kind}")
        if where not in _PRUNED:
            _PRUNED.add(where)
            _prune(where)
    except OSError:
        pass


_PRUNED: set[Path] = set()     # folders pruned by this process (once: a folder scan per save
                               # would cost more than it saves)


def _prune(where: Path) -> None:
    """Remove the least recently used traces while the folder holds over MAX_BYTES."""
    files = []
    for p in where.iterdir():
        if p.name.startswith(".") or p.suffix[1:] not in KINDS:
            continue
        try:
            st = p.stat()
        except OSError:
            continue
        files.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in files)
    for _, size, p in sorted(files):
        if total <= MAX_BYTES:
            break
        try:
            p.unlink()
            total -= size
        except OSError:
            pass
