"""simrun_core.store: run ids, the layout, the append-only log, atomic writes and the cache."""

from __future__ import annotations

import re
import stat
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from core_samples import RUN_ID, at

from simrun_core import events as ev
from simrun_core.fold import fold
from simrun_core.store import (
    LogCorrupt,
    LogWriter,
    OpenLog,
    RunPaths,
    fold_log,
    is_run_id,
    iter_blocks,
    iter_log,
    new_run_id,
    read_log,
    read_record_cache,
    run_ids,
    whole_length,
    worker_log_pod,
    write_atomic,
    write_record_cache,
)

# --- run ids and layout -------------------------------------------------------------------------


def test_new_run_id_format() -> None:
    run_id = new_run_id(datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert re.fullmatch(r"20240102-030405-[0-9a-f]{6}", run_id)
    assert is_run_id(run_id)


def test_new_run_ids_differ_and_use_now() -> None:
    before = datetime.now(UTC).strftime("%Y%m%d")
    run_ids_made = {new_run_id() for _ in range(20)}
    assert len(run_ids_made) == 20
    for run_id in run_ids_made:
        assert is_run_id(run_id)
        assert run_id[:8] >= before


@pytest.mark.parametrize(
    "value",
    [
        "20240102-030405-ABCDEF",
        "20240102-030405-abcde",
        "20240102-030405-abcdefa",
        "2024012-030405-abcdef",
        "20240102030405-abcdef",
        "../20240102-030405-abcdef",
        "20240102-030405-abcdeg",
        "",
    ],
)
def test_is_run_id_refuses(value: str) -> None:
    assert is_run_id(value) is False


def test_is_run_id_refuses_a_trailing_newline() -> None:
    assert is_run_id("20240102-030405-abcdef\n") is False


def test_run_paths(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path, RUN_ID)
    run = tmp_path / "runs" / RUN_ID
    assert paths.dir == run
    assert paths.events == run / "events.jsonl"
    assert paths.cache == run / "run.json"
    assert paths.task_dir("fit") == run / "tasks" / "fit"
    assert paths.out("fit") == run / "tasks" / "fit" / "out"
    assert paths.logs("fit") == run / "tasks" / "fit" / "logs"
    assert paths.worker_events("fit") == run / "tasks" / "fit" / "events"
    assert paths.ledger("fit") == run / "tasks" / "fit" / "ledger"
    assert paths.settings("fit") == run / "tasks" / "fit" / "settings.json"
    assert paths.provenance("fit") == run / "tasks" / "fit" / "provenance.json"


def test_a_worker_log_names_its_pod_attempt(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path, RUN_ID)
    log = paths.worker_log("fit", "w0.x", 12)
    assert log == paths.worker_events("fit") / "w0.x.12.jsonl"
    assert worker_log_pod(log) == ("fit", "w0.x", 12)
    for other in ("w0.jsonl", ".1.jsonl", "w0.one.jsonl", "w0.1.json"):
        assert worker_log_pod(paths.worker_events("fit") / other) is None
    assert worker_log_pod(paths.logs("fit") / "w0.1.jsonl") is None


def test_run_ids_lists_runs_with_a_log_sorted(tmp_path: Path) -> None:
    assert run_ids(tmp_path) == []
    for run_id in ("20240102-030405-bbbbbb", "20230102-030405-aaaaaa", "not-a-run"):
        RunPaths(tmp_path, run_id).dir.mkdir(parents=True)
        RunPaths(tmp_path, run_id).events.write_bytes(b"")
    RunPaths(tmp_path, "20250102-030405-cccccc").dir.mkdir()
    assert run_ids(tmp_path) == ["20230102-030405-aaaaaa", "20240102-030405-bbbbbb"]


# --- the log ------------------------------------------------------------------------------------


def events(count: int) -> list[ev.Event]:
    return [
        ev.UnitDone(seq=i, time=at(i), task="t", index=i, worker="w") for i in range(1, count + 1)
    ]


def write_log(path: Path, items: list[ev.Event]) -> None:
    writer = LogWriter(path, fsync=False)
    try:
        writer.append(*items)
    finally:
        writer.close()


def test_a_writer_gives_back_its_lines_and_sees_what_another_appended(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sample = events(3)
    writer = LogWriter(path, fsync=False)
    try:
        lines = writer.append(*sample[:2])
        assert lines == [ev.encode_event(event) for event in sample[:2]]
        assert writer.length == writer.size() == sum(map(len, lines)) == path.stat().st_size
        with open(path, "ab") as other:
            other.write(b"#\n")
        writer.append(sample[2])
        assert writer.size() == writer.length + 2
    finally:
        writer.close()


def test_log_writer_appends_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "r" / "events.jsonl"
    sample = events(3)
    writer = LogWriter(path)
    writer.append(sample[0])
    writer.append(sample[1], sample[2])
    writer.close()
    assert path.read_bytes() == b"".join(ev.encode_event(event) for event in sample)
    assert read_log(path) == sample
    writer = LogWriter(path, fsync=False)
    writer.append(*events(4)[3:])
    writer.close()
    assert read_log(path) == events(4)


def test_iter_log_gives_the_offset_after_each_event(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sample = events(3)
    write_log(path, sample)
    lengths = [len(ev.encode_event(event)) for event in sample]
    assert list(iter_log(path)) == [
        (lengths[0], sample[0]),
        (lengths[0] + lengths[1], sample[1]),
        (sum(lengths), sample[2]),
    ]


def test_iter_log_resumes_from_an_offset(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sample = events(4)
    write_log(path, sample)
    offsets = [offset for offset, _ in iter_log(path)]
    assert [event for _, event in iter_log(path, offsets[1])] == sample[2:]
    assert [offset for offset, _ in iter_log(path, offsets[1])] == offsets[2:]
    assert list(iter_log(path, offsets[-1])) == []


def test_a_torn_last_line_is_ignored_by_readers(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    sample = events(2)
    write_log(path, sample)
    whole = path.stat().st_size
    torn = ev.encode_event(events(3)[2])[:-1]
    with open(path, "ab") as file:
        file.write(torn)
    assert read_log(path) == sample
    assert [offset for offset, _ in iter_log(path)][-1] == whole
    assert whole_length(path) == whole


def test_a_torn_last_line_that_is_not_json_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, events(2))
    with open(path, "ab") as file:
        file.write(b'{"type":"unit-do')
    assert read_log(path) == events(2)


def test_a_new_writer_truncates_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, events(2))
    whole = path.read_bytes()
    with open(path, "ab") as file:
        file.write(b'{"type":"unit-do')
    writer = LogWriter(path, fsync=False)
    assert path.read_bytes() == whole
    writer.append(events(3)[2])
    writer.close()
    assert read_log(path) == events(3)
    assert path.read_bytes() == whole + ev.encode_event(events(3)[2])


def test_a_writer_of_a_torn_only_line_truncates_to_empty(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"seq":1,"ty')
    LogWriter(path, fsync=False).close()
    assert path.read_bytes() == b""
    assert read_log(path) == []


def test_a_corrupt_middle_line_raises_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    first, second = (ev.encode_event(event) for event in events(2))
    path.write_bytes(first + b"%garbage\n" + second)
    with pytest.raises(LogCorrupt) as info:
        read_log(path)
    assert str(info.value) == (
        f"{path}: line 2 (byte {len(first)}): JSON is malformed: invalid character (byte 0)"
    )


def test_iter_log_yields_the_events_before_a_corrupt_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    first, second = (ev.encode_event(event) for event in events(2))
    path.write_bytes(first + b"{}\n" + second)
    found = []
    with pytest.raises(LogCorrupt, match=r": line 2 \(byte \d+\): "):
        for item in iter_log(path):
            found.append(item)
    assert found == [(len(first), events(1)[0])]


def test_a_corrupt_line_after_an_offset_names_its_byte(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    first, second = (ev.encode_event(event) for event in events(2))
    path.write_bytes(first + second + b"%garbage\n")
    with pytest.raises(LogCorrupt) as info:
        list(iter_log(path, len(first)))
    assert f": byte {len(first) + len(second)}: " in str(info.value)


@pytest.mark.parametrize("block_bytes", [1, 7, 1 << 20])
def test_an_open_log_reads_what_iter_log_reads_as_the_log_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    monkeypatch.setattr("simrun_core.store.BLOCK_BYTES", block_bytes)
    path = tmp_path / "events.jsonl"
    sample = events(4)
    lines = [ev.encode_event(event) for event in sample]
    path.write_bytes(lines[0] + lines[1][:5])  # the second line torn
    opened = OpenLog(path)
    try:
        assert list(opened.events(0)) == list(iter_log(path)) == [(len(lines[0]), sample[0])]
        with open(path, "ab") as file:
            file.write(lines[1][5:] + lines[2] + lines[3] + b"%garbage\n")
        offset = len(lines[0])
        found = []
        with pytest.raises(LogCorrupt, match=f": byte {sum(map(len, lines))}: "):
            for item in opened.events(offset):
                found.append(item)
        assert [event for _, event in found] == sample[1:]
        assert found[-1][0] == sum(map(len, lines))
    finally:
        opened.close()


@pytest.mark.parametrize("block_bytes", [1, 7, 100, 1 << 20])
def test_iter_blocks_reads_what_iter_log_reads_whatever_the_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, events(9))
    with open(path, "ab") as file:
        file.write(b'{"type":"unit-do')
    monkeypatch.setattr("simrun_core.store.BLOCK_BYTES", block_bytes)
    blocks = list(iter_blocks(path))
    by_line = list(iter_log(path))
    assert [event for _, found in blocks for event in found] == events(9)
    ends = {offset for offset, _ in by_line}
    assert all(offset in ends for offset, _ in blocks)
    assert blocks[-1][0] == by_line[-1][0] == whole_length(path)
    offset = by_line[3][0]
    assert [e for _, found in iter_blocks(path, offset) for e in found] == events(9)[4:]


@pytest.mark.parametrize("block_bytes", [5, 1 << 20])
def test_iter_blocks_yields_the_events_before_a_corrupt_line_then_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    path = tmp_path / "events.jsonl"
    lines = [ev.encode_event(event) for event in events(4)]
    path.write_bytes(b"".join(lines[:3]) + b"%garbage\n" + lines[3])
    monkeypatch.setattr("simrun_core.store.BLOCK_BYTES", block_bytes)
    found = []
    with pytest.raises(LogCorrupt) as info:
        for offset, block in iter_blocks(path):
            found.append((offset, block))
    start = sum(len(line) for line in lines[:3])
    assert str(info.value) == (
        f"{path}: line 4 (byte {start}): JSON is malformed: invalid character (byte 0)"
    )
    assert [event for _, block in found for event in block] == events(3)
    assert found[-1][0] == start
    with pytest.raises(LogCorrupt, match=rf": byte {start}: "):
        list(iter_blocks(path, len(lines[0])))


def test_fold_log_folds_the_whole_log_or_its_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_log: list[ev.Event]
) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, run_log)
    monkeypatch.setattr("simrun_core.store.BLOCK_BYTES", 300)
    folded = fold_log(path).record
    assert folded == fold(run_log)
    for last in range(1, len(run_log) + 1):
        assert fold_log(path, last).record == fold(run_log[:last])


def test_unknown_types_are_read_in_their_place(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    first = ev.encode_event(events(1)[0])
    unknown = b'{"type":"from-the-future","seq":2}\n'
    path.write_bytes(first + unknown)
    read = [event for _, event in iter_log(path)]
    assert read[0] == events(1)[0]
    assert isinstance(read[1], ev.UnknownEvent) and read[1].kind == "from-the-future"
    assert read_log(path) == read


def test_a_log_with_an_unknown_type_folds(tmp_path: Path, run_log: list[ev.Event]) -> None:
    path = tmp_path / "events.jsonl"
    lines = [ev.encode_event(event) for event in run_log[:3]]
    lines.append(b'{"type":"from-the-future","seq":4,"time":"2024-05-06T07:08:12Z"}\n')
    lines += [ev.encode_event(msgspec.structs.replace(e, seq=e.seq + 1)) for e in run_log[3:]]
    path.write_bytes(b"".join(lines))
    assert fold(read_log(path)).seq == 22


# --- atomic writes and the cache ------------------------------------------------------------------


def test_write_atomic_creates_and_replaces_without_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "run.json"
    write_atomic(path, b"one")
    assert path.read_bytes() == b"one"
    write_atomic(path, b"two", mode=0o600)
    assert path.read_bytes() == b"two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.json"]


def test_write_atomic_default_mode(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    write_atomic(path, b"{}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_record_cache_round_trip(tmp_path: Path, run_log: list[ev.Event]) -> None:
    paths = RunPaths(tmp_path, RUN_ID)
    assert read_record_cache(paths) is None
    for length in (1, 12, len(run_log)):
        record = fold(run_log[:length])
        write_record_cache(paths, record)
        assert read_record_cache(paths) == record
    assert sorted(p.name for p in paths.dir.iterdir()) == ["run.json"]


@pytest.mark.parametrize("data", [b"", b"{not json", b'{"id": "x"}', b"[]"])
def test_an_unreadable_record_cache_is_none(tmp_path: Path, data: bytes) -> None:
    paths = RunPaths(tmp_path, RUN_ID)
    write_atomic(paths.cache, data)
    assert read_record_cache(paths) is None
