#!/usr/bin/python3
"""llm-cluster lab stand-in for Grafana (not Grafana; no Grafana build is on the registries the lab may
use): reads and checks the provisioning files as Grafana would need them, then serves /api/health.

Checks: every datasources/*.yaml has apiVersion and datasources with name, type and url; every
dashboards/*.yaml provider has a path whose *.json files parse and carry a title and panels; the admin
password file (GF_SECURITY_ADMIN_PASSWORD__FILE) is readable. A failed check exits 1 (docker restarts it).
"""

import glob
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

PROV = os.environ.get("GF_PATHS_PROVISIONING", "/etc/grafana/provisioning")


def check():
    problems, summary = [], []
    for path in sorted(glob.glob(os.path.join(PROV, "datasources", "*.y*ml"))):
        doc = yaml.safe_load(open(path)) or {}
        if "apiVersion" not in doc:
            problems.append("%s: no apiVersion" % path)
        for ds in doc.get("datasources") or []:
            missing = [k for k in ("name", "type", "url") if not ds.get(k)]
            if missing:
                problems.append("%s: datasource %r lacks %s" % (path, ds.get("name"), ", ".join(missing)))
            summary.append("datasource %s (%s) %s" % (ds.get("name"), ds.get("type"), ds.get("url")))
    for path in sorted(glob.glob(os.path.join(PROV, "dashboards", "*.y*ml"))):
        doc = yaml.safe_load(open(path)) or {}
        for prov in doc.get("providers") or []:
            folder = (prov.get("options") or {}).get("path")
            if not folder or not os.path.isdir(folder):
                problems.append("%s: provider %r path %r is not a directory" % (path, prov.get("name"), folder))
                continue
            for dash in sorted(glob.glob(os.path.join(folder, "*.json"))):
                try:
                    d = json.load(open(dash))
                except ValueError as e:
                    problems.append("%s: not JSON: %s" % (dash, e))
                    continue
                if not d.get("title") or not isinstance(d.get("panels"), list):
                    problems.append("%s: no title or panels" % dash)
                summary.append("dashboard %s (%d panels)" % (d.get("title"), len(d.get("panels") or [])))
    pw = os.environ.get("GF_SECURITY_ADMIN_PASSWORD__FILE")
    if pw and not (os.path.isfile(pw) and open(pw).read().strip()):
        problems.append("admin password file %s is missing or empty" % pw)
    return problems, summary


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        pass

    def do_GET(self):
        if self.path == "/api/health":
            body = json.dumps(
                {
                    "database": "ok",
                    "version": os.environ.get("LAB_GRAFANA_VERSION", ""),
                    "standin": "llm-cluster lab",
                    "provisioned": SUMMARY,
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
        else:
            body = b'{"message":"Not found"}'
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    PROBLEMS, SUMMARY = check()
    for s in SUMMARY:
        print("lab-grafana: provisioned " + s, flush=True)
    if PROBLEMS:
        for p in PROBLEMS:
            print("lab-grafana: ERROR " + p, file=sys.stderr, flush=True)
        sys.exit(1)
    addr = os.environ.get("GF_SERVER_HTTP_ADDR", "0.0.0.0")
    ThreadingHTTPServer((addr, int(os.environ.get("GF_SERVER_HTTP_PORT", "3000"))), Handler).serve_forever()
