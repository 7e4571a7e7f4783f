"""Objects a pipeline already holds (a built model or a ``partial`` of its class, a dataset, a loss
module, a collator, a ``partial`` of an optimizer), given to the Python API where a reference
would be: pickled once to a file the ranks load, named by a hash of its content, so that the same
object gives the same reference (and a resumed study matches) and another object another one.

The file is a JSON header line, then the pickle. The header names the script being run
(``__main__``) where the caller runs one: a class of that script is pickled as
``__main__.Name``, which in a rank is another program; the rank's unpickler takes it from the
script, imported as ``autotune.runner.references`` imports any file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import pickle
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from autotune.errors import ConfigError, WorkloadError
from autotune.units import format_bytes

PREFIX = "pickled:"
"""How a reference to a pickled object starts (then the file: ``<tmp>/autotune-objects/
<type>-<hash>.pkl``)."""
UNUSED_FOR_S = 7 * 24 * 3600.0
"""A pickled object's file not written, reused or loaded for this long is deleted the next time
an object is pickled (each search or trial writes its own again: only a week-old one goes)."""
SAID_AFTER_S = 2.0
"""Pickling that takes this long is said (with ``say``): otherwise a large dataset's seconds
pass in silence before the first line of a search."""
_HELD: dict[str, tuple[Any, str, str | None]] = {}
"""The objects this process pickled, by reference, with their module and the script's
location: loaded here without a copy."""


def is_pickled(reference: str) -> bool:
    return reference.startswith(PREFIX)


def described(reference: str, flag: str) -> str:
    """How a reference reads in the output: ``--data pkg.module:attr``, or for an object given
    to the API, ``a MyData object given to the API (pickled to <file>)``."""
    if not is_pickled(reference):
        return f"{flag} {reference}"
    path = reference.removeprefix(PREFIX)
    kind = Path(path).name.rpartition("-")[0]
    article = "an" if kind[:1].lower() in tuple("aeiou") else "a"
    return f"{article} {kind} object given to the API (pickled to {path})"


def pickled_reference(
    value: Any, where: str, script: str | None, say: Callable[[str], None] | None = None
) -> str:
    """The reference of ``value`` pickled for the ranks (``where`` names it in an error);
    ``script``: the location the ranks import the script being run by, if any. ``say`` is told
    how long it took where that was ``SAID_AFTER_S`` or more (a large dataset, written whole)."""
    started = time.monotonic()
    origin = (value.func if isinstance(value, functools.partial) else type(value)).__module__
    header = json.dumps(
        {"script": script, "type": type(value).__qualname__, "module": origin}
    ).encode()
    try:
        digest, from_main = _identity(header, value)
    except Exception as error:  # a lambda, an open file, a generator, a lock
        raise ConfigError(
            f"{where}: the ranks get an object by pickling it, and it cannot be pickled "
            f"({type(error).__name__}: {error}); give the class or factory every rank builds it "
            "with, as 'pkg.module:Name' / 'path/to/file.py:Name'"
        ) from None
    if from_main and script is None:
        raise ConfigError(
            f"{where}: holds {', '.join(sorted(from_main))}, defined in an interactive session "
            "(a notebook), which the ranks cannot import; move it to a .py file and import it "
            "from there"
        )
    directory = Path(tempfile.gettempdir()) / "autotune-objects"
    path = directory / f"{type(value).__name__}-{digest[:24]}.pkl"
    _prune(directory)
    done = "hashed: the same content was pickled before"
    if path.exists():  # the same content pickled before (a resumed search): kept, and fresh
        _touch(path)
    else:
        directory.mkdir(exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        with partial.open("wb") as file:
            file.write(header + b"\n")
            _HostPickler(file, sys.modules.get("torch")).dump(value)
        partial.replace(path)  # whole or absent: another process may read it now
        done = f"pickled for the ranks, {format_bytes(path.stat().st_size)}"
    took = time.monotonic() - started
    if say is not None and took >= SAID_AFTER_S:
        say(f"{where}: {done} in {took:.0f} s ({path})")
    reference = PREFIX + str(path)
    _HELD[reference] = (value, origin, script)
    return reference


def release() -> None:
    """Forget the objects this process pickled and loaded: an API call keeps none of its
    caller's objects past its return (a pipeline that tunes dataset after dataset would hold
    every one); a later load reads the file."""
    _HELD.clear()
    load_pickled.cache_clear()


def _prune(directory: Path) -> None:
    """Delete the files of ``directory`` unused for ``UNUSED_FOR_S`` (a search's objects would
    pile up in the temporary directory, a dataset's whole each time it changes)."""
    now = time.time()
    for old in directory.glob("*.p*"):  # a .pkl, or the .part of a process that died writing
        try:
            if now - old.stat().st_mtime > UNUSED_FOR_S:
                old.unlink()
        except OSError:  # another process pruned it first, or it is not ours
            pass


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # read-only, or pruned: the next pickling writes it
        os.utime(path)


def _identity(header: bytes, value: Any) -> tuple[str, set[str]]:
    """The sha256 of ``header`` and ``value``'s pickle with each tensor in it replaced by its
    dtype, shape and a hash of its bytes (torch pickles a tensor's storage with a random
    serialization id, so the same data would pickle to other bytes in every run, and a resumed
    study would not know it), hashed as it is pickled (a large dataset is not held twice); and
    the names of the classes and functions it holds from ``__main__``."""
    digest = hashlib.sha256(header)
    pickler = _IdentityPickler(digest, sys.modules.get("torch"))  # torch only if in use
    pickler.dump(value)
    return digest.hexdigest(), pickler.from_main


class _HostPickler(pickle.Pickler):
    """Pickles a tensor on a device (a model the caller moved to its GPU) as a copy in host
    memory: unpickled as it was, every rank would put its copy on the device it came from (the
    first GPU), not on its own; each rank moves the model to its device itself."""

    def __init__(self, file: Any, torch: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.torch = torch

    def reducer_override(self, obj: Any) -> Any:
        torch = self.torch
        if torch is None or not isinstance(obj, torch.Tensor) or not _on_a_device(obj):
            return NotImplemented
        host = obj.detach().to("cpu", copy=True)
        if isinstance(obj, torch.nn.Parameter):
            return torch.nn.Parameter, (host, obj.requires_grad)
        return _as_given, (host.requires_grad_(obj.requires_grad),)


def _on_a_device(tensor: Any) -> bool:
    """Whether ``tensor`` lives in a device's memory, not the host's (nor on meta)."""
    return tensor.device.type not in ("cpu", "meta")


def _as_given(value: Any) -> Any:
    return value


class _IdentityPickler(pickle.Pickler):
    def __init__(self, digest: Any, torch: Any) -> None:
        file = types.SimpleNamespace(write=digest.update)  # all a pickler writes to
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.torch = torch
        self.from_main: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type | types.FunctionType) and obj.__module__ == "__main__":
            self.from_main.add(obj.__qualname__)
        torch = self.torch
        if torch is None or not isinstance(obj, torch.Tensor):
            return NotImplemented
        try:
            data = obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
            digest = hashlib.sha256(data.numpy().tobytes()).hexdigest()
        except Exception:  # a sparse or quantized tensor: pickled as it is
            return NotImplemented
        return str, (f"tensor {obj.dtype} {tuple(obj.shape)} {digest}",)


@functools.cache
def load_pickled(
    reference: str, what: str, import_location: Callable[[str, str], Any]
) -> tuple[Any, Any]:
    """(module, object): the object ``reference`` holds, this process's own where it pickled
    it, else loaded from its file (once a process), the script's classes from the module
    ``import_location`` gives (``references.import_location``); and the module its class (a
    ``partial``'s function) comes from, where it imports: for a model, where
    ``autotune_dataset`` and the rest beside it are looked up."""
    if reference in _HELD:
        value, origin, script = _HELD[reference]
        return _module(origin, script, import_location), value
    return read_pickled(reference, what, import_location)


def read_pickled(
    reference: str, what: str, import_location: Callable[[str, str], Any]
) -> tuple[Any, Any]:
    """``load_pickled`` from the file every time: another copy of the object at each call (a
    rank's fresh model for each trial, where the model cannot be copied)."""
    path = Path(reference.removeprefix(PREFIX))
    try:
        file = path.open("rb")  # read as it is unpickled: a large dataset is not held twice
    except OSError as error:
        raise _unreadable(what, reference, error) from None
    with file:
        try:
            fields = json.loads(file.readline())
            script, origin = fields["script"], fields["module"]
        except (OSError, ValueError, KeyError) as error:
            raise _unreadable(what, reference, error) from None
        try:
            value = _Unpickler(file, script, import_location).load()
        except WorkloadError:
            raise
        except Exception as error:
            raise WorkloadError(
                f"{what}: the object pickled for the ranks does not load in a rank "
                f"({type(error).__name__}: {error}); give the class or factory that builds it, "
                "as 'pkg.module:Name'"
            ) from None
    _touch(path)  # in use: not pruned while a long search goes on loading it
    return _module(origin, script, import_location), value


def _unreadable(what: str, reference: str, error: Exception) -> WorkloadError:
    return WorkloadError(
        f"{what} {reference!r}: the object pickled for the ranks cannot be read ({error}); "
        "run the search or trial again from the object"
    )


def _module(origin: str, script: str | None, import_location: Callable[[str, str], Any]) -> Any:
    """The module named ``origin`` (``__main__``: the script's), None where it does not import
    here (only the object is needed)."""
    location = script if origin == "__main__" else origin
    if location is None:
        return None
    try:
        return import_location(location, "the module of an object given to the API")
    except WorkloadError:
        return None


class _Unpickler(pickle.Unpickler):
    """Takes what the caller's script defined (``__main__``) from that script."""

    def __init__(
        self, file: BinaryIO, script: str | None, importer: Callable[[str, str], Any]
    ) -> None:
        super().__init__(file)
        self.script = script
        self.importer = importer

    def find_class(self, module: str, name: str) -> Any:
        if module == "__main__" and self.script is not None:
            found: Any = self.importer(self.script, "the script being run")
            for part in name.split("."):
                found = getattr(found, part)
            return found
        return super().find_class(module, name)
