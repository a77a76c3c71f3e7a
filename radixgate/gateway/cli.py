"""The ``radixgate`` command: ``serve``, ``generate``, ``plan``, ``bench``.

    radixgate serve [--config radixgate.toml] [--host H] [--port P] [--model PATH] [--tiny]
                    [--kv-cache-gb G] [--block-size B] [--policy lru|credit]
                    [--kv-disk-dir DIR --kv-disk-gb G]   # the disk tier
                    [--max-model-len N] [--threads N] [--log-level L]
                    [--no-prefix-cache] [--page-rounded-match]   # baselines
                    [--replicas N] [--ray-address ADDR] [--kv-events-endpoint tcp://127.0.0.1:P]
    radixgate generate "prompt" [--chat] [--system S] [--max-tokens N] [--temperature T]
                    [--repeat K] [--tiny] [--model PATH] [--threads N]
    radixgate plan [MODEL...] [--memory-gb G] [--context N] [--conversations C]
                    [--dtype-bytes B | --kv-dtype D|all]   # radixgate/runtime/model/planner.py's arithmetic
    radixgate bench [benchmark args...]    # benchmarks/run_all.py

Flags override the config file (the cache flags its ``[cache]`` section; ``--plain-lru`` is
a deprecated spelling of ``--policy lru``). Without API keys ``serve`` refuses a
non-loopback host.
CPU threads: ``--threads`` > env ``RADIXGATE_THREADS`` > ``[model] threads`` (0: torch's default).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
import warnings
from pathlib import Path

from radixgate.gateway.config import ConfigError, GatewayConfig, load_config
from radixgate.radix_cache.cache_config import KV_DTYPES, POLICIES
from radixgate.radix_cache.kv_dtypes import KV_DTYPE_BYTES

THREADS_ENV = "RADIXGATE_THREADS"
THREADS_HELP = (
    "torch CPU threads (0: torch's default, one per core): the most the engine uses; it "
    "runs on one while other processes keep a core busy (all threads spin-wait for each "
    "other there, several times slower). "
    f"Overrides env {THREADS_ENV}, which overrides [model] threads in the config")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixgate", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP gateway")
    serve.add_argument("--config", help="TOML config file (docs/USAGE.md, Config file)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    _model_flags(serve)
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--body-timeout-s", type=float,
                       help="seconds a request body may take to arrive (else 408)")
    serve.add_argument("--max-unsent-events", type=int,
                       help="events a streaming client may leave unread before its request ends")
    serve.add_argument("--stream-send-buffer-bytes", type=int,
                       help="kernel send buffer of a streaming response (0: the kernel's)")
    serve.add_argument("--no-prefix-cache", dest="enable_prefix_cache", action="store_false",
                       default=None, help="compute every prompt in full (benchmark baseline)")
    serve.add_argument("--page-rounded-match", action="store_true", default=None,
                       help="reuse cached prefixes in whole blocks only (benchmark baseline)")
    serve.add_argument("--plain-lru", action="store_true", default=None,
                       help="deprecated: use --policy lru")
    serve.add_argument("--replicas", type=int, metavar="N",
                       help="N engine replicas on Ray Serve behind the prefix router "
                            "([cluster] replicas; 1: one engine in this process)")
    serve.add_argument("--ray-address", metavar="ADDR",
                       help="join this Ray cluster instead of starting a local one")
    serve.add_argument("--kv-events-endpoint", metavar="tcp://127.0.0.1:PORT",
                       help="publish KV cache events (vLLM's format, ZMQ PUB) here; a "
                            "loopback address unless [server] kv_events_allow_remote")
    serve.add_argument("--state-dir", metavar="DIR",
                       help="the gateway's state folder: cache usage history, explicit cache "
                            "handles ([server] state_dir; default: beside the disk tier's "
                            "folder, none without a tier)")
    gen = sub.add_parser("generate", help="run one prompt through the engine (no HTTP)")
    gen.add_argument("prompt")
    gen.add_argument("--chat", action="store_true", help="render the prompt as a user message")
    gen.add_argument("--system", help="system prompt (implies --chat)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--repeat", type=int, default=1, help="run K times (shows cache reuse)")
    _model_flags(gen)
    _plan_flags(sub.add_parser("plan", help="KV/memory planner (radixgate/runtime/model/planner.py)",
                               description="KV capacity planner: bytes per token, and how "
                                           "many tokens and conversations fit a budget"))
    bench = sub.add_parser("bench", help="benchmarks (benchmarks/run_all.py)", add_help=False)
    bench.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _plan_flags(parser: argparse.ArgumentParser) -> None:
    from radixgate.runtime.model.planner import PRESETS   # no torch: the planner is arithmetic
    parser.add_argument("models", nargs="*", default=None,
                        help=f"preset names ({', '.join(PRESETS)}), GGUF files or HF dirs "
                             "('default' = SmolLM2); default: every preset")
    parser.add_argument("--memory-gb", type=float, default=80.0, help="KV budget in GiB (default 80)")
    parser.add_argument("--context", type=int, default=8192, help="tokens per conversation (default 8192)")
    parser.add_argument("--conversations", type=int, default=None,
                        help="also show the memory this many conversations need")
    parser.add_argument("--dtype-bytes", type=int, default=2, help="bytes per number (2 = fp16/bf16)")
    parser.add_argument("--kv-dtype", choices=[*KV_DTYPE_BYTES, "all"], default=None,
                        help="plan for this [cache] kv_dtype (8-bit ones with their scales; "
                             "'all': one row per dtype); replaces --dtype-bytes")
    parser.add_argument("--window-ratio", type=float, default=0.0,
                        help="sliding-window models: window-pool blocks per main block "
                             "([cache] window_ratio; 0 auto, 1 one pool)")


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="GGUF file or HF directory (default: SmolLM2-135M-Instruct)")
    p.add_argument("--tiny", action="store_true", default=None,
                   help="small random weights with the default tokenizer (tests)")
    p.add_argument("--kv-cache-gb", type=float, help="KV cache budget ([cache] kv_cache_gb)")
    p.add_argument("--block-size", type=int, help="tokens per KV block ([cache] block_size)")
    p.add_argument("--policy", choices=list(POLICIES),
                   help="eviction: lru (plain LRU order) or credit (LRU with credits for "
                        "expected continuations, probation, partial blocks first; default)")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--threads", type=int, metavar="N", help=THREADS_HELP)
    p.add_argument("--spec", choices=["ngram", "none"],
                   help="speculative decoding ([spec] mode): ngram drafts each request's next "
                        "tokens from its own prompt and output and checks them in one step "
                        "(the answer is what it would be without; none: off, the default)")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None,
                   help="deterministic mode ([model] deterministic): a position's logits are "
                        "the same bits however it was scheduled (batched, chunked, cached, "
                        "from the disk tier, 1 or 2 threads); costs prefill speed "
                        "(benchmarks/RESULTS.md)")
    p.add_argument("--weights-dtype", choices=["auto", "float32", "bfloat16", "int8", "int4"],
                   help="form the matmul weights are kept and computed in ([model] weights_dtype; "
                        "auto: int4 for Q4 GGUFs where torch's int4 op exists, else bf16 with "
                        "AVX512-BF16, else float32)")
    p.add_argument("--kv-disk-dir", metavar="DIR",
                   help="folder of the KV disk tier: evicted prefixes are kept there and "
                        "loaded back instead of recomputed, also after a restart ([cache] "
                        "disk_dir; needs --kv-disk-gb; one server per folder; with "
                        "--replicas N, replica i uses DIR/replica-i)")
    p.add_argument("--kv-disk-gb", type=float, metavar="G",
                   help="the disk tier's budget in GiB ([cache] disk_gb; least recently used "
                        "blocks go first); with --replicas N the total, split evenly: G/N "
                        "each (G/max_replicas under autoscaling)")
    p.add_argument("--kv-dtype", choices=list(KV_DTYPES),
                   help="KV cache element type ([cache] kv_dtype; auto: the model's dtype; "
                        "int8 / fp8: 8-bit codes with a float16 scale per token and kv head, "
                        "about 3.9x float32's tokens)")
    p.add_argument("--window-ratio", type=float,
                   help="sliding-window models (Gemma 2/3, Mistral): window-pool blocks per "
                        "main block ([cache] window_ratio; 0 auto, 1 one pool)")


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    overrides = {"model": args.model, "tiny": args.tiny, "kv_cache_gb": args.kv_cache_gb,
                 "block_size": args.block_size, "max_model_len": args.max_model_len,
                 "policy": _policy_override(args), "threads": _threads_override(args.threads),
                 "deterministic": getattr(args, "deterministic", None),
                 "spec": getattr(args, "spec", None),
                 "weights_dtype": getattr(args, "weights_dtype", None),
                 "kv_dtype": getattr(args, "kv_dtype", None),
                 "window_ratio": getattr(args, "window_ratio", None),
                 "kv_disk_dir": getattr(args, "kv_disk_dir", None),
                 "kv_disk_gb": getattr(args, "kv_disk_gb", None)}
    for name in ("host", "port", "log_level", "enable_prefix_cache", "page_rounded_match",
                 "body_timeout_s", "max_unsent_events", "stream_send_buffer_bytes",
                 "replicas", "ray_address", "kv_events_endpoint", "state_dir"):
        overrides[name] = getattr(args, name, None)
    return load_config(getattr(args, "config", None), overrides)


def _policy_override(args: argparse.Namespace) -> str | None:
    """``--policy``, or ``lru`` for the deprecated ``--plain-lru`` (with a FutureWarning)."""
    if not getattr(args, "plain_lru", None):
        return args.policy
    warnings.warn("--plain-lru is deprecated and will be removed; use --policy lru",
                  FutureWarning, stacklevel=2)
    if args.policy not in (None, "lru"):
        raise ConfigError(f"--plain-lru contradicts --policy {args.policy}")
    return "lru"


def _threads_override(flag: int | None) -> int | None:
    """The ``--threads`` flag, else env RADIXGATE_THREADS, else None (the config decides)."""
    if flag is not None:
        return flag
    env = os.environ.get(THREADS_ENV, "").strip()
    if not env:
        return None
    try:
        return int(env)
    except ValueError:
        raise ConfigError(f"{THREADS_ENV} must be an integer, got {env!r}") from None


def apply_threads(config: GatewayConfig) -> None:
    """Set torch's CPU threads before any model work (imports torch: not at module level)."""
    from radixgate.runtime.engine.cpu_threads import set_cpu_threads
    n = set_cpu_threads(config.model.threads)
    logging.getLogger("radixgate.gateway").info("torch CPU threads: %d", n)


