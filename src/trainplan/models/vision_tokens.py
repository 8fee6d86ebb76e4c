"""Image tokens per image: what one image of a given size costs a vision-language model.

Two families, by how the image processor turns pixels into patches:

Dynamic resolution (Qwen2-VL, Qwen2.5-VL; model_type qwen2_vl / qwen2_5_vl). The processor
(transformers models/qwen2_vl/image_processing_qwen2_vl.py, `smart_resize`) rounds the image to a
multiple of factor = patch_size * spatial_merge_size (28 px) with the aspect ratio kept, scaling
it into [min_pixels, max_pixels] first when the rounded area falls outside:

    h', w' = smart_resize(h, w, factor, min_pixels, max_pixels)
    patches  = (h'/patch) * (w'/patch)        one temporal patch: a still image is repeated
                                              temporal_patch_size times, grid_t = 1
    values   = 3 * temporal_patch_size * patch^2 per patch (the rows of pixel_values)
    tokens   = patches / merge^2 = (h'/factor) * (w'/factor)   (the merger folds merge x merge
                                              patches into one LM token)

and image_grid_thw = [1, h'/patch, w'/patch]. The pixel bounds are the model's preprocessor
settings, QWEN_PIXELS below.

Fixed grid (CLIP / SigLIP towers: LLaVA-1.5, PaliGemma, CLIP, SigLIP). The processor resizes and
crops every image to the tower's own image_size, so the count does not depend on the input size:
the tower sees floor(image_size/patch)^2 patch positions (its stride-patch convolution drops a
remainder: SigLIP-So400m/14 at 384 px, 27^2 = 729), plus a CLS position for CLIP. LLaVA's
`vision_feature_select_strategy` "default" drops the first position (LlavaModel.get_image_features,
`[:, 1:]`; CLIP ViT-L/14-336: 577 - 1 = 576 tokens), "full" keeps all; PaliGemma feeds all
(image_size/patch)^2 SigLIP positions (its config's num_image_tokens).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import TrainplanError

# Pixel bounds of Qwen2VLImageProcessor (used by Qwen2-VL and Qwen2.5-VL).
#   "hub": the published preprocessor_config.json of Qwen/Qwen2-VL-{2B,7B}-Instruct and
#     Qwen/Qwen2.5-VL-{3B,7B,72B}-Instruct: min_pixels 3136 (56*56), max_pixels 12845056
#     (16384 tokens * 28*28), what AutoProcessor.from_pretrained applies. (The Hub repos are not
#     in this project's source index; the values are as quoted verbatim by public copies of that
#     file.)
#   "class_default": transformers 5.24, models/qwen2_vl/image_processing_qwen2_vl.py,
#     Qwen2VLImageProcessor.size = {"shortest_edge": 56*56, "longest_edge": 28*28*1280}: a
#     processor built without a preprocessor_config.json.
QWEN_PIXELS = {
    "hub": {"min_pixels": 56 * 56, "max_pixels": 16384 * 28 * 28},
    "class_default": {"min_pixels": 56 * 56, "max_pixels": 1280 * 28 * 28},
}
QWEN_TYPES = ("qwen2_vl", "qwen2_5_vl")
MAX_ASPECT = 200          # smart_resize refuses max(h, w) / min(h, w) > 200


@dataclass(frozen=True)
class ImageTokens:
    tokens_per_image: int         # LM positions one image takes (image-pad tokens)
    patches_per_image: int        # vision-tower positions (patches, + CLS where the tower has one)
    grid: tuple[int, int, int]    # (t, h, w) in patches: Qwen's image_grid_thw row
    note: str
    resized: tuple[int, int] = (0, 0)   # (height, width) in pixels the tower sees
    patch_values: int = 0         # values per patch row of Qwen's pixel_values (0: fixed grid)


def _get(cfg, key, default=None):
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def _hw(image_size) -> tuple[int, int]:
    """(height, width) from an int (square side) or a (height, width) pair, checked positive."""
    hw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(hw) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                               for v in hw):
        raise TrainplanError(f"image size {image_size!r} is not a positive pixel size.",
                             allowed="a side in pixels (e.g. 448) or (height, width)",
                             fix="set image_size to a positive integer")
    return hw


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """transformers' Qwen2-VL `smart_resize` (models/qwen2_vl/image_processing_qwen2_vl.py,
    5.24), restated so no image-processing import (torchvision) is needed: round each side to a
    multiple of `factor`; if the area is then above max_pixels, scale by beta = sqrt(hw/max) and
    floor, if below min_pixels, scale by sqrt(min/hw) and ceil."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_tokens(config, image_size, *, min_pixels: int | None = None,
                 max_pixels: int | None = None, processor: str = "hub") -> ImageTokens:
    """Tokens, patches and grid of one image of `image_size` (side, or (height, width)) for the
    model of `config` (a transformers config or its dict). Qwen-VL pixel bounds come from
    QWEN_PIXELS[processor] unless min_pixels/max_pixels are given."""
    height, width = _hw(image_size)
    model_type = _get(config, "model_type", "")
    if model_type in QWEN_TYPES:
        return _qwen(config, height, width, min_pixels, max_pixels, processor)
    if model_type in FIXED_GRID:
        return _fixed_grid(config, model_type, height, width)
    raise TrainplanError(
        f"trainplan does not know how model_type {model_type!r} turns an image into tokens.",
        allowed=", ".join(QWEN_TYPES + tuple(FIXED_GRID)),
        fix="leave image_size unset to trace the text path only")


