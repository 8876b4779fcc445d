"""Tests of loaderkit.device.transfer: to_device, resolve_non_blocking and DevicePrefetcher.

CPU tests move batches to the ``meta`` device (a real device change available on any machine).
Pinned memory and CUDA streams do not exist here, so the non_blocking wiring and the prefetcher's
stream protocol are checked on CPU with tensor subclasses that say they are pinned and a fake
stream backend that logs every call. The ``cuda`` tests at the end check the same things on a
real GPU and are skipped when none is present.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import types
import typing
import warnings
from collections import OrderedDict, UserDict, defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence
from torch.utils.data import DataLoader, TensorDataset

from loaderkit import _torch
from loaderkit.device.prefetch import DevicePrefetcher
from loaderkit.device.transfer import resolve_non_blocking, to_device
from loaderkit.errors import ConfigError, LoaderkitWarning

META = torch.device("meta")

# ----------------------------------------------------------------------------- helpers


def on_meta(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


Point = collections.namedtuple("Point", ["x", "y"])


class Pair(typing.NamedTuple):
    left: torch.Tensor
    right: Any


class Scaled(collections.namedtuple("Scaled", ["value", "scale"])):
    """A namedtuple whose __new__ transforms its arguments (must not run again on rebuild)."""

    def __new__(cls, value: Any, scale: int) -> Scaled:
        return super().__new__(cls, value, scale * 10)


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    label: int
    extra: Any = None


@dataclasses.dataclass(frozen=True)
class FrozenSample:
    image: torch.Tensor
    names: tuple[str, ...] = ()


@dataclasses.dataclass(slots=True)
class SlotSample:
    image: torch.Tensor


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenSlotSample:
    image: torch.Tensor


POST_INIT_CALLS = 0


@dataclasses.dataclass
class WithDerived:
    image: torch.Tensor
    mask: torch.Tensor = dataclasses.field(init=False)
    never_set: torch.Tensor = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        global POST_INIT_CALLS
        POST_INIT_CALLS += 1
        self.mask = self.image > 0


@dataclasses.dataclass
class NotCopyable:
    image: torch.Tensor
    label: int

    def __copy__(self) -> NotCopyable:
        raise TypeError("no copies")


class TaggedDict(dict):  # type: ignore[type-arg]
    pass


class TaggedList(list):  # type: ignore[type-arg]
    pass


class TaggedTuple(tuple):  # type: ignore[type-arg]
    __slots__ = ()


class FrozenMapping(Mapping[str, Any]):
    """Immutable mapping rebuilt by its constructor (takes a mapping)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class OddMapping(FrozenMapping):
    """A mapping whose constructor takes something else: cannot be rebuilt."""

    def __init__(self, name: str, data: Mapping[str, Any]) -> None:
        super().__init__(data)
        self.name = name


