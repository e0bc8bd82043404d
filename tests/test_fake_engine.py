"""The fake engine (tests/fake_engine.py) against the real one: the same requests give the same
kinds of events in the same order, so window tests on the fake see what the window sees."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.config.settings import Settings
from engine.core.results import ReplyResult, Stopped
from engine.core.tree import Role
from engine.llm.llama import gpu_devices
from engine.service.control import ThreadControl
from engine.service.handler import EngineService
from engine.service.protocol import (
    Event,
    Finished,
    ForgetRequest,
    GenerateRequest,
    LoadRequest,
    ModelLoaded,
    NodeView,
    Piece,
    Request,
    Sync,
    WarmRequest,
)
from tests.fake_engine import FakeEngineService, Script

CID = 1
SYSTEM = NodeView(1, Role.SYSTEM, "Be brief.", None)
USER = NodeView(2, Role.USER, "Tell me about rivers.", None)
REPLY = 3


def _generate(request_id: int) -> GenerateRequest:
    return GenerateRequest(request_id, CID, REPLY, (SYSTEM, USER), None, max_tokens=6, seed=3)


Handler = Callable[[Callable[[Event], None], ThreadControl], object]


def _run(make: Handler, model: str, stopped: bool) -> list[Event]:
    """Load, warm, answer (or answer a reply stopped before it starts), forget, sync."""
    events: list[Event] = []
    control = ThreadControl()
    service = make(events.append, control)
    requests: list[Request] = [
        LoadRequest(model, Settings(n_ctx=512, max_tokens=6)),
        WarmRequest(control.epoch(), CID, (SYSTEM, USER), max_tokens=6),
        _generate(1),
        ForgetRequest(CID, (REPLY,)),
        Sync(7),
    ]
    if stopped:
        control.stop(1)
    for request in requests:
        service.handle(request)  # type: ignore[attr-defined]
    service.close()  # type: ignore[attr-defined]
    return events


def _shape(events: list[Event]) -> list[str]:
    """The kinds of events in order, a run of the same kind as one."""
    kinds: list[str] = []
    for event in events:
        if not kinds or kinds[-1] != type(event).__name__:
            kinds.append(type(event).__name__)
    return kinds


@pytest.mark.parametrize("stopped", [False, True], ids=["answered", "stopped"])
def test_the_fake_engine_answers_in_the_real_engines_shape(
    tiny_models: dict[str, Path], stopped: bool
) -> None:
    model = str(tiny_models["dense"])
    real = _run(EngineService, model, stopped)
    fake = _run(lambda emit, control: FakeEngineService(emit, control, Script()), model,
                stopped)
    assert _shape(fake) == _shape(real), (_shape(fake), _shape(real))
    # The GPUs' memory with the model loaded: none on this project's machines.
    [loaded] = [e for e in real if isinstance(e, ModelLoaded)]
    assert (loaded.gpu is None) == (not gpu_devices())
    outcomes = [e.outcome for e in fake if isinstance(e, Finished)]
    assert len(outcomes) == 1
    if stopped:  # stopped before a word: nothing said
        assert isinstance(outcomes[0], Stopped)
        assert [type(e.outcome) for e in real if isinstance(e, Finished)] == [Stopped]
    else:
        result = outcomes[0]
        assert isinstance(result, ReplyResult)
        said = "".join(e.text for e in fake if isinstance(e, Piece))
        assert result.text == said == "You said: Tell me about rivers."
        assert result.report.prompt_tokens == result.report.reused_tokens  # warmed
