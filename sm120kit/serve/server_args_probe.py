"""Build SGLang's own launch-server argument parser and describe its options; parse given command lines.

This module is a program: ``python -m sm120kit.serve.server_args_probe RESULT.json ARGVS_JSON``, started by
:func:`sm120kit.serve.server_args.read_server_args` through :func:`sm120kit.runner.run` in the Python that
will run the server, with ``PYTHONPATH`` at the folder holding the SGLang tree's ``sglang/`` when a tree is
given (otherwise the sglang that Python imports). It never runs in the calling process, and it imports
nothing of sm120kit nor anything outside the standard library but sglang, so that it runs in any
interpreter that can run SGLang.

``ARGVS_JSON`` is a JSON array of command lines (each an array of strings, without the program name).
RESULT.json gets: ``python`` (the interpreter), ``package_dir`` and ``version`` of the sglang imported,
``options`` (each option of ``ServerArgs.add_cli_args``: flags, destination, arity, choices, type and
whether it is deprecated or retired), and per command line its parse error (or null) in ``argv_errors``
and the destinations it sets explicitly in ``argv_given``. When sglang's server arguments cannot be
imported it gets ``import_error`` and ``traceback`` instead. The exit status is 0 whenever RESULT.json
was written.
"""

import argparse
import json
import os
import sys
import traceback


class Stop(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Stop(message)

    def exit(self, status=0, message=None):
        raise Stop(message or "exit %s" % status)


def plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, (str, int)) else str(v)


def describe(parser):
    options = []
    for a in parser._actions:
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        kind = type(a).__name__
        options.append(
            {
                "flags": list(a.option_strings),
                "dest": a.dest,
                "nargs": a.nargs if a.nargs is None or isinstance(a.nargs, int) else str(a.nargs),
                "required": bool(a.required),
                "choices": [str(c) for c in a.choices] if a.choices is not None else None,
                "type": a.type.__name__ if a.type in (int, float, str) else None,
                "deprecated": "Deprecat" in kind or bool(getattr(a, "deprecated", False)),
                "retired": getattr(a, "error_message", None),
                "replacement": getattr(a, "new_flag", None),
            }
        )
    return options


def parse(parser, argv, result):
    try:
        parser.parse_args(argv)
        result["argv_errors"].append(None)
    except Stop as exc:
        result["argv_errors"].append(str(exc))
    except BaseException as exc:
        result["argv_errors"].append("%s: %s" % (type(exc).__name__, exc))
    # what the line sets explicitly: the same parser with every default suppressed
    saved = [(a, a.default, a.required) for a in parser._actions]
    try:
        for a in parser._actions:
            a.default, a.required = argparse.SUPPRESS, False
        ns, _ = parser.parse_known_args(argv)
        result["argv_given"].append({k: plain(v) for k, v in vars(ns).items() if k != "model_path"})
    except BaseException:
        result["argv_given"].append(None)
    finally:
        for a, default, required in saved:
            a.default, a.required = default, required


def main(argv):
    out_path, argvs = argv[0], json.loads(argv[1])
    result = {"python": sys.executable, "argv_errors": []}

    def dump():
        with open(out_path, "w") as fh:
            json.dump(result, fh)

    try:
        import sglang

        result["package_dir"] = os.path.dirname(os.path.abspath(sglang.__file__))
        try:
            from sglang.version import __version__ as v
        except Exception:
            v = None
        result["version"] = v
        from sglang.srt.server_args import ServerArgs
    except BaseException as exc:
        result["import_error"] = "%s: %s" % (type(exc).__name__, exc)
        result["traceback"] = traceback.format_exc()[-3000:]
        dump()
        return 0

    parser = Parser(prog="python -m sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    result["options"] = describe(parser)
    result["argv_given"] = []
    for one in argvs:
        parse(parser, one, result)
    dump()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
