"""The run folder: who owns it, what may replace it, and its training history across sessions.

- **Ownership.** A run folder has one writer at a time: :func:`claim` takes an exclusive lock
  (``flock`` on ``.lock``) before anything is written and holds it until the process ends, on
  every exit (the kernel releases it, even after ``kill -9``). A second run on the same folder
  is refused with one line.
- **What this tool made.** A new folder gets a marker file (:data:`MARKER`). ``--overwrite``
  replaces only folders that carry it, or that have exactly the shape of a run folder of an
  earlier version (a valid ``config.yaml`` and nothing but run-folder entries); never the
  working directory or one of its parents; and never one holding a file that a run does not
  write (:func:`foreign_file`: a user's notes beside the run's files), which it names. What a
  run writes is declared by exact name (:data:`RUN_FILES`, :data:`CHECKPOINT_FILES`,
  ``figures/<kind>/epoch_<E>.png`` of the kinds it draws, ``logs/session_<n>/`` and the files
  in it, TensorBoard's event files, the temporary files of the tool's own atomic writes), and
  ``--overwrite`` removes those by name: a user's ``checkpoints/keep-epoch5.ckpt`` or
  ``.draft.tmp`` is not the tool's.
- **A start stopped by kill -9** before its first checkpoint leaves a marked folder with no
  checkpoint (:func:`stopped_start`): nothing to resume. The same command is then refused with
  the command that starts it again (``--overwrite``), as is ``--resume``.
- **Links and leftovers.** A run folder can come from elsewhere (a tarball, a colleague's disk):
  :func:`claim` refuses one that holds a link anywhere inside it (the folder named by ``--out``
  may itself be one: the user named it), before anything is opened or
  written, and opens ``.lock`` only if it is a regular file (never following a link, never
  blocking on a FIFO). Under the lock a resume removes the temporary files a killed write left
  behind (:func:`remove_temporaries`: by their names, so a user's ``.draft.tmp`` stays). A
  folder holding only ``.lock`` and the marker (a start that failed on a full disk) counts as
  empty: a retry, ``--overwrite`` and a sweep take it.
- **Reading.** :class:`RunFolder` is the one reader of a run folder for every command that
  reads one (the report, the feature browser, the figures from a checkpoint, a sweep's analysis,
  the gallery): its settings (``config.yaml`` over the defaults), final metrics, last checkpoint
  and data; :class:`RunFolderError` when a path is not a readable run folder.
- **History.** Each training session (the first run, then each ``--resume``) logs to its own
  ``logs/session_<n>/metrics.csv`` and records the step it started from; no session's file is
  ever rewritten. ``metrics.csv`` in the run folder is the merged view, rebuilt at the end of
  each session: the rows of each session before the step the next one resumed from, then the next.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from sae.settings.cli import UsageError, defaults, read_settings_file
from sae.system import io as sae_io

__all__ = ["LEFTOVERS", "MARKER", "RUN_ENTRIES", "RunFolder", "RunFolderError", "check_links",
           "check_resume", "claim",
           "foreign_file", "is_leftover", "merge_history", "new_session", "overwritable", "release",
           "remove_temporaries", "stopped_start"]

MARKER = ".sae-run-folder"
LOCK = ".lock"
# what a run folder of this tool may hold (earlier versions included)
RUN_ENTRIES = {MARKER, LOCK, "config.yaml", "metrics.csv", "metrics.json", "checkpoints",
               "tensorboard", "figures", "report.html", "features.html", "hparams.yaml", "logs",
               "analysis.json", "test_l0.npy"}
LEFTOVERS = {MARKER, LOCK}  # all that a start which failed at once may leave
# What a run writes, by name (earlier versions included): --overwrite removes these and nothing
# else, and refuses a folder that holds anything else (a user's file named like one of them).
# At the top: its own files (data.json: the record of --data; analysis.json and test_l0.npy: a
# sweep's analysis; hparams.yaml: an earlier version's log).
RUN_FILES = {MARKER, LOCK, "config.yaml", "metrics.csv", "metrics.json", "report.html",
             "features.html", "hparams.yaml", "analysis.json", "test_l0.npy", "data.json"}
RUN_FOLDERS = {"checkpoints", "tensorboard", "figures", "logs"}
CHECKPOINT_FILES = {"best.ckpt", "last.ckpt"}  # the two ModelCheckpoints of a run
# figures/<kind>/: what the figure callback draws, and the feature browser's code embedding
FIGURE_KINDS = {"decoder_atoms", "reconstructions", "sparsity_histogram", "activation_frequency",
                "class_unit_heatmap", "feature_density", "code_embedding"}
EMBEDDING_FILES = {"test_set.png", "final.png"}  # code_embedding/ (final.png: earlier versions)
_FIGURE = re.compile(r"epoch_\d+\.png")  # figures/<kind>/epoch_<E>.png
_SESSION = re.compile(r"session_\d+")  # logs/session_<n>/: one training session's log
SESSION_FILES = {"metrics.csv", "hparams.yaml", "session.json"}  # CSVLogger's and the tool's
# tensorboard/: TensorBoard's event files (events.out.tfevents.<time>.<host>.<pid>.<n>)
_EVENTS = re.compile(r"events\.out\.tfevents\.\d+\..+\.\d+\.\d+")
# a killed write's temporary file: sae.system.io.atomic_file names it .<name>-<random>.tmp in
# the target's folder, the random part of mkstemp's letters, digits and underscores
_TEMPORARY = re.compile(r"\.(.+)-[a-z0-9_]+\.tmp")
_NOT_ATOMIC = {LOCK, "hparams.yaml"}  # written in place (the lock, Lightning's logs): no temporary

_held: dict[Path, int] = {}  # folder -> open lock file descriptor
_made_parents: dict[Path, Path] = {}  # folder -> the outermost of the parents claim made for it


def _lock(folder: Path) -> None:
    try:
        fd = sae_io.open_regular(folder / LOCK, os.O_RDWR | os.O_CREAT)
    except sae_io.UnsafePathError as e:
        raise UsageError(f"refusing run folder {folder}: {e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"run folder {folder} is in use by another training process") from None
    try:  # the PID is for people; the lock is the flock, so a full disk must not stop it
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        pass
    _held[folder.resolve()] = fd


def check_links(folder: Path) -> None:
    """Refuse ``folder`` if a link lies anywhere in it: the run would write through it."""
    link = sae_io.find_link(folder)
    if link is not None:
        raise UsageError(f"refusing run folder {folder}: {link} is a link (a run folder holds no "
                         "links; remove it)")


def is_leftover(folder: Path) -> bool:
    """Whether ``folder`` holds nothing but what a failed start leaves (``.lock``, the marker)."""
    return folder.is_dir() and {p.name for p in folder.iterdir()} <= LEFTOVERS


def release(folder: Path) -> None:
    """Release this process's lock on ``folder`` (exiting releases it too)."""
    fd = _held.pop(Path(folder).resolve(), None)
    if fd is not None:
        os.close(fd)


