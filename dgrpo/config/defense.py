"""Typed configuration of a node's defenses: the chain (by name, with per-defense options) and the
reputation policy. A scenario's or a daemon's ``[defense]`` section, or ``--defense a,b`` on the command line.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from dgrpo.config.sections import Section
from dgrpo.errors import ConfigError


class ReputationConfig(Section):
    """Blacklist a peer whose completions keep being rejected (rejection rate over a window of rounds)."""

    enabled: Annotated[bool, Field(description="blacklist peers past the threshold")] = True
    window: Annotated[int, Field(ge=1, description="rounds over which a peer's rejection rate is taken")] = 5
    threshold: Annotated[
        float, Field(gt=0.0, le=1.0, description="rejection rate at or above which a peer is blacklisted")
    ] = 0.5
    min_completions: Annotated[
        int, Field(ge=1, description="completions a peer must have sent in the window before it can be judged")
    ] = 8
    max_evidence: Annotated[
        int,
        Field(
            ge=1,
            description="blacklist a peer after this many pieces of evidence over the whole run: completions "
            "failing a proof (sampling-proof) and rollouts breaking the plan binding or the canonical-text rule, "
            "which honest peers never produce; unlike the rate rule, honest completions mixed in do not dilute it",
        ),
    ] = 3


# Defenses that compare a completion with the receiver's own model: meaningful only for authors holding the
# same weights (dgrpo.defense.base.Defense.same_model; a test keeps this list equal to the classes' flags).
SAME_MODEL_DEFENSES = ("logit", "sampling-proof")

# Named chains: a name here in ``defense.chain`` or ``defense.foreign`` stands for its defenses.
# ``heterogeneous`` (issue 28): the recommended chain where nodes run different models, so no same-model check
# applies. ``repetition`` and ``meaning`` stop out-of-context payloads (the same words, or the same meaning in
# other words, across one author's completions), ``arith-pattern`` false arithmetic an author keeps stating,
# ``length-shift`` an author publishing its longest samples (DoS), ``code-policy`` the CODE attack's imports.
# docs/results.md has what it stops per mix and what it costs.
CHAIN_PRESETS: dict[str, tuple[str, ...]] = {
    "heterogeneous": ("repetition", "meaning", "arith-pattern", "length-shift", "code-policy"),
}


def expand_presets(names: list[str]) -> list[str]:
    """``names`` with each preset replaced by its defenses, each defense once, in order."""
    return list(dict.fromkeys(d for name in names for d in CHAIN_PRESETS.get(name, (name,))))


# From the names defined here, never typed twice (the registered defenses live above this layer: an unknown
# name's error lists them).
CHAIN_HELP = (
    "registered defenses by name (an unknown name's error lists them) or a named chain "
    f"({', '.join(CHAIN_PRESETS)}), as a list: -s 'defense.chain=[\"logit\"]'; run cheapest first. "
    f"Same-model checks ({', '.join(SAME_MODEL_DEFENSES)}) apply only to authors announcing this node's "
    "model and weights"
)


class DefenseConfig(Section):
    chain: Annotated[
        list[str],
        Field(
            description=CHAIN_HELP,
        ),
    ] = Field(default_factory=list)
    foreign: Annotated[
        list[str] | None,
        Field(
            description="the chain for authors announcing another model or other weights (no same-model checks). "
            "None: the chain itself when it has no same-model check; otherwise such authors are rejected "
            "(foreign_model), since in a homogeneous network every honest peer holds the same weights"
        ),
    ] = None
    options: Annotated[dict[str, dict[str, Any]], Field(description="per-defense options, by defense name")] = Field(
        default_factory=dict
    )
    reputation: ReputationConfig = ReputationConfig()

    @field_validator("chain", "foreign")
    @classmethod
    def _expand(cls, names: list[str] | None) -> list[str] | None:
        return None if names is None else expand_presets(names)

    @model_validator(mode="after")
    def _foreign_has_no_model_check(self) -> DefenseConfig:
        bad = sorted(set(self.foreign or ()) & set(SAME_MODEL_DEFENSES))
        if bad:
            raise ValueError(
                f"defense.foreign holds {bad}: it checks authors with another model or other weights, against "
                "which a same-model check compares nothing meaningful"
            )
        return self


def needs_seeded_sampler(chain: list[str]) -> bool:
    """Whether every node of the run must sample with the seeded sampler (the sampling-proof checks it)."""
    return "sampling-proof" in chain


def check_sampler(chain: list[str], sampler: str, key: str) -> None:
    """Raise when the chain needs the seeded sampler and ``key`` (the config key of the sampler) is not it."""
    if needs_seeded_sampler(chain) and sampler != "seeded":
        raise ValueError(f"the sampling-proof defense needs {key} = 'seeded' (every node samples with it)")


def parse_defense_spec(spec: str) -> list[str]:
    """``logit`` or ``length,arith-check,logit`` -> the chain's names."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"defense spec {spec!r}: expected NAME or NAME,NAME,...")
    return names
