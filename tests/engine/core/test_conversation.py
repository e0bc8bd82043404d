"""The conversation core: each operation's change to the tree, without a model or Qt."""

from __future__ import annotations

import pytest

from engine.core.conversation import Conversation, ReplyJob
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
