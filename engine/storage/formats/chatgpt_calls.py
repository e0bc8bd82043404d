"""ChatGPT `conversations.json`: which messages are tool calls and which results answer them.

Tool calls (`engine.core.tools`), as real exports hold them (exports of 2023-2025 published
in public repositories): a call is an assistant message whose `recipient` names the tool
("all" is the user), its arguments a JSON object in `content: {"content_type": "code",
"language": "json", "text": ...}` (canvas), in code of language "unknown" (web.run, plugins,
GPT actions), or in a text part (dalle.text2im, some canvas calls); its result is a message
below it from `author: {"role": "tool", "name": <the tool>}`, its text in `parts` (a
`system_error`'s in `text`). On import:
- a message addressed to a tool is a call when it sends a JSON object (`chatgpt_mapping`
  reads it so). It is a call of the assistant message above it when only skipped messages
  and calls stand between them, on a path without branches; otherwise an empty reply is made
  for it (its id is the call's). Calls in a row are one reply's (OpenAI's parallel calls).
- a tool message with text answers the first call of its name, in the run of calls above it
  (reached through earlier tool messages), that no tool message on its path answered
  already; it becomes a tool node. Two tool messages below one call are two results on two
  branches.
- a call that nothing answers is skipped: no call reaches the model without a result, and
  none that the file did not make. Skipped so: the code interpreter (`python`: its code is no
  JSON object, its `execution_output` no text part), the old browser's `search("...")`
  commands, and the web.run and DALL·E exchanges whose tool messages have no text (search
  results live in metadata, images are asset pointers); hidden messages are neither calls
  nor results.
Arbor marks the calls and results it writes with the call's id in
`metadata.arbor_tool_call_id`, a key ChatGPT's readers ignore; these are read as written,
answered or not. The tools the conversation offered go in the conversation's own
`arbor_tools` key (readers take the keys they know). So a file Arbor wrote comes back with
the same calls, results and tools.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from engine.core.tools import ToolCall
from engine.core.tree import Role
from engine.storage.formats.chatgpt_mapping import Entry, Message, fail, short


@dataclass
class Run:
    """The calls of one reply: a run of call messages, after the reply's text or not."""

    made: bool  # no text message above: the reply is made for the calls
    calls: list[str] = field(default_factory=list)  # the call entries, in order
    by_name: dict[str, list[str]] = field(default_factory=dict)  # ChatGPT's: per tool
    taken: Counter[str] = field(default_factory=Counter)  # per tool: answered on this path
    kept: list[str] = field(default_factory=list)  # the calls kept, once paired


@dataclass
class Calls:
    """Which messages are calls and results: what `_build_record` needs of the pairing."""

    runs: dict[str, Run]  # a call entry, or a reply's text entry -> its reply's run
    calls: dict[str, ToolCall]  # a kept call's entry -> the call
    answers: dict[str, str | None]  # a result's entry -> the call id it answers (None: none)

    def kept(self, entry_id: str) -> bool:
        return entry_id in self.calls

    @property
    def merged(self) -> int:
        """Kept calls that are no node of their own (all but a made reply's first)."""
        made = sum(1 for key, run in self.runs.items() if run.kept and run.kept[0] == key
                   and run.made)
        return len(self.calls) - made


_Lead = Run | str | None  # what a call would join: a run, a reply's text entry, or nothing


