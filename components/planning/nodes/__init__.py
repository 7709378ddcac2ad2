"""Node preparation: remote scripts, preflight expectations, host firewall, clock."""
