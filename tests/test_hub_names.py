"""`hf:` names: bare names and aliases of bundled configs, close matches for unknown ids, local
paths without the prefix, and config.json downloads from a hub (opt-in only).

No test touches the network: downloads go to a local HTTP server that answers as the Hugging
Face Hub does (`{HF_ENDPOINT}/{repo_id}/resolve/{revision}/config.json`, HEAD and GET, with the
X-Repo-Commit / ETag headers huggingface_hub reads and its X-Error-Code errors), with HF_ENDPOINT
pointed at it and a temporary HF_HOME / HF_HUB_CACHE.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trainplan.cli.main import main
from trainplan.errors import TrainplanError
from trainplan.models import build_model, hub
from trainplan.models.hf_names import (ALIASES, bundled_ids, bundled_index, close_ids,
                                       known_ids, load_config_dict, normalize_model_ref,
                                       resolve_config)
from trainplan.spec import Job, validate

CONFIG_DIR = Path(__file__).parents[1] / "src/trainplan/models/hf_configs"

# a GPT-2 with 2 blocks of width 128: traces in about a second
TINY_GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 128,
             "n_head": 4, "n_layer": 2, "n_positions": 256, "n_ctx": 256, "vocab_size": 1000,
             "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
# architectures transformers has no class for, as legacy T5 and remote-code MPT configs name them
TINY_T5 = {"architectures": ["T5WithLMHeadModel"], "model_type": "t5", "d_model": 64, "d_ff": 128,
           "d_kv": 16, "num_heads": 4, "num_layers": 2, "num_decoder_layers": 2,
           "vocab_size": 1000, "relative_attention_num_buckets": 8,
           "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1}
TINY_MPT = {**json.loads((CONFIG_DIR / "mosaicml--mpt-7b.json").read_text()),
            "architectures": ["MPTForCausalLM"], "d_model": 64, "n_heads": 4, "n_layers": 2,
            "vocab_size": 1000, "max_seq_len": 128}
TOKEN = "hf_test_token_for_gated"


class FakeHub(BaseHTTPRequestHandler):
    """The Hub's `resolve` endpoint: 200 with X-Repo-Commit and ETag (HEAD and GET); 404
    RepoNotFound / EntryNotFound; 401 GatedRepo without the right token."""

    repos: dict[str, bytes] = {}          # repo id -> config.json bytes (None: no config.json)
    gated: set[str] = set()
    requests: list[tuple[str, str]] = []

    def log_message(self, *args):          # keep pytest's output clean
        pass

    def _answer(self, body: bool):
        type(self).requests.append((self.command, self.path))
        repo, sep, rest = self.path.lstrip("/").partition("/resolve/")
        filename = rest.partition("/")[2]
        commit = hashlib.sha1(repo.encode()).hexdigest()
        if not sep or repo not in self.repos:
            return self._error(404, "RepoNotFound", "Repository not found")
        if repo in self.gated and self.headers.get("authorization") != f"Bearer {TOKEN}":
            return self._error(401, "GatedRepo", "Access to model is restricted", commit)
        data = self.repos[repo]
        if filename != "config.json" or data is None:
            return self._error(404, "EntryNotFound", "Entry not found", commit)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", commit)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status, code, message, commit=None):
        payload = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)


@pytest.fixture(scope="module")
def server():
    FakeHub.repos = {"test-org/tiny-gpt2": json.dumps(TINY_GPT2).encode(),
                     "test-org/tiny-t5": json.dumps(TINY_T5).encode(),
                     "test-org/tiny-mpt": json.dumps(TINY_MPT).encode(),
                     "test-org/gated-gpt2": json.dumps(TINY_GPT2).encode(),
                     "test-org/weights-only": None}
    FakeHub.gated = {"test-org/gated-gpt2"}
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def hub_env(server, tmp_path, monkeypatch):
    """HF_ENDPOINT at the fake hub, an empty cache, no token, no opt-in, online."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                hub.ENV_OPT_IN, "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
                "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", server)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    FakeHub.requests.clear()
    _forget()
    yield server
    _forget()


