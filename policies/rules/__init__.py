"""The pack's rules, one module per concern; each exposes POLICIES."""
