"""The gateway's TLS (no Pulumi): the scripts that make a certificate signed by a private CA on the
gateway host, or install the stack's own certificate and key, and remove them."""

from __future__ import annotations

import shlex

from components.planning.gateway.layout import HOST_KEYS_DIR, NginxControl, reload_lines
from components.spec.stack import StackSpec

# Certificates the gateway host makes: valid 397 days (what browsers accept), renewed by any
# deployment within 30 days of expiry; the CA for 10 years.
CERT_DAYS = 397
CERT_RENEW_DAYS = 30
CA_DAYS = 3650


def tls_names(spec: StackSpec) -> list[str]:
    """Names in a generated certificate: the node's name and cluster address, then gateway.tlsNames."""
    g = spec.gateway
    assert g is not None
    return list(dict.fromkeys([g.node, spec.node(g.node).address, *g.tls_names]))


def tls_generate_script(spec: StackSpec, root: str = HOST_KEYS_DIR, control: NginxControl = NginxControl()) -> str:
    """Make (once) a private CA on the gateway host and a server certificate it signs; print the CA's certificate.

    The certificate is made again when its names change, when it expires within CERT_RENEW_DAYS, or
    when it no longer verifies against the CA; then nginx reloads. The CA key stays on the host (0600).
    """
    g = spec.gateway
    assert g is not None
    q = shlex.quote
    san = ",".join(f"{'IP' if _is_ipv4(n) else 'DNS'}:{n}" for n in tls_names(spec))
    return f"""#!/usr/bin/env bash
# llm-cluster: the gateway's TLS certificate, signed by a private CA made on this host
set -euo pipefail
umask 077
ca={q(root + "/ca")}
tls={q(root + "/tls")}
san={q(san)}
mkdir -p "$ca" "$tls"
if [ ! -s "$ca/ca.key" ] || [ ! -s "$ca/ca.pem" ]; then
  openssl req -x509 -newkey rsa:3072 -nodes -sha256 -days {CA_DAYS} -subj {q(f"/CN=llm-cluster gateway CA ({g.node})")} \\
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \\
    -keyout "$ca/ca.key.new" -out "$ca/ca.pem.new" 2>/dev/null
  mv -f "$ca/ca.key.new" "$ca/ca.key"
  mv -f "$ca/ca.pem.new" "$ca/ca.pem"
  chmod 0644 "$ca/ca.pem"
  echo "gateway: made a private CA in $ca" >&2
fi
current() {{
  [ -s "$tls/cert.pem" ] && [ -s "$tls/key.pem" ] && [ "$(cat "$tls/names" 2>/dev/null)" = "$san" ] &&
    openssl x509 -checkend {CERT_RENEW_DAYS * 86400} -noout -in "$tls/cert.pem" >/dev/null &&
    openssl verify -CAfile "$ca/ca.pem" "$tls/cert.pem" >/dev/null 2>&1
}}
if ! current; then
  openssl req -newkey rsa:2048 -nodes -sha256 -subj {q(f"/CN={g.node}")} -keyout "$tls/key.pem.new" \\
    -out "$tls/req.csr" 2>/dev/null
  printf 'subjectAltName=%s\\nextendedKeyUsage=serverAuth\\nbasicConstraints=critical,CA:FALSE\\n' "$san" > "$tls/ext.cnf"
  openssl x509 -req -sha256 -days {CERT_DAYS} -in "$tls/req.csr" -CA "$ca/ca.pem" -CAkey "$ca/ca.key" \\
    -set_serial "0x$(od -An -tx1 -N16 /dev/urandom | tr -d ' \\n')" -extfile "$tls/ext.cnf" \\
    -out "$tls/cert.pem.new" 2>/dev/null
  rm -f "$tls/req.csr" "$tls/ext.cnf"
  chmod 0644 "$tls/cert.pem.new"
  mv -f "$tls/key.pem.new" "$tls/key.pem"
  mv -f "$tls/cert.pem.new" "$tls/cert.pem"
  printf '%s' "$san" > "$tls/names"
  echo "gateway: new certificate for $san, valid {CERT_DAYS} days" >&2
{_indent(reload_lines("certificate", control))}
fi
cat "$ca/ca.pem"
"""


def tls_from_stdin_script(root: str = HOST_KEYS_DIR, control: NginxControl = NginxControl()) -> str:
    """Install the stack's certificate chain and key (one PEM stream on stdin), checked to match; reload."""
    q = shlex.quote
    return f"""#!/usr/bin/env bash
# llm-cluster: the gateway's TLS certificate and key from the stack's secrets
set -euo pipefail
umask 077
tls={q(root + "/tls")}
mkdir -p "$tls"
pem=$(cat)
key=$(printf '%s\\n' "$pem" | sed -n '/-----BEGIN .*PRIVATE KEY-----/,/-----END .*PRIVATE KEY-----/p')
cert=$(printf '%s\\n' "$pem" | sed '/-----BEGIN .*PRIVATE KEY-----/,/-----END .*PRIVATE KEY-----/d')
if [ -z "$key" ] || ! printf '%s\\n' "$cert" | openssl x509 -noout 2>/dev/null; then
  echo "gateway: gatewayTlsCert must hold a PEM certificate (chain) and gatewayTlsKey its PEM private key" >&2
  exit 1
fi
if [ "$(printf '%s\\n' "$cert" | openssl x509 -noout -pubkey)" != "$(printf '%s\\n' "$key" | openssl pkey -pubout)" ]; then
  echo "gateway: gatewayTlsKey is not the key of the certificate in gatewayTlsCert" >&2
  exit 1
fi
if [ "$(cat "$tls/cert.pem" 2>/dev/null)" != "$cert" ] || [ "$(cat "$tls/key.pem" 2>/dev/null)" != "$key" ]; then
  printf '%s\\n' "$key" > "$tls/key.pem.new"
  printf '%s\\n' "$cert" > "$tls/cert.pem.new"
  chmod 0644 "$tls/cert.pem.new"
  mv -f "$tls/key.pem.new" "$tls/key.pem"
  mv -f "$tls/cert.pem.new" "$tls/cert.pem"
  rm -f "$tls/names"
{_indent(reload_lines("certificate", control))}
fi
"""


def tls_delete_script(root: str = HOST_KEYS_DIR) -> str:
    """Undo the TLS scripts: certificate, key and the private CA go with the gateway."""
    return (
        f"#!/usr/bin/env bash\n# llm-cluster: remove the gateway's certificate and CA\nset -euo pipefail\n"
        f"rm -rf -- {shlex.quote(root + '/tls')} {shlex.quote(root + '/ca')}\n"
    )


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else line for line in text.rstrip("\n").split("\n"))


def _is_ipv4(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)
