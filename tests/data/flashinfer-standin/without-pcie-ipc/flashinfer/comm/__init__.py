"""Stand-in for flashinfer.comm of a FlashInfer without the PCIe-IPC all-reduce (0.6.18 and older)."""
