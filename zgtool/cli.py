"""Console entry point: `zgtool` (the script) and `python -m zgtool`."""


def main() -> None:
    from zgtool.app import main as app_main

    app_main()
