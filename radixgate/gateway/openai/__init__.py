"""The OpenAI APIs: ``schemas`` and ``convert`` (chat and legacy completions requests),
``chat`` (POST /v1/chat/completions), ``completions`` (POST /v1/completions), ``models``
(GET /v1/models), ``choices`` and ``logprobs`` (what chat and completions share), and
``responses/`` (the Responses API)."""