def _forget():
    """A fresh process's view: nothing fetched yet, no --allow-download."""
    hub._fetched.clear()
    hub._downloaded.clear()
    hub._failed.clear()
    hub.set_allow_download(False)


# --- bundled names, aliases, close matches (no hub at all) -------------------------------------

@pytest.mark.parametrize("ref, hub_id", [
    ("gpt2", "openai-community/gpt2"), ("GPT2", "openai-community/gpt2"),
    ("bert-base-uncased", "google-bert/bert-base-uncased"),
    ("Llama-3.2-1B", "meta-llama/Llama-3.2-1B"), ("llama-3.2-1b", "meta-llama/Llama-3.2-1B"),
    ("t5-small", "google-t5/t5-small"), ("OpenAI-Community/GPT2", "openai-community/gpt2")])
def test_bare_and_case_insensitive_names_resolve_to_the_bundled_id(ref, hub_id):
    cfg, auto, canonical, note = resolve_config(ref)
    assert canonical == hub_id
    assert cfg == json.loads((CONFIG_DIR / (hub_id.replace("/", "--") + ".json")).read_text())
    assert auto == bundled_index()[hub_id.lower()]["auto_class"]
    assert (note is None) == (ref == hub_id or "/" in ref)
    if note:
        assert note == f"hf:{ref} is {hub_id}"


def test_bare_names_are_unambiguous():
    names = [i.rsplit("/", 1)[-1].lower() for i in known_ids()]
    assert len(names) == len(set(names))


def test_bundled_model_builds_from_a_bare_name_with_a_note():
    bundle = build_model(validate(Job(model="hf:gpt2", seq_len=32)))
    assert bundle.name == "hf:openai-community/gpt2"
    assert "hf:gpt2 is openai-community/gpt2" in bundle.notes


@pytest.mark.parametrize("alias, target", [
    ("meta-llama/Llama-2-7b-chat-hf", "meta-llama/Llama-2-7b-hf"),
    ("meta-llama/Meta-Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B"),
    ("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B"),
    ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B"),
    ("google/gemma-2-2b-it", "google/gemma-2-2b")])
def test_aliases_use_the_bundled_config_and_say_so(alias, target):
    cfg, auto, canonical, note = resolve_config(alias.lower())
    assert canonical == alias                 # reported as asked, spelled as on the hub
    assert (cfg, auto) == load_config_dict(target)[:2]
    assert note.startswith(f"hf:{alias}: built from the bundled config of {target}: ")
    assert note.endswith("with the same architecture")


def test_bare_alias_name_resolves_too():
    _, _, canonical, note = resolve_config("Llama-3.2-1B-Instruct")
    assert canonical == "meta-llama/Llama-3.2-1B-Instruct"
    assert note.startswith("hf:Llama-3.2-1B-Instruct is meta-llama/Llama-3.2-1B-Instruct, built "
                           "from the bundled config of meta-llama/Llama-3.2-1B")


def test_alias_table_points_at_bundled_configs_of_the_same_family():
    bundled = {i.lower() for i in bundled_ids()}
    for alias, (target, relation) in ALIASES.items():
        assert alias.lower() not in bundled, alias          # an alias never hides a bundled id
        assert target.lower() in bundled, (alias, target)
        assert relation
        assert alias.split("/")[0] == target.split("/")[0]  # same organisation


def test_alias_builds_with_its_note():
    bundle = build_model(validate(Job(model="hf:Qwen/Qwen2.5-0.5B-Instruct", seq_len=32)))
    assert bundle.name == "hf:Qwen/Qwen2.5-0.5B-Instruct"
    assert any("bundled config of Qwen/Qwen2.5-0.5B" in n for n in bundle.notes)


