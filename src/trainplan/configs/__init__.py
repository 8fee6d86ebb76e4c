"""Plan the config you already have: axolotl, LLaMA-Factory, TRL (and the HF Trainer's
TrainingArguments), torchtune, DeepSpeed and accelerate files, read into trainplan's job.

`load(path, deepspeed=, accelerate=)` recognises a file by its keys (`detect`), reads it with
that framework's reader (one module each) and returns the job (not yet validated: flags go over
it first, as over a trainplan YAML) and the `Reading`, which says what every key became. A file
that is none of these is trainplan's own job (spec.py). A DeepSpeed or accelerate config may
also come beside any other (`--deepspeed ds.json`, `--accelerate acc.yaml`):

    DeepSpeed beside a training config   its ZeRO stage, offload and 16-bit mode; its "auto"
                                         values filled from the training config (deepspeed.py)
    accelerate beside a training config  its processes (devices); its strategy where the
                                         training config names none; its mixed_precision only
                                         beside a trainplan job or a DeepSpeed config (the HF
                                         Trainer's bf16/fp16 flags override the accelerate
                                         config's: TrainingArguments.__post_init__ sets
                                         ACCELERATE_MIXED_PRECISION)

Layering: below plan/ (it builds a Job, as spec.py does); imports spec, models.hf_names and the
precision/strategy/algorithm types only.
"""
from __future__ import annotations

from pathlib import Path

from .. import algorithm as algo_mod
from ..errors import TrainplanError
from ..spec import Job, Lora
from ..jobfile import load_job
from . import accelerate as acc_mod
from . import axolotl, llamafactory, torchtune, trl
from . import deepspeed as ds_mod
from .common import load_file
from .reading import Reading

KINDS = ("axolotl", "llama-factory", "trl", "torchtune", "deepspeed", "accelerate")
# (TRL's reader also reads a bare TrainingArguments JSON: kind "hf-trainer")
READERS = {"axolotl": axolotl.read, "llama-factory": llamafactory.read, "trl": trl.read}
_SPEC_MARKERS = {"batch_size", "grad_accum", "seq_len", "gpu", "gpus", "precision", "strategy",
                 "training_data", "run", "hardware", "platforms", "rollout", "campaign"}

__all__ = ["KINDS", "Reading", "detect", "load"]


def detect(data: dict, path: str = "") -> str | None:
    """Which framework's config `data` is, by its keys; None for trainplan's own job."""
    if torchtune.looks_like(data):
        return "torchtune"
    if acc_mod.looks_like(data):
        return "accelerate"
    if ds_mod.looks_like(data):
        return "deepspeed"
    if axolotl.looks_like(data):
        return "axolotl"
    if llamafactory.looks_like(data):
        return "llama-factory"
    if isinstance(data.get("model"), (str, dict)) and _SPEC_MARKERS & set(data):
        return None
    if trl.looks_like(data):
        return "trl"
    return None


def load(path: str | None, deepspeed: str | None = None,
         accelerate: str | None = None) -> tuple[Job, Reading | None]:
    """(job, reading) from a job or framework config, with DeepSpeed / accelerate configs
    beside it; reading None for a trainplan job with nothing beside it."""
    acc = acc_mod.read_file(accelerate) if accelerate else None
    if path is None:
        base, reading = Job(), Reading("trainplan", "flags")
    else:
        data = load_file(path, "job")
        kind = detect(data, str(path))
        if kind is None:
            if not (deepspeed or acc):
                return load_job(path), None
            base, reading = load_job(path), Reading("trainplan", str(path))
        else:
            reading = _read(kind, data, str(path), deepspeed, acc)
            return _job(reading, acc, None), reading
    # a trainplan job (or flags) with a DeepSpeed config beside it
    if deepspeed:
        beside = ds_mod.Trainer("the job", micro_batch=base.batch_size, grad_accum=base.grad_accum,
                                bf16=base.precision.is_bf16, fp16=base.precision.is_fp16,
                                world=base.gpus if base.gpus > 1 else None,
                                max_grad_norm=base.max_grad_norm, strict=False)
        inner = ds_mod.read(load_file(deepspeed, "DeepSpeed config"), deepspeed, beside,
                            acc.settings.get("gpus") if acc else None)
        reading.companions.append(inner)
        reading.settings.update(ds_mod.apply({}, inner))
    return _job(reading, acc, base), reading


