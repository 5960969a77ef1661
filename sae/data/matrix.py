"""Any activation matrix as a dataset: a ``.npy`` file of N rows of D numbers, or a manifest.

An SAE reads what a network represents from its activations, so the data need not be pixels.
Two ways to name such data (``--data``):

- a ``.npy`` file of shape (N, D), float16, float32 or float64: unlabelled rows, split into
  train / validation / test with a fixed seed;
- a manifest, a JSON file that names the files of each split and what comes with them::

      {"format": "sae-activations/1",
       "name": "MNIST, MLP hidden layer 1",
       "train": {"x": "train.npy", "labels": "train_labels.npy", "rows": "train_rows.npy"},
       "test":  {"x": "test.npy",  "labels": "test_labels.npy",  "rows": "test_rows.npy"},
       "images": {"dataset": "mnist"},          (optional: rows index that dataset's images)
       "class_names": ["0", "1", ...]}          (optional)

  Data whose features are known (``python -m sae.synth``) add ``"truth": {"features":
  "features.npy"}``, the true dictionary [F, D], and to each split ``"active":
  "train_active.npy"``, each row's true features as bits (``numpy.packbits`` along the row:
  [N, ceil(F / 8)] uint8); a run on them is scored against the truth (``sae.metrics.truth``).

  Paths are relative to the manifest's folder. ``labels`` is an (N,) integer ``.npy`` (for the
  probes and the class figures), ``rows`` an (N,) integer ``.npy`` of the image each row came
  from (row i of the train split came from image ``rows[i]`` of the dataset's training split),
  and ``texts`` (instead of images) a UTF-8 file with one line per row, e.g. a token in its
  context. ``val`` and ``test`` are optional: without them the validation and test splits are
  carved from ``train`` (``--val-size`` rows each); ``val`` rows, like carved ones, index the
  image dataset's training split. ``python -m sae.layer`` writes such a manifest for a trained
  classifier's hidden layer.

Matrices are opened for reading rows on demand (:mod:`sae.data.npyfile`, never with pickles,
never mapped whole): a file larger than memory is read a batch at a time, and the process holds
only the rows it reads. Every file must be a regular file (no FIFO, device or folder), and a
``.npy`` header is checked against the opened file's size before anything is read or allocated.
Everything is checked before any work, with a one-line :class:`MatrixError`: a missing file, a
rank other than 2, a dtype that is not a real float, NaN or inf in any row, or a float64 value
beyond the float32 range that training computes in (found by one streamed pass over each matrix,
:mod:`sae.data.scan`, which also hashes the file and sums its columns), labels or rows of the
wrong length, labels beyond :data:`MAX_CLASSES` or more classes than training rows, texts over
:data:`TEXT_ROW_LIMIT` bytes a row, differing D between splits.
:func:`describe` gives what a run folder records (path, shape, dtype, SHA-256), so that a resume
or a sweep can refuse a different file.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sae.data.npyfile import NpyError, map_array, open_npy, open_rows, read_array, read_header
from sae.data.scan import Scan, file_sha256, scan_matrix
from sae.system import status
from sae.system.io import UnsafePathError, read_bytes, read_text

__all__ = ["FORMAT", "MatrixData", "MatrixError", "MatrixSplit", "checked", "describe",
           "file_sha256", "load_data", "open_matrix"]

FORMAT = "sae-activations/1"
FLOAT_DTYPES = (np.float16, np.float32, np.float64)
MANIFEST_LIMIT = 1 << 20  # bytes: a manifest names files; it holds no data
TEXT_LIMIT = 1 << 30  # bytes: one line per row
TRUTH_FEATURES = 1 << 16  # true features a manifest may name
SPLIT_KEYS = ("x", "labels", "rows", "texts", "active")  # what a split of a manifest names
TEXT_ROW_LIMIT = 64 << 10  # bytes of text per row, on average, at most
MAX_CLASSES = 1000  # classes a run's figures, probes and pages hold
MAX_NAME = 200  # characters of the data's name and of each class name (titles, tables, pages)


class MatrixError(ValueError):
    """The activation data cannot be used; the message says which file and why, in one line."""


def _npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, bool]:
    """Shape, dtype and Fortran order from a ``.npy`` header, without reading the data (or
    unpickling anything: an object dtype is refused from the header alone)."""
    try:
        with open_npy(path) as f:
            header = read_header(f, path)
    except NpyError as e:
        raise MatrixError(str(e)) from None
    return header.shape, header.dtype, header.fortran


def open_matrix(path: str | Path):
    """The (N, D) float matrix of a ``.npy`` file, opened for reading rows on demand
    (:func:`sae.data.npyfile.open_rows`); checked from its header (rank 2, N ≥ 2, D ≥ 1, a real
    float dtype) before anything is read."""
    path = Path(path)
    shape, dtype, _ = _npy_header(path)
    if len(shape) != 2:
        raise MatrixError(f"{path} holds an array of shape {shape}; an (N, D) matrix is needed "
                          "(one row per input)")
    if shape[0] < 2 or shape[1] < 1:
        raise MatrixError(f"{path} holds {shape[0]} rows of {shape[1]} numbers; at least 2 rows "
                          "of 1 are needed")
    if dtype.type not in FLOAT_DTYPES:
        raise MatrixError(f"{path} holds {dtype} values; float16, float32 or float64 are "
                          "needed (convert with x.astype('float32'))")

    try:  # the file opened again is checked again: the header's size against the file's
        return open_rows(path)
    except NpyError as e:
        raise MatrixError(str(e)) from None


def _int_vector(path: Path, n: int, what: str, low: int = 0, high: int | None = None) -> np.ndarray:
    """An (n,) integer ``.npy`` with values in [low, high), loaded (it is small)."""
    shape, dtype, _ = _npy_header(path)
    if len(shape) != 1 or shape[0] != n:
        raise MatrixError(f"{path}: {what} of shape {shape}; ({n},) needed, one per row")
    if not np.issubdtype(dtype, np.integer):
        raise MatrixError(f"{path}: {what} are {dtype}; integers are needed")

    try:  # at most 8 bytes an integer, n of them: the shape was checked above
        values = read_array(path, limit=8 * max(n, 1)).astype(np.int64)
    except NpyError as e:
        raise MatrixError(str(e)) from None
    if n and (values.min() < low or (high is not None and values.max() >= high)):
        bad = values.min() if values.min() < low else values.max()
        bounds = f"[{low}, {high})" if high is not None else f">= {low}"
        raise MatrixError(f"{path}: {what} holds {int(bad)}; values {bounds} are needed")
    return values


def _texts(path: Path, n: int) -> list[str]:
    limit = min(TEXT_LIMIT, n * TEXT_ROW_LIMIT)
    try:  # a regular file only (a FIFO or /dev/zero never ends), bounded by the bytes read
        raw = read_bytes(path, limit, follow_links=True)
    except FileNotFoundError:
        raise MatrixError(f"{path} does not exist") from None
    except UnsafePathError as e:
        if "larger than" in str(e):
            raise MatrixError(f"{path} holds more than {limit:,} bytes of text; at most "
                              f"{TEXT_ROW_LIMIT:,} a row on average ({n} rows)") from None
        raise MatrixError(str(e)) from None
    except OSError as e:
        raise MatrixError(f"{path} cannot be read ({e.strerror or e})") from None
    try:
        lines = raw.decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise MatrixError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != n:
        raise MatrixError(f"{path} holds {len(lines)} lines; {n} needed, one per row")
    return lines


@dataclass
class MatrixSplit:
    """One split: the matrix (rows read on demand), per row its label, image index and text,
    and what the check's pass over the matrix found (:class:`sae.data.scan.Scan`)."""

    x: np.ndarray  # or sae.data.npyfile.FileRows, indexed the same way
    labels: np.ndarray | None = None
    rows: np.ndarray | None = None
    texts: list[str] | None = None
    active: np.ndarray | None = None  # [N, ceil(F / 8)] uint8: the true features, as bits
    files: dict[str, Path] = field(default_factory=dict)
    scan: Scan | None = None


