"""The TopK SAE: each input keeps its k largest pre-activations. k is a common setting (it sizes
BatchTopK's budget too)."""

from sae.settings.variants.registry import Variant, register

register(Variant("topk", "sae.models.topk:TopKSAE", budget="fixed"))
