"""vLLM's extensions: ``utility`` (POST /tokenize, /detokenize, GET /version); vLLM's
request fields (``structured_outputs``, ``guided_*``, ``cache_salt``) are read by the
OpenAI schemas and radixgate/gateway/constraint_fields.py."""
