"""Single-cell batches: what a batch of counts becomes before a model sees it.

Modules:

- ``normalize``: ``normalize_total`` and ``log1p``, scanpy's ``pp.normalize_total`` and
  ``pp.log1p`` on a loaderkit batch (sparse CSR or dense, cells x genes), on its device and in
  its layout.

Runs where the batches are used (the training loop, on the GPU or the CPU), on batches the
loader gave. Imports go down only: ``normalize`` imports torch and ``loaderkit.errors``;
nothing of loaderkit imports this folder but the package root, which makes it reachable as
``loaderkit.singlecell``.

Examples:
    >>> import torch
    >>> from loaderkit.singlecell import log1p, normalize_total
    >>> log1p(normalize_total(torch.tensor([[1, 1]]), target_sum=2))
    tensor([[0.6931, 0.6931]])
"""

from loaderkit.singlecell.normalize import log1p, normalize_total

__all__ = ["log1p", "normalize_total"]