class ToWithFlag:
    """Has ``.to(device, non_blocking=...)``; records what it received."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def to(self, device: Any, non_blocking: bool = False) -> str:
        self.calls.append((device, {"non_blocking": non_blocking}))
        return f"moved-to-{device}"


class ToWithoutFlag:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def to(self, device: Any) -> str:
        self.calls.append(device)
        return "moved"


class ToVarKwargs:
    def __init__(self) -> None:
        self.kwargs: dict[str, Any] | None = None

    def to(self, *args: Any, **kwargs: Any) -> str:
        self.kwargs = kwargs
        return "moved"


class PinnedAware(ToVarKwargs):
    def __init__(self, pinned: bool) -> None:
        super().__init__()
        self.pinned = pinned

    def is_pinned(self) -> bool:
        return self.pinned


def _opaque_to(self: Any, device: Any, **kwargs: Any) -> Any:
    if "non_blocking" in kwargs and not self.accepts_flag:
        raise TypeError("to() got an unexpected keyword argument 'non_blocking'")
    self.calls.append(kwargs)
    if self.fail:
        raise TypeError("bad device type")
    return "moved"


_opaque_to.__signature__ = "unreadable"  # type: ignore[attr-defined]  # inspect.signature fails


class OpaqueTo:
    """``.to`` whose signature cannot be inspected: the TypeError fallback is used."""

    to = _opaque_to

    def __init__(self, accepts_flag: bool, fail: bool = False) -> None:
        self.accepts_flag = accepts_flag
        self.fail = fail
        self.calls: list[dict[str, Any]] = []


class FakeTransferTensor(torch.Tensor):
    """A CPU tensor that claims to be pinned (or not) and records ``.to`` calls.

    It stands in for pinned memory and a CUDA target, which this machine does not have.
    """

    pinned = True
    log: typing.ClassVar[list[tuple[Any, ...]]] = []

    def is_pinned(self, *args: Any, **kwargs: Any) -> bool:
        FakeTransferTensor.log.append(("is_pinned",))
        return type(self).pinned

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        FakeTransferTensor.log.append(("to", args, kwargs))
        return self.as_subclass(torch.Tensor)


class FakePageableTensor(FakeTransferTensor):
    pinned = False


def fake_pinned(*values: float) -> FakeTransferTensor:
    return torch.tensor(values).as_subclass(FakeTransferTensor)


@pytest.fixture(autouse=True)
def _clear_fake_log() -> Iterator[None]:
    FakeTransferTensor.log.clear()
    yield
    FakeTransferTensor.log.clear()


# ----------------------------------------------------------------------------- non_blocking


@pytest.mark.parametrize(
    ("requested", "source", "pinned", "target", "expected"),
    [
        (None, "cpu", True, "cuda", True),
        (None, "cpu", False, "cuda", False),
        (None, "cpu", True, "cpu", False),
        (None, "cpu", True, "mps", False),
        (None, "cpu", True, "meta", False),
        (None, "cuda", False, "cuda", False),
        (None, "cuda", False, "cpu", False),
        (None, "mps", False, "cuda", False),
        (True, "cpu", False, "cpu", True),
        (True, "cuda", False, "cpu", True),
        (True, "cpu", False, "mps", True),
        (False, "cpu", True, "cuda", False),
    ],
)
def test_resolve_non_blocking_table(
    requested: bool | None, source: str, pinned: bool, target: str, expected: bool
) -> None:
    got = resolve_non_blocking(
        requested, source_device_type=source, source_pinned=pinned, target_device_type=target
    )
    assert got is expected


@pytest.mark.parametrize(
    ("tensor_cls", "device", "requested", "expected"),
    [
        (FakeTransferTensor, "cuda", None, True),
        (FakeTransferTensor, "cuda:1", None, True),
        (FakePageableTensor, "cuda", None, False),
        (FakeTransferTensor, "cpu", None, False),
        (FakeTransferTensor, "mps", None, False),
        (FakeTransferTensor, "cuda", False, False),
        (FakePageableTensor, "cuda", True, True),
        (FakePageableTensor, "cpu", True, True),
    ],
)
def test_to_device_passes_the_decided_flag_to_tensor_to(
    tensor_cls: type[FakeTransferTensor], device: str, requested: bool | None, expected: bool
) -> None:
    src = torch.zeros(2).as_subclass(tensor_cls)
    to_device({"x": [src]}, device, non_blocking=requested)
    (call,) = [entry for entry in FakeTransferTensor.log if entry[0] == "to"]
    assert call[1] == (torch.device(device),)
    assert call[2] == {"non_blocking": expected}


def test_is_pinned_only_asked_for_cpu_to_cuda_copies() -> None:
    to_device(fake_pinned(1.0), "cpu")
    to_device(fake_pinned(1.0), "mps")
    assert ("is_pinned",) not in FakeTransferTensor.log
    to_device(fake_pinned(1.0), "cuda")
    assert ("is_pinned",) in FakeTransferTensor.log


# ----------------------------------------------------------------------------- structure


def test_plain_containers_are_rebuilt_with_every_tensor_moved() -> None:
    batch = {
        "x": torch.randn(2, 3),
        "seq": [torch.ones(1), (torch.zeros(2), "label")],
        "n": 3,
        "f": 0.5,
        "s": "text",
        "b": b"raw",
        "none": None,
    }
    out = to_device(batch, META)
    assert type(out) is dict and list(out) == list(batch)
    assert on_meta(out["x"]) and out["x"].shape == (2, 3) and out["x"].dtype == batch["x"].dtype
    assert type(out["seq"]) is list and on_meta(out["seq"][0])
    assert type(out["seq"][1]) is tuple
    assert on_meta(out["seq"][1][0]) and out["seq"][1][1] == "label"
    for key in ("n", "f", "s", "b", "none"):
        assert out[key] is batch[key]


def test_input_batch_is_not_modified() -> None:
    x = torch.ones(2)
    inner = TaggedDict(a=x)
    batch = {"inner": inner, "lst": TaggedList([x]), "od": OrderedDict(a=x)}
    to_device(batch, META)
    assert batch["inner"]["a"] is x and batch["lst"][0] is x and batch["od"]["a"] is x
    assert x.device.type == "cpu"


def test_ordered_dict_keeps_type_and_order() -> None:
    batch = OrderedDict([("z", torch.ones(1)), ("a", torch.zeros(1)), ("m", 1)])
    out = to_device(batch, META)
    assert type(out) is OrderedDict
    assert list(out) == ["z", "a", "m"]
    assert on_meta(out["z"]) and on_meta(out["a"]) and out["m"] == 1


def test_defaultdict_keeps_default_factory() -> None:
    batch: defaultdict[str, list[Any]] = defaultdict(list, x=[torch.ones(1)])
    out = to_device(batch, META)
    assert type(out) is defaultdict
    assert out.default_factory is list
    assert on_meta(out["x"][0])
    assert out["missing"] == []  # the factory still works on the result
    assert "missing" not in batch


def test_dict_and_userdict_subclasses_keep_type_and_attributes() -> None:
    tagged = TaggedDict(x=torch.ones(1))
    tagged.source = "camera"  # type: ignore[attr-defined]

    class Attrs(UserDict):  # type: ignore[type-arg]
        pass

    user = Attrs(x=torch.ones(1))
    user.source = "lidar"  # type: ignore[attr-defined]
    counter = collections.Counter(a=2)

    out_tagged, out_user, out_counter = to_device((tagged, user, counter), META)
    assert type(out_tagged) is TaggedDict and out_tagged.source == "camera"
    assert on_meta(out_tagged["x"])
    assert type(out_user) is Attrs and out_user.source == "lidar" and on_meta(out_user["x"])
    assert user["x"].device.type == "cpu"  # the UserDict's storage was not shared
    assert type(out_counter) is collections.Counter and out_counter == counter


def test_immutable_mappings_are_rebuilt_by_their_constructor() -> None:
    proxy = types.MappingProxyType({"x": torch.ones(1)})
    frozen = FrozenMapping({"x": torch.ones(1), "k": "v"})
    out_proxy, out_frozen = to_device([proxy, frozen], META)
    assert type(out_proxy) is types.MappingProxyType and on_meta(out_proxy["x"])
    assert type(out_frozen) is FrozenMapping and on_meta(out_frozen["x"])
    assert out_frozen["k"] == "v"


def test_mapping_that_cannot_be_rebuilt_becomes_dict_with_a_warning() -> None:
    class Unbuildable(OddMapping):  # a fresh type: the warning is per type
        pass

    batch = Unbuildable("n", {"x": torch.ones(1)})
    with pytest.warns(LoaderkitWarning, match="Unbuildable"):
        out = to_device(batch, META)
    assert type(out) is dict and on_meta(out["x"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = to_device(batch, META)  # warned once per type only
    assert type(again) is dict


def test_list_and_tuple_subclasses_keep_type() -> None:
    tagged = TaggedList([torch.ones(1), 2])
    tagged.note = "kept"  # type: ignore[attr-defined]
    out_list, out_tuple = to_device([tagged, TaggedTuple((torch.ones(1), "a"))], META)
    assert type(out_list) is TaggedList and out_list.note == "kept"
    assert on_meta(out_list[0]) and out_list[1] == 2
    assert type(out_tuple) is TaggedTuple and on_meta(out_tuple[0]) and out_tuple[1] == "a"


def test_namedtuples_keep_type_and_fields() -> None:
    point = Point(torch.ones(2), "tag")
    pair = Pair(torch.zeros(1), [torch.ones(1)])
    scaled = Scaled(torch.ones(1), 2)
    assert scaled.scale == 20
    out_point, out_pair, out_scaled = to_device((point, pair, scaled), META)
    assert type(out_point) is Point and on_meta(out_point.x) and out_point.y == "tag"
    assert type(out_pair) is Pair and on_meta(out_pair.left) and on_meta(out_pair.right[0])
    assert type(out_scaled) is Scaled and out_scaled.scale == 20  # __new__ not re-run


def test_torch_return_types_keep_type() -> None:
    result = torch.max(torch.randn(3, 4), dim=1)
    out = to_device(result, META)
    assert type(out) is type(result)
    assert on_meta(out.values) and on_meta(out.indices)


def test_dataclasses_plain_frozen_and_slotted() -> None:
    samples = [
        Sample(torch.ones(2), 7, extra={"m": torch.zeros(1)}),
        FrozenSample(torch.ones(2), ("a", "b")),
        SlotSample(torch.ones(2)),
        FrozenSlotSample(torch.ones(2)),
    ]
    out = to_device(samples, META)
    for original, moved in zip(samples, out, strict=True):
        assert type(moved) is type(original)
        assert on_meta(moved.image)
        assert original.image.device.type == "cpu"
    assert out[0].label == 7 and on_meta(out[0].extra["m"])
    assert out[1].names == ("a", "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        out[1].image = torch.ones(1)  # type: ignore[misc]  # still frozen


def test_dataclass_init_false_fields_are_moved_and_post_init_not_rerun() -> None:
    sample = WithDerived(torch.tensor([1.0, -1.0]))
    calls = POST_INIT_CALLS
    out = to_device(sample, META)
    assert calls == POST_INIT_CALLS
    assert on_meta(out.image) and on_meta(out.mask) and out.mask.dtype == torch.bool
    assert not hasattr(out, "never_set")


def test_dataclass_that_cannot_be_copied_is_rebuilt_by_its_constructor() -> None:
    out = to_device(NotCopyable(torch.ones(1), 3), META)
    assert type(out) is NotCopyable and on_meta(out.image) and out.label == 3


def test_packed_sequence_moves_with_its_own_to() -> None:
    packed = pack_padded_sequence(torch.randn(2, 3, 1), [3, 2], batch_first=True)
    out = to_device({"seq": packed}, META)
    assert type(out["seq"]) is PackedSequence
    assert on_meta(out["seq"].data)
    assert out["seq"].batch_sizes.device.type == "cpu"  # PackedSequence keeps these on CPU


def test_other_objects_and_classes_are_returned_as_is() -> None:
    import numpy as np

    array = np.arange(3)
    marker = object()
    batch = [array, marker, torch.Tensor, torch.float16, torch.device("cpu"), range(3)]
    out = to_device(batch, META)
    assert all(a is b for a, b in zip(out, batch, strict=True))


def test_shared_references_stay_shared() -> None:
    x = torch.ones(2)
    sub = [x]
    out = to_device({"a": x, "b": x, "s1": sub, "s2": sub}, META)
    assert out["a"] is out["b"]
    assert out["s1"] is out["s2"] and out["s1"][0] is out["a"]


def test_tensor_already_on_target_is_returned_unchanged() -> None:
    x = torch.ones(2)
    assert to_device(x, "cpu") is x


def test_reference_cycle_raises_config_error_naming_the_path() -> None:
    loop: list[Any] = [torch.ones(1)]
    loop.append(loop)
    with pytest.raises(ConfigError, match=r"batch\[1\] refers back to batch "):
        to_device(loop, META)

    outer: dict[str, Any] = {"x": torch.ones(1)}
    inner: list[Any] = [outer]
    outer["inner"] = {"deep": inner}
    with pytest.raises(ConfigError, match=r"batch\['inner'\]\['deep'\]\[0\] refers back to batch"):
        to_device(outer, META)

    sample = Sample(torch.ones(1), 1)
    sample.extra = [sample]
    with pytest.raises(ConfigError, match=r"batch\.extra\[0\] refers back to batch "):
        to_device(sample, META)


# ----------------------------------------------------------------------------- .to() objects


def test_object_with_to_and_non_blocking_receives_the_flag() -> None:
    obj = ToWithFlag()
    assert to_device(obj, "cuda", non_blocking=True) == "moved-to-cuda"
    assert to_device(obj, "cpu", non_blocking=False) == "moved-to-cpu"
    assert obj.calls == [
        (torch.device("cuda"), {"non_blocking": True}),
        (torch.device("cpu"), {"non_blocking": False}),
    ]


def test_object_with_to_without_non_blocking_gets_device_only() -> None:
    obj = ToWithoutFlag()
    assert to_device([obj], "cuda:0", non_blocking=True) == ["moved"]
    assert to_device(obj, "cpu") == "moved"
    assert obj.calls == [torch.device("cuda", 0), torch.device("cpu")]


def test_object_with_var_kwargs_to_receives_the_flag() -> None:
    obj = ToVarKwargs()
    to_device(obj, "cpu", non_blocking=True)
    assert obj.kwargs == {"non_blocking": True}


def test_object_default_flag_follows_its_is_pinned() -> None:
    pinned, pageable, plain = PinnedAware(True), PinnedAware(False), ToVarKwargs()
    to_device([pinned, pageable, plain], "cuda")
    assert pinned.kwargs == {"non_blocking": True}
    assert pageable.kwargs == {} and plain.kwargs == {}
    to_device(pinned, "cpu")  # never asynchronous to the CPU
    assert pinned.kwargs == {}


def test_uninspectable_to_falls_back_on_a_non_blocking_type_error_only() -> None:
    rejecting = OpaqueTo(accepts_flag=False)
    assert to_device(rejecting, "cpu", non_blocking=True) == "moved"
    assert rejecting.calls == [{}]

    accepting = OpaqueTo(accepts_flag=True)
    assert to_device(accepting, "cpu", non_blocking=False) == "moved"
    assert accepting.calls == [{"non_blocking": False}]

    failing = OpaqueTo(accepts_flag=True, fail=True)
    with pytest.raises(TypeError, match="bad device type"):
        to_device(failing, "cpu", non_blocking=True)
    assert failing.calls == [{"non_blocking": True}]  # not retried


# ----------------------------------------------------------------------------- arguments


def test_device_forms() -> None:
    x = torch.ones(1)
    assert to_device(x, "meta").device.type == "meta"
    assert to_device(x, torch.device("meta")).device.type == "meta"
    assert DevicePrefetcher([], 1).device.index == 1
    expected_type = _torch.accelerator_type() or "cuda"
    assert DevicePrefetcher([], 0).device == torch.device(expected_type, 0)


@pytest.mark.parametrize("bad", ["gpu7", "cuda:x", -1])
def test_invalid_device_raises_config_error(bad: Any) -> None:
    with pytest.raises(ConfigError, match="device"):
        to_device(torch.ones(1), bad)


@pytest.mark.parametrize("bad", [True, 1.0, None, [0]])
def test_wrong_device_type_raises_type_error(bad: Any) -> None:
    with pytest.raises(TypeError, match="device must be"):
        to_device(torch.ones(1), bad)


def test_non_blocking_must_be_a_bool_or_none() -> None:
    with pytest.raises(TypeError, match="non_blocking"):
        to_device(torch.ones(1), "cpu", non_blocking=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="non_blocking"):
        DevicePrefetcher([], "cpu", non_blocking="yes")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- prefetcher (CPU)


class CountingLoader:
    """Re-iterable batches that count how many passes were started."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.passes = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.passes += 1
        for i in range(self.n):
            yield {"x": torch.full((2,), float(i + 100 * self.passes)), "i": i}