@pytest.mark.parametrize("ref, expected", [
    ("gpt-2", "openai-community/gpt2"), ("meta-llama/Llama-2-7b", "meta-llama/Llama-2-7b-hf"),
    ("llama-3-8b", "meta-llama/Meta-Llama-3-8B"),
    ("bert-larg-uncased", "google-bert/bert-large-uncased"),
    ("Qwen/Qwen2.5-7b-instrct", "Qwen/Qwen2.5-7B-Instruct")])
def test_close_matches(ref, expected):
    assert expected in close_ids(ref)


def test_unknown_id_without_opt_in_says_how_to_get_it(hub_env):
    with pytest.raises(TrainplanError) as e:
        resolve_config("meta-llama/Llama-2-7b")
    msg = str(e.value)
    assert e.value.what.startswith("Unknown model 'hf:meta-llama/Llama-2-7b': trainplan bundles "
                                   "no config for it, and downloading is off. Did you mean "
                                   "'hf:meta-llama/Llama-2-7b-hf'")
    assert "--allow-download" in msg and "TRAINPLAN_ALLOW_DOWNLOAD=1" in msg
    assert f"{hub_env}/meta-llama/Llama-2-7b/resolve/main/config.json" in msg
    assert "--model hf:./config.json" in msg
    assert FakeHub.requests == []                         # no network without opt-in


def test_unknown_id_message_names_huggingface_co_by_default(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv(hub.ENV_OPT_IN, raising=False)
    monkeypatch.setattr(hub, "cached_config", lambda repo_id: None)
    with pytest.raises(TrainplanError) as e:
        resolve_config("someone/some-model")
    assert ("download https://huggingface.co/someone/some-model/resolve/main/config.json "
            "yourself and pass --model hf:./config.json") in e.value.fix


def test_not_a_hub_id():
    with pytest.raises(TrainplanError) as e:
        resolve_config("gpt 2")
    assert "not a hub id" in e.value.what and "openai-community/gpt2" in e.value.what


# --- local paths without the hf: prefix ---------------------------------------------------------

def test_config_path_without_prefix(tmp_path, monkeypatch):
    cfg = tmp_path / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(TINY_GPT2))
    assert normalize_model_ref(str(cfg)) == f"hf:{cfg}"
    assert normalize_model_ref(str(cfg.parent)) == f"hf:{cfg.parent}"
    assert normalize_model_ref("missing/config.json") == "hf:missing/config.json"
    for other in ("hf:gpt2", "timm:resnet50", "transformer", "py:m:f", "gpt2", str(tmp_path)):
        assert normalize_model_ref(other) == other
    monkeypatch.chdir(tmp_path)                           # a relative folder, as typed
    bundle = build_model(validate(Job(model="tiny", seq_len=32)))
    assert bundle.name == "hf:tiny/config.json"
    job = validate(Job(model=str(cfg), seq_len=32))
    assert job.model == f"hf:{cfg}"