def _check_disk_tier(config: GatewayConfig) -> None:
    """An unusable disk tier folder (unwritable, held by another server; with replicas, a
    replica subfolder too) is a ConfigError before anything loads or Ray starts. With
    replicas the folder stays held by this process (``radixgate/cluster/tier_folders.py``)."""
    if not config.cache.disk_dir:
        return
    from radixgate.runtime.kv_tier import TierFolderError, check_disk_folder
    try:
        if config.cluster.enabled:
            from radixgate.cluster.tier_folders import prepare_deployment_folder
            from radixgate.gateway.scaleout import replica_slots
            prepare_deployment_folder(config.cache, replica_slots(config))
        else:
            check_disk_folder(config.cache)
    except TierFolderError as exc:
        raise ConfigError(str(exc)) from None


# subcommands whose arguments belong to another module's own parser
DELEGATES = {"bench": "benchmarks.run_all"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATES:        # passed on untouched, --help included
        return _delegate(DELEGATES[argv[0]], argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "plan":
        return plan_command(args)
    try:
        if args.command == "serve":
            return serve(config_from_args(args))
        return generate(args, config_from_args(args))
    except ConfigError as e:
        print(f"radixgate: {e}", file=sys.stderr)
        return 2


def plan_command(args: argparse.Namespace) -> int:
    """``radixgate plan``: prints the planner's table (no model is loaded), returns the exit code."""
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


def serve(config: GatewayConfig) -> int:
    config.check_host_allowed()
    _check_disk_tier(config)            # refusals first: before the web stack imports
    _setup_logging(config.server.log_level)
    apply_threads(config)
    from radixgate.gateway.state import early_engine_factory
    # the model loads while the web stack imports (replicas start on the app's worker thread)
    factory = None if config.cluster.enabled else early_engine_factory(config)
    from aiohttp import web

    from radixgate.gateway.app import create_app
    from radixgate.gateway.http_util import STATE
    logging.getLogger("radixgate.gateway").info(
        "serving %s on http://%s:%d (%s)", config.model.name, config.server.host,
        config.server.port, "tiny random weights" if config.model.tiny else config.model.path)
    app = create_app(config, engine_factory=factory)
    app.on_startup.append(_stop_if_load_fails)
    app.on_startup.append(_drain_on_signals)
    web.run_app(app, host=config.server.host, port=config.server.port,
                handler_cancellation=True, access_log=None, print=None, handle_signals=False,
                shutdown_timeout=config.server.shutdown_grace_s + 5.0)
    return 1 if app[STATE].load_error else 0


async def _drain_on_signals(app) -> None:
    from radixgate.gateway.app import install_drain_signals
    install_drain_signals(app)


async def _stop_if_load_fails(app) -> None:
    """A server whose model cannot load exits (status 1) instead of answering 503 forever."""
    from radixgate.gateway.http_util import STATE
    state = app[STATE]

    async def watch() -> None:
        await asyncio.to_thread(state.load_done.wait)
        if state.load_error:
            logging.getLogger("radixgate.gateway").error("exiting: %s", state.load_error)
            os.kill(os.getpid(), signal.SIGTERM)

    _watchers.add(asyncio.get_running_loop().create_task(watch()))   # keep a reference


_watchers: set = set()


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def generate(args: argparse.Namespace, config: GatewayConfig) -> int:
    from radixgate.gateway.render import ChatMessage, Conversation, Piece, render_prompt
    from radixgate.gateway.state import default_engine_factory
    from radixgate.runtime.engine.api import Request, SamplingParams
    _setup_logging("warning")
    apply_threads(config)
    engine = default_engine_factory(config)
    try:
        if args.chat or args.system:
            system = (Piece(args.system),) if args.system else ()
            conversation = Conversation(system, (ChatMessage("user", (Piece(args.prompt),)),))
            tokens = render_prompt(engine.tokenizer, conversation).tokens
        else:
            tokens = engine.tokenizer.encode(args.prompt)
        sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
        for _ in range(max(1, args.repeat)):
            finished = engine.generate(Request(list(tokens), sampling))
            if finished.error_kind is not None:
                print(f"error ({finished.error_kind.value}): {finished.error_message}",
                      file=sys.stderr)
                return 1
            print(finished.text)
            u = finished.usage
            ttft = f"{u.ttft_s * 1000:.1f} ms" if u.ttft_s is not None else "-"
            print(f"[usage] prompt={u.prompt_tokens} cached={u.cache_read_tokens} "
                  f"uncached={u.uncached_tokens} output={u.output_tokens} "
                  f"finish={finished.reason.value} ttft={ttft}")
    finally:
        engine.shutdown(grace_s=0)
    return 0


def _delegate(module_name: str, argv: list[str]) -> int:
    if module_name.startswith("benchmarks"):
        _add_repo_root_to_path()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        print(f"radixgate: {module_name} is not available ({e})", file=sys.stderr)
        return 2
    result = module.main(argv)
    return int(result or 0)


def _add_repo_root_to_path() -> None:
    """benchmarks/ is a folder of the checkout, not an installed package: find it next to
    the gateway sources (editable install) or in the working directory."""
    for root in (Path(__file__).resolve().parents[1], Path.cwd()):
        if (root / "benchmarks" / "run_all.py").is_file():
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))
            return


if __name__ == "__main__":
    sys.exit(main())
