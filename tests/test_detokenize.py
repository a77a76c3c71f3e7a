"""Incremental UTF-8-safe detokenization and stop-string hold-back."""
import pytest

from radixgate.runtime.engine.detokenize import IncrementalDetokenizer, token_bytes_function
from radixgate.runtime.engine.stop import StopMatcher


@pytest.fixture(scope="module")
def tokenizer():
    from radixgate.runtime.model.loader import gguf_tokenizer
    return gguf_tokenizer("default")


def _deltas(detok: IncrementalDetokenizer, ids) -> list[str]:
    return [detok.feed(i) for i in ids] + [detok.flush()]


def test_character_split_over_tokens_is_sent_whole():
    emoji = "🎉".encode()                       # 4 bytes, one byte per fake token
    table = {i: bytes([b]) for i, b in enumerate(emoji)} | {9: b"!"}
    deltas = _deltas(IncrementalDetokenizer(table.__getitem__), [0, 1, 2, 3, 9])
    assert deltas == ["", "", "", "🎉", "!", ""]


def test_invalid_bytes_become_replacement_characters():
    table = {0: b"a", 1: b"\xff", 2: b"\xe6\x97"}   # 0xff never valid; e6 97 unfinished
    deltas = _deltas(IncrementalDetokenizer(table.__getitem__), [0, 1, 2])
    assert "".join(deltas) == "a\ufffd\ufffd"
    assert deltas[2] == ""                          # the unfinished character waited


@pytest.mark.parametrize("text", ["héllo wörld", "日本語のテキスト", "emoji 🎉🚀 mix ç", "plain ascii"])
def test_real_tokenizer_deltas_rebuild_the_text_without_broken_characters(tokenizer, text):
    ids = tokenizer.encode(text)
    deltas = _deltas(IncrementalDetokenizer(token_bytes_function(tokenizer)), ids)
    assert "".join(deltas) == text == tokenizer.decode(ids)
    assert all("\ufffd" not in d for d in deltas)


def test_byte_level_tokens_of_multibyte_text_include_partial_characters(tokenizer):
    """The real vocabulary splits some characters over tokens (what the decoder guards)."""
    ids = tokenizer.encode("日本語のテキスト🎉")
    to_bytes = token_bytes_function(tokenizer)
    partial = [i for i in ids if _is_partial(to_bytes(i))]
    assert partial, "expected at least one token that is not whole UTF-8"


def _is_partial(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_stop_string_spanning_pieces_is_found_and_excluded():
    stops = StopMatcher(["STOP"])
    emitted = [stops.feed(piece) for piece in ["Hel", "lo ST", "OP and more"]]
    assert [r.emit for r in emitted] == ["Hel", "lo ", ""]
    assert emitted[-1].stop == "STOP"
    assert stops.flush() == ""


def test_possible_stop_start_is_held_back_then_released():
    stops = StopMatcher(["</end>"])
    assert stops.feed("value </e").emit == "value "
    assert stops.feed("x").emit == "</ex"
    assert stops.feed("tail </").emit == "tail "
    assert stops.flush() == "</"


def test_earliest_stop_string_wins():
    stops = StopMatcher(["world", "lo w"])
    result = stops.feed("hello world")
    assert (result.emit, result.stop) == ("hel", "lo w")


def test_text_without_stop_strings_passes_straight_through():
    stops = StopMatcher([])
    assert stops.feed("anything </").emit == "anything </"
    assert stops.flush() == ""