def test_prefetcher_cpu_pass_through_yields_loader_batches() -> None:
    batches = [{"x": torch.randn(3), "meta": ("a", 1)} for _ in range(4)]
    out = list(DevicePrefetcher(batches, "cpu"))
    assert len(out) == 4
    for original, got in zip(batches, out, strict=True):
        assert got["x"] is original["x"]  # already on the CPU: no copy
        assert got["meta"] == ("a", 1)


def test_prefetcher_non_cuda_device_applies_to_device() -> None:
    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)
    out = list(DevicePrefetcher(loader, META))
    assert [b[0].shape[0] for b in out] == [4, 4, 2]
    assert all(on_meta(b[0]) for b in out)


def test_prefetcher_is_reiterable_one_pass_per_iter() -> None:
    loader = CountingLoader(3)
    prefetcher = DevicePrefetcher(loader, "cpu")
    first = [b["x"][0].item() for b in prefetcher]
    second = [b["x"][0].item() for b in prefetcher]
    assert loader.passes == 2
    assert first == [100.0, 101.0, 102.0]
    assert second == [200.0, 201.0, 202.0]


def test_prefetcher_follows_a_shuffling_loader_each_epoch() -> None:
    data = TensorDataset(torch.arange(12.0))
    loader = DataLoader(
        data, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    reference = DataLoader(
        data, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    prefetcher = DevicePrefetcher(loader, "cpu")
    for _ in range(2):
        got = [b[0].tolist() for b in prefetcher]
        expected = [b[0].tolist() for b in reference]
        assert got == expected
    assert sorted(itertools.chain.from_iterable(got)) == list(range(12))


def test_prefetcher_is_lazy() -> None:
    loader = CountingLoader(2)
    iterator = iter(DevicePrefetcher(loader, "cpu"))
    assert loader.passes == 0
    next(iterator)
    assert loader.passes == 1


def test_prefetcher_len() -> None:
    assert len(DevicePrefetcher([1, 2, 3], "cpu")) == 3
    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)
    assert len(DevicePrefetcher(loader, "cpu")) == 3
    with pytest.raises(TypeError, match="len"):
        len(DevicePrefetcher(iter([1, 2]), "cpu"))
    with pytest.raises(TypeError, match="len"):
        len(DevicePrefetcher(CountingLoader(2), "cpu"))


def test_prefetcher_over_a_generator_gives_one_pass() -> None:
    prefetcher = DevicePrefetcher((torch.full((1,), float(i)) for i in range(3)), "cpu")
    assert [t.item() for t in prefetcher] == [0.0, 1.0, 2.0]
    assert list(prefetcher) == []


def test_prefetcher_over_an_empty_loader() -> None:
    assert list(DevicePrefetcher([], "cpu")) == []
    assert (
        list(DevicePrefetcher(DataLoader(TensorDataset(torch.zeros(0)), batch_size=2), META)) == []
    )


class Boom(RuntimeError):
    pass


def failing_loader(n_good: int) -> Iterator[torch.Tensor]:
    for i in range(n_good):
        yield torch.full((1,), float(i))
    raise Boom("worker died")


def test_prefetcher_propagates_loader_errors_after_the_good_batches() -> None:
    got: list[float] = []
    with pytest.raises(Boom, match="worker died"):
        for t in DevicePrefetcher(failing_loader(2), "cpu"):
            got.append(t.item())
    assert got == [0.0, 1.0]


def test_prefetcher_rejects_non_iterables() -> None:
    with pytest.raises(TypeError, match="iterable"):
        DevicePrefetcher(42, "cpu")  # type: ignore[arg-type]


def test_prefetcher_cuda_without_cuda_raises_config_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    prefetcher = DevicePrefetcher([torch.ones(1)], "cuda")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        next(iter(prefetcher))


def test_prefetcher_attributes_set_epoch_close_and_context_manager() -> None:
    class Loader(list):  # type: ignore[type-arg]
        def __init__(self) -> None:
            super().__init__([torch.ones(1)])
            self.epochs: list[int] = []
            self.closed = 0

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

        def close(self) -> None:
            self.closed += 1

    loader = Loader()
    with DevicePrefetcher(loader, "cpu") as prefetcher:
        assert prefetcher.loader is loader
        assert prefetcher.device == torch.device("cpu")
        assert prefetcher.non_blocking is None
        assert prefetcher.stream is None
        prefetcher.set_epoch(4)
        assert repr(prefetcher).endswith("(loader=<Loader>, device='cpu')")
    assert loader.epochs == [4]
    assert loader.closed == 1

    plain = DevicePrefetcher([1], "cpu")
    with pytest.raises(AttributeError, match=r"sampler\.set_epoch"):
        plain.set_epoch(1)
    plain.close()  # nothing to close: no error


# ----------------------------------------------------------------------------- stream protocol
#
# The CUDA path of the prefetcher, run against fake streams and events that log every call.
# Tensors stand in for pinned host memory and their CUDA copies.

LOG: list[tuple[Any, ...]] = []


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name

    def wait_stream(self, other: FakeStream) -> None:
        LOG.append(("wait_stream", self.name, other.name))

    def wait_event(self, event: FakeEvent) -> None:
        LOG.append(("wait_event", self.name, event.number))


class FakeEvent:
    def __init__(self, number: int) -> None:
        self.number = number
        self.done = True  # a copy completes at once unless a test says otherwise

    def record(self, stream: FakeStream) -> None:
        LOG.append(("record", self.number, stream.name))

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        LOG.append(("synchronize", self.number))
        self.done = True


class FakeBackend:
    def __init__(self) -> None:
        self.current = FakeStream("consumer")
        self.streams_created = 0
        self.events_created = 0

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def new_stream(self, device: torch.device) -> FakeStream:
        assert device == torch.device("cuda", 0)
        self.streams_created += 1
        return FakeStream(f"side{self.streams_created}")

    def current_stream(self, device: torch.device) -> FakeStream:
        return self.current

    @contextlib.contextmanager
    def use_stream(self, stream: FakeStream) -> Iterator[None]:
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous

    def new_event(self) -> FakeEvent:
        self.events_created += 1
        return FakeEvent(self.events_created)


BACKEND: FakeBackend | None = None


class FakeCudaTensor(torch.Tensor):
    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)

    def record_stream(self, stream: Any) -> None:  # type: ignore[override]
        LOG.append(("record_stream", int(self.as_subclass(torch.Tensor)[0]), stream.name))


