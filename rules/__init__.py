"""Bundled Sigma rulesets, one file per threat vector (data only)."""
