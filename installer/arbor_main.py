"""The frozen program's entry point (PyInstaller): the engine's child processes start through
it too, so multiprocessing's spawn must be handled before anything else."""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    from app.main import main

    sys.exit(main())
