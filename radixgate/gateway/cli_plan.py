"""``radixgate plan``: the KV capacity planner's table, without loading a model (the
planner is arithmetic: no torch import)."""
from __future__ import annotations

import argparse
import sys

from radixgate.kv.dtypes import KV_DTYPE_BYTES

DESCRIPTION = ("KV capacity planner: bytes per token, and how many tokens and conversations "
               "fit a memory budget (no model is loaded)")


def positive(kind: type):
    """An argparse ``type``: a number of ``kind`` above 0, else argparse's usage error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value
    parse.__name__ = kind.__name__            # argparse names the type in its messages
    return parse


def not_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def add_plan_flags(parser: argparse.ArgumentParser) -> None:
    from radixgate.runtime.model.planner import PRESETS
    parser.add_argument("models", nargs="*", default=None,
                        help=f"preset names ({', '.join(PRESETS)}), GGUF files or HF folders "
                             "('default': SmolLM2-135M-Instruct); default: every preset")
    parser.add_argument("--memory-gb", type=positive(float), default=80.0,
                        help="KV memory budget in GiB, above 0 (default 80)")
    parser.add_argument("--context", type=positive(int), default=8192,
                        help="tokens per conversation, above 0 (default 8192)")
    parser.add_argument("--conversations", type=positive(int), default=None, metavar="C",
                        help="also show the memory C conversations need (default: not shown)")
    parser.add_argument("--dtype-bytes", type=positive(int), default=2,
                        help="bytes per stored number (default 2: float16 / bfloat16)")
    parser.add_argument("--kv-dtype", choices=[*KV_DTYPE_BYTES, "all"], default=None,
                        help="plan for this [cache] kv_dtype, the 8-bit ones with their "
                             "scales; 'all': one row per dtype; replaces --dtype-bytes "
                             "(default: not set, --dtype-bytes decides)")
    parser.add_argument("--window-ratio", type=not_negative_float, default=0.0,
                        help="sliding-window models: window-pool blocks per main block "
                             "([cache] window_ratio; default 0: auto; 1: one pool)")


def plan_command(args: argparse.Namespace) -> int:
    """Prints the planner's table; returns the exit status (2: a model it cannot read)."""
    from radixgate.runtime.model.planner import PRESETS, format_plan_table, plan
    names = args.models or list(PRESETS)
    dtypes = list(KV_DTYPE_BYTES) if args.kv_dtype == "all" else [args.kv_dtype]
    try:
        plans = [plan(n, args.memory_gb, args.context, args.dtype_bytes, d, args.window_ratio)
                 for n in names for d in dtypes]
    except ValueError as exc:
        print(f"radixgate plan: {exc}", file=sys.stderr)
        return 2
    print(format_plan_table(plans, args.conversations))
    return 0
