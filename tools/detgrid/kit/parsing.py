"""The kit's argument parser, shared by the `detgrid` CLI and the verbs that
also run as modules of their own (`python -m detgrid.kit.patch`)."""

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none to show (None,
    or False for a flag): those options' help says what happens instead."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """The kit's parser: defaults in --help, for the subcommands' parsers too
    (add_subparsers builds them with the parser's own class), and a bad
    argument answered in one line, not after a screenful of usage."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
