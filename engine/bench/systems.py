"""The systems the benchmark compares, each replaying one conversation's session:

  arbor        Arbor with checkpoints (the live cache, RAM and disk checkpoints)
  reprocess    Arbor with `--cache none`: the whole prompt decoded at every step (the
               reference every other system's text is compared with)
  plain        a plain app on llama-cpp-python: `Llama.create_chat_completion`, with its own
               longest-common-prefix reuse of its one cache
  ramcache     the same app with llama-cpp-python's `LlamaRAMCache`
  llama-server llama.cpp's own server (engine.bench.llama_server), with its context
               checkpoints and host-memory prompt cache, driven as a chat app drives its API
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from engine.bench.cases import (
    AFTER_SWITCH,
    AFTER_WARM,
    EARLY_EDIT,
    INTERRUPTED_AT,
    MEASURED,
    REPLY_TOKENS,
    SETUP_LAST,
    SYSTEM,
    TO_INTERRUPT,
    Case,
    Conversation,
)
from engine.config.params import CacheMode, CheckpointOptions, ContextParams, RuntimeSettings
from engine.models.files import read_model_info
from engine.service.scenario import parse_scenario

log = logging.getLogger(__name__)


class System(StrEnum):
    ARBOR = "arbor"
    REPROCESS = "reprocess"
    PLAIN = "plain"
    RAMCACHE = "ramcache"
    LLAMA_SERVER = "llama-server"

    @property
    def label(self) -> str:
        return _TITLES[self]


_TITLES = {
    System.ARBOR: "Arbor (checkpoints)",
    System.REPROCESS: "Arbor --cache none (full reprocess)",
    System.PLAIN: "llama-cpp-python chat (prefix reuse)",
    System.RAMCACHE: "llama-cpp-python + LlamaRAMCache",
    System.LLAMA_SERVER: "llama-server (checkpoints, RAM cache)",
}
SETUP = "setup"  # the key of the setup's last send (a full prompt for everyone)


@dataclass(frozen=True)
class Measure:
    """One measured reply."""

    ttft_ms: float
    decoded: int  # prompt tokens decoded for this reply
    text: str
    prompt_tokens: int | None = None  # the prompt's length, where the system reports it


@dataclass(frozen=True)
class Setup:
    """What every system shares: the model file and the context, threads and batch."""

    model: Path
    n_ctx: int
    n_batch: int
    n_threads: int
    swa_full: bool = False

    def runtime(self) -> RuntimeSettings:
        return RuntimeSettings(n_ctx=self.n_ctx, n_batch=self.n_batch, n_threads=self.n_threads,
                               context=replace(ContextParams(), swa_full=self.swa_full))


def run(system: System, setup: Setup, conversation: Conversation) -> dict[str, Measure]:
    """Replay `conversation`'s session on `system`; its measures keyed by case (and SETUP).
    ServerAbsent if llama-server cannot be built or started here."""
    if system in (System.ARBOR, System.REPROCESS):
        return _arbor(setup, conversation, CacheMode.CHECKPOINTS if system is System.ARBOR
                      else CacheMode.NONE)
    if system is System.LLAMA_SERVER:
        return _llama_server(setup, conversation)
    return _peer(setup, conversation, ram_cache=system is System.RAMCACHE)


def _arbor(setup: Setup, conversation: Conversation, cache: CacheMode) -> dict[str, Measure]:
    from engine.service.replay import replay  # loads llama.cpp: only when a system runs

    data = conversation.scenario(str(setup.model), n_ctx=setup.n_ctx, n_batch=setup.n_batch)
    with tempfile.TemporaryDirectory(prefix="arbor-bench-") as disk:
        report = replay(parse_scenario(data), cache=cache, runtime_settings=setup.runtime(),
                        checkpoints=CheckpointOptions(disk_dir=Path(disk)))
    steps: list[dict[str, Any]] = report["steps"]

    def measure(step: dict[str, Any]) -> Measure:
        return Measure(ttft_ms=float(step["ttft_ms"]), decoded=int(step["decoded_tokens"]),
                       text=str(step["text"]), prompt_tokens=int(step["prompt_tokens"]))

    out = {case.value: measure(steps[index]) for index, case in MEASURED.items()}
    out[SETUP] = measure(steps[SETUP_LAST])
    return out


Messages = list[dict[str, str]]


class Chat(Protocol):
    """A chat app on a peer: greedy replies, timed, with the prompt tokens decoded for each."""

    def ask(self, messages: Messages, max_tokens: int) -> tuple[str, float, int]: ...

    def resume(self, messages: Messages, partial: str,
               max_tokens: int) -> tuple[str, float, int]: ...


def _peer(setup: Setup, conversation: Conversation, *, ram_cache: bool) -> dict[str, Measure]:
    from engine.llm.llama import PlainChat

    info = read_model_info(setup.model)
    # Without a template of its own a careful app names the model's format: llama-cpp-python
    # would use llama-2's otherwise.
    chat_format = "gemma" if info.chat_template is None and \
        info.architecture.startswith("gemma") else None
    chat = PlainChat(setup.model, n_ctx=setup.n_ctx, n_batch=setup.n_batch,
                     n_threads=setup.n_threads, ram_cache=ram_cache, swa_full=setup.swa_full,
                     chat_format=chat_format)
    try:
        return _session(chat, conversation)
    finally:
        chat.close()


def _llama_server(setup: Setup, conversation: Conversation) -> dict[str, Measure]:
    from engine.bench.api_session import Server, ServerChat, launch, running

    with tempfile.TemporaryDirectory(prefix="arbor-bench-") as tmp:
        spec = launch(Server.LLAMA_SERVER, setup.model, n_ctx=setup.n_ctx,
                      n_batch=setup.n_batch, n_threads=setup.n_threads,
                      swa_full=setup.swa_full)
        with running(spec, Path(tmp) / "llama-server.log") as url:
            return _session(ServerChat(url), conversation)


def _session(chat: Chat, conversation: Conversation) -> dict[str, Measure]:
    """The benchmark's session as a chat app on `chat` performs it."""
    out: dict[str, Measure] = {}

    def ask(messages: Messages, key: str | None = None, max_tokens: int = REPLY_TOKENS) -> str:
        text, ttft, decoded = chat.ask(messages, max_tokens)
        if key is not None:
            out[key] = Measure(ttft, decoded, text)
        return text

    def user(text: str) -> dict[str, str]:
        return {"role": "user", "content": text}

    def assistant(text: str) -> dict[str, str]:
        return {"role": "assistant", "content": text}

    base: Messages = [{"role": "system", "content": SYSTEM}] if SYSTEM else []
    history: Messages = list(base)
    for k, turn in enumerate(conversation.turns):
        history.append(user(turn))
        last = k == len(conversation.turns) - 1
        history.append(assistant(ask(history, SETUP if last else None)))
    edited = [*history[:-2], user(conversation.edited_last)]
    ask(edited, Case.EDIT_LAST.value)
    branch = [*edited, assistant(ask(edited, Case.REGENERATE.value))]  # the same prompt
    ask([*base, user(EARLY_EDIT)], Case.EDIT_EARLY.value)
    back = [*branch, user(AFTER_SWITCH)]
    asked = [*back, assistant(ask(back, Case.SWITCH_BACK.value)), user(TO_INTERRUPT)]
    partial = ask(asked, max_tokens=INTERRUPTED_AT)
    more, ttft, decoded = chat.resume(asked, partial, REPLY_TOKENS)
    out[Case.CONTINUE.value] = Measure(ttft, decoded, more)
    # A plain app has no warm-up: the next message is simply sent.
    ask([*asked, assistant(partial + more), user(AFTER_WARM)], Case.WARM_SEND.value)
    return out
