"""Token sampling for a whole batch: every transform in one place, one host sync per step.

``sample_tokens`` applies, as tensor operations over the batch (each row with its own
values, no Python loop over the vocabulary), in this order (vLLM's):

1. NaN logits count as ``-inf`` (never picked);
2. ``logit_bias`` (token id -> bias, added to the logit);
3. ``min_tokens``: while a row has fewer output tokens, its EOS ids (unless ``ignore_eos``)
   and ``stop_token_ids`` get ``-inf``;
4. grammar masks (``TokenMasks``, constrained rows only): tokens the row's grammar does not
   allow get ``-inf``; a row whose grammar allows only the end skips step 3 (the grammar
   wins over ``min_tokens``);
5. penalties, as vLLM and HF apply them: ``repetition_penalty`` divides the positive and
   multiplies the negative logits of every token seen in the prompt **or** the output;
   ``frequency_penalty`` subtracts ``penalty x count`` and ``presence_penalty`` subtracts
   ``penalty`` once, both counting **output** tokens only (OpenAI's definition);
6. greedy rows (temperature below ``MIN_TEMPERATURE``) take the argmax here;
7. temperature (after subtracting the row's largest logit, so nothing overflows), then
   ``min_p`` (drop tokens whose probability is below ``min_p`` x the largest), ``top_k``,
   ``top_p`` (the smallest set of most likely tokens whose mass reaches it, over what
   ``min_p`` and ``top_k`` left);
8. one uniform draw per row from the row's own ``torch.Generator`` (seeded from
   ``SamplingParams.seed`` or at random) picks the token by inverse CDF, so a seeded
   request draws the same tokens whatever shares its batch: its noise is its generator's
   n-th number at its n-th sampled token.

The chosen tokens come back with one ``.tolist()``; everything else stays on the logits'
device (per-row values travel host -> device without a sync). Work over ``[rows, V]`` is a
handful of in-place passes over one float32 copy of the logits (a fresh allocation per
pass costs more than the pass on a CPU).

Penalty counts (``TokenCounts``, one per sequence) are sparse and kept on the host,
incrementally: one slot per distinct token of the prompt (built once) and the output, with
its output count; a step adds the tokens appended since the last (normally one per row).
The penalised rows' slots become ``[M]`` tensors by array copies (M: their distinct seen
tokens), so a step costs O(M) gathers and puts, never a ``[rows, V]`` count tensor.

top_p needs the most likely tokens in order. On an accelerator the rows are sorted. On the
CPU a sort costs ~3 ms a row at V = 49k, so the row's ``topk`` candidates (top_k's own, or
the ``TOP_P_CANDIDATES`` most likely) are used when they hold the mass, and only the other
rows are sorted; that choice reads a CPU tensor (no device to wait for).

Edge values are safe per row, so one request's numbers can never fail its batch:

- a temperature below ``MIN_TEMPERATURE`` (1e-5; 0, ``1e-39``, ``5e-324`` ...) is greedy:
  dividing by it would overflow the logits to inf and the softmax to NaN;
- a row with no finite logit picks greedily over the row with NaN as ``-inf``: the first
  ``+inf`` when there is one, else token 0 (a row of only ``-inf``/NaN).
"""
from __future__ import annotations

import math
import random
from array import array
from dataclasses import dataclass

import torch

from radixgate.kernels import native

from .api import SamplingParams, TokenLogprob
from .stop import stop_problem

MIN_TEMPERATURE = 1e-5   # below it a request is greedy
MAX_PENALTY = 2.0        # presence / frequency penalties lie in [-2, 2] (OpenAI)
MAX_LOGIT_BIAS = 100.0   # a logit bias lies in [-100, 100] (OpenAI)
MAX_LOGIT_BIAS_ENTRIES = 1024
NEG_INF = float("-inf")
TOP_P_CANDIDATES = 256    # CPU top_p: tokens looked at before sorting a whole row


