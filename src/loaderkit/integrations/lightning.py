"""PyTorch Lightning: close every loader a Trainer used, on success and on exception.

Lightning shuts down the worker processes of the loaders it iterated, but never calls
``dataset.close()`` or ``loader.close()``, so HDF5 files stay open in the main process (and in
persistent workers until they exit); and ``trainer.predict`` (or a DDP run that re-shards)
iterates a *rebuilt copy* of the loader your hook returned, not that object. ``LoaderkitCallback``
closes both: the loaders the trainer holds (``trainer.train_dataloader``,
``val_dataloaders``, ``test_dataloaders``, ``predict_dataloaders``) and every loaderkit
loader built while the stage ran (your ``*_dataloader`` hooks' originals).

Needs Lightning: ``pip install "loaderkit[lightning]"``.

Examples:
    >>> import lightning.pytorch as pl  # doctest: +SKIP
    >>> trainer = pl.Trainer(callbacks=[LoaderkitCallback()])  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any

from loaderkit.integrations.loaders import close_loaders
from loaderkit.loader import loaders_built, loaders_built_since

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "loaderkit.integrations.lightning needs Lightning (the 'lightning' package): "
        'pip install "loaderkit[lightning]"'
    ) from exc

__all__ = ["LoaderkitCallback", "close_trainer_loaders"]

logger = logging.getLogger("loaderkit")


def close_trainer_loaders(trainer: Any) -> int:
    """Close the loaderkit loaders a Lightning ``Trainer`` holds for any stage.

    Use it in ``LightningDataModule.teardown`` (success only) or anywhere a trainer is done;
    ``LoaderkitCallback`` calls it for you, on exceptions too.

    Args:
        trainer: A ``lightning.pytorch.Trainer``.

    Returns:
        How many loaders were closed.

    Examples:
        >>> close_trainer_loaders(trainer)  # doctest: +SKIP
        2
    """
    return close_loaders(
        trainer.train_dataloader,
        trainer.val_dataloaders,
        trainer.test_dataloaders,
        trainer.predict_dataloaders,
    )


class LoaderkitCallback(Callback):
    """Close every loaderkit loader of a stage when it ends, normally or with an exception.

    At ``setup`` it notes which loaders exist; at ``teardown`` (success) or ``on_exception``
    it closes the loaders the trainer iterated and every loaderkit loader built since
    ``setup`` (the objects your hooks returned, which Lightning may have replaced by rebuilt
    copies). Closing stops worker processes and closes datasets (HDF5 files); a loader that is
    used again afterwards simply starts fresh workers and reopens its files.

    Examples:
        >>> import lightning.pytorch as pl  # doctest: +SKIP
        >>> trainer = pl.Trainer(callbacks=[LoaderkitCallback()])  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=dm)  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._mark = 0

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Remember where this stage starts (loaders built from here on are its own)."""
        self._mark = loaders_built()

    def _close(self, trainer: Any) -> None:
        closed = close_loaders(
            trainer.train_dataloader,
            trainer.val_dataloaders,
            trainer.test_dataloaders,
            trainer.predict_dataloaders,
            loaders_built_since(self._mark),
        )
        logger.debug("loaderkit: closed %d loader(s) at the end of the stage", closed)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Close the stage's loaders after it finished."""
        self._close(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Close the stage's loaders when it failed (Lightning skips ``teardown`` then)."""
        self._close(trainer)