class FakeHostTensor(torch.Tensor):
    pinned = True

    def is_pinned(self, *args: Any, **kwargs: Any) -> bool:
        return type(self).pinned

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        assert BACKEND is not None
        value = int(self.as_subclass(torch.Tensor)[0])
        LOG.append(("copy", value, BACKEND.current.name, kwargs["non_blocking"]))
        return self.as_subclass(torch.Tensor).clone().as_subclass(FakeCudaTensor)


class FakePageableHostTensor(FakeHostTensor):
    pinned = False


def host_batches(n: int, cls: type[FakeHostTensor] = FakeHostTensor) -> list[dict[str, Any]]:
    return [{"x": torch.full((2,), float(i)).as_subclass(cls), "name": f"b{i}"} for i in range(n)]


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBackend]:
    global BACKEND
    BACKEND = FakeBackend()
    monkeypatch.setattr(DevicePrefetcher, "_backend", BACKEND)
    LOG.clear()
    yield BACKEND
    BACKEND = None
    LOG.clear()


def consume(prefetcher: DevicePrefetcher[Any]) -> list[Any]:
    out = []
    for batch in prefetcher:
        LOG.append(("consume", int(batch["x"].as_subclass(torch.Tensor)[0])))
        out.append(batch)
    return out


def stage(i: int, event: int, side: str = "side1", consumer: str = "consumer") -> list[Any]:
    return [("wait_stream", side, consumer), ("copy", i, side, True), ("record", event, side)]


