"""Attention groups: how each kind of attention layer keeps its KV blocks (the window layers'
second pool and its plan)."""
