"""Model sources: a name in a job becomes a PyTorch module built on the meta device, plus the
synthetic inputs and loss of one training step. Nothing is downloaded.

    hf:<hub id>                  bundled config (models/hf_configs), or hf:./path/config.json
    timm:<name>, torchvision:<name>
    transformer                  our reference module from dimensions (job.transformer)
    py:<module>:<factory>        any nn.Module, with an input spec (job.inputs)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..algorithm import sequences_per_sample
from ..errors import TrainplanError

if TYPE_CHECKING:      # imported where a model is built: naming one (spec.py, the command
    import torch       # line's parser, `--help`) does not load PyTorch

SOURCES = ("hf:", "timm:", "torchvision:", "transformer", "py:")


@dataclass
class ModelBundle:
    """A model ready to trace.

    make_inputs(batch) is called inside the fake mode and returns the forward's keyword arguments;
    loss(outputs, inputs) returns the scalar loss. tokens_per_sample is None for non-token models.
    lora_roles maps a role (q, k, v, o, mlp, lm_head, embed) to module-name suffixes.
    """

    name: str
    module: torch.nn.Module
    kind: str
    make_inputs: Callable[[int], dict[str, Any]]
    loss: Callable[[Any, dict[str, Any]], torch.Tensor]
    tokens_per_sample: int | None = None
    samples_unit: str = "samples"
    lora_roles: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def described(self) -> str:
        """'a decoder model', 'an encoder-decoder model': its kind in a sentence."""
        return f"{'an' if self.kind[0] in 'aeiou' else 'a'} {self.kind} model"


def build_model(job, attention: str = "efficient") -> ModelBundle:
    """The model named in `job.model`, `attention` the target's kernel; a sample holds as many
    sequences as the algorithm runs through the policy (DPO: chosen and rejected, algorithm.py)."""
    bundle = _build(job, attention)
    if job.algorithm != "sft" and bundle.kind not in ("decoder", "vision-language", "custom"):
        raise TrainplanError(
            f"{job.algorithm.upper()} trains a language model on the log-probabilities of the "
            f"sequences it scores; {bundle.name} is {bundle.described}.",
            allowed="--algorithm sft for this model; grpo, dpo and ppo for causal (or "
                    "vision-language) models",
            fix="use --algorithm sft, or a causal LM")
    _check_inputs_used(job, bundle)
    per_sample = sequences_per_sample(job.algorithm)
    if per_sample > 1:
        one = bundle.make_inputs
        bundle.make_inputs = lambda batch: one(per_sample * batch)
        if bundle.tokens_per_sample:
            bundle.tokens_per_sample *= per_sample
        bundle.notes.append(f"{job.algorithm}: each sample is {per_sample} sequences (chosen and "
                            "rejected, concatenated into one forward as TRL does)")
    return bundle


def _check_inputs_used(job, bundle: ModelBundle) -> None:
    """A sequence length for a model that reads images only, or an image size for one that reads
    text only, sets nothing the model runs: said as bad input, not planned as if it did (a
    convnet's step printed "x 128 tokens")."""
    if bundle.kind == "vision" and job.seq_len is not None:
        raise TrainplanError(
            f"{bundle.name} is {bundle.described}: it reads images, not token "
            f"sequences, so --seq-len {job.seq_len} sets nothing it runs.",
            allowed="--image-size (and --images-per-sample) for an image model",
            fix="drop --seq-len (seq_len in a job file)")
    if bundle.kind not in ("vision", "vision-language", "custom") and \
            job.image_size is not None:
        raise TrainplanError(
            f"{bundle.name} is {bundle.described}: it reads text, not images, so "
            f"--image-size {job.image_size} sets nothing it runs.",
            allowed="--seq-len for a text model; --image-size for image and vision-language "
                    "models",
            fix="drop --image-size (image_size in a job file), or plan a vision-language "
                "model")


def _build(job, attention: str) -> ModelBundle:
    name = job.model
    if name.startswith("hf:"):
        from .hf import build_hf
        return build_hf(job, attention)
    if name.startswith("timm:") or name.startswith("torchvision:"):
        from .vision import build_vision
        return build_vision(job)
    if name == "transformer" or name.startswith("transformer:"):
        from .reference_source import build_reference
        return build_reference(job)
    if name.startswith("py:"):
        from .custom import build_custom
        return build_custom(job)
    raise TrainplanError(
        f"Model {name!r} does not name a source.",
        allowed="hf:<hub id or ./config.json>, timm:<name>, torchvision:<name>, transformer "
                "(with a `transformer:` block of dimensions), py:<module>:<factory>",
        fix="for example --model hf:google-bert/bert-large-uncased or --model timm:resnet50")


def stack_hint(job) -> int | None:
    """How many repeated blocks the job's model config names (the deepest stack), without
    building it; None when unknown (timm, torchvision, py:). What decides whether a trace is cut
    to a few blocks (trace/stack.py) is the built model; this only says whether to try."""
    if job.model.startswith("hf:"):
        from .hf_names import config_depth     # the config only: no torch
        return config_depth(job)
    if job.transformer is not None:
        return int(job.transformer.num_layers)
    return None


def loss_from_output(out, inputs) -> torch.Tensor:
    """HF-style outputs carry `.loss`; a bare tensor output is the loss (or logits, reduced)."""
    import torch
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else out.float().mean()
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None:
        raise TrainplanError("The model's forward returned no loss.",
                             fix="return the loss, or describe the model with py: and a loss")
    return loss


# the share of positions a masked-LM batch predicts: BERT's (Devlin et al. 2019, section 3.1),
# transformers' DataCollatorForLanguageModeling `mlm_probability` default
MLM_PROBABILITY = 0.15


def masked_lm_batch(ids, mask_id: int) -> dict[str, Any]:
    """A masked-LM batch from token ids `ids` (batch, seq): a random 15% of positions (the last of
    each row always, so no batch is empty) take `mask_id` as input and their own token as label;
    every other label is -100, which the loss ignores. An encoder given its own tokens as labels
    learns nothing that takes work: where it ties its embeddings it predicts its input exactly, so
    the loss and every gradient are 0 (GraphMER-SE's measured H200 step ran so,
    validation/measured/h200/README.md), and its backward multiplies zeros."""
    import torch
    chosen = torch.rand(ids.shape, device=ids.device) < MLM_PROBABILITY
    chosen[..., -1] = True
    return {"input_ids": ids.masked_fill(chosen, mask_id), "labels": ids.masked_fill(~chosen, -100)}
