"""Serving: recipes, server-argument probe, flag checks, launch, docker arguments."""
