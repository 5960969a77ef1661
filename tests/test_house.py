"""The house rules the code keeps, checked on the tree: short functions, short modules, imports at
the top unless deferred on purpose."""

import ast
from pathlib import Path

import sae

MAX_FUNCTION_LINES = 80  # a function longer than this does more than one thing: split it


def test_no_function_is_longer_than_80_lines():
    root = Path(sae.__file__).parent
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines})")
    assert not long, "functions over 80 lines: " + ", ".join(long)


def test_no_module_is_longer_than_600_lines():
    root = Path(sae.__file__).parent
    long = [f"{p.relative_to(root)} ({n})" for p in sorted(root.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600]
    assert not long, "modules over 600 lines: " + ", ".join(long)


def test_an_import_inside_a_function_says_why_it_is_deferred():
    """An import inside a function defers a heavy library (or breaks a cycle) on purpose, and a
    comment on its line or the line above says so; any other import belongs at the top."""
    root = Path(sae.__file__).parent
    silent = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for func in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    own = lines[node.lineno - 1:node.end_lineno]
                    above = lines[node.lineno - 2] if node.lineno > 1 else ""
                    if not any("#" in line for line in own) and \
                            not above.strip().startswith("#"):
                        silent.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not silent, "imports inside functions without a reason: " + ", ".join(silent)
