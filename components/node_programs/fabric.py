"""The inter-node fabric: ib_write_bw between every pair of a multi-node instance, and NCCL's transport.

Standard library only, Python 3.8: the RDMA check ships this file to the instance's head node
(`python3 fabric.py '<plan json>'`), which runs perftest's `ib_write_bw` server on one node and the
client on the other over SSH (the nodes already reach each other as the SSH user for the weights
copy), pair after pair so no two tests share an HCA. The parsers read the real output formats
(tests/fixtures/ops); doctor uses them too.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

# perftest's default TCP port for its out-of-band exchange (the firewall accepts the cluster's own
# addresses on every port).
IB_PORT = 18515
# 2000 x 1 MiB: long enough for a 200 Gb link to reach its plateau (the fixtures' 1 MiB rows), ~0.1 s.
IB_SIZE = 1048576
IB_ITERS = 2000


@dataclass(frozen=True)
class BwReport:
    """What `ib_write_bw --report_gbits` printed: header facts and the result rows."""

    device: str
    link_type: str
    gid_index: Optional[int]
    unit: str  # "Gb/sec" with --report_gbits, else "MB/sec"
    rows: Tuple[Tuple[int, int, float, float], ...]  # (#bytes, #iterations, BW peak, BW average)

    @property
    def average_gbps(self) -> float:
        """BW average of the largest message size, in Gb/s (the plateau a bulk transfer sees)."""
        if not self.rows:
            raise ValueError("ib_write_bw printed no result row")
        avg = max(self.rows)[3]
        return avg if self.unit == "Gb/sec" else avg * 8 / 1000 * 1.048576


def parse_ib_write_bw(text: str) -> BwReport:
    """Parse perftest's ib_write_bw client (or server) output: the header block and the results table."""
    fields: Dict[str, str] = {}
    for line in text.splitlines():
        for m in re.finditer(r"([A-Za-z][A-Za-z .]*?)\s*:\s*(\S+(?: \S+)?)(?=\s{2,}|\s*$)", line):
            fields.setdefault(m.group(1).strip(), m.group(2).strip())
    header = re.search(r"#bytes\s+#iterations\s+BW peak\[([^\]]+)\]\s+BW average\[([^\]]+)\]", text)
    if header is None:
        raise ValueError("no ib_write_bw results header (#bytes #iterations BW peak BW average)")
    rows = []
    for line in text[header.end():].splitlines():
        cells = line.split()
        if len(cells) >= 4 and cells[0].isdigit():
            rows.append((int(cells[0]), int(cells[1]), float(cells[2]), float(cells[3])))
        elif rows and line.strip().startswith("---"):
            break
    gid = fields.get("GID index")
    return BwReport(fields.get("Device", ""), fields.get("Link type", ""),
                    int(gid) if gid and gid.isdigit() else None, header.group(2), tuple(rows))


@dataclass
class NcclNet:
    """NCCL's network choice per process, as its NCCL_DEBUG=INFO lines say."""

    networks: Dict[str, str] = field(default_factory=dict)  # "host:pid" -> "IB" | "Socket"
    ib_devices: List[str] = field(default_factory=list)  # mlx5_0:1/RoCE …
    socket_interfaces: List[str] = field(default_factory=list)  # bond0:192.168.10.11<0> …
    warnings: List[str] = field(default_factory=list)  # NCCL WARN lines, and "NET/IB : No device found."

    @property
    def fell_back(self) -> bool:
        """Some process uses the Socket transport."""
        return "Socket" in self.networks.values()


_PREFIX = re.compile(r"^(?P<host>[^\s:]+):(?P<pid>\d+):\d+ \[\d+\] ")


def parse_nccl_net(text: str) -> NcclNet:
    """Read NET/IB, NET/Socket, `Using network …` and WARN lines of NCCL_DEBUG=INFO output (any number of ranks)."""
    net = NcclNet()
    for line in text.splitlines():
        m = _PREFIX.match(line)
        if not m:
            continue
        rest = line[m.end():]
        who = f"{m.group('host')}:{m.group('pid')}"
        used = re.match(r"NCCL INFO Using network (\w+)", rest)
        if used:
            net.networks[who] = used.group(1)
        ib = re.match(r"NCCL INFO NET/IB : Using (.*?)(?: ; OOB .*)?$", rest)
        if ib:
            for dev in re.findall(r"\[\d+\](\S+)", ib.group(1)):
                if dev not in net.ib_devices:
                    net.ib_devices.append(dev)
        sock = re.match(r"NCCL INFO NET/Socket : Using (.*)$", rest)
        if sock:
            for iface in re.findall(r"\[\d+\](\S+)", sock.group(1)):
                if iface not in net.socket_interfaces:
                    net.socket_interfaces.append(iface)
        if "NCCL WARN" in rest or "NET/IB : No device found" in rest:
            warning = re.sub(r"^.*?NCCL (WARN|INFO) ", "", rest).strip()
            if warning not in net.warnings:
                net.warnings.append(warning)
    return net


