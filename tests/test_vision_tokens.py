"""Image tokens from the image size (models/vision_tokens.py) and Qwen2.5-VL traced with images
(models/hf.py, _qwen_vl_inputs): counts checked against transformers' own image processor and
configs, the vision tower checked to run in the traced step."""
import json
import re
from pathlib import Path

import pytest
import torch

from trainplan.errors import TrainplanError
from trainplan.models import build_model, hf_import
from trainplan.models.vision_tokens import QWEN_PIXELS, image_tokens
from trainplan.spec import Job, validate
from trainplan.trace.semantics import KernelSemantics
from trainplan.trace.tracer import trace_step

CONFIGS = Path(__file__).parent.parent / "src" / "trainplan" / "models" / "hf_configs"
QWEN_VL = json.loads((CONFIGS / "Qwen--Qwen2.5-VL-3B-Instruct.json").read_text())


@pytest.fixture(scope="module")
def pil_processor():
    """transformers' Qwen2-VL image processor (the PIL backend: the torchvision one needs a
    torchvision this CPU environment may not load), built offline with given pixel bounds."""
    hf_import.prepare()
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import \
        Qwen2VLImageProcessorPil

    def make(**bounds):
        return Qwen2VLImageProcessorPil(**bounds)
    return make


@pytest.mark.parametrize("processor", ["hub", "class_default"])
@pytest.mark.parametrize("hw", [(224, 224), (448, 448), (700, 1000), (3000, 3000), (5000, 5000),
                                (20, 20), (10, 1500)])
def test_qwen_tokens_match_transformers_processor(pil_processor, processor, hw):
    """tokens = image_grid_thw.prod() / merge^2, patches and pixel_values rows as the processor
    computes them on a blank image of that size: plain rounding (224, 448, 700x1000), the
    max_pixels clip (5000^2 under the Hub bounds; 3000^2 too under the class default's 1003520),
    the min_pixels floor (20x20, 10x1500)."""
    from PIL import Image
    bounds = QWEN_PIXELS[processor]
    proc = pil_processor(min_pixels=bounds["min_pixels"], max_pixels=bounds["max_pixels"])
    out = proc(images=Image.new("RGB", (hw[1], hw[0])), return_tensors="pt")
    grid = out["image_grid_thw"][0]
    got = image_tokens(QWEN_VL, hw, processor=processor)
    assert got.grid == tuple(grid.tolist())
    assert got.patches_per_image == int(grid.prod()) == out["pixel_values"].shape[0]
    assert got.tokens_per_image == int(grid.prod()) // 2 ** 2
    assert got.patch_values == out["pixel_values"].shape[1] == 3 * 2 * 14 * 14


