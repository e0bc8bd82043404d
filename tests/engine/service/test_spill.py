"""Spills to the checkpoints' disk tier: after a request's last event, giving way to a real
request sent after the one that ran (engine.service.handler, CheckpointStore.enforce_budget)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.config.settings import Settings
from engine.core.tree import Role
from engine.llm.generator import Generator
from engine.service.control import ThreadControl
from engine.service.handler import EngineService
from engine.service.protocol import (
    Event,
    Finished,
    GenerateRequest,
    LoadRequest,
    NodeView,
    Warmed,
    WarmRequest,
)

CID = 1
PATH = (NodeView(1, Role.SYSTEM, "Be brief.", None),
        NodeView(2, Role.USER, "Tell me about rivers.", None))


def test_a_spill_follows_the_last_event_and_gives_way_only_to_a_newer_request(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[Event] = []
    control = ThreadControl()
    seen: list[tuple[str, bool]] = []

    def emit(event: Event) -> None:
        events.append(event)
        if isinstance(event, Finished):
            control.preempt()  # the client sends its next reply as soon as this one ends

    def after_reply(self: Generator, yield_to: Callable[[], bool] | None = None) -> None:
        assert yield_to is not None
        seen.append((type(events[-1]).__name__, yield_to()))
        if isinstance(events[-1], Warmed):
            control.preempt()  # a reply is sent while the warm-up's spill runs
            seen.append(("sent", yield_to()))

    monkeypatch.setattr(Generator, "after_reply", after_reply)
    service = EngineService(emit, control)
    service.handle(LoadRequest(str(tiny_models["dense"]), Settings(n_ctx=512, max_tokens=6)))
    service.handle(WarmRequest(control.epoch(), CID, PATH, max_tokens=6))
    control.preempt()  # as a client does when it sends a reply: the reply's own epoch
    service.handle(GenerateRequest(1, CID, 3, PATH, None, max_tokens=6, seed=3))
    service.close()
    # The warm-up's spill runs while nothing newer was sent, and gives way once a reply is;
    # the reply's gives way at once to the one sent when it ended.
    assert seen == [("Warmed", False), ("sent", True), ("Finished", True)]
