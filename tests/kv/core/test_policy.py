"""Eviction order with credits (``EvictionPolicy``): expected continuations (a response
that ends in a tool call) and branching prefixes (a document many questions extended)
outlive equally recent leaves; plain LRU (``LRU``) ignores both."""

import pytest

from radixgate.kv import BlockPool, CreditParams, CreditPolicy, EvictionPolicy, LRUPolicy, RadixTree
from tests.support.radix import cache, hit

B = 4


def make_tree(policy: EvictionPolicy, num_blocks: int = 64):
    pool = BlockPool(num_blocks, B)
    return pool, RadixTree(pool, policy=policy)


def cached(pool, tree, tokens) -> bool:
    """Is all of ``tokens`` still cached (without touching LRU state)?"""
    return tree.peek_length("ns", tokens) == len(tokens)


def test_expected_continuation_outlives_a_more_recent_leaf():
    pool, tree = make_tree(CreditPolicy(CreditParams(continuation_ticks=100, branch_ticks=0)))
    agent, chat = [1] * 8, [2] * 8
    cache(pool, tree, agent)
    cache(pool, tree, chat)
    assert tree.expect_continuation("ns", agent) == 8
    assert tree.evict(2) == 2
    assert cached(pool, tree, agent) and not cached(pool, tree, chat)
    tree.check_integrity()


def test_the_next_match_consumes_the_continuation_credit():
    pool, tree = make_tree(CreditPolicy(CreditParams(continuation_ticks=100, branch_ticks=0)))
    agent, later = [1] * 8, [3] * 8
    cache(pool, tree, agent)
    tree.expect_continuation("ns", agent)
    hit(pool, tree, agent)                  # the tool result came back
    cache(pool, tree, later)
    assert tree.evict(2) == 2               # the agent's leaf is now the older one
    assert not cached(pool, tree, agent) and cached(pool, tree, later)
    tree.check_integrity()


@pytest.mark.parametrize("credit, agent_survives", [(2, False), (100, True)])
def test_a_continuation_credit_runs_out_when_the_client_never_returns(credit, agent_survives):
    """Agent cached at tick 1 (credit: counts as accessed at 1 + credit), then four
    one-block leaves at ticks 2..5; three single-block evictions follow."""
    pool, tree = make_tree(CreditPolicy(CreditParams(continuation_ticks=credit, branch_ticks=0)))
    agent = [1] * 8
    cache(pool, tree, agent)
    tree.expect_continuation("ns", agent)
    others = [[10 + i] * 4 for i in range(4)]
    for tokens in others:
        cache(pool, tree, tokens)
    for _ in range(3):
        assert tree.evict(1) >= 1
    assert cached(pool, tree, agent) == agent_survives
    survivors = others[3:] if agent_survives else others[2:]  # newer than an expired credit
    assert [cached(pool, tree, t) for t in others] == [t in survivors for t in others]
    tree.check_integrity()


def test_expect_continuation_of_an_uncached_prompt_marks_nothing():
    pool, tree = make_tree(CreditPolicy(CreditParams()))
    assert tree.expect_continuation("ns", [5, 6, 7]) == 0
    cache(pool, tree, [5, 6, 7, 8])
    assert tree.expect_continuation("ns", [5, 6, 9]) == 0      # diverges inside: not ours
    assert tree.expect_continuation("other", [5, 6]) == 0
    assert tree.expect_continuation("ns", [5, 6]) == 2          # a prefix of it is
    tree.check_integrity()


def test_a_match_that_only_enters_a_credited_leaf_keeps_its_credit():
    """Another prompt sharing part of a waiting agent's leaf is not its continuation: the
    credit survives it (and the split it causes), so the agent outlives newer leaves."""
    pool, tree = make_tree(CreditPolicy(CreditParams(continuation_ticks=100, branch_ticks=0)))
    agent = list(range(1, 17))
    cache(pool, tree, agent)
    tree.expect_continuation("ns", agent)
    other = agent[:8] + [900, 901, 902, 903]
    hit(pool, tree, other)
    cache(pool, tree, other)
    newer = [[1000 + 10 * i + j for j in range(8)] for i in range(5)]
    for tokens in newer:
        cache(pool, tree, tokens)
    tree.evict(2)
    assert tree.peek_length("ns", agent) == 16
    tree.check_integrity()


def _document_then_unshared_prompt(policy: EvictionPolicy):
    """A 2-block document extended by four one-off questions, then a 2-block unshared
    prompt cached after it; the questions' tails are evicted first (oldest leaves)."""
    pool, tree = make_tree(policy)
    document = list(range(100, 108))
    for q in range(4):
        cache(pool, tree, document + [200 + q] * 4)
    unshared = [7] * 8
    cache(pool, tree, unshared)
    assert tree.evict(4) == 4                  # the four question tails
    return pool, tree, document, unshared


def test_a_prefix_many_requests_branched_from_outlives_a_more_recent_unshared_one():
    pool, tree, document, unshared = _document_then_unshared_prompt(
        CreditPolicy(CreditParams(continuation_ticks=0, branch_ticks=8)))
    assert tree.evict(2) == 2
    assert cached(pool, tree, document) and not cached(pool, tree, unshared)
    tree.check_integrity()