def hand_out(i: int, event: int, consumer: str = "consumer") -> list[Any]:
    return [("wait_event", consumer, event), ("record_stream", i, consumer), ("consume", i)]


def test_protocol_copies_one_ahead_and_hands_out_after_the_copy(fake_cuda: FakeBackend) -> None:
    prefetcher = DevicePrefetcher(host_batches(3), "cuda")
    out = consume(prefetcher)
    expected = [
        *stage(0, 1),
        *stage(1, 2),  # batch 1 is queued before batch 0 is handed out
        *hand_out(0, 1),
        *stage(2, 3),
        *hand_out(1, 2),
        *hand_out(2, 3),
    ]
    assert expected == LOG
    assert [b["name"] for b in out] == ["b0", "b1", "b2"]
    assert all(type(b["x"]) is FakeCudaTensor for b in out)


def test_protocol_creates_the_side_stream_once_across_epochs(fake_cuda: FakeBackend) -> None:
    prefetcher = DevicePrefetcher(host_batches(2), torch.device("cuda"))
    for _ in range(3):
        assert len(consume(prefetcher)) == 2
    assert fake_cuda.streams_created == 1
    assert prefetcher.stream is not None and prefetcher.stream.name == "side1"
    assert {entry[2] for entry in LOG if entry[0] == "copy"} == {"side1"}


