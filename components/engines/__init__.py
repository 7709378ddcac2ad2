"""Serving engines, one package each, behind one seam (base.Engine) and one registry (registry.ENGINES)."""
