"""The training split's principal components, kept on disk so that a machine computes them once.

The adaptivity measure needs the PCA of the training images (``sae.metrics.principal_components``:
a float64 covariance of 55 000 × 784 and its eigendecomposition, about two seconds on one core).
Every run's test metrics ask for it, and every process (each ``sae.run``, each sweep worker)
computed it again. Here it is written once per data split to the data cache folder (the data
module's ``cache_dir``, by default ``$SAE_CACHE_DIR`` or ``~/.cache/sae``) and read by the
processes after.

A file is named by a hash of its key: the data files' stamp (path, size and modification time of
each), the split settings and :data:`VERSION`. It holds plain arrays (``.npz``, read without
pickles) and the key itself. A file is used only when its key, shapes and dtypes are right, its
values are finite and its mean is the split's mean image (to the float32 precision of
``train_mean``); anything else (damaged, foreign, another split's) is ignored and written again.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import torch

from sae.metrics.dynamic import PCA
from sae.system.io import atomic_file

__all__ = ["VERSION", "read_pca", "write_pca"]

VERSION = 1  # the definition of the cached PCA: moves on when principal_components changes


def _key_text(key: tuple) -> str:
    return json.dumps([VERSION, key], default=str)


def _path(folder: Path, key: tuple) -> Path:
    digest = hashlib.sha256(_key_text(key).encode()).hexdigest()[:32]
    return Path(folder) / "splits" / f"pca-{digest}.npz"


def read_pca(folder: Path, key: tuple, train_mean: torch.Tensor):
    """The ``PCA`` cached in ``folder`` for the split named by ``key`` whose mean image is
    ``train_mean`` [D] (float32 or float64); None when there is none that passes every check."""
    d = train_mean.shape[0]
    try:
        with np.load(_path(folder, key), allow_pickle=False) as z:
            if str(z["key"]) != _key_text(key):
                return None
            arrays = [z[name] for name in ("mean", "basis", "variances")]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    mean, basis, variances = arrays
    if mean.shape != (d,) or basis.shape != (d, d) or variances.shape != (d,) or \
            any(a.dtype != np.float64 or not np.isfinite(a).all() for a in arrays):
        return None
    mean = torch.from_numpy(mean)
    if not torch.allclose(mean, train_mean.to(torch.float64), rtol=0.0, atol=1e-6):
        return None  # the same files' stamp, other images: computed again
    return PCA(mean, torch.from_numpy(basis), torch.from_numpy(variances))


def write_pca(folder: Path, key: tuple, pca) -> None:
    """Keep ``pca`` in ``folder`` for the split named by ``key``; a folder that cannot be
    written (read-only, full) only costs the next process the computation."""
    try:
        with atomic_file(_path(folder, key)) as fh:
            np.savez(fh, key=np.array(_key_text(key)), mean=pca.mean.numpy(),
                     basis=pca.basis.numpy(), variances=pca.variances.numpy())
    except OSError:
        pass
