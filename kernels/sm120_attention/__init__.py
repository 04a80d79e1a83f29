# Copyright 2026 the sm120kit authors. Licensed under the Apache License, Version 2.0.
"""The SM120 attention kernels of sm120kit's ``sm120-mla-attention`` patch, as a package for tests and benchmarks.

The patch ships the files of ``KERNEL_FILES`` in ``scripts/gen_mla_patch.py`` into SGLang, beside its Triton
attention kernels, where they import each other relatively as they do here; this file and ``reference``
(the inputs and the float32 reference of the tests and benchmarks) stay in sm120kit.
"""
