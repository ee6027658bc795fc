"""Turn ``"module:attribute"`` strings from a config into Python objects.

Configs name user code (a reader, a provider, mappers, a text parser) by
string, so that a config is plain data that can cross a process or host
boundary; each process resolves the names itself, lazily, when it needs them.

A config's ``import_path`` (by default the config file's directory) is added to
``sys.path`` (at the end: a module beside the config never shadows an installed
one) by ``add_import_path`` before anything is resolved, in the daemon and in
every worker, so ``mappers = ["my_maps:split"]`` finds ``my_maps.py`` beside the
config without ``PYTHONPATH``. When a module is not found, the error names it, the
directories searched and the fix.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Iterable
from typing import Any

from loader.errors import ConfigError

# "package.module:attribute" or "package.module:Class.attribute"
SPEC_PATTERN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def is_spec(text: object) -> bool:
    """True when ``text`` looks like ``"module:attribute"``."""
    return isinstance(text, str) and SPEC_PATTERN.match(text) is not None


def add_import_path(directories: Iterable[str]) -> None:
    """Append ``directories`` to ``sys.path`` (those not there yet); they are searched after the rest."""
    for directory in directories:
        directory = os.path.abspath(directory)
        if directory not in sys.path:
            sys.path.append(directory)
        if directory not in _IMPORT_PATH:
            _IMPORT_PATH.append(directory)


_IMPORT_PATH: list[str] = []  # what add_import_path added, named by the not-found message


def _not_found_hint(module_name: str, exc: BaseException) -> str:
    top = module_name.split(".")[0]
    searched = ", ".join(_IMPORT_PATH) or "(none)"
    if not isinstance(exc, ModuleNotFoundError) or exc.name not in (top, module_name):
        return _failed_inside_hint(module_name, exc, searched)
    return (
        f"; searched sys.path and the config's import_path: {searched}; "
        f"fix: put {top}.py (or the package {top}/) beside the config file, list its directory in the "
        f"config's top-level import_path, or add it to PYTHONPATH"
    )


def _failed_inside_hint(module_name: str, exc: BaseException, searched: str) -> str:
    """Found, but failed inside (its own import of something missing, a bug at import time): the user
    must see which file failed, where it was looked for and what to do, as for a module not found."""
    top = module_name.split(".")[0]
    try:  # the top-level name only: finding a submodule would run its broken package's code again
        origin = getattr(importlib.util.find_spec(top), "origin", None)
    except (ImportError, ValueError):
        origin = None
    where = module_name if not origin else origin if top == module_name else os.path.dirname(origin)
    imported = exc.name.split(".")[0] if isinstance(exc, ImportError) and exc.name else None
    if imported in _SHIPPED_TOP_LEVEL:
        # ``from workers import helper`` in the user's module met loader's own package of that name: the user's
        # code is fine, their module is hidden ("correct it there" sent them the wrong way).
        return (
            f"; {where} imports from {imported!r}, which here is a package of loader itself and hides a module of "
            f"yours of that name: give yours another name (my_{imported})"
        )
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        missing = exc.name.split(".")[0]
        fix = f"install {missing} in this environment, or put {missing}.py beside the config file"
        return (
            f"; {where} imports {exc.name!r}, not found on sys.path or the config's import_path: {searched}; fix: {fix}"
        )
    return (
        f"; the error is inside {where} (found on sys.path or the config's import_path: {searched}); "
        "fix: correct it there (`loader check --debug CONFIG` shows the traceback)"
    )


def import_object(spec: str, *, what: str = "object") -> Any:
    """Import ``"module:attribute"`` and return the attribute.

    ``what`` names the config key in error messages (``"source.reader"``).
    Raises ``ConfigError`` when the spec is malformed, the module cannot be
    imported, or the attribute is missing.
    """
    if not is_spec(spec):
        raise ConfigError(f"{what} must look like 'module:function', got {spec!r}")
    module_name, _, attr_path = spec.partition(":")
    _refuse_the_script(module_name, spec, what)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an ImportError, or user code failing at import time
        raise ConfigError(
            f"{what}: cannot import module {module_name!r} for {spec!r}: {type(exc).__name__}: {exc}"
            f"{_not_found_hint(module_name, exc)}"
        ) from exc
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                f"{what}: module {module_name!r} has no attribute {attr_path!r} (from {spec!r}; "
                f"the module imported is {getattr(module, '__file__', None) or module_name}){_shadowed(module_name)}"
            ) from None
    return obj


def _refuse_the_script(module_name: str, spec: str, what: str) -> None:
    """Refuse code named in the running script: workers never run it (``__main__`` is theirs, not the
    script), and importing the script by its own name would run the training again, in every worker."""
    name = spec.partition(":")[2]
    fix = f"move {name} into a module of its own (my_maps.py beside the config) and name it 'my_maps:{name}'"
    if module_name in ("__main__", "__mp_main__"):
        raise ConfigError(f"{what}: {spec!r} is in the running script, which workers never run: {fix}")
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if not script or module_name in sys.modules:
        return  # already imported: whatever it is, importing it runs nothing again
    try:
        found = importlib.util.find_spec(module_name)
    except Exception:  # a parent package that fails to import (any error): import_module says why, naming the module
        return
    origin = getattr(found, "origin", None)
    try:  # a script read from stdin ("<stdin>"), or moved since it started, is no file to compare
        same = origin is not None and os.path.isfile(origin) and os.path.isfile(script)
        same = same and os.path.samefile(str(origin), script)
    except OSError:
        return
    if same and not _guarded(script):
        raise ConfigError(
            f"{what}: {spec!r} is in the training script {os.path.basename(script)}, which importing would "
            f'run again (in this process and in every worker), having no `if __name__ == "__main__":` '
            f"block: {fix}, or put the training under that guard"
        )


def _guarded(script: str) -> bool:
    """Whether ``script`` has a top-level ``if __name__ == "__main__":`` block: then importing it by its own
    name runs its definitions only (the idiom multiprocessing's spawn relies on too)."""
    try:
        with open(script, "rb") as fh:
            tree = ast.parse(fh.read(), script)
    except (OSError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1:
            sides = [node.test.left, *node.test.comparators]
            names = {side.id for side in sides if isinstance(side, ast.Name)}
            texts = {side.value for side in sides if isinstance(side, ast.Constant)}
            if isinstance(node.test.ops[0], ast.Eq) and names == {"__name__"} and texts == {"__main__"}:
                return True
    return False


# Top-level packages this project installs: a user's module of the same name is not the one imported.
_SHIPPED_TOP_LEVEL = ("loader", "workers")


def _shadowed(module_name: str) -> str:
    top = module_name.split(".")[0]
    if top not in _SHIPPED_TOP_LEVEL:
        return ""
    return f"; {top!r} is a package of loader itself: give your module another name (my_{top}.py)"


def import_shipped_package(name: str) -> None:
    """Import the top-level package ``name`` that ships beside ``loader`` (``workers``) from there.

    A spawned child inherits its parent's ``sys.path``, whose first entry is the training script's
    directory; a ``workers.py`` or ``workers/`` of the user's own there would otherwise be imported
    in place of ours, and every worker would die at start-up naming neither."""
    if name in sys.modules:
        return
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the folder holding loader/
    package = os.path.join(root, name)
    init = os.path.join(package, "__init__.py")
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[package])
    if spec is None or spec.loader is None or not os.path.isfile(init):
        return  # not installed beside loader: the plain import decides
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def rng_parameter(func: Any) -> inspect.Parameter | None:
    """The parameter named ``rng`` by which a resolved mapper asks for a random generator, or None."""
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):  # builtins and C functions without a signature take no rng
        return None
    return parameters.get("rng")