def validate_sampling(params: SamplingParams, vocab_size: int) -> str | None:
    """Returns a message describing the first invalid value, or None when all are valid."""
    if params.max_tokens < 1:
        return "max_tokens must be at least 1"
    if params.temperature < 0 or params.temperature != params.temperature:
        return "temperature must be >= 0"
    if not 0.0 < params.top_p <= 1.0:
        return "top_p must lie in (0, 1]"
    if params.top_k < 0:
        return "top_k must be >= 0"
    if not 0.0 <= params.min_p <= 1.0:
        return "min_p must lie in [0, 1]"
    if params.logprobs is not None and not 0 <= params.logprobs <= MAX_LOGPROBS:
        return f"top logprobs must lie in [0, {MAX_LOGPROBS}]"
    return _penalty_problem(params) or _token_problem(params, vocab_size)


def _penalty_problem(params: SamplingParams) -> str | None:
    for name in ("presence_penalty", "frequency_penalty"):
        if not -MAX_PENALTY <= getattr(params, name) <= MAX_PENALTY:
            return f"{name} must lie in [-2, 2]"
    if not 0.0 < params.repetition_penalty < math.inf:
        return "repetition_penalty must be > 0 (1 is off)"
    return None


def _token_problem(params: SamplingParams, vocab_size: int) -> str | None:
    if not 0 <= params.min_tokens <= params.max_tokens:
        return "min_tokens must lie in [0, max_tokens]"
    if any(not isinstance(s, str) or not s for s in params.stop):
        return "stop strings must be non-empty strings"
    if (problem := stop_problem(params.stop)) is not None:
        return problem
    if any(not 0 <= t < vocab_size for t in params.stop_token_ids):
        return "stop_token_ids must be token ids of the model's vocabulary"
    if len(params.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
        return f"logit_bias takes at most {MAX_LOGIT_BIAS_ENTRIES} entries"
    if any(not 0 <= t < vocab_size for t, _ in params.logit_bias):
        return f"logit_bias keys must be token ids of the model's vocabulary [0, {vocab_size})"
    if any(not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS for _, b in params.logit_bias):
        return "logit_bias values must lie in [-100, 100]"
    return None


def _plain_greedy(params: SamplingParams, history: TokenCounts | None) -> bool:
    """A greedy row that no logit processor changes (no logit_bias, no min_tokens still to
    reach, no penalty): its pick is the argmax of the raw logits, NaN read as -inf."""
    if not is_greedy(params) or params.logit_bias or has_penalty(params):
        return False
    return not params.min_tokens or (history.num_output if history else 0) >= params.min_tokens


def is_greedy(params: SamplingParams) -> bool:
    """True when ``params`` picks the argmax (temperature below ``MIN_TEMPERATURE``)."""
    return params.temperature < MIN_TEMPERATURE


def has_penalty(params: SamplingParams) -> bool:
    return (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
            or params.repetition_penalty != 1.0)


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A CPU generator for sampled requests (None for greedy ones: they need no randomness)."""
    if is_greedy(params):
        return None
    seed = params.seed if params.seed is not None else random.getrandbits(63)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return generator


class TokenCounts:
    """One sequence's tokens as its penalties count them (engine thread only).

    ``tokens`` is the sequence's own growing list (prompt then output: only ever appended
    to) and ``num_prompt`` its prompt length. Kept on the host, sparse: one slot per
    distinct token seen (the prompt's first, at the first ``update``), with its output
    count; ``update`` adds the tokens appended since the last call (normally one).
    """

    __slots__ = ("tokens", "num_prompt", "num_counted", "slots", "ids", "counts")

    def __init__(self, tokens: list[int], num_prompt: int):
        self.tokens = tokens
        self.num_prompt = num_prompt
        self.num_counted = 0                      # output tokens in ``counts``
        self.slots: dict[int, int] | None = None  # token id -> slot
        self.ids = array("q")                     # slot -> token id
        self.counts = array("f")                  # slot -> output count

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    def update(self) -> None:
        if self.slots is None:
            distinct = list(dict.fromkeys(self.tokens[:self.num_prompt]))
            self.slots = {token: slot for slot, token in enumerate(distinct)}
            self.ids = array("q", distinct)
            self.counts = array("f", bytes(4 * len(distinct)))
        for token in self.tokens[self.num_prompt + self.num_counted:]:
            slot = self.slots.get(token)
            if slot is None:
                slot = self.slots[token] = len(self.ids)
                self.ids.append(token)
                self.counts.append(0.0)
            self.counts[slot] += 1.0
        self.num_counted = self.num_output


@dataclass(frozen=True, slots=True)
class TokenMasks:
    """Grammar masks of some rows of a batch: ``banned`` [k, V] bool (True: the grammar
    forbids the token) for the batch rows ``rows`` (k of them, ascending); ``ends_only``:
    rows whose grammar allows only the end, which ``min_tokens`` does not hold back."""

    rows: tuple[int, ...]
    banned: torch.Tensor
    ends_only: frozenset[int] = frozenset()

    def row(self, index: int) -> "TokenMasks | None":
        """The mask of batch row ``index`` alone, as row 0 of a one-row batch."""
        if index not in self.rows:
            return None
        at = self.rows.index(index)
        return TokenMasks((0,), self.banned[at:at + 1],
                          frozenset({0}) if index in self.ends_only else frozenset())


def sample_tokens(logits: torch.Tensor, params: list[SamplingParams],
                  generators: list[torch.Generator | None],
                  histories: list[TokenCounts | None] | None = None,
                  eos_ids=(), masks: TokenMasks | None = None) -> list[int]:
    """Picks one token per row. logits: [n, V] (left untouched); ``histories``: each row's
    ``TokenCounts`` (None: nothing generated yet, no prompt seen); ``eos_ids``: the ids
    ``min_tokens`` holds back; ``masks``: the constrained rows' grammar masks. Returns n
    token ids (the step's one host sync)."""
    if masks is None and all(_plain_greedy(p, h) for p, h in zip(params, histories or [None] * len(params))) \
            and native.usable(logits):
        return native.argmax_rows(logits)          # nothing to process: one pass, no copy
    x = processed_logits(logits, params, histories, eos_ids, masks)  # [n, V]
    top, picked = x.max(dim=-1, keepdim=True)                  # [n, 1]: greedy picks
    rows = [i for i, p in enumerate(params) if not is_greedy(p)]
    if len(rows) == len(params):
        picked = _draw(x, top, params, generators, picked)
    elif rows:
        index = _to_device(rows, torch.int64, x.device)         # [s]
        drawn = _draw(x[index], top[index], [params[i] for i in rows],
                      [generators[i] for i in rows], picked[index])
        picked = picked.index_copy(0, index, drawn)
    return picked.squeeze(1).tolist()


def processed_logits(logits: torch.Tensor, params: list[SamplingParams],
                     histories: list[TokenCounts | None] | None = None,
                     eos_ids=(), masks: TokenMasks | None = None) -> torch.Tensor:
    """Steps 1-5 (NaN, logit_bias, min_tokens, grammar masks, penalties) on a float32 copy:
    [n, V]. Brings the histories' counts up to date."""
    histories = histories if histories is not None else [None] * len(params)
    x = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    if logits.dtype == torch.float32:                          # the copy and NaN in one pass
        torch.nan_to_num(logits, nan=NEG_INF, posinf=math.inf, neginf=NEG_INF, out=x)
    else:
        torch.nan_to_num_(x.copy_(logits), nan=NEG_INF, posinf=math.inf, neginf=NEG_INF)
    _apply_logit_bias(x, params)
    _apply_min_tokens(x, params, histories, eos_ids, masks.ends_only if masks else ())
    if masks is not None:
        _apply_masks(x, masks)
    _apply_penalties(x, params, histories)
    return x


def token_distribution(logits: torch.Tensor, params: list[SamplingParams],
                       histories: list[TokenCounts | None] | None = None,
                       eos_ids=(), masks: TokenMasks | None = None) -> torch.Tensor:
    """[n, V]: the distribution each row's token is drawn from (one-hot on the argmax for
    greedy rows and rows without a finite logit). For tests and reports, not the hot path."""
    x = processed_logits(logits, params, histories, eos_ids, masks)
    top, picked = x.max(dim=-1, keepdim=True)
    greedy = torch.nn.functional.one_hot(picked.squeeze(1), x.shape[1]).float()
    finite = torch.isfinite(top)
    probs = _probabilities(x.clone(), top, params)
    sampled = _column([not is_greedy(p) for p in params], x.device, torch.bool) & finite
    return torch.where(sampled, probs / probs.sum(dim=-1, keepdim=True), greedy)


# -- logit processors (greedy rows too): sparse, in place on x ----------------------------

def _apply_logit_bias(x: torch.Tensor, params: list[SamplingParams]) -> None:
    vocab = x.shape[1]
    entries = [(row * vocab + token, bias) for row, p in enumerate(params)
               for token, bias in p.logit_bias]
    if entries:
        flat, biases = zip(*entries)
        x.put_(_to_device(flat, torch.int64, x.device), _to_device(biases, torch.float32, x.device),
               accumulate=True)


def _apply_min_tokens(x: torch.Tensor, params: list[SamplingParams],
                      histories: list[TokenCounts | None], eos_ids, exempt=()) -> None:
    """Rows short of ``min_tokens`` cannot pick a token that would end them (except the
    ``exempt`` rows, whose grammar allows only the end)."""
    vocab = x.shape[1]
    flat: list[int] = []
    for row, (p, history) in enumerate(zip(params, histories)):
        if row in exempt:
            continue
        if p.min_tokens and (history.num_output if history else 0) < p.min_tokens:
            banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids))
            flat += [row * vocab + token for token in banned]
    if flat:
        x.put_(_to_device(flat, torch.int64, x.device),
               torch.full((len(flat),), NEG_INF, device=x.device))


