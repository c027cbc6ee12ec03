"""simrun_core.faults and the store under faults: the plans of `SIMRUN_FAULTS`, and a log that
keeps whole lines only whatever fails (injected errors, and a real short write of the kernel)."""

from __future__ import annotations

import errno
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from core_samples import at

from simrun_core import events as ev
from simrun_core import faults
from simrun_core.faults import FaultPlan, FaultSpecError
from simrun_core.store import LogWriter, read_log, write_atomic


@pytest.fixture(autouse=True)
def no_plan() -> Iterator[None]:
    """Every test starts and ends without a plan (and never reads the environment's)."""
    faults.install(None)
    yield
    faults.install(None)


def unit(seq: int) -> ev.Event:
    return ev.UnitDone(seq=seq, time=at(seq), task="t", index=seq, worker="w")


def fired(plan: FaultPlan, op: str, calls: int) -> list[int]:
    """The numbers (from 1) of the calls of `op` that fail."""
    failed = []
    for number in range(1, calls + 1):
        try:
            plan.check(op)
        except OSError:
            failed.append(number)
    return failed


# --- plans ---------------------------------------------------------------------------------------


def test_a_rate_is_seeded_and_about_right() -> None:
    first = fired(FaultPlan.parse("append:ENOSPC:0.3:seed=7"), "append", 1000)
    again = fired(FaultPlan.parse("append:ENOSPC:0.3:seed=7"), "append", 1000)
    other = fired(FaultPlan.parse("append:ENOSPC:0.3:seed=8"), "append", 1000)
    assert first == again
    assert first != other
    assert 250 <= len(first) <= 350


def test_nth_fails_that_call_and_times_the_ones_after() -> None:
    assert fired(FaultPlan.parse("fsync:EIO:nth=3"), "fsync", 10) == [3]
    assert fired(FaultPlan.parse("fsync:EIO:nth=3:times=4"), "fsync", 10) == [3, 4, 5, 6]
    assert fired(FaultPlan.parse("fsync:EIO:times=2"), "fsync", 10) == [1, 2]
    assert fired(FaultPlan.parse("fsync:EIO"), "fsync", 3) == [1, 2, 3]
    assert fired(FaultPlan.parse("fsync:EIO:nth=2"), "append", 5) == []


def test_while_fails_only_while_the_file_exists(tmp_path: Path) -> None:
    full = tmp_path / "full"
    plan = FaultPlan.parse(f"atomic:ENOSPC:while={full}")
    assert fired(plan, "atomic", 2) == []
    full.touch()
    assert fired(plan, "atomic", 2) == [1, 2]
    full.unlink()
    assert fired(plan, "atomic", 2) == []


