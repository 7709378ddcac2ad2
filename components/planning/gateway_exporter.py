#!/usr/bin/env python3
"""llm-cluster gateway exporter: nginx's JSON usage log, read from its daily files, as Prometheus metrics.

nginx (njs 0.7.9 has no memory shared across requests) keeps no counters of its own: it appends each
request's JSON log line to the day's usage file (`<usage dir>/usage-YYYY-MM-DD.log`, the operator's
record), and this program follows those files, counts the lines and serves the counters on
`GET /metrics` in the Prometheus text format 0.0.4. Reading the file costs nginx nothing beyond the
line it writes anyway: the usage copy that went out as one UDP datagram per request (syslog) cost
the gateway 6-30 % of its throughput (bench/gateway.py). `--syslog` still accepts such
datagrams, for an nginx configured to send them.

Shipped as one file into an official Python image and run with `python3 gateway_exporter.py
--usage-dir /var/log/llm-gateway --listen <cluster address>:9145`: standard library only, Python 3.8
or newer. It starts at the end of the newest file (counters start with the process, as Prometheus
expects), polls every second, and reads the newest two files, so lines nginx still appends to
yesterday's file after midnight are counted too.

Metrics (labels are what the log line carries; the log holds API key ids, never keys):
  llm_gateway_requests_total{key_id,model,pool,status}     requests answered
  llm_gateway_upstream_failures_total{pool,upstream}       failed attempts on a replica (see below)
  llm_gateway_tokens_total{key_id,model,kind}              usage reported by vLLM, kind=prompt|completion
  llm_gateway_request_duration_seconds{pool}               histogram of $request_time (whole stream)
  llm_gateway_log_lines_total / _log_parse_errors_total    log lines read / not understood
  llm_gateway_series_overflow_total                        observations dropped at the label-set cap

An upstream failure is one attempt whose entry in $upstream_status is 502 or 504: nginx's codes for a
replica it could not connect to, that reset or broke the response (502) or did not answer within the
timeouts (504); a replica answering 502/504 itself counts too (vLLM does not). nginx logs every
attempt, so a request retried on the next replica counts one failure for the first and none for the
second. When no replica of the pool is live (all taken out by max_fails), nginx logs the pool's name
as the address: that 502 counts with upstream="none".

`model` is labelled only for requests the gateway routed (pool non-empty): the names of refused
requests are whatever clients send, and would make the label sets unbounded. Even so, the number of
label sets is capped (--max-series); beyond it observations are dropped and counted.
"""
from __future__ import annotations

import argparse
import bisect
import datetime
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Optional, Tuple

# Seconds; LLM requests run from milliseconds (refusals, short embeddings) up to the pools' readTimeoutSeconds.
DURATION_BUCKETS: Tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
                                       120.0, 300.0, 600.0, 900.0)
DEFAULT_MAX_SERIES = 10000
# nginx's own 502/504 and the replica answers it counts as failures and retries (gateway.py: 5xx).
FAILED_ATTEMPT = ("500", "502", "503", "504")
NO_LIVE_UPSTREAM = "none"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# nginx's syslog header (ngx_syslog_add_header, the same in 1.22 and 1.27): `<PRI>Mmm dd hh:mm:ss `,
# the hostname unless `nohostname`, then `tag: `. The day is space-padded ("Dec  1").
SYSLOG_HEADER = re.compile(rb"<\d{1,3}>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (?:\S+ )?[A-Za-z0-9_]{1,32}: ")
# $upstream_addr / $upstream_status separate attempts with ", " and internal redirects with " : ".
ATTEMPT_SEPARATOR = re.compile(r", | : ")
ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]+):\d+$|^unix:")

HELP = {
    "llm_gateway_requests_total": "Requests the gateway answered, by API key id, routed model, pool and HTTP status.",
    "llm_gateway_upstream_failures_total": "Attempts on a replica that failed (upstream status 500, 502, 503 or "
                                           "504: engine error or not ready, connect error, broken response, timeout); "
                                           "upstream=none: no live replica.",
    "llm_gateway_tokens_total": "Tokens in the usage vLLM reported, by API key id, model and kind (prompt, completion).",
    "llm_gateway_request_duration_seconds": "Time from the request's first byte to the response's last, streams whole.",
    "llm_gateway_log_lines_total": "Usage log lines read (or syslog datagrams received) from nginx.",
    "llm_gateway_log_parse_errors_total": "Usage log lines (or datagrams) that were not the gateway's JSON log line.",
    "llm_gateway_series_overflow_total": "Observations dropped because the exporter already holds --max-series label sets.",
}

LabelValues = Tuple[str, ...]


class ParseError(ValueError):
    """A datagram that is not one of the gateway's log lines."""


