"""A 2-D embedding of test-set codes coloured by class: do codes of different classes separate?

:func:`embed_codes` maps codes ``[N, H]`` to points ``[n, 2]`` with t-SNE (scikit-learn) on a
fixed, seeded subset of at most 1 000 codes; :func:`embedding_figure` draws them, one colour per
class, beside the same t-SNE of the same inputs' raw pixels when given them: whether the code
separates classes better or worse than the pixels it was trained on is what the picture is for.
Like the other figure modules this is a pure function (arrays in, ``matplotlib.figure.Figure``
out) styled by ``sae.figures.common.styled``.

Why t-SNE and these settings: PCA of sparse codes mostly shows the few most frequent units, while
t-SNE keeps neighbourhoods, which is what "do classes separate" asks. The codes are first reduced
to 50 principal components (the usual t-SNE preprocessing; it also drops most of the noise of
hundreds of rarely used units), then embedded with Barnes-Hut t-SNE (perplexity 30, PCA
initialisation, 500 iterations; the default 1 000 doubles the time for a barely different
picture). The figure is drawn at the end of every run, so its cost is kept to a few seconds:
1 000 codes (a hundred per class, enough to see whether classes form islands) and a coarser
Barnes-Hut approximation (``angle`` 0.8 instead of 0.5) cost about a third of 2 000 codes at the
default angle (docs/running.md, "The terminal"). scikit-learn's OpenMP threads are limited to
one: its runtime and PyTorch's each start a thread per core, and on a busy 2-core machine their
spin-waiting made t-SNE several times slower. The codes' and the pixels' embeddings run side by
side in two threads instead (scikit-learn's Barnes-Hut gradient releases the GIL), so on two cores
the comparison costs no more time than the codes alone.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure
from threadpoolctl import threadpool_limits

from sae.figures.common import empty_note, styled

__all__ = ["EMBED_ANGLE", "EMBED_MAX_POINTS", "embed_codes", "embed_many", "embedding_figure"]

EMBED_MAX_POINTS = 1000  # codes embedded at most: t-SNE time grows faster than linearly
EMBED_ANGLE = 0.8  # Barnes-Hut trade-off: larger is faster and coarser (scikit-learn: 0.5)
_PCA_DIMS = 50
_MIN_POINTS = 10  # below this a neighbourhood embedding says nothing


def embed_codes(codes: np.ndarray, max_points: int = EMBED_MAX_POINTS, seed: int = 0,
                angle: float = EMBED_ANGLE) -> tuple[np.ndarray, np.ndarray]:
    """t-SNE of a seeded random subset of codes.

    Args:
        codes: ``[N, H]`` code activations (test set), or any ``[N, *]`` rows (pixels).
        max_points: embed at most this many codes (a uniform random subset without replacement).
        seed: seed of the subset and of t-SNE, so the same run gives the same picture.
        angle: Barnes-Hut's accuracy trade-off (scikit-learn's ``angle``; larger: faster).

    Returns:
        ``(points [n, 2], index [n])``: the embedded positions and which rows of ``codes`` they
        are (sorted), ``n = min(N, max_points)``. Fewer than 10 codes give empty arrays.
    """
    # scikit-learn: only when an embedding is drawn
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE  # likewise

    codes = np.asarray(codes, dtype=np.float32)
    codes = codes.reshape(len(codes), -1)  # images [N, h, w] as rows of pixels
    n = min(len(codes), int(max_points))
    if n < _MIN_POINTS:
        return np.zeros((0, 2)), np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(seed)
    index = np.sort(rng.choice(len(codes), size=n, replace=False))
    data = np.nan_to_num(codes[index])
    dims = min(_PCA_DIMS, n, data.shape[1])
    perplexity = min(30.0, (n - 1) / 3)
    tsne = TSNE(n_components=2, perplexity=perplexity, init="pca", max_iter=500,
                angle=angle, random_state=seed)
    # one thread (see the module docstring: OpenMP runtimes fight otherwise), the PCA's too, so
    # that the result is the same bit for bit whatever else runs
    with threadpool_limits(1):
        if data.shape[1] > dims:
            data = PCA(n_components=dims, random_state=seed).fit_transform(data)
        return tsne.fit_transform(data), index


def embed_many(arrays: list[np.ndarray], max_points: int = EMBED_MAX_POINTS, seed: int = 0,
               angle: float = EMBED_ANGLE) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`embed_codes` of several ``[N, *]`` arrays of the same N inputs, one thread each:
    the same subset of rows (the subset depends on N and ``seed`` only), each result equal to
    its own :func:`embed_codes` call, bit for bit, in every call."""
    import sklearn.manifold  # noqa: F401 (its OpenMP runtime loaded, so that the limit holds it)

    # One limit around all the threads: the limit is the process's, so a thread that left its
    # own limit first would lift it under the others, whose gradients would then be summed by
    # several OpenMP threads in a varying order (the same run, another picture).
    with threadpool_limits(1), ThreadPoolExecutor(max(1, len(arrays))) as pool:
        return list(pool.map(lambda a: embed_codes(a, max_points, seed, angle), arrays))