@dataclass
class _Pairing:
    """One walk of the mapping, entering and leaving each node, that finds the calls, the
    replies they belong to and the results that answer them. A run's `taken` counts the
    results on the path being walked, so a branch's results leave the calls unanswered for
    its sibling branches. Each node costs O(1), whatever the file."""

    entries: dict[str, Entry]
    runs: dict[str, Run] = field(default_factory=dict)
    leads: dict[str, _Lead] = field(default_factory=dict)  # what a call below would join
    above: dict[str, Run | None] = field(default_factory=dict)  # tool entry -> its run
    paired: dict[str, str] = field(default_factory=dict)  # ChatGPT's result -> call entry
    arbor_results: dict[str, str | None] = field(default_factory=dict)  # -> call id
    arbor_calls: set[str] = field(default_factory=set)

    def walk(self, root: Entry) -> None:
        stack: list[tuple[str, str | None]] = [(root.id, None)]  # (entry, name to give back)
        while stack:
            node_id, give_back = stack.pop()
            if give_back is not None:  # leaving: the result no longer answers for the path
                run = self.above[node_id]
                assert run is not None
                run.taken[give_back] -= 1
                continue
            entry = self.entries[node_id]
            taken = self._visit(entry)
            if taken is not None:
                stack.append((node_id, taken))
            stack.extend((child, None) for child in reversed(entry.children))

    def _visit(self, entry: Entry) -> str | None:
        """Place one entry; the tool name whose `taken` count it raised, if it did."""
        parent = self.entries[entry.parent] if entry.parent is not None else None
        lead: _Lead = None  # the run or reply text above, on an unbranched path
        if parent is not None and len(parent.children) == 1:
            lead = self.leads.get(parent.id)
        message = entry.message
        if message is None or not (message.is_call or message.role == "tool"):
            if message is not None and message.kept_role is Role.ASSISTANT:
                self.leads[entry.id] = entry.id  # a call below would be this reply's
            elif message is None or message.kept_role is None:
                self.leads[entry.id] = lead  # skipped: a call below follows what is above
            return None
        if message.is_call:
            self._add_call(entry, message, lead)
            return None
        run: Run | None = None
        if parent is not None and parent.message is not None:
            if parent.message.role == "tool":
                run = self.above[parent.id]
            elif parent.message.is_call:
                run = self.runs[parent.id]
        self.above[entry.id] = run
        if not message.answers:
            return None
        if message.by_arbor:
            self.arbor_results[entry.id] = message.arbor_id
            return None
        name = message.tool_name
        if run is None or name is None:
            return None
        calls = run.by_name.get(name, [])
        if run.taken[name] >= len(calls):
            return None
        self.paired[entry.id] = calls[run.taken[name]]
        run.taken[name] += 1
        return name

    def _add_call(self, entry: Entry, message: Message, lead: _Lead) -> None:
        if isinstance(lead, Run):
            run = lead
        elif lead is not None:  # the first call after a reply's text
            run = self.runs[lead] = Run(made=False)
        else:
            run = Run(made=True)
        self.runs[entry.id] = run
        self.leads[entry.id] = run
        run.calls.append(entry.id)
        if message.by_arbor:
            self.arbor_calls.add(entry.id)
        else:
            run.by_name.setdefault(message.recipient or "", []).append(entry.id)

    def result(self, label: str) -> Calls:
        """Keep the calls that are answered (or Arbor's); give each call its id."""
        answered = set(self.paired.values()) | self.arbor_calls
        calls: dict[str, ToolCall] = {}
        for run in {id(run): run for run in self.runs.values()}.values():
            run.kept = [call for call in run.calls if call in answered]
            ids: set[str] = set()
            for call in run.kept:
                message = self.entries[call].message
                assert message is not None and message.arguments is not None
                call_id = message.arbor_id if message.arbor_id is not None else call
                if call_id in ids:
                    fail(f"{label}, node {short(call)}: its reply makes two tool calls with "
                          f"the id {short(call_id)}")
                ids.add(call_id)
                calls[call] = ToolCall(call_id, message.recipient or "", message.arguments)
        answers: dict[str, str | None] = dict(self.arbor_results)
        answers.update((result, calls[call].id) for result, call in self.paired.items())
        return Calls(self.runs, calls, answers)


def pair_calls(entries: dict[str, Entry], root: Entry, label: str) -> Calls:
    if not any(entry.message is not None and (entry.message.is_call or entry.message.by_arbor)
               for entry in entries.values()):
        return Calls({}, {}, {})  # no call, no result of Arbor's: no walk (most files)
    pairing = _Pairing(entries)
    pairing.walk(root)
    return pairing.result(label)


__all__ = ["Calls", "Run", "pair_calls"]
