"""The switches of the CUDA MLA kernels the ``sm120-mla-attention`` patch adds to SGLang (``sm120_mla_mma.py``).

A patched SGLang reads them from its environment; sm120kit names them where it builds those kernels as the
server would (``audit``), checks a value (``verify``) or prints one to set (``tune-mla``). The kernels' modules
hold the same names (``sm120_mla_mma.DEFINES_ENV`` and ``FP8_MMA_ENV``, ``sm120_mla_nvrtc.CACHE_ENV``); a test
compares them.
"""

# Build flags the kernels take at first use (NAME=VALUE of the kernels' TUNABLES, comma-separated).
DEFINES_ENV = "SGLANG_SM120_MLA_DEFINES"
# fp8 KV on the fp8-mma path (e4m3 scores): 1 on, 0 off, unset the route's default.
FP8_MMA_ENV = "SGLANG_SM120_MLA_FP8_MMA"
# Where the kernels' cubins are kept once NVRTC has compiled them.
CACHE_DIR_ENV = "SGLANG_SM120_MLA_CACHE_DIR"
