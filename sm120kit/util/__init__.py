"""Small helpers every layer may use: atomic writes, the tree lock, strict TOML, cache paths, name suggestions, data folders."""
