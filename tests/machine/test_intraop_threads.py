"""torch's intra-op threads in the training process while a loader's workers run a pass.

Real worker processes; the platform (CPUs, torch's thread count, whether the user chose it) is
injected, so the decisions are checked for hosts this machine is not. No test measures speed
(``benchmarks/handoff.py`` does).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from loaderkit import create_dataloader
from loaderkit.machine.intraop_threads import THREAD_ENV, ThreadLimit, torch_threads
from loaderkit.machine.platform import PlatformInfo
from loaderkit.policy import resolve_main_threads
from tests.conftest import fake_platform


@pytest.fixture(autouse=True)
def four_threads() -> Iterator[None]:
    """Every test starts with torch at 4 threads and leaves torch as it found it."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def small_host(**overrides: Any) -> PlatformInfo:
    """A 4-CPU host whose torch runs 4 threads nobody chose."""
    fields: dict[str, Any] = {"usable_cpus": 4, "torch_threads": 4, "torch_threads_chosen": False}
    fields.update(overrides)
    return fake_platform(**fields)


@pytest.mark.parametrize(
    ("cpus", "threads", "chosen", "workers", "expected"),
    [
        (4, 4, False, 2, 2),  # 4 threads + 2 workers on 4 CPUs: the workers' CPUs freed
        (2, 2, False, 1, 1),
        (2, 2, False, 2, 1),  # never below 1
        (2, 2, False, 8, 1),
        (16, 8, False, 8, None),  # 8 + 8 fit in 16
        (4, 4, True, 2, None),  # the user's own count
        (4, 1, False, 6, None),  # already 1
    ],
)
def test_the_decision(
    cpus: int, threads: int, chosen: bool, workers: int, expected: int | None
) -> None:
    host = fake_platform(usable_cpus=cpus, torch_threads=threads, torch_threads_chosen=chosen)
    decision = resolve_main_threads(host, workers)
    assert decision.value == expected
    if expected is not None:
        assert (
            f"lowered to {expected}" in decision.reason and f"{cpus} usable CPUs" in decision.reason
        )
    elif chosen:
        assert "chosen by you" in decision.reason


def test_unknown_thread_count_is_left_alone() -> None:
    assert resolve_main_threads(fake_platform(torch_threads=None), 4).value is None


def test_a_pass_runs_with_fewer_threads_and_gives_them_back() -> None:
    loader = create_dataloader(list(range(32)), batch_size=4, num_workers=2, platform=small_host())
    assert loader.plan["main_threads"].value == 2
    assert "spin" in loader.plan["main_threads"].reason
    try:
        for _ in range(2):  # persistent or not, every pass
            seen = {torch.get_num_threads() for _ in loader}
            assert seen == {2}
            assert torch.get_num_threads() == 4
    finally:
        loader.close()
    assert torch.get_num_threads() == 4


def test_persistent_workers_break_and_close() -> None:
    loader = create_dataloader(
        list(range(32)), batch_size=4, num_workers=2, training=True, platform=small_host()
    )
    assert loader.persistent_workers
    it = iter(loader)
    next(it)
    assert torch.get_num_threads() == 2  # a pass left half-way: still the loader's count
    del it
    assert [len(b) for b in loader] == [4] * 8  # the next pass starts and ends as usual
    assert torch.get_num_threads() == 4
    next(iter(loader))
    loader.close()  # workers gone: the count goes back
    assert torch.get_num_threads() == 4


def test_an_error_in_the_loop_then_close_gives_them_back() -> None:
    loader = create_dataloader(list(range(32)), batch_size=4, num_workers=1, platform=small_host())
    with pytest.raises(ValueError, match="in the loop"):
        for _ in loader:
            raise ValueError("in the loop")
    loader.close()
    assert torch.get_num_threads() == 4


def test_the_users_own_count_is_kept() -> None:
    chosen = small_host(torch_threads_chosen=True)
    loader = create_dataloader(list(range(16)), batch_size=4, num_workers=2, platform=chosen)
    assert loader.plan["main_threads"].value == 4
    assert {torch.get_num_threads() for _ in loader} == {4}
    loader.close()


def test_no_workers_no_change() -> None:
    loader = create_dataloader(list(range(16)), batch_size=4, num_workers=0, platform=small_host())
    assert "main_threads" not in loader.plan
    assert {torch.get_num_threads() for _ in loader} == {4}


def test_a_change_made_during_the_pass_is_kept() -> None:
    limit = ThreadLimit(2)
    limit.lower()
    assert torch.get_num_threads() == 2
    torch.set_num_threads(3)  # the loop chose another count meanwhile
    limit.restore()
    assert torch.get_num_threads() == 3
    limit.restore()  # idempotent
    assert torch.get_num_threads() == 3


def test_below_the_limit_nothing_changes() -> None:
    torch.set_num_threads(1)
    limit = ThreadLimit(2)
    limit.lower()
    limit.restore()
    assert torch.get_num_threads() == 1
    ThreadLimit(None).lower()
    assert torch.get_num_threads() == 1


def test_what_counts_as_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    import loaderkit.machine.intraop_threads as threads_module

    monkeypatch.setattr(threads_module, "_TORCH_DEFAULT", 4)
    assert torch_threads() == (4, False)  # torch's own count
    torch.set_num_threads(3)
    assert torch_threads() == (3, True)  # torch.set_num_threads was called
    torch.set_num_threads(4)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert torch_threads() == (4, True)
