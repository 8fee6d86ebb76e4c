"""What the framework-config exports share (`--to axolotl | llama-factory | trl | torchtune`).

Each writes the job the plan runs on the platform, in that framework's own keys, so that the
framework's launch runs what was planned:

    the job as read (a trainplan YAML or a framework config: configs/)
    + the platform's adaptations (planner.platform_job: devices, strategy, what the accelerator
      runs: bf16 on a pre-Ampere GPU becomes fp16, FlashAttention below sm80 becomes SDPA)
    + the fix-ladder rungs the plan kept (export.common.kept_settings)
    + the plan's micro-batch, accumulation, precision and strategy for the platform

When the job came from a config of the same framework, that config is the base: its datasets,
learning rate, output folder and every other key are kept, the planned settings written over
them. From any other source the file holds the planned settings and, where the framework cannot
run without them, placeholders named in the header (`REPLACE_WITH_YOUR_DATASET`). Values go
through yaml.safe_dump / json.dumps: every one quoted for its format.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass

import yaml

from ..errors import TrainplanError
from ..optimizer import ADAM, SGD_MOMENTUM
from ..spec import checkpointing_label, every_k
from .common import Launch, _wrap, kept_settings

PLACEHOLDER = "REPLACE_WITH_YOUR_DATASET"
# trainplan optimizer -> the HF Trainer's `optim` (training_args.OptimizerNames)
@dataclass
class Export:
    """One framework export: the launch values, the planned job, the config it came from."""

    ln: Launch
    job: object                  # spec.Job as planned on the platform
    source: object | None        # configs.Reading of the input file, None for flags
    steps: int | None = None     # the steps the user asked for (max_steps), None: epochs

    def base(self, kind: str) -> dict:
        """The source config's keys when it is `kind`'s own, else {}."""
        if self.source is not None and self.source.kind == kind:
            return copy.deepcopy(self.source.data)
        return {}

    def same(self, kind: str, *fields: str) -> bool:
        """The source config is `kind`'s and already says what the plan runs for these job
        fields: its own keys for them are kept as written (`bf16: auto` stays)."""
        if self.source is None or self.source.kind != kind:
            return False
        from ..configs import settings_job
        read = settings_job(self.source)
        return all(getattr(read, f) == getattr(self.job, f) for f in fields)

    @property
    def hub_id(self) -> str:
        model = str(self.job.model)
        if not model.startswith("hf:"):
            raise TrainplanError(f"{model} is not a Hugging Face model: the frameworks load "
                                 "models by hub id.", fix="export --to torchrun, accelerate or "
                                                          "deepspeed for other models")
        return model[3:]

    def model_name(self, kind: str, key: str) -> str:
        """The source's own spelling of the model when it means the planned one (a re-upload
        such as NousResearch/Llama-2-7b-hf stays as written), else the hub id. Only a causal or
        vision-language model: axolotl, LLaMA-Factory and TRL load AutoModelForCausalLM (or
        their VLM class), and would train another head than the planned BERT masked LM or T5
        seq2seq, or stop."""
        from ..models.hf import language_model_class
        hub_id = self.hub_id
        cls, ok = language_model_class(self.job)
        if not ok:
            raise TrainplanError(f"{kind} trains causal (and vision-language) models; the plan "
                                 f"trains {hub_id} as {cls}.",
                                 fix="export --to torchrun, accelerate or deepspeed, which run "
                                     "your own training script")
        if self.source is not None and self.source.kind == kind:
            f = next((f for f in self.source.read if f.key == key), None)
            if f is not None and self.source.settings.get("model") == self.job.model:
                return str(f.value)
        return hub_id

    def hf_optim(self, kind: str, key: str) -> str:
        """The HF Trainer `optim` name: the source's when it is the same optimizer."""
        opt = self.job.optimizer
        if self.source is not None and self.source.kind == kind and \
                self.source.settings.get("optimizer") == opt and key in self.source.data:
            return str(self.source.data[key])
        return opt.hf_optim

    def trainer_sync(self, c: dict, notes: list[str]) -> None:
        """The HF Trainer's `accelerator_config` where the plan reduces the gradients after every
        micro-batch (sync_each_batch: not the Trainer's default; configs.trainer
        read_accelerator_config reads it back). An inline mapping or JSON string in the source
        keeps its other keys; a file it names is replaced by the mapping, said in a note."""
        if not self.ln.syncs_each_micro_batch:
            return
        old = c.get("accelerator_config")
        acc: dict = {}
        if isinstance(old, dict):
            acc = copy.deepcopy(old)
        elif isinstance(old, str) and old.strip().startswith("{"):
            try:
                acc = json.loads(old)
            except json.JSONDecodeError:
                acc = {}
        elif old is not None:
            notes.append(f"accelerator_config {old} replaced by the mapping below: copy its "
                         "other keys into it")
        kw = acc.get("gradient_accumulation_kwargs")
        acc["gradient_accumulation_kwargs"] = {**(kw if isinstance(kw, dict) else {}),
                                               "sync_each_batch": True}
        c["accelerator_config"] = acc

    def trainer_clipping(self, c: dict, notes: list[str], passes_zero: bool = True) -> None:
        """The Trainer's `max_grad_norm`: the planned clipping norm, 0 for none (the Trainer's
        own default is 1.0). `passes_zero` False: the framework hands the Trainer only a
        non-zero value (axolotl), so no clipping cannot be written; a note says so."""
        norm = self.job.max_grad_norm
        if norm or passes_zero:
            c["max_grad_norm"] = norm or 0.0
            return
        c.pop("max_grad_norm", None)
        notes.append("planned without gradient clipping, which this framework cannot write: it "
                     "passes only a non-zero max_grad_norm, so the Trainer clips to 1.0 (one "
                     "more pass over the gradients a step than planned)")

    def notes(self) -> list[str]:
        """What the framework's file cannot say exactly, for the header."""
        out = []
        p = self.job.precision
        if self.job.strategy.name.startswith("zero") and p.pure_half:
            out.append(f"pure {p.compute} planned; DeepSpeed's {p.compute} mode keeps fp32 "
                       "master weights in its optimizer (more memory than planned)")
        if self.job.optimizer in (ADAM, SGD_MOMENTUM):   # the Trainer has no such `optim`
            out.append(f"optimizer {self.job.optimizer} written as {self.job.optimizer.hf_optim} "
                       "(the Trainer's nearest; the same state size)")
        return out


