"""The gateway: nginx + Lua config, routing, keys, TLS, its image."""
