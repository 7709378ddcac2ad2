"""The stand-in server: vLLM's argv parsing (from the real parser dump), Ray join, OpenAI endpoints, /metrics."""

import argparse
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import ThreadingHTTPServer

from openai_http import OpenAIHandler

from vllm import HERE, __version__, _facts

QUANTIZATIONS = set(_facts["quantizations"])


class ParseError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ParseError(message)


def human_readable_int(value):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value.strip())
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[suffix])
        return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    return int(value)


TYPES = {"int": int, "float": float, "human_readable_int": human_readable_int}


def build_parser(program):
    """argparse from the dump of the real parser (option strings, action kind, nargs, choices, type)."""
    prog = "vllm serve" if program == "serve" else "api_server.py"
    return populate(Parser(prog=prog, add_help=False, allow_abbrev=False), program)


def populate(p, program):
    """The dumped arguments added to parser `p` (`serve` takes the model as its positional)."""
    with open(os.path.join(HERE, "serve-args.json")) as f:
        dump = json.load(f)
    for e in dump:
        if "positional" in e:
            if program == "serve":
                p.add_argument(e["positional"], nargs=e["nargs"])
            continue
        kind, opts = e["kind"], e["opts"]
        if kind == "_HelpAction":
            continue
        if kind == "BooleanOptionalAction":
            p.add_argument(*[o for o in opts if not o.startswith("--no-")], action=argparse.BooleanOptionalAction)
        elif kind == "_StoreTrueAction":
            p.add_argument(*opts, action="store_true")
        else:
            kw = {"action": "append" if kind == "_AppendAction" else "store"}
            if e["nargs"] is not None:
                kw["nargs"] = e["nargs"]
            if e["type"] in TYPES:
                kw["type"] = TYPES[e["type"]]
            if e["choices"] and kw.get("nargs") != "+":
                kw["choices"] = [c for c in e["choices"] if c != "None"]
            p.add_argument(*opts, **kw)
    return p


def parse(argv, program):
    """The namespace, or exit 2 with argparse's message as vLLM would."""
    p = build_parser(program)
    try:
        ns = p.parse_args(argv)
    except ParseError as e:
        sys.stderr.write("%s: error: %s\n" % (p.prog, e))
        sys.exit(2)
    if program == "serve":
        if getattr(ns, "model", None) and "--model" in " ".join(argv):
            sys.stderr.write(
                "ValueError: With `vllm serve`, you should provide the model as a positional "
                "argument or in a config file instead of via the `--model` option.\n"
            )
            sys.exit(1)
        ns.model = ns.model_tag
    if not ns.model:
        sys.stderr.write("error: no model given\n")
        sys.exit(2)
    if ns.quantization is not None and ns.quantization not in QUANTIZATIONS:
        sys.stderr.write(
            "ValueError: Unknown quantization method: %s. Must be one of %s.\n"
            % (ns.quantization, sorted(QUANTIZATIONS))
        )
        sys.exit(1)
    return ns


def join_ray(ns):
    """With the Ray executor: join the cluster (RAY_ADDRESS) and wait for tensor x pipeline GPUs."""
    import ray

    want = (ns.tensor_parallel_size or 1) * (ns.pipeline_parallel_size or 1)
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level="WARNING")
    have = ray.cluster_resources().get("GPU", 0)
    print(
        "INFO lab-vllm: Ray cluster has %d GPUs, %d nodes; the engine needs %d"
        % (have, len([n for n in ray.nodes() if n["Alive"]]), want),
        flush=True,
    )
    if have < want:
        sys.stderr.write(
            "ValueError: The number of required GPUs exceeds the total number of available GPUs "
            "in the placement group (need %d, Ray has %d).\n" % (want, have)
        )
        sys.exit(1)
    workers = place_workers(ray)
    threading.Thread(target=watch_workers, args=(ray, workers), daemon=True).start()


