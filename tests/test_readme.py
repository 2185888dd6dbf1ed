"""The README's examples are real output: each `$ tilepilot ...` line in its code blocks is run, and
so is the demo, and what they print must be what the README shows.

Shown output is compared line by line (trailing blanks aside) up to a line `...`, after which the
README leaves the rest out. The stores the examples read are made as the README says: `make demo`
for the demo's output, and for `out/demo.db` the demo campaign and the same campaign with the
`rules` proposer, named `rules`, both at `--budget 8`. `bad.toml` is the demo campaign with its
kernel misspelt, `fp8.toml` a campaign of one fp8 matmul problem.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
ELIDED = "..."


def code_blocks(text: str) -> list[list[str]]:
    """The lines of each fenced code block, dedented by the fence's own indent."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    indent = 0
    for line in text.splitlines():
        fence = re.match(r"^(\s*)```", line)
        if fence and current is None:
            current, indent = [], len(fence.group(1))
        elif fence and current is not None:
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line[indent:])
    return blocks


def shown(lines: list[str]) -> list[str]:
    """The lines before `...` (all of them where there is none), trailing blanks dropped."""
    out: list[str] = []
    for line in lines:
        if line.strip() == ELIDED:
            break
        out.append(line.rstrip())
    return out


def examples(text: str) -> list[tuple[str, list[str]]]:
    """Each `$ tilepilot ...` command of a code block with the lines shown after it in that block, up
    to the next command (`shown`)."""
    found: list[tuple[str, list[str]]] = []
    for block in code_blocks(text):
        starts = [i for i, line in enumerate(block) if line.startswith("$ ")]
        for i, end in itertools.pairwise([*starts, len(block)]):
            found.append((block[i][2:], shown(block[i + 1:end])))
    return found


def demo_block(text: str) -> list[str]:
    """The demo's output as the README shows it (the block that starts with a progress bar)."""
    blocks = [b for b in code_blocks(text) if b and re.match(r"^\[[#.]+\] \d+/\d+ trials$", b[0])]
    assert len(blocks) == 1, "the README shows the demo's output once"
    return blocks[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out as the examples expect: campaigns/, bad.toml, fp8.toml and out/demo.db."""
    root = tmp_path_factory.mktemp("readme")
    shutil.copytree(REPO / "campaigns", root / "campaigns")
    demo = (root / "campaigns" / "demo.toml").read_text()
    (root / "bad.toml").write_text(demo.replace('kernel = "matmul"', 'kernel = "matmull"'))
    (root / "fp8.toml").write_text('[campaign]\nname = "fp8"\nkernel = "matmul"\nbudget = 8\n\n'
                                   '[[problems]]\nM = 4096\nN = 4096\nK = 4096\ndtype = "fp8"\n')
    rules = demo.replace('proposer = "optuna"', 'proposer = "rules"').replace('name = "demo"', 'name = "rules"')
    assert rules.count('"rules"') == 2, "demo.toml no longer names its proposer and campaign as this test expects"
    (root / "rules.toml").write_text(rules)
    return root


@pytest.fixture(scope="module")
def demo_db(workdir: Path) -> Path:
    """out/demo.db of the history and compare examples: demo and rules, both at --budget 8."""
    from tilepilot.cli import main

    db = workdir / "out" / "demo.db"
    db.parent.mkdir()
    for campaign in ("campaigns/demo.toml", "rules.toml"):
        assert main(["tune", str(workdir / campaign), "--backend", "replay", "--db", str(db), "--budget", "8"]) == 0
    return db


COMMANDS = examples(README.read_text())


def test_the_readme_has_examples() -> None:
    assert len(COMMANDS) >= 6
    assert all(c.startswith("tilepilot ") and lines for c, lines in COMMANDS)


@pytest.mark.parametrize(("command", "expected"), COMMANDS, ids=[c for c, _ in COMMANDS])
def test_example_prints_what_the_readme_shows(command: str, expected: list[str], workdir: Path,
                                              demo_db: Path) -> None:
    """In a process of its own, as a user runs it (kernels other tests register are not in it)."""
    proc = subprocess.run([sys.executable, "-m", "tilepilot", *shlex.split(command)[1:]], cwd=workdir,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    code = proc.returncode
    printed = [line.rstrip() for line in (proc.stdout if code == 0 else proc.stderr).splitlines()]
    assert printed[:len(expected)] == expected
    if expected[0].startswith("tilepilot: error: "):
        assert code == 2 and printed == expected  # a mistake is one line, exit code 2


def test_demo_prints_what_the_readme_shows(workdir: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`make demo`'s command (Makefile), in a fresh store."""
    block = demo_block(README.read_text())
    make = (REPO / "Makefile").read_text()
    assert "-m tilepilot tune campaigns/demo.toml --backend replay --db out/demo.db" in make
    monkeypatch.chdir(workdir)
    (workdir / "fresh").mkdir()
    code, out, err = run(capsys, "tune", "campaigns/demo.toml", "--backend", "replay", "--db", "fresh/demo.db")
    assert code == 0
    assert block[0].split("] ")[1] in err.splitlines()[-1]  # the progress bar's last count
    lines = [line.rstrip() for line in out.splitlines()]
    assert lines[:len(shown(block[1:]))] == shown(block[1:])
    assert block[-1].startswith("results in ") and lines[-1].startswith("results in ")
