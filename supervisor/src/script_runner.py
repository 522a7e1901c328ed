# Running a script as `__main__` the way `python script.py` does, shared by the pool's
# bootstrap (pool_boot.py) and the fork server (zygote_boot.py): the supervisor puts this file
# in front of either one. Names used here (sys, types, importlib.machinery, _fresh_names) are
# the including bootstrap's globals, looked up when a script runs.


def _exit_status(code):
    # As the interpreter turns an uncaught SystemExit into a status (and prints a non-int one).
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def _run(path):
    """Runs the script as `__main__`; returns (exit status, whether it ended by Ctrl-C)."""
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__builtins__ = __builtins__
    if "__annotations__" in _fresh_names:
        main.__annotations__ = {}
    try:
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    except Exception:
        pass
    sys.modules["__main__"] = main
    sys.argv[:] = [path]
    try:
        with open(path, "rb") as f:
            source = f.read()
        code = compile(source, path, "exec", dont_inherit=True)
        del source
        exec(code, main.__dict__)
    except SystemExit as exc:
        code = exc.code
        del exc
        return _exit_status(code), False
    except BaseException as exc:
        # Report as `python script.py` would: without this bootstrap's frame.
        tb = exc.__traceback__
        if tb is not None and tb.tb_frame.f_code is _run.__code__:
            tb = tb.tb_next
        kind, value = type(exc), exc.with_traceback(tb)
        del exc
        sys.excepthook(kind, value, tb)
        del value, tb
        return 1, issubclass(kind, KeyboardInterrupt)
    return 0, False


