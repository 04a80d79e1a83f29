"""The verifier: static SM120 audits that run on any machine, and checks that need a real GPU.

:mod:`sm120kit.verify.fake_device` is the one place that stands in for a CUDA device this machine may
lack; every static audit builds on it and says in its output that its results are static.
"""
