"""Serving: recipes (recipe), the server-argument probe (server_args, server_args_probe), flag checks (flags),
environment switches (env), GPUs (gpus), recipe checks (checks), launch (launch), docker arguments (docker)."""
