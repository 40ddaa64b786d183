"""`python -m searchrl ...`: the CLI, as torchrun launches it (`torchrun ... -m searchrl train ...`)."""

from searchrl.cli import main

if __name__ == "__main__":
    main()
