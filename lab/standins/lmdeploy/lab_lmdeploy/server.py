"""`lmdeploy` of the lab stand-in: LMDeploy's own CLI parses the command line, then a canned-text server.

The real parser (lmdeploy.cli: `lmdeploy serve api_server <model> ...`) takes the argv and refuses what
0.16.0 refuses; the real entrypoint fills model_name from the path. Then, where TurboMind would start:
the model directory must hold config.json; its `architectures` must be one TurboMind loads (the real
SUPPORTED_ARCHS) or LMDeploy falls back to its PyTorch engine, which the stand-in does not have; the real
TurbomindEngineConfig is built from the arguments as api_server builds it; the container must have been
given `--tp` GPUs. It serves what lmdeploy's api_server serves the program: /health, /v1/models,
/v1/chat/completions and /v1/completions (streamed and not, with usage), 404 for any name but
--model-name, and /metrics from lmdeploy's own PrometheusStatLogger on the real prometheus_client.
"""

import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time
import types
import uuid
from http.server import ThreadingHTTPServer

from lab_lmdeploy.boot import SITE
from openai_http import OpenAIHandler

DEFAULT_PORT = 23333  # api_server's port when --server-port is unset (lmdeploy/cli/serve.py)


def fail(message):
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    sys.exit(1)