def test_protocol_uses_the_current_stream_at_each_next(fake_cuda: FakeBackend) -> None:
    prefetcher = DevicePrefetcher(host_batches(2), "cuda:0")
    iterator = iter(prefetcher)
    next(iterator)
    fake_cuda.current = FakeStream("other")
    next(iterator)
    assert LOG[-2:] == [("wait_event", "other", 2), ("record_stream", 1, "other")]


def test_protocol_warns_once_about_pageable_memory(fake_cuda: FakeBackend) -> None:
    prefetcher = DevicePrefetcher(host_batches(2, FakePageableHostTensor), "cuda")
    with pytest.warns(LoaderkitWarning, match="pin_memory=True") as record:
        consume(prefetcher)
        consume(prefetcher)
    assert len(record) == 1
    assert {entry[3] for entry in LOG if entry[0] == "copy"} == {False}


def test_protocol_honours_explicit_non_blocking_false(fake_cuda: FakeBackend) -> None:
    prefetcher = DevicePrefetcher(host_batches(2), "cuda", non_blocking=False)
    consume(prefetcher)  # pinned: no LoaderkitWarning (pytest would turn it into an error)
    assert {entry[3] for entry in LOG if entry[0] == "copy"} == {False}


def test_protocol_loader_error_arrives_after_the_staged_batch(fake_cuda: FakeBackend) -> None:
    def loader() -> Iterator[dict[str, Any]]:
        yield from host_batches(2)
        raise Boom("disk gone")

    got = []
    with pytest.raises(Boom, match="disk gone"):
        for batch in DevicePrefetcher(loader(), "cuda"):
            got.append(batch["name"])
    assert got == ["b0", "b1"]


def test_protocol_empty_loader_and_early_break(fake_cuda: FakeBackend) -> None:
    assert list(DevicePrefetcher([], "cuda")) == []
    assert LOG == []

    prefetcher = DevicePrefetcher(host_batches(4), "cuda")
    for _ in prefetcher:
        break
    assert [entry[1] for entry in LOG if entry[0] == "copy"] == [0, 1]
    LOG.clear()
    assert [b["name"] for b in prefetcher] == ["b0", "b1", "b2", "b3"]


def test_protocol_records_tensors_inside_to_objects(fake_cuda: FakeBackend) -> None:
    class Holder:
        def __init__(self, t: torch.Tensor) -> None:
            self.t = t

        def to(self, device: torch.device, non_blocking: bool = False) -> tuple[Any, ...]:
            return (self.t.to(device, non_blocking=non_blocking), "holder")

    batches = [
        {
            "x": torch.full((1,), 5.0).as_subclass(FakeHostTensor),
            "h": Holder(torch.full((1,), 7.0).as_subclass(FakeHostTensor)),
        }
    ]
    (batch,) = list(DevicePrefetcher(batches, "cuda"))
    assert batch["h"][1] == "holder"
    recorded = sorted(entry[1] for entry in LOG if entry[0] == "record_stream")
    assert recorded == [5, 7]


# Blocking copies (pageable memory, non_blocking=False) skip the side stream: each batch is
# copied on the consumer stream when it is handed out, as a plain to_device loop does.


def plain_hand_out(i: int, non_blocking: bool = False, consumer: str = "consumer") -> list[Any]:
    return [("copy", i, consumer, non_blocking), ("consume", i)]


def test_protocol_pageable_batches_are_copied_on_the_consumer_stream(
    fake_cuda: FakeBackend,
) -> None:
    prefetcher = DevicePrefetcher(host_batches(3, FakePageableHostTensor), "cuda")
    with pytest.warns(LoaderkitWarning, match="pageable.*plain loop.*pin_memory=True"):
        out = consume(prefetcher)
    assert [*plain_hand_out(0), *plain_hand_out(1), *plain_hand_out(2)] == LOG
    assert fake_cuda.events_created == 0  # no event, no wait_stream, no record_stream
    assert [b["name"] for b in out] == ["b0", "b1", "b2"]
    assert all(type(b["x"]) is FakeCudaTensor for b in out)


def test_protocol_pageable_copy_uses_the_stream_current_at_hand_out(
    fake_cuda: FakeBackend,
) -> None:
    prefetcher = DevicePrefetcher(host_batches(2, FakePageableHostTensor), "cuda")
    with pytest.warns(LoaderkitWarning, match="pageable"):
        iterator = iter(prefetcher)
        next(iterator)
        fake_cuda.current = FakeStream("other")
        next(iterator)
    assert LOG[-1] == ("copy", 1, "other", False)


def test_protocol_explicit_non_blocking_false_skips_the_side_stream(
    fake_cuda: FakeBackend,
) -> None:
    consume(DevicePrefetcher(host_batches(2), "cuda", non_blocking=False))  # pinned: no warning
    assert [*plain_hand_out(0), *plain_hand_out(1)] == LOG
    assert fake_cuda.events_created == 0


def test_protocol_pinned_and_pageable_batches_in_one_pass(fake_cuda: FakeBackend) -> None:
    batches = host_batches(3)
    batches[1] = host_batches(2, FakePageableHostTensor)[1]
    with pytest.warns(LoaderkitWarning, match="pageable"):
        out = consume(DevicePrefetcher(batches, "cuda"))
    expected = [
        *stage(0, 1),
        *hand_out(0, 1),  # batch 1 is pageable: nothing queued for it ahead of time
        *stage(2, 2),
        *plain_hand_out(1),
        *hand_out(2, 2),
    ]
    assert expected == LOG
    assert [b["name"] for b in out] == ["b0", "b1", "b2"]


def test_protocol_one_pageable_tensor_makes_the_whole_batch_a_plain_copy(
    fake_cuda: FakeBackend,
) -> None:
    batch = {
        "x": torch.full((1,), 1.0).as_subclass(FakeHostTensor),  # pinned
        "y": [torch.full((1,), 2.0).as_subclass(FakePageableHostTensor)],
    }
    with pytest.warns(LoaderkitWarning, match="pageable"):
        (out,) = list(DevicePrefetcher([batch], "cuda"))
    copies = sorted(entry[1:] for entry in LOG if entry[0] == "copy")
    assert copies == [(1, "consumer", True), (2, "consumer", False)]  # to_device's own flags
    assert fake_cuda.events_created == 0
    assert type(out["x"]) is FakeCudaTensor and type(out["y"][0]) is FakeCudaTensor


