"""SessionTable in-process with real environments (the example plugin's EchoEnv, which the
suite puts on sys.path)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest
from agentrl_echo import EchoEnv

from agentrl.env_server.sessions import (
    EnvFactoryError,
    SessionCapacityError,
    SessionTable,
    UnknownSession,
)
from agentrl.envs import EpisodeGuard


class CountingEcho(EchoEnv):
    closes: ClassVar[list[int]] = []

    async def aclose(self) -> None:
        CountingEcho.closes.append(id(self))


def make() -> Any:
    return EpisodeGuard(CountingEcho())


async def test_the_limit_refuses_one_more_and_a_closed_session_frees_its_slot():
    table = SessionTable(make, max_sessions=2, idle_timeout_s=None)
    first, _ = await table.open(), await table.open()
    with pytest.raises(SessionCapacityError, match="2/2"):
        await table.open()
    await table.close(first.id)
    await table.open()
    assert table.active == 2 and table.opened == 3


async def test_each_session_has_its_own_environment_closed_exactly_once():
    CountingEcho.closes.clear()
    table = SessionTable(make, max_sessions=4, idle_timeout_s=None)
    sessions = [await table.open() for _ in range(3)]
    assert len({id(session.env.unwrapped) for session in sessions}) == 3
    await table.close(sessions[0].id)
    await table.close(sessions[0].id)  # a second close of the same id is a no-op
    await table.stop()
    assert sorted(CountingEcho.closes) == sorted(id(s.env.unwrapped) for s in sessions)
    with pytest.raises(UnknownSession, match="Unknown session_id: "):
        table.get(sessions[1].id)


async def test_a_failing_factory_is_reported_and_keeps_no_slot():
    def broken() -> Any:
        raise OSError("no sandbox engine")

    table = SessionTable(broken, max_sessions=1, idle_timeout_s=None)
    for _ in range(2):
        with pytest.raises(EnvFactoryError, match="OSError: no sandbox engine"):
            await table.open()
    assert table.active == 0


async def test_idle_sessions_expire_but_attached_and_busy_ones_do_not():
    CountingEcho.closes.clear()
    table = SessionTable(make, max_sessions=4, idle_timeout_s=0.2)
    table.start_reaper()
    idle, attached, busy = await table.open(), await table.open(), await table.open()
    attached.attached = True
    async with busy.lock:
        await asyncio.sleep(0.6)
        assert set(table.sessions) == {attached.id, busy.id}
    assert CountingEcho.closes == [id(idle.env.unwrapped)] and table.expired == 1
    await table.stop()
