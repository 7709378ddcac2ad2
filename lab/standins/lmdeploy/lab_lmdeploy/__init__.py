"""llm-cluster lab stand-in for LMDeploy's OpenAI server (not TurboMind): the image's real lmdeploy 0.16.0
Python (its CLI, config classes, metrics) with a canned-text engine in place of TurboMind.

boot (run at every interpreter start by lab-lmdeploy.pth) stubs the packages lmdeploy requires that the
stand-in does not carry, as components/engines/lmdeploy/tools/dump_lmdeploy.py does; server is `lmdeploy serve api_server`.
"""