def rng_passing(func: Any) -> str:
    """How a per-sample mapper takes its generator: "plain" (it takes none), "keyword" or "positional".

    ``ValueError`` (one line) when it names an ``rng`` that cannot be passed after the sample: the
    first parameter (the sample's place), or ``*rng`` / ``**rng``."""
    parameter = rng_parameter(func)
    if parameter is None:
        return "plain"
    if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        raise ValueError("its rng is a variadic parameter; name rng as a parameter after the sample")
    names = list(inspect.signature(func).parameters)
    if names.index("rng") == 0:
        raise ValueError("its first parameter is rng, where the sample goes; put rng after the sample")
    return "positional" if parameter.kind is inspect.Parameter.POSITIONAL_ONLY else "keyword"


def call_problem(func: Any, args: int, rng: str = "plain") -> str | None:
    """Why ``func`` cannot be called with ``args`` positional values (and its generator, as ``rng_passing``
    says it takes it), in a few words; None when it can, or when Python cannot tell (a builtin with no
    signature). A mapper of the wrong shape then fails at the config, not at every sample of the epoch."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    values: list[Any] = [object()] * args
    keywords: dict[str, Any] = {}
    if rng == "positional":
        values.append(object())
    elif rng == "keyword":
        keywords["rng"] = object()
    try:
        signature.bind(*values, **keywords)
    except TypeError as exc:
        return str(exc)
    return None


__all__ = [
    "call_problem",
    "import_object",
    "import_shipped_package",
    "add_import_path",
    "is_spec",
    "rng_parameter",
    "rng_passing",
    "SPEC_PATTERN",
]
