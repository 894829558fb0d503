"""The generic MoE transformer (plain torch reference path)."""
