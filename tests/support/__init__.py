"""Shared helpers for the reliability and security suite: a gateway subprocess,
HTTP request builders and checkers, and the soak load generator."""
