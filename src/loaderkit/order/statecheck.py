"""Whether a saved loader state fits a loader, and where it resumes: ``check_state``.

A loader's state (``loaderkit.DataLoader.state_dict()``) records, beside its position, the
loader's ``fingerprint`` (``loaderkit.order.resume``): dataset length and samples key, batch
size, seed, sampler, world size, elastic order. ``check_state`` compares a saved one with the
loader at hand and refuses what does not fit with a ``ConfigError`` naming each mismatch (a
stateful sampler, e.g. ``WeightedSampler``, checks its own part first); an elastic order may
resume on another world size. It returns a ``ResumePoint``: the epoch, the batches to skip and
the order-defining state to restore.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loaderkit.errors import ConfigError
from loaderkit.plan import counted

__all__ = ["STATE_FORMAT", "STATE_VERSION", "ResumePoint", "check_state"]

#: Identifies a loaderkit loader state (a checkpoint may hold many kinds of state).
STATE_FORMAT = "loaderkit.DataLoader"
#: Version of the state's layout; a newer one is refused with a ConfigError.
STATE_VERSION = 1

#: Fingerprint keys that must match between the saved state and the loader, with their names
#: in error messages.
_MUST_MATCH = {
    "dataset_length": "dataset length",
    "batch_size": "batch_size",
    "drop_last": "drop_last",
    "seed": "seed",
    "sample_seeding": "sample_seeding",
    "sampler": "sampler",
    "batch_sampler": "batch_sampler",
    "num_replicas": "world size (num_replicas of the distributed sampler)",
    "batches_per_pass": "batches per pass",
}

#: Keys an elastic order lets differ (the world size and the per-rank split of a global batch).
_ELASTIC_MAY_DIFFER = frozenset({"batch_size", "sampler", "num_replicas", "batches_per_pass"})


@dataclass(frozen=True)
class ResumePoint:
    """Where a loaded state makes the next pass start.

    Attributes:
        epoch: The epoch of that pass.
        skip: Batches of it to skip at the index level.
        start: The order-defining state to restore when the sampler starts.
    """

    epoch: int
    skip: int
    start: dict[str, Any]


def check_state(
    state: Any, fingerprint: Mapping[str, Any], stateful: Iterable[tuple[str, Any]] = ()
) -> ResumePoint:
    """Validate a saved loader state against a loader's fingerprint; return where to resume.

    Args:
        state: What ``DataLoader.state_dict()`` returned (possibly through ``torch.save`` /
            ``torch.load``).
        fingerprint: The loader's own fingerprint (``DataLoader.state_dict()["loader"]``).
        stateful: The loader's stateful samplers (``OrderSources.stateful``): one with
            ``check_state_dict`` (``WeightedSampler``) checks its part of ``start`` first.

    Both sides elastic with the same order (``fingerprint``'s ``order``): the world size,
    ``batch_size`` and sampler class may differ. With the same global batch the position is
    kept (every rank resumes right after the last global batch); with another one the samples
    already read (``position x saved global batch``) must fill whole global batches of this
    loader, else ``ConfigError`` naming both global batch sizes.

    Returns:
        The epoch, the batches to skip and the order-defining state to restore.

    Raises:
        ConfigError: Not a loaderkit loader state, a newer version, or one taken from a loader
            that differs (each mismatch named, with the saved and current values; a sampler's
            own check, e.g. a ``WeightedSampler`` with other weights); a mid-pass
            state of a loader with ``in_order=False`` (its caller received batches out of order).

    Examples:
        >>> fp = {"dataset_length": 10, "batch_size": 2}
        >>> state = {"format": STATE_FORMAT, "version": 1, "epoch": 1, "batches_yielded": 3,
        ...          "start": {}, "loader": fp}
        >>> check_state(state, fp)
        ResumePoint(epoch=1, skip=3, start={})
        >>> check_state(state, {"dataset_length": 12, "batch_size": 2})
        Traceback (most recent call last):
        ...
        loaderkit.errors.ConfigError: the loader state does not fit this loader: dataset length is 10 in the state and 12 here. ...
    """  # noqa: E501
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise ConfigError(
            "load_state_dict expects the dict a loaderkit DataLoader's state_dict() returned "
            f"(with format={STATE_FORMAT!r}); got {_describe(state)}"
        )
    version = state.get("version")
    if not isinstance(version, int) or not 1 <= version <= STATE_VERSION:
        raise ConfigError(
            f"this loader state has version {version!r}; this loaderkit reads versions 1 to "
            f"{STATE_VERSION}: upgrade loaderkit to resume from it"
        )
    start = state.get("start") or {}
    for name, obj in stateful:
        if callable(getattr(obj, "check_state_dict", None)) and name in start:
            obj.check_state_dict(start[name])
    saved = state.get("loader", {})
    elastic = saved.get("order") is not None and saved.get("order") == fingerprint.get("order")
    problems = [
        f"{label} is {saved.get(key)!r} in the state and {fingerprint.get(key)!r} here"
        for key, label in _MUST_MATCH.items()
        if key in saved and key in fingerprint and saved[key] != fingerprint[key]
        if not (elastic and key in _ELASTIC_MAY_DIFFER)
    ]
    before, now = saved.get("samples_key"), fingerprint.get("samples_key")
    if before is not None and now is not None and before != now:  # a state without: loads
        problems.insert(
            0,
            f"the dataset's chosen samples differ (samples_key {before!r} in the state, "
            f"{now!r} here: other cells=, genes=, join=, build_index() or files)",
        )
    if problems:
        raise ConfigError(
            "the loader state does not fit this loader: "
            + "; ".join(problems)
            + ". A state resumes the loader it was taken from: build the loader with the same "
            "dataset, batch_size, drop_last, seed, sample_seeding, sampler and world size "
            "(num_workers may differ; with a seed and loaderkit's own training sampler the "
            "world size may differ too, for the same global batch)."
        )
    epoch, position = state.get("epoch"), state.get("batches_yielded")
    for name, value in (("epoch", epoch), ("batches_yielded", position)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"the loader state's {name} must be an int >= 0, got {value!r}")
    assert isinstance(epoch, int) and isinstance(position, int)
    if elastic:
        position = _elastic_position(position, epoch, saved, fingerprint)
    total = fingerprint.get("batches_per_pass")
    if isinstance(total, int) and position > total:
        raise ConfigError(
            f"the loader state is at batch {position} of epoch {epoch}, but a pass of this "
            f"loader has {total} batches"
        )
    if position > 0 and saved.get("in_order") is False:
        raise ConfigError(
            f"cannot resume at batch {position} of epoch {epoch}: the loader that "
            "saved this state had in_order=False, so the batches its caller received were "
            "not the first ones of the pass. Resume from a state taken between epochs, or "
            "train with in_order=True (torch's default) where resuming mid-epoch matters."
        )
    return ResumePoint(epoch=epoch, skip=position, start=dict(start))


def _global_batch(fingerprint: Mapping[str, Any]) -> str:
    size, replicas = fingerprint.get("global_batch_size"), fingerprint.get("num_replicas") or 1
    return f"{size} (batch_size {fingerprint.get('batch_size')} x {counted(replicas, 'rank')})"


def _elastic_position(
    position: int, epoch: int, saved: Mapping[str, Any], here: Mapping[str, Any]
) -> int:
    """Batches of this loader to skip for a state of the same elastic order."""
    before, now = saved.get("global_batch_size"), here.get("global_batch_size")
    if not isinstance(before, int) or not isinstance(now, int) or before == now:
        return position
    samples = position * before
    if samples % now:
        raise ConfigError(
            f"the loader state is at global batch {position} of epoch {epoch} with a global "
            f"batch of {_global_batch(saved)} samples; this loader's global batch is "
            f"{_global_batch(here)}, and the {samples} samples already read are not a whole "
            f"number of its global batches. Resume with a global batch of {before} samples "
            f"(world size x batch_size), or one that divides {samples}, or from a state taken "
            "between epochs."
        )
    return samples // now


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"a dict with keys {sorted(map(str, value))[:8]}"
    return f"a {type(value).__name__}"
