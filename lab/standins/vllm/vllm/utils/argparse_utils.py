"""vllm.utils.argparse_utils of the lab stand-in: the parser class the qualification gate builds on."""

import argparse


class FlexibleArgumentParser(argparse.ArgumentParser):
    """vLLM's ArgumentParser subclass (its extras, config files and dash/underscore folding, are not needed here)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
