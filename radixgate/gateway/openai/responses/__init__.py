"""The OpenAI Responses API: ``schemas``, ``convert`` (a turn -> the chat conversation),
``store`` (stored responses per tenant), ``api`` (POST/GET/DELETE /v1/responses)."""
