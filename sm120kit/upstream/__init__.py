"""Checking the series against newer SGLang (releases, main, moved files) and refreshing its diffs."""
