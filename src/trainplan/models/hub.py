"""One file from the Hugging Face Hub: a model's `config.json`, and only when the user opts in.

`hf:<hub id>` for a model trainplan does not bundle (models/hf_configs) reads that model's
config.json from the Hugging Face cache when an earlier download left it there (no network), and
otherwise downloads it with `huggingface_hub.hf_hub_download(repo_id, "config.json")` only if the
user opted in: `--allow-download` (`set_allow_download`) or `TRAINPLAN_ALLOW_DOWNLOAD=1`. Weights
are never fetched. huggingface_hub's own settings apply, read when the file is asked for (not when
huggingface_hub was imported): `HF_ENDPOINT`, `HF_TOKEN` (gated and private models),
`HF_HUB_OFFLINE` / `TRANSFORMERS_OFFLINE` (the cache only), `HF_HOME` / `HF_HUB_CACHE` (where the
cache is). Every failure is one `TrainplanError` saying what to do.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import TrainplanError

ENV_OPT_IN = "TRAINPLAN_ALLOW_DOWNLOAD"
DEFAULT_ENDPOINT = "https://huggingface.co"
FILENAME = "config.json"
_TRUE = ("1", "true", "yes", "on")

_flag = False                       # --allow-download of the command being run
_fetched: dict[str, Path] = {}      # repo id -> config.json path, once found in this process
_downloaded: set[str] = set()       # repo ids whose config.json this process downloaded
_failed: dict[tuple, TrainplanError] = {}   # a failed fetch is not retried in this process with
                                            # the same settings (huggingface_hub's own retries on a
                                            # dead connection take half a minute)


def set_allow_download(on: bool) -> None:
    """The CLI's `--allow-download` (set on every command, so one run's flag does not outlive it);
    forked trace workers inherit it."""
    global _flag
    _flag = bool(on)


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def download_allowed() -> bool:
    return _flag or _env_true(ENV_OPT_IN)


def offline() -> bool:
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def config_url(repo_id: str) -> str:
    """Where the Hub serves a model's config.json (what `hf_hub_download` fetches)."""
    return f"{endpoint()}/{repo_id}/resolve/main/{FILENAME}"


