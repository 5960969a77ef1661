"""What the metric tests share: float32 tensors from lists, finite matrices drawn by hypothesis."""

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays


def t(a) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float32)


finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False, width=32)


def matrices(min_rows=2, max_rows=12, min_cols=1, max_cols=10, elements=finite):
    shapes = st.tuples(st.integers(min_rows, max_rows), st.integers(min_cols, max_cols))
    return arrays(np.float32, shapes, elements=elements)
