"""The conversation core: each operation's change to the tree, without a model or Qt."""

from __future__ import annotations

import pytest

from engine.core.conversation import Change, Conversation, ReplyJob
from engine.core.tools import TOOL_CALL_ID, TOOL_CALLS, TOOL_SERVERS, TOOLS, ToolCall
from engine.core.tree import NodeStatus, Role, Tree, TreeError


def _chat() -> tuple[Conversation, list[int]]:
    """system, u0, a0, u1, a1 on the active path."""
    conv = Conversation(Tree("Be kind."))
    ids = []
    for text in ("u0", "a0", "u1", "a1"):
        role = Role.USER if text.startswith("u") else Role.ASSISTANT
        ids.append(conv.tree.add_child(conv.tree.active_leaf, role, text).id)
    return conv, ids


def test_send_and_edit_ask_for_a_reply_to_the_new_user_message() -> None:
    conv, ids = _chat()
    change = conv.send("u2")
    (message,) = change.nodes
    assert (message.role, message.parent) == (Role.USER, ids[3])
    assert change.reply == ReplyJob(message.id)
    change = conv.edit(ids[0], "u0 again")
    (new,) = change.nodes
    assert new.parent == conv.tree.root_id and change.reply == ReplyJob(new.id)
    assert conv.tree.siblings(ids[0]) == [ids[0], new.id]  # the old version stays
    assert conv.edit(ids[1], "a0 by hand").reply is None  # an assistant edit is just text
    with pytest.raises(TreeError):
        conv.edit(conv.tree.root_id, "no")


def test_regenerate_answers_the_user_message_of_any_reply() -> None:
    conv, ids = _chat()
    assert conv.regenerate().reply == ReplyJob(ids[2])  # the last reply
    assert conv.tree.active_leaf == ids[2]
    assert conv.regenerate(ids[1]).reply == ReplyJob(ids[0])  # an earlier one
    assert conv.tree.active_leaf == ids[0]
    with pytest.raises(TreeError):
        Conversation(Tree()).regenerate()


def test_continue_resumes_a_reply_or_answers_a_rewound_user_message() -> None:
    conv, ids = _chat()
    conv.tree.node(ids[3]).status = NodeStatus.INTERRUPTED
    assert conv.continue_reply().reply == ReplyJob(ids[2], resume=ids[3])
    conv.rewind(ids[2])
    assert conv.continue_reply().reply == ReplyJob(ids[2])


def test_the_warm_up_continues_an_interrupted_reply_and_never_a_streaming_one() -> None:
    conv, ids = _chat()
    tree = conv.tree
    assert conv.warm_target() == (tree.active_path(), None)  # the branch, for the next Send
    assert conv.warm_target(ids[2]) == (tree.path_to(ids[1]), None)  # before the edited one
    reply = tree.node(ids[3])
    reply.status = NodeStatus.INTERRUPTED  # stopped: Continue is next, prepared exactly
    assert conv.warm_target() == (tree.path_to(ids[2]), reply)
    assert conv.warm_path() == []  # the path alone: it does not end in a complete message
    reply.status = NodeStatus.STREAMING  # still being written: nothing to prepare
    assert conv.warm_target() == ([], None) and conv.warm_path() == []
    reply.status = NodeStatus.INTERRUPTED
    tree.node(ids[1]).status = NodeStatus.INTERRUPTED  # an earlier reply unfinished
    assert conv.warm_target() == ([], None)
    tree.node(ids[1]).status = NodeStatus.COMPLETE
    conv.rewind(ids[2])  # a user message at the leaf: its first reply comes next
    assert conv.warm_target() == (tree.path_to(ids[2]), None)


def test_delete_and_undo_put_the_branch_back_where_it_was() -> None:
    conv, ids = _chat()
    change = conv.delete_branch(ids[2])
    assert set(change.deleted) == {ids[2], ids[3]} and conv.tree.active_leaf == ids[1]
    assert conv.can_undo
    restored = conv.undo()
    assert [n.id for n in restored.nodes] == [ids[2], ids[3]]
    assert conv.tree.active_leaf == ids[3] and not conv.can_undo
    with pytest.raises(TreeError, match="nothing to undo"):
        conv.undo()
    # A front end with its own undo stack restores by the delete's token.
    token = conv.delete_branch(ids[0]).undo
    assert token is not None
    conv.restore(token)
    assert [n.text for n in conv.tree.messages()] == ["u0", "a0", "u1", "a1"]


