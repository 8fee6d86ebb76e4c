"""Which keys each framework's config file may hold, read from the frameworks' own source.

    python scripts/config_keys.py [--mirrors DIR]

writes src/trainplan/data/config_keys/<kind>.json for axolotl, llama-factory, trl, torchtune,
deepspeed and accelerate: every key the framework's config schema defines (top level and the
nested sections trainplan reads), with the repository, commit, date and files each list came
from. trainplan's config readers (src/trainplan/configs/) tell a key the framework knows but
trainplan does not need (listed as "no effect on memory or time") from one nobody knows (listed as
"unknown": a typo, or a newer framework's key).

Each framework is read at a pinned commit of a git clone (`--mirrors DIR` holds them as
`<owner>+<name>/repo`, the layout the project's fetch tool writes; `git clone --bare` works too),
by parsing its source with `ast` (nothing is imported or run):

    axolotl       pydantic fields (and `alias=`) of AxolotlInputConfig and every base class
                  (src/axolotl/utils/schemas/), plus the plugins' Args models
                  (src/axolotl/integrations/*/args.py); sections trl, vllm, fsdp_config
    llama-factory dataclass fields of src/llamafactory/hparams/*.py (two commits: the one the
                  example configs come from and a recent one), plus TrainingArguments
    trl           dataclass fields of trl/trainer/*_config.py, trl/experimental/*/*_config.py,
                  ModelConfig and ScriptArguments, the script arguments of the two TrlParser
                  recipe projects (alignment-handbook, open-r1), plus TrainingArguments
    torchtune     the keys of every recipe config (recipes/configs/**.yaml) and every `cfg.<key>` /
                  `cfg.get("<key>")` the recipes (recipes/*.py) read
    deepspeed     string constants of deepspeed/**/constants.py and config.py (top level), the
                  pydantic fields of the ZeRO and offload configs
    accelerate    dataclass fields of accelerate/commands/config/config_args.py, and the
                  fsdp_config / deepspeed_config keys that `accelerate config` writes
                  (commands/config/cluster.py) and the plugins read (utils/dataclasses.py)

TrainingArguments' fields come from the transformers installed here (constraints.txt's) and,
with --transformers-v4-wheel, from a 4.x wheel's source (the keys 4.x configs carry).
Run on 2026-11-27: python scripts/config_keys.py --transformers-v4-wheel
transformers-4.57.1-py3-none-any.whl (transformers 5.24.0 installed).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "trainplan" / "data" / "config_keys"

PINS = {   # repository -> commit (its newest snapshot on 2026-11-27, or the examples' commit)
    "axolotl-ai-cloud/axolotl": "067b021c8b87a9e5e380b9173c704cf7340e30f5",
    "hiyouga/LLaMA-Factory": "ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30",
    "hiyouga/LLaMA-Factory@examples": "c3c0efbaa0953ffcdba4b9f51a669cd9cf3c8260",
    "huggingface/trl": "f2cd57710ae345ea6428ae95363267fcf38a3dc8",
    "huggingface/alignment-handbook": "925acdfe4b2b4e38c3dabd1851bc418f0b656351",
    "huggingface/open-r1": "1416fa0cf21595d2083b399a2a0bbddd7f6e9563",
    "pytorch/torchtune": "bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1",
    "deepspeedai/DeepSpeed": "edaa7221267243c7be7fb49c5d5f5c4fb97b4641",
    "huggingface/accelerate": "16cb6eb80dd9aa8b4df1a63ef57863e455d53b83",
}


class Repo:
    def __init__(self, mirrors: Path, name: str):
        self.name, _, tag = name.partition("@")
        self.commit = PINS[name]
        self.git = mirrors / self.name.replace("/", "+") / "repo"

    def _run(self, *args: str) -> str:
        return subprocess.run(["git", "--git-dir", str(self.git), *args], check=True,
                              capture_output=True, text=True).stdout

    def files(self, pattern: str) -> list[str]:
        names = self._run("ls-tree", "-r", "--name-only", self.commit).splitlines()
        return sorted(n for n in names if re.fullmatch(pattern, n))

    def read(self, path: str) -> str:
        return self._run("show", f"{self.commit}:{path}")

    def full_commit(self) -> str:
        return self._run("rev-parse", self.commit).strip()

    def date(self) -> str:
        return self._run("log", "-1", "--format=%cs", self.commit).strip()

    def source(self, paths: list[str]) -> dict:
        return {"repo": self.name, "commit": self.full_commit(), "date": self.date(),
                "paths": paths}


# --- classes and their fields, from source ------------------------------------------------------

def classes(sources: dict[str, str]) -> dict[str, ast.ClassDef]:
    out = {}
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text, filename=path)):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, node)
    return out


def _aliases(value) -> list[str]:
    """`Field(alias="x")` / `validation_alias="x"` spellings pydantic also accepts."""
    out = []
    if isinstance(value, ast.Call):
        for kw in value.keywords:
            if kw.arg in ("alias", "validation_alias") and isinstance(kw.value, ast.Constant) \
                    and isinstance(kw.value.value, str):
                out.append(kw.value.value)
    return out


def own_fields(node: ast.ClassDef) -> list[str]:
    out = []
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            name = item.target.id
            if name.startswith("_") or "ClassVar" in ast.unparse(item.annotation) or \
                    name == "model_config":
                continue
            out.append(name)
            out += _aliases(item.value)
    return out


def fields_of(name: str, table: dict[str, ast.ClassDef], seen=None) -> list[str]:
    """Fields of class `name` and of every base class found in `table`."""
    seen = set() if seen is None else seen
    if name in seen or name not in table:
        return []
    seen.add(name)
    node = table[name]
    out = own_fields(node)
    for base in node.bases:
        out += fields_of(ast.unparse(base).split(".")[-1].split("[")[0], table, seen)
    return out


V4_WHEEL: Path | None = None     # --transformers-v4-wheel


def training_arguments() -> tuple[list[str], str]:
    """TrainingArguments' fields: the installed transformers', and (with --transformers-v4-wheel)
    those of a 4.x release, whose keys (warmup_ratio, evaluation_strategy, overwrite_output_dir,
    ...) the configs written for it still carry; transformers 5 removed them."""
    import transformers
    from transformers import Seq2SeqTrainingArguments, TrainingArguments
    keys = {f.name for f in dataclasses.fields(TrainingArguments)}
    keys |= {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)}
    version = transformers.__version__
    if V4_WHEEL is not None:
        import zipfile
        with zipfile.ZipFile(V4_WHEEL) as z:
            texts = {n: z.read(n).decode() for n in ("transformers/training_args.py",
                                                     "transformers/training_args_seq2seq.py")}
        table = classes(texts)
        keys |= set(fields_of("Seq2SeqTrainingArguments", table))
        version += f" and {V4_WHEEL.name}"
    return sorted(k for k in keys if not k.startswith("_")), version


# --- each framework ----------------------------------------------------------------------------

def axolotl(mirrors: Path) -> dict:
    r = Repo(mirrors, "axolotl-ai-cloud/axolotl")
    paths = r.files(r"src/axolotl/utils/schemas/.*\.py") + \
        r.files(r"src/axolotl/integrations/[^/]+/args\.py")
    table = classes({p: r.read(p) for p in paths})
    top = set(fields_of("AxolotlConfigWCapabilities", table))
    for p in paths:
        if "/integrations/" in p:
            for node in ast.walk(ast.parse(r.read(p))):
                if isinstance(node, ast.ClassDef):
                    top |= set(fields_of(node.name, {**table, node.name: node}))
    return {"sources": [r.source(paths)], "keys": sorted(top),
            "sections": {"trl": sorted(set(fields_of("TRLConfig", table))),
                         "vllm": sorted(set(fields_of("VllmConfig", table))),
                         "fsdp_config": sorted(set(fields_of("FSDPConfig", table)))}}


def llamafactory(mirrors: Path) -> dict:
    keys: set[str] = set()
    sources = []
    for name in ("hiyouga/LLaMA-Factory", "hiyouga/LLaMA-Factory@examples"):
        r = Repo(mirrors, name)
        paths = r.files(r"src/llamafactory/hparams/.*\.py")
        table = classes({p: r.read(p) for p in paths})
        for cls in table:
            keys |= set(own_fields(table[cls]))
        sources.append(r.source(paths))
    ta, version = training_arguments()
    sources.append({"repo": "huggingface/transformers", "version": version,
                    "paths": ["TrainingArguments", "Seq2SeqTrainingArguments"]})
    return {"sources": sources, "keys": sorted(keys | set(ta))}


def trl(mirrors: Path) -> dict:
    r = Repo(mirrors, "huggingface/trl")
    paths = r.files(r"trl/trainer/[a-z_]+_config\.py") + \
        r.files(r"trl/experimental/[a-z_0-9]+/[a-z_0-9]+_config\.py") + \
        ["trl/trainer/model_config.py", "trl/scripts/utils.py"]
    paths = sorted(set(paths))
    table = classes({p: r.read(p) for p in paths})
    keys: set[str] = set()
    for cls in table:
        keys |= set(own_fields(table[cls]))
    sources = [r.source(paths)]
    for name, path in (("huggingface/alignment-handbook", "src/alignment/configs.py"),
                       ("huggingface/open-r1", "src/open_r1/configs.py")):
        recipes = Repo(mirrors, name)       # TrlParser recipes: their own script arguments
        table = classes({path: recipes.read(path)})
        for cls in table:
            keys |= set(own_fields(table[cls]))
        sources.append(recipes.source([path]))
    ta, version = training_arguments()
    sources.append({"repo": "huggingface/transformers", "version": version,
                    "paths": ["TrainingArguments"]})
    return {"sources": sources, "keys": sorted(keys | set(ta))}


_CFG_ATTR = re.compile(r"\bcfg(?:_[a-z_]+)?\.(?:get\(\s*[\"']([a-z_0-9]+)[\"']|([a-z_][a-z_0-9]*))")


def torchtune(mirrors: Path) -> dict:
    r = Repo(mirrors, "pytorch/torchtune")
    configs = r.files(r"recipes/configs/.*\.yaml")
    recipes = r.files(r"recipes/[a-z_0-9]+\.py")
    keys: set[str] = set()
    for p in configs:
        data = yaml.safe_load(r.read(p)) or {}
        keys |= set(data)
    for p in recipes:
        for m in _CFG_ATTR.finditer(r.read(p)):
            k = m.group(1) or m.group(2)
            if k not in ("get", "items", "keys", "values", "pop", "copy"):
                keys.add(k)
    return {"sources": [r.source(configs + recipes)], "keys": sorted(keys)}


def deepspeed(mirrors: Path) -> dict:
    r = Repo(mirrors, "deepspeedai/DeepSpeed")
    const_paths = r.files(r"deepspeed/(?:[a-z_]+/)*(?:constants|config)\.py")
    keys: set[str] = set()
    for p in const_paths:
        for node in ast.walk(ast.parse(r.read(p))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                    isinstance(node.value.value, str) and len(node.targets) == 1 and \
                    isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper() and \
                    re.fullmatch(r"[a-z][a-z0-9_]*", node.value.value):
                keys.add(node.value.value)
    zero_paths = r.files(r"deepspeed/runtime/zero/(?:config|offload_config)\.py") + \
        r.files(r"deepspeed/runtime/precision_config\.py") + \
        r.files(r"deepspeed/runtime/config_utils\.py")
    table = classes({p: r.read(p) for p in zero_paths})
    sections = {"zero_optimization": sorted(set(fields_of("DeepSpeedZeroConfig", table))),
                "offload_optimizer": sorted(set(fields_of("DeepSpeedZeroOffloadOptimizerConfig",
                                                          table))),
                "offload_param": sorted(set(fields_of("DeepSpeedZeroOffloadParamConfig", table)))}
    for name, cls in (("fp16", "DeepSpeedFP16Config"), ("bf16", "DeepSpeedBF16Config")):
        if cls in table:
            sections[name] = sorted(set(fields_of(cls, table)) | {"enabled"})
    return {"sources": [r.source(const_paths + zero_paths)], "keys": sorted(keys),
            "sections": sections}


def accelerate(mirrors: Path) -> dict:
    r = Repo(mirrors, "huggingface/accelerate")
    paths = ["src/accelerate/commands/config/config_args.py",
             "src/accelerate/commands/config/cluster.py", "src/accelerate/utils/dataclasses.py"]
    texts = {p: r.read(p) for p in paths}
    table = classes(texts)
    top = set(fields_of("ClusterConfig", table)) | set(fields_of("SageMakerConfig", table))
    sections: dict[str, set[str]] = {"fsdp_config": set(), "deepspeed_config": set()}
    for sec in sections:
        sections[sec] |= set(re.findall(sec + r'\["([a-z_0-9]+)"\]', texts[paths[1]]))
    sections["fsdp_config"] |= {"fsdp_" + f for f in fields_of("FullyShardedDataParallelPlugin",
                                                               table)}
    sections["fsdp_config"] |= {"fsdp_sharding_strategy"}   # the 1.x spelling cluster.py reads
    sections["deepspeed_config"] |= set(fields_of("DeepSpeedPlugin", table)) | \
        {"deepspeed_config_file"}
    return {"sources": [r.source(paths)], "keys": sorted(top),
            "sections": {k: sorted(v) for k, v in sections.items()}}


READERS = {"axolotl": axolotl, "llama-factory": llamafactory, "trl": trl, "torchtune": torchtune,
           "deepspeed": deepspeed, "accelerate": accelerate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mirrors", default="/work/.mirror",
                    help="folder of <owner>+<name>/repo clones")
    ap.add_argument("--transformers-v4-wheel", type=Path,
                    help="a transformers 4.x wheel (`pip download transformers==4.57.1 --no-deps`)")
    args = ap.parse_args()
    global V4_WHEEL
    V4_WHEEL = args.transformers_v4_wheel
    OUT.mkdir(parents=True, exist_ok=True)
    for kind, fn in READERS.items():
        doc = {"kind": kind, "generated_by": "scripts/config_keys.py", **fn(Path(args.mirrors))}
        (OUT / f"{kind}.json").write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
        print(kind, len(doc["keys"]), {k: len(v) for k, v in doc.get("sections", {}).items()})


if __name__ == "__main__":
    main()
