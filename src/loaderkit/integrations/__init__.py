"""Integrations with training frameworks, each behind its own extra.

``loaderkit.integrations.lightning`` needs ``pip install "loaderkit[lightning]"``; loaderkit's
core never imports a framework. Modules: ``loaders`` (framework-neutral: ``find_loaders`` and
``close_loaders``, re-exported here), ``lightning`` (the Lightning callback and helpers).

Imports go down only, to the loader (``loaderkit.loader``); nothing in loaderkit imports
this folder.
"""

from __future__ import annotations

from loaderkit.integrations.loaders import close_loaders, find_loaders

__all__ = ["close_loaders", "find_loaders"]