def test_the_error_is_the_errno_and_names_the_rule_and_the_file() -> None:
    plan = FaultPlan.parse("index:EACCES, append:EROFS;atomic:eio")
    with pytest.raises(PermissionError) as raised:
        plan.check("index", "/x/simrun.sqlite")
    assert raised.value.errno == errno.EACCES
    assert "Permission denied" in str(raised.value)
    assert "SIMRUN_FAULTS index:EACCES" in str(raised.value)
    assert raised.value.filename == "/x/simrun.sqlite"
    with pytest.raises(OSError) as raised:
        plan.check("append")
    assert raised.value.errno == errno.EROFS
    with pytest.raises(OSError) as raised:
        plan.check("atomic")
    assert raised.value.errno == errno.EIO
    assert plan.raised() == 3
    assert plan.raised("index") == 1


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("append", "expected OP:ERRNO"),
        ("disk:ENOSPC", "unknown op 'disk'"),
        ("append:NOSPACE", "'NOSPACE' is not the name of an errno"),
        ("append:errorcode", "is not the name of an errno"),
        ("append:ENOSPC:1.5", "not in [0, 1]"),
        ("append:ENOSPC:often", "could not convert"),
        ("append:ENOSPC:nth=0", "nth counts from 1"),
        ("append:ENOSPC:seed=x", "invalid literal"),
        ("append:ENOSPC:when=3", "unknown key 'when'"),
        ("append:ENOSPC:while=", "while needs a path"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_rule(text: str, named: str) -> None:
    with pytest.raises(FaultSpecError) as raised:
        FaultPlan.parse(f"fsync:EIO,{text}")
    assert f"SIMRUN_FAULTS: rule {text!r}" in str(raised.value)
    assert named in str(raised.value)


def test_the_plan_of_the_environment_is_installed(tmp_path: Path) -> None:
    plan = faults.install_from_env({"SIMRUN_FAULTS": "atomic:ENOSPC:nth=2"})
    assert plan is not None and faults.current() is plan
    write_atomic(tmp_path / "a", b"1")
    with pytest.raises(OSError, match="No space left on device"):
        write_atomic(tmp_path / "a", b"2")
    write_atomic(tmp_path / "a", b"3")
    assert (tmp_path / "a").read_bytes() == b"3"
    assert faults.install_from_env({"SIMRUN_FAULTS": " "}) is None
    assert faults.install_from_env({}) is None
    write_atomic(tmp_path / "a", b"4")


# --- the store under faults ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "code"),
    [("atomic:ENOSPC", errno.ENOSPC), ("fsync:EIO", errno.EIO)],  # the write; its fsync
)
def test_write_atomic_that_fails_keeps_the_old_file_and_no_temporary(
    tmp_path: Path, rule: str, code: int
) -> None:
    path = tmp_path / "run.json"
    write_atomic(path, b"old")
    with faults.injected(rule), pytest.raises(OSError) as raised:
        write_atomic(path, b"new")
    assert raised.value.errno == code
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_write_atomic_of_a_cache_does_not_fsync(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    with faults.injected("fsync:EIO"):
        write_atomic(path, b"cache", durable=False)
    assert path.read_bytes() == b"cache"


@pytest.mark.parametrize("rule", ["append:ENOSPC:nth=2", "fsync:EIO:nth=2", "append:EACCES:nth=3"])
def test_a_failed_append_leaves_the_log_as_it_was(tmp_path: Path, rule: str) -> None:
    path = tmp_path / "events.jsonl"
    writer = LogWriter(path)
    writer.append(unit(1))
    seq = 1
    with faults.injected(rule) as plan:
        with pytest.raises(OSError) as raised:
            for _ in range(3):
                before = path.read_bytes()
                writer.append(unit(seq + 1), unit(seq + 2))
                seq += 2
        assert plan.raised() == 1
    assert raised.value.errno == plan.rules[0].errno
    assert str(path) in str(raised.value)
    assert path.read_bytes() == before
    writer.append(unit(seq + 1), unit(seq + 2))
    writer.close()
    assert read_log(path) == [unit(n) for n in range(1, seq + 3)]


def test_an_injected_append_writes_a_part_before_it_fails(tmp_path: Path) -> None:
    """The seam writes half the bytes first, so the truncation is what keeps the log whole."""
    path = tmp_path / "events.jsonl"
    seen: list[int] = []
    writer = LogWriter(path, fsync=False)
    real = writer._restore

    def restore() -> None:
        seen.append(path.stat().st_size)
        real()

    writer._restore = restore  # type: ignore[method-assign]
    with faults.injected("append:ENOSPC"), pytest.raises(OSError):
        writer.append(unit(1))
    assert seen == [len(ev.encode_event(unit(1))) // 2]
    assert path.read_bytes() == b""
    writer.close()


def test_a_writer_whose_truncation_failed_truncates_before_the_next_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = LogWriter(path)
    writer.append(unit(1))
    before = path.read_bytes()
    # The append's write fails after half of it, and so does the fsync of its truncation.
    with faults.injected("append:ENOSPC:nth=1,fsync:EIO:nth=1"), pytest.raises(OSError):
        writer.append(unit(2))
    assert writer.dirty
    # The truncation fails again: the append raises without writing.
    with faults.injected("fsync:EIO:nth=1"), pytest.raises(OSError):
        writer.append(unit(2))
    assert writer.dirty
    writer.append(unit(2))
    writer.close()
    assert not writer.dirty
    assert path.read_bytes() == before + ev.encode_event(unit(2))


def test_a_log_under_seeded_faults_holds_exactly_the_appends_that_returned(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    rng = random.Random(11)
    kept: list[ev.Event] = []
    failed = 0
    writer = LogWriter(path)
    with faults.injected("append:ENOSPC:0.2:seed=3,fsync:EIO:0.1:seed=4") as plan:
        for _ in range(300):
            batch = [unit(len(kept) + n) for n in range(1, rng.randint(1, 3) + 1)]
            try:
                writer.append(*batch)
            except OSError as error:
                assert error.errno in (errno.ENOSPC, errno.EIO)
                failed += 1
                continue
            kept.extend(batch)
            assert path.read_bytes().endswith(b"\n")
    writer.close()
    assert plan.raised() >= failed
    assert 50 < failed < 150
    assert read_log(path) == kept
    assert [event.seq for event in kept] == list(range(1, len(kept) + 1))


REAL_LIMIT = textwrap.dedent(
    """
    import resource, signal, sys
    from pathlib import Path
    from simrun_core import events as ev
    from simrun_core.store import LogWriter
    from datetime import UTC, datetime
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    path = Path(sys.argv[1])
    writer = LogWriter(path)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1234, 1234))
    seq = 0
    while True:
        event = ev.UnitDone(seq=seq + 1, time=datetime.now(UTC), task="t", index=seq, worker="w")
        try:
            writer.append(event, event)
        except OSError as error:
            print(error.errno, seq, flush=True)
            break
        seq += 1
    """
)


def test_a_real_file_size_limit_leaves_whole_lines_only(tmp_path: Path) -> None:
    """The kernel writes a part of the append up to RLIMIT_FSIZE, then fails it with EFBIG:
    the writer truncates the part, so the log ends with its last whole line."""
    path = tmp_path / "events.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", REAL_LIMIT, str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SIMRUN_FAULTS": ""},
    )
    assert result.returncode == 0, result.stderr
    code, appended = map(int, result.stdout.split())
    assert code == errno.EFBIG
    assert appended > 0
    data = path.read_bytes()
    assert 1000 < len(data) < 1234 and data.endswith(b"\n")
    assert len(read_log(path)) == 2 * appended
