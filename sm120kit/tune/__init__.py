"""Tuning runs on a real GPU: the fused-MoE config tuner."""
