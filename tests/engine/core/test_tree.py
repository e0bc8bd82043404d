"""The conversation tree: pure data, no model."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.tree import NodeStatus, Role, Tree, TreeError


def _chat(tree: Tree, *texts: str) -> list[int]:
    """Alternate user/assistant messages at the active leaf; return their ids."""
    ids = []
    for i, text in enumerate(texts):
        role = Role.USER if i % 2 == 0 else Role.ASSISTANT
        ids.append(tree.add_child(tree.active_leaf, role, text).id)
    return ids


def test_new_tree_has_only_the_system_root() -> None:
    tree = Tree("be brief")
    assert tree.root.role is Role.SYSTEM and tree.root.text == "be brief"
    assert tree.messages() == []
    assert tree.active_leaf == tree.root_id


def test_messages_follow_the_active_path_in_order() -> None:
    tree = Tree()
    ids = _chat(tree, "hi", "hello", "how are you", "fine")
    assert [n.id for n in tree.messages()] == ids
    assert tree.message(2).text == "how are you"
    with pytest.raises(TreeError, match="message 4 does not exist"):
        tree.message(4)


def test_edit_adds_a_sibling_and_keeps_the_old_branch() -> None:
    tree = Tree()
    u0, _a0, _u1, a1 = _chat(tree, "q1", "r1", "q2", "r2")
    new = tree.add_sibling(u0, "q1 edited")
    assert tree.siblings(u0) == [u0, new.id]
    assert tree.node(u0).text == "q1"  # never overwritten
    assert [n.id for n in tree.messages()] == [new.id]
    # The old branch is intact and reachable by switching back.
    leaf = tree.switch_variant(new.id, 0)
    assert leaf == a1
    assert [n.text for n in tree.messages()] == ["q1", "r1", "q2", "r2"]


def test_switch_follows_last_active_descendants() -> None:
    tree = Tree()
    _u0, a0 = _chat(tree, "q", "r")
    tree.add_sibling(a0, "r-b")  # a second reply
    _chat(tree, "follow-up on b")
    leaf_b = tree.active_leaf
    tree.switch_variant(a0, 0)
    assert tree.active_leaf == a0
    tree.switch_variant(a0, 1)
    assert tree.active_leaf == leaf_b
    with pytest.raises(TreeError, match="variant 2 does not exist"):
        tree.switch_variant(a0, 2)


def test_rewind_keeps_descendants_and_send_branches_there() -> None:
    tree = Tree()
    _u0, a0, u1, a1 = _chat(tree, "q1", "r1", "q2", "r2")
    tree.rewind(a0)
    assert tree.active_leaf == a0
    new = tree.add_child(tree.active_leaf, Role.USER, "other q2")
    assert tree.siblings(new.id) == [u1, new.id]
    assert a1 in tree


def test_delete_branch_moves_the_active_path_to_a_sibling() -> None:
    tree = Tree()
    u0, a0 = _chat(tree, "q", "r")
    b = tree.add_sibling(a0, "r2")
    removed = tree.delete_branch(b.id)
    assert removed == [b.id]
    assert tree.active_leaf == a0
    tree.delete_branch(a0)
    assert tree.active_leaf == u0
    assert tree.node(u0).last_active_child is None
    with pytest.raises(TreeError):
        tree.delete_branch(tree.root_id)


def test_delete_off_the_active_path_leaves_it_alone() -> None:
    tree = Tree()
    _u0, _a0, u1, a1 = _chat(tree, "q1", "r1", "q2", "r2")
    other = tree.add_sibling(u1, "q2b")
    tree.switch_variant(other.id, 0)
    tree.delete_branch(other.id)
    assert tree.active_leaf == a1
    assert other.id not in tree


def test_system_nodes_only_at_the_root() -> None:
    tree = Tree()
    with pytest.raises(TreeError):
        tree.add_child(tree.root_id, Role.SYSTEM, "x")
    with pytest.raises(TreeError):
        tree.add_sibling(tree.root_id, "x")


def test_status_defaults_to_complete() -> None:
    tree = Tree()
    node = tree.add_child(tree.root_id, Role.USER, "x")
    assert node.status is NodeStatus.COMPLETE


_ops = st.lists(
    st.tuples(
        st.sampled_from(["send", "edit", "switch", "rewind", "delete"]),
        st.integers(0, 50),
        st.integers(0, 5),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_random_operations_keep_the_tree_consistent(ops: list[tuple[str, int, int]]) -> None:
    tree = Tree("sys")
    for op, a, b in ops:
        messages = tree.messages()
        try:
            if op == "send":
                last = tree.node(tree.active_leaf)
                role = Role.ASSISTANT if last.role is Role.USER else Role.USER
                tree.add_child(last.id, role, f"m{a}")
            elif op == "edit" and messages:
                tree.add_sibling(messages[a % len(messages)].id, f"e{a}")
            elif op == "switch" and messages:
                tree.switch_variant(messages[a % len(messages)].id, b)
            elif op == "rewind" and messages:
                tree.rewind(messages[a % len(messages)].id)
            elif op == "delete" and messages:
                tree.delete_branch(messages[a % len(messages)].id)
        except TreeError:
            pass
        # Invariants: the active path runs root -> leaf through existing parents, and every
        # last-active pointer and child list refers to existing nodes whose parent matches.
        path = tree.active_path()
        assert path[0].id == tree.root_id and path[-1].id == tree.active_leaf
        for parent, child in itertools.pairwise(path):
            assert child.parent == parent.id
            assert parent.last_active_child == child.id
        for node in tree.nodes():
            for child_id in node.children:
                assert tree.node(child_id).parent == node.id
            if node.last_active_child is not None:
                assert node.last_active_child in node.children
            if node.parent is not None:
                assert node.id in tree.node(node.parent).children
