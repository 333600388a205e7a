"""Lazy package exports: a name is imported from its module on first access, then cached.

Every package of the SDK that re-exports names lazily (the top-level package, ``backends``,
``server`` and the framework adapters) declares them once, grouped by the submodule that defines them::

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {"types": ("Prompt",), "pipeline": ("Pipeline",)})

Static type checkers do not run this function, so a package also re-exports the same names under
``if TYPE_CHECKING:`` (``from .types import Prompt as Prompt``); ``tests/test_exports.py`` checks
that the two agree.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports", "require_extra"]


def lazy_exports(
    package: str, modules: Mapping[str, Sequence[str]], *, eager: Sequence[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The module ``__getattr__``, ``__dir__`` and ``__all__`` of ``package``.

    ``modules`` maps each submodule (relative to ``package``, e.g. ``"types"`` or ``"backends.openai"``)
    to the public names it defines; ``eager`` names public attributes the package defines itself
    (``__version__``, constants). Importing the package stays cheap: a submodule (and what it imports,
    e.g. torch) loads when one of its names is first used. A name listed twice is an error.
    """
    exports: dict[str, str] = {}
    for module, names in modules.items():
        for name in names:
            if name in exports or name in eager:
                raise ValueError(f"{package}: {name!r} is exported twice")
            exports[name] = module
    public = sorted([*exports, *eager])

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return list(public)

    return __getattr__, __dir__, public


def require_extra(package: str, extra: str, modules: Sequence[str]) -> None:
    """Refuse to import ``package`` without its extra's ``modules``, naming the install command.

    Only looks the modules up (nothing is imported), so the package's import stays cheap.

    Raises:
        ModuleNotFoundError: a module is missing; the message says ``pip install 'specprefill-sdk[EXTRA]'``.
    """
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package that is missing, or a broken entry
            found = False
        if not found:
            raise ModuleNotFoundError(
                f"{package} needs {name}, which is not installed: pip install 'specprefill-sdk[{extra}]'",
                name=name,
            )
