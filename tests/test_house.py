"""The house rules the code keeps, checked on the tree: short functions."""

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
