#!/usr/bin/python3
"""Fake-GPU tools of a lab host: nvidia-smi, ibstat, ibv_devices, nvidia-container-cli.

Each prints a captured real output (tests/fixtures/preflight, sources in its SOURCES.md), chosen per
host by the lab stack's `lab:hosts.<node>` (copied to choice.json beside this script):
- `nvidia-smi --query-gpu=<fields> --format=csv,noheader`: the rows of the captured 8 x
  Tesla V100-SXM2-32GB table (name, driver, memory), the first `gpus` of them; compute_cap is 7.0,
  the V100's (the captured table, from a driver that prints no compute capability column, lacks it);
- `nvidia-smi topo -m`: the captured DGX-1 V100 matrix (nvlink) or a PCIe-only one (pcie);
- `nvidia-smi` alone: the captured table;
- `ibstat`: the captured ConnectX-7 RoCE output, mlx5_0 port 1 Active at 200 (roce-active), or the same
  capture with that port's two state lines as ibstat prints a disabled port (down: `State: Down`,
  `Physical state: Disabled`, as mlx5_2 shows them in the captured H100 output): no capture has the
  stack's mlx5_0 down, and the preflight must name the port the stack uses;
- `ibv_devices`: a captured four-device list with mlx5_0;
- `nvidia-container-cli --version`: a version line (the lab's docker registers a runtime named
  nvidia and a no-op nvidia-container-runtime-hook, see lab/README.md);
- `df -Pk /data…`: the real df line of the host's /data, but on a disk of `diskGib` (default 7000, a
  node's NVMe): the stack's weights are sized from the model catalog (hundreds of GiB) while the lab's
  generated weights are a few MB. Every other df call is the real df.
"""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
FIX = os.path.join(HERE, "fixtures")
TABLE = "nvidia-smi.8x-tesla-v100-sxm2-32gb.azure-nd40rs-v2.drv535.usernetes-azure.txt"
TOPO = {
    "nvlink": "nvidia-smi-topo-m.dgx1-v100-4nic.ucx-py-docs.txt",
    "pcie": "nvidia-smi-topo-m.8x-pcie-gpus-pix-phb-sys.model-not-stated.matrix-only.nccl-issue-1439.txt",
}
IBSTAT = "ibstat.cx7-mt4129-rate200-ethernet-roce-active.first-2-CA-blocks.mooncake-issue-1999.txt"
DISABLED_PORT = "ibstat.h100-cx6dx-mt4125-eth-down-disabled-plus-cx7-ib400-active.gpud-testdata.txt"
IBV_DEVICES = (
    "ibv_devices.vfs-with-zero-node-guid.whitespace-collapsed-as-posted.sriov-network-device-plugin-issue-20.txt"
)
V100_COMPUTE_CAP = "7.0"


def fixture(name):
    with open(os.path.join(FIX, name)) as f:
        return f.read()


def choice():
    with open(os.path.join(HERE, "choice.json")) as f:
        return json.load(f)


def gpu_names(table):
    return re.findall(r"^\|\s+\d+\s+(.+?)\s{2,}(?:On|Off)\s+\|", table, re.M)


def gpu_model(fixtures=FIX):
    """(name, count, (major, minor)) of the captured table's GPUs: what the hosts pretend to have."""
    with open(os.path.join(fixtures, TABLE)) as f:
        names = gpu_names(f.read())
    return names[0], len(names), [int(v) for v in V100_COMPUTE_CAP.split(".")]


def gpu_rows(fields):
    table = fixture(TABLE)
    driver = re.search(r"Driver Version: (\S+)", table).group(1)
    names = gpu_names(table)
    mems = re.findall(r"/\s+(\d+)MiB \|", table)
    values = {
        "name": names,
        "driver_version": [driver] * len(names),
        "memory.total": ["%s MiB" % m for m in mems],
        "compute_cap": [V100_COMPUTE_CAP] * len(names),
        "index": [str(i) for i in range(len(names))],
    }
    unknown = [f for f in fields if f not in values]
    if unknown:
        sys.stderr.write('Field "%s" is not a valid field to query.\n' % unknown[0])
        sys.exit(2)
    rows = [", ".join(values[f][i] for f in fields) for i in range(len(names))]
    return rows[: choice()["gpus"]]


def nvidia_smi(args):
    if args[:2] == ["topo", "-m"]:
        sys.stdout.write(fixture(TOPO[choice()["topo"]]))
        return 0
    query = [a for a in args if a.startswith("--query-gpu=")]
    if query:
        for row in gpu_rows(query[0].split("=", 1)[1].split(",")):
            print(row)
        return 0
    sys.stdout.write(fixture(TABLE))
    return 0


def df(args):
    paths = [a for a in args if not a.startswith("-")]
    if args[:1] != ["-Pk"] or len(paths) != 1 or not paths[0].startswith("/data"):
        os.execv("/usr/bin/df", ["df"] + args)
    real = os.popen("/usr/bin/df -Pk %s" % paths[0]).read().splitlines()
    fs, _, used = real[-1].split()[:3]
    size = int(choice().get("diskGib", 7000)) * 1024 * 1024
    print(real[0])
    print("%s %d %s %d %d%% /data" % (fs, size, used, size - int(used), 100 * int(used) // size))
    return 0


def ibstat(hca):
    """The captured RoCE output; with hca == "down", mlx5_0 port 1 in the state lines of a disabled port."""
    out = fixture(IBSTAT)
    if hca == "roce-active":
        return out
    if hca != "down":
        raise SystemExit("gpu_shim: hca is roce-active or down, not %r" % hca)
    down = re.search(r"(\s+State: Down\n\s+Physical state: Disabled\n)", fixture(DISABLED_PORT)).group(1)
    first = re.search(r"(CA 'mlx5_0'.*?Port 1:\n)(\s+State: Active\n\s+Physical state: LinkUp\n)", out, re.S)
    indent = re.match(r"\s+", first.group(2)).group(0)
    lines = [indent + line.strip() for line in down.strip("\n").splitlines()]
    return out[: first.end(1)] + "\n".join(lines) + "\n" + out[first.end(2) :]


def main():
    tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
    if tool == "df":
        return df(args)
    if tool == "nvidia-smi":
        return nvidia_smi(args)
    if tool == "ibstat":
        sys.stdout.write(ibstat(choice()["hca"]))
        return 0
    if tool == "ibv_devices":
        sys.stdout.write(fixture(IBV_DEVICES))
        return 0
    if tool == "nvidia-container-cli":
        print("cli-version: 1.17.8 (llm-cluster lab stand-in: no GPU behind it)")
        return 0
    sys.stderr.write("gpu_shim: unknown tool %s\n" % tool)
    return 127


if __name__ == "__main__":
    sys.exit(main())
