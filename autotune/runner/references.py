"""The user's code by reference: ``"pkg.module:Name"`` or ``"path/to/file.py:Name"`` imported as
``python -m`` or ``python file.py`` would, its attribute looked up, a factory called, and every
failure of that code a one-line ``WorkloadError`` naming the reference.

The user's code runs as a program run alone would: ``sys.argv`` holds the program's name and no
argument while it is imported or a factory of it is called, so research code that parses its
command line as it loads (``args = parser.parse_args()`` at module level) takes its defaults,
not the tuner's flags or a Ray worker's; where it exits all the same (an argument it requires),
the exit is one line that says why, not a usage message of someone else's program.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.errors import WorkloadError, closest
from autotune.runner.pickled import is_pickled, load_pickled, read_pickled

FILE_MODULE_PREFIX = "autotune_user_"
"""What the name of a module imported from a file outside any package starts with."""
_RUNNING: list[str] = []
"""The programs whose code ``run_alone`` is running now, innermost last."""


def running_user_code() -> str | None:
    """The program whose code autotune is running now (importing it, or calling a factory of
    it), or None: a script that calls the tuner where it loads, outside a ``__main__`` guard,
    would call it again from every import of it."""
    return _RUNNING[-1] if _RUNNING else None


@contextlib.contextmanager
def run_alone(program: str, command: str, what: str, doing: str) -> Iterator[None]:
    """The user's code running as ``program`` (``sys.argv[0]``) with no command-line argument,
    as ``command`` would run it; its ``sys.exit`` (or argparse's) a ``WorkloadError`` saying
    ``what``: ``doing``."""
    argv = sys.argv
    sys.argv = [program]
    _RUNNING.append(program)
    try:
        yield
    except SystemExit as stop:
        raise WorkloadError(
            f"{what}: {doing} called sys.exit({stop.code!r}); autotune runs it with no "
            f"command-line argument, as `{command}` would (code that parses its command line as "
            "it loads, argparse's parse_args(), takes its defaults there): give its required "
            'arguments defaults, or parse them under `if __name__ == "__main__":`'
        ) from None
    finally:
        sys.argv = argv
        _RUNNING.pop()


def _split_reference(reference: str, what: str) -> tuple[str, str]:
    location, sep, attribute = reference.rpartition(":")
    if not sep or not location or not attribute:
        raise WorkloadError(
            f"{what} {reference!r} must look like 'package.module:Name' or 'path/to/file.py:Name'"
        )
    return location, attribute


def import_location(location: str, what: str) -> Any:
    """Import a module given as a dotted name or as a path to a .py file; a file's directory
    goes first on ``sys.path``, as ``python file.py`` puts it, so that the modules beside it
    import."""
    if location.endswith(".py") or "/" in location:
        path = Path(location).expanduser().resolve()
        if not path.is_file():
            raise WorkloadError(f"{what}: file {location!r} does not exist")
        if (packaged := _import_packaged(path, what, location)) is not None:
            return packaged
        name = FILE_MODULE_PREFIX + "_".join(path.with_suffix("").parts[-3:]).replace("-", "_")
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise WorkloadError(f"{what}: {location!r} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        if str(path.parent) not in sys.path:  # its siblings import, as under `python file.py`
            sys.path.insert(0, str(path.parent))
        try:
            with run_alone(str(path), f"python {location}", what, f"importing {location!r}"):
                spec.loader.exec_module(module)
        except BaseException as error:
            del sys.modules[name]
            if isinstance(error, WorkloadError) or not isinstance(error, Exception):
                raise
            raise WorkloadError(
                f"{what}: importing {location!r} raised {type(error).__name__}: {error}"
            ) from error
        return module
    return _import_module(location, what)


def _import_packaged(path: Path, what: str, location: str) -> Any:
    """The module of a file inside a package (its directory holds ``__init__.py``), imported
    by its dotted name from the directory above the outermost package, as ``python -m`` would:
    so that its relative imports (``from .layers import Block``) work. None for a file outside
    any package, or one whose dotted name imports another file (an installed package of that
    name): it is then loaded by itself."""
    parts = [] if path.name == "__init__.py" else [path.stem]
    root = path.parent
    while (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):
        return None
    for directory in (str(path.parent), str(root)):  # siblings import too, as beside a script
        if directory not in sys.path:
            sys.path.insert(0, directory)
    top = importlib.util.find_spec(parts[0])
    if top is None or top.origin is None or Path(top.origin).resolve().parent != root / parts[0]:
        return None  # that name is another package's
    return _import_module(".".join(parts), what, location)


def _import_module(name: str, what: str, location: str | None = None) -> Any:
    """``importlib.import_module(name)``, its failures as one-line ``WorkloadError``s naming
    ``location`` (the name as given)."""
    location = location or name
    try:
        with run_alone(name, f"python -m {name}", what, f"importing {location!r}"):
            return importlib.import_module(name)
    except WorkloadError:
        raise
    except ModuleNotFoundError as error:
        if error.name and location.startswith(error.name):
            raise WorkloadError(
                f"{what}: no module named {location!r} (is it installed or on PYTHONPATH?)"
            ) from None
        raise WorkloadError(
            f"{what}: importing {location!r} raised ModuleNotFoundError: {error}"
        ) from error
    except Exception as error:
        raise WorkloadError(
            f"{what}: importing {location!r} raised {type(error).__name__}: {error}"
        ) from error


def resolve_reference(reference: str, what: str, fresh: bool = False) -> tuple[Any, Any]:
    """Return (module, attribute) for 'module:attr' (attr may be dotted); for an object the
    caller pickled (``autotune.runner.pickled``), the module of its class and the object
    (``fresh``: another copy of it, read from its file again)."""
    if is_pickled(reference):
        load = read_pickled if fresh else load_pickled
        return load(reference, what, import_location)
    location, attribute = _split_reference(reference, what)
    module = import_location(location, what)
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise WorkloadError(
                f"{what}: module {location!r} has no attribute {attribute!r}"
                + _candidates(module, part)
            )
        value = getattr(value, part)
    return module, value


def _candidates(module: Any, missing: str) -> str:
    """What ``module`` offers in place of ``missing``, from the names it exports (``__all__``;
    else those it defines itself): the close ones where there are any, else the first dozen."""
    exported = getattr(module, "__all__", None)
    names = sorted(
        exported
        if isinstance(exported, (list, tuple))
        else (
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
    )
    hint = closest(missing, names, "it defines", n=3, shown=12)
    return f"; {hint}" if hint else ""


def call_factory(factory: Any, reference: str, what: str, *args: Any) -> Any:
    """``factory(*args)``, the user's code that builds what ``reference`` names; its failures
    one-line ``WorkloadError``s."""
    location = reference.rpartition(":")[0] or reference
    try:
        with run_alone(location, f"python {location}", what, f"building {reference!r}"):
            return factory(*args)
    except WorkloadError:
        raise
    except Exception as error:
        raise WorkloadError(
            f"{what} {reference!r} could not be built: {type(error).__name__}: {error}"
        ) from error
