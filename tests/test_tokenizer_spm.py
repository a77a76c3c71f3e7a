"""SentencePiece tokenizers read from GGUF files (``tokenizer.ggml.model == "llama"``).

Two tiny SentencePiece BPE models (Llama/Mistral style with a dummy prefix, Gemma style
without) are trained here, wrapped in HF folders and converted by llama.cpp's own converter
(tests/support/spm.py). Our tokenizer, built from the GGUF metadata alone, must encode as
SentencePiece does under llama.cpp's rules (``SpmReference``), and as transformers' fast
tokenizer of the folder does, except where that one itself departs from SentencePiece: its
``Metaspace`` pre-tokenizer adds no dummy prefix to a stretch of text that already starts with
a space (``" hi"``: SentencePiece ``▁▁hi``, transformers ``▁hi``).

No SentencePiece model is trained, loaded or run in this process, nor any transformers
tokenizer (the sentencepiece wheel brings an OpenMP runtime of its own beside torch's):
``spm.build`` trains, writes the folders and records both references' answers for the texts
below in one subprocess; the last test checks this.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from radixgate.runtime.engine.detokenize import IncrementalDetokenizer
from radixgate.runtime.model.gguf_file import GGUFFile
from radixgate.runtime.model.tokenizer import Tokenizer
from radixgate.runtime.model.tokenizer_gguf import tokenizer_from_gguf
from tests.support import spm

TEXTS = [
    "", " ", "   ", "\n", "Hello world", "The quick brown fox jumps over the lazy dog.",
    " leading space", "   three leading", "trailing  ", "multiple   inner    spaces",
    "line\nbreak\n\n\ttab\t(x)", "\r\n windows\r\n", "digits 1234567 and 3.14159, 2026-11-29",
    "café naïve über façade", "emoji 🤖🚀 日本語 Ελληνικά 👨‍👩‍👧 🇫🇷",
    "gateway radix prefix cache", "QQQ zzz ZZZ", "<0x41> looks like a byte piece",
    "user <tool> call@@arg", "a<ctl>b", " <ctl> ", "<s>[INST] hi [/INST] ok</s>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<bos><eos> <pad>",
    "<unk> <mask>", "<end_of_turn><end_of_turn>", "x" * 40 + " " * 9 + "🤖",
]
LONG_TEXT = "\n".join(spm.corpus(seed=1, lines=120)) + " 🤖 <tool>"
CHATS = [[{"role": "user", "content": "hi 🤖"}, {"role": "assistant", "content": " ok"}]]


@dataclass
class Case:
    style: str
    ours: Tokenizer
    hf: spm.HfReference           # transformers' fast tokenizer of the HF folder, recorded
    ref: spm.SpmReference         # SentencePiece under llama.cpp's rules, recorded
    meta: dict


def _openmp_runtimes() -> set[str]:
    """The OpenMP runtimes (libgomp, libiomp) mapped in this process (Linux; else none)."""
    if not sys.platform.startswith("linux"):
        return set()
    return {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
            if "libgomp" in line or "libiomp" in line}


@pytest.fixture(scope="module", autouse=True)
def sentencepiece_watch():
    """Before the module's other fixtures: the modules and OpenMP runtimes loaded so far, and
    a list that records every SentencePiece model trained or loaded in this process while the
    module runs (where sentencepiece is already imported: its trainer and processor are
    wrapped; a later import shows up as a new module)."""
    calls = []

    def recorded(name, real):
        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return call

    with pytest.MonkeyPatch.context() as mp:
        sp = sys.modules.get("sentencepiece")
        if sp is not None:
            mp.setattr(sp.SentencePieceProcessor, "__init__",
                       recorded("SentencePieceProcessor", sp.SentencePieceProcessor.__init__))
            mp.setattr(sp.SentencePieceTrainer, "train",
                       staticmethod(recorded("SentencePieceTrainer.train", sp.SentencePieceTrainer.train)))
        yield set(sys.modules), _openmp_runtimes(), calls


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return spm.build(tmp_path_factory.mktemp("spm"), texts=TEXTS + [LONG_TEXT], chats=CHATS)


@pytest.fixture(scope="module", params=["llama", "gemma"])
def case(request, built) -> Case:
    fixture = built[request.param]
    meta = GGUFFile(fixture.gguf, load_tensors=False).metadata
    return Case(request.param, tokenizer_from_gguf(meta), fixture.hf, fixture.ref, meta)


def _metaspace_departs(case: Case, text: str) -> bool:
    """Whether transformers' Llama tokenizer drops a dummy prefix SentencePiece adds here."""
    return case.ref.add_dummy_prefix and any(
        f.startswith(" ") for f in case.ref.fragments(text) if f not in case.ref.added())


def _has_added(case: Case, text: str) -> bool:
    return any(f in case.ref.added() for f in case.ref.fragments(text))


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_sentencepiece_under_llama_cpp_rules(case, text):
    assert case.ours.encode(text) == case.ref.encode(text)