def is_locked(folder: Path) -> bool:
    """Whether a process holds ``folder``'s lock (a sweep asks before resuming a run).

    Raises UsageError when ``.lock`` is a link, a folder or a special file.
    """
    path = Path(folder) / LOCK
    if not os.path.lexists(path):
        return False
    try:
        fd = sae_io.open_regular(path)
    except sae_io.UnsafePathError as e:
        raise UsageError(f"refusing run folder {folder}: {e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def made_here(folder: Path, entries: set[str] | None = None) -> str | None:
    """None when ``folder`` is a run folder of this tool, else the reason it is not.

    That is: it carries :data:`MARKER`, or it has exactly the shape of a run folder of an
    earlier version (a non-empty, valid ``config.yaml`` and nothing but run-folder entries: an
    empty one, beside a user's own ``metrics.json``, is not), or it holds only what a failed
    start leaves.
    """
    entries = {p.name for p in folder.iterdir()} if entries is None else entries
    if MARKER in entries or entries <= LEFTOVERS:
        return None
    if "config.yaml" not in entries:
        return "it is not a run folder (no config.yaml)"
    strangers = sorted(entries - RUN_ENTRIES)
    if strangers:
        return f"it holds files a run folder does not ({', '.join(strangers[:3])})"
    try:
        settings = read_settings_file(folder / "config.yaml")
    except UsageError:
        return "its config.yaml is not a run's settings"
    if not settings:
        return "it has no marker of this tool and its config.yaml holds no settings"
    return None


def _run_folder(parts: tuple[str, ...]) -> bool:
    """Whether the folder at ``parts`` (relative to a run folder) is one a run makes: the run
    folder, ``checkpoints``, ``tensorboard``, ``figures``, ``logs``, ``figures/<kind>`` of a
    kind it draws and ``logs/session_<n>``."""
    if not parts:
        return True
    top, depth = parts[0], len(parts)
    if depth == 1:
        return top in RUN_FOLDERS
    return depth == 2 and ((top == "figures" and parts[1] in FIGURE_KINDS) or
                           (top == "logs" and _SESSION.fullmatch(parts[1]) is not None))


def _run_file(folder: tuple[str, ...], name: str) -> bool:
    """Whether a run writes the file ``name`` in its folder ``folder`` (a :func:`_run_folder`)."""
    if not folder:
        return name in RUN_FILES
    top, depth = folder[0], len(folder)
    if depth == 1:  # files directly in figures/ or logs/ are not a run's
        return (top == "checkpoints" and name in CHECKPOINT_FILES) or \
            (top == "tensorboard" and (name == "hparams.yaml" or
                                       _EVENTS.fullmatch(name) is not None))
    if top == "figures":
        return _FIGURE.fullmatch(name) is not None or \
            (folder[1] == "code_embedding" and name in EMBEDDING_FILES)
    return top == "logs" and name in SESSION_FILES


def _temporary_of_a_run(folder: tuple[str, ...], name: str) -> bool:
    """Whether ``name`` in ``folder`` is the temporary file of a killed atomic write of a run's
    own file there (``.last.ckpt-<random>.tmp``): never of TensorBoard's or Lightning's files,
    which are written in place."""
    temporary = _TEMPORARY.fullmatch(name)
    if temporary is None or temporary[1] in _NOT_ATOMIC or folder[:1] == ("tensorboard",):
        return False
    return _run_folder(folder) and _run_file(folder, temporary[1])


def _written_by_a_run(parts: tuple[str, ...], is_dir: bool) -> bool:
    """Whether the entry at ``parts`` (relative to a run folder) is one a run writes, by its
    exact name: a :func:`_run_folder`, a :func:`_run_file` in one, or the temporary file of a
    killed write of one (:func:`_temporary_of_a_run`). Anything else is not the tool's."""
    folder, name = parts[:-1], parts[-1]
    if is_dir:
        return _run_folder(parts)
    return _run_folder(folder) and (_run_file(folder, name) or _temporary_of_a_run(folder, name))


def foreign_file(folder: Path) -> Path | None:
    """The first entry in ``folder``'s tree that a run does not write (a user's file or
    folder), or None. Links are not followed (a run folder holds none: :func:`check_links`)."""
    for root, dirs, files in os.walk(folder, followlinks=False):
        rel = Path(root).relative_to(folder).parts
        for name in sorted(dirs):
            if not _written_by_a_run((*rel, name), True):
                return Path(root) / name
        for name in sorted(files):
            if not _written_by_a_run((*rel, name), False):
                return Path(root) / name
        dirs.sort()
    return None


def _run_entries(folder: Path, temporaries_only: bool = False) -> list[Path]:
    """The files (and then the folders) in ``folder``'s tree that a run writes, deepest first;
    with ``temporaries_only`` the temporary files of its killed writes alone. Links are not
    followed, and neither are folders a run does not make (what is in them is not the tool's).
    """
    found = []
    for root, dirs, files in os.walk(folder, topdown=False, followlinks=False):
        rel = Path(root).relative_to(folder).parts
        if not _run_folder(rel):
            continue
        for name in files:
            is_run_file = not temporaries_only and _run_file(rel, name)
            if (is_run_file or _temporary_of_a_run(rel, name)) and \
                    not os.path.islink(os.path.join(root, name)):
                found.append(Path(root) / name)
        if not temporaries_only:
            found += [Path(root) / d for d in dirs if _run_folder((*rel, d))]
    return found


def remove_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files a killed write of a run left in ``folder`` (named as
    :func:`sae.system.io.atomic_file` names them, after one of the run's own files); call it
    under the folder's lock. A user's ``.draft.tmp`` stays. Returns those removed."""
    removed = _run_entries(folder, temporaries_only=True)
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def _remove_run_files(folder: Path, keep_lock: bool = True) -> None:
    """Remove every file and folder a run wrote in ``folder``, by name (but its ``.lock`` while
    ``keep_lock``); a folder that holds anything else keeps it, and stays."""
    for path in _run_entries(folder):
        if keep_lock and path.parent == folder and path.name == LOCK:
            continue
        if path.is_dir() and not path.is_symlink():
            try:
                path.rmdir()  # empty by now, unless it holds what a run does not write
            except OSError:
                pass
        else:
            path.unlink(missing_ok=True)


def overwritable(folder: Path) -> str | None:
    """None when ``folder`` may be replaced by ``--overwrite``, else the reason it may not."""
    here = Path.cwd().resolve()
    target = folder.resolve()
    if target == here or target in here.parents:
        return "it is the working directory or one of its parents"
    reason = made_here(folder)
    if reason:
        return reason
    stranger = foreign_file(folder)
    if stranger is not None:
        return (f"{stranger} was not written by a run (move it out of the folder; nothing "
                "was removed)")
    return None


def stopped_start(folder: Path) -> bool:
    """Whether ``folder`` is this tool's run folder of a start stopped before its first
    checkpoint, with no process in it (a kill -9, a power cut): marked, with ``config.yaml``,
    no checkpoint and no final metrics."""
    return (folder / MARKER).is_file() and (folder / "config.yaml").is_file() and \
        not (folder / "metrics.json").exists() and \
        not any((folder / "checkpoints").glob("*.ckpt")) and not is_locked(folder)



def check_resume(out: str | Path) -> None:
    """For ``--resume last``: the run folder's last checkpoint exists. A UsageError otherwise,
    which for a start stopped before its first checkpoint (kill -9) says how to start it again
    with its own settings (``--config`` its config.yaml, ``--overwrite``)."""
    out = Path(out)
    last = out / "checkpoints" / "last.ckpt"
    if last.is_file():
        return
    hint = ""
    if stopped_start(out):
        again = shlex.join([sys.executable, "-m", "sae.run", "--config", str(out / "config.yaml"),
                            "--out", str(out), "--overwrite"])
        hint = f" (the run was stopped before its first checkpoint); start it again with: {again}"
    raise UsageError(f"cannot resume: no checkpoint at {last}{hint}")

def claim(folder: Path, mode: str, again: str | None = None) -> bool:
    """Take ``folder`` for this run; ``mode`` is new, resume or overwrite.

    Returns whether the folder was created now (a failed start then removes it again). Raises
    UsageError, before anything is written, if the folder is not this run's to take: a link
    anywhere in it, a ``.lock`` that is not a regular file, another process training in it,
    for ``resume`` a folder that this tool did not make (:func:`made_here`), and for
    ``overwrite`` one holding a file a run does not write (:func:`overwritable`). ``again``:
    the command that starts a stopped start over (:func:`stopped_start`), named when a new run
    finds one.
    """
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out {folder} exists and is not a folder")
    if folder.is_dir():
        check_links(folder)
    if mode == "resume":
        reason = made_here(folder)
        if reason:
            raise UsageError(f"refusing to resume into {folder}: {reason}")
        _lock(folder)
        remove_temporaries(folder)
        return False
    if folder.is_dir() and not is_leftover(folder):
        if mode != "overwrite":
            if again is not None and stopped_start(folder):
                raise UsageError(f"run folder {folder} holds a start that was stopped before its "
                                 f"first checkpoint (nothing to resume); start it again with: "
                                 f"{again}")
            raise UsageError(f"run folder {folder} already exists; pass --resume to continue "
                             "it or --overwrite to replace it")
        reason = overwritable(folder)
        if reason:
            raise UsageError(f"refusing to --overwrite {folder}: {reason}")
        _lock(folder)  # not while another process trains in it
        _remove_run_files(folder)
        (folder / MARKER).write_text("made by python -m sae.run\n")
        return False
    created = not folder.exists()
    top = folder.absolute()  # the outermost folder made now: a failed start removes it again
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if created and top != folder.absolute():
            _made_parents[folder.absolute()] = top
        _lock(folder)
        if not is_leftover(folder):  # another run got here first
            release(folder)
            raise UsageError(f"run folder {folder} already exists; pass --resume to continue "
                             "it or --overwrite to replace it")
        sae_io.write_text(folder / MARKER, "made by python -m sae.run\n")
    except OSError as e:
        _undo_claim(folder, created)
        raise UsageError(f"cannot create run folder {folder}: {e.strerror or e}") from None
    return created


def _undo_claim(folder: Path, created: bool) -> None:
    """A start that failed at once (a full disk) leaves no ``.lock`` or marker behind."""
    release(folder)
    if is_leftover(folder):
        for name in LEFTOVERS:
            (folder / name).unlink(missing_ok=True)
        if created:
            folder.rmdir()


def remove_unfinished(folder: Path, created: bool) -> None:
    """Undo a start that failed before any checkpoint: the retry then simply works."""
    if (folder / "checkpoints").is_dir() and any((folder / "checkpoints").glob("*.ckpt")):
        return
    release(folder)
    if created:
        shutil.rmtree(folder, ignore_errors=True)
        top = _made_parents.pop(folder.absolute(), None)
        parent = folder.absolute().parent
        while top is not None and parent != top.parent:
            try:
                parent.rmdir()  # only while empty: what someone else put there stays
            except OSError:
                break
            parent = parent.parent
    else:  # a folder that was there: what the run wrote in it, by name
        _remove_run_files(folder, keep_lock=False)


# ---------------------------------------------------------------- reading


class RunFolderError(Exception):
    """The given path is not a readable run folder."""


@dataclass(frozen=True)
class RunFolder:
    """A run folder as the commands that read one see it: its settings, final metrics, last
    checkpoint and data, each read when asked for. :meth:`open` checks that ``path`` is one;
    the constructor alone (for a folder known to be one) checks nothing."""

    path: Path

    @classmethod
    def open(cls, path: str | Path) -> RunFolder:
        """The run folder at ``path``. RunFolderError when it is missing, not a folder, or holds
        no ``config.yaml``."""
        path = Path(path)
        if not path.exists():
            raise RunFolderError(f"run folder not found: {path}")
        if not path.is_dir():
            raise RunFolderError(f"not a folder: {path}")
        if not (path / "config.yaml").is_file():
            raise RunFolderError(f"not a run folder (no config.yaml): {path}")
        return cls(path)

    @property
    def config_file(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.json"

    @property
    def checkpoint(self) -> Path:
        """The last checkpoint, ``checkpoints/last.ckpt`` (none before the first validation)."""
        return self.path / "checkpoints" / "last.ckpt"

    def settings(self) -> dict:
        """Every setting of the run by field name: its ``config.yaml``, read and checked by the
        settings layer as for a resume (known settings, valid values), over the defaults of
        those it does not name (a folder of an earlier version). RunFolderError when
        ``config.yaml`` cannot be read or holds a bad value."""
        try:
            return {**defaults(), **read_settings_file(self.config_file)}
        except UsageError as exc:
            raise RunFolderError(str(exc)) from None

    def metrics(self) -> dict | None:
        """The final test metrics (``metrics.json``: a regular file, no link followed, bounded
        size); None while there are none, or when the file is damaged (not a JSON object)."""
        try:
            value = json.loads(sae_io.read_text(self.metrics_file))
        except (OSError, ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None

    def model(self):
        """The trained model of the last checkpoint, in eval mode, read and checked in full
        (:func:`sae.training.checkpoints.load_checkpoint`)."""
        from sae.training.checkpoints import load_checkpoint  # deferred: torch

        return load_checkpoint(self.checkpoint)

    def data_module(self, data_dir: str | Path | None = None):
        """The data module of the run's data (its images or ``--data`` activations, with the
        run's splits), not yet loaded; ``data_dir``: the folder of the images, instead of the
        run's."""
        from sae.data.modules import data_module  # deferred: numpy and torch

        settings = self.settings()
        if settings.get("source"):  # config.yaml may name a module: never imported from here
            raise RunFolderError(f"{self.path} trained on a model's layer (--source "
                                 f"{settings['source']}); its data is that model's, read only "
                                 "while it trains (its pages are written then)")
        if data_dir is not None:
            settings["data_dir"] = data_dir
        return data_module(settings)


# ---------------------------------------------------------------- history


def _sessions(folder: Path) -> list[tuple[int, Path]]:
    logs = folder / "logs"
    found = []
    for d in logs.glob("session_*") if logs.is_dir() else ():
        if d.name[8:].isdigit():
            found.append((int(d.name[8:]), d))
    return sorted(found)


def _start_step(session: Path, rows: list[dict]) -> int:
    """The step a session resumed from (its ``session.json``); when that file is missing or
    damaged, the first step the session logged (its rows start at or after its start)."""
    try:
        start = json.loads(sae_io.read_text(session / "session.json")).get("start_step")
        if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
            return start
    except (OSError, ValueError, AttributeError):
        pass
    steps = [s for s in (_step(row) for row in rows) if s is not None]
    return min(steps) if steps else 0


def _step(row: dict) -> int | None:
    try:
        return int(float(row.get("step") or 0))
    except (TypeError, ValueError, OverflowError):
        return None


def new_session(folder: Path, start_step: int) -> str:
    """Open the next session's log folder; returns its name (``session_<n>``).

    A run folder of an earlier version kept one ``metrics.csv``; it becomes session 0 (copied,
    not changed) before the first new session.
    """
    sessions = _sessions(folder)
    if not sessions and (folder / "metrics.csv").is_file():
        first = folder / "logs" / "session_0"
        first.mkdir(parents=True, exist_ok=True)
        sae_io.copy_file(folder / "metrics.csv", first / "metrics.csv")
        sae_io.write_json(first / "session.json", {"start_step": 0})
        sessions = [(0, first)]
    n = sessions[-1][0] + 1 if sessions else 0
    path = folder / "logs" / f"session_{n}"
    path.mkdir(parents=True, exist_ok=True)
    sae_io.write_json(path / "session.json", {"start_step": int(start_step)})
    return path.name


def merge_history(folder: Path) -> Path | None:
    """Write ``metrics.csv``: every session's rows that no later session logged again.

    A damaged ``session.json`` or ``metrics.csv`` of one session costs that session's rows
    their exact cut (see :func:`_start_step`) or the rows themselves, never the merge.
    """
    parts = []
    for _, d in _sessions(folder):
        if not (d / "metrics.csv").is_file():
            continue
        try:
            rows = list(csv.DictReader(sae_io.read_text(d / "metrics.csv").splitlines()))
        except (OSError, ValueError, csv.Error):
            rows = []
        parts.append((_start_step(d, rows), rows))
    if not parts:
        return None
    merged: list[dict] = []
    columns: list[str] = []
    for i, (_, rows) in enumerate(parts):
        until = parts[i + 1][0] if i + 1 < len(parts) else None
        for row in rows:
            step = _step(row)
            if until is None or (step is not None and step < until):
                merged.append(row)
            for key in row:
                if key is not None and key not in columns:
                    columns.append(key)
    text = _csv_text(columns, merged)
    sae_io.write_text(folder / "metrics.csv", text)
    return folder / "metrics.csv"


def _csv_text(columns: list[str], rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n",
                            extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
