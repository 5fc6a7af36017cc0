"""Envs whose actions call a tool: a search engine, a shop, a code sandbox, a Lean server."""
