"""The `treb` command: argparse front, one module per verb, imported only when used."""