def _qwen(config, height, width, min_pixels, max_pixels, processor) -> ImageTokens:
    vc = _get(config, "vision_config")
    patch = _get(vc, "patch_size", 14)
    merge = _get(vc, "spatial_merge_size", 2)
    temporal = _get(vc, "temporal_patch_size", 2)
    if processor not in QWEN_PIXELS:
        raise TrainplanError(f"unknown Qwen-VL processor setting {processor!r}.",
                             allowed=", ".join(QWEN_PIXELS))
    lo = QWEN_PIXELS[processor]["min_pixels"] if min_pixels is None else min_pixels
    hi = QWEN_PIXELS[processor]["max_pixels"] if max_pixels is None else max_pixels
    factor = patch * merge
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise TrainplanError(
            f"a {height}x{width} image has aspect ratio {max(height, width) / min(height, width):.0f}"
            f"; the Qwen-VL image processor refuses ratios above {MAX_ASPECT}.",
            allowed=f"max(h, w) / min(h, w) <= {MAX_ASPECT}",
            fix="crop or pad the image to a less extreme shape")
    if not 0 < lo <= hi or hi < factor * factor:
        raise TrainplanError(f"pixel bounds min_pixels={lo}, max_pixels={hi} are not a range the "
                             f"processor can meet (one {factor}x{factor} token is {factor**2} px).",
                             allowed=f"0 < min_pixels <= max_pixels, max_pixels >= {factor**2}")
    h, w = smart_resize(height, width, factor, lo, hi)
    gh, gw = h // patch, w // patch
    tokens = (h // factor) * (w // factor)
    rounded = round(height / factor) * round(width / factor) * factor * factor
    how = ("as is" if (h, w) == (height, width) else
           f"resized to {h}x{w}" + (" (max_pixels)" if rounded > hi else
                                    " (min_pixels)" if rounded < lo else
                                    f" (multiples of {factor})"))
    note = (f"{height}x{width} image {how}: {gh}x{gw} patches of {patch}px, merged "
            f"{merge}x{merge} into {tokens} tokens (pixels {lo}..{hi})")
    return ImageTokens(tokens, gh * gw, (1, gh, gw), note, (h, w), 3 * temporal * patch * patch)


def _tower(config, model_type):
    """(vision config, tower type) of a fixed-grid model."""
    if model_type in ("clip_vision_model", "siglip_vision_model"):
        return config, model_type
    vc = _get(config, "vision_config")
    default = "siglip_vision_model" if model_type in ("paligemma", "siglip") else \
        "clip_vision_model"
    return vc, _get(vc, "model_type", default) or default


def _fixed_grid(config, model_type, height, width) -> ImageTokens:
    vc, tower = _tower(config, model_type)
    size = _get(vc, "image_size", 336 if model_type == "llava" else 224)
    patch = _get(vc, "patch_size", 14)
    g = size // patch        # the stride-patch convolution drops a remainder (384/14: 27)
    cls = 1 if tower.startswith("clip") else 0
    positions = g * g + cls
    tokens = positions
    why = f"{g}x{g} patches of {patch}px" + (" + CLS" if cls else "")
    if model_type == "llava":
        strategy = _get(config, "vision_feature_select_strategy", "default")
        if strategy == "default":
            tokens -= 1
            why += ", first position dropped (vision_feature_select_strategy 'default')"
    elif model_type == "paligemma":
        tokens = g * g
    resized = "" if (height, width) == (size, size) else \
        f"{height}x{width} image resized to {size}x{size} by the processor: "
    note = f"{resized}{why} -> {tokens} tokens"
    return ImageTokens(tokens, positions, (1, g, g), note, (size, size), 0)


FIXED_GRID = ("llava", "paligemma", "clip", "siglip", "clip_vision_model", "siglip_vision_model")
