"""The import rules of ``docs/architecture.md`` ("Rules we keep", 1), read from the source itself.

Each rule names the one module allowed to do a thing; a second module doing it fails here, naming the
file and line, so the rule cannot drift from the code unnoticed.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re
from collections.abc import Callable

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("loader", "workers")

# Top-level packages -> the only modules (paths from the repository root) that may import them.
SOLE_IMPORTERS = {
    "zmq": {"loader/service/transport/sockets.py"},
    "ray": {"loader/service/daemon/ray_launcher.py"},
    "torch": {"loader/device.py"},
    "cupy": {"loader/device.py"},
}
PROCESSES_MODULE = "loader/runtime/processes.py"
# Calls that start a process, by the dotted name they resolve to through the module's imports.
PROCESS_STARTERS = {
    "subprocess.Popen",
    "subprocess.run",
    "subprocess.call",
    "subprocess.check_call",
    "subprocess.check_output",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.popen",
    "os.posix_spawn",
    "os.posix_spawnp",
    "multiprocessing.Process",
    "multiprocessing.Pool",
}
PROCESS_STARTER_PREFIXES = ("os.spawn", "os.exec")
# Attribute calls that start a process whatever they are called on (a multiprocessing context's Process).
PROCESS_STARTER_ATTRS = {"Process", "Pool"}
# loader imports workers only in the CLI's ``loader worker`` command; the launcher names it as a string.
WORKERS_IMPORTERS = {"loader/cli.py"}
# What runs in a worker process never reaches into the daemon's or the trainer's side.
NOT_FOR_WORKERS = ("loader.service.daemon", "loader.service.client", "loader.service.local", "loader.cli")


@functools.cache
def _sources() -> dict[str, ast.Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[path.relative_to(ROOT).as_posix()] = ast.parse(path.read_text(), str(path))
    return found


def _module_name(path: str) -> str:
    parts = path[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: str, tree: ast.Module) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in ``tree``: statements, relative ones resolved, and
    ``importlib.import_module("literal")``."""
    package = _module_name(path).split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
            found.append((node.lineno, module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted name, from the module's imports (``import multiprocessing as mp``: mp)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None


def process_starts(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, call) of every call in ``tree`` that starts a process."""
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases) or ""
        attr = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if name in PROCESS_STARTERS or name.startswith(PROCESS_STARTER_PREFIXES) or attr in PROCESS_STARTER_ATTRS:
            found.append((node.lineno, name or f"....{attr}"))
    return found


def _violations(rule: Callable[[str, ast.Module], list[tuple[int, str]]]) -> str:
    """Every (file:line: what) the rule finds in loader/ and workers/, one a line; empty when none."""
    return "\n".join(f"{path}:{line}: {what}" for path, tree in _sources().items() for line, what in rule(path, tree))


@pytest.mark.parametrize("package", sorted(SOLE_IMPORTERS))
def test_one_module_imports_each_optional_or_transport_library(package):
    allowed = SOLE_IMPORTERS[package]

    def rule(path, tree):
        if path in allowed:
            return []
        return [(line, name) for line, name in imports(path, tree) if name.split(".")[0] == package]

    found = _violations(rule)
    assert not found, f"only {sorted(allowed)} may import {package}:\n{found}"


def test_only_the_processes_module_starts_processes():
    def rule(path, tree):
        return [] if path == PROCESSES_MODULE else process_starts(tree)

    found = _violations(rule)
    assert not found, f"start processes through {PROCESSES_MODULE}:\n{found}"


def test_loader_imports_workers_only_in_the_cli():
    def rule(path, tree):
        if not path.startswith("loader/") or path in WORKERS_IMPORTERS:
            return []
        return [(line, name) for line, name in imports(path, tree) if name.split(".")[0] == "workers"]

    found = _violations(rule)
    assert not found, f"loader names the worker entry as a string (launcher.DEFAULT_WORKER_ENTRY):\n{found}"


def test_workers_import_nothing_of_the_daemon_or_the_client():
    def rule(path, tree):
        if not path.startswith("workers/"):
            return []
        return [(line, name) for line, name in imports(path, tree) if name.startswith(NOT_FOR_WORKERS)]

    found = _violations(rule)
    assert not found, found


# The checks themselves, on code that breaks each rule: a rule that can never fail guards nothing.
BROKEN = {
    "import zmq": ("imports", "zmq"),
    "from zmq.auth import thread": ("imports", "zmq.auth.thread"),
    "import importlib\nimportlib.import_module('torch')": ("imports", "torch"),
    "import subprocess\nsubprocess.Popen(['true'])": ("starts", "subprocess.Popen"),
    "from subprocess import run\nrun(['true'])": ("starts", "subprocess.run"),
    "import os\nos.execv('/bin/true', [])": ("starts", "os.execv"),
    "import multiprocessing as mp\nmp.get_context('spawn').Process(target=print).start()": ("starts", "....Process"),
}


@pytest.mark.parametrize("source", sorted(BROKEN))
def test_the_checks_see_a_broken_rule(source):
    tree = ast.parse(source)
    kind, expected = BROKEN[source]
    path = "loader/service/transport/example.py"
    found = [name for _, name in (imports(path, tree) if kind == "imports" else process_starts(tree))]
    assert expected in found


def test_the_checks_leave_a_type_annotation_alone():
    # reader/pipe.py imports subprocess for Popen's type and TimeoutExpired: that starts nothing.
    source = "import subprocess\ndef reap(proc: subprocess.Popen) -> None:\n    proc.wait(1)\n"
    assert process_starts(ast.parse(source)) == []


# -- the map: docs/architecture.md's table of packages ----------------------------------------------------
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# Rows that list their package's modules one by one (the others describe theirs by what they hold): a module
# added there without its line in the map fails here.
ROWS_LISTING_MODULES = {
    "loader/",
    "loader/config/",
    "loader/runtime/",
    "loader/service/",
    "loader/service/transport/",
    "loader/service/shm/",
    "loader/service/daemon/",
    "loader/service/client/",
    "workers/",
}


def _package_rows() -> dict[str, str]:
    """Package folder -> its row's text, from the table under "## Packages"."""
    rows = {}
    for line in ARCHITECTURE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 2:
            rows[cells[0].split("`")[1]] = cells[1]
    return rows


def _packages_on_disk() -> set[str]:
    return {
        path.parent.relative_to(ROOT).as_posix() + "/"
        for package in PACKAGES
        for path in (ROOT / package).rglob("__init__.py")
    }


def test_the_map_has_a_row_for_each_package_and_no_other():
    assert set(_package_rows()) == _packages_on_disk()


@pytest.mark.parametrize("package", sorted(ROWS_LISTING_MODULES))
def test_the_map_names_every_module_of_a_row_that_lists_them(package):
    row = _package_rows()[package]
    modules = sorted(path.stem for path in (ROOT / package).glob("*.py") if not path.stem.startswith("_"))
    missing = [name for name in modules if f"`{name}`" not in row and f"`{name}.py`" not in row]
    assert not missing, f"docs/architecture.md: the row of {package} does not name {missing}"


# -- paths named in the source ----------------------------------------------------------------------------
# Files of other projects that comments name by their own paths.
OTHER_PROJECTS = {"multiprocessing/connection.py", "numpy/random/bit_generator.py"}


def test_every_path_a_docstring_or_comment_names_exists():
    # A module moved without its references updated leaves readers looking for a file that is not there.
    ours = {path.relative_to(ROOT).as_posix() for path in ROOT.rglob("*.py") if ".venv" not in path.parts}
    stale = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for named in re.findall(r"\b[A-Za-z_][\w/]*/\w+\.py\b", line):
                    if named not in OTHER_PROJECTS and not any(f"/{p}".endswith(f"/{named}") for p in ours):
                        stale.append(f"{path.relative_to(ROOT)}:{number}: {named}")
    assert not stale, "\n".join(stale)


# -- tests mirror the source ------------------------------------------------------------------------------
UNIT_TESTS = ROOT / "tests" / "unit"


def test_unit_test_folders_mirror_the_packages():
    packages = {package.removeprefix("loader/").rstrip("/") for package in _packages_on_disk()} - {"loader"}
    folders = {path.parent.relative_to(UNIT_TESTS).as_posix() for path in UNIT_TESTS.rglob("test_*.py")} - {"."}
    assert folders <= packages, f"tests/unit folders with no package of that name: {sorted(folders - packages)}"


def test_a_subpackages_tests_live_in_its_folder():
    # tests/unit/test_examples_images.py tested loader/examples/images.py: its place is tests/unit/examples/.
    subpackages = {path.parent.name for path in (ROOT / "loader").glob("*/__init__.py")} | {"workers"}
    misplaced = [
        path.name
        for path in UNIT_TESTS.glob("test_*.py")
        if path.stem.removeprefix("test_").split("_")[0] in subpackages
    ]
    assert not misplaced, f"move these under tests/unit/<package>/: {misplaced}"