def test_plain_lru_evicts_the_older_document_first():
    pool, tree, document, unshared = _document_then_unshared_prompt(LRUPolicy())
    assert tree.evict(2) == 2
    assert not cached(pool, tree, document) and cached(pool, tree, unshared)


def test_a_chain_of_turns_earns_no_branch_credit():
    """Each turn extends the previous one (one branch per node): plain LRU order."""
    pool, tree = make_tree(CreditPolicy(CreditParams(continuation_ticks=0, branch_ticks=1000)))
    conversation = [1] * 4
    for turn in range(3):
        conversation = conversation + [10 + turn] * 4
        cache(pool, tree, conversation)
    newer = [9] * 8
    cache(pool, tree, newer)
    assert tree.evict(4) == 4                  # the chain's 4 blocks, not the newer prompt
    assert tree.peek_length("ns", conversation) == 0 and cached(pool, tree, newer)
    tree.check_integrity()


def _document_with_two_questions(document_tokens: int):
    """A 16-block tree holding a document (tokens 100, 101, ...) and two one-block questions
    below it; returns the pool, the tree, the document and its node."""
    pool, tree = make_tree(CreditPolicy(CreditParams()), num_blocks=16)
    document = list(range(100, 100 + document_tokens))
    cache(pool, tree, document + [1] * 4)
    cache(pool, tree, document + [2] * 4)
    return pool, tree, document, tree.namespace("ns").root.children[100]


def test_a_continuation_cached_again_after_eviction_is_not_a_new_branch():
    pool, tree, document, node = _document_with_two_questions(8)
    assert node.policy_state.branches == 2
    for _ in range(3):                         # the same question evicted and asked again
        assert tree.evict(1) == 1
        cache(pool, tree, document + [2] * 4)
    cache(pool, tree, document + [3] * 4)      # a new question is a new branch
    assert node.alive and node.policy_state.branches == 3
    tree.check_integrity()


def test_a_trimmed_prefix_keeps_its_branch_count_without_inflating_it():
    pool, tree, document, node = _document_with_two_questions(12)
    assert tree.evict(2) == 2                   # both questions
    assert tree.evict(1) == 1                   # then the document's last block: [0,8)
    assert (node.alive, node.end, node.policy_state.branches) == (True, 8, 2)
    cache(pool, tree, document + [2] * 4)       # the same question again, through the tail
    assert node.policy_state.branches == 2
    cache(pool, tree, document[:8] + [7] * 4)   # a question on the shorter prefix is new
    assert node.policy_state.branches == 3
    tree.check_integrity()


# ---- partly filled last blocks go first ------------------------------------------------

def test_a_partial_last_block_goes_before_an_older_whole_block():
    pool, tree = make_tree(CreditPolicy(CreditParams()), num_blocks=16)
    old, recent = [1] * 8, [2] * 10                  # 2 whole blocks; 2 whole + 2 tokens
    cache(pool, tree, old)
    cache(pool, tree, recent)
    assert tree.evict(1) == 1
    assert cached(pool, tree, old)                   # LRU would have trimmed this one
    assert tree.peek_length("ns", recent) == 8       # lost only its two-token block
    tree.check_integrity()


def test_plain_lru_takes_the_oldest_leaf_even_when_another_ends_in_a_partial_block():
    pool, tree = make_tree(LRUPolicy(), num_blocks=16)
    old, recent = [1] * 8, [2] * 10
    cache(pool, tree, old)
    cache(pool, tree, recent)
    assert tree.evict(1) == 1
    assert tree.peek_length("ns", old) == 4 and cached(pool, tree, recent)
    tree.check_integrity()


def test_partial_tails_go_in_lru_order_and_a_hit_moves_one_back():
    pool, tree = make_tree(CreditPolicy(CreditParams()), num_blocks=16)
    first, second = [1] * 6, [2] * 6
    cache(pool, tree, first)
    cache(pool, tree, second)
    hit(pool, tree, first)                           # first is now the more recent
    assert tree.evict(1) == 1
    assert cached(pool, tree, first) and tree.peek_length("ns", second) == 4
    tree.check_integrity()


def test_partial_tails_of_locked_pinned_or_one_block_leaves_stay():
    pool, tree = make_tree(CreditPolicy(CreditParams()), num_blocks=16)
    locked, pinned, short, whole = [1] * 6, [2] * 6, [3] * 3, [4] * 8
    for tokens in (locked, pinned, short, whole):
        cache(pool, tree, tokens)
    match = tree.match("ns", locked)
    tree.pin("ns", pinned, ttl_s=1e9)
    assert tree.evict(1) == 1                        # falls through to plain LRU order
    assert cached(pool, tree, locked) and cached(pool, tree, pinned)
    assert tree.peek_length("ns", short) == 0 and cached(pool, tree, whole)
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
    tree.check_integrity()


def test_a_conversation_keeps_its_whole_blocks_when_its_partial_one_goes():
    pool, tree = make_tree(CreditPolicy(CreditParams()), num_blocks=16)
    turn1 = [5] * 10
    cache(pool, tree, turn1)
    assert tree.evict(1) == 1
    match = tree.match("ns", turn1 + [6] * 4)        # the next turn still reuses 8 tokens
    assert match.length == 8
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
    tree.check_integrity()