def _apply_masks(x: torch.Tensor, masks: TokenMasks) -> None:
    """The constrained rows' banned tokens get -inf; other rows are not touched."""
    banned = _host_to(masks.banned, x.device)                              # [k, V]
    if len(masks.rows) == x.shape[0]:
        x.masked_fill_(banned, NEG_INF)
        return
    index = _to_device(list(masks.rows), torch.int64, x.device)            # [k]
    x.index_copy_(0, index, x.index_select(0, index).masked_fill_(banned, NEG_INF))


def _apply_penalties(x: torch.Tensor, params: list[SamplingParams],
                     histories: list[TokenCounts | None]) -> None:
    """Over the (row, token) pairs that penalised rows have seen only: [M] values, M the
    distinct tokens of their prompts and outputs; the host builds them with array copies."""
    rows = [i for i, (p, h) in enumerate(zip(params, histories))
            if h is not None and has_penalty(p)]
    if not rows:
        return
    pairs = {"row": array("q"), "id": array("q"), "count": array("f"),
             "repetition": array("f"), "frequency": array("f"), "presence": array("f")}
    for row in rows:
        history, p = histories[row], params[row]
        history.update()
        n = len(history.ids)
        pairs["row"].extend(array("q", [row]) * n)
        pairs["id"].extend(history.ids)
        pairs["count"].extend(history.counts)
        pairs["repetition"].extend(array("f", [p.repetition_penalty]) * n)
        pairs["frequency"].extend(array("f", [p.frequency_penalty]) * n)
        pairs["presence"].extend(array("f", [p.presence_penalty]) * n)
    if not pairs["id"]:
        return
    t = {name: _host_to(torch.frombuffer(values, dtype=torch.int64 if values.typecode == "q"
                                         else torch.float32), x.device)
         for name, values in pairs.items()}                                # each [M]
    flat = t["row"] * x.shape[1] + t["id"]                                 # [M] into x
    values = x.take(flat)                                                  # [M]
    if any(params[i].repetition_penalty != 1.0 for i in rows):  # every pair is a seen token
        values = torch.where(values > 0, values / t["repetition"], values * t["repetition"])
    count = t["count"]
    values -= t["frequency"] * count + t["presence"] * (count > 0)
    x.put_(flat, values)


