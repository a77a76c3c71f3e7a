"""Tiny SentencePiece models for the GGUF tokenizer tests, built offline in a temp folder.

``build(folder, texts, chats)`` trains a small SentencePiece BPE model (byte fallback,
user-defined and control symbols) on text made here, writes an HF model folder around it
(``tokenizer.model``, the ``tokenizer.json`` transformers makes from it,
``tokenizer_config.json`` and a 1-layer random model), converts that folder with llama.cpp's
own converter, and records what the references make of the given texts: ``SpmReference``
(how llama.cpp encodes, with the real SentencePiece model) and ``HfReference`` (transformers'
fast tokenizer of the folder). Two styles:

* ``"llama"``: Llama 2 / Mistral v0.x: ``<unk> <s> </s>``, a dummy prefix space.
* ``"gemma"``: Gemma's id layout (``<pad> <eos> <bos> <unk> <mask> <2mass> [@BOS@]``,
  ``<unused0..98>``, then ``<start_of_turn>`` = 106 and ``<end_of_turn>`` = 107, the ids the
  converter hardcodes), no dummy prefix, and a user-defined ``▁▁`` piece.

Everything that needs ``sentencepiece`` (training, transformers' Llama/Gemma tokenizers, the
reference encodings) runs in one subprocess, ``python -m tests.support.spm build FOLDER``
(the request as JSON on stdin, the answers as JSON files in FOLDER), never in the test
process: the sentencepiece wheel brings an OpenMP runtime of its own beside torch's.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.support.convert import convert

SPACE = "\u2581"
ROOT = Path(__file__).resolve().parents[2]

_STYLES = {
    "llama": dict(
        vocab_size=640, add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
        control_symbols=["<ctl>"], user_defined_symbols=["<tool>", "@@"]),
    "gemma": dict(
        vocab_size=800, add_dummy_prefix=False, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        control_symbols=(["<mask>", "<2mass>", "[@BOS@]"] + [f"<unused{i}>" for i in range(99)]
                         + ["<start_of_turn>", "<end_of_turn>"]),
        user_defined_symbols=["<tool>", "@@", SPACE * 2]),
}

_TEMPLATES = {
    "llama": ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
              "[INST] {{ m['content'] }} [/INST]{% else %}{{ m['content'] }}{{ eos_token }}"
              "{% endif %}{% endfor %}"),
    "gemma": ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
              "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
              "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
}


def corpus(seed: int = 0, lines: int = 500) -> list[str]:
    """~28 KB of varied lines: real and made-up words, capitals, digits, runs of spaces, tabs,
    accented letters (no emoji: those must come out through byte fallback)."""
    rng = random.Random(seed)
    syllables = "ka ri to me na so lu pe di mo ra ne ti ko sa fu gi ha be zo the and ing ion ed er qu st ch sh".split()
    words = ("the quick brown fox jumps over lazy dog token cache prefix radix gateway model serve "
             "request prompt hello world python code function return value").split()
    words += ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(300)]
    out = []
    for i in range(lines):
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 14)))
        if i % 5 == 0:
            line = line.capitalize() + "."
        if i % 7 == 0:
            line += f" {rng.randint(0, 99999)}"
        if i % 11 == 0:
            line = "    " + line + "\t(x)"
        if i % 13 == 0:
            line += " café naïve über façade"
        out.append(line)
    return out


# --- the HF folders: written in the build subprocess only (sentencepiece, transformers) ---

def train(folder: Path, style: str) -> Path:
    """Train the style's SentencePiece BPE model into ``folder/tokenizer.model``."""
    import sentencepiece as spm
    folder.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_prefix=str(folder / "tokenizer"), model_type="bpe",
        byte_fallback=True, character_coverage=1.0, split_digits=True,
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        normalization_rule_name="identity", minloglevel=2, **_STYLES[style])
    (folder / "tokenizer.vocab").unlink()
    return folder / "tokenizer.model"


def hf_tokenizer(hf_dir: Path, style: str):
    """transformers' fast tokenizer made from the folder's tokenizer.model (``legacy``: the
    dummy prefix goes before every stretch of text between added tokens, as in llama.cpp)."""
    import transformers
    cls = transformers.GemmaTokenizer if style == "gemma" else transformers.LlamaTokenizer
    return cls.from_pretrained(str(hf_dir), legacy=True)