def _read(kind: str, data: dict, path: str, deepspeed: str | None,
          acc: Reading | None) -> Reading:
    if kind == "torchtune":
        if deepspeed:
            raise TrainplanError(f"{path} is a torchtune recipe config: torchtune does not run "
                                 "DeepSpeed.", fix="drop --deepspeed (torchtune's distributed "
                                                   "recipes shard with FSDP2)")
        text = Path(path).read_text(encoding="utf-8")
        return torchtune.read(data, path, text)
    if kind == "accelerate":
        if acc is not None:
            raise TrainplanError(f"{path} is an accelerate config, and --accelerate gives "
                                 "another.", fix="give one of them")
        reading = acc_mod.read(data, path)
        if deepspeed:                       # as the config's deepspeed_config_file
            prec = reading.settings.get("precision", "")
            beside = ds_mod.Trainer("accelerate", bf16=prec.startswith("bf16"),
                                    fp16=prec.startswith("fp16"), strict=False)
            inner = ds_mod.read(load_file(deepspeed, "DeepSpeed config"), deepspeed, beside,
                                reading.settings.get("gpus"))
            reading.companions.append(inner)
            reading.settings.update(ds_mod.apply({}, inner))
        return reading
    if kind == "deepspeed":
        if deepspeed:
            raise TrainplanError(f"{path} is a DeepSpeed config, and --deepspeed gives "
                                 "another.", fix="give one of them")
        gpus = acc.settings.get("gpus") if acc else None
        prec = acc.settings.get("precision", "") if acc else ""
        beside = ds_mod.Trainer("accelerate", bf16=prec.startswith("bf16"),
                                fp16=prec.startswith("fp16"), strict=False) if acc else None
        return ds_mod.read(data, path, beside, gpus)
    return READERS[kind](data, path, deepspeed=deepspeed)


def settings_job(reading: Reading) -> Job:
    """The job a reading's own settings make, trainplan's defaults for the rest (for comparing
    with a plan: export keeps a config's own keys where they already say what is planned)."""
    return Job(**_settings(reading.settings))


def _settings(settings: dict) -> dict:
    out = dict(settings)
    if isinstance(out.get("lora"), dict):
        out["lora"] = Lora(**out["lora"])
    if isinstance(out.get("rollout"), dict):
        out["rollout"] = algo_mod.parse_rollout(out["rollout"], "the config's rollout")
    return out


def _job(reading: Reading, acc: Reading | None, base: Job | None) -> Job:
    """The job: a trainplan `base` or trainplan's defaults, the reading's settings over it, an
    accelerate config's beside them (module docstring)."""
    settings = _settings(reading.settings)
    if acc is not None:
        reading.companions.append(acc)
        a = acc.settings
        if "gpus" in a and "gpus" not in settings:
            settings["gpus"] = a["gpus"]
        if "strategy" not in settings:
            for k in ("strategy", "offload", "grad_checkpointing"):
                if k in a:
                    settings[k] = a[k]
        if reading.kind in ("trainplan", "deepspeed") and "precision" in a and \
                "precision" not in reading.settings:
            settings["precision"] = a["precision"]
        for k in ("batch_size", "grad_accum"):
            if k in a and k not in settings:
                settings[k] = a[k]
    if settings.get("strategy") == "single" and (settings.get("gpus") or 1) > 1:
        settings["strategy"] = "ddp"
    if base is not None:
        notes = base.notes + (reading.note(),) if reading.companions else base.notes
        return base.with_(**settings, notes=notes)
    path = Path(reading.path)
    return Job(name=path.stem, base_dir=path.resolve().parent, notes=(reading.note(),),
               **settings)
