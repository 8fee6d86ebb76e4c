"""Bad input: one clear message (what is wrong, what is allowed, what to try), exit code 2."""
import pytest

from trainplan.cli.main import main


def run(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, err


def test_unknown_model_suggests_close_matches(capsys):
    code, err = run(capsys, "inspect", "hf:meta-llama/Llama-2-7b", "--seq-len", "16")
    assert code == 2
    assert "Unknown model" in err and "hf:meta-llama/Llama-2-7b-hf" in err
    assert "Traceback" not in err


def test_unknown_gpu_suggests_close_matches(capsys):
    code, err = run(capsys, "estimate", "--model", "hf:openai-community/gpt2", "--gpu", "a100-sxm",
                    "--batch-size", "1", "--seq-len", "16")
    assert code == 2
    assert "a100-sxm4-40gb" in err or "a100-sxm4-80gb" in err


@pytest.mark.parametrize("name, said", [
    # timm's own deprecation entry leads to a tag its weights no longer have (timm 1.0.31)
    ("vit_base_patch32_224_sam", "old name for 'vit_base_patch32_224.sam'"),
    ("vit_base_patch32_224.nope", "no pretrained tag 'nope'"),
])
def test_a_timm_tag_the_architecture_lacks_is_named_with_its_tags(capsys, name, said):
    code, err = run(capsys, "estimate", "--model", f"timm:{name}", "--gpu", "t4",
                    "--batch-size", "2")
    assert code == 2 and "Traceback" not in err, err
    assert said in err
    assert "vit_base_patch32_224.sam_in1k" in err                 # allowed: the real tags
    assert "timm:vit_base_patch32_224" in err                     # what to try


def test_a_timm_tag_the_architecture_has_builds_its_model(capsys):
    code, _ = run(capsys, "estimate", "--model", "timm:vit_base_patch32_224.sam_in1k",
                  "--gpu", "t4", "--batch-size", "2")
    assert code == 0


@pytest.mark.parametrize("name, size, said", [
    ("vit_b_16", 200, "use --image-size 192 or 208"),        # a ViT's size: patches of 16
    ("maxvit_t", 384, "use --image-size 224 or 448"),        # 7 x 7 windows after a /32
])
def test_a_torchvision_model_built_for_its_image_size(capsys, name, size, said):
    """torchvision's ViTs and MaxViT fix their input size when built (models/vision.py `_SIZED`):
    built for --image-size, or one clear error naming the sizes they take."""
    code, err = run(capsys, "estimate", "--model", f"torchvision:{name}", "--gpu", "t4",
                    "--batch-size", "2", "--image-size", str(size))
    assert code == 2 and "Traceback" not in err, err
    assert said in err and "could not be traced" not in err
    code, err = run(capsys, "estimate", "--model", f"torchvision:{name}", "--gpu", "t4",
                    "--batch-size", "2", "--image-size", said.split()[-1])
    assert code == 0, err


def test_malformed_yaml_names_the_line(capsys, tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text("model: hf:openai-community/gpt2\nbatch_size: 4\n  seq_len: [1, 2\n")
    code, err = run(capsys, "estimate", str(bad), "--gpu", "t4")
    assert code == 2
    assert "line 3" in err and "not valid YAML" in err


def test_unknown_setting_names_the_line_and_suggests(capsys, tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text("model: hf:openai-community/gpt2\nbatch_sise: 4\n")
    code, err = run(capsys, "estimate", str(bad), "--gpu", "t4")
    assert code == 2
    assert "line 2" in err and "batch_size" in err


def test_py_model_without_input_spec(capsys, tmp_path):
    (tmp_path / "m.py").write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 4)\n")
    code, err = run(capsys, "inspect", f"py:{tmp_path / 'm.py'}:build")
    assert code == 2
    assert "input spec" in err and "batch" in err


def test_a_models_own_check_of_its_inputs_is_said_as_such(capsys):
    """timm's MaxViT checks that its windows divide the image: its message, and what to change
    (--image-size), not the data-dependent-op advice."""
    code, err = run(capsys, "estimate", "--model", "timm:maxvit_tiny_tf_224", "--gpu", "l4",
                    "--batch-size", "2", "--image-size", "300")
    assert code == 2 and "Traceback" not in err
    assert "must be divisible by window" in err and "leave --image-size 300 out" in err
    assert "computes shapes from data" not in err


@pytest.mark.parametrize("model, kind", [("timm:resnet50", "a vision model"),
                                         ("hf:google-bert/bert-base-uncased", "an encoder model")])
def test_a_preference_algorithm_needs_a_language_model(capsys, model, kind):
    """DPO scores sequences by their log-probabilities: an image classifier or a masked LM is
    refused (it was planned as two 'sequences' a sample)."""
    code, err = run(capsys, "estimate", "--model", model, "--gpu", "l4", "--batch-size", "2",
                    "--seq-len", "64", "--algorithm", "dpo")
    assert code == 2 and "Traceback" not in err
    assert f"is {kind}" in err and "--algorithm sft" in err


def test_untraceable_model_names_the_op(capsys, tmp_path):
    (tmp_path / "dd.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.l = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        "        return self.l(x[x > 0].reshape(-1, 4)).sum()\n"
        "def build():\n    return M()\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"model: py:{tmp_path / 'dd.py'}:build\n"
                   "inputs:\n  - {name: x, shape: [batch, 4], dtype: float32}\n")
    code, err = run(capsys, "inspect", "--job", str(job))
    assert code == 2
    assert "could not be traced" in err and "aten." in err and "py:" in err


def test_impossible_combinations(capsys):
    code, err = run(capsys, "estimate", "--model", "hf:openai-community/gpt2", "--gpu", "tpu-v5e-8",
                    "--lora-rank", "8", "--quantize", "nf4", "--seq-len", "16")
    assert code == 2 and "bitsandbytes" in err
    code, err = run(capsys, "estimate", "--model", "hf:openai-community/gpt2", "--gpu", "t4",
                    "--strategy", "zero3", "--seq-len", "16")
    assert code == 2 and "shards nothing" in err


def test_bad_choice_values(capsys):
    code, err = run(capsys, "estimate", "--model", "hf:openai-community/gpt2", "--gpu", "t4",
                    "--precision", "fp7")
    assert code == 2 and "Allowed" in err


def test_sequence_longer_than_learned_positions(capsys):
    code, err = run(capsys, "inspect", "hf:google-bert/bert-base-uncased", "--seq-len", "1024")
    assert code == 2
    assert "512 learned positions" in err and "--seq-len 512" in err
    assert "Traceback" not in err


def test_selective_checkpointing_cannot_be_reentrant(capsys):
    code, err = run(capsys, "inspect", "hf:openai-community/gpt2", "--seq-len", "16",
                    "--grad-checkpointing", "selective", "--checkpoint-impl", "reentrant")
    assert code == 2
    assert "use_reentrant=False" in err and "--checkpoint-impl non-reentrant" in err


def test_an_error_fits_the_terminal_and_is_written_whole_when_piped(monkeypatch, capsys):
    """On a terminal the message is word-wrapped to its width (a flag or path never split);
    piped or captured it is as written, so it can be searched and parsed line by line."""
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    argv = ["estimate", "--model", "hf:google-t5/t5-small", "--task", "causal-lm", "--gpu",
            "t4", "--batch-size", "2", "--seq-len", "32"]
    assert main(argv) == 2
    piped = capsys.readouterr().err
    assert any(len(line) > 60 for line in piped.splitlines())
    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    monkeypatch.setenv("COLUMNS", "60")
    assert main(argv) == 2
    shown = term.getvalue()
    assert all(len(line) <= 60 for line in shown.splitlines()), shown
    assert shown.split() == piped.split()


def test_a_transformer_setting_suggests_what_was_meant(capsys, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: transformer\ntransformer: {hidden_size: 64, num_layers: 0, "
                   "num_heads: 4}\nbatch_size: 2\nseq_len: 32\n")
    code, err = run(capsys, "estimate", str(job), "--gpu", "t4")
    assert code == 2 and "write it like `num_layers: 12`" in err
    job.write_text("model: transformer\ntransformer: {hidden_size: 64, num_layers: 2, "
                   "num_heads: 4, kind: encoderx}\nbatch_size: 2\nseq_len: 32\n")
    code, err = run(capsys, "estimate", str(job), "--gpu", "t4")
    assert code == 2 and "Did you mean 'encoder'" in err and "Allowed: encoder, decoder" in err


@pytest.mark.parametrize("key, value, said", [("precision", "fp17", "Did you mean 'fp16'"),
                                              ("strategy", "zer3", "Did you mean 'zero3'")])
def test_a_name_in_a_job_file_is_placed_in_the_file(capsys, tmp_path, key, value, said):
    """A misspelt name in a job file says its line, not the flag's name (it was '--precision
    'fp17' is not a precision' for a YAML key)."""
    job = tmp_path / "job.yaml"
    job.write_text(f"model: hf:openai-community/gpt2\nbatch_size: 2\nseq_len: 32\n"
                   f"{key}: {value}\n")
    code, err = run(capsys, "estimate", str(job), "--gpu", "t4")
    assert code == 2 and f"job.yaml, line 4: {key} '{value}'" in err and said in err
    assert f"--{key}" not in err


def test_inspect_depth_below_zero_is_refused_before_tracing(capsys, monkeypatch):
    import trainplan.cli.inspect_cmd as inspect_cmd
    monkeypatch.setattr(inspect_cmd, "trace_for", lambda args: pytest.fail("traced"))
    code, err = run(capsys, "inspect", "hf:openai-community/gpt2", "--depth", "-1")
    assert code == 2 and "Traceback" not in err
    assert "--depth must be 0 or more, got -1" in err and "--depth 3" in err


@pytest.mark.parametrize("alpha", ["-16", "0"])
def test_a_lora_alpha_that_is_not_positive_is_refused(capsys, alpha):
    code, err = run(capsys, "estimate", "--model", "hf:openai-community/gpt2", "--gpu", "t4",
                    "--lora-rank", "8", "--lora-alpha", alpha)
    assert code == 2 and "Traceback" not in err
    assert "--lora-alpha must be a positive number" in err and "alpha / rank" in err
    assert "--lora-alpha 16" in err                                # what to try


@pytest.mark.parametrize("lora, said", [
    ("{rank: 8, alpha: -1}", "alpha must be a positive number"),
    ("{rank: 8, dropout: 1.5}", "dropout must be a number in [0, 1)"),
])
def test_a_job_files_lora_out_of_range_names_the_file(capsys, tmp_path, lora, said):
    job = tmp_path / "job.yaml"
    job.write_text(f"model: hf:openai-community/gpt2\nlora: {lora}\n")
    code, err = run(capsys, "estimate", str(job), "--gpu", "t4")
    assert code == 2 and "Traceback" not in err
    assert f"{job}: lora: {said}" in err


@pytest.mark.parametrize("argv, said", [
    (["--model", "timm:resnet18", "--seq-len", "128"],
     "timm:resnet18 is a vision model: it reads images, not token sequences"),
    (["--model", "hf:openai-community/gpt2", "--image-size", "224"],
     "is a decoder model: it reads text, not images"),
])
def test_a_setting_the_model_cannot_read_is_refused(capsys, argv, said):
    """A convnet's step used to print 'x 128 tokens'; a text model took --image-size silently."""
    code, err = run(capsys, "estimate", "--gpu", "t4", *argv)
    assert code == 2 and "Traceback" not in err
    assert said in err and "To fix: drop --" in err


def test_a_capacity_factor_for_a_dense_model_is_warned(capsys):
    import json
    code = main(["estimate", "--model", "hf:openai-community/gpt2", "--gpu", "t4",
                 "--moe-capacity-factor", "2", "--seq-len", "64", "--format", "json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert code == 0
    (f,) = [f for f in findings if "capacity factor" in f["message"]]
    assert f["severity"] == "warning" and "no mixture-of-experts layers to route" in f["message"]
    assert f["fix"] == "drop --moe-capacity-factor"