@dataclass
class MatrixData:
    """Activation data as named by ``--data``: a train split, an optional test split (else
    carved from train), and how to show a row to a person (``images``: a dataset name whose
    images ``rows`` index; ``texts``: a line per row)."""

    name: str
    train: MatrixSplit
    test: MatrixSplit | None
    images: str | None = None
    val: MatrixSplit | None = None  # validation rows of their own (else carved from train)
    class_names: list[str] | None = None
    source: Path | None = None
    truth_features: np.ndarray | None = None  # [F, D]: the true dictionary, when known

    @property
    def dim(self) -> int:
        return int(self.train.x.shape[1])

    @property
    def n_classes(self) -> int | None:
        if self.train.labels is None:
            return None
        if self.class_names is not None:
            return len(self.class_names)
        labels = [s.labels for s in self.splits()]
        return int(max(int(v.max()) for v in labels)) + 1

    def splits(self) -> list[MatrixSplit]:
        """The splits the data gives: train, then val and test where given."""
        return [s for s in (self.train, self.val, self.test) if s is not None]


def _split(entry: object, folder: Path, name: str, images: str | None,
           n_images: int | None) -> MatrixSplit:
    if not isinstance(entry, dict) or not isinstance(entry.get("x"), str):
        raise MatrixError(f"manifest: {name!r} must be an object with an \"x\" file name")
    unknown = set(entry) - set(SPLIT_KEYS)
    if unknown:
        raise MatrixError(f"manifest: {name!r} has unknown keys {sorted(unknown)}; known: "
                          f"{', '.join(SPLIT_KEYS)}")
    files = {}
    for key in SPLIT_KEYS:
        value = entry.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise MatrixError(f"manifest: {name}.{key} must be a file name")
        files[key] = folder / value
    x = open_matrix(files["x"])
    n = len(x)
    split = MatrixSplit(x=x, files=files)
    if "labels" in files:
        split.labels = _int_vector(files["labels"], n, "labels", 0, MAX_CLASSES)
    if "rows" in files:
        if images is None:
            raise MatrixError(f"manifest: {name}.rows needs \"images\" (the dataset they index)")
        split.rows = _int_vector(files["rows"], n, "image rows", 0, n_images)
    elif images is not None:
        raise MatrixError(f"manifest: \"images\" is given but {name}.rows is not")
    if "texts" in files:
        split.texts = _texts(files["texts"], n)
    if "active" in files:
        split.active = _bit_rows(files["active"], n)
    return split


