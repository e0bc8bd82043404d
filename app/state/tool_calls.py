"""The window's half of a tool loop: a reply called tools its conversation offers from the
user's MCP servers; each call is approved by the user (or allowed always), run off the GUI
thread by the hub (engine.mcp.hub), and its result becomes a `tool` node that the model then
answers, as any message is (engine.core.conversation.Conversation.answer_calls).

Nothing runs without the user's word: "Allow once", "Always allow" (this tool of this server,
saved in Settings) or "Deny". A denied or failed call is a result the model reads. After
`MAX_AUTOMATIC_ROUNDS` rounds of calls without a user message, even an always-allowed tool asks
again, so a model that keeps calling cannot run unattended. One loop runs at a time; a new
message, an edit or Stop ends it (the reply keeps its calls, unanswered).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal, Slot

from engine.config.mcp import McpServer
from engine.config.settings import SettingsError, save_settings
from engine.core.tools import TOOL_SERVERS, ToolCall, calls_of
from engine.core.tree import Role
from engine.files.paths import data_dirs
from engine.mcp.hub import McpHub, ToolOutcome

if TYPE_CHECKING:
    from app.state.controller import ChatController

log = logging.getLogger(__name__)

MAX_AUTOMATIC_ROUNDS = 10
DENIED = "The user did not allow this call."


class Decision(Enum):
    ONCE = "once"
    ALWAYS = "always"
    DENY = "deny"


@dataclass(frozen=True)
class Asking:
    """A call waiting for the user's word."""

    conversation_id: int
    call: ToolCall
    server: str

    def describe(self) -> str:
        try:
            arguments = json.dumps(json.loads(self.call.arguments), ensure_ascii=False)
        except ValueError:
            arguments = self.call.arguments
        if len(arguments) > 300:
            arguments = arguments[:299] + "…"
        return f"The model wants to run {self.call.name} ({self.server}) with {arguments}"


@dataclass
class _Loop:
    conversation_id: int
    reply_id: int
    calls: list[ToolCall]
    servers: dict[str, str]
    rounds: int  # rounds of calls since the last user message, this one included
    results: list[tuple[ToolCall, str]] = field(default_factory=list)
    ticket: int = 0  # the call running (its outcome is dropped if the loop ended since)