def test_cli_accepts_config_path_without_prefix(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_GPT2))
    code = main(["estimate", "--model", str(cfg), "--seq-len", "32", "--batch-size", "1",
                 "--gpu", "t4", "--format", "json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)


def test_a_config_naming_no_architecture_builds_its_families_model(tmp_path):
    """microsoft/deberta-v3-large's config.json has no `architectures`: a user's copy of it
    builds what the bundled id builds (DeBERTa-v2 has no causal-LM class; its masked-LM class
    is the first task with a class for model_type 'deberta-v2') and says so, where it used to
    stop on transformers' "Could not import module 'Gemma3nConfig'"."""
    cfg, auto, _ = load_config_dict("microsoft/deberta-v3-large")
    assert "architectures" not in cfg and auto == "AutoModelForMaskedLM"
    small = {**cfg, "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
             "num_attention_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps(small))
    own = build_model(validate(Job(model=f"hf:{tmp_path / 'config.json'}", seq_len=32)))
    assert type(own.module).__name__ == "DebertaV2ForMaskedLM"
    assert any("names no architecture; built DebertaV2ForMaskedLM" in n for n in own.notes)


@pytest.mark.parametrize("model, task, allowed, fix", [
    # the family's own task first in what to try (its config.json's architecture)
    ("google-t5/t5-small", "causal-lm", "seq2seq, seq-classification", "--task seq2seq"),
    ("meta-llama/Llama-3.2-1B", "masked-lm", "causal-lm, seq-classification", "--task causal-lm"),
    ("google/vit-base-patch16-224", "seq2seq", "image-classification",
     "--task image-classification"),
])
def test_a_task_the_family_has_no_model_for_is_named(model, task, allowed, fix):
    """--task with a head transformers has not for that model_type: one error naming the tasks
    it has, where transformers' Auto class failed on another model's config ("Could not import
    module 'Gemma3nConfig'")."""
    with pytest.raises(TrainplanError) as e:
        build_model(validate(Job(model=f"hf:{model}", seq_len=32, task=task)))
    assert f"has no {task} model" in str(e.value) and "Gemma3n" not in str(e.value)
    assert e.value.allowed == allowed and fix in e.value.fix


def test_a_decoder_classifier_without_a_pad_id_takes_a_batch():
    """GPT-2's config has no pad_token_id, and its sequence classifier refuses a batch of two
    without one: the EOS id is set, as fine-tuning recipes do, and the note says so."""
    from trainplan.trace.semantics import KernelSemantics
    from trainplan.trace.tracer import trace_step
    job = validate(Job(model="hf:openai-community/gpt2", seq_len=32, batch_size=2,
                       task="seq-classification"))
    tr = trace_step(job, KernelSemantics(attention="efficient"), depth=2)
    assert any("sets no pad_token_id: set to 50256 (its EOS)" in n for n in tr.notes)
    bert = build_model(validate(Job(model="hf:google-bert/bert-base-uncased", seq_len=32,
                                    task="seq-classification")))
    assert not any("pad_token_id" in n for n in bert.notes)      # BERT's config has one


# --- downloads from the (fake) hub --------------------------------------------------------------

def test_download_with_opt_in_then_cache(hub_env, monkeypatch):
    monkeypatch.setenv(hub.ENV_OPT_IN, "1")
    cfg, auto, canonical, note = resolve_config("test-org/tiny-gpt2")
    assert cfg == TINY_GPT2 and auto is None and canonical == "test-org/tiny-gpt2"
    assert note.startswith(f"hf:test-org/tiny-gpt2: config.json downloaded from {hub_env} (")
    assert ("GET", "/test-org/tiny-gpt2/resolve/main/config.json") in FakeHub.requests
    assert Path(os.environ["HF_HUB_CACHE"]) in Path(note.split("(")[1].split(")")[0]).parents
    # later runs read huggingface_hub's cache, with no request, even without the opt-in
    FakeHub.requests.clear()
    _forget()
    monkeypatch.delenv(hub.ENV_OPT_IN)
    cfg2, _, _, note2 = resolve_config("test-org/tiny-gpt2")
    assert cfg2 == TINY_GPT2 and "read from the Hugging Face cache" in note2
    assert FakeHub.requests == []


def test_cli_flag_opts_in(hub_env, capsys):
    code = main(["inspect", "hf:test-org/tiny-gpt2", "--seq-len", "32", "--allow-download"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert FakeHub.requests
    FakeHub.requests.clear()
    _forget()
    code = main(["inspect", "hf:test-org/tiny-t5", "--seq-len", "32"])   # the flag does not stick
    assert code == 2 and "downloading is off" in capsys.readouterr().err
    assert FakeHub.requests == []


def test_missing_repo_is_one_clear_error(hub_env, monkeypatch):
    monkeypatch.setenv(hub.ENV_OPT_IN, "1")
    with pytest.raises(TrainplanError) as e:
        resolve_config("test-org/no-such-model")
    assert e.value.what == (f"Hub model 'test-org/no-such-model' was not found at {hub_env} "
                            "(HTTP 404).")
    assert "HF_TOKEN" in e.value.fix
    assert f"{hub_env}/test-org/no-such-model/resolve/main/config.json" in e.value.fix
    FakeHub.requests.clear()                  # asked again in this process (the trace after the
    with pytest.raises(TrainplanError) as again:  # depth probe): the answer is kept, not re-asked
        resolve_config("test-org/no-such-model")
    assert again.value.what == e.value.what and FakeHub.requests == []


def test_gated_repo_asks_for_token_and_licence(hub_env, monkeypatch):
    monkeypatch.setenv(hub.ENV_OPT_IN, "1")
    with pytest.raises(TrainplanError) as e:
        resolve_config("test-org/gated-gpt2")
    assert e.value.what == ("test-org/gated-gpt2 is a gated model: its config.json is served only "
                            "to an account that accepted its licence.")
    assert "accept the licence on https://huggingface.co/test-org/gated-gpt2" in e.value.fix
    assert "set HF_TOKEN" in e.value.fix
    monkeypatch.setenv("HF_TOKEN", TOKEN)                 # honoured: the token unlocks it
    assert resolve_config("test-org/gated-gpt2")[0] == TINY_GPT2


def test_repo_without_config_json(hub_env, monkeypatch):
    monkeypatch.setenv(hub.ENV_OPT_IN, "1")
    with pytest.raises(TrainplanError) as e:
        resolve_config("test-org/weights-only")
    assert e.value.what == ("Hub model 'test-org/weights-only' has no config.json: it is not a "
                            "transformers model repo.")


def test_offline_with_opt_in_and_no_cache(hub_env, monkeypatch):
    monkeypatch.setenv(hub.ENV_OPT_IN, "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TrainplanError) as e:
        resolve_config("test-org/tiny-gpt2")
    assert e.value.what.startswith(f"HF_HUB_OFFLINE is set, and the config.json of "
                                   f"test-org/tiny-gpt2 is not in {os.environ['HF_HUB_CACHE']}.")
    assert "unset HF_HUB_OFFLINE" in e.value.fix
    assert FakeHub.requests == []


def test_offline_reads_the_cache(hub_env, monkeypatch):
    monkeypatch.setenv(hub.ENV_OPT_IN, "1")
    resolve_config("test-org/tiny-gpt2")
    _forget()
    FakeHub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_config("test-org/tiny-gpt2")[0] == TINY_GPT2
    assert FakeHub.requests == []


@pytest.mark.parametrize("repo, built, mapped", [
    ("test-org/tiny-t5", "T5ForConditionalGeneration", True),    # T5WithLMHeadModel: via model_type
    ("test-org/tiny-mpt", "MptForCausalLM", False)])              # MPTForCausalLM: case-folded
def test_downloaded_config_with_a_class_transformers_lacks_builds(hub_env, monkeypatch, repo,
                                                                   built, mapped):
    monkeypatch.setenv(hub.ENV_OPT_IN, "1")
    bundle = build_model(validate(Job(model=f"hf:{repo}", seq_len=32)))
    assert type(bundle.module).__name__ == built
    assert bundle.name == f"hf:{repo}"
    assert any("config.json downloaded from" in n for n in bundle.notes), bundle.notes
    assert any("which transformers does not have" in n for n in bundle.notes) == mapped


def test_trainplan_estimate_on_a_served_config(hub_env):
    """The installed command, in its own process, downloads through HF_ENDPOINT and estimates."""
    env = {k: v for k, v in os.environ.items() if k != hub.ENV_OPT_IN}
    env.update(TRAINPLAN_JOBS="1", PYTHONPATH=str(Path(__file__).parents[1] / "src"))
    r = subprocess.run([sys.executable, "-m", "trainplan.cli.main", "estimate",
                        "--model", "hf:test-org/tiny-gpt2", "--seq-len", "128",
                        "--batch-size", "1", "--gpu", "t4", "--allow-download"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "test-org/tiny-gpt2" in r.stdout
    assert ("GET", "/test-org/tiny-gpt2/resolve/main/config.json") in FakeHub.requests
