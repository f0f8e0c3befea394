from infermux.cli import main

# Guarded: front-end and executor processes are spawned, and must not run the command line again.
if __name__ == "__main__":
    raise SystemExit(main())
