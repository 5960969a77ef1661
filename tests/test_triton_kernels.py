"""The Triton kernels' tests (tests/triton_kernel_cases.py), run in a process of their own.

Without a GPU they run in Triton's interpreter, which must be switched on (TRITON_INTERPRET=1)
before triton is first imported; other test modules import libraries that import triton first,
so the cases get a fresh interpreter rather than depending on the collection order.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CASES = Path(__file__).with_name("triton_kernel_cases.py")


@pytest.mark.slow
def test_triton_kernels_in_their_own_process():
    import torch

    env = dict(os.environ)
    if not torch.cuda.is_available():  # on a GPU the kernels run compiled
        env["TRITON_INTERPRET"] = "1"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(CASES)], cwd=CASES.parent.parent, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-2000:]
