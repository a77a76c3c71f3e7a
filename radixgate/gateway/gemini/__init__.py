"""Google's Gemini API (``/v1beta/``): generateContent, streamGenerateContent, countTokens and
explicit caches (``cachedContents``), on the same pipeline as the Anthropic and OpenAI APIs."""
