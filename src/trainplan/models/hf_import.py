"""Import transformers' model code without the parts trainplan never uses.

A `hf:` model needs one modeling file, but importing any of them first runs `transformers` and
`transformers.models`, and each of those builds a lazy-import table by reading all ~2,500 source
files under `transformers/models` (`create_import_structure_from_path`, about 0.25 s each on a
2-core machine). transformers caches that scan with `lru_cache(maxsize=128)`, smaller than its
~550 model folders, so the second scan repeats the first. We make the cache unbounded and keep
the result on disk, keyed by the name, size and mtime of every file scanned: a changed or
reinstalled transformers gives a new key, and the table is the one transformers would build.

torchvision is hidden from transformers as well: transformers imports it only for image
*processing* (image_utils); model definitions, ViT and CLIP included, need none of it, it costs
about 0.5 s, and beside a CPU torch the wheel may be a CUDA build that cannot load (see
vision.import_torchvision). A later `timm:`/`torchvision:` model still imports it normally.

Both are set up only if transformers is not imported yet; if it is, nothing changes.

Also here: `third_party_output`, the one place where the CLI hides transformers', huggingface_hub's
and torch's warnings unless --verbose (issue 18).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import logging
import os
import pickle
import sys
import warnings

from ..paths import cache_dir

_IMPORT_UTILS = "transformers.utils.import_utils"
_CACHE_VERSION = 1


def prepare() -> None:
    """Call before the first import of anything under `transformers`."""
    if "transformers" not in sys.modules and not any(isinstance(f, _ScanCacheFinder)
                                                     for f in sys.meta_path):
        sys.meta_path.insert(0, _ScanCacheFinder())
    _hide_torchvision()


class _ScanCacheFinder(importlib.abc.MetaPathFinder):
    """Finds transformers.utils.import_utils with the normal finders, then patches the module
    right after it runs, before transformers' __init__ calls the scan."""

    def find_spec(self, name, path, target=None):
        if name != _IMPORT_UTILS:
            return None
        sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)
        spec.loader.exec_module = exec_module
        return spec


def _patch(module) -> None:
    scan = getattr(getattr(module, "create_import_structure_from_path", None), "__wrapped__", None)
    if scan is None:  # a transformers without this function: leave it alone
        return
    memo: dict[str, object] = {}

    def cached_scan(module_path):
        folder = os.fspath(module_path)
        if os.path.isfile(folder):
            folder = os.path.dirname(folder)
        if folder not in memo:
            memo[folder] = _disk_cached(scan, folder) if os.path.basename(folder) == "models" \
                else scan(folder)
        return memo[folder]
    module.create_import_structure_from_path = cached_scan


def _disk_cached(scan, folder: str):
    """scan(folder), read from / written to the cache when the folder's files are unchanged."""
    try:
        key = _fingerprint(folder)
    except OSError:
        return scan(folder)
    path = cache_dir() / f"hf-import-structure-{key}.pickle"
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError):
        pass
    structure = scan(folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(structure, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except OSError:  # a read-only home: no cache, same result
        pass
    return structure


def _fingerprint(folder: str) -> str:
    """Hash of (path, size, mtime) of every file under folder, skipping __pycache__."""
    h = hashlib.sha256(f"{_CACHE_VERSION}\0{sys.version}\0{folder}".encode())
    stack = [folder]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        stack.append(e.path)
                    continue
                st = e.stat()
                h.update(f"{e.path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def _hide_torchvision() -> None:
    """Tell transformers torchvision is absent, unless something already imported it."""
    if "torchvision" in sys.modules or "transformers.image_utils" in sys.modules:
        return
    import transformers.utils as tu
    from transformers.utils import import_utils

    def absent() -> bool:
        return False
    tu.is_torchvision_available = import_utils.is_torchvision_available = absent



# --- third-party noise (issue 18) ---------------------------------------------------------------
# What the user reads is trainplan's own findings. transformers', huggingface_hub's and torch's
# log warnings and Python warnings (rope_scaling, `loss_type=None`, deprecations) say nothing
# about the job; they are shown with `trainplan --verbose` only. The CLI sets this up once, in
# `main`, around the whole command: forked trace workers (trace/parallel.py) inherit the levels,
# the environment and the warning filters in force when they are forked.

_LIBRARY_LOGGERS = ("transformers", "huggingface_hub", "torch", "timm", "torchvision",
                    "accelerate", "peft")
# transformers and huggingface_hub give their root logger a level when first imported, from
# these variables (default warning); setting the variable covers an import inside the block
_VERBOSITY_ENV = {"transformers": "TRANSFORMERS_VERBOSITY", "huggingface_hub": "HF_HUB_VERBOSITY"}


@contextlib.contextmanager
def third_party_output(verbose: bool):
    """Within the block, third-party warnings are dropped unless `verbose`; all is put back on
    exit. Dropped: records below ERROR on the libraries' loggers and on loggers with no handler
    (which Python's last-resort handler would print), and Python warnings. A verbosity the user
    asked for (TRANSFORMERS_VERBOSITY, HF_HUB_VERBOSITY, -W or PYTHONWARNINGS) is kept."""
    if verbose:
        yield
        return
    env_before = {lib: os.environ.get(var) for lib, var in _VERBOSITY_ENV.items()}
    levels_before = {n: logging.getLogger(n).level for n in _LIBRARY_LOGGERS}
    last_resort = logging.lastResort
    for lib, var in _VERBOSITY_ENV.items():
        os.environ.setdefault(var, "error")
    for n in _LIBRARY_LOGGERS:
        if env_before.get(n) is None:
            logging.getLogger(n).setLevel(logging.ERROR)
    quiet = logging.StreamHandler()   # stderr, like the last-resort handler, from ERROR up
    quiet.setLevel(logging.ERROR)
    logging.lastResort = quiet
    try:
        with warnings.catch_warnings():
            if not sys.warnoptions:
                warnings.simplefilter("ignore")
            yield
    finally:
        logging.lastResort = last_resort
        for lib, var in _VERBOSITY_ENV.items():
            if env_before[lib] is None:
                os.environ.pop(var, None)
        for n, level in levels_before.items():
            if level == logging.NOTSET and n in _VERBOSITY_ENV and n in sys.modules:
                level = logging.WARNING    # imported inside the block: the library's default
            logging.getLogger(n).setLevel(level)