def nccl_fix(hca: str, gid_index: Optional[int], interface: str) -> str:
    """What to check when NCCL is on sockets: the variables the stack sets, with this cluster's values."""
    gid = f"NCCL_IB_GID_INDEX={gid_index} is the RoCE v2 GID (show_gids; nodes.*.hca.gidIndex)" \
        if gid_index is not None else "NCCL_IB_GID_INDEX is unset (InfiniBand needs none)"
    return (f"NCCL_IB_HCA={hca} names an Active HCA port in the container (ibv_devices; nodes.*.hca.device); "
            f"{gid}; NCCL_SOCKET_IFNAME={interface} carries the nodes' cluster addresses (nodes.*.interface); "
            "NCCL_IB_DISABLE=0 (nccl.ibDisable); the image has libibverbs and the container sees /dev/infiniband")


# --- on the head node: every pair of the instance ------------------------------------------------

def ib_argv(plan: Dict[str, object], peer: Optional[str]) -> List[str]:
    """ib_write_bw server (peer None) or client argv over the stack's HCA, port and GID index."""
    argv = ["ib_write_bw", "-d", str(plan["device"]), "-i", str(plan["port"]), "-p", str(IB_PORT),
            "-s", str(IB_SIZE), "-n", str(IB_ITERS), "-F", "--report_gbits"]
    if plan.get("gid_index") is not None:
        argv += ["-x", str(plan["gid_index"])]
    return argv + ([peer] if peer else [])


def _on(node: Dict[str, str], argv: Sequence[str], ssh: Sequence[str]) -> List[str]:
    """argv run on a node: locally on this one, over SSH on another."""
    if node.get("local"):
        return list(argv)
    return [*ssh, node["login"], " ".join(shlex.quote(a) for a in argv)]


def test_pair(plan: Dict[str, object], server: Dict[str, str], client: Dict[str, str]) -> Tuple[Optional[float], str]:
    """(average Gb/s or None, what happened) for one pair: the server on `server`, the client on `client`."""
    ssh = list(plan["ssh"])  # type: ignore[call-overload]
    srv = subprocess.Popen(_on(server, ["timeout", "60", *ib_argv(plan, None)], ssh),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    try:
        time.sleep(float(plan.get("server_start_s", 2)))  # type: ignore[arg-type]
        try:
            done = subprocess.run(_on(client, ["timeout", "60", *ib_argv(plan, server["address"])], ssh),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                                  timeout=90)
            out = done.stdout
        except subprocess.TimeoutExpired:
            return None, "ib_write_bw client did not finish within 90 s"
    finally:
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
    try:
        return parse_ib_write_bw(out).average_gbps, out
    except ValueError:
        tail = " | ".join(ln.strip() for ln in out.strip().splitlines()[-3:]) or f"exit status {done.returncode}"
        return None, f"ib_write_bw gave no result ({tail})"


def main(argv: List[str]) -> int:
    """`python3 fabric.py '<plan>'`: every pair, each at least plan["floor_gbps"]; exit 1 naming the pairs below."""
    plan = json.loads(argv[0])
    nodes = plan["nodes"]
    failures = []
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            gbps, seen = test_pair(plan, b, a)
            pair = f"{a['name']} -> {b['name']}"
            if gbps is None:
                failures.append(f"{pair}: {seen}")
            elif gbps < float(plan["floor_gbps"]):
                failures.append(f"{pair}: ib_write_bw average {gbps:.1f} Gb/s, below {plan['floor_gbps']:g} Gb/s")
            else:
                print(f"rdma {plan['instance']}: {pair} {gbps:.1f} Gb/s (floor {plan['floor_gbps']:g})", flush=True)
    for f in failures:
        print(f"ERROR: rdma {plan['instance']}: {f}", file=sys.stderr)
    if failures:
        print(f"    fix: check {plan['hints']}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
