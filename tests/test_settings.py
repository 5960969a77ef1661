"""Settings declared once (sae.settings.config), derived for the CLI, config files and sweeps
(sae.settings.cli)."""

from dataclasses import fields

import pytest
import yaml

from sae.settings.cli import (
    SETTINGS,
    UsageError,
    build_parser,
    check_mapping,
    config_file_dict,
    read_settings_file,
    resolve_settings,
    to_argv,
    write_config,
)
from sae.settings.config import SECTIONS, SAEConfig


def test_every_setting_field_is_a_flag_with_its_default_and_help():
    help_text = build_parser().format_help()
    for section, _ in SECTIONS:
        for f in fields(section):
            if "setting" not in f.metadata:
                continue
            s = SETTINGS[f.name]
            assert s.flag in help_text
            assert s.help.split()[0] in help_text
    defaults = vars(build_parser().parse_args([]))
    assert defaults["lam"] == SAEConfig().lam and defaults["epochs"] == 10


def test_one_field_is_one_setting_everywhere(tmp_path):
    # the flag, the file key and the field name of λ
    assert vars(build_parser().parse_args(["--lambda", "0.3"]))["lam"] == 0.3
    assert check_mapping({"lambda": 0.3}, "x") == {"lam": 0.3}
    assert config_file_dict({"lam": 0.3, "out": "run"}) == {"lambda": 0.3}  # out is CLI-only
    assert to_argv({"lam": 0.3, "no_figures": True, "max_steps": None}) == \
        ["--lambda", "0.3", "--no-figures"]


def test_written_config_reads_back_identically(tmp_path):
    args = vars(resolve_settings(["--model", "topk", "--k", "8", "--devices", "0,1",
                                  "--out", "x"]))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_file_dict(args), sort_keys=False))
    again = read_settings_file(path)
    assert all(again[name] == args[name] for name in again)
    assert again["devices"] == [0, 1]


def test_config_file_and_flags_layer(tmp_path):
    """defaults < --config < explicit flags, and the config.yaml a run writes (sae.settings.cli's
    write_config) gives the same settings again as a --config file."""
    from sae.settings.config import RunConfig

    (tmp_path / "exp.yaml").write_text("model: kl\nlambda: 0.05\nrho: 0.1\nhidden: 32\n")
    args = resolve_settings(["--config", str(tmp_path / "exp.yaml"), "--lambda", "0.02",
                             "--out", str(tmp_path / "run")])
    assert (args.model, args.lam, args.rho, args.hidden, args.epochs) == ("kl", 0.02, 0.1, 32, 10)
    write_config(RunConfig.from_settings(vars(args)), tmp_path / "config.yaml")
    again = resolve_settings(["--config", str(tmp_path / "config.yaml"), "--out", "x"])
    assert {k: v for k, v in vars(again).items() if k not in ("config", "out")} == \
        {k: v for k, v in vars(args).items() if k not in ("config", "out")}


@pytest.mark.parametrize("text, message", [
    ("no_figures: 'false'\n", "true or false"),       # a quoted false is not a boolean
    ("hidden: 64\nhidden: 32\n", "repeated key"),     # YAML would keep the last silently
    ("hidden: 64.5\n", "integer"),
    ("lambda: -1\n", ">= 0"),
    ("bogus: 3\n", "unknown setting"),
    ("out: somewhere\n", "unknown setting"),          # CLI-only
    ("model: [l1, kl]\n", "one value"),
    ("- a\n- b\n", "mapping"),
    ("!!python/object/apply:os.system ['true']\n", "not valid YAML"),
])
def test_bad_config_files_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as e:
        read_settings_file(path)
    assert "\n" not in str(e.value)


def test_config_file_that_is_a_folder_or_not_text(tmp_path):
    with pytest.raises(UsageError, match="is a folder"):
        read_settings_file(tmp_path)
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("model: l1 # caf\xe9\n".encode("latin-1"))
    with pytest.raises(UsageError, match="not UTF-8"):
        read_settings_file(bad)


def test_yaml_numbers_written_as_text_are_read():
    # YAML 1.1 reads 1e-3 as a string; a number setting takes it
    assert check_mapping({"lr": "1e-3", "hidden": 64}, "x") == {"lr": 1e-3, "hidden": 64}


def test_sae_config_validate_checks_field_bounds_and_cross_fields():
    with pytest.raises(ValueError, match="--model"):
        SAEConfig(model="pca").validate()
    with pytest.raises(ValueError, match="--hidden"):
        SAEConfig(hidden=0).validate()
    with pytest.raises(ValueError, match="--groups"):
        SAEConfig(hidden=10, groups=3).validate()
    SAEConfig().validate()


def test_a_run_config_is_typed_sections_built_once_and_checked():
    from sae.settings.cli import run_config
    from sae.settings.config import RunConfig

    config = run_config(["--model", "topk", "--k", "8", "--devices", "0,1", "--epochs", "3",
                         "--no-report", "--out", "x"])
    assert (config.sae.model, config.sae.k, config.train.epochs) == ("topk", 8, 3)
    assert config.hardware.devices == [0, 1] and config.output.no_report
    assert config.folder.out == "x" and config.data.dataset == "mnist"
    assert RunConfig.from_settings(config.settings()) == config
    assert config_file_dict(config.settings()) == \
        config_file_dict(vars(resolve_settings(["--model", "topk", "--k", "8", "--devices",
                                                "0,1", "--epochs", "3", "--no-report",
                                                "--out", "x"])))
    with pytest.raises(UsageError, match="--k must be <= --hidden"):
        run_config(["--model", "topk", "--k", "16", "--hidden", "8", "--out", "x"])
    with pytest.raises(UsageError, match="use bf16-mixed"):  # a check of the run, not the model
        run_config(["--precision", "bf16-true", "--out", "x"])


def test_no_module_below_the_entry_point_imports_it():
    """Only sae.run itself, sae.train, the stack runner (each member is checked and claimed as
    sae.run does) and the sweep worker (which runs sae.run's main in its own
    process, as ``python -m sae.run`` would) import sae.run; the settings, checks and process
    helpers it uses live below it."""
    import ast
    from pathlib import Path

    import sae

    root = Path(sae.__file__).parent
    importers = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(n == "sae.runner.command" or n.startswith("sae.runner.command.") for n in names):
                importers.add(path.relative_to(root).as_posix())
    # the entry point, the worker, sae.train (the same command, called from Python) and the
    # stack runner (several such commands trained together)
    assert importers == {"run.py", "sweep/worker.py", "api/train.py", "runner/stack.py"}
