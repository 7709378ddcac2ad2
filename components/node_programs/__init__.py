"""Programs shipped to the nodes and run there: standard library only, no import of the project."""
from pathlib import Path

# Planning reads these files as text and ships them; it never imports them.
NODE_PROGRAMS = Path(__file__).parent
