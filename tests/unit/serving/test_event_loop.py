"""Async tests run on the loop the services run on."""

import asyncio


async def test_tests_run_on_uvloop() -> None:
    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
