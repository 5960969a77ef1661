"""The Sparsemax-SAE and its α-entmax relative: which units fire from a sparse map over the code,
how much from a learned per-input magnitude."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sae.activations import EntmaxAlpha, entmax_alpha, softplus_inverse, sparsemax
from sae.activations.thresholds import threshold_code, update_running_threshold
from sae.models.base import SparseAutoencoder
from sae.models.gates import support_gate
from sae.models.losses import effective_support
from sae.models.schedules import anneal
from sae.settings.config import SAEConfig


class SparsemaxSAE(SparseAutoencoder):
    """Which units fire from sparsemax, how much from a learned per-input magnitude.

    For G groups of n = H/G units (G = ``groups``, default 1):

        s_g = a_g / T_g(x)                            scores                        [B, G, n]
        p_g = sparsemax(s_g)                          on the simplex, exact zeros   [B, G, n]
        r_g = softplus(w_g · (x − b_dec) + c_g)       magnitude of group g          [B, G]
        h   = r ⊙ p

    On its support sparsemax is p_j = s_j − τ(s), so h_j = (r/T) · ReLU(a_j − T τ): a ReLU
    whose threshold adapts to each input. The temperature sets how many units share the mass:
    the support of sparsemax(a / T) grows with T. Without a learnable T the encoder would have to
    rescale all its rows to change the support size, and training settled on few units per input
    (L0 ≈ 6 of 512 after an epoch on MNIST). The code carries magnitude through r (Σ_j h_j = r,
    and any non-negative h can be written this way), which a raw sparsemax code cannot (Σ p = 1).

    ``--model sparsemax`` defaults (``auto``) to each input's own support (the projection of
    its own scores, at inference as in training: what the name promises) with ``unshrunk-ste``
    values and the energy temperature (docs/results.md says how the design was chosen);
    ``EntmaxSAE`` keeps the global temperature and shrunk values.

    **Temperature** (``temperature``), with a learned T_g = exp(log T_g) per group in every mode:

    - ``global``: T_g(x) = T_g. Sparsemax is invariant to shifts of the scores but not to their
      scale, so the support then depends on the scale of a: scores twice as large give a smaller
      support, and inputs with more ink, whose scores are larger, get fewer units.
    - ``learned``: T_g(x) = T_g · exp(u_g · (x − b_dec)), a learned input head u_g ∈ R^D that
      starts at 0, so training starts exactly as ``global``; the model learns how the support's
      size should follow the input.
    - ``normalized``: T_g(x) = T_g · σ_g(a), σ_g(a) the standard deviation of the input's scores
      over the group's n units (parameter-free, differentiated through). Then
      sparsemax(a / T_g(x)) = sparsemax(z / T_g), z the input's standardised scores: the support
      is invariant to any positive affine map of the scores (c·a + d, c > 0), so it depends on
      the shape of their distribution, not on their scale. T_g is then a number of standard
      deviations per unit of mass and starts at 0.03 n: for standard normal scores that puts
      7 % of the units on the support (Σ_j (z_j − t)₊ = T with t the 93 % quantile). Rescaling
      the encoder no longer changes the support, so T is what sizes it, and log T learns
      ``TEMPERATURE_LR_SCALE`` times faster (``param_groups``).
    - ``energy``: T_g(x) = T_g · σ_g(a) · (‖x − b_dec‖ / ν)^γ_g, the normalized temperature
      times a power γ_g of the input's energy, ν = sqrt(v) the typical norm of a centred input.
      γ starts at ``energy_power`` (0 by default, so that training starts exactly as
      ``normalized``) and is learned, or held there with ``energy_power_mode: fixed``. The
      normalized support sees only the shape of the scores, so its L0 follows the input's
      energy only as far as that shape does; a fixed threshold's (BatchTopK's, JumpReLU's) L0
      also grows with the scores' scale. With γ > 0 the support grows with the energy through
      the temperature, and training sets γ (docs/models.md gives what it chose, and what a fixed
      larger γ trades). The power sizes the support only: unshrunk values stay
      r·ReLU(a / (T_g σ_g(a))), the normalized temperature's (``value_scores``). Had it divided
      the values too, γ would also have learned their scale, which r already carries, and
      training drove it below 0 (fewer units for inputs with more energy), the opposite of what
      a fixed threshold does; with shrunk values, h = r·p, it cannot be kept out of them.

    ``global`` and ``learned`` start at T₀ = 25 sqrt(v / D), some 5-10 % of the units active with
    the tied init.

    ‖p‖₁ ≡ 1, so an L1 penalty on p is a constant with zero gradient. The penalty is instead the
    effective number of active units, the Hill number of order 1/2, summed over groups:

        penalty = Σ_g (Σ_j sqrt(p_gj))² / 5

    It equals k when p is uniform on k units, so λ/5 is a price per active unit (the 1/5 puts
    λ = 0.01 near the L0 of the L1 and KL defaults), and it is 1 for a one-hot code. Lower orders
    weigh small entries more (order 0 is L0 itself). Orders 2 (the participation ratio 1/Σ p²)
    and 1 (the exponential of the entropy) could be lowered by piling mass onto one always-on
    unit while many tiny entries joined the support, and L0 kept rising late in training (the
    docs/models.md gives the runs' numbers). Its gradient, proportional to 1/sqrt(p_j), pushes small
    entries out of the support.

    **Values on the support** (``values``). ``shrunk``: h = r·p as above, every active value
    offset by the threshold Tτ. ``unshrunk``: h_j = r·ReLU(s_j) on sparsemax's support, 0
    elsewhere: the support (and the penalty on p that sets its size) is the same, but the values
    are those of a plain ReLU, not pulled towards zero by the threshold. The reconstruction's
    gradient then reaches only the units on the support, so a unit that leaves it never comes
    back, and the support's size shrinks through training whatever λ. ``unshrunk-ste`` has the
    same forward, h_j = r·ReLU(s_j)·H(u_j) with u_j = s_j − τ(s) the unit's margin (p_j on the
    support), and gives the step H the pseudo-derivative of a rectangle kernel of bandwidth ε
    (``sae.models.gates``, after JumpReLU's straight-through estimator):

        ∂h_j/∂u_j := r·ReLU(s_j)·K(u_j/ε)/ε,   K(z) = 1[|z| < 1/2],   ε = κ / |S|

    with τ differentiated as sparsemax's threshold (∂τ/∂s_k = 1/|S| on the support S). A unit
    within ε/2 below the threshold thus receives the reconstruction's gradient scaled by the
    value it would carry, and enters the support when that lowers the loss; a unit within ε/2
    above it learns what leaving would cost. The penalty is then L0 itself through the same gate,
    Σ_g Σ_j H(u_gj) / 10 (λ/10 a price per active unit), so a unit stays while its
    reconstruction is worth its price, as with JumpReLU's L0 penalty. The gate's price binds
    harder than the Hill number's at the same λ; the 1/10 (instead of 1/5) keeps λ = 0.01 near
    the same L0 as the shrunk design's default in a default-length MNIST run.
    (With the Hill number, whose gradient ∝ 1/sqrt(p_j) grows without bound at the threshold,
    the push out always won there.) The support's size then moves mostly through T, whose
    log learns ``TEMPERATURE_LR_SCALE`` times faster than the other parameters (as JumpReLU's
    thresholds do): at the base lr, L0 grew by some 2 units per 50 steps and could not reach
    the balance that λ sets in a short run. ε is measured in the units of p (which sums to
    1 on the simplex), relative to the mean active share 1/|S| of the input's group, so the
    window holds a similar fraction of the units near the threshold at every L0 (κ =
    ``GATE_BANDWIDTH``). (Before, ``unshrunk-ste`` passed the shrunk code's gradient to the
    unshrunk forward; that mismatch collapsed training to a handful of active units and most
    units dead.)

    **Inference** (``inference``; ``auto`` = ``sparsemax``). ``sparsemax``: the code above, in
    training and at inference.
    ``threshold`` trains exactly as ``sparsemax`` and, at inference (eval mode: validation,
    test, encoding), replaces sparsemax's per-input support by one threshold θ on every unit's
    unshrunk value v_j = r · ReLU(value score_j), the value it carries when on the support:

        h_j = v_j · 1[v_j > θ]

    so an active unit keeps its value and only the rule that chooses the support changes, as
    BatchTopK swaps its batch top-k for a threshold at inference. θ is the running mean (rate
    ``THRESHOLD_RATE``) over training batches of the |S|-th largest v in the batch, |S| the
    number of units sparsemax kept there: the threshold that would have kept as many. Sparsemax
    sizes each input's support by the shape of its own scores; a fixed threshold also gives an
    input with larger values more units. At 512 units the threshold's inputs follow their
    difficulty more closely at about the same FVU; at 4 096 units it admits units just outside
    an input's support with values they were never trained to carry there, and loses much of
    the reconstruction, so it is not the default (docs/history.md gives what each rule costs and
    gains on the same trained models).

    **Support** (``support``; ``auto`` = ``input``). ``input``: each input's scores are
    projected onto its own simplex, as above, in training and at inference. ``batch``: the
    whole batch's scores are projected at once, per group, onto {p >= 0, Σ_{i,j} p_ij = B}
    (``project``), as BatchTopK takes the top k·B of a batch where TopK takes each input's top
    k:

        p_ij = (s_ij − τ)₊,   Σ_{i,j} (s_ij − τ)₊ = B,   i.e.  p = B · sparsemax(vec(s) / B)

    One threshold τ serves the batch, so an input whose scores stand higher takes more units
    and one whose scores are flat takes fewer, where an input's own projection sizes its
    support by the shape of its scores alone. Values and gate are ``unshrunk-ste``'s with τ
    the batch's (∂τ/∂s = 1/|S| on the batch's support S) and ε = κ B / |S|, the batch's mean
    active share. At inference the batch is replaced by a running mean (rate
    ``BATCH_THRESHOLD_RATE``) of T·τ, the threshold on the pre-activations a, so that a unit fires
    where a_j > θ and the code of an input does not depend on its batch; the units admitted at
    inference are those the same rule trained. At inference this is a shared threshold on the
    pre-activations, BatchTopK's rule and a JumpReLU with one threshold (times the gain r):
    sparsemax only sets the threshold in training, so it is a named variant, not the default.
    The temperature is the global one: the per-input temperatures divide each input's scale
    away, which is what a shared threshold reads.

    Sparsemax units compete for the support, so a unit whose direction matches no input never
    enters it and never gets a gradient. ``init: auto`` therefore starts the decoder columns
    (and, tied, the encoder rows) at centred training images for this model (far fewer dead
    units; docs/models.md gives the numbers), and resampled units are admitted into the support on
    their source input (``after_resample``).
    """

    # a resampled unit must come near the others' scores on its input to enter the support at
    # all; at 1.0 it out-scores every unit there, and validation fvu jumped after each
    # resampling on MNIST; 0.5 resampled as many units without that jump
    resample_encoder_scale = 0.5
    # a resampled unit's score on its own input: above the others' threshold τ by this fraction
    # of their typical share Σ p². At the full share, the admitting bias is input-independent
    # and large where T is (the normalized T grows with the width): at 4 096 units it passed
    # the threshold on every input, pushed the other units out and killed most of them
    ADMISSION_SHARE = 0.1
    GATE_BANDWIDTH = 1.0  # κ: the gate's window ε = κ/|S|, one mean active share wide
    GATE_PRICE = 10.0  # unshrunk-ste's penalty: λ / GATE_PRICE per active unit
    # Adam moves log T by about lr a step at most: at the base lr, T (what sizes the support
    # with unshrunk-ste or the normalized temperature) moved too slowly for λ to reach the L0 it
    # sets within a short run (docs/models.md gives the numbers); JumpReLU's thresholds learn 10x
    # faster too
    TEMPERATURE_LR_SCALE = 10.0
    THRESHOLD_RATE = 0.01  # inference threshold: the running mean's rate, BatchTopK's
    # the batch support's θ = T·τ moves with T, which learns TEMPERATURE_LR_SCALE times faster
    # than the encoder whose pre-activations BatchTopK's threshold follows; at BatchTopK's rate
    # it lagged the batch threshold where L0 still moved (4 096 units: θ 5 % above T·τ at the
    # end, L0 38 at inference against 46 in training)
    BATCH_THRESHOLD_RATE = THRESHOLD_RATE * TEMPERATURE_LR_SCALE
    NORMALIZED_T0 = 0.03  # normalized temperature: T₀ = 0.03 n (7 % of normal scores active)
    SPREAD_MODES = ("normalized", "energy")  # temperatures that divide by the scores' spread

    def __init__(self, config: SAEConfig, mean_image=None, data_var: float = 1.0,
                 init_inputs=None):
        super().__init__(config, mean_image, data_var, init_inputs)
        self.temperature_mode = config.resolved_temperature()
        self.values_mode = config.resolved_values()
        if config.hidden % config.groups:
            raise ValueError(f"hidden {config.hidden} is not divisible by groups {config.groups}")
        self.scale_head = nn.Linear(config.input_dim, config.groups)
        nn.init.zeros_(self.scale_head.weight)
        nn.init.constant_(self.scale_head.bias, softplus_inverse(math.sqrt(data_var)))
        t0 = 25.0 * math.sqrt(data_var / config.input_dim)
        if self.temperature_mode in self.SPREAD_MODES:
            t0 = self.NORMALIZED_T0 * (config.hidden // config.groups)
        self.log_temperature = nn.Parameter(torch.full((config.groups,), math.log(t0)))
        if self.temperature_mode == "learned":  # log T(x) = log T + u · (x − b_dec), u from 0
            self.temperature_head = nn.Linear(config.input_dim, config.groups, bias=False)
            nn.init.zeros_(self.temperature_head.weight)
        if self.temperature_mode == "energy":  # T(x) ∝ (‖x − b_dec‖ / ν)^γ
            gamma = torch.full((config.groups,), float(config.energy_power))
            if config.energy_power_mode == "learn":
                self.energy_exponent = nn.Parameter(gamma)
            else:  # a buffer: saved with the weights, never trained
                self.register_buffer("energy_exponent", gamma)
        self.inference = config.resolved_inference()
        self.support_scope = config.resolved_support()
        if self.support_scope == "batch":  # θ_g: the batch threshold's running mean, per group
            # (kept on the pre-activations a = s·T: a mean of τ on s would also move with every
            # rescaling of the scores by T)
            self.register_buffer("inference_threshold", torch.zeros(config.groups))
            self.register_buffer("threshold_batches", torch.zeros((), dtype=torch.long))
        if self.inference == "threshold":
            self.register_buffer("inference_threshold", torch.zeros(()))
            self.register_buffer("threshold_batches", torch.zeros((), dtype=torch.long))
        # the smallest score spread the normalized temperature divides by
        self.min_spread = 1e-6 * math.sqrt(data_var / config.input_dim)
        if self.values_mode != "shrunk" and init_inputs is not None:
            self.start_at_shrunk_mass(init_inputs, math.sqrt(data_var))

    @torch.no_grad()
    def start_at_shrunk_mass(self, inputs: Tensor, r0: float) -> None:
        """Start unshrunk values with the shrunk code's mass, Σ_j h_j = r₀ per group on average.

        Unshrunk values sum to r·Σ_S ReLU(s_j), several times the shrunk code's r·Σ p = r with
        the data-initialised encoder (some 7x on MNIST); at the start the reconstruction then
        overshoots (FVU ≈ 20), and the gate pushed most units out of the support before r could
        come down (Adam moves r's bias by about lr a step).
        """
        a, x_centred = self.pre_activations(inputs.float())
        s = self.scores(a, x_centred)
        p = self.project(s)
        mass = (F.relu(s) * (p > 0)).sum(-1).mean(0)  # [G]
        for g, m in enumerate(mass.tolist()):
            self.scale_head.bias[g] = softplus_inverse(r0 / max(m, 1e-3))

    def param_groups(self) -> list[dict]:
        """log T (and the energy temperature's γ) learns ``TEMPERATURE_LR_SCALE`` times faster
        where T is what sizes the support: with ``unshrunk-ste`` and with the ``normalized`` and
        ``energy`` temperatures (whose scores ignore the encoder's scale); ``global`` and
        ``learned`` with shrunk values keep the base lr."""
        if self.values_mode != "unshrunk-ste" and self.temperature_mode not in self.SPREAD_MODES:
            return super().param_groups()
        fast = ("log_temperature", "energy_exponent")  # what sizes every input's support
        named = dict(self.named_parameters())
        return [{"params": [p for name, p in named.items() if name not in fast]},
                {"params": [named[name] for name in fast if name in named],
                 "lr": self.config.lr * self.TEMPERATURE_LR_SCALE}]

    def support_map(self, a: Tensor) -> Tensor:
        """Scores [B, H] -> p [B, H], each group of H/G entries on the simplex."""
        return sparsemax(a, dim=-1, groups=self.config.groups)

    def project(self, s: Tensor) -> Tensor:
        """Scores s [B, G, n] -> p [B, G, n]: each input's projection (``support: input``), or
        the whole batch's (``batch``): per group, the Euclidean projection of all B·n scores
        onto {p >= 0, Σ p = B},

            p = (s − τ_g)₊,  Σ_{i,j} (s_igj − τ_g)₊ = B,  i.e.  p = B · sparsemax(vec(s_g) / B),

        one threshold τ_g for the batch, so an input whose scores stand higher takes more of
        the batch's units (each input's mass is 1 on average, not each). In eval mode the batch
        is replaced by a running mean of τ_g: p = (s − θ_g / T_g)₊ with θ_g the running mean of
        T_g·τ_g, the threshold on the pre-activations a (T_g, which learns ten times faster than
        the encoder, would leave a mean of τ_g itself behind), and an input's code no longer
        depends on the rest of its batch."""
        if self.support_scope == "input":
            return self.support_map(s.reshape(len(s), -1)).view_as(s)
        if not self.training:
            return F.relu(s - self.batch_threshold()[:, None])
        B, G, n = s.shape
        flat = s.transpose(0, 1).reshape(G, B * n) / B
        return (B * sparsemax(flat, dim=-1)).view(G, B, n).transpose(0, 1).contiguous()

    def value_temperature(self, a: Tensor, x_centred: Tensor) -> Tensor:
        """The temperature without the energy power, [B, G]: what scales unshrunk values."""
        mode = self.temperature_mode
        if mode == "learned":
            return (self.log_temperature + self.temperature_head(x_centred)).exp()
        T = self.log_temperature.exp().expand(len(a), -1)
        if mode in self.SPREAD_MODES:
            spread = a.view(len(a), self.config.groups, -1).std(-1, correction=0)
            T = T * spread.clamp_min(self.min_spread)
        return T

    def temperature(self, a: Tensor, x_centred: Tensor) -> Tensor:
        """The temperature T_g(x) of each input and group, [B, G] (see ``temperature``)."""
        T = self.value_temperature(a, x_centred)
        if self.temperature_mode == "energy":
            norm = x_centred.norm(dim=-1, keepdim=True) / self.data_var.sqrt()  # [B, 1], ν = √v
            T = T * norm.clamp_min(1e-6).pow(self.energy_exponent)
        return T

    def scores(self, a: Tensor, x_centred: Tensor) -> Tensor:
        """s = a / T(x), [B, G, H/G]: the scores whose sparsemax is the support."""
        return a.view(len(a), self.config.groups, -1) / self.temperature(a, x_centred)[..., None]

    def value_scores(self, a: Tensor, x_centred: Tensor, s: Tensor) -> Tensor:
        """The scores unshrunk values carry, [B, G, H/G]: s itself, but for the energy
        temperature a / (T σ(a)) without the energy power, which sizes the support only."""
        if self.temperature_mode != "energy":
            return s
        return a.view_as(s) / self.value_temperature(a, x_centred)[..., None]

    @torch.no_grad()
    def after_resample(self, idx: Tensor, inputs: Tensor) -> None:
        """Admit each resampled unit into the support on its source input.

        A unit outside the support gets no gradient (but near the threshold with
        ``unshrunk-ste``), so a resampled unit that does not beat the threshold τ on any input
        stays dead. Its bias is set so that, on its source input and under that input's
        temperature T(x), its score is T(x)·(τ + c Σ p²), τ and p those of the other units (the
        resampled ones left out), c = ``ADMISSION_SHARE``: above the threshold by a small part
        of the support's typical share E_p[p], so that it enters the support on its input and
        on inputs like it, not on every input (the bias does not depend on the input). With
        ``support: batch`` τ is the batch threshold's running mean θ (what inference uses) and
        the share that of the input's p = (s − θ)₊, Σ p² / Σ p. With unshrunk values a unit
        carries ReLU(score), so it fires only where its score is above max(τ, 0), and the
        target is taken above that: early in training τ can be negative (the batch's θ starts
        near 0 and all scores are small), and units admitted just above it carried nothing.
        The global and learned temperatures do not depend on the bias, so one step is exact;
        the normalized and energy ones include the new scores in their spread, and the bias is
        its fixed point, found by iterating to rounding level (each step moves one of n scores,
        so the spread changes by O(1/n) and the iteration contracts fast).
        """
        G, n = self.config.groups, len(idx)
        rows, group = torch.arange(n, device=idx.device), idx // (self.config.hidden // G)
        a, x_centred = self.pre_activations(inputs)  # [n, H]
        without_bias = a[:, idx] - self.b_enc[idx]  # [n inputs, n new units]
        bias = self.b_enc[idx].clone()
        if self.temperature_mode in self.SPREAD_MODES:
            # start each new score at its group's median score: a far-off old bias (a unit
            # pushed to -1e4) would otherwise dominate the spread and slow the iteration
            median = a.view(n, G, -1).median(-1).values[rows, group]
            bias = median - without_bias[rows, rows]
        for _ in range(100 if self.temperature_mode in self.SPREAD_MODES else 1):
            a[:, idx] = without_bias + bias
            T = self.temperature(a, x_centred)  # [n, G]
            scores = a.view(n, G, -1) / T[..., None]
            scores.view(n, -1)[:, idx] = float("-inf")  # τ of the others, without the new units
            if self.support_scope == "input":
                p = self.support_map(scores.view(n, -1)).view(n, G, -1)
                tau = (scores - p).masked_fill(p <= 0, float("-inf")).amax(-1)  # [n, G]
                share = p.pow(2).sum(-1)  # [n, G]
            else:  # the batch threshold's running mean, and the input's own E_p[p]
                tau = self.batch_threshold().expand(n, G)
                p = F.relu(scores - tau[..., None])
                share = p.pow(2).sum(-1) / p.sum(-1).clamp_min(torch.finfo(p.dtype).tiny)
            if self.values_mode != "shrunk":  # an unshrunk value is ReLU(score): the unit
                tau = tau.clamp_min(0)  # carries one only where its score is also above 0
            target = T[rows, group] * (tau[rows, group] + self.ADMISSION_SHARE * share[rows, group])
            step, bias = target - without_bias[rows, rows] - bias, target - without_bias[rows, rows]
            tol = 16 * torch.finfo(a.dtype).eps * target.abs().max().clamp_min(self.min_spread)
            if step.abs().max() <= tol:
                break
        self.b_enc[idx] = bias

    def batch_threshold(self) -> Tensor:
        """θ_g / T_g [G]: the batch support's threshold at inference, on the scores s = a / T_g
        (``support: batch`` has the global temperature)."""
        return self.inference_threshold / self.log_temperature.exp()

    def gate(self, s: Tensor, p: Tensor) -> Tensor:
        """H(s − τ) [B, G, n] on sparsemax's support, with the straight-through pseudo-derivative
        of ``unshrunk-ste`` (``sae.models.gates``). With ``support: batch`` τ and the mean
        active share B/|S| are the batch's (one per group); in eval mode τ is θ."""
        on = p > 0
        if self.support_scope == "input":
            size = on.sum(-1, keepdim=True).clamp_min(1)
            tau = ((s - p) * on).sum(-1, keepdim=True) / size  # ∂τ/∂s_k = 1/|S| on S
            return support_gate(s - tau, on, self.GATE_BANDWIDTH / size)
        if not self.training:
            return on.to(s.dtype)
        size = on.sum((0, 2), keepdim=True).clamp_min(1)  # [1, G, 1]
        tau = ((s - p) * on).sum((0, 2), keepdim=True) / size
        if torch.is_grad_enabled():  # a training step (not a resampling pass)
            update_running_threshold(self.inference_threshold, self.threshold_batches,
                                     tau.detach().view(-1) * self.log_temperature.detach().exp(),
                                     self.BATCH_THRESHOLD_RATE)
        return support_gate(s - tau, on, self.GATE_BANDWIDTH * len(s) / size)

    def scale(self, x_centred: Tensor) -> Tensor:
        """r = softplus(scale head), [B, G]: the code's scale per input and group."""
        return F.softplus(self.scale_head(x_centred))

    def unshrunk_values(self, a: Tensor, x_centred: Tensor, s: Tensor | None = None,
                        r: Tensor | None = None) -> Tensor:
        """v = r·ReLU(value score), [B, G, H/G]: the value each unit carries when it is on the
        support with unshrunk values, and what the threshold at inference is put on. ``s``
        (the scores) and ``r`` (the scale, [B, G]) are computed unless given."""
        s = self.scores(a, x_centred) if s is None else s
        r = self.scale(x_centred) if r is None else r
        return F.relu(self.value_scores(a, x_centred, s)) * r.unsqueeze(-1)

    def code(self, a, x_centred):
        s = self.scores(a, x_centred)  # [B, G, n]
        p = self.project(s)
        r = self.scale(x_centred)  # [B, G]
        extras = {"p": p.view_as(a)}
        if self.values_mode == "shrunk":
            return (p * r.unsqueeze(-1)).view_as(a), extras
        # on the support p_j = s_j − τ: give s_j itself (clipped at 0), so no active value is
        # offset by the threshold; the support is still sparsemax's, and the penalty on p still
        # sets its size
        v = self.unshrunk_values(a, x_centred, s, r)
        if self.values_mode == "unshrunk":
            h = (v * (p > 0)).view_as(a)
        else:  # unshrunk-ste: the same, with a gradient near the support
            extras["gate"] = self.gate(s, p)
            h = (v * extras["gate"]).view_as(a)
        if self.inference == "threshold":  # validated: only with unshrunk values
            v = v.view_as(a)
            if not self.training:
                return threshold_code(v, self.inference_threshold), extras
            if torch.is_grad_enabled():  # a training step (not a resampling pass)
                self.track_threshold(v.detach(), int((p > 0).sum()))
        return h, extras

    @torch.no_grad()
    def track_threshold(self, v: Tensor, kept: int) -> None:
        """Move θ towards the ``kept``-th largest of the batch's values v [B, H]."""
        if kept < 1:
            return
        flat = v.flatten()
        value = flat.kthvalue(flat.numel() - min(kept, flat.numel()) + 1).values
        update_running_threshold(self.inference_threshold, self.threshold_batches, value,
                                 self.THRESHOLD_RATE)

    def penalty(self, h, extras):
        if "gate" in extras:  # unshrunk-ste: L0 through the gate, priced at the threshold
            return extras["gate"].sum((-2, -1)).mean() / self.GATE_PRICE
        return effective_support(extras["p"], self.config.groups) / 5.0


class EntmaxSAE(SparsemaxSAE):
    """As the Sparsemax-SAE with α-entmax as the support map (α = 2 is sparsemax).

    ``alpha_mode``: ``learn`` (α = 1 + softplus(θ), always > 1), ``anneal`` (α from ``alpha`` to
    2 over the first half of training, a soft start that ends as sparsemax) or ``fixed``.
    """

    def __init__(self, config: SAEConfig, mean_image=None, data_var: float = 1.0,
                 init_inputs=None):
        super().__init__(config, mean_image, data_var, init_inputs)
        self.entmax = EntmaxAlpha(alpha=config.alpha, learnable=config.alpha_mode == "learn",
                                  dim=-1, groups=config.groups)
        self.progress = (1, 1)  # (step, steps of training): a model not training is at its end

    def set_progress(self, step: int, total: int) -> None:
        self.progress = (step, total)

    def current_alpha(self) -> float | Tensor:
        """α now: the annealed value at this step (the end of training, 2, when no trainer has
        told the step: a loaded model), else the module's (learned or fixed) α."""
        if self.config.alpha_mode == "anneal":
            step, total = self.progress
            return anneal(step, self.config.alpha, 2.0, total // 2)
        return self.entmax.alpha

    def result_extras(self) -> dict[str, float]:
        """The α the run ended with (learned, annealed or fixed)."""
        alpha = self.current_alpha()
        return {"alpha": float(alpha.detach() if torch.is_tensor(alpha) else alpha)}

    def support_map(self, a: Tensor) -> Tensor:
        if self.config.alpha_mode == "anneal":
            return entmax_alpha(a, self.current_alpha(), dim=-1, groups=self.config.groups)
        return self.entmax(a)

    def train_logs(self) -> dict[str, float | Tensor]:
        alpha = self.current_alpha()
        return {"alpha": alpha.detach() if torch.is_tensor(alpha) else float(alpha)}
