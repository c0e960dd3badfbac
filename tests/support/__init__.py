"""Helpers shared by test tiers (fetching oracle inputs, building small files)."""
