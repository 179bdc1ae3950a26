"""Chips: specs, memory tiers, and the execution models that turn operator work into time."""
