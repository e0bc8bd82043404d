"""The frozen program's entry point (PyInstaller): the engine's child processes start through
it too, so multiprocessing's spawn must be handled before anything else."""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    if sys.argv[1:2] == ["--kernels"]:  # llama.cpp in this process, no Qt: see engine.llm.kernels
        from engine.cli.main import main as engine_main

        sys.exit(engine_main(["kernels", *sys.argv[2:]]))
    from app.window.main import main

    sys.exit(main())
