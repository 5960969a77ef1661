"""``python -m sae.features`` keeps its name; the feature browser is :mod:`sae.pages.features`."""
