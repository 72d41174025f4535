"""``python -m relaunch`` is the ``relaunch`` command."""

from relaunch._cli import main

if __name__ == "__main__":
    main()