def _scatter(ax, points: np.ndarray, shown: np.ndarray, names: list[str], colours) -> None:
    for c, name in enumerate(names):
        mask = shown == c
        if mask.any():
            ax.scatter(points[mask, 0], points[mask, 1], s=6, alpha=0.75, linewidths=0,
                       color=colours(c % colours.N), label=name)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("t-SNE 1")
    ax.set_ylabel("t-SNE 2")


@styled
def embedding_figure(codes: np.ndarray, labels: np.ndarray,
                     class_names: list[str] | None = None, max_points: int = EMBED_MAX_POINTS,
                     seed: int = 0, pixels: np.ndarray | None = None) -> Figure:
    """Scatter plot of a t-SNE embedding of test codes, one colour per class, beside the same
    embedding of the same inputs' pixels when ``pixels`` is given. With a single class (data
    without labels) the points take one colour and the figure names no class.

    Args:
        codes: ``[N, H]`` code activations.
        labels: ``[N]`` integer class of each input.
        class_names: name of each class (legend); default: the class index.
        max_points: embed at most this many codes (see :func:`embed_codes`).
        seed: subset and t-SNE seed.
        pixels: ``[N, D]`` the inputs the codes were made from: a second panel embeds the same
            subset of them by the same method, for comparison.

    Codes of one class forming their own islands means the code separates the classes without
    being trained on labels; a single blob means it does not. Beside the pixels' panel, islands
    the pixels already form are told apart from what the code adds or loses.
    """
    labels = np.asarray(labels).ravel()
    codes = np.asarray(codes)
    if len(labels) != len(codes):
        raise ValueError(f"{len(codes)} codes but {len(labels)} labels")
    if pixels is not None:
        pixels = np.asarray(pixels).reshape(len(pixels), -1)
        if len(pixels) != len(codes):
            raise ValueError(f"{len(codes)} codes but {len(pixels)} pixel rows")
    sources = [codes] if pixels is None else [codes, pixels]
    embedded = embed_many(sources, max_points, seed)
    fig = Figure(figsize=(7.2 if pixels is None else 12.0, 5.6), layout="constrained")
    axes = fig.subplots(1, len(sources), squeeze=False)[0]
    points, index = embedded[0]
    if len(points) == 0:
        fig.suptitle("t-SNE of test codes")
        for ax in axes:
            empty_note(ax, f"only {len(codes)} codes: too few to embed")
        return fig
    what = "their codes" if pixels is None else "their codes (left) and raw pixels (right)"
    shown = labels[index]
    n_classes = max(int(labels.max()) + 1, len(class_names or []))
    coloured = ", coloured by class" if n_classes > 1 else ""  # one class: data without labels
    fig.suptitle(f"t-SNE of {len(points):,} of the {len(codes):,} test inputs{coloured}: "
                 f"{what}")
    names = list(class_names or []) + [str(c) for c in range(len(class_names or []), n_classes)]
    colours = mpl.colormaps["tab10" if n_classes <= 10 else "tab20"]
    titles = ["the SAE's codes", "the same inputs' raw pixels"]
    for ax, (pts, _), title in zip(axes, embedded, titles, strict=False):
        _scatter(ax, pts, shown, names, colours)
        if pixels is not None:
            ax.set_title(title)
    if n_classes > 1:
        fig.legend(*axes[0].get_legend_handles_labels(), title="class",
                   loc="outside right center", markerscale=2.5, frameon=False)
    return fig
