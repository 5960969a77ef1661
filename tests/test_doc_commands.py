"""Every command the README and the documentation show is one the tool accepts.

The commands are the ``python -m sae.*`` lines of their ``bash`` blocks (an environment
assignment before them and a comment after them are left out; ``;`` separates two). ``sae.run``
lines are parsed by its parser and checked as ``sae.run`` checks them; ``sae.compare`` lines
by its parser, their sweep file loaded and planned (a dry run); ``sae.data.synth`` lines by its
parser; the other commands' flags must each be one their ``--help`` lists.
"""

import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


def commands() -> list[tuple[str, str, list[str]]]:
    """(page, module, argv) of every command shown."""
    found = []
    for page in PAGES:
        for block in BLOCK.findall(page.read_text(encoding="utf-8")):
            for line in block.splitlines():
                for part in line.split(";"):
                    words = shlex.split(part, comments=True)
                    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                        words = words[1:]  # SAE_DATA_DIR=... before the command
                    if words[:2] == ["python", "-m"] and words[2].startswith("sae."):
                        found.append((page.name, words[2], words[3:]))
    return found


COMMANDS = commands()


def test_the_pages_show_commands():
    modules = {module for _, module, _ in COMMANDS}
    assert {"sae.run", "sae.compare", "sae.synth", "sae.layer"} <= modules


@cache
def help_text(module: str) -> str:
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("page, module, argv", COMMANDS,
                         ids=[f"{p}:{m} {' '.join(a)}"[:80] for p, m, a in COMMANDS])
def test_a_shown_command_is_accepted(page, module, argv, tmp_path):
    from sae.settings.cli import build_parser, run_config

    if module == "sae.run":
        build_parser(suppress=True).parse_args(argv)
        if "--resume" not in argv:  # a resume reads its folder's config.yaml first
            out = [] if "--out" in argv else ["--out", str(tmp_path / "run")]
            run_config([*argv, *out])
    elif module == "sae.compare":
        from sae.sweep import command as compare
        from sae.sweep import spec

        args = compare.parse_args(argv)
        spec.plan(spec.load_sweep(REPO / args.sweep))
    elif module == "sae.synth":
        from sae.data import synth

        args = vars(synth._parser().parse_args(argv))
        args.pop("out")
        synth.SynthConfig(**args).check()
    else:
        flags = [w.split("=")[0] for w in argv if w.startswith("--")]
        listed = help_text(module)
        for flag in flags:
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", listed), \
                f"{page}: {module} has no {flag}"
