"""Loads the common library the way sgl-kernel does: sm90/ on capability 9.0, sm100/ otherwise."""

import importlib.util
import os
from pathlib import Path


def load_common_ops(capability=(12, 0)):
    folder = "sm90" if tuple(capability) == (9, 0) else "sm100"
    matches = sorted((Path(__file__).parent / folder).glob("common_ops.*"))
    spec = importlib.util.spec_from_file_location("common_ops", os.fspath(matches[0]))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
