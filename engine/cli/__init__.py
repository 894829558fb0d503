"""Command-line interface: generate, chat, info, convert (no Qt here; the GUI entry is main.py)."""
