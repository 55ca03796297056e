"""Console entry point (placeholder until the Typer app lands)."""


def main() -> None:
    from zgtool.app import app

    app()
