"""``WeightedSampler``: torch's ``WeightedRandomSampler`` with epochs, ranks and resume.

One epoch is ``num_samples`` draws of dataset indices, each index with probability
proportional to its weight (with replacement, as ``torch.multinomial(..., True)``; without,
successive draws among the indices not drawn yet, as ``torch.multinomial(..., False)``). The
draws depend only on ``(seed, epoch)`` and the weights: a ``numpy.random.Generator`` from a
``SeedSequence`` of ``(seed, epoch)``, never torch's global RNG, and never anything of a worker
(the sampler runs in the loader's process). Under ``torch.distributed`` the ``num_samples``
draws are one global sequence, cut into global batches of ``num_replicas * batch_size`` as
the loader's own elastic samplers cut theirs (``loaderkit.order.samplers
.global_batch_positions``): the global batches are the same on 1 or N ranks, and a state
resumes on another number of ranks.

The loader tells the sampler what it leaves unset (``bind_loader``): the loader's ``seed``,
``batch_size``, ``drop_last`` and placement among the ranks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from loaderkit import _torch
from loaderkit.errors import ArgumentTypeError, ConfigError, check_int
from loaderkit.machine.distributed import dist_info
from loaderkit.order.samplers import global_batch_count, global_batch_positions
from loaderkit.order.seeding import validate_seed

__all__ = ["WeightedSampler", "check_weights", "weighted_draws"]

#: The first spawn-key word of the draws' ``SeedSequence``: a stream of its own, apart from the
#: loader's epoch seeds (``epoch_seed``: ``spawn_key=(epoch,)``) and the block sampler's.
_STREAM = 0x5745  # "WE"


def check_weights(weights: Any) -> np.ndarray:
    """``weights`` as a read-only 1-D float64 array, or ``ConfigError`` naming what is wrong.

    Accepts what ``torch.as_tensor(weights, dtype=torch.double)`` accepts: a sequence, a numpy
    array or a tensor (on any device). Every weight must be finite and ``>= 0``, and one at
    least ``> 0``.

    Examples:
        >>> check_weights([1, 0, 2.5]).tolist()
        [1.0, 0.0, 2.5]
        >>> check_weights([1.0, -1.0])
        Traceback (most recent call last):
        ...
        loaderkit.errors.ConfigError: WeightedSampler: weights must be finite and >= 0; weights[1] is -1.0 ...
    """  # noqa: E501
    try:
        if isinstance(weights, torch.Tensor):
            array = weights.detach().to("cpu", torch.float64).numpy()
        else:
            array = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ArgumentTypeError(
            "WeightedSampler: weights must be a 1-D sequence, numpy array or tensor of numbers "
            f"(one per sample), got {type(weights).__name__}: {exc}"
        ) from None
    if array.ndim != 1 or array.shape[0] == 0:
        raise ConfigError(
            f"WeightedSampler: weights must be 1-D with one weight per sample, got shape "
            f"{tuple(array.shape)}. Pass a flat sequence (e.g. weights.ravel())."
        )
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(
            f"WeightedSampler: weights must be finite and >= 0; weights[{i}] is {float(array[i])}"
            f" ({bad.size} such weight(s)). Give each sample a weight >= 0 (0: never drawn)."
        )
    if not np.any(array > 0):
        raise ConfigError(
            f"WeightedSampler: all {array.shape[0]} weights are 0, so no sample can be drawn. "
            "Give at least one sample a weight > 0."
        )
    array = np.array(array, dtype=np.float64, copy=True)
    array.flags.writeable = False
    return array


def weighted_draws(
    weights: np.ndarray, num_samples: int, replacement: bool, seed: int, epoch: int
) -> np.ndarray:
    """The ``num_samples`` indices drawn in ``epoch`` (int64), from ``(seed, epoch)`` alone.

    With replacement: ``Generator.choice(n, num_samples, p=weights / sum)``. Without: the
    ``num_samples`` smallest keys ``E_i / w_i`` (``E_i`` exponential), in increasing order,
    which is drawing one index at a time in proportion to the weights of those left (zero
    weights never drawn). Both are vectorised.

    Examples:
        >>> w = np.array([0.0, 1.0, 1.0, 2.0])
        >>> draws = weighted_draws(w, 3, False, seed=0, epoch=0)
        >>> sorted(draws.tolist()) == sorted(set(draws.tolist())), 0 in draws
        (True, False)
        >>> (weighted_draws(w, 5, True, 0, 1) == weighted_draws(w, 5, True, 0, 1)).all()
        np.True_
    """
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_STREAM, epoch)))
    if replacement:
        return rng.choice(weights.shape[0], size=num_samples, p=weights / weights.sum())
    with np.errstate(divide="ignore"):
        keys = rng.standard_exponential(weights.shape[0]) / weights  # weight 0: inf
    first = np.argpartition(keys, num_samples - 1)[:num_samples]
    return first[np.argsort(keys[first], kind="stable")].astype(np.int64)


def _digest(weights: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(weights).tobytes()).hexdigest()[:16]


class WeightedSampler(DistributedSampler[int]):
    """Indices drawn in proportion to their weights: new every epoch, rank-aware, resumable.

    torch's ``WeightedRandomSampler(weights, num_samples, replacement=True)`` with what it
    lacks: draws reproducible from ``(seed, epoch)`` (``set_epoch``, which the loader calls
    every pass), one global sequence of draws shared by the ranks of ``torch.distributed``
    (rank ``r`` reads part ``r`` of every global batch of ``num_replicas * batch_size``
    draws, so the global batches are the same on any number of ranks), and exact mid-epoch
    resume through ``loader.state_dict()``/``load_state_dict()``, on another number of
    workers or ranks too. The same draws for 0 workers, worker processes and threads.

    A ``torch.utils.data.DistributedSampler`` subclass, as loaderkit's other rank-aware
    samplers, so Lightning and Fabric keep it instead of sharding its draws again; its
    ``num_samples`` keeps ``WeightedRandomSampler``'s meaning (draws over all ranks), and
    ``len(sampler)`` is this rank's share.

    Args:
        weights: One weight per dataset index (a sequence, numpy array or tensor), finite and
            ``>= 0``, not all 0; need not sum to 1.
        num_samples: Draws per epoch, over all ranks together.
        replacement: Draw with replacement (an index may come again); ``False``: every index
            at most once per epoch (``num_samples`` at most the number of weights > 0).
        seed: Seed of the draws (``0 <= seed < 2**64``). ``None``: the ``seed`` of the
            loaderkit loader it is given to; without one, ``0`` under several ranks (they must
            agree), else drawn from torch's global RNG when first needed.
        batch_size: Draws per rank per step. ``None``: the loader's ``batch_size`` (1 used
            outside a loaderkit loader).
        num_replicas: Number of ranks. ``None``: the loader's placement (outside a loaderkit
            loader: the ``torch.distributed`` group's, 1 without one).
        rank: This rank. ``None``: as ``num_replicas``.
        drop_last: Drop the last, partial global batch. ``None``: the loader's ``drop_last``.

    Raises:
        ConfigError: Invalid weights (not 1-D, negative, NaN or infinite, all 0),
            ``num_samples < 1``, or without replacement more draws than weights > 0; each
            names the argument. ``ArgumentTypeError`` for a wrong type.

    Examples:
        >>> sampler = WeightedSampler([0.0, 1.0, 3.0], num_samples=8, seed=0)
        >>> draws = list(sampler)
        >>> len(draws), 0 in draws
        (8, False)
        >>> sampler.set_epoch(1); list(sampler) != draws
        True
        >>> from loaderkit import create_dataloader
        >>> loader = create_dataloader(list(range(3)), batch_size=4, seed=0,
        ...                            sampler=WeightedSampler([0.0, 1.0, 3.0], 8))
        >>> [len(b) for b in loader], loader.sampler.seed
        ([4, 4], 0)
    """

    def __init__(
        self,
        weights: Any,
        num_samples: int,
        replacement: bool = True,
        seed: int | None = None,
        *,
        batch_size: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool | None = None,
    ) -> None:
        self.weights = check_weights(weights)
        self.num_samples = check_int("num_samples", num_samples, minimum=1)
        if not isinstance(replacement, bool):
            raise ArgumentTypeError(
                f"WeightedSampler: replacement must be True or False, got {replacement!r}"
            )
        self.replacement = replacement
        nonzero = int(np.count_nonzero(self.weights))
        if not replacement and self.num_samples > nonzero:
            raise ConfigError(
                f"WeightedSampler: num_samples={self.num_samples} draws without replacement, "
                f"but only {nonzero} of the {self.weights.shape[0]} weights are > 0. Draw at "
                f"most {nonzero}, or pass replacement=True."
            )
        self._seed_given = None if seed is None else validate_seed(seed)
        self._seed: int | None = self._seed_given
        self._seed_source = "as given" if seed is not None else ""
        self._given = {
            name
            for name, value in (
                ("batch_size", batch_size),
                ("num_replicas", num_replicas),
                ("rank", rank),
                ("drop_last", drop_last),
            )
            if value is not None
        }
        if num_replicas is None or rank is None:
            info = dist_info()
            num_replicas = info.world_size if num_replicas is None else num_replicas
            rank = info.rank if rank is None else rank
        self._place(batch_size, num_replicas, rank, bool(drop_last))
        self.epoch = 0
        self.shuffle = True  # DistributedSampler's attribute: the order is random
        self.digest = _digest(self.weights)

    def _place(self, batch_size: int | None, num_replicas: int, rank: int, drop_last: bool) -> None:
        self.batch_size = None if batch_size is None else check_int("batch_size", batch_size, 1)
        self.num_replicas = check_int("num_replicas", num_replicas, minimum=1)
        self.rank = check_int("rank", rank, minimum=0)
        if self.rank >= self.num_replicas:
            raise ConfigError(
                f"WeightedSampler: rank must be in [0, {self.num_replicas - 1}] "
                f"(num_replicas={self.num_replicas}), got {self.rank}"
            )
        self.drop_last = drop_last

    def bind_loader(
        self,
        *,
        seed: int | None,
        batch_size: int | None,
        drop_last: bool,
        num_replicas: int,
        rank: int,
        dataset_length: int | None = None,
    ) -> str:
        """Take what the caller left unset from the loader this sampler is given to.

        ``loaderkit.DataLoader`` calls it once, while it plans. Returns the plan's reason.

        Raises:
            ConfigError: ``dataset_length`` (the loader's dataset) is not the number of
                weights.

        Examples:
            >>> s = WeightedSampler([1.0, 1.0], 4)
            >>> s.bind_loader(seed=3, batch_size=2, drop_last=False, num_replicas=1, rank=0)[:40]
            '4 draws per epoch with replacement from '
            >>> s.seed, s.global_batch_size
            (3, 2)
        """
        given = self._given
        self._place(
            self.batch_size if "batch_size" in given else (batch_size or 1),
            self.num_replicas if "num_replicas" in given else num_replicas,
            self.rank if "rank" in given else rank,
            self.drop_last if "drop_last" in given else bool(drop_last),
        )
        if dataset_length is not None and dataset_length != self.weights.shape[0]:
            raise ConfigError(
                f"WeightedSampler: weights has {self.weights.shape[0]} weights, but the "
                f"loader's dataset has {dataset_length} samples: give one weight per sample "
                "(weight 0 for a sample never to be drawn)."
            )
        if self._seed_given is None and seed is not None:
            self._seed, self._seed_source = validate_seed(seed), "the loader's seed"
        elif self._seed_given is None and self._seed_source == "the loader's seed":
            self._seed, self._seed_source = None, ""  # a seed drawn or loaded is kept
        return self.describe()

    def describe(self) -> str:
        """One line: the draws, their seed, and how the ranks share them.

        Examples:
            >>> WeightedSampler([1.0, 2.0], 4, seed=0, num_replicas=1, rank=0).describe()
            '4 draws per epoch with replacement from 2 weights (digest ...), seed 0 (as given); a new sequence every epoch'
        """  # noqa: E501
        how = "with" if self.replacement else "without"
        if self._seed is not None:
            seed = f"seed {self._seed} ({self._seed_source})"
        elif self.num_replicas > 1:
            seed = "seed 0 (no seed given: every rank must agree)"
        else:
            seed = "seed drawn from torch's global RNG when first needed (no seed given)"
        text = (
            f"{self.num_samples} draws per epoch {how} replacement from {self.weights.shape[0]} "
            f"weights (digest {self.digest}), {seed}; a new sequence every epoch"
        )
        if self.num_replicas > 1:
            text += (
                f"; rank {self.rank} of {self.num_replicas} reads part {self.rank} of every "
                f"global batch of {self.num_replicas} x {self.batch_size or 1} draws"
            )
        return text

    @property
    def seed(self) -> int:  # type: ignore[override]
        """The seed of the draws (resolved when first asked for; see ``seed`` above)."""
        if self._seed is None:
            if self.num_replicas > 1:
                self._seed, self._seed_source = 0, "no seed given: every rank must agree"
            else:
                self._seed, self._seed_source = _torch.draw_seed() % 2**63, "drawn"
        return self._seed

    def set_epoch(self, epoch: int) -> None:
        """Draw ``epoch``'s sequence at the next pass (the loader calls it every pass)."""
        self.epoch = check_int("epoch", epoch, minimum=0)

    @property
    def total_size(self) -> int:  # type: ignore[override]
        """Draws all ranks yield per epoch, padding included (``DistributedSampler``'s)."""
        return sum(
            global_batch_count(
                self.num_samples, self.batch_size or 1, self.num_replicas, r, self.drop_last
            )
            for r in range(self.num_replicas)
        )

    @property
    def global_batch_size(self) -> int | None:
        """Draws all ranks read together per step (``None`` before a batch size is known)."""
        return None if self.batch_size is None else self.batch_size * self.num_replicas

    def order_key(self) -> dict[str, Any]:
        """What, besides the seed and the dataset, decides the draws (resume compares it).

        Examples:
            >>> WeightedSampler([1.0, 1.0], 4, seed=0).order_key()["kind"]
            'weighted'
        """
        return {
            "kind": "weighted",
            "weights": self.digest,
            "num_samples": self.num_samples,
            "replacement": self.replacement,
        }

    def global_draws(self) -> np.ndarray:
        """The whole epoch's draws, the same on every rank (what the ranks' parts cut up)."""
        return weighted_draws(
            self.weights, self.num_samples, self.replacement, self.seed, self.epoch
        )

    def indices(self) -> np.ndarray:
        """This rank's draws of the current epoch, in order (what ``iter`` yields)."""
        positions = global_batch_positions(
            self.num_samples, self.batch_size or 1, self.num_replicas, self.rank, self.drop_last
        )
        return self.global_draws()[positions]

    def __iter__(self) -> Iterator[int]:
        yield from self.indices().tolist()

    def __len__(self) -> int:
        return global_batch_count(
            self.num_samples, self.batch_size or 1, self.num_replicas, self.rank, self.drop_last
        )

    def __repr__(self) -> str:
        how = "" if self.replacement else ", replacement=False"
        seed = "" if self._seed is None else f", seed={self._seed}"
        size = self.weights.shape[0]
        return f"WeightedSampler({size} weights, num_samples={self.num_samples}{how}{seed})"

    # ------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        """What decides the draws: the seed, the weights' digest, ``num_samples``, ``replacement``.

        Plain data; the loader keeps it in its own state (``loader.state_dict()["start"]``).

        Examples:
            >>> WeightedSampler([1.0, 1.0], 4, seed=5).state_dict()["seed"]
            5
        """
        return {"seed": self.seed, **self.order_key()}

    def check_state_dict(self, state: Mapping[str, Any]) -> None:
        """Refuse a state of a sampler with other weights, ``num_samples``, ``replacement`` or seed.

        The loader calls it in ``load_state_dict``, before anything else changes.

        Raises:
            ConfigError: Naming what differs, with the saved and current values.

        Examples:
            >>> WeightedSampler([1.0, 2.0], 4, seed=0).check_state_dict(
            ...     WeightedSampler([1.0, 1.0], 4, seed=0).state_dict())
            Traceback (most recent call last):
            ...
            loaderkit.errors.ConfigError: the WeightedSampler's weights differ from the state's ...
        """
        if not isinstance(state, Mapping) or state.get("kind") != "weighted":
            raise ConfigError(
                "the loader state's sampler state is not a WeightedSampler's "
                f"(got {state!r:.80}): resume with the sampler the state was taken with"
            )
        if state.get("weights") != self.digest:
            raise ConfigError(
                f"the WeightedSampler's weights differ from the state's (digest "
                f"{self.digest} here, {state.get('weights')} in the state): the draws would "
                "not be the ones the state continues. Build the sampler with the weights it "
                "was saved with (the same dataset and key for balanced_weights)."
            )
        for name in ("num_samples", "replacement"):
            if state.get(name) != getattr(self, name):
                raise ConfigError(
                    f"the WeightedSampler's {name} is {getattr(self, name)!r} here and "
                    f"{state.get(name)!r} in the state: build it with {name}="
                    f"{state.get(name)!r} to resume"
                )
        fixed = self._seed_given is not None or self._seed_source == "the loader's seed"
        if fixed and state.get("seed") != self._seed:
            raise ConfigError(
                f"the WeightedSampler's seed is {self._seed} here and {state.get('seed')} in "
                "the state: build it with the seed it was saved with to resume"
            )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the draws of ``state`` (from ``state_dict``); its seed where none was set.

        Raises:
            ConfigError: As ``check_state_dict``.
        """
        self.check_state_dict(state)
        seed = state.get("seed")
        if self._seed_given is None and self._seed_source != "the loader's seed":
            self._seed, self._seed_source = validate_seed(seed), "from the loaded state"