def test_protocol_to_objects_that_say_they_are_pageable(fake_cuda: FakeBackend) -> None:
    class Pageable:
        def __init__(self, value: float) -> None:
            self.value = value

        def is_pinned(self) -> bool:
            return False

        def to(self, device: torch.device, non_blocking: bool = False) -> str:
            assert BACKEND is not None
            LOG.append(("copy", self.value, BACKEND.current.name, non_blocking))
            return "moved"

    with pytest.warns(LoaderkitWarning, match="pageable"):
        (out,) = list(DevicePrefetcher([{"p": Pageable(3.0)}], "cuda"))
    assert out == {"p": "moved"}
    assert LOG == [("copy", 3.0, "consumer", False)]


def test_pageable_detection_walks_what_to_device_walks() -> None:
    from loaderkit.device.transfer import holds_pageable_memory as _holds_pageable_memory

    pinned = torch.ones(1).as_subclass(FakeHostTensor)
    pageable = torch.ones(1).as_subclass(FakePageableHostTensor)
    on_gpu = torch.ones(1).as_subclass(FakeCudaTensor)
    assert not _holds_pageable_memory({"ids": [1, 2], "name": "x", "none": None})
    assert not _holds_pageable_memory({"x": pinned, "y": (on_gpu, Point(pinned, 2))})
    assert _holds_pageable_memory(torch.ones(2))  # a real CPU tensor here: never pinned
    assert _holds_pageable_memory({"a": [pinned, {"b": Point(1, pageable)}]})
    assert _holds_pageable_memory(Sample(pageable, 1))
    assert _holds_pageable_memory(Pair(pinned, [pageable]))
    assert not _holds_pageable_memory(Sample(pinned, 1, extra=on_gpu))
    shared = [pinned]
    assert not _holds_pageable_memory([shared, shared, (shared,)])


# ----------------------------------------------------------------------------- CUDA


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _busy(cycles: int = 200_000_000) -> None:
    """Queue roughly 0.1 s of GPU work on the current stream."""
    torch.cuda._sleep(cycles)


class EpochBatches:
    """Pinned batches whose values differ per epoch: batch i of epoch e is filled with 1000e+i."""

    def __init__(self, n: int, numel: int = 1 << 20) -> None:
        self.n, self.numel, self.epoch = n, numel, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[torch.Tensor]:
        self.epoch += 1
        for i in range(self.n):
            value = float(1000 * self.epoch + i)
            yield torch.full((self.numel,), value, dtype=torch.float64).pin_memory()