class ToolCalls(QObject):
    asking = Signal(object)  # Asking, or None once answered
    running = Signal(str)  # what runs now, in words ("" when nothing does)
    _outcome = Signal(int, object)  # a ticket and its ToolOutcome, from the hub's thread

    def __init__(self, controller: ChatController,
                 hub: Callable[[list[McpServer]], McpHub] | None = None) -> None:
        super().__init__(controller)
        self.controller = controller
        self._make_hub = hub or (lambda servers: McpHub(servers, log_dir=data_dirs().logs))
        self._hub: McpHub | None = None
        self._loop: _Loop | None = None
        self._waiting: Asking | None = None
        self._tickets = itertools.count(1)
        self._outcome.connect(self._on_outcome)

    @property
    def hub(self) -> McpHub:
        if self._hub is None:
            self._hub = self._make_hub(list(self.controller.settings.mcp_servers))
        return self._hub

    @property
    def busy(self) -> bool:
        return self._loop is not None

    @property
    def waiting(self) -> Asking | None:
        return self._waiting

    def configure(self, servers: tuple[McpServer, ...]) -> None:
        """Settings were saved with these servers."""
        if self._hub is not None:
            self._hub.configure(servers)

    def close(self) -> None:
        self.cancel()
        if self._hub is not None:
            self._hub.close()
            self._hub = None

    # --- the loop ----------------------------------------------------------------------------

    def reply_done(self, conversation_id: int, reply_id: int) -> None:
        """A reply finished: if it called tools its conversation has from MCP servers, the
        loop begins (asking the user first, unless the tools are always allowed)."""
        tree = self.controller.tree_of(conversation_id)
        if tree is None or reply_id not in tree:
            return
        reply = tree.node(reply_id)
        calls = list(calls_of(reply.meta))
        servers = tree.root.meta.get(TOOL_SERVERS)
        if not calls or not isinstance(servers, dict):
            return
        path = tree.path_to(reply_id)
        since_user = next((i for i in range(len(path) - 1, -1, -1)
                           if path[i].role is Role.USER), 0)
        rounds = 1 + sum(1 for n in path[since_user:] if n.role is Role.ASSISTANT
                         and calls_of(n.meta) and n.id != reply_id)
        self.cancel()
        self._loop = _Loop(conversation_id, reply_id, calls, dict(servers), rounds)
        self._next()

    def decide(self, decision: Decision) -> None:
        """The user's word on the call waiting for it."""
        loop, asking = self._loop, self._waiting
        if loop is None or asking is None:
            return
        self._waiting = None
        self.asking.emit(None)
        if decision is Decision.DENY:
            self._result(asking.call, DENIED)
            return
        if decision is Decision.ALWAYS:
            self._allow_always(asking.server, asking.call.name)
        self._run(asking.call, asking.server)

    def cancel(self) -> None:
        """End the loop: the calls not yet answered stay unanswered."""
        if self._loop is None:
            return
        self._loop = None
        if self._waiting is not None:
            self._waiting = None
            self.asking.emit(None)
        self.running.emit("")

    def _next(self) -> None:
        loop = self._loop
        assert loop is not None
        if len(loop.results) == len(loop.calls):
            self._loop = None
            self.running.emit("")
            self.controller.answer_calls(loop.conversation_id, loop.reply_id, loop.results)
            return
        call = loop.calls[len(loop.results)]
        server = loop.servers.get(call.name)
        known = {s.name for s in self.controller.settings.mcp_servers}
        if server is None or server not in known:
            self._result(call, f"Error: no MCP server in Settings offers the tool {call.name} "
                               f"any more")
        elif self.hub.allowed(server, call.name) and loop.rounds <= MAX_AUTOMATIC_ROUNDS:
            self._run(call, server)
        else:
            self._waiting = Asking(loop.conversation_id, call, server)
            self.asking.emit(self._waiting)

    def _run(self, call: ToolCall, server: str) -> None:
        loop = self._loop
        assert loop is not None
        loop.ticket = ticket = next(self._tickets)
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            self._result(call, "Error: the call's arguments are not a JSON object")
            return
        self.running.emit(f"Running {call.name} ({server})…")
        future = self.hub.call(server, call.name, arguments)
        future.add_done_callback(lambda done: self._outcome.emit(ticket, _outcome_of(done)))

    @Slot(int, object)
    def _on_outcome(self, ticket: int, outcome: ToolOutcome) -> None:
        loop = self._loop
        if loop is None or loop.ticket != ticket:
            return  # the loop ended (Stop, a new message) while the call ran
        call = loop.calls[len(loop.results)]
        if outcome.failed:
            log.info("tool %s failed: %s", call.name, outcome.text[:200])
        self._result(call, outcome.text)

    def _result(self, call: ToolCall, text: str) -> None:
        loop = self._loop
        assert loop is not None
        loop.results.append((call, text))
        self._next()

    def _allow_always(self, server: str, tool: str) -> None:
        controller = self.controller
        servers = tuple(s.with_allowed(tool) if s.name == server else s
                        for s in controller.settings.mcp_servers)
        settings = replace(controller.settings, mcp_servers=servers)
        try:
            save_settings(settings)
        except SettingsError as exc:
            controller.error.emit(str(exc))
            return
        controller.settings = settings
        self.configure(servers)


def _outcome_of(done: concurrent.futures.Future[ToolOutcome]) -> ToolOutcome:
    try:
        return done.result()
    except Exception as exc:  # the hub never raises from a call; this is a last guard
        return ToolOutcome(f"Error: {exc}", failed=True)