def supported_archs():
    """TurboMind's SUPPORTED_ARCHS, from lmdeploy/turbomind/supported_models.py itself (the package's
    __init__, which loads the CUDA library, is not run)."""
    if "lmdeploy.turbomind" not in sys.modules:
        pkg = types.ModuleType("lmdeploy.turbomind")
        pkg.__path__ = [str(SITE / "lmdeploy" / "turbomind")]
        sys.modules["lmdeploy.turbomind"] = pkg
    name = "lmdeploy.turbomind.supported_models"
    spec = importlib.util.spec_from_file_location(name, SITE / "lmdeploy" / "turbomind" / "supported_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.SUPPORTED_ARCHS


def engine_config(args, max_batch_size):
    """lmdeploy's own TurbomindEngineConfig, from the arguments as SubCliServe.api_server builds it."""
    from lmdeploy.messages import TurbomindEngineConfig

    return TurbomindEngineConfig(
        dtype=args.dtype,
        tp=args.tp,
        dp=args.dp,
        cp=args.cp,
        ep=args.ep,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        dist_init_addr=args.dist_init_addr,
        max_batch_size=max_batch_size,
        session_len=args.session_len,
        model_format=args.model_format,
        quant_policy=args.quant_policy,
        rope_scaling_factor=args.rope_scaling_factor,
        cache_max_entry_count=args.cache_max_entry_count,
        cache_block_seq_len=args.cache_block_seq_len,
        enable_prefix_caching=args.enable_prefix_caching,
        max_prefill_token_num=args.max_prefill_token_num,
        num_tokens_per_iter=args.num_tokens_per_iter,
        max_prefill_iters=args.max_prefill_iters,
        async_=args.async_,
        communicator=args.communicator,
        language_model_only=args.language_model_only,
        enable_metrics=not args.disable_metrics,
        hf_overrides=args.hf_overrides,
    )


def api_server(args):
    """What `lmdeploy serve api_server` does once parsed, with a canned-text engine for TurboMind."""
    print(
        "INFO lab-lmdeploy 0.16.0 (llm-cluster lab stand-in): serve api_server %s" % " ".join(sys.argv[3:]), flush=True
    )
    config_path = os.path.join(args.model_path, "config.json")
    if not os.path.isfile(config_path):
        fail("OSError: %s does not appear to have a file named config.json" % args.model_path)
    with open(config_path) as f:
        model_config = json.load(f)
    archs = model_config.get("architectures") or []
    if args.backend == "pytorch" or not archs or archs[0] not in supported_archs():
        if args.backend != "pytorch":
            print(
                "WARNING lmdeploy: Fallback to pytorch engine because %r not supported by turbomind engine."
                % args.model_path,
                flush=True,
            )
        fail("lab stand-in: LMDeploy's PyTorch engine is not part of the stand-in (architectures %s)" % archs)
    from lmdeploy.utils import get_max_batch_size

    max_batch_size = args.max_batch_size or get_max_batch_size(args.device)
    config = engine_config(args, max_batch_size)
    import torch

    if torch.cuda.device_count() < config.tp:
        fail(
            "RuntimeError: TurboMind needs %d GPU(s) for --tp %d; the container sees %d"
            % (config.tp, config.tp, torch.cuda.device_count())
        )
    if not config.session_len:
        # TurboMind takes the model's own length when --session-len is unset.
        config.session_len = model_config.get("max_position_embeddings")
        if not config.session_len:
            fail("lab stand-in: no --session-len and no max_position_embeddings in %s" % config_path)
    print("INFO lab-lmdeploy: %s" % config, flush=True)
    serve(args, config)


class Stats:
    """lmdeploy's own PrometheusStatLogger, fed as its engine feeds it (per schedule, token, finish)."""

    def __init__(self, model_name, session_len, enabled):
        self.lock = threading.Lock()
        self.running = 0
        self.logger = None
        if enabled:
            from lmdeploy.metrics.loggers import PrometheusStatLogger

            self.logger = PrometheusStatLogger(model_name=model_name, max_model_len=session_len or 0)

    def schedule(self, delta):
        from lmdeploy.metrics.stats import SchedulerStats

        with self.lock:
            self.running += delta
            if self.logger:
                stats = SchedulerStats()
                stats.num_running_reqs = self.running
                self.logger.record_schedule(stats)

    def finish(self, arrival, first_token, prompt_tokens, generation_tokens):
        if not self.logger:
            return
        from lmdeploy.messages import ResponseType
        from lmdeploy.metrics.stats import IterationStats, RequestStats

        with self.lock:
            it = IterationStats()
            it.prompt_tokens, it.new_generation_tokens = prompt_tokens, generation_tokens
            it.ttft = first_token - arrival
            it.tpot = (time.time() - first_token) / max(generation_tokens, 1)
            self.logger.record_iteration(it)
            req = RequestStats(arrival_time=arrival, prompt_tokens=prompt_tokens)
            req.generation_tokens = generation_tokens
            req.queued_time = req.scheduled_time = arrival
            req.first_token_time = first_token
            req.lastest_token_time = req.finish_time = time.time()
            req.finish_reason = ResponseType.FINISH
            self.logger.record_finish(req)


def error_body(code, message, kind):
    """lmdeploy/serve/openai/errors.py create_error_response: ErrorResponse(message, type, code, param, object)."""
    return {"message": message, "type": kind, "code": code, "param": None, "object": "error"}


def make_handler(args, name, stats):
    where = "%s:%s" % (socket.gethostname(), args.server_port or DEFAULT_PORT)
    delay = float(os.environ.get("LAB_LMDEPLOY_TOKEN_DELAY_S", "0.02"))

    class Handler(OpenAIHandler):
        def do_GET(self):
            if self.path == "/health":
                self.send(200, {"status": "healthy"})
            elif self.path == "/v1/models":
                self.send(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": name,
                                "object": "model",
                                "created": int(time.time()),
                                "owned_by": "lmdeploy",
                                "root": name,
                                "parent": None,
                            }
                        ],
                    },
                )
            elif self.path.split("?")[0].rstrip("/") == "/metrics":
                import prometheus_client

                self.send(200, prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST)
            else:
                self.send(404, {"detail": "Not Found"})

        def do_POST(self):
            req = self.completion_request(error_body(400, "invalid JSON body", "invalid_request_error"))
            if req is None:
                return
            if req.get("model") != name:
                # lmdeploy/serve/openai/endpoints/common.py validate_request
                return self.send(
                    404, error_body(404, "The model %r does not exist." % req.get("model"), "not_found_error")
                )
            self.complete(req, self.path == "/v1/chat/completions")

        def complete(self, req, chat):
            arrival = time.time()
            model = req["model"]
            words = ("lab stand-in %s answers from %s" % (model, where)).split(" ")
            prompt_tokens = len(json.dumps(req.get("messages") or req.get("prompt") or "").split())
            usage = {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + len(words),
                "completion_tokens": len(words),
            }
            rid = str(uuid.uuid4().int % 10**9)
            obj = "chat.completion" if chat else "text_completion"
            stats.schedule(+1)
            try:
                time.sleep(delay)
                first = time.time()
                if req.get("stream"):
                    self.start_stream("text/event-stream; charset=utf-8")
                    for i, w in enumerate(words):
                        piece = w if i == 0 else " " + w
                        choice = (
                            {"index": 0, "delta": {"role": "assistant", "content": piece}, "finish_reason": None}
                            if chat
                            else {"index": 0, "text": piece, "finish_reason": None}
                        )
                        self.chunk(
                            {
                                "id": rid,
                                "object": obj + ".chunk" if chat else obj,
                                "created": int(arrival),
                                "model": model,
                                "choices": [choice],
                            }
                        )
                        time.sleep(delay)
                    last = (
                        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": "stop"}
                        if chat
                        else {"index": 0, "text": "", "finish_reason": "stop"}
                    )
                    final = {
                        "id": rid,
                        "object": obj + ".chunk" if chat else obj,
                        "created": int(arrival),
                        "model": model,
                        "choices": [last],
                    }
                    if (req.get("stream_options") or {}).get("include_usage"):
                        final["usage"] = usage  # lmdeploy puts usage on the last chunk, beside its choice
                    self.chunk(final)
                    self.end_stream()
                else:
                    time.sleep(delay * len(words))
                    text = " ".join(words)
                    choice = (
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                        if chat
                        else {"index": 0, "text": text, "finish_reason": "stop"}
                    )
                    self.send(
                        200,
                        {
                            "id": rid,
                            "object": obj,
                            "created": int(arrival),
                            "model": model,
                            "choices": [choice],
                            "usage": usage,
                        },
                    )
                stats.finish(arrival, first, prompt_tokens, len(words))
            finally:
                stats.schedule(-1)

    return Handler


def serve(args, config):
    host, port = args.server_name or "0.0.0.0", args.server_port or DEFAULT_PORT
    stats = Stats(args.model_name, config.session_len, config.enable_metrics)
    server = ThreadingHTTPServer((host, port), make_handler(args, args.model_name, stats))
    server.daemon_threads = True

    def stop(signum, frame):
        print("INFO lab-lmdeploy: shutting down (signal %d)" % signum, flush=True)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("INFO:     Uvicorn running on http://%s:%d (Press CTRL+C to quit)" % (host, port), flush=True)
    server.serve_forever()
    server.server_close()


def no_hub(path, **kwargs):
    """lmdeploy.utils.get_model: the stand-in has no hub to download `path` from."""
    fail("lab stand-in: %r is not a local directory and the stand-in downloads nothing (HF_HUB_OFFLINE)" % path)


def main():
    """`lmdeploy ...` through LMDeploy's own entrypoint; `serve api_server` runs the stand-in server."""
    import lmdeploy.utils
    from lmdeploy.cli.serve import SubCliServe

    SubCliServe.api_server = staticmethod(api_server)  # read when the parser is built: set_defaults(run=...)
    lmdeploy.utils.get_model = no_hub
    from lmdeploy.cli.entrypoint import run

    run()
    return 0