# -- the draw (sampled rows), in place on x ------------------------------------------------

def _draw(x: torch.Tensor, top: torch.Tensor, params: list[SamplingParams],
          generators: list[torch.Generator | None], greedy: torch.Tensor) -> torch.Tensor:
    """x: [s, V] processed logits of sampled rows (overwritten), top: [s, 1] their largest;
    greedy: [s, 1] their argmax (kept for rows without a finite logit). One uniform per row
    picks by inverse CDF."""
    probs = _probabilities(x, top, params)                 # [s, V] unnormalized
    uniform = _uniforms(generators, x.device)              # [s, 1] in [0, 1)
    cdf = torch.cumsum(probs, dim=-1, out=probs)           # [s, V] in place
    total = cdf[:, -1:]                                    # [s, 1] > 0 where finite
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    token = torch.searchsorted(cdf, target, right=True)   # [s, 1], < V where finite
    return torch.where(torch.isfinite(top) & (token < cdf.shape[1]), token, greedy)


def _probabilities(x: torch.Tensor, top: torch.Tensor, params: list[SamplingParams]
                   ) -> torch.Tensor:
    """Temperature, min_p, top_k, top_p over x [s, V] (overwritten; top: [s, 1] its row
    maxima): [s, V] probabilities, unnormalized (the largest is 1), zero where filtered.
    Rows without a finite logit come out as NaN or inf (their pick is the greedy one)."""
    device = x.device
    inverse = _column([1.0 / max(p.temperature, MIN_TEMPERATURE) for p in params], device)
    shift = -top.nan_to_num(0.0, 0.0, 0.0) * inverse                      # [s, 1]
    torch.addcmul(shift, x, inverse, out=x)             # (x - top) / T in one pass, max 0
    if any(p.temperature == math.inf for p in params):
        torch.nan_to_num_(x, nan=NEG_INF)                                 # -inf / inf
    floor, candidates = _floors(x, params)                                # [s, 1]
    if floor is not None:
        x.masked_fill_(x < floor, NEG_INF)
    probs = x.exp_()                                                      # [s, V] max 1
    return _top_p(probs, params, candidates)


