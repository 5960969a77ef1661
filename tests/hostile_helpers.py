"""What the hostile-file tests share: a finished tiny run to copy, snapshots of folders, the
one error line, a planted victim file, a resume, an edited checkpoint."""

import hashlib
import os
import shutil
from pathlib import Path

import torch
from cli_helpers import QUICK

from sae.runner import command as sae_run
from sae.training import runfolder
from sae.training.checkpoints import checksum

VICTIM_TEXT = "the user's own file\n"


def train_template(tmp_path_factory, data_dir) -> Path:
    """A finished tiny run (in-process): the template every case copies."""
    os.environ.update(SAE_DATA_DIR=str(data_dir), SAE_OFFLINE="1")
    out = tmp_path_factory.mktemp("template") / "run"
    rc = sae_run.main(["--model", "topk", *QUICK, "--max-steps", "8", "--no-figures",
                       "--no-features", "--no-report", "--progress", "off", "--out", str(out)])
    assert rc == 0
    runfolder.release(out)
    return out


def copy_run(trained, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


def snapshot(root: Path) -> dict:
    """Every path under root (folders too) with the SHA-256 of each file's bytes."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest()
                                       if p.is_file() and not p.is_symlink() else "dir")
            for p in sorted(root.rglob("*"))}


def one_line(capsys, *words) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "Traceback" not in err[0]
    for word in words:
        assert word in err[0], err[0]
    return err[0]


def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(VICTIM_TEXT)
    return path


def resume(run: Path) -> int:
    code = sae_run.main(["--out", str(run), "--resume", "--progress", "off"])
    runfolder.release(run)
    return code


def edit_checkpoint(run: Path, change, keep_checksum=False) -> None:
    path = run / "checkpoints" / "last.ckpt"
    state = torch.load(path, weights_only=True)
    change(state)
    if not keep_checksum and "sae_checksum" in state:
        state["sae_checksum"] = checksum(state)
    torch.save(state, path)
