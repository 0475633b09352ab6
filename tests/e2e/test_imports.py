"""What loads torch, and what must not.

``import iqtrain`` is lazy (PEP 562), the config and the evidence readers import no torch, and
the commands that only read or check (``--help``, ``verify``, ``report``, ``synth``) start
without it: torch costs seconds to import, and ``iqtrain verify`` on a machine without a GPU
stack should not pay that (or need it). Each check runs in a fresh interpreter under
``-X importtime``; a failure names the chain of imports that pulled torch in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cli_tables

import iqtrain
from iqtrain.config.schema import dumps_toml

#: The torch-free folders (docs/design.md "Import layers"): every module in them, and the modules at
#: the top. Two modules of torch folders are torch-free too and stay so (the schedule's plan is
#: read by report-like tools; the FLOP count by the benches).
TORCH_FREE_PACKAGES = ("config", "objectives", "data", "checkpoint", "evidence", "report", "cli")
TORCH_FREE_MODULES = sorted(
    [
        "iqtrain",
        "iqtrain.errors",
        "iqtrain.storage",
        "iqtrain.console",
        "iqtrain.train.schedule",
        "iqtrain.model.flops",
    ]
    + [
        f"iqtrain.{pkg}.{path.stem}" if path.stem != "__init__" else f"iqtrain.{pkg}"
        for pkg in TORCH_FREE_PACKAGES
        for path in (Path(iqtrain.__file__).parent / pkg).glob("*.py")
    ]
)


def _torch_chain(stderr: str) -> list[str] | None:
    """The chain of imports that loaded torch (``torch <- ... <- the first module outside it``)
    from ``-X importtime`` output, in which a module is printed after the modules it imported,
    indented two spaces per level; None if torch was never imported."""
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:"):
            field = line.rsplit("|", 1)[1][1:]  # one space after the bar, then 2 per level
            name = field.lstrip(" ")
            rows.append(((len(field) - len(name)) // 2, name))
    hits = [i for i, (_, name) in enumerate(rows) if name.split(".")[0] == "torch"]
    if not hits:
        return None
    # torch itself when it was imported whole, else the first torch submodule seen.
    i = next((i for i in hits if rows[i][1] == "torch"), hits[0])
    depth, name = rows[i]
    chain = [name]
    for parent_depth, parent in rows[i + 1 :]:
        if parent_depth < depth:
            chain.append(parent)
            depth = parent_depth
    return chain


def _run(*args: str | os.PathLike, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-X", "importtime", *map(os.fspath, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


def _assert_no_torch(proc: subprocess.CompletedProcess, what: str) -> None:
    chain = _torch_chain(proc.stderr)
    assert chain is None, f"{what} imports torch: " + " <- ".join(chain)


# ------------------------------------------------------------------------- modules


@pytest.mark.parametrize("module", TORCH_FREE_MODULES)
def test_module_imports_no_torch(module: str) -> None:
    proc = _run("-c", f"import {module}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    _assert_no_torch(proc, f"import {module}")


def test_the_importtime_parser_sees_torch() -> None:
    # The negative tests above are only as good as this: a chain through
    # iqtrain.model.transformer is found.
    proc = _run("-c", "import iqtrain.model.transformer")
    assert proc.returncode == 0, proc.stderr[-2000:]
    chain = _torch_chain(proc.stderr)
    assert chain is not None and chain[-1] == "iqtrain.model.transformer", chain


def test_config_use_and_package_attributes_stay_torch_free() -> None:
    code = (
        "import sys, iqtrain\n"
        "from iqtrain import Config, ConfigError, load_config\n"
        "from iqtrain.config.sections import ModelConfig, OptimizerConfig, ScheduleConfig\n"
        "from iqtrain.config.schema import build_config, config_to_dict, dumps_toml\n"
        "dumps_toml(config_to_dict(build_config({'training': {'max_steps': 500}})))\n"
        "import iqtrain.config.sections\n"
        "assert iqtrain.config.sections.SYNTH_DATATYPES and isinstance(iqtrain.__version__, str)\n"
        "assert set(iqtrain.__all__) <= set(dir(iqtrain))\n"
    )
    proc = _run("-c", code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _assert_no_torch(proc, "building and writing a config")


# ------------------------------------------------------------------------- the lazy package


#: What ``import iqtrain`` offers (the product: docs/usage.md "Python API"); everything else is
#: imported from the submodule that defines it.
PUBLIC = {
    "load_pretrained",
    "Pretrained",
    "SampleRateWarning",
    "run_attempt",
    "ParentRef",
    "AttemptResult",
    "verify_attempt",
    "load_config",
    "Config",
    "IQDataset",
    "TrainStream",
    "prepare_iq_input",
    "IQTrainError",
    "ConfigError",
    "DataError",
    "CheckpointError",
}


def test_the_package_exports_the_product_alone() -> None:
    assert set(iqtrain._EXPORTS) == PUBLIC
    assert iqtrain.__all__ == [*iqtrain._EXPORTS, "__version__"]


def test_every_public_name_imports_and_is_listed() -> None:
    import importlib

    listed = dir(iqtrain)
    for name in iqtrain.__all__:
        assert name in listed, name
        assert getattr(iqtrain, name) is not None, name
    for name, module in iqtrain._EXPORTS.items():
        assert getattr(iqtrain, name) is getattr(importlib.import_module(module), name), name
    ns: dict = {}
    exec("from iqtrain import *", ns)
    assert set(iqtrain.__all__) <= set(ns)
    assert isinstance(iqtrain.__version__, str) and iqtrain.__version__


def test_what_type_checkers_see_is_the_export_list() -> None:
    # The TYPE_CHECKING block of iqtrain/__init__.py restates _EXPORTS for type checkers (which
    # cannot follow the lazy __getattr__): the same names, each from the same module, each an
    # explicit re-export (``X as X``), and nothing more.
    import ast

    tree = ast.parse(Path(iqtrain.__file__).read_text())
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "_typing.TYPE_CHECKING"
    ]
    seen = {}
    for node in block.body:
        if isinstance(node, ast.AnnAssign):
            assert ast.unparse(node) == "__version__: str"
            continue
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        for alias in node.names:
            assert alias.asname == alias.name, ast.unparse(node)
            assert alias.name not in seen, alias.name
            seen[alias.name] = node.module
    assert seen == iqtrain._EXPORTS


def test_import_iqtrain_and_its_names_of_the_config_and_errors_import_no_torch() -> None:
    code = (
        "import iqtrain\n"
        "from iqtrain import Config, ConfigError, CheckpointError, DataError, IQTrainError\n"
        "assert iqtrain.__all__ and not [m for m in __import__('sys').modules if "
        "m.startswith('iqtrain.') and m.split('.')[1] not in ('config', 'objectives', 'errors')]\n"
    )
    proc = _run("-c", code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _assert_no_torch(proc, "import iqtrain")


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        iqtrain.no_such_name  # noqa: B018
    assert not hasattr(iqtrain, "__wrapped__")


# ------------------------------------------------------------------------- commands


@pytest.fixture(scope="module")
def attempt(tmp_path_factory) -> Path:
    """A finished three-step attempt, trained by ``iqtrain run`` in a child process."""
    root = tmp_path_factory.mktemp("imports")
    tables = cli_tables(root / "run", root / "cache")  # the CLI tests' tiny config
    cfg = root / "cfg.toml"
    cfg.write_text(dumps_toml(tables))
    proc = subprocess.run(
        [sys.executable, "-m", "iqtrain.cli.main", "run", os.fspath(cfg)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root / "run" / "attempts" / "0001"


def test_version_is_the_distributions_and_imports_no_torch() -> None:
    proc = _run("-m", "iqtrain.cli.main", "--version")
    assert proc.returncode == 0 and proc.stdout == f"iqtrain {iqtrain.__version__}\n", proc.stdout
    _assert_no_torch(proc, "iqtrain --version")


@pytest.mark.parametrize(
    "command", [[], ["probe"], ["embed"], ["score"], ["export"]], ids=lambda c: str(c)
)
def test_help_imports_no_torch(command: list[str]) -> None:
    proc = _run("-m", "iqtrain.cli.main", *command, "--help")
    assert proc.returncode == 0 and "usage: iqtrain" in proc.stdout, proc.stderr[-2000:]
    _assert_no_torch(proc, f"iqtrain {' '.join(command)} --help")


@pytest.mark.parametrize(
    "args",
    [["verify"], ["verify", "--data"], ["report"]],
    ids=["verify", "verify-data", "report"],
)
def test_reading_commands_import_no_torch(attempt: Path, args: list[str]) -> None:
    proc = _run("-m", "iqtrain.cli.main", args[0], attempt, *args[1:])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    _assert_no_torch(proc, f"iqtrain {' '.join(args)}")


def _imported(proc: subprocess.CompletedProcess, package: str) -> list[str]:
    """The modules of ``package`` that ``-X importtime`` output says were imported."""
    names = (x.rsplit("|", 1)[1].strip() for x in proc.stderr.splitlines() if "|" in x)
    return [n for n in names if n.split(".")[0] == package]


@pytest.mark.parametrize("args", [["--help"], ["verify"], ["report"]], ids=lambda a: a[0])
def test_commands_that_need_no_model_import_no_wandb(attempt: Path, args: list[str]) -> None:
    # iqtrain.report.live (the live W&B view) sits beside report's readers: wandb is imported
    # only by a run that asks for it.
    proc = _run("-m", "iqtrain.cli.main", *args, *([attempt] if args[0] != "--help" else []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _imported(proc, "wandb") == [], f"iqtrain {args[0]} imports wandb"
    assert _imported(proc, "iqtrain")  # the parser sees imports at all


def test_synth_imports_no_torch(tmp_path: Path) -> None:
    out = tmp_path / "synth"
    args = ["synth", out, "--recordings", "1", "--samples", "1024", "--datatype", "ci8"]
    proc = _run("-m", "iqtrain.cli.main", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list(out.glob("*.sigmf-meta"))) == 1
    _assert_no_torch(proc, "iqtrain synth")
