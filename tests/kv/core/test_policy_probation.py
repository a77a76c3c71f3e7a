"""Probation (``admission.py``) and the capped branch credit: one-off content below a
fanned-out prefix goes first; conversations and content asked for again are never on it."""

from radixgate.kv import BlockPool, CreditParams, CreditPolicy, LRUPolicy, RadixTree
from radixgate.kv.core.node import TreeNode
from radixgate.kv.core.policy.credit import CreditState
from radixgate.kv.core.policy.probation import Sightings
from tests.support.radix import cache, hit

B = 4
DOCUMENT = list(range(100, 108))                    # two blocks


def make_tree(policy: CreditPolicy | LRUPolicy | None = None, num_blocks: int = 64):
    pool = BlockPool(num_blocks, B)
    return pool, RadixTree(pool, policy=CreditPolicy(CreditParams()) if policy is None else policy)


def question(i: int) -> list[int]:
    return DOCUMENT + [200 + i] * B


def leaf_of(tree, tokens):
    node = tree.namespace("ns").root
    pos = 0
    while pos < len(tokens):
        node = node.children[tokens[pos]]
        pos = node.end
    return node


def test_branch_credit_grows_per_extra_continuation_up_to_the_cap():
    policy = CreditPolicy(CreditParams(branch_ticks=64, branch_cap=4, probation_ticks=0))
    node = TreeNode(b"", 0, 0, [], None, None)
    node.policy_state = CreditState(0)
    credits = []
    for branches in range(1, 8):
        node.policy_state.branches = branches
        credits.append(policy.key(node) - node.policy_state.last_access)
    assert credits == [0, 64, 128, 192, 256, 256, 256]


def test_new_questions_under_a_document_go_on_probation_from_the_fourth_branch():
    pool, tree = make_tree()
    for i in range(6):
        cache(pool, tree, question(i))
    document = leaf_of(tree, DOCUMENT)
    assert document.policy_state.branches == 6 and document.policy_state.child_reuses == 0
    on = [tree.policy.on_probation(leaf_of(tree, question(i))) for i in range(6)]
    assert on == [False, False, False, True, True, True]
    tree.check_integrity()


def test_a_probationary_question_goes_before_an_older_unrelated_prefix():
    for policy, older_survives in ((CreditPolicy(CreditParams()), True), (LRUPolicy(), False)):
        pool, tree = make_tree(policy)
        older = [7] * 8
        cache(pool, tree, older)
        for i in range(5):
            cache(pool, tree, question(i))
        assert tree.evict(1) == 1
        assert (tree.peek_length("ns", older) == 8) == older_survives
        tree.check_integrity()


def test_a_question_asked_again_counts_as_come_back_not_as_new():
    pool, tree = make_tree(num_blocks=64)
    for i in range(4):
        cache(pool, tree, question(i))
    document = leaf_of(tree, DOCUMENT)
    assert tree.evict(1) == 1                         # question 3 (on probation) goes
    assert tree.peek_length("ns", question(3)) == 8
    cache(pool, tree, question(3))                    # asked again
    assert document.policy_state.child_reuses == 1
    assert not leaf_of(tree, question(3)).policy_state.probation
    tree.check_integrity()


def test_a_hit_ends_probation():
    pool, tree = make_tree()
    for i in range(5):
        cache(pool, tree, question(i))
    assert leaf_of(tree, question(4)).policy_state.probation
    hit(pool, tree, question(4))
    assert not leaf_of(tree, question(4)).policy_state.probation


def test_conversations_that_come_back_put_no_new_one_on_probation():
    pool, tree = make_tree()
    system = list(range(300, 308))
    for c in range(6):
        turn = system + [400 + c] * B
        cache(pool, tree, turn)
        for t in range(2):                            # each next turn reuses the whole last
            hit(pool, tree, turn)
            turn = turn + [500 + t] * B
            cache(pool, tree, turn)
    root = leaf_of(tree, system)
    # 2 turns came back in each conversation (the first one's before the second conversation
    # split the system prompt off as a node of its own: the split carries them over)
    assert root.policy_state.branches == 6 and root.policy_state.child_reuses == 12
    newcomer = system + [600] * B
    cache(pool, tree, newcomer)
    assert not tree.policy.on_probation(leaf_of(tree, newcomer))


def test_probation_off_with_zero_ticks():
    pool, tree = make_tree(CreditPolicy(CreditParams(probation_ticks=0)))
    for i in range(6):
        cache(pool, tree, question(i))
    assert not any(leaf_of(tree, question(i)).policy_state.probation for i in range(6))


def test_sightings_stay_bounded_and_keep_the_newest():
    sightings = Sightings(capacity=8)
    for key in range(20):
        assert sightings.record(key) == 1
    assert len(sightings) <= 8
    assert sightings.record(19) == 2                  # recent ones are remembered
    assert sightings.record(0) == 1                   # the oldest were forgotten


def request(pool, tree, tokens):
    """What the engine does for a prompt: match it, then insert it with its blocks."""
    hit(pool, tree, tokens)
    cache(pool, tree, tokens)


def test_matching_a_document_does_not_count_as_its_questions_coming_back():
    pool, tree = make_tree()
    for i in range(6):
        request(pool, tree, question(i))              # six one-off questions, engine order
    document = leaf_of(tree, DOCUMENT)
    assert document.policy_state.child_reuses == 0
    hit(pool, tree, DOCUMENT)                         # the bare document, no continuation
    assert document.policy_state.child_reuses == 0
    assert tree.policy.on_probation(leaf_of(tree, question(5)))
