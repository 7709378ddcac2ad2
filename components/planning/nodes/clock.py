"""The node's clock against the operator's: one `date` over SSH, bracketed by the operator's clock.

The node's reading lies between the operator's readings before and after the round trip, so its
offset lies in [remote - after, remote - before]. The check fails only when that whole interval is
beyond the bound (a slow SSH handshake widens the interval, it never makes a false alarm), and
says so when the round trip was too slow to decide.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

q = shlex.quote


def clock_script(ssh: Sequence[str], login: str, node: str, bound_s: float) -> str:
    """Bash for the operator's machine: fail when the node's clock is surely off by more than bound_s."""
    fix = (
        "install chrony on the node and point it at the same NTP servers as this machine "
        "(apt-get install chrony; chronyc tracking); Ray's workers and TLS need clocks in step"
    )
    return f"""#!/usr/bin/env bash
# llm-cluster: {node}'s clock against this machine's (bound {bound_s:g} s)
set -euo pipefail
before=$(date +%s.%N)
remote=$({" ".join(q(a) for a in ssh)} {q(login)} 'date +%s.%N' </dev/null)
after=$(date +%s.%N)
awk -v b="$before" -v r="$remote" -v a="$after" -v bound={bound_s!r} -v node={q(node)} -v fix={q(fix)} 'BEGIN {{
  lo = r - a; hi = r - b
  if (r !~ /^[0-9]+(\\.[0-9]+)?$/) {{ printf "ERROR: %s answered %s to date +%%s.%%N\\n", node, r > "/dev/stderr"; exit 1 }}
  if (lo > bound || hi < -bound) {{
    printf "ERROR: %s'"'"'s clock is %.3f to %.3f s %s this machine'"'"'s (bound %g s, preflight.maxClockOffsetSeconds)\\n",
      node, (lo > 0 ? lo : -hi), (lo > 0 ? hi : -lo), (lo > 0 ? "ahead of" : "behind"), bound > "/dev/stderr"
    printf "    fix: %s\\n", fix > "/dev/stderr"
    exit 1
  }}
  if (a - b > 2 * bound) printf "clock %s: round trip %.3f s, too slow to bound the offset to %g s\\n", node, a - b, bound
  else printf "clock %s: offset %+.3f s (+/- %.3f s), within %g s\\n", node, (lo + hi) / 2, (hi - lo) / 2, bound
}}'
"""
