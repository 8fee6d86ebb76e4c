"""`timm:` and `torchvision:` sources: image models built without weights, trained with
cross-entropy on synthetic images of the job's size (default: the model's own input size)."""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from ..errors import TrainplanError, unknown
from . import ModelBundle
from .meta import on_meta


def import_torchvision(required: bool = True):
    """Import torchvision, even where its C++ ops cannot load (None if absent and not required).

    The torchvision wheel that matches a CPU torch may be a CUDA build whose `_C.so` cannot load
    beside it; its import then dies registering fake kernels for `torchvision::nms`/`qnms`
    ("operator torchvision::nms does not exist"), and transformers, which imports torchvision when
    present, dies with it. Model definitions need none of its C++ ops, so we define those two
    schemas and import again. A working install is left untouched.
    """
    try:
        import torchvision
        return torchvision
    except ModuleNotFoundError:
        if not required:
            return None
        raise TrainplanError("torchvision is not installed.",
                             fix="pip install 'trainplan[vision]' (timm and torchvision)") from None
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    lib = torch.library.Library("torchvision", "DEF")  # kept alive below
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import_torchvision._lib = lib
    import torchvision
    return torchvision


def _build_timm(name: str, image_size: int | None):
    import_torchvision()
    try:
        import timm
    except ModuleNotFoundError:
        raise TrainplanError("timm is not installed.", fix="pip install 'trainplan[vision]'") from None
    if not timm.is_model(name):
        raise unknown("timm model", name, timm.list_models(),
                      hint="list them with python -c 'import timm; print(timm.list_models())'")
    _check_timm_tag(timm, name)
    cfg = timm.get_pretrained_cfg(name)
    default = cfg.input_size[-1] if cfg is not None and cfg.input_size else 224
    size = image_size or default
    kwargs = {"img_size": image_size} if image_size and image_size != default else {}
    with on_meta():
        try:  # transformers-style models take img_size; CNNs adapt to any size
            model = timm.create_model(name, pretrained=False, **kwargs)
        except TypeError:
            model = timm.create_model(name, pretrained=False)
    return model, size, getattr(model, "num_classes", 1000)


def _check_timm_tag(timm, name: str) -> None:
    """A pretrained tag (`resnet50.a1_in1k`: it sets the classes and input size even without
    weights) must be one of the architecture's, and an old name timm still accepts
    (`vit_base_patch32_224_sam`) must lead to one: timm's `is_model` ignores the tag, and its
    `create_model` then fails with "Invalid pretrained tag", even where the old name is timm's own
    deprecation entry (1.0.31 maps that one to `.sam`, its weights are `.sam_in1k`)."""
    from timm.models import get_deprecated_models, split_model_name_tag
    old = get_deprecated_models()
    current = old.get(name) or name
    arch, tag = split_model_name_tag(current)
    if not tag:
        return
    tags = timm.list_pretrained(f"{arch}.*")
    if current in tags:
        return
    version = getattr(timm, "__version__", "?")
    what = (f"timm model {name!r} is timm's old name for {current!r}, pretrained weights timm "
            f"{version} does not have." if name in old else
            f"timm model {arch!r} has no pretrained tag {tag!r} in timm {version}.")
    raise unknown("timm pretrained tag", current, tags + [arch], what=what,
                  hint=f"name the architecture (timm:{arch}) or one of its tags")


# torchvision's classification models whose input size is fixed when they are built, by their
# builders' keyword (torchvision/models/vision_transformer.py `VisionTransformer(image_size)`,
# maxvit.py `MaxVit(input_size)`), and the sizes they take: a ViT's a multiple of its patch (the
# name's last number), MaxViT's a multiple of 224 (a stride-4 stem, then four stages that halve
# it, each split into 7 x 7 windows). The others adapt to any size.
_SIZED = {"vit_": (lambda s: {"image_size": s}, lambda name: int(name.rsplit("_", 1)[1])),
          "maxvit": (lambda s: {"input_size": (s, s)}, lambda name: 224)}


def _build_torchvision(name: str, image_size: int | None):
    tv = import_torchvision()
    names = tv.models.list_models()
    if name not in names:
        raise unknown("torchvision model", name, names)
    sized = next((v for k, v in _SIZED.items() if name.startswith(k)), None)
    kwargs = sized[0](image_size) if sized and image_size else {}
    try:
        with on_meta():
            model = tv.models.get_model(name, weights=None, **kwargs)
    except (AssertionError, ValueError) as e:
        if not kwargs:
            raise
        step = sized[1](name)
        lo, hi = max(step, image_size // step * step), (image_size // step + 1) * step
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TrainplanError(f"torchvision:{name} cannot be built for {image_size} px images "
                             f"(torchvision: {first}).",
                             allowed=f"image sizes that are multiples of {step}",
                             fix=f"use --image-size {lo} or {hi}") from None
    size = image_size or (299 if name.startswith("inception") else 224)
    return model, size, getattr(model, "num_classes", 1000)


def build_vision(job) -> ModelBundle:
    src, _, name = job.model.partition(":")
    if src == "timm":
        model, size, classes = _build_timm(name, job.image_size)
    else:
        model, size, classes = _build_torchvision(name, job.image_size)
    classes = classes or 1000

    def make_inputs(batch: int):
        return {"x": torch.randn(batch, 3, size, size),
                "_labels": torch.randint(0, classes, (batch,))}

    def loss(out, inputs):
        logits = getattr(out, "logits", out)
        if isinstance(logits, (tuple, list)):
            logits = logits[0]
        return F.cross_entropy(logits, inputs["_labels"])

    return ModelBundle(name=job.model, module=model, kind="vision", make_inputs=make_inputs,
                       loss=loss, tokens_per_sample=None, samples_unit="images")
