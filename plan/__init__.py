"""The offline plan: the real program under Pulumi's mock runtime, the real policy pack, no engine."""