def parse_datagram(data: bytes) -> Dict[str, object]:
    """The JSON object of one nginx syslog datagram; ParseError when it is not one."""
    header = SYSLOG_HEADER.match(data)
    if header is None:
        raise ParseError("no nginx syslog header")
    return parse_line(data[header.end():])


def parse_line(data: bytes) -> Dict[str, object]:
    """The JSON object of one usage log line; ParseError when it is not one of the gateway's lines."""
    # escape=json leaves bytes >= 0x80 as sent: a client's invalid UTF-8 must not lose the line.
    text = data.decode("utf-8", errors="replace").rstrip("\n")
    try:
        line = json.loads(text)
    except ValueError as e:
        raise ParseError("not JSON: %s" % e) from None
    if not isinstance(line, dict):
        raise ParseError("not a JSON object")
    for name in ("key_id", "model", "pool", "upstream", "upstream_status"):
        if not isinstance(line.get(name), str):
            raise ParseError("field %r is not a string" % name)
    status = line.get("status")
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
        raise ParseError("status %r is not an HTTP status" % (status,))
    if not isinstance(line.get("request_time"), (int, float)):
        raise ParseError("request_time is not a number")
    for name in ("prompt_tokens", "completion_tokens"):
        value = line.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ParseError("%s %r is not a token count" % (name, value))
    return line


def failed_attempts(upstream: str, upstream_status: str) -> List[str]:
    """Addresses of the attempts that failed (5xx), `none` for a pool without a live replica."""
    addrs = ATTEMPT_SEPARATOR.split(upstream) if upstream else []
    statuses = ATTEMPT_SEPARATOR.split(upstream_status) if upstream_status else []
    return [addr if ADDRESS.match(addr) else NO_LIVE_UPSTREAM
            for addr, status in zip(addrs, statuses) if status in FAILED_ATTEMPT]


def escape_label(value: str) -> str:
    """A label value as the text format quotes it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text as the text format wants it: backslash and newline escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value or bucket bound as Prometheus' own clients write it: 3, 0.25, 1.0, +Inf."""
    if isinstance(value, int):
        return str(value)
    return "+Inf" if value == float("inf") else repr(float(value))


class Metrics:
    """The counters and the histogram, fed log lines, rendered as exposition text; thread-safe."""

    def __init__(self, max_series: int = DEFAULT_MAX_SERIES, buckets: Tuple[float, ...] = DURATION_BUCKETS):
        self.max_series = max_series
        self.buckets = buckets
        self.lock = threading.Lock()
        self.requests: Dict[LabelValues, int] = {}
        self.failures: Dict[LabelValues, int] = {}
        self.tokens: Dict[LabelValues, int] = {}
        # (pool,) -> the count in each finite bucket (not cumulative), then the sum, then the count
        self.durations: Dict[LabelValues, List[float]] = {}
        self.log_lines = 0
        self.parse_errors = 0
        self.overflow = 0

    def _series(self) -> int:
        return len(self.requests) + len(self.failures) + len(self.tokens) + len(self.durations)

    def _add(self, family: Dict[LabelValues, int], labels: LabelValues, amount: int) -> None:
        if labels not in family and self._series() >= self.max_series:
            self.overflow += 1
            return
        family[labels] = family.get(labels, 0) + amount

    def record(self, datagram: bytes) -> None:
        """Count one syslog datagram: its log line, or a parse error."""
        self._count(datagram, parse_datagram)

    def record_line(self, data: bytes) -> None:
        """Count one line of a usage file: the request it logs, or a parse error."""
        self._count(data, parse_line)

    def _count(self, data: bytes, parse: "Callable[[bytes], Dict[str, object]]") -> None:
        try:
            line: Optional[Dict[str, object]] = parse(data)
        except ParseError:
            line = None
        with self.lock:
            self.log_lines += 1
            if line is None:
                self.parse_errors += 1
            else:
                self._observe(line)

    def _observe(self, line: Dict[str, object]) -> None:
        key_id, pool = str(line["key_id"]), str(line["pool"])
        model = str(line["model"]) if pool else ""
        self._add(self.requests, (key_id, model, pool, str(line["status"])), 1)
        for upstream in failed_attempts(str(line["upstream"]), str(line["upstream_status"])):
            self._add(self.failures, (pool, upstream), 1)
        for kind in ("prompt", "completion"):
            count = line.get(kind + "_tokens")
            if isinstance(count, int):
                self._add(self.tokens, (key_id, model, kind), count)
        seconds = float(line["request_time"])  # type: ignore[arg-type]
        hist = self.durations.get((pool,))
        if hist is None:
            if self._series() >= self.max_series:
                self.overflow += 1
                return
            hist = self.durations[(pool,)] = [0.0] * (len(self.buckets) + 2)
        index = bisect.bisect_left(self.buckets, seconds)  # the first bucket with seconds <= le
        if index < len(self.buckets):
            hist[index] += 1
        hist[-2] += seconds
        hist[-1] += 1

    def render(self) -> str:
        """Every metric in the Prometheus text format 0.0.4, label sets sorted."""
        with self.lock:
            out: List[str] = []
            self._family(out, "llm_gateway_requests_total", "counter", ("key_id", "model", "pool", "status"),
                         self.requests)
            self._family(out, "llm_gateway_upstream_failures_total", "counter", ("pool", "upstream"),
                         self.failures)
            self._family(out, "llm_gateway_tokens_total", "counter", ("key_id", "model", "kind"), self.tokens)
            self._histogram(out, "llm_gateway_request_duration_seconds")
            for name, value in (("llm_gateway_log_lines_total", self.log_lines),
                                ("llm_gateway_log_parse_errors_total", self.parse_errors),
                                ("llm_gateway_series_overflow_total", self.overflow)):
                self._family(out, name, "counter", (), {(): value})
            return "\n".join(out) + "\n"

    @staticmethod
    def _head(out: List[str], name: str, kind: str) -> None:
        out.append("# HELP %s %s" % (name, escape_help(HELP[name])))
        out.append("# TYPE %s %s" % (name, kind))

    @staticmethod
    def _labels(names: Tuple[str, ...], values: LabelValues, extra: str = "") -> str:
        pairs = ['%s="%s"' % (n, escape_label(v)) for n, v in zip(names, values)]
        if extra:
            pairs.append(extra)
        return "{%s}" % ",".join(pairs) if pairs else ""

    def _family(self, out: List[str], name: str, kind: str, names: Tuple[str, ...],
                series: Dict[LabelValues, int]) -> None:
        self._head(out, name, kind)
        for values in sorted(series):
            out.append("%s%s %s" % (name, self._labels(names, values), format_value(series[values])))

    def _histogram(self, out: List[str], name: str) -> None:
        self._head(out, name, "histogram")
        for values in sorted(self.durations):
            hist = self.durations[values]
            count = int(hist[-1])
            cumulative = 0
            for bound, in_bucket in zip(self.buckets, hist):
                cumulative += int(in_bucket)
                le = 'le="%s"' % format_value(bound)
                out.append("%s_bucket%s %d" % (name, self._labels(("pool",), values, le), cumulative))
            out.append('%s_bucket%s %d' % (name, self._labels(("pool",), values, 'le="+Inf"'), count))
            out.append("%s_sum%s %s" % (name, self._labels(("pool",), values), format_value(hist[-2])))
            out.append("%s_count%s %d" % (name, self._labels(("pool",), values), count))