def _tokenizer_config(tok, style: str) -> dict:
    """tokenizer_config.json as hub models carry it: the added tokens with their ids and
    ``special`` flags (the converter reads them to mark control and user-defined tokens)."""
    added = {str(i): {"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip,
                      "normalized": t.normalized, "single_word": t.single_word, "special": t.special}
             for i, t in sorted(tok.added_tokens_decoder.items())}
    return {"tokenizer_class": type(tok).__name__, "legacy": True, "add_bos_token": True,
            "add_eos_token": False, "added_tokens_decoder": added,
            "bos_token": tok.bos_token, "eos_token": tok.eos_token, "unk_token": tok.unk_token,
            "pad_token": tok.pad_token, "chat_template": _TEMPLATES[style],
            "clean_up_tokenization_spaces": False, "model_max_length": 512}


def _model_shapes(vocab: int, tied: bool) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a 1-layer Llama/Gemma (hidden 32, 2 heads of 16, 1 KV head),
    as ``save_pretrained`` writes them (lm_head only when untied)."""
    layer = "model.layers.0."
    shapes = {"model.embed_tokens.weight": (vocab, 32), "model.norm.weight": (32,),
              layer + "input_layernorm.weight": (32,), layer + "post_attention_layernorm.weight": (32,),
              layer + "self_attn.q_proj.weight": (32, 32), layer + "self_attn.k_proj.weight": (16, 32),
              layer + "self_attn.v_proj.weight": (16, 32), layer + "self_attn.o_proj.weight": (32, 32),
              layer + "mlp.gate_proj.weight": (64, 32), layer + "mlp.up_proj.weight": (64, 32),
              layer + "mlp.down_proj.weight": (32, 64)}
    return shapes if tied else {**shapes, "lm_head.weight": (vocab, 32)}


def _save_model(hf_dir: Path, style: str, tok) -> None:
    """A random 1-layer model of the tokenizer's vocabulary size: config.json and
    model.safetensors as transformers' ``save_pretrained`` writes them for
    ``LlamaForCausalLM`` / ``GemmaForCausalLM``, written with numpy (building the model with
    torch costs ~4 s of imports; the converter only reads the files)."""
    import numpy as np
    from safetensors.numpy import save_file
    gemma = style == "gemma"
    config = {"architectures": ["GemmaForCausalLM" if gemma else "LlamaForCausalLM"],
              "model_type": style, "vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 16, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
              "hidden_act": "gelu_pytorch_tanh" if gemma else "silu", "tie_word_embeddings": gemma,
              "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
              "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
              "pad_token_id": tok.pad_token_id, "dtype": "float32"}
    (hf_dir / "config.json").write_text(json.dumps(config, indent=1))
    rng = np.random.default_rng(0)
    tensors = {name: (rng.standard_normal(shape) * 0.02).astype(np.float32)
               for name, shape in _model_shapes(len(tok), tied=gemma).items()}
    save_file(tensors, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})


def write_hf_folder(hf_dir: Path, style: str) -> Path:
    """tokenizer.model + tokenizer.json + tokenizer_config.json + a tiny model in ``hf_dir``.
    Subprocess only (imports sentencepiece)."""
    train(hf_dir, style)
    tok = hf_tokenizer(hf_dir, style)
    tok.save_pretrained(str(hf_dir))
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(tok, style), indent=1))
    _save_model(hf_dir, style, tok)
    return hf_dir


# --- in the test process: no sentencepiece, no transformers tokenizers ---

@dataclass(frozen=True)
class SpmFixture:
    """One converted tiny model: its HF folder, the GGUF file made from it, and what the two
    references made of the texts ``build`` was given."""
    style: str
    hf_dir: Path
    gguf: Path
    ref: "SpmReference"
    hf: "HfReference"

    @property
    def spm_path(self) -> Path:
        return self.hf_dir / "tokenizer.model"


def build(folder: Path, texts=(), chats=(), styles=tuple(_STYLES)) -> dict[str, SpmFixture]:
    """Each style's HF folder under ``folder``, its f32 GGUF from llama.cpp's converter, and
    the references' answers for ``texts`` and for the chats (message lists, rendered without
    a generation prompt; their rendered texts are encoded too). One subprocess writes the
    folders and computes the answers; each conversion (~8 s: a subprocess that imports
    torch) starts as soon as its folder is written, and they run side by side."""
    folder = Path(folder)
    request = json.dumps({"styles": list(styles), "texts": list(texts), "chats": list(chats)})
    log = folder / "spm-build.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    jobs = {}
    with ThreadPoolExecutor(len(styles)) as pool, open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.spm", "build", str(folder)],
                                cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True)
        watchdog = threading.Timer(300, proc.kill)
        watchdog.start()
        try:
            proc.stdin.write(request)
            proc.stdin.close()
            for line in proc.stdout:
                if line.startswith("ready "):
                    style = line.split()[1]
                    jobs[style] = pool.submit(convert, folder / f"{style}-hf", folder / f"{style}.gguf", "f32")
            rc = proc.wait()
        finally:
            watchdog.cancel()
        if rc:
            raise RuntimeError(f"python -m tests.support.spm build failed ({rc}):\n{log.read_text()[-3000:]}")
        out = {}
        for style in styles:
            answers = json.loads((folder / f"{style}-ref.json").read_text())
            out[style] = SpmFixture(style, folder / f"{style}-hf", jobs[style].result(),
                                    SpmReference(answers["spm"]), HfReference(answers["hf"]))
        return out


class RecordedProcessor:
    """The few ``SentencePieceProcessor`` answers the tests read, recorded from the model."""

    def __init__(self, info: dict):
        self._info, self._pieces = info, info["pieces"]

    def vocab_size(self) -> int:
        return len(self._pieces)

    def bos_id(self) -> int:
        return self._info["bos_id"]

    def eos_id(self) -> int:
        return self._info["eos_id"]

    def unk_id(self) -> int:
        return self._info["unk_id"]

    def id_to_piece(self, i: int) -> str:
        return self._pieces[i]

    def piece_to_id(self, piece: str) -> int:
        return self._pieces.index(piece)


class SpmReference:
    """What llama.cpp makes of a text, with the real SentencePiece model: added tokens
    (control and unknown ones only with ``parse_special``; user-defined always) are cut out
    of the raw text first, then each stretch between them is encoded by SentencePiece on its
    own (so each gets the dummy prefix, where the model has one). The encodings were made in
    the build subprocess (``_spm_answers``); ``encode`` answers only the texts recorded there."""

    def __init__(self, answers: dict):
        self.sp = RecordedProcessor(answers["sp"])
        self.special: dict[str, int] = answers["special"]
        # llama.cpp's converter writes user-defined pieces with real spaces ("▁▁" -> "  ")
        self.user: dict[str, int] = answers["user"]
        self.add_dummy_prefix: bool = answers["add_dummy_prefix"]
        self._ids = {True: answers["ids"], False: answers["ids_plain"]}

    def added(self, parse_special: bool = True) -> dict[str, int]:
        return {**self.user, **(self.special if parse_special else {})}

    def fragments(self, text: str, parse_special: bool = True) -> list[str]:
        return split_on_added(text, list(self.added(parse_special)))

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        try:
            return self._ids[parse_special][text]
        except KeyError:
            raise KeyError(f"{text!r} was not given to spm.build: no SentencePiece encoding") from None


class HfReference:
    """transformers' fast tokenizer of the HF folder (``AutoTokenizer``), as recorded in the
    build subprocess (``_hf_answers``): ``encode`` of the texts, ``decode`` of each text's
    ``SpmReference`` ids, the chats' renderings."""

    def __init__(self, answers: dict):
        self._answers = answers
        self.bos_token, self.eos_token = answers["bos_token"], answers["eos_token"]

    def __len__(self) -> int:
        return self._answers["len"]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert not add_special_tokens, "only add_special_tokens=False is recorded"
        return self._lookup("ids", text)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._lookup("skip" if skip_special_tokens else "decode", _ids_key(ids))

    def apply_chat_template(self, messages, add_generation_prompt: bool = False, tokenize: bool = True) -> str:
        assert not tokenize and not add_generation_prompt, "only rendered text, no generation prompt"
        return self._lookup("chat", json.dumps(messages))

    def _lookup(self, table: str, key: str):
        try:
            return self._answers[table][key]
        except KeyError:
            raise KeyError(f"{key!r} is not among transformers' recorded {table!r} answers") from None


