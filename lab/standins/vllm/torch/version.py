"""torch.version of the lab stand-in: the image's CUDA."""

from torch import FACTS

cuda = FACTS["cuda"]
__version__ = FACTS["torch"]