def place_workers(ray):
    """One light actor on each GPU node (where vLLM's Ray executor places its GPU workers), so that the
    engine depends on every node of the cluster as vLLM's does. They hold no GPU: the lab has none.
    Like vLLM waiting for its placement group, it waits for them without a deadline (a busy machine
    starts Ray's worker processes slowly), saying so every 10 s."""

    @ray.remote(num_cpus=0)
    class Worker:
        def where(self):
            return socket.gethostname()

    workers = {}
    for node in ray.nodes():
        if node["Alive"] and node["Resources"].get("GPU", 0) > 0:
            address = node["NodeManagerAddress"]
            workers[address] = Worker.options(resources={"node:%s" % address: 0.001}).remote()
    started = time.monotonic()
    for address, w in workers.items():
        ref = w.where.remote()
        while True:
            try:
                print("INFO lab-vllm: engine worker on %s (%s)" % (address, ray.get(ref, timeout=10)), flush=True)
                break
            except ray.exceptions.GetTimeoutError:
                print(
                    "INFO lab-vllm: waiting for the engine worker on %s (%.0fs)"
                    % (address, time.monotonic() - started),
                    flush=True,
                )
    return workers


def watch_workers(ray, workers):
    """vLLM's engine dies with any of its Ray workers (the executor's next call raises ActorDiedError and
    the API server shuts down, exit 1): the watchdog and the container's restart policy take it from there.

    Only a worker Ray has declared dead ends the engine: ActorUnavailableError ("temporarily
    unavailable", an RPC that failed) is what a busy machine also gives a live actor, and Ray turns it
    into ActorDiedError once its GCS has marked the worker's node dead (its health checks)."""
    unavailable = getattr(ray.exceptions, "ActorUnavailableError", ())
    told = set()
    while True:
        time.sleep(2)
        for address, w in workers.items():
            try:
                ray.get(w.where.remote(), timeout=60)
                told.discard(address)
            except ray.exceptions.GetTimeoutError:
                continue  # a slow answer on a busy machine is not a dead worker
            except unavailable as e:
                if address not in told:
                    print(
                        "INFO lab-vllm: the Ray worker on %s is unavailable (%s), waiting for Ray's verdict"
                        % (address, str(e).splitlines()[0][:200]),
                        flush=True,
                    )
                    told.add(address)
            except (ray.exceptions.RayActorError, ray.exceptions.RaySystemError) as e:
                sys.stderr.write(
                    "ERROR lab-vllm: the Ray worker on %s died (%s: %s): the engine is dead "
                    "(vLLM: EngineDeadError), shutting down\n" % (address, type(e).__name__, e)
                )
                sys.stderr.flush()
                os._exit(1)


class Metrics:
    """vLLM's metric names (this version's list), labelled model_name."""

    def __init__(self, model_name):
        self.model = model_name
        self.lock = threading.Lock()
        self.counters = {
            "vllm:request_success_total": 0,
            "vllm:prompt_tokens_total": 0,
            "vllm:generation_tokens_total": 0,
        }
        self.running = 0
        with open(os.path.join(HERE, "metrics.txt")) as f:
            self.names = [line.split() for line in f if line.strip() and not line.startswith("#")]

    def render(self):
        out = []
        lab = 'model_name="%s"' % self.model
        for name, kind in self.names:
            out.append("# TYPE %s %s" % (name, kind))
            if kind == "histogram":
                out.append('%s_bucket{%s,le="+Inf"} %d' % (name, lab, self.counters["vllm:request_success_total"]))
                out.append("%s_sum{%s} 0" % (name, lab))
                out.append("%s_count{%s} %d" % (name, lab, self.counters["vllm:request_success_total"]))
            elif name == "vllm:num_requests_running":
                out.append("%s{%s} %d" % (name, lab, self.running))
            else:
                out.append("%s{%s} %d" % (name, lab, self.counters.get(name, 0)))
        return "\n".join(out) + "\n"


