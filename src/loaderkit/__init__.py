"""loaderkit: PyTorch data loading that is correct by default."""

from loaderkit.errors import ConfigError, LoaderkitError, LoaderkitWarning

__version__ = "0.1.0"

__all__ = ["ConfigError", "LoaderkitError", "LoaderkitWarning", "__version__"]
