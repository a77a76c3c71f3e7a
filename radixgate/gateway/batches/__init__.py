"""Batch APIs (Anthropic Message Batches, OpenAI Batch): requests stored in the state folder
and run below interactive traffic, grouped by shared prefix (store.py, runner.py)."""
