"""``StatefulDataLoader`` is whichever loader ``LOADER_VARIANT`` names (inherited by children)."""

import os

_VARIANT = os.environ.get("LOADER_VARIANT", "torch")

if _VARIANT == "torch":
    from torch.utils.data import DataLoader as StatefulDataLoader
elif _VARIANT == "class":
    from loaderkit import DataLoader as StatefulDataLoader
elif _VARIANT == "function":
    from loaderkit import create_dataloader as StatefulDataLoader
else:
    raise RuntimeError(f"LOADER_VARIANT={_VARIANT!r}: expected torch, class or function")

__all__ = ["StatefulDataLoader"]
