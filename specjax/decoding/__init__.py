"""Decoding methods: autoregressive, speculative (draft model) and n-gram (prompt lookup)."""
