"""The hurry line: a reader behind the projection asks it to fold now and is told when it has; the projector
folds a stream of writes in batches otherwise."""
import asyncio
import os
import shutil
import socket
import sqlite3
import tempfile
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rota.controller.eventlog import MemoryLog
from rota.core import events as ev
from rota.projections import hurry, queries
from rota.projections.hurry import HurryLine
from rota.projections.projector import Projector

from harness import Harness, make_cluster
from helpers import run_as


@pytest.fixture
def shared_dir():
    """A directory every user may enter (pytest's own are root's alone)."""
    path = tempfile.mkdtemp(prefix="rota-hurry-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _answered(sock: socket.socket, wait: float = 0.2) -> bool:
    sock.settimeout(wait)
    try:
        sock.recv(16)
        return True
    except TimeoutError:
        return False


async def _line(path: str) -> tuple[HurryLine, list[int]]:
    asked: list[int] = []
    line = HurryLine(path, lambda: asked.append(1))
    assert line.open(asyncio.get_running_loop())
    return line, asked


async def _turn() -> None:
    for _ in range(20):
        await asyncio.sleep(0.005)


async def test_a_reader_is_answered_once_its_sequence_is_folded_and_not_before(shared_dir):
    line, asked = await _line(os.path.join(shared_dir, "p.sqlite.hurry"))
    try:
        reader = hurry.ask(line.path, 7)
        assert reader is not None
        await _turn()
        assert asked and len(line.waiting) == 1
        line.answer(6)
        assert not _answered(reader)
        line.answer(7)
        assert _answered(reader) and not line.waiting
        reader.close()
    finally:
        line.close(asyncio.get_running_loop())
    assert not os.path.exists(line.path)


def _ask_and_wait(argv: list[str]) -> int:
    s = hurry.ask(argv[0], 3)
    if s is None:
        print("cannot ask")
        return 1
    s.settimeout(20)
    s.recv(16)
    print("answered")
    return 0


async def test_another_user_may_ask_and_is_answered(shared_dir):
    line, _ = await _line(os.path.join(shared_dir, "p.sqlite.hurry"))
    try:
        child = asyncio.create_task(asyncio.to_thread(run_as, "nobody", _ask_and_wait, [line.path], "/"))
        for _ in range(400):
            if line.waiting:
                break
            await asyncio.sleep(0.01)
        line.answer(3)
        code, out, err = await asyncio.wait_for(child, 30)
    finally:
        line.close(asyncio.get_running_loop())
    assert code == 0, out + err
    assert out.split() == ["answered"]


async def test_only_a_name_the_kernel_gave_is_answered_never_a_path_a_user_names(shared_dir):
    line, asked = await _line(os.path.join(shared_dir, "p.sqlite.hurry"))
    named = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    named.bind(os.path.join(shared_dir, "mine"))
    try:
        named.sendto(b"1", line.path)
        unnamed = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        unnamed.sendto(b"1", line.path)
        await _turn()
        assert asked and not line.waiting
        line.answer(10)
        assert not _answered(named)
        unnamed.close()
    finally:
        named.close()
        line.close(asyncio.get_running_loop())


async def test_a_full_line_keeps_the_readers_waiting_for_the_least(shared_dir, monkeypatch):
    monkeypatch.setattr(hurry, "MAX_WAITING", 3)
    line, _ = await _line(os.path.join(shared_dir, "p.sqlite.hurry"))
    readers = []
    try:
        for seq in (100, 300, 200, b"x", 50, 400):       # b"x": not a sequence, waits for nothing (0)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.bind(b"")
            s.sendto(seq if isinstance(seq, bytes) else b"%d" % seq, line.path)
            readers.append(s)
            await _turn()
        assert sorted(seq for seq, _ in line.waiting.values()) == [0, 50, 100]
        line.answer(99)
        assert [_answered(s, 0.05) for s in readers] == [False, False, False, True, True, False]
    finally:
        for s in readers:
            s.close()
        line.close(asyncio.get_running_loop())


def _history(jobs: int) -> list[ev.Envelope]:
    h = Harness(make_cluster(nodes=2, gpus=0, cpus=8, memory=16000, max_time=3600))
    for i in range(jobs):
        h.submit(name=f"j{i}", user="alice", uid=2001, gid=2001, hold=True)
    return list(h.log)


async def test_slow_writes_are_projected_as_they_come_a_fast_stream_waits_for_its_batch_unless_a_reader_asks(
        tmp_path):
    """A write that comes a tenth of the batch interval or more after the last catch-up is projected at once; one
    right after another waits for the batch (here a long one); a reader behind asks, and the projection holds it
    in a moment."""
    entries = _history(4)
    lg = MemoryLog()
    lg.entries = entries[:-2]
    path = tmp_path / "p.sqlite"
    p = Projector(path, lg)
    await p.open()
    stop, wake = asyncio.Event(), asyncio.Event()
    follow = asyncio.create_task(p.follow(stop, wake, poll=5.0, min_interval=10.0))

    async def stored(seq: int, within: float) -> bool:
        for _ in range(int(within / 0.01)):
            if p.stored >= seq:
                return True
            await asyncio.sleep(0.01)
        return p.stored >= seq
    try:
        assert await stored(entries[-3].seq, 2.0)        # a quiet log: at once
        await asyncio.sleep(1.2)                         # more than a tenth of the interval
        lg.entries.append(entries[-2])
        wake.set()
        assert await stored(entries[-2].seq, 0.5)        # a slow write: as it comes
        lg.entries.append(entries[-1])
        wake.set()
        assert not await stored(entries[-1].seq, 0.5)    # right after it: waits for the batch

        def read() -> int:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                return queries.wait_until_folded(conn, entries[-1].seq, 20.0, hurry.path_for(str(path)))
            finally:
                conn.close()
        t = time.monotonic()
        behind = await asyncio.to_thread(read)
        waited = time.monotonic() - t
        assert behind == 0 and waited < 5.0
    finally:
        stop.set()
        await follow
        await p.close()


async def test_a_reader_asking_for_what_the_projection_already_holds_is_told_at_once(shared_dir):
    line = HurryLine(os.path.join(shared_dir, "p.sqlite.hurry"), lambda: None, folded=lambda: 5)
    assert line.open(asyncio.get_running_loop())
    try:
        early, late = hurry.ask(line.path, 5), hurry.ask(line.path, 6)
        assert early is not None and late is not None
        await _turn()
        assert _answered(early) and not _answered(late)
        assert [seq for seq, _ in line.waiting.values()] == [6]
        early.close()
        late.close()
    finally:
        line.close(asyncio.get_running_loop())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 30)), max_size=60))
def test_a_full_line_makes_way_as_the_plain_rule_says_whatever_the_order_of_asking(pokes):
    """The heap behind the full line keeps exactly whom the plain rule keeps: a reader already waiting raises
    its sequence; a new one, when full, takes the place of the one waiting for the highest if it waits for
    less (of equals, any one of them)."""
    line = HurryLine("/nonexistent", lambda: None)
    model: dict[bytes, int] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hurry, "MAX_WAITING", 3)
        _poke_all(line, model, pokes)


def _poke_all(line: HurryLine, model: dict[bytes, int], pokes: list[tuple[int, int]]) -> None:
    for who, seq in pokes:
        addr = b"\0%05x" % who
        line._remember(addr, seq)
        if addr in model:
            model[addr] = max(seq, model[addr])
        elif len(model) < hurry.MAX_WAITING:
            model[addr] = seq
        else:
            top = max(model.values())
            if top > seq:
                del model[next(a for a, s in model.items() if s == top and a not in line.waiting)]
                model[addr] = seq
        assert sorted(s for s, _ in line.waiting.values()) == sorted(model.values())
        assert set(line.waiting) == set(model)