def _ids_key(ids) -> str:
    return ",".join(map(str, ids))


def split_on_added(text: str, added: list[str]) -> list[str]:
    """``text`` cut into pieces at each (leftmost, longest) occurrence of an added token, the
    tokens kept as their own pieces; empty pieces dropped. What llama.cpp's tokenizer does
    before it encodes each text piece on its own."""
    pieces, start, i = [], 0, 0
    by_length = sorted(added, key=len, reverse=True)
    while i < len(text):
        hit = next((a for a in by_length if text.startswith(a, i)), None)
        if hit is None:
            i += 1
            continue
        pieces += [text[start:i], hit]
        i = start = i + len(hit)
    pieces.append(text[start:])
    return [p for p in pieces if p]


# --- the references' answers: computed in the build subprocess only ---

def _spm_answers(model_path: Path, texts: list[str]) -> dict:
    """The real SentencePiece model's pieces and its llama.cpp-rule encodings of ``texts``."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(model_path).read_bytes())
    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    kinds = proto.SentencePiece.Type
    special = {p.piece: i for i, p in enumerate(proto.pieces) if p.type in (kinds.CONTROL, kinds.UNKNOWN)}
    user = {p.piece.replace(SPACE, " "): i for i, p in enumerate(proto.pieces)
            if p.type == kinds.USER_DEFINED}

    def encode(text: str, parse_special: bool) -> list[int]:
        added, ids = {**user, **(special if parse_special else {})}, []
        for fragment in split_on_added(text, list(added)):
            ids += [added[fragment]] if fragment in added else sp.encode(fragment)
        return ids

    return {"special": special, "user": user,
            "add_dummy_prefix": proto.normalizer_spec.add_dummy_prefix,
            "sp": {"pieces": [sp.id_to_piece(i) for i in range(sp.vocab_size())],
                   "bos_id": sp.bos_id(), "eos_id": sp.eos_id(), "unk_id": sp.unk_id()},
            "ids": {t: encode(t, True) for t in texts},
            "ids_plain": {t: encode(t, False) for t in texts}}


def _hf_answers(hf, texts: list[str], chats: list, ids: dict[str, list[int]]) -> dict:
    """What ``hf`` (transformers' ``AutoTokenizer`` of the written folder) makes of ``texts``,
    of the SentencePiece ids ``ids`` and of ``chats``."""
    return {"len": len(hf), "bos_token": hf.bos_token, "eos_token": hf.eos_token,
            "ids": {t: hf.encode(t, add_special_tokens=False) for t in texts},
            "decode": {_ids_key(i): hf.decode(i) for i in ids.values()},
            "skip": {_ids_key(i): hf.decode(i, skip_special_tokens=True) for i in ids.values()},
            "chat": {json.dumps(m): hf.apply_chat_template(m, add_generation_prompt=False, tokenize=False)
                     for m in chats}}


def _build_main(folder: Path, request: dict) -> None:
    """Write each style's folder (``ready STYLE`` on stdout when done, so that its conversion
    can start), then each style's answers to ``folder/STYLE-ref.json``."""
    styles, chats = request["styles"], request["chats"]
    for style in styles:
        write_hf_folder(folder / f"{style}-hf", style)
        print("ready", style, flush=True)
    from transformers import AutoTokenizer
    for style in styles:
        hf_dir = folder / f"{style}-hf"
        hf = AutoTokenizer.from_pretrained(str(hf_dir))
        rendered = [hf.apply_chat_template(m, add_generation_prompt=False, tokenize=False) for m in chats]
        texts = list(dict.fromkeys(request["texts"] + rendered))
        spm_answers = _spm_answers(hf_dir / "tokenizer.model", texts)
        hf_answers = _hf_answers(hf, texts, chats, spm_answers["ids"])
        (folder / f"{style}-ref.json").write_text(json.dumps({"spm": spm_answers, "hf": hf_answers}))


if __name__ == "__main__":
    if sys.argv[1:2] != ["build"] or len(sys.argv) != 3:
        sys.exit("usage: python -m tests.support.spm build FOLDER < request.json")
    _build_main(Path(sys.argv[2]), json.loads(sys.stdin.read()))
