"""Facts about SM12x GPUs and their binaries: the Arch type, fat-binary and cubin readers, the fake device."""
