"""The JSON API (views) and its bearer tokens (tokens, which the line's door reads too)."""
