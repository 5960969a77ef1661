"""sae: sparse autoencoders on images, compared by sparsity mechanism."""

__version__ = "0.1.0"
