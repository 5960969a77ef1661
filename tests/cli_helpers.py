"""How the CLI tests call the tool: as a user would, in a subprocess."""

import os
import subprocess
import sys
from pathlib import Path

# a few hundred images and a small code: seconds per run
QUICK = ["--limit-train", "1024", "--val-size", "256", "--limit-test", "256", "--hidden", "64",
         "--batch-size", "128", "--k", "8"]


def cli_env(cwd, data_dir, **extra) -> dict:
    # one thread per training: the tests' small models gain nothing from more, and several
    # processes each spinning up a thread per core slow each other down many times over
    env = dict(os.environ, SAE_DATA_DIR=str(data_dir), SAE_OFFLINE="1", OMP_NUM_THREADS="1",
               SAE_CACHE_DIR=str(Path(cwd) / "cache"), **extra)
    env.pop("SAE_RUN_DIR", None)
    return env


def run_cli(args, cwd, data_dir, timeout=300, module="sae.run", **env_extra):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd,
                          env=cli_env(cwd, data_dir, **env_extra), capture_output=True,
                          text=True, timeout=timeout)


def start_cli(args, cwd, data_dir, stderr=subprocess.DEVNULL, module="sae.run"):
    return subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=cwd,
                            env=cli_env(cwd, data_dir), stdout=subprocess.DEVNULL,
                            stderr=stderr, text=True)


def assert_one_line_error(result, code=2):
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
