"""Scripts that ran under fork keep running under Python 3.14's forkserver default.

Real scripts run as ``python script.py`` (and under ``torchrun``): a loader made at the
unguarded top level of the main script, and a dataset defined in ``python -c``. On Python 3.14
the interpreter's own default (forkserver) is in effect; on older Pythons the scripts inject a
``PlatformInfo`` whose default is forkserver, as 3.14's is, and the plan is checked.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from loaderkit import ConfigError, detect_platform
from loaderkit.machine.main_module import MainRerun, guard_example, unguarded_line
from loaderkit.policy.start_method import (
    fit_for_main_rerun,
    fit_for_unpicklable,
    fit_start_method,
    fork_blocker,
)

PY314 = sys.version_info >= (3, 14)
REPO = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------ pure parts


def test_unguarded_line_finds_lines_outside_every_main_guard() -> None:
    source = textwrap.dedent(
        """\
        import torch

        def main():
            run()

        if __name__ == "__main__":
            main()
            more()
        if "__main__" == __name__:
            other()
        if __name__ != "__main__":
            not_a_guard()
        main()
        """
    )
    assert not unguarded_line(source, 7)
    assert not unguarded_line(source, 8)
    assert not unguarded_line(source, 10)
    assert unguarded_line(source, 12)
    assert unguarded_line(source, 13)
    assert unguarded_line("this is not python (", 1)  # unparsable: no guard found


def _platform(**changes: object):
    base = replace(
        detect_platform(),
        os_name="Linux",
        is_windows=False,
        start_method="forkserver",
        start_method_source="default",
        python_version=(3, 14, 0),
        cuda_initialized=False,
        cuda_bad_fork=False,
    )
    return replace(base, **changes)


def test_fork_stands_in_only_for_a_default_on_linux_without_cuda() -> None:
    assert fork_blocker(_platform(), "default") is None
    assert "explicitly" in (fork_blocker(_platform(), "argument") or "")
    assert "set_start_method" in (fork_blocker(_platform(), "global") or "")
    assert "Darwin" in (fork_blocker(_platform(os_name="Darwin"), "default") or "")
    assert "CUDA" in (fork_blocker(_platform(cuda_initialized=True), "default") or "")


def test_a_main_rerun_is_forked_on_linux_and_refused_elsewhere_naming_file_and_line() -> None:
    rerun = MainRerun("/jobs/train.py", 12, "loader = create_dataloader(ds, num_workers=2)")
    fit = fit_for_main_rerun(_platform(), "forkserver", "default", rerun)
    assert fit.start_method == "fork"
    assert "train.py:12" in fit.reason and "forkserver" in fit.reason
    assert "/jobs/train.py:12" in fit.warning and 'if __name__ == "__main__":' in fit.warning
    for platform, source in (
        (_platform(os_name="Darwin", start_method="spawn"), "default"),
        (_platform(cuda_initialized=True), "default"),
        (_platform(), "argument"),
    ):
        with pytest.raises(ConfigError) as info:
            fit_for_main_rerun(platform, platform.start_method, source, rerun)
        message = str(info.value)
        assert "/jobs/train.py:12" in message
        assert guard_example(rerun) in message


def test_an_unpicklable_dataset_is_forked_only_where_fork_may_stand_in() -> None:
    problem = "dataset cannot be pickled, but the 'forkserver' start method sends it: x"
    fit = fit_for_unpicklable(_platform(), "forkserver", "default", problem)
    assert fit is not None and fit.start_method == "fork"
    assert problem in fit.warning
    assert fit_for_unpicklable(_platform(), "forkserver", "argument", problem) is None
    with pytest.raises(ConfigError, match="cannot be pickled"):
        fit_start_method(_platform(), "forkserver", "global", rerun=None, problem=problem)
    assert fit_start_method(_platform(), "forkserver", "default", rerun=None, problem=None) is None


# ------------------------------------------------------------------ real scripts

#: A platform whose default start method is forkserver, as Python 3.14's is on Linux (real on
#: 3.14, injected before it).
_EMULATE = textwrap.dedent(
    """\
    import dataclasses, sys
    from loaderkit import detect_platform
    platform = None
    if sys.version_info < (3, 14):
        platform = dataclasses.replace(
            detect_platform(), start_method="forkserver", start_method_source="default",
            python_version=(3, 14, 0),
        )
    """
)

_DATASET = textwrap.dedent(
    """\
    import torch
    from loaderkit import create_dataloader

    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.tensor(i * i)
    """
)


#: A loader made, iterated and closed at the script's top level, with no main guard.
_TOP_LEVEL_LOADER = textwrap.dedent(
    """\
    loader = create_dataloader(Squares(), batch_size=4, num_workers=2, platform=platform)
    print("start_method", loader.plan["start_method"].value)
    print("batches", [b.tolist() for b in loader])
    loader.close()
    """
)


def _run(args: list[str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "always", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        args, cwd=tmp_path, capture_output=True, text=True, timeout=timeout, env=env
    )


_EXPECTED = "batches [[0, 1, 4, 9], [16, 25, 36, 49]]"


def test_an_unguarded_script_with_workers_finishes_under_a_forkserver_default(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(_EMULATE + _DATASET + _TOP_LEVEL_LOADER)
    done = _run([sys.executable, str(script)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "start_method fork" in done.stdout
    assert _EXPECTED in done.stdout
    assert f"{script.resolve()}:" in done.stderr  # the warning names the file and line
    assert "bootstrapping phase" not in done.stderr
    assert done.stdout.count("start_method") == 1  # the top level ran once


def test_an_unguarded_script_with_an_explicit_spawn_like_method_gets_a_config_error(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import multiprocessing\n"
        "multiprocessing.set_start_method('spawn')\n"
        + _DATASET
        + "loader = create_dataloader(Squares(), batch_size=4, num_workers=2)\n"
        + "print('batches', [b.tolist() for b in loader])\n"
    )
    done = _run([sys.executable, str(script)], tmp_path)
    assert done.returncode != 0
    assert "ConfigError" in done.stderr
    line = 1 + 2 + _DATASET.count("\n")  # the create_dataloader line
    assert f"{script.resolve()}:{line}" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr
    assert "bootstrapping phase" not in done.stderr
    assert "batches" not in done.stdout


def test_a_guarded_script_keeps_its_spawn_like_start_method(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        _DATASET
        + textwrap.dedent(
            """\
            def main():
                loader = create_dataloader(
                    Squares(), batch_size=4, num_workers=2, multiprocessing_context="forkserver"
                )
                print("start_method", loader.plan["start_method"].value)
                print("batches", [b.tolist() for b in loader])
                loader.close()

            if __name__ == "__main__":
                main()
            """
        )
    )
    done = _run([sys.executable, str(script)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "start_method forkserver" in done.stdout
    assert _EXPECTED in done.stdout


def test_a_dataset_defined_in_python_c_loads_with_fork_under_a_forkserver_default(
    tmp_path: Path,
) -> None:
    code = _EMULATE + _DATASET + _TOP_LEVEL_LOADER
    done = _run([sys.executable, "-c", code], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "start_method fork" in done.stdout
    assert _EXPECTED in done.stdout
    assert "interactive session" in done.stderr  # the warning says what could not be pickled
    explicit = code.replace("platform=platform", "multiprocessing_context='forkserver'")
    refused = _run([sys.executable, "-c", explicit], tmp_path)
    assert refused.returncode != 0
    assert "ConfigError" in refused.stderr and "cannot be pickled" in refused.stderr


def _torchrun() -> list[str]:
    found = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


# a torchrun launch of two ranks: fast where Python's own default is forkserver (3.14)
@pytest.mark.distributed
@pytest.mark.parametrize(
    "launch", [pytest.param("torchrun", marks=() if PY314 else pytest.mark.slow)]
)
def test_an_unguarded_script_finishes_under_torchrun(tmp_path: Path, launch: str) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(
        _EMULATE
        + _DATASET
        + textwrap.dedent(
            """\
            import torch.distributed as dist
            dist.init_process_group("gloo")
            loader = create_dataloader(
                Squares(), batch_size=2, num_workers=2, training=False, platform=platform
            )
            seen = [b.tolist() for b in loader]
            # one file a rank: the ranks share stdout, and their prints interleave
            with open(f"rank{dist.get_rank()}.txt", "w") as out:
                out.write(f"{loader.plan['start_method'].value}\\n{seen!r}\\n")
            loader.close()
            dist.destroy_process_group()
            """
        )
    )
    args = [*_torchrun(), "--standalone", "--nproc-per-node=2", str(script)]
    done = _run(args, tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [(tmp_path / f"rank{rank}.txt").read_text().splitlines() for rank in (0, 1)]
    assert [method for method, _ in reports] == ["fork", "fork"]
    seen = sorted(
        value for _, batches in reports for batch in ast.literal_eval(batches) for value in batch
    )
    assert seen == [i * i for i in range(8)]  # the two ranks' exact shards, every sample once