def test_qwen_default_processor_clips_large_images(pil_processor):
    """A processor built with transformers' class defaults (no preprocessor_config.json) caps a
    3000x3000 image at 28*28*1280 px: 1280 tokens at most, where the Hub bounds give 11449."""
    from PIL import Image
    out = pil_processor()(images=Image.new("RGB", (3000, 3000)), return_tensors="pt")
    default = image_tokens(QWEN_VL, 3000, processor="class_default")
    assert default.tokens_per_image == int(out["image_grid_thw"].prod()) // 4 <= 1280
    assert image_tokens(QWEN_VL, 3000).tokens_per_image == (2996 // 28) ** 2 == 11449
    assert "max_pixels" in default.note


def test_fixed_grid_counts_match_configs():
    """CLIP/SigLIP towers: (image_size/patch)^2 patch positions (+ CLS for CLIP), whatever the
    input image's size (the processor resizes it to the tower's)."""
    hf_import.prepare()
    from transformers.models.clip.configuration_clip import CLIPVisionConfig
    from transformers.models.clip.modeling_clip import CLIPVisionEmbeddings
    from transformers.models.llava.configuration_llava import LlavaConfig
    from transformers.models.paligemma.configuration_paligemma import PaliGemmaConfig
    from transformers.models.siglip.configuration_siglip import SiglipVisionConfig
    from transformers.models.siglip.modeling_siglip import SiglipVisionEmbeddings

    llava = LlavaConfig()                 # LLaVA-1.5: CLIP ViT-L/14 at 336, strategy "default"
    got = image_tokens(llava, 1000)
    assert got.tokens_per_image == llava.image_seq_length == 576
    assert got.patches_per_image == 577 and got.grid == (1, 24, 24)
    assert "resized to 336x336" in got.note
    full = LlavaConfig(vision_feature_select_strategy="full")
    assert image_tokens(full, 336).tokens_per_image == 577

    pali = PaliGemmaConfig()              # SigLIP-So400m/14 at 224: no CLS
    assert image_tokens(pali, 224).tokens_per_image == pali.text_config.num_image_tokens == 256

    with torch.device("meta"):
        clip = CLIPVisionConfig(image_size=336, patch_size=14)
        assert image_tokens(clip, 336).patches_per_image == \
            CLIPVisionEmbeddings(clip).num_positions == 577
        siglip = SiglipVisionConfig(image_size=384, patch_size=14)
        assert image_tokens(siglip, 384).tokens_per_image == \
            SiglipVisionEmbeddings(siglip).num_patches == 729
    bundled = json.loads((CONFIGS / "openai--clip-vit-large-patch14.json").read_text())
    assert image_tokens(bundled, 224).patches_per_image == (224 // 14) ** 2 + 1


@pytest.mark.parametrize("config,size,what", [
    (QWEN_VL, (10, 3000), "aspect ratio"),
    (QWEN_VL, 0, "not a positive pixel size"),
    ({"model_type": "llama"}, 224, "does not know"),
])
def test_sizes_and_models_that_cannot_take_an_image(config, size, what):
    with pytest.raises(TrainplanError) as e:
        image_tokens(config, size)
    assert what in str(e.value) and e.value.allowed


def small_qwen_vl(tmp_path) -> str:
    """The bundled Qwen2.5-VL-3B config, shrunk: 2 text layers and 2 vision blocks (one windowed,
    one full attention), hidden sizes 128; patch, merge, window and token ids as published."""
    cfg = json.loads(json.dumps(QWEN_VL))
    text = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2)
    cfg.update(text)
    cfg["text_config"].update(text)
    for c in (cfg, cfg["text_config"]):
        c["rope_scaling"]["mrope_section"] = [4, 6, 6]      # half of head_dim 32
    cfg["vision_config"].update(depth=2, fullatt_block_indexes=[1], hidden_size=128, num_heads=4,
                                intermediate_size=256, out_hidden_size=128)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return f"hf:{tmp_path / 'config.json'}"


def test_qwen_vl_inputs_hold_the_images(tmp_path):
    """The inputs as Qwen2VLProcessor lays them out: per image vision_start, 256 image tokens
    (448 px), vision_end, inside seq_len; one pixel_values row per patch; M-RoPE positions."""
    job = validate(Job(model=small_qwen_vl(tmp_path), batch_size=2, seq_len=600, image_size=448,
                       images_per_sample=2))
    bundle = build_model(job)
    inputs = bundle.make_inputs(2)
    ids = inputs["input_ids"].as_subclass(torch.Tensor)
    assert ids.shape == (2, 600) and bundle.tokens_per_sample == 600
    assert ((ids == QWEN_VL["image_token_id"]).sum(1) == 2 * 256).all()
    assert ((ids == QWEN_VL["vision_start_token_id"]).sum(1) == 2).all()
    assert inputs["pixel_values"].shape == (2 * 2 * 1024, 1176)
    assert inputs["image_grid_thw"].as_subclass(torch.Tensor).tolist() == [[1, 32, 32]] * 4
    assert (inputs["labels"][ids == QWEN_VL["image_token_id"]] == -100).all()
    pos = inputs["position_ids"]
    assert pos.shape == (3, 2, 600)
    # the images' 16x16 merged grids advance the text positions by 16 each, not by 256
    assert int(pos[0, 0, -1]) == 600 - 1 - 2 * (256 - 16)


def test_vision_tower_runs_in_the_trace(tmp_path):
    """With an image size the vision blocks and the merger have activations and forward and
    backward FLOPs, and the activations and peak grow with the image; without one the step is the
    text path, as before."""
    ref = small_qwen_vl(tmp_path)
    sem = KernelSemantics(attention="efficient")
    traces = {size: trace_step(validate(Job(model=ref, batch_size=1, seq_len=512,
                                            image_size=size)), sem)
              for size in (None, 224, 448)}
    rows = {size: {m.name: m for m in t.modules} for size, t in traces.items()}
    assert rows[None]["model.visual"].activation_bytes == 0
    assert rows[None]["model.visual"].flops_forward == 0
    for size in (224, 448):
        # the patch embedding's output is only re-indexed, nothing of it is saved for backward;
        # its and the merger's backward ops are counted, but ModuleTracker files them under the
        # module whose backward ran last (their inputs need no gradient), so only the forward
        # is checked by name there
        assert rows[size]["model.visual.patch_embed"].flops_forward > 0
        assert rows[size]["model.visual.merger"].activation_bytes > 0
        assert rows[size]["model.visual.merger"].flops_forward > 0
        for name in ("model.visual.blocks.0", "model.visual.blocks.1"):
            assert rows[size][name].activation_bytes > 0, (size, name)
            assert rows[size][name].flops_forward > 0 and rows[size][name].flops_backward > 0
        assert any(r.name == "convolution_backward" for r in traces[size].ops)
    # the tower's FLOPs scale with its patches: 4x the patches, more than 4x (attention) for the
    # full-attention block
    f224 = rows[224]["model.visual.blocks.1"].flops_forward
    assert rows[448]["model.visual.blocks.1"].flops_forward > 4 * f224
    acts = [traces[s].activation_bytes for s in (None, 224, 448)]
    peaks = [traces[s].peak_allocated_bytes for s in (None, 224, 448)]
    assert acts[0] < acts[1] < acts[2]
    assert peaks[0] < peaks[1] < peaks[2]


def test_frozen_tower_still_runs(tmp_path):
    """A frozen vision tower (job.frozen) still runs forward; nothing flows back into it (its
    input, pixel_values, needs no gradient) and it has no trainable parameter."""
    job = validate(Job(model=small_qwen_vl(tmp_path), batch_size=1, seq_len=512, image_size=224,
                       frozen=("model.visual",)))
    tr = trace_step(job, KernelSemantics(attention="efficient"))
    vis = {m.name: m for m in tr.modules}["model.visual"]
    assert vis.trainable_params == 0 < vis.params
    assert vis.flops_forward > 0 and vis.flops_backward == 0


@pytest.mark.parametrize("model, size, own, patches", [
    ("hf:google/vit-base-patch16-224", 384, 224, (576, 196)),
    ("hf:openai/clip-vit-base-patch32", 320, 224, (100, 49)),
])
def test_a_vit_checkpoint_trains_on_images_of_another_size(model, size, own, patches):
    """ViT and CLIP build a position table for their config's image size and refuse another
    unless the forward interpolates it (models/hf.py `_resized`): the same parameters, the
    patches of the larger image, and a note that says so."""
    sem = KernelSemantics(attention="efficient")
    tr = {s: trace_step(validate(Job(model=model, batch_size=1, image_size=s, seq_len=16
                                     if "clip" in model else None)), sem) for s in (own, size)}
    assert tr[size].params_total == tr[own].params_total
    assert any(f"images of {size} px" in n and "interpolated" in n for n in tr[size].notes)
    assert not any("interpolated" in n for n in tr[own].notes)
    # the vision tower's first block runs on the patches (and the class token) of the image
    block = next(m.name for m in tr[own].modules
                 if re.fullmatch(r"(vit|vision_model)\..*layers?\.0", m.name))
    rows = {s: {m.name: m for m in t.modules}[block] for s, t in tr.items()}
    ratio = (patches[0] + 1) / (patches[1] + 1)
    assert rows[size].flops_forward > ratio * rows[own].flops_forward * 0.99
    assert rows[size].activation_bytes > ratio * rows[own].activation_bytes * 0.99


def test_images_longer_than_the_sequence_are_an_error(tmp_path):
    job = validate(Job(model=small_qwen_vl(tmp_path), batch_size=1, seq_len=200, image_size=448))
    with pytest.raises(TrainplanError) as e:
        build_model(job)
    msg = str(e.value)
    assert "need 258 tokens" in msg and "256 image tokens" in msg
    assert "--seq-len 258" in msg
    assert "--image-size 392" in msg        # (392/28)^2 = 196 tokens + 2 markers <= 200


def test_inputs_reproduce_the_models_own_forward(tmp_path):
    """On a real (small, random) model the built inputs, with the host-precomputed rotary and
    window layouts and M-RoPE positions, give the logits transformers computes from ids, grid and
    token types alone: the precomputation is the model's own."""
    from trainplan.models.hf import _from_config, make_config
    from trainplan.models.hf_names import resolve_config
    ref = small_qwen_vl(tmp_path)
    bundle = build_model(validate(Job(model=ref, batch_size=1, seq_len=128, image_size=224)))
    config = make_config(resolve_config(ref[3:])[0])
    torch.manual_seed(0)
    model = _from_config(type(bundle.module), config, "sdpa").eval()
    inputs = bundle.make_inputs(1)
    plain = {k: v.as_subclass(torch.Tensor) for k, v in inputs.items()
             if k in ("input_ids", "pixel_values", "image_grid_thw")}
    plain["mm_token_type_ids"] = (plain["input_ids"] == config.image_token_id).int()
    with torch.no_grad():
        ours = model(**inputs).logits
        theirs = model(**plain).logits
    assert type(ours) is torch.Tensor and ours.shape == (1, 128, config.text_config.vocab_size)
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_llava_runs_its_tower_and_projector_on_the_images(tmp_path):
    """LLaVA (a fixed-grid CLIP tower): 576 image tokens per 336 px image in the sequence, and
    the tower's attention over its 577 positions in the traced forward, on top of the text-only
    step: 2 images x 2 layers x 2 matmuls x 2 FLOPs x 577^2 x 32 (hidden)."""
    import json as _json
    from trainplan.accelerators import get_accelerator
    from trainplan.estimate import estimate
    from trainplan.spec import Job, validate
    cfg = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
           "image_token_index": 250,
           "text_config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                           "num_hidden_layers": 2, "num_attention_heads": 4,
                           "num_key_value_heads": 4, "vocab_size": 256,
                           "max_position_embeddings": 2048},
           "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32,
                             "intermediate_size": 64, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "image_size": 336, "patch_size": 14,
                             "projection_dim": 32}}
    path = tmp_path / "config.json"
    path.write_text(_json.dumps(cfg))
    t4 = get_accelerator("t4")
    with_images = estimate(validate(Job(model=f"hf:{path}", batch_size=2, seq_len=1024,
                                        image_size=336)), t4, with_max_batch=False)
    text = estimate(validate(Job(model=f"hf:{path}", batch_size=2, seq_len=1024)), t4,
                    with_max_batch=False)
    extra = (with_images.trace.flops["forward"]["attention"]
             - text.trace.flops["forward"]["attention"])
    assert extra == pytest.approx(2 * 2 * 2 * 2 * 577 ** 2 * 32, rel=0.02)
    assert with_images.trace.flops["forward"]["matmul"] > text.trace.flops["forward"]["matmul"]
    assert not any("not counted" in n for n in with_images.trace.notes)
    with pytest.raises(TrainplanError, match="576 each"):
        estimate(validate(Job(model=f"hf:{path}", batch_size=1, seq_len=512, image_size=336)),
                 t4, with_max_batch=False)
