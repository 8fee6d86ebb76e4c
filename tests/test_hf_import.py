"""trainplan.models.hf_import: the cached table of transformers' model modules is the one
transformers builds itself, is written once, and is keyed by the files it was built from."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

from trainplan.models import hf_import

TABLES = textwrap.dedent("""
    import pickle, sys
    if sys.argv[1] == "cached":
        from trainplan.models import hf_import
        hf_import.prepare()
    import transformers, transformers.models
    from pathlib import Path
    from transformers.utils import import_utils as iu
    tables = (iu.define_import_structure(Path(transformers.__file__).parent / "models", prefix="models"),
              iu.define_import_structure(transformers.models.__file__))
    sys.stdout.buffer.write(pickle.dumps(tables))
""")


def _tables(mode: str):
    r = subprocess.run([sys.executable, "-c", TABLES, mode], capture_output=True, check=True,
                       env=dict(os.environ))
    return pickle.loads(r.stdout)


def test_cached_tables_equal_transformers_own_and_are_written_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))   # not the session's cache
    plain = _tables("plain")
    assert not list(hf_import.cache_dir().glob("hf-import-structure-*.pickle"))
    assert _tables("cached") == plain                       # built, then written
    written = list(hf_import.cache_dir().glob("hf-import-structure-*.pickle"))
    assert len(written) == 1
    assert _tables("cached") == plain                       # read back
    assert list(hf_import.cache_dir().glob("hf-import-structure-*.pickle")) == written


def test_fingerprint_follows_every_file(tmp_path):
    (tmp_path / "bert").mkdir()
    f = tmp_path / "bert" / "modeling_bert.py"
    f.write_text("__all__ = ['A']\n")
    (tmp_path / "__pycache__").mkdir()
    key = hf_import._fingerprint(str(tmp_path))
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"0")   # bytecode: ignored
    assert hf_import._fingerprint(str(tmp_path)) == key
    f.write_text("__all__ = ['A', 'B']\n")                    # a changed source: a new key
    assert hf_import._fingerprint(str(tmp_path)) != key
