"""vllm.entrypoints.cli.serve of the lab stand-in: `vllm serve`'s subparser, from the real parser dump."""

from vllm.server import populate


class ServeSubcommand:
    """As vLLM's: `subparser_init(subparsers)` returns the `serve` parser (the model is its positional)."""

    name = "serve"

    def subparser_init(self, subparsers):
        parser = subparsers.add_parser("serve", add_help=False, allow_abbrev=False)
        return populate(parser, "serve")
