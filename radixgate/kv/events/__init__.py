"""KV events: the tree's block stored / removed / cleared announcements and vLLM's wire format."""
