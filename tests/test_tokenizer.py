"""Our tokenizer (built from the GGUF vocab/merges) against transformers' GGUF tokenizer."""
import jinja2
import pytest

from radixgate.runtime.model.loader import gguf_tokenizer

SAMPLES = [
    "Hello world!",
    "  leading spaces, trailing  \n\n newlines\t tabs",
    "Numbers 1234567 and 3.14159, dates 2026-11-29.",
    "Unicode: café, naïve, 日本語のテキスト, Ελληνικά, русский текст",
    "Emoji 🤖🚀 and a family 👨‍👩‍👧 plus flags 🇫🇷",
    "code: def f(x):\n    return x ** 2  # comment\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "don't won't it's we'll they've I'm you'd",
]

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime 🤔"},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "Another?"},
]


@pytest.fixture(scope="module")
def tok(default_model_path):
    return gguf_tokenizer(default_model_path)


@pytest.mark.parametrize("text", SAMPLES)
def test_encode_matches_transformers(tok, hf_reference_tokenizer, text):
    assert tok.encode(text) == hf_reference_tokenizer.encode(text, add_special_tokens=False)


def test_chat_formatted_text_matches_transformers(tok, hf_reference_tokenizer):
    text = tok.apply_chat_template(CONVERSATION, add_generation_prompt=True)
    assert tok.encode(text) == hf_reference_tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_renders_like_transformers(tok, hf_reference_tokenizer, add_generation_prompt):
    ours = tok.apply_chat_template(CONVERSATION, add_generation_prompt=add_generation_prompt)
    theirs = hf_reference_tokenizer.apply_chat_template(
        CONVERSATION, add_generation_prompt=add_generation_prompt, tokenize=False)
    assert ours == theirs


def test_default_system_prompt_comes_from_the_models_template(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_literal_special_tokens_become_single_ids_and_no_bos_is_added(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and ids.count(1) == 1
    assert tok.encode("hi") == tok.encode("hi") and tok.bos_token_id not in tok.encode("hi")
    assert tok.encode("") == []


def test_special_ids_eos_and_bos_come_from_metadata(tok):
    assert tok.bos_token_id == 1 and tok.bos_token == "<|im_start|>"
    assert tok.eos_token_id == 2 and tok.eos_token == "<|im_end|>"
    assert tok.eos_token_ids == {0, 2}       # <|endoftext|> also ends generation, as in llama.cpp
    assert {0, 1, 2} <= tok.special_token_ids and tok.vocab_size == 49152


@pytest.mark.parametrize("text", SAMPLES)
def test_decode_round_trips_and_bytes_concatenate_to_utf8(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode_bytes(ids) == text.encode("utf-8")
    assert b"".join(tok.token_to_bytes(i) for i in ids) == text.encode("utf-8")


def test_emoji_is_split_across_tokens_at_byte_level(tok):
    ids = tok.encode("🤖")
    pieces = [tok.token_to_bytes(i) for i in ids]
    assert len(ids) > 1 and b"".join(pieces) == "🤖".encode()
    with pytest.raises(UnicodeDecodeError):
        pieces[0].decode("utf-8")


def test_every_vocabulary_entry_maps_to_its_byte_level_bytes(tok):
    from radixgate.runtime.model.tokenizer import bytes_to_unicode
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    added = set(tok.backend.get_added_tokens_decoder())
    for i in range(tok.vocab_size):
        piece = tok.id_to_token(i)
        if i not in added:
            assert tok.token_to_bytes(i) == bytes(byte_of[c] for c in piece), (i, piece)


def test_ids_past_the_vocabulary_have_no_bytes(tok):
    assert tok.token_to_bytes(49152) == b"" and tok.decode_bytes([33, 10**6]) == tok.token_to_bytes(33)


def test_skip_special_tokens_drops_control_tokens(tok):
    ids = tok.encode("<|im_start|>assistant\nok<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\nok"
    assert tok.decode_bytes(ids, skip_special_tokens=True) == b"assistant\nok"


def test_template_globals_raise_exception_and_tokens(tok):
    from radixgate.runtime.model.tokenizer import Tokenizer
    custom = Tokenizer(tok.backend, bos_token_id=1, eos_token_ids={2}, special_token_ids=set(),
                       chat_template="{{ bos_token }}{% if messages|length > 1 %}"
                                     "{{ raise_exception('one message only') }}{% endif %}"
                                     "{{ messages[0]['content'] }}{{ eos_token }}")
    assert custom.apply_chat_template([{"role": "user", "content": "x"}]) == "<|im_start|>x<|im_end|>"
    with pytest.raises(jinja2.TemplateError, match="one message only"):
        custom.apply_chat_template([{"role": "user", "content": "x"}] * 2)


def test_tokenizer_is_built_once_per_process(default_model_path):
    assert gguf_tokenizer(default_model_path) is gguf_tokenizer("default")


def test_long_texts_encode_to_the_same_ids_without_holding_the_interpreter_lock():
    import threading
    import time

    from radixgate.runtime.model.loader import load_model
    from radixgate.runtime.model.tokenizer import LONG_TEXT_CHARS
    tokenizer = load_model("default", tiny=True).tokenizer
    text = "word <|im_end|> " * 60_000                     # ~1 MB, specials inside
    for encode, backend in ((tokenizer.encode, tokenizer.backend),
                            (tokenizer.encode_plain, tokenizer._plain_backend)):
        assert encode(text) == backend.encode(text, add_special_tokens=False).ids
    assert len(text) > LONG_TEXT_CHARS
    ticks, done = [], threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.01)
    start = time.perf_counter()
    tokenizer.encode_plain(text)
    end = time.perf_counter()
    done.set()
    ticker.join()
    during = [t for t in ticks if start < t < end]
    assert len(during) > 5          # the other thread ran while the text was encoded