def cache_dir() -> str | None:
    """huggingface_hub's cache as the environment names it now (None: its default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def _cache_label() -> str:
    return cache_dir() or "the default Hugging Face cache (~/.cache/huggingface/hub)"


def how_to_get(repo_id: str) -> str:
    """The fix for a model that is neither bundled nor cached."""
    return (f"pass --allow-download (or set {ENV_OPT_IN}=1) to fetch only its config.json from "
            f"the Hugging Face Hub, or download {config_url(repo_id)} yourself and pass "
            f"--model hf:./config.json")


def cached_config(repo_id: str) -> Path | None:
    """config.json of repo_id from the Hugging Face cache, or None. Never touches the network."""
    if repo_id in _fetched:
        return _fetched[repo_id]
    try:
        path = _download(repo_id, local_only=True)
    except Exception:                   # not cached (or no huggingface_hub): not an error here
        return None
    _fetched[repo_id] = path
    return path


def download_config(repo_id: str, close: str = "") -> Path:
    """Fetch repo_id's config.json (the user opted in). `close`: the close matches to add to a
    not-found message (errors.suggestion). Raises one TrainplanError for every failure."""
    if repo_id in _fetched:
        return _fetched[repo_id]
    key = (repo_id, endpoint(), cache_dir(), offline(), os.environ.get("HF_TOKEN"), close)
    if key in _failed:
        raise _failed[key]
    try:
        path = _fetch(repo_id, close)
    except TrainplanError as e:
        _failed[key] = e
        raise
    _fetched[repo_id] = path
    _downloaded.add(repo_id)
    return path


def _fetch(repo_id: str, close: str) -> Path:
    url = config_url(repo_id)
    if offline():
        raise TrainplanError(
            f"HF_HUB_OFFLINE is set, and the config.json of {repo_id} is not in "
            f"{_cache_label()}.{close}",
            fix=f"unset HF_HUB_OFFLINE (and TRANSFORMERS_OFFLINE) so --allow-download can fetch "
                f"it, or download {url} on a connected machine and pass --model hf:./config.json")
    try:
        from huggingface_hub import utils as hub_utils
    except ImportError:
        raise TrainplanError("Downloading a config.json needs huggingface_hub, which is not "
                             "installed.",
                             fix=f"pip install huggingface_hub, or download {url} yourself and "
                                 "pass --model hf:./config.json") from None
    manual = f"or download {url} yourself and pass --model hf:./config.json"
    try:
        path = _download(repo_id, local_only=False)
    except hub_utils.GatedRepoError:
        raise TrainplanError(
            f"{repo_id} is a gated model: its config.json is served only to an account that "
            "accepted its licence.",
            fix=f"accept the licence on https://huggingface.co/{repo_id} while logged in, then set "
                "HF_TOKEN to an access token of that account "
                f"(https://huggingface.co/settings/tokens) and run again; {manual}") from None
    except hub_utils.RepositoryNotFoundError as e:
        status = _status(e)
        raise TrainplanError(
            f"Hub model {repo_id!r} was not found at {endpoint()}"
            f"{f' (HTTP {status})' if status else ''}.{close}",
            fix="check the id (the part after huggingface.co/ in the model's address); a private "
                "or gated model also answers this way without a token: set HF_TOKEN to a token "
                f"that can read it; {manual}") from None
    except hub_utils.RevisionNotFoundError:
        raise TrainplanError(f"Hub model {repo_id!r} has no `main` revision.",
                             fix=manual[3:]) from None
    except hub_utils.LocalEntryNotFoundError as e:      # before EntryNotFoundError, its base
        raise TrainplanError(
            f"Could not reach the Hugging Face Hub at {endpoint()} to fetch the config.json of "
            f"{repo_id}, and it is not in {_cache_label()}{_cause(e)}.",
            fix=f"check the connection (and HTTPS_PROXY if you are behind a proxy), {manual}"
        ) from None
    except hub_utils.EntryNotFoundError:
        raise TrainplanError(
            f"Hub model {repo_id!r} has no config.json: it is not a transformers model repo.",
            fix="describe the model with py:<module>:<factory>, or write a transformers "
                "config.json for it and pass --model hf:./config.json") from None
    except hub_utils.HfHubHTTPError as e:
        status = _status(e)
        raise TrainplanError(
            f"The Hugging Face Hub answered{f' HTTP {status}' if status else ''} for the "
            f"config.json of {repo_id} ({url}).",
            fix=f"try again later; a 403 means HF_TOKEN cannot read this model; {manual}"
        ) from None
    except (OSError, ValueError) as e:      # hub id rejected, cache not writable, ...
        raise TrainplanError(f"Could not fetch the config.json of {repo_id}: "
                             f"{str(e).splitlines()[0] if str(e) else type(e).__name__}.",
                             fix=manual[3:]) from None
    return path


def origin(repo_id: str) -> str:
    """How this process got repo_id's config.json, for the result's note."""
    return (f"downloaded from {endpoint()}" if repo_id in _downloaded
            else "read from the Hugging Face cache")


def _download(repo_id: str, local_only: bool) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import (are_progress_bars_disabled, disable_progress_bars,
                                       enable_progress_bars)
    quiet = are_progress_bars_disabled()
    disable_progress_bars()                 # a few KB: no progress bar in the CLI's output
    try:
        return Path(hf_hub_download(repo_id, FILENAME, cache_dir=cache_dir(),
                                    endpoint=os.environ.get("HF_ENDPOINT") or None,
                                    local_files_only=local_only or offline()))
    finally:
        if not quiet:
            enable_progress_bars()


def _status(e) -> int | None:
    response = getattr(e, "response", None)
    return getattr(response, "status_code", None)


def _cause(e) -> str:
    cause = e.__cause__ or e.__context__
    if cause is None:
        return ""
    text = str(cause).splitlines()[0] if str(cause) else ""
    return f" ({type(cause).__name__}{': ' + text if text else ''})"
