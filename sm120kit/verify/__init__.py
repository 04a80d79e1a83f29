"""Verifying an environment: the environment report, its assessment rules, and numeric checks per backend on a real GPU."""
