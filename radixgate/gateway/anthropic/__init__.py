"""The Anthropic Messages API: ``schemas`` (request models), ``convert`` (request ->
conversation and constraint), ``messages`` (POST /v1/messages and count_tokens, the
answer's body and stream events)."""
