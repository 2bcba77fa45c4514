"""imgbuild: NGC-based images from YAML recipes, smoke-tested on the GPU, run the way shared servers want."""

__version__ = "0.1.0"