def make_handler(ns, names, metrics):
    where = "%s:%s" % (socket.gethostname(), ns.port)

    class Handler(OpenAIHandler):
        def do_GET(self):
            if self.path == "/health":
                self.send(200, b"", "text/plain")
            elif self.path == "/v1/models":
                self.send(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": n,
                                "object": "model",
                                "owned_by": "vllm",
                                "root": ns.model,
                                "max_model_len": ns.max_model_len,
                            }
                            for n in names
                        ],
                    },
                )
            elif self.path == "/metrics":
                self.send(200, metrics.render().encode(), "text/plain; version=0.0.4")
            elif self.path == "/version":
                self.send(200, {"version": __version__})
            else:
                self.send(404, {"detail": "Not Found"})

        def do_POST(self):
            req = self.completion_request(
                {"object": "error", "message": "invalid JSON", "type": "BadRequestError", "code": 400}
            )
            if req is None:
                return
            model = req.get("model")
            if model not in names:
                return self.send(
                    404,
                    {
                        "object": "error",
                        "message": "The model `%s` does not exist." % model,
                        "type": "NotFoundError",
                        "param": None,
                        "code": 404,
                    },
                )
            chat = self.path == "/v1/chat/completions"
            delay = float(os.environ.get("LAB_VLLM_TOKEN_DELAY_S", "0.02"))
            text = "lab stand-in %s answers from %s" % (model, where)
            words = text.split(" ")
            prompt_tokens = len(json.dumps(req.get("messages") or req.get("prompt") or "").split())
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(words),
                "total_tokens": prompt_tokens + len(words),
            }
            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
            obj = "chat.completion" if chat else "text_completion"
            with metrics.lock:
                metrics.running += 1
            try:
                if req.get("stream"):
                    self.start_stream()
                    for i, w in enumerate(words):
                        time.sleep(delay)
                        piece = w if i == 0 else " " + w
                        choice = (
                            {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                            if chat
                            else {"index": 0, "text": piece, "finish_reason": None}
                        )
                        self.chunk(
                            {
                                "id": rid,
                                "object": obj + (".chunk" if chat else ""),
                                "model": model,
                                "created": int(time.time()),
                                "choices": [choice],
                            }
                        )
                    last = (
                        {"index": 0, "delta": {}, "finish_reason": "stop"}
                        if chat
                        else {"index": 0, "text": "", "finish_reason": "stop"}
                    )
                    final = {
                        "id": rid,
                        "object": obj + (".chunk" if chat else ""),
                        "model": model,
                        "created": int(time.time()),
                        "choices": [last],
                    }
                    self.chunk(final)
                    if (req.get("stream_options") or {}).get("include_usage"):
                        self.chunk(
                            {
                                "id": rid,
                                "object": obj + (".chunk" if chat else ""),
                                "model": model,
                                "created": int(time.time()),
                                "choices": [],
                                "usage": usage,
                            }
                        )
                    self.end_stream()
                else:
                    time.sleep(delay * len(words))
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
                            "created": int(time.time()),
                            "model": model,
                            "choices": [choice],
                            "usage": usage,
                        },
                    )
                with metrics.lock:
                    metrics.counters["vllm:request_success_total"] += 1
                    metrics.counters["vllm:prompt_tokens_total"] += prompt_tokens
                    metrics.counters["vllm:generation_tokens_total"] += len(words)
            finally:
                with metrics.lock:
                    metrics.running -= 1

    return Handler


def run(argv, program):
    ns = parse(argv, program)
    print("INFO lab-vllm %s (llm-cluster lab stand-in): %s %s" % (__version__, program, " ".join(argv)), flush=True)
    config = os.path.join(ns.model, "config.json")
    if not os.path.isfile(config):
        sys.stderr.write("OSError: %s does not appear to have a file named config.json\n" % ns.model)
        return 1
    if ns.distributed_executor_backend == "ray":
        join_ray(ns)
    names = ns.served_model_name or [ns.model]
    metrics = Metrics(names[0])
    server = ThreadingHTTPServer((ns.host or "0.0.0.0", ns.port), make_handler(ns, names, metrics))
    server.daemon_threads = True

    def stop(signum, frame):
        print(
            "INFO lab-vllm: shutting down (signal %d): no new connections, finishing requests in flight" % signum,
            flush=True,
        )
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        "INFO:     Uvicorn running on http://%s:%d (Press CTRL+C to quit)" % (ns.host or "0.0.0.0", ns.port), flush=True
    )
    server.serve_forever()
    server.server_close()
    # Like uvicorn's graceful shutdown: requests already accepted are answered before the process exits.
    deadline = time.monotonic() + 30
    while metrics.running and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0