@pytest.mark.cuda
@requires_cuda
class TestOnCuda:
    def test_values_and_structure_after_transfer(self) -> None:
        batch = {
            "x": torch.randn(4, 5).pin_memory(),
            "y": [torch.arange(3), "s"],
            "p": Point(torch.ones(2).pin_memory(), 3),
            "d": Sample(torch.randn(2), 1),
        }
        out = to_device(batch, "cuda")
        torch.cuda.synchronize()
        assert out["x"].device.type == "cuda" and out["p"].x.device.type == "cuda"
        torch.testing.assert_close(out["x"].cpu(), batch["x"])
        torch.testing.assert_close(out["y"][0].cpu(), batch["y"][0])
        torch.testing.assert_close(out["d"].image.cpu(), batch["d"].image)
        assert out["y"][1] == "s" and out["p"].y == 3 and type(out["p"]) is Point

    def test_pinned_source_copies_asynchronously(self) -> None:
        pinned = torch.empty(16 << 20, dtype=torch.uint8).pin_memory()
        pageable = torch.empty(16 << 20, dtype=torch.uint8)
        stream = torch.cuda.current_stream()

        torch.cuda.synchronize()
        _busy()
        to_device(pinned, "cuda")
        assert not stream.query(), "a pinned copy should return while the GPU is still busy"
        torch.cuda.synchronize()

        _busy()
        to_device(pageable, "cuda")
        assert stream.query(), "a pageable copy is blocking"

        _busy()
        to_device(pinned, "cuda", non_blocking=False)
        assert stream.query(), "explicit non_blocking=False is honoured"

    def test_cuda_to_cpu_is_blocking_by_default(self) -> None:
        source = torch.full((1 << 20,), 3.0, device="cuda")
        _busy()
        out = to_device(source, "cpu")
        assert torch.cuda.current_stream().query()
        assert float(out[0]) == 3.0

    def test_integer_and_indexless_devices(self) -> None:
        index = torch.cuda.current_device()
        assert to_device(torch.ones(1), index).device == torch.device("cuda", index)
        (batch,) = list(DevicePrefetcher([torch.ones(1).pin_memory()], "cuda"))
        assert batch.device == torch.device("cuda", index)

    def test_prefetcher_matches_plain_to(self) -> None:
        data = TensorDataset(torch.randn(40, 8), torch.arange(40))
        loader = DataLoader(data, batch_size=6, pin_memory=True)
        prefetcher = DevicePrefetcher(loader, "cuda")
        for _ in range(2):
            got = list(prefetcher)
            expected = [to_device(b, "cuda") for b in loader]
            assert len(got) == len(expected) == len(loader)
            for g, e in zip(got, expected, strict=True):
                assert type(g) is type(e) and g[0].is_cuda and g[1].is_cuda
                torch.testing.assert_close(g[0], e[0])
                torch.testing.assert_close(g[1], e[1])

    def test_side_stream_created_once_and_memory_does_not_grow(self) -> None:
        loader = DataLoader(TensorDataset(torch.randn(64, 4096)), batch_size=8, pin_memory=True)
        prefetcher = DevicePrefetcher(loader, "cuda")
        streams = []
        reserved = []
        for _ in range(6):
            for (x,) in prefetcher:
                (x * 2).sum()
            torch.cuda.synchronize()
            streams.append(prefetcher.stream)
            reserved.append(torch.cuda.memory_reserved())
        assert streams[0] is not None and all(s is streams[0] for s in streams)
        assert streams[0] != torch.cuda.current_stream()
        assert reserved[-1] <= reserved[1], f"reserved memory grew per epoch: {reserved}"

    def test_consumer_work_on_batch_k_is_safe_while_k_plus_1_copies(self) -> None:
        loader = EpochBatches(8)
        sums = []
        for x in DevicePrefetcher(loader, "cuda"):
            _busy(50_000_000)  # the consumer is slow: its reads of x are queued late
            x.mul_(2)
            sums.append(x.sum())
            del x  # released while the queued work still needs it
        torch.cuda.synchronize()
        expected = [2.0 * (1000 + i) * loader.numel for i in range(8)]
        assert [s.item() for s in sums] == expected

    def test_consumer_waits_for_a_slow_copy(self) -> None:
        loader = EpochBatches(4)
        prefetcher = DevicePrefetcher(loader, "cuda")
        list(prefetcher)  # epoch 1 creates the side stream
        torch.cuda.synchronize()
        with torch.cuda.stream(prefetcher.stream):
            _busy(400_000_000)  # every copy of epoch 2 is queued behind this
        firsts = [x[:1].clone() for x in prefetcher]
        torch.cuda.synchronize()
        assert [float(f) for f in firsts] == [2000.0, 2001.0, 2002.0, 2003.0]

    def test_pageable_batches_warn_once(self) -> None:
        loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2, pin_memory=False)
        prefetcher = DevicePrefetcher(loader, "cuda")
        with pytest.warns(LoaderkitWarning, match="pageable") as record:
            list(prefetcher)
            list(prefetcher)
        assert len(record) == 1

    def test_consumer_on_a_non_default_stream(self) -> None:
        loader = EpochBatches(4)
        consumer = torch.cuda.Stream()
        with torch.cuda.stream(consumer):
            sums = []
            for x in DevicePrefetcher(loader, "cuda"):
                _busy(50_000_000)
                sums.append(x.sum())
        torch.cuda.synchronize()
        assert [s.item() for s in sums] == [(1000.0 + i) * loader.numel for i in range(4)]

    def test_sparse_batches(self) -> None:
        dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
        batches = [{"coo": dense.to_sparse(), "csr": dense.to_sparse_csr()} for _ in range(3)]
        with pytest.warns(LoaderkitWarning, match="pageable"):
            out = list(DevicePrefetcher(batches, "cuda"))
        torch.cuda.synchronize()
        for batch in out:
            assert batch["coo"].is_cuda and batch["csr"].is_cuda
            torch.testing.assert_close(batch["coo"].to_dense().cpu(), dense)
            torch.testing.assert_close(batch["csr"].to_dense().cpu(), dense)

    def test_pageable_batches_are_copied_like_a_plain_loop(self) -> None:
        loader = [torch.randn(1 << 18) for _ in range(4)]
        prefetcher = DevicePrefetcher(loader, "cuda")
        with pytest.warns(LoaderkitWarning, match="pageable"):
            got = list(prefetcher)  # first pass: creates the side stream, warns once
        for g, e in zip(got, loader, strict=True):
            torch.testing.assert_close(g.cpu(), e)
        torch.cuda.synchronize()
        side = prefetcher.stream
        with torch.cuda.stream(side):
            _busy(400_000_000)  # were a copy queued behind this, the values would come late
        firsts = [float(x[0]) for x in prefetcher]  # copies on the current stream only
        assert firsts == [float(e[0]) for e in loader]
        assert not side.query(), "the side stream is still busy: copies did not wait for it"
        torch.cuda.synchronize()


# ------------------------------------------------------------------ sparse single-cell batches


def _csr_loaders(tmp_path: Any, **kwargs: Any) -> tuple[Any, Any]:
    """The same shuffled order of CSR rows (legacy .h5ad files, written by h5py) as a sparse
    batch and as a dense one."""
    from loaderkit import HDF5SessionDataset, create_dataloader
    from tests.hdf5.h5adfiles import matrix, write_legacy

    paths = [write_legacy(tmp_path / f"c{i}.h5ad", matrix(i), compression=None) for i in (0, 1)]
    return tuple(  # type: ignore[return-value]
        create_dataloader(
            HDF5SessionDataset(paths, key="X", sparse=form),
            batch_size=32,
            shuffle=True,
            seed=0,
            **kwargs,
        )
        for form in ("csr", "dense")
    )


def test_a_sparse_csr_batch_moves_as_itself(tmp_path: Any) -> None:
    """``to_device`` moves a sparse CSR batch whole: its layout, shape and values kept."""
    sparse, dense = _csr_loaders(tmp_path)
    with sparse, dense:
        for s, d in zip(sparse, dense, strict=True):
            moved = to_device(s, "cpu")
            assert moved.layout == torch.sparse_csr and moved.shape == d.shape
            assert torch.equal(moved.to_dense(), d)


@pytest.mark.cuda
@requires_cuda
def test_sparse_csr_batches_from_workers_expand_on_cuda(tmp_path: Any) -> None:
    """Pinned sparse batches from worker processes: moved, then ``.to_dense()`` on the GPU."""
    sparse, dense = _csr_loaders(tmp_path, num_workers=2, pin_memory=True)
    with sparse, dense:
        for s, d in zip(sparse, dense, strict=True):
            on_gpu = to_device(s, "cuda")
            assert on_gpu.layout == torch.sparse_csr and on_gpu.is_cuda
            assert torch.equal(on_gpu.to_dense(), to_device(d, "cuda"))
        torch.cuda.synchronize()