def test_system_fork_and_seeds() -> None:
    conv, ids = _chat()
    for node in conv.tree.nodes():
        node.tokens = (node.id,)
    change = conv.set_system("Be brief.")
    assert change.nodes == (conv.tree.root,) and conv.tree.root.tokens is None
    assert conv.set_system("Be brief.").nodes == ()  # no change, nothing to save
    fork = conv.fork(ids[1])
    assert [n.text for n in fork.messages()] == ["u0", "a0"]
    assert [n.tokens for n in fork.messages()] == [(ids[0],), (ids[1],)]  # same prefix
    assert [conv.reply_seed(40) for _ in range(3)] == [40, 41, 42]
    assert 0 <= conv.reply_seed(None) < 0x7FFFFFFF


WEATHER = [{"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _called(conversation: Conversation) -> tuple[int, ToolCall]:
    """A user message answered by a reply that calls `weather`."""
    tree = conversation.tree
    user = conversation.send("weather in Oslo?").nodes[0]
    call = ToolCall.new("weather", {"city": "Oslo"})
    reply = tree.add_child(user.id, Role.ASSISTANT, "")
    reply.meta[TOOL_CALLS] = [call.to_meta()]
    return reply.id, call


def test_tools_are_set_on_the_root_and_render_it_again() -> None:
    conversation = Conversation(Tree("sys"))
    conversation.tree.root.tokens = [1, 2, 3]
    change = conversation.set_tools(WEATHER, {"weather": "forecast"})
    root = conversation.tree.root
    assert change.nodes == (root,) and root.tokens is None
    assert root.meta[TOOLS] == WEATHER and root.meta[TOOL_SERVERS] == {"weather": "forecast"}
    root.tokens = [1, 2]
    assert conversation.set_tools(WEATHER, {"weather": "forecast"}) == Change()
    assert root.tokens == [1, 2]  # unchanged: kept
    conversation.set_tools([], {})
    assert TOOLS not in root.meta and TOOL_SERVERS not in root.meta and root.tokens is None


def test_results_are_tool_nodes_and_the_last_one_is_answered() -> None:
    conversation = Conversation(Tree("sys"))
    reply_id, call = _called(conversation)
    second = ToolCall.new("weather", {"city": "Bergen"})
    conversation.tree.node(reply_id).meta[TOOL_CALLS].append(second.to_meta())
    change = conversation.answer_calls(reply_id, [(call, "sunny"), (second, "rain")])
    first, last = change.nodes
    assert (first.role, first.text, first.parent) == (Role.TOOL, "sunny", reply_id)
    assert (last.text, last.parent, last.meta[TOOL_CALL_ID]) == ("rain", first.id, second.id)
    assert change.reply == ReplyJob(last.id)
    with pytest.raises(TreeError):
        conversation.answer_calls(reply_id, [(ToolCall.new("weather", {}), "made up")])
    with pytest.raises(TreeError):
        conversation.answer_calls(first.id, [(call, "not a reply")])


def test_a_tool_result_is_edited_regenerated_and_continued_like_a_message() -> None:
    conversation = Conversation(Tree("sys"))
    reply_id, call = _called(conversation)
    result = conversation.answer_calls(reply_id, [(call, "sunny")]).nodes[0]
    edited = conversation.edit(result.id, "snow")
    new = edited.nodes[0]
    assert (new.role, new.parent, new.meta[TOOL_CALL_ID]) == (Role.TOOL, reply_id, call.id)
    assert edited.reply == ReplyJob(new.id)
    answer = conversation.tree.add_child(new.id, Role.ASSISTANT, "it snows")
    assert conversation.regenerate(answer.id).reply == ReplyJob(new.id)
    assert conversation.continue_reply(new.id).reply == ReplyJob(new.id)