@pytest.mark.parametrize("text", TEXTS)
def test_plain_encoding_reads_control_tokens_as_text(case, text):
    """``encode_plain``: control tokens written in the text stay text (SentencePiece spells
    them out piece by piece); user-defined ones are still matched, as llama.cpp does."""
    assert case.ours.encode_plain(text) == case.ref.encode(text, parse_special=False)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_the_hf_fast_tokenizer(case, text):
    if _metaspace_departs(case, text):
        pytest.skip("transformers' Metaspace adds no prefix before a leading space; "
                    "checked against SentencePiece above")
    assert case.ours.encode(text) == case.hf.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_hf_and_round_trips(case, text):
    """transformers decoded the SentencePiece ids (the ids ours must make, checked above) in
    the build subprocess; ours decodes them the same, and its own ids back to the text."""
    ref_ids = case.ref.encode(text)
    assert case.ours.decode(ref_ids) == case.hf.decode(ref_ids)
    assert case.ours.decode(ref_ids, skip_special_tokens=True) == case.hf.decode(ref_ids, skip_special_tokens=True)
    ids = case.ours.encode(text)
    if not (case.style == "llama" and _has_added(case, text)):
        # with a dummy prefix, the text after an added token comes back with its prefix space
        assert case.ours.decode(ids) == text


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_agree_with_decode(case, text, skip):
    """The bytes the incremental detokenizer streams are ``decode``'s text, except the one
    dummy-prefix space ``decode`` strips from the front of a Llama-style text."""
    ids = case.ours.encode(text)
    streamed = IncrementalDetokenizer(case.ours.token_to_bytes)
    kept = [i for i in ids if not (skip and i in case.ours.special_token_ids)]
    text_out = "".join(streamed.feed(i) for i in kept) + streamed.flush()
    assert case.ours.decode_bytes(ids, skip_special_tokens=skip) == text_out.encode()
    expected = case.ours.decode(ids, skip_special_tokens=skip)
    if case.style == "llama" and kept and case.ours.token_to_bytes(kept[0]).startswith(b" "):
        expected = " " + expected
    assert text_out == expected


def test_special_tokens_and_ids(case):
    sp, ours = case.ref.sp, case.ours
    assert ours.vocab_size == sp.vocab_size() == len(case.hf)
    assert (ours.bos_token_id, ours.eos_token_id) == (sp.bos_id(), sp.eos_id())
    assert (ours.bos_token, ours.eos_token) == (case.hf.bos_token, case.hf.eos_token)
    assert ours.special_token_ids == set(case.ref.special.values())
    assert ours.id_to_token(sp.unk_id()) == sp.id_to_piece(sp.unk_id())
    if case.style == "gemma":      # the converter writes eot = 107, Gemma's <end_of_turn>
        assert case.meta["tokenizer.ggml.eot_token_id"] == 107
        assert ours.eos_token_ids == {sp.eos_id(), sp.piece_to_id("<end_of_turn>")} == {1, 107}
    else:
        assert ours.eos_token_ids == {sp.eos_id()}


def test_add_space_prefix_is_read_and_defaults_to_true(case):
    """llama.cpp's converter writes ``add_space_prefix`` for Gemma (False) but not for Llama
    (only when tokenizer_config.json has ``add_prefix_space``): absent means True."""
    key = "tokenizer.ggml.add_space_prefix"
    assert case.meta.get(key, True) is case.ref.add_dummy_prefix
    flipped = tokenizer_from_gguf({**case.meta, key: not case.ref.add_dummy_prefix})
    assert flipped.encode("hi there") != case.ours.encode("hi there")
    assert tokenizer_from_gguf({**case.meta, key: case.ref.add_dummy_prefix}).encode("hi there") \
        == case.ours.encode("hi there")


def test_chat_template_renders_and_encodes_without_an_extra_bos(case):
    messages = CHATS[0]
    text = case.ours.apply_chat_template(messages, add_generation_prompt=False)
    assert text == case.hf.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    ids = case.ours.encode(text)
    assert ids == case.ref.encode(text)
    assert ids[0] == case.ours.bos_token_id and ids.count(case.ours.bos_token_id) == 1


def test_long_text_takes_the_batch_path_with_the_same_ids(case):
    text = LONG_TEXT
    assert len(text) > 4096
    assert case.ours.encode(text) == case.ref.encode(text) == case.ours.encode_batch([text])[0]


def test_merges_never_build_a_control_piece():
    """Pieces that join into a control token's text do not make that token: text can only
    become a control token by being matched whole (and ``encode_plain`` never does that)."""
    tokens = ["<unk>", "<s>", "</s>", "<ab>", "<", "a", "b", ">", "<a", "b>"]
    types = [3, 3, 3, 3, 1, 1, 1, 1, 1, 1]
    scores = [0.0, 0.0, 0.0, 0.0, -4.0, -5.0, -6.0, -7.0, -1.0, -2.0]
    ours = tokenizer_from_gguf({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0})
    assert ours.encode("<ab>") == [3]
    assert ours.encode_plain("<ab>") == [8, 9]                  # "<a" "b>"
    assert ours.decode(ours.encode_plain("<ab>")) == "<ab>"


def test_sentencepiece_never_works_in_this_process(sentencepiece_watch):
    """Last in the module: no test or fixture above trained, loaded or ran SentencePiece (nor
    transformers' tokenizers, which import it) in this process, and no OpenMP runtime got
    mapped (the wheel bundles its own libgomp). Relative to the module's start: the gguf
    package (radixgate's GGUF reader imports it) imports sentencepiece wherever it is
    installed, so the module may be loaded, and its libgomp mapped, before any test runs."""
    modules, runtimes, calls = sentencepiece_watch
    assert calls == []
    assert sorted(m for m in set(sys.modules) - modules
                  if "sentencepiece" in m or m.startswith("transformers") and "tokeniz" in m) == []
    assert _openmp_runtimes() - runtimes == set()
