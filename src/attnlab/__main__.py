"""`python -m attnlab ...` (also what `torchrun -m attnlab train ...` runs), and the `attnlab`
console script (pyproject's [project.scripts] names `main`).

`main` holds a Ctrl-C over the import of the CLI's own modules (tens of milliseconds,
before `cli.main` takes over interrupts): pressed then, the program ends as it would in a
command, with `cli.interrupted_line` and status 130, not a KeyboardInterrupt traceback
(the console script's target was `cli.main`, imported by the script before it could catch
anything). A Ctrl-C before this module runs lands in the interpreter's own start-up (its
`site` import), which no code of attnlab's can catch.
"""

import signal
import sys


def main() -> int:
    """Run `attnlab` on sys.argv: the exit status."""
    pressed: list[int] = []
    held = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        from attnlab import cli
    finally:
        signal.signal(signal.SIGINT, held)
    if pressed:
        print(cli.interrupted_line(cli.command_of(sys.argv[1:])), file=sys.stderr)
        return 130
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