def host_port(text: str) -> Tuple[str, int]:
    """`127.0.0.1:5514` or `[::1]:5514` -> (host, port)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError("%r is not host:port" % text)
    return host.strip("[]"), int(port)


def receive(sock: socket.socket, metrics: Metrics) -> None:
    """Count every datagram that arrives on the syslog socket, forever."""
    while True:
        data = sock.recv(65535)
        try:
            metrics.record(data)
        except Exception as e:  # noqa: BLE001 -- a dead receiver would leave /metrics up and frozen
            print("gateway exporter: %r on %r" % (e, data[:200]), file=sys.stderr, flush=True)


class MetricsServer(ThreadingHTTPServer):
    """The /metrics listener, on IPv4 or IPv6 by the address it is given."""

    daemon_threads = True

    def __init__(self, listen: Tuple[str, int], handler: type) -> None:
        # socketserver creates the socket in __init__ from this attribute.
        self.address_family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        super().__init__(listen, handler)


def make_server(listen: Tuple[str, int], metrics: Metrics) -> MetricsServer:
    """The HTTP server: GET /metrics, 404 elsewhere."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path.split("?", 1)[0] != "/metrics":
                body = b"llm-cluster gateway exporter: GET /metrics\n"
                self.send_response(404)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
            else:
                body = metrics.render().encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # one line per scrape would drown the container log

    return MetricsServer(listen, Handler)


USAGE_FILE = re.compile(r"^usage-(\d{4}-\d{2}-\d{2})\.log$")


def prune_usage(directory: str, retention_days: int, max_bytes: int, today: Optional[datetime.date] = None) -> List[str]:
    """Delete the daily usage files older than the retention, then the oldest while the rest exceed max_bytes.

    Today's file (UTC) is never deleted: nginx is writing it. Returns the names deleted, oldest first.
    """
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    days = sorted((m.group(1), m.group(0)) for m in map(USAGE_FILE.match, os.listdir(directory)) if m)
    sizes = {name: os.path.getsize(os.path.join(directory, name)) for _, name in days}
    cutoff = (today - datetime.timedelta(days=retention_days)).isoformat()
    deleted: List[str] = []
    total = sum(sizes.values())
    for day, name in days:
        if day >= today.isoformat():
            break
        if day < cutoff or total > max_bytes:
            os.remove(os.path.join(directory, name))
            total -= sizes[name]
            deleted.append(name)
    return deleted


