"""The gateway's API keys (no Pulumi): their ids, the digest file gateway.lua reads (`sha256 -> key id`;
nginx never sees a key in its config), and the scripts that make and remove the keys on the gateway host."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence

from components.planning.gateway.layout import DIGESTS_FILE, HOST_KEYS_DIR
from components.spec.stack import StackSpec

DEFAULT_KEY_ID = "default"


def key_ids(spec: StackSpec) -> list[str]:
    """Key ids of the stack: the apiKeys' ids, or `default` when none are stated; none without auth."""
    assert spec.gateway is not None
    if not spec.gateway.auth:
        return []
    return [k.id for k in spec.gateway.api_keys] or [DEFAULT_KEY_ID]


def key_digests(keys: Mapping[str, str], ids: Sequence[str]) -> str:
    """The file gateway.lua reads: {sha256(key): id} for exactly the stack's ids; refuses gaps and extras."""
    missing = [i for i in ids if not keys.get(i)]
    extra = sorted(set(keys) - set(ids))
    if missing or extra:
        raise ValueError(
            "gatewayApiKeys must hold one key for each gateway key id "
            f"({', '.join(ids)}); missing: {', '.join(missing) or 'none'}, "
            f"not in the stack: {', '.join(extra) or 'none'}"
        )
    digests = {hashlib.sha256(keys[i].encode()).hexdigest(): i for i in ids}
    if len(digests) != len(ids):
        raise ValueError("gatewayApiKeys gives the same key to two ids; each id needs its own key")
    return json.dumps(digests, indent=1, sort_keys=True) + "\n"


def keys_script(ids: Sequence[str], keys_dir: str = HOST_KEYS_DIR) -> str:
    """Make one key per id on the gateway host (kept across runs), drop others; print id -> key JSON.

    Writes keys.json (id -> key, 0600) for the operator and nginx/key-hashes.json (sha256 -> id,
    the only file mounted into the container). Files are rewritten only when their content changes.
    """
    quoted = " ".join(shlex.quote(i) for i in ids)
    d = shlex.quote(keys_dir)
    return f"""#!/usr/bin/env bash
# Gateway API keys, generated on this host and never sent anywhere but the Pulumi state (as a secret).
set -euo pipefail
umask 077
dir={d}
ids=({quoted})
mkdir -p "$dir/keys" "$dir/nginx"
for id in "${{ids[@]}}"; do
  if [ ! -s "$dir/keys/$id" ]; then
    key="sk-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \\n')"
    printf '%s\\n' "$key" > "$dir/keys/$id.new"
    mv "$dir/keys/$id.new" "$dir/keys/$id"
  fi
done
for f in "$dir/keys"/*; do
  [ -e "$f" ] || continue
  keep=0
  for id in "${{ids[@]}}"; do
    if [ "$(basename "$f")" = "$id" ]; then keep=1; fi
  done
  if [ "$keep" = 0 ]; then rm -f -- "$f"; fi
done
keys='{{'
digests='{{'
sep=''
for id in "${{ids[@]}}"; do
  key=$(cat "$dir/keys/$id")
  digest=$(printf '%s' "$key" | sha256sum | cut -d' ' -f1)
  keys+="$sep\\"$id\\": \\"$key\\""
  digests+="$sep\\"$digest\\": \\"$id\\""
  sep=', '
done
keys+='}}'
digests+='}}'
write_if_changed() {{
  if [ ! -f "$1" ] || [ "$(cat "$1")" != "$2" ]; then
    printf '%s\\n' "$2" > "$1.new"
    mv "$1.new" "$1"
  fi
}}
write_if_changed "$dir/keys.json" "$keys"
write_if_changed "$dir/nginx/{DIGESTS_FILE}" "$digests"
printf '%s\\n' "$keys"
"""


def keys_delete_script(keys_dir: str = HOST_KEYS_DIR) -> str:
    """Undo keys_script: the keys go with the gateway."""
    return f"""#!/usr/bin/env bash
set -euo pipefail
rm -rf -- {shlex.quote(keys_dir)}
"""
