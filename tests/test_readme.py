"""The README is what a user reads first: short, and every path, link and script it names exists."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_is_short_and_has_two_quickstart_commands():
    assert len(README.splitlines()) < 250
    quick = README[README.index("## Quickstart"):README.index("## What it answers")]
    commands = [l for l in quick.splitlines() if l.startswith("    python3 -m venv")]
    assert len(commands) == 2 and commands[0].endswith("trainplan plan")
    assert commands[1].endswith("python -m pytest -q")
    assert commands[1].split("&& ", 2)[2] in (ROOT / ".ci" / "run").read_text()


def test_every_linked_doc_and_named_script_exists():
    for link in re.findall(r"\]\(([^)#]+)\)", README):
        assert (ROOT / link).exists(), link
    for script in set(re.findall(r"scripts/[\w]+\.py", README)):
        assert (ROOT / script).exists(), script
    for path in set(re.findall(r"`((?:src|tests|validation|docs)/[\w/.-]+)`", README)):
        assert (ROOT / path).exists(), path


def test_bring_your_config_commands_name_real_configs():
    section = README[README.index("## Bring your config"):]
    section = section[:section.index("\n## ")]
    paths = re.findall(r"\$C/(\S+)", section)
    assert len(paths) >= 8
    for p in paths:
        assert (ROOT / "tests" / "data" / "configs" / p).exists(), p