class UsageFollower:
    """Reads what nginx appends to the daily usage files: the newest two, from where it last stopped."""

    def __init__(self, directory: str, metrics: Metrics, from_start: bool = False):
        self.directory = directory
        self.metrics = metrics
        # file name -> (inode, bytes consumed); a partial last line waits for its newline.
        self.offsets: Dict[str, Tuple[int, int]] = {}
        self.partial: Dict[str, bytes] = {}
        if not from_start:
            for name in self._newest():
                st = os.stat(os.path.join(directory, name))
                self.offsets[name] = (st.st_ino, st.st_size)

    def _newest(self) -> List[str]:
        return sorted(n for n in os.listdir(self.directory) if USAGE_FILE.match(n))[-2:]

    def poll(self) -> int:
        """Count every complete line appended since the last poll; returns how many were read."""
        read = 0
        newest = self._newest()
        for name in newest:
            path = os.path.join(self.directory, name)
            try:
                with open(path, "rb") as f:
                    st = os.fstat(f.fileno())
                    inode, offset = self.offsets.get(name, (st.st_ino, 0))
                    if inode != st.st_ino or st.st_size < offset:
                        offset, self.partial[name] = 0, b""  # replaced or truncated: read it anew
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                continue  # pruned meanwhile
            self.offsets[name] = (st.st_ino, offset + len(data))
            text = self.partial.pop(name, b"") + data
            lines = text.split(b"\n")
            if lines[-1]:
                self.partial[name] = lines[-1]
            for line in lines[:-1]:
                if line:
                    self.metrics.record_line(line)
                    read += 1
        for name in list(self.offsets):
            if name not in newest:  # two days old: nginx writes there no more
                del self.offsets[name]
                self.partial.pop(name, None)
        return read

    def forever(self, every_seconds: float = 1.0) -> None:
        """poll() every second; a failure is reported and retried, never fatal to the metrics."""
        while True:
            try:
                self.poll()
            except OSError as err:
                print("gateway exporter: reading %s failed: %s" % (self.directory, err), file=sys.stderr, flush=True)
            time.sleep(every_seconds)


def prune_forever(directory: str, retention_days: int, max_bytes: int, every_seconds: float = 3600) -> None:
    """prune_usage every hour; a failure is reported and retried, never fatal to the metrics."""
    while True:
        try:
            for name in prune_usage(directory, retention_days, max_bytes):
                print("gateway exporter: deleted usage log %s" % name, file=sys.stderr, flush=True)
        except OSError as err:
            print("gateway exporter: pruning %s failed: %s" % (directory, err), file=sys.stderr, flush=True)
        time.sleep(every_seconds)


def main(argv: Optional[List[str]] = None) -> None:
    """Follow the usage files (and/or bind the syslog socket) and the HTTP listener; serve until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--usage-dir", help="directory of nginx's daily usage files: followed, and pruned hourly")
    parser.add_argument("--syslog", type=host_port, help="UDP host:port where nginx sends its log as datagrams")
    parser.add_argument("--listen", type=host_port, required=True, help="host:port of GET /metrics")
    parser.add_argument("--max-series", type=int, default=DEFAULT_MAX_SERIES, help="cap on label sets")
    parser.add_argument("--retention-days", type=int, default=30, help="usage files kept for this many days")
    parser.add_argument("--max-usage-mib", type=int, default=20480, help="usage files kept within this total")
    args = parser.parse_args(argv)
    if not args.usage_dir and not args.syslog:
        parser.error("give --usage-dir (the usage files nginx writes) or --syslog (datagrams nginx sends)")
    metrics = Metrics(args.max_series)
    server = make_server(args.listen, metrics)
    # As PID 1 in a container, Python gets no default SIGTERM action: `docker stop` would wait 10 s.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sources = []
    if args.syslog:
        sock = socket.socket(socket.AF_INET6 if ":" in args.syslog[0] else socket.AF_INET, socket.SOCK_DGRAM)
        # Bursts of log lines queue here while a scrape holds the lock; the kernel caps it at rmem_max.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.bind(args.syslog)
        threading.Thread(target=receive, args=(sock, metrics), daemon=True).start()
        sources.append("syslog udp %s:%d" % args.syslog)
    if args.usage_dir:
        threading.Thread(target=UsageFollower(args.usage_dir, metrics).forever, daemon=True).start()
        threading.Thread(target=prune_forever, args=(args.usage_dir, args.retention_days, args.max_usage_mib << 20),
                         daemon=True).start()
        sources.append("usage files in %s" % args.usage_dir)
    print("gateway exporter: %s, metrics http://%s:%d/metrics" % (", ".join(sources), args.listen[0], args.listen[1]),
          file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