def _bit_rows(path: Path, n: int) -> np.ndarray:
    """An (n, B) uint8 ``.npy`` of packed bits (each row's true features), memory-mapped."""
    shape, dtype, _ = _npy_header(path)
    if len(shape) != 2 or shape[0] != n or shape[1] < 1 or dtype != np.uint8:
        raise MatrixError(f"{path}: true features of shape {shape} and dtype {dtype}; an ({n}, "
                          "ceil(F / 8)) uint8 array of packed bits is needed, one row per row")

    try:
        return map_array(path)
    except NpyError as e:
        raise MatrixError(str(e)) from None


def _truth(spec: object, folder: Path, dim: int, splits: list[MatrixSplit]) -> np.ndarray:
    """The true dictionary [F, D] of a manifest's ``truth``, checked against its splits."""
    if not isinstance(spec, dict) or set(spec) != {"features"} or \
            not isinstance(spec["features"], str) or not spec["features"]:
        raise MatrixError("manifest: \"truth\" must be {\"features\": a file name}")
    path = folder / spec["features"]
    shape, dtype, _ = _npy_header(path)
    if len(shape) != 2 or shape[1] != dim or not 1 <= shape[0] <= TRUTH_FEATURES or \
            dtype.type not in FLOAT_DTYPES:
        raise MatrixError(f"{path}: true features of shape {shape} and dtype {dtype}; an (F, "
                          f"{dim}) float array is needed, F at most {TRUTH_FEATURES}")

    try:
        features = read_array(path, TRUTH_FEATURES * dim * 8).astype(np.float32)
    except NpyError as e:
        raise MatrixError(str(e)) from None
    if not np.isfinite(features).all():
        raise MatrixError(f"{path}: the true features hold NaN or inf")
    for split in splits:
        if split.active is None:
            raise MatrixError("manifest: \"truth\" is given, so every split needs \"active\"")
        if split.active.shape[1] != -(-len(features) // 8):
            raise MatrixError(f"{split.files['active']}: {split.active.shape[1]} bytes per row "
                              f"for {len(features)} true features; {-(-len(features) // 8)} "
                              "needed")
    return features


def _image_count(dataset: str, split: str, data_dir: str | Path | None) -> int:
    """How many images a dataset's split holds (read from the IDX files where training will
    find them: ``data_dir``, else the usual sources of :func:`sae.data.images.load_arrays`)."""
    from sae.data.images import DataSourceError, load_arrays  # torch: only for images

    try:
        arrays = load_arrays(dataset, data_dir)
    except DataSourceError as e:
        raise MatrixError(f"manifest: images of {dataset}: {e}") from None
    return len(arrays.train_images if split == "train" else arrays.test_images)


def manifest_name(path: str | Path) -> str | None:
    """A manifest's ``name`` (None when it has none or cannot be read): enough to name a run's
    folder without checking the files it names."""
    try:
        spec = json.loads(read_text(Path(path).expanduser(), MANIFEST_LIMIT, follow_links=True))
    except (OSError, ValueError, RecursionError):
        return None
    name = spec.get("name") if isinstance(spec, dict) else None
    return name if isinstance(name, str) and name else None


def _manifest(path: Path, data_dir: str | Path | None = None) -> MatrixData:
    try:
        spec = json.loads(read_text(path, MANIFEST_LIMIT, follow_links=True))
    except FileNotFoundError:
        raise MatrixError(f"{path} does not exist") from None
    except (OSError, ValueError) as e:
        raise MatrixError(f"{path} is not a readable JSON manifest ({str(e).splitlines()[0]})") \
            from None
    except RecursionError:
        raise MatrixError(f"{path} is not a readable JSON manifest (it nests too deeply)") \
            from None
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        raise MatrixError(f"{path}: a manifest is a JSON object with \"format\": \"{FORMAT}\"")
    unknown = set(spec) - {"format", "name", "train", "val", "test", "images", "class_names",
                           "source", "truth"}
    if unknown:
        raise MatrixError(f"{path}: unknown keys {sorted(unknown)}")
    images = spec.get("images")
    if images is not None:
        from sae.data.images import DATASETS  # torch: only for a manifest with images

        if not isinstance(images, dict) or images.get("dataset") not in DATASETS:
            raise MatrixError(f"{path}: \"images\" must be {{\"dataset\": one of "
                              f"{sorted(DATASETS)}}}")
        images = images["dataset"]
    folder = path.parent
    count = (lambda split: _image_count(images, split, data_dir)) if images else \
        (lambda split: None)
    train = _split(spec.get("train"), folder, "train", images, count("train"))
    # validation rows index the image dataset's training split, as carved ones would
    val, test = (_other_split(spec, path, name, train, images, count(where))
                 for name, where in (("val", "train"), ("test", "test")))
    names = spec.get("class_names")
    if names is not None:
        if not (isinstance(names, list) and names and all(isinstance(c, str) for c in names)):
            raise MatrixError(f"{path}: \"class_names\" must be a list of strings")
        top = max(int(s.labels.max()) for s in (train, val, test) if s is not None
                  and s.labels is not None) if train.labels is not None else -1
        if top >= len(names):
            raise MatrixError(f"{path}: label {top} has no name in \"class_names\" "
                              f"({len(names)} names)")
    name = spec.get("name") if isinstance(spec.get("name"), str) else path.stem
    splits = [s for s in (train, val, test) if s is not None]
    truth = None
    if spec.get("truth") is not None:
        truth = _truth(spec["truth"], folder, train.x.shape[1], splits)
    elif any(s.active is not None for s in splits):
        raise MatrixError(f"{path}: \"active\" needs \"truth\" (the true features it marks)")
    return MatrixData(name=name, train=train, test=test, images=images, class_names=names,
                      source=path, truth_features=truth, val=val)


def _other_split(spec: dict, path: Path, name: str, train: MatrixSplit, images: str | None,
                 n_images: int | None) -> MatrixSplit | None:
    """The manifest's ``val`` or ``test`` split (None when not given), checked against
    ``train``: rows of the same width, labels where train has them."""
    if spec.get(name) is None:
        return None
    split = _split(spec[name], folder=path.parent, name=name, images=images, n_images=n_images)
    if split.x.shape[1] != train.x.shape[1]:
        raise MatrixError(f"{path}: {name} rows have {split.x.shape[1]} numbers, train rows "
                          f"{train.x.shape[1]}")
    if (split.labels is None) != (train.labels is None):
        raise MatrixError(f"{path}: labels must be given for every split or none")
    return split


def load_data(path: str | Path, check_finite: bool = True,
              data_dir: str | Path | None = None,
              progress: Callable[[int, int], None] | None = None) -> MatrixData:
    """The activation data ``--data`` names (a ``.npy`` matrix or a ``.json`` manifest), every
    file checked; NaN or inf anywhere is refused unless ``check_finite`` is off. A manifest's
    image rows are checked against the images found in ``data_dir`` (``--data-dir``), else
    where :func:`sae.data.images.load_arrays` looks.

    The check is one pass over each matrix (:func:`sae.data.scan.scan_matrix`), which also
    hashes its file and sums its columns (each split's ``scan``); ``progress(bytes read, of
    bytes)`` is called as it goes, and an exception it raises stops it."""
    path = Path(path).expanduser()
    if path.suffix.lower() == ".json":
        data = _manifest(path, data_dir)
    else:
        data = MatrixData(name=path.stem, train=MatrixSplit(x=open_matrix(path),
                                                            files={"x": path}),
                          test=None, source=path)
    _check_classes(data)
    if check_finite:
        splits = data.splits()
        total, done = sum(s.x.shape[0] * s.x.shape[1] * s.x.dtype.itemsize for s in splits), 0
        for split in splits:
            report = None if progress is None else \
                (lambda read, done=done: progress(done + read, total))
            split.scan = scan_matrix(split.x, report)
            if split.scan.bad is not None:
                row, why = split.scan.bad
                raise MatrixError(f"{split.files['x']}: row {row} {why}")
            done += split.x.shape[0] * split.x.shape[1] * split.x.dtype.itemsize
    return data


def _check_classes(data: MatrixData) -> None:
    """Refuse more classes than a run holds (:data:`MAX_CLASSES`) or than training rows, and
    names longer than :data:`MAX_NAME`: the class figures, probes and pages are sized by them."""
    names = data.class_names
    if names is not None and len(names) > MAX_CLASSES:
        raise MatrixError(f"{data.source}: \"class_names\" holds {len(names):,} names; at most "
                          f"{MAX_CLASSES:,} classes")
    given = [data.name] if data.source is None or data.name != data.source.stem else []
    longest = max([*given, *(names or [])], key=len, default="")
    if len(longest) > MAX_NAME:
        raise MatrixError(f"{data.source}: a name of {len(longest):,} characters "
                          f"({longest[:40]!r}...); at most {MAX_NAME}")
    classes, rows = data.n_classes, len(data.train.x)
    if classes is not None and classes > rows:
        what = "class names" if names is not None else f"classes (labels up to {classes - 1})"
        raise MatrixError(f"{data.source}: {classes:,} {what} for {rows:,} training rows; more "
                          "classes than rows cannot be learned")


def describe(data: MatrixData) -> dict:
    """What a run folder records of its data: for each split's matrix its path, shape, dtype
    and SHA-256, so that a resume or a sweep can refuse a different file, and whether its rows
    have labels (the pages of a run on rows without labels show no classes)."""
    out: dict = {"name": data.name, "source": str(data.source), "images": data.images,
                 "labelled": data.train.labels is not None}
    for name, split in (("train", data.train), ("val", data.val), ("test", data.test)):
        if split is None:
            continue
        sha = split.scan.sha256 if split.scan is not None and split.scan.sha256 else \
            file_sha256(split.files["x"])
        out[name] = {"path": str(split.files["x"]), "shape": list(split.x.shape),
                     "dtype": str(split.x.dtype), "sha256": sha}
    return out


_CHECKED: dict[tuple, tuple[tuple, MatrixData, dict]] = {}
_CHECKING = threading.Lock()  # one check at a time: a second caller gets the first's result


def _stamps(paths) -> tuple:
    """(path, size, mtime) of each file: the same stamps, the same bytes (as far as a process
    that trains run after run needs to know)."""
    out = []
    for path in paths:
        try:
            info = Path(path).stat()
            out.append((str(path), info.st_size, info.st_mtime_ns))
        except OSError:
            out.append((str(path),))
    return tuple(out)


def _files(data: MatrixData) -> list[Path]:
    return [data.source] + [f for s in data.splits() for f in s.files.values()]


def checked(path: str | Path, data_dir: str | Path | None = None) -> tuple[MatrixData, dict]:
    """The data ``--data`` names, every file checked (:func:`load_data`, its image rows against
    the images in ``data_dir``), and its record (:func:`describe`: paths, shapes, dtypes,
    SHA-256); read once per process while none of its files changes. The pass over the
    matrices is a start-up task (:mod:`sae.system.status`), its progress in bytes read.
    Raises :class:`MatrixError`."""
    path = Path(path).expanduser()
    key = (str(path), None if data_dir is None else str(data_dir))
    with _CHECKING:
        if key in _CHECKED:
            stamps, data, record = _CHECKED[key]
            if _stamps(_files(data)) == stamps:
                return data, record
        _CHECKED.clear()  # one data set at a time: each holds its files open
        what = f"checking {path.name}"

        def progress(read: int, total: int) -> None:
            status.note(what, f"{read / 1e9:.2f} of {total / 1e9:.2f} GB read")

        with status.task(what):
            data = load_data(path, data_dir=data_dir, progress=progress)
        stamps = _stamps(_files(data))
        record = describe(data)
        _CHECKED[key] = (stamps, data, record)
        return data, record