def final_job(job, platform, pp):
    """The job the plan runs on `platform` (module docstring)."""
    from ..plan.fixes import apply
    from ..plan.planner import platform_job
    jp, _changes = platform_job(job, platform)
    jp = apply(jp, kept_settings(pp))
    if jp.seq_len is None and str(jp.model).startswith("hf:"):
        from ..configs.common import planned_seq_len
        jp = jp.with_(seq_len=planned_seq_len(jp.model))
    return jp.with_(batch_size=pp.micro_batch_size, grad_accum=pp.grad_accum,
                    precision=pp.precision, strategy=pp.strategy, gpus=pp.devices)


def every_block_note(job, framework: str) -> list[str]:
    """What an export says where the plan checkpoints every K-th block and `framework`'s
    gradient checkpointing wraps every block: [] for any other mode."""
    if every_k(job.grad_checkpointing) < 2:
        return []
    return [f"{checkpointing_label(job.grad_checkpointing)} planned; {framework} checkpoints "
            "every block (more recompute, less memory)"]


def header(ln: Launch, launch: str, notes: list[str]) -> str:
    """The plan's header (export.common), how to launch this file, and what it cannot say."""
    extra = [f"# launch: {launch}"]
    for n in notes:
        lines = _wrap(f"note: {n}", 96)
        extra += [f"# {lines[0]}"] + [f"#   {x}" for x in lines[1:]]
    return ln.header() + "\n".join(extra) + "\n"


def dump_yaml(head: str, data: dict) -> str:
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def deepspeed_file(ln: Launch) -> tuple[str, str]:
    """(file name, text) of the DeepSpeed config a ZeRO plan's framework config names: the
    `--to deepspeed` config (stage, offload, 16-bit mode), its batch fields and its clipping
    "auto", so the framework's own micro-batch, accumulation and max_grad_norm fill them (the HF
    Trainer's fill_match)."""
    from .deepspeed import config
    c = config(ln)
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "train_batch_size", "gradient_clipping"):
        c[key] = "auto"
    return "ds_config.json", json.dumps(c, indent=2) + "\n"


def launcher(ln: Launch, command: str) -> str:
    """`command` under accelerate with the plan's processes (one device: as is)."""
    procs = ln.nodes * ln.procs_per_node
    if procs <= 1:
        return command
    multi = f" --num_machines {ln.nodes} --machine_rank $NODE_RANK --main_process_ip " \
            "$NODE0_ADDRESS" if ln.nodes > 1 else ""
    return f"accelerate launch --num_processes {procs}{multi} " + command


def refuse_own_file(files: dict, out_dir, inputs: list) -> None:
    """A framework config written into the folder the job came from could land on the user's
    own config (axolotl.yaml, ds_config.json): refused, whatever else may be overwritten."""
    from pathlib import Path
    mine = {Path(p).resolve() for p in inputs if p}
    for name in files:
        target = (Path(out_dir) / name).resolve()
        if target in mine:
            raise TrainplanError(f"--out {out_dir} would write {name} over {target}, the file "
                                 "this plan was read from.", fix="give another --out folder")
