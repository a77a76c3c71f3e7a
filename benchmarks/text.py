"""Seeded synthetic English for benchmark prompts: word lists + sentence templates.

Everything is drawn from a ``random.Random`` the caller owns, so the same seed gives the
same text on every machine (no downloads, no global RNG). Lengths are targeted in
*approximate* tokens (``CHARS_PER_TOKEN`` characters each, measured on the SmolLM2
tokenizer for this generator's text); the exact counts come from the real tokenizer later.
"""
from __future__ import annotations

import json
import random

CHARS_PER_TOKEN = 4.8   # SmolLM2 BPE on this generator's prose: ~4.8 characters per token

NOUNS = (
    "account invoice customer order shipment warehouse server cluster database table index "
    "query report dashboard metric alert incident ticket release branch commit pipeline job "
    "schedule budget forecast contract vendor policy document section paragraph summary "
    "request response latency throughput region zone bucket file folder permission role user "
    "team manager engineer analyst meeting deadline milestone project roadmap feature bug test "
    "payment refund subscription plan discount price product catalog inventory supplier "
    "network router firewall certificate token session cache queue worker thread process "
    "memory disk backup snapshot replica migration schema field record event log trace span"
).split()
VERBS = (
    "review update create delete archive restore deploy monitor check verify approve reject "
    "escalate assign schedule cancel refund export import summarize compare analyze rotate "
    "configure migrate replicate validate measure estimate reconcile audit notify forward"
).split()
ADJECTIVES = (
    "critical pending overdue active stale primary secondary regional quarterly monthly "
    "internal external encrypted missing duplicate partial complete unusual expected slow "
    "fast large small recent legacy new shared private public default custom optional"
).split()
ADVERBS = "carefully quickly always never usually first then finally promptly safely".split()
NAMES = (
    "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Niaj Olivia Peggy Rupert "
    "Sybil Trent Uma Victor Walter Yara Zoe"
).split()
CITIES = "Lisbon Oslo Austin Denver Nairobi Osaka Lyon Porto Quito Seoul Tallinn Utrecht".split()
QUESTION_STARTS = (
    "How do I", "Can you explain how to", "What is the best way to", "Why does the system",
    "When should we", "Is it possible to", "Could you help me", "What happens if we",
)
SENTENCE_TEMPLATES = (
    "The {adj} {noun} must be {verb_ed} before the {noun2} is {verb2_ed}.",
    "{name} will {verb} every {adj} {noun} in the {city} {noun2} by Friday.",
    "Always {verb} the {noun} {adv} when a {adj} {noun2} appears in the log.",
    "If the {noun} is {adj}, {verb} the {noun2} and notify the {noun3} owner.",
    "Each {noun} belongs to exactly one {noun2}, and each {noun2} has a {adj} {noun3}.",
    "Do not {verb} a {adj} {noun} without approval from the {noun2} team.",
    "The {noun} report for {city} shows {num} {adj} {noun2}s this week.",
    "Use the {noun} tool to {verb} {adj} {noun2}s; it returns at most {num} results.",
    "Our {adj} {noun} policy says a {noun2} older than {num} days is {adj2}.",
    "{name} asked whether the {noun} can {verb} the {noun2} {adv}.",
)


def _past(verb: str) -> str:
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ied"
    return verb + "ed"


class TextGen:
    """Deterministic prose, questions and JSON payloads from one seeded RNG."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def _fill(self, template: str) -> str:
        r = self.rng
        return template.format(
            adj=r.choice(ADJECTIVES), adj2=r.choice(ADJECTIVES), noun=r.choice(NOUNS),
            noun2=r.choice(NOUNS), noun3=r.choice(NOUNS), verb=r.choice(VERBS),
            verb_ed=_past(r.choice(VERBS)), verb2_ed=_past(r.choice(VERBS)),
            adv=r.choice(ADVERBS), name=r.choice(NAMES),
            city=r.choice(CITIES), num=r.randint(2, 500),
        )

    def sentence(self) -> str:
        text = self._fill(self.rng.choice(SENTENCE_TEMPLATES))
        return text[0].upper() + text[1:]

    def paragraph(self, approx_tokens: int) -> str:
        """Sentences until about ``approx_tokens`` tokens (at least one sentence)."""
        target_chars = approx_tokens * CHARS_PER_TOKEN
        parts, size = [], 0
        while not parts or size < target_chars:
            parts.append(self.sentence())
            size += len(parts[-1]) + 1
        return " ".join(parts)

    def document(self, title: str, approx_tokens: int) -> str:
        """A titled document of numbered sections (each ~120 tokens)."""
        sections, size, number = [f"# {title}"], 0, 1
        while size < approx_tokens * CHARS_PER_TOKEN:
            heading = f"## {number}. {self.rng.choice(ADJECTIVES).title()} {self.rng.choice(NOUNS)}s"
            body = self.paragraph(min(120, max(20, approx_tokens - int(size / CHARS_PER_TOKEN))))
            sections += [heading, body]
            size += len(heading) + len(body) + 2
            number += 1
        return "\n\n".join(sections)

    def question(self) -> str:
        r = self.rng
        return (f"{r.choice(QUESTION_STARTS)} {r.choice(VERBS)} the {r.choice(ADJECTIVES)} "
                f"{r.choice(NOUNS)} for {r.choice(NAMES)} in {r.choice(CITIES)}?")

    def reply(self, approx_tokens: int) -> str:
        return self.paragraph(approx_tokens)

    def tool_schema(self, name: str) -> dict:
        """One tool definition: name, description, JSON-schema input (Anthropic shape)."""
        r = self.rng
        props = {}
        for field_name in r.sample(NOUNS, r.randint(2, 5)):
            kind = r.choice(("string", "integer", "boolean"))
            props[field_name] = {"type": kind, "description": self.sentence()}
        required = sorted(r.sample(sorted(props), r.randint(1, len(props))))
        return {"name": name, "description": self.paragraph(40),
                "input_schema": {"type": "object", "properties": props, "required": required}}

    def tool_input(self, schema: dict) -> dict:
        r = self.rng
        out = {}
        for key, spec in schema["input_schema"]["properties"].items():
            kind = spec["type"]
            out[key] = (r.randint(1, 9999) if kind == "integer" else r.random() < 0.5
                        if kind == "boolean" else f"{r.choice(ADJECTIVES)}-{r.choice(NOUNS)}")
        return out

    def observation(self, approx_tokens: int) -> str:
        """A tool result: JSON rows like an API or database would return."""
        r = self.rng
        rows, size = [], 0
        while not rows or size < approx_tokens * 3.0:   # JSON tokenizes denser than prose
            row = {"id": r.randint(1000, 99999), "status": r.choice(ADJECTIVES),
                   "owner": r.choice(NAMES), "region": r.choice(CITIES),
                   "note": self.sentence()}
            rows.append(row)
            size += len(json.dumps(row))
        return json.dumps({"results": rows, "count": len(rows)})

    def unique_words(self, approx_tokens: int) -> str:
        """Prose with a random alphanumeric tag per sentence (shares nothing across calls)."""
        parts, size = [], 0
        while not parts or size < approx_tokens * CHARS_PER_TOKEN:
            tag = "".join(self.rng.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(6))
            parts.append(f"[{tag}] {self.sentence()}")
            size += len(parts[-1]) + 1
        return " ".join(parts)