def _floors(x: torch.Tensor, params: list[SamplingParams]):
    """The per-row logit floor of min_p (log min_p: the largest is 0) and top_k (the k-th
    largest), or None when no row has either; and the top candidates (values and ids, sorted,
    or None) that ``_top_p`` may reuse."""
    vocab, device = x.shape[1], x.device
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    needs_candidates = x.device.type == "cpu" and any(   # top_p rows that top_k leaves wide
        p.top_p < 1.0 and not 0 < p.top_k < vocab for p in params)
    width = min(vocab, max(max(ks), TOP_P_CANDIDATES if needs_candidates else 0))
    floor = None
    if any(p.min_p > 0 for p in params):
        floor = _column([math.log(p.min_p) if p.min_p > 0 else NEG_INF for p in params], device)
    candidates = torch.topk(x, width, dim=-1) if width else None        # [s, width]
    if any(ks):
        kth = candidates.values.gather(1, _column([max(k, 1) - 1 for k in ks], device,
                                                  torch.int64))            # [s, 1]
        kth = kth.masked_fill_(_column([k == 0 for k in ks], device, torch.bool), NEG_INF)
        floor = kth if floor is None else torch.maximum(floor, kth)
    return floor, candidates


def _top_p(probs: torch.Tensor, params: list[SamplingParams], candidates) -> torch.Tensor:
    """Keeps, in each row with top_p < 1, the smallest set of most likely tokens whose mass
    reaches top_p of the row's (at least one; ties at its edge are kept too); the rest get 0.

    On an accelerator the rows are sorted. On the CPU, where sorting a vocabulary costs
    milliseconds a row, the ``TOP_P_CANDIDATES`` most likely tokens (found with top_k's
    ``topk``) are used when they hold the mass, and only the other rows are sorted: on the
    CPU that choice reads the tensor without any device to wait for."""
    rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if not rows:
        return probs
    device = probs.device
    every = len(rows) == len(params)
    index = None if every else _to_device(rows, torch.int64, device)       # [t]
    sub = probs if every else probs[index]                                 # [t, V]
    top_p = _column([params[i].top_p for i in rows], device)               # [t, 1]
    total = sub.sum(dim=-1, keepdim=True)                                  # [t, 1]
    if candidates is None or device.type != "cpu":
        floor = _mass_floor(torch.sort(sub, dim=-1, descending=True).values, top_p * total)
    else:
        ordered = sub.gather(1, candidates.indices if every else candidates.indices[index])
        floor = _mass_floor(ordered, top_p * total)
        short = (ordered.sum(dim=-1) < (top_p * total).squeeze(1)).tolist()  # CPU: no sync
        if any(short):
            uncovered = [i for i, s in enumerate(short) if s]
            full = torch.sort(sub[uncovered], dim=-1, descending=True).values
            floor[uncovered] = _mass_floor(full, (top_p * total)[uncovered])
    sub.masked_fill_(sub < floor, 0.0)
    return sub if every else probs.index_copy_(0, index, sub)


