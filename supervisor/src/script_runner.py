# Running a script as `__main__` the way `python script.py` does, and ending the process the
# way its interpreter would, shared by the pool's bootstrap (pool_boot.py) and the fork server
# (zygote_boot.py): the supervisor puts this file in front of either one. Names used here (sys,
# os, types, importlib.machinery, threading, atexit, gc, _fresh_names) are the including
# bootstrap's globals, looked up when a script runs.


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


def _warm_up_compiler():
    """A process's first compile() sets up the parser and compiler (about 2 ms on our 2-core
    machines, more than compiling a small script): a bootstrap calls this before it waits, so
    the script's compile does not pay for it. The source touches the common statement kinds."""
    compile(
        "import os\nfrom a import b\nx = [i * 2 for i in range(3) if i]\n"
        "def f(a, *b, k=1, **c):\n    global x\n    return f'{a!r}'\n"
        "class C(object):\n    async def g(self):\n        with open(x) as f:\n"
        "            pass\ntry:\n    pass\nexcept Exception as e:\n    raise\n",
        "<warm-up>",
        "exec",
        dont_inherit=True,
    )


def _read_all(fd):
    """What is left to read from `fd`, read at the os level: the io stack's buffered file costs
    a forked child ten times more. Asked for by its size: a read of a fixed megabyte had the
    allocator map and unmap a megabyte twice for a script of a few bytes."""
    chunks = []
    want = os.fstat(fd).st_size + 1
    while True:
        chunk = os.read(fd, want)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        want = 1 << 16


def _run(path, source=None):
    """Runs the script as `__main__`; returns (exit status, whether it ended by Ctrl-C).
    `source` is the file's bytes when the caller has them already (a forked script process
    gets them with its request); the file is read otherwise."""
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
        if source is None:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                source = _read_all(fd)
            finally:
                os.close(fd)
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


def _nothing_to_join():
    """Whether the script left no thread and registered no exit callback, so that
    `threading._shutdown` (which joins non-daemon threads and marks the main thread stopped for
    the callbacks to see) has nothing anyone could notice to do. Its code, never run in this
    process before, costs a forked child tens of microseconds."""
    locks = getattr(threading, "_shutdown_locks", None)
    return (locks is not None and not locks and len(threading._active) <= 1
            and not threading._limbo and atexit._ncallbacks() == 0)


def _finish(status, sigint):
    """The interpreter's exit, in its order, minus the teardown of every module.

    Waiting for non-daemon threads, atexit callbacks, releasing the script's globals (so files
    it left open are flushed and closed, and its objects' __del__ run) and flushing stdio are
    what a script can observe of a normal exit; freeing every module and the interpreter itself
    would only cost time, and the process is discarded anyway.
    """
    if not _nothing_to_join():
        try:
            threading._shutdown()
        except BaseException:
            pass
    atexit._run_exitfuncs()
    main = sys.modules.get("__main__")
    if main is not None:
        try:
            main.__dict__.clear()
        except Exception:
            pass
    del main
    gc.collect()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    if sigint:
        # A cold interpreter ends an uncaught Ctrl-C by dying of SIGINT after its cleanup.
        # Imported here: the pool's bootstrap loads only what the stub imports (the fork server
        # has it loaded already, so this costs it a lookup).
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    # The fork server's early exit report (zygote_boot.py); the pool's bootstrap has none.
    announce = globals().get("_announce_exit")
    if announce is not None:
        announce(status)
    os._exit(status)
