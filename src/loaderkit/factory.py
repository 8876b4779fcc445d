"""``create_dataloader``: the function-style name of ``loaderkit.DataLoader``.

It is the class itself, not a wrapper: one signature and one argument documentation, the same
object for ``help``, ``inspect.signature``, type checkers, the docs and frameworks that
rebuild loaders (Lightning records the arguments of ``DataLoader.__init__``; a wrapper that
re-passed them positionally broke its rebuilds). ``create_dataloader[T]`` works in annotations
exactly where code written for torch says ``DataLoader[T]``.

Examples:
    >>> from loaderkit import DataLoader, create_dataloader
    >>> create_dataloader is DataLoader
    True
"""

from __future__ import annotations

from loaderkit.loader import DataLoader

__all__ = ["create_dataloader"]

#: ``create_dataloader(dataset, ...)`` builds a ``loaderkit.DataLoader``; see its arguments.
create_dataloader = DataLoader