def _mass_floor(ordered: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """ordered: [t, K] probabilities, descending; mass: [t, 1]. The smallest probability
    kept: the last one whose mass before it is below ``mass`` (the first is always kept)."""
    before = torch.cumsum(ordered, dim=-1) - ordered                       # [t, K]
    last = (before < mass).sum(dim=-1, keepdim=True).clamp_(min=1) - 1     # [t, 1]
    return ordered.gather(1, last)


def _uniforms(generators: list[torch.Generator | None], device) -> torch.Tensor:
    """[s, 1]: each row's next uniform from its own generator (a fresh one when None)."""
    draws = torch.cat([torch.rand(1, generator=g) for g in generators])  # [s] on the host
    return _host_to(draws, device)[:, None]


# -- helpers ------------------------------------------------------------------------------

def _to_device(values, dtype: torch.dtype, device) -> torch.Tensor:
    return _host_to(torch.tensor(values, dtype=dtype), device)


def _column(values, device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return _to_device(values, dtype, device)[:, None]


def _host_to(tensor: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on ``device`` without a sync (pinned, non-blocking to an accelerator)."""
    if torch.device(device).type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def top2_gaps(logits: torch.Tensor) -> list[float]:
    """Difference between the best and second-best logit of each row (near-tie detection)."""
    top = torch.topk(logits.float(), 2, dim=-1).values  # [n, 2]
    return (top[:, 0] - top[:, 1]).tolist()


# -- log probabilities ------------------------------------------------------------------

MAX_LOGPROBS = 20


def token_logprobs(logits: torch.Tensor, wanted: list[int | None],
                   tokens: list[int | None]) -> list[TokenLogprob | None]:
    """Each chosen token's log probability under the model's own distribution (log-softmax
    of the raw logits: temperature 1, before penalties, bias and filters; NaN as -inf) and
    the ``wanted[row]`` most likely alternatives, for the rows that want them (None: off).
    One batched pass over those rows and one host transfer."""
    rows = [i for i, k in enumerate(wanted) if k is not None and tokens[i] is not None]
    out: list[TokenLogprob | None] = [None] * len(wanted)
    if not rows:
        return out
    x = torch.nan_to_num(logits[rows].float(), nan=float("-inf"))          # [r, V]
    logp = torch.log_softmax(x, dim=-1)                                    # [r, V]
    chosen = torch.tensor([tokens[i] for i in rows], device=logp.device)   # [r]
    picked = logp.gather(1, chosen[:, None]).squeeze(1)                    # [r]
    k = min(max(wanted[i] for i in rows), MAX_LOGPROBS)
    top_values, top_ids = logp.topk(k, dim=-1) if k else (logp[:, :0], chosen[:, None][:, :0])
    picked, top_values, top_ids = picked.tolist(), top_values.tolist(), top_ids.tolist()
    for j, i in enumerate(rows):
        n = min(wanted[i], MAX_LOGPROBS)
        out[i] = TokenLogprob(tokens[i], picked[j], tuple(zip(top_ids[j][:n], top_values[j][:n])))
    return out
