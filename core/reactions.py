"""The reaction fallback: a small classifier over the context vector and its gates, in numpy.

The classes and their weights are trained offline (`models/reactions/head.py`,
docs/reactions.md) and ship in the bundle, so serving needs no torch. What
answers, in order:

1. every class that is *allowed* and *sure*, likeliest first. Allowed: it takes
   no side, or the context leans its way on its axis by the axis's margin
   (valence: a learned good-against-bad direction; phase: greeting against
   farewell). Sure: its probability reaches its floor; a mirror ("me too!",
   "you too!") has a high one, so it answers only a turn that invites it;
2. then the bundle's fallback ("oh I see"), which fits almost anything.

What the classifier reads: the context vector of the bundle that retrieves,
or, for a reaction model (a bundle of kind "reactions", `reading`), the last
turn through that model's own encoder, tuned to read a turn's mood.

A bundle with no fallback (an older one) answers with every allowed class,
likeliest first, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from core.bundle import REACTIONS_FILE, BundleError, ReactionSpec, open_bundle
from core.encoder import Encoder
from core.valence import Valence


@dataclass(frozen=True)
class ReactionClassifier:
    labels: list[str]  # [C] in `language`
    weight: np.ndarray  # [C, D], or [C, H] after a hidden layer
    bias: np.ndarray  # [C]
    language: str  # BCP 47: the conversations these reactions suit
    # BCP 47 -> [C] the same classes' text in another language; a multilingual
    # encoder puts a context near its translation, so one classifier serves both.
    translations: dict[str, list[str]] = field(default_factory=dict)
    axes: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))  # [A, D]
    axis_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [C] row of `axes`; -1: no side
    pole: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # [C] +1, -1; 0: no side
    margin: float = 0.0  # the lean a class needs on an axis that `axis_margin` leaves empty
    hidden_weight: np.ndarray | None = None  # [H, D]: logits = relu(x W_h^T + b_h) W^T + b; None: linear
    hidden_bias: np.ndarray | None = None  # [H]
    axis_bias: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # [A]; empty: zeros
    axis_margin: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # [A]; empty: `margin`
    floors: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # [C]; empty: every class sure
    # [G] rows of `axes`, [G] poles (+1, -1), [G] leans toward the pole at or past which only the classes
    # taking that side, and the fallback, may answer; empty: no guard.
    guard_axis: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    guard_pole: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    guard_lean: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    axis_names: list[str] = field(default_factory=list)  # [A] the spec's axes, in order
    fallback: int = -1  # the class served when none is sure; -1: none
    # A reaction model's own encoder: the classifier reads the last turn through it. None: it reads
    # the context vector of the bundle that retrieves.
    reader: Encoder | None = None
    # A reaction model's valence model (core/valence.py). Where there is one, the "valence" axis leans by
    # its `turn_lean` for the turn, which every caller passes, and a side needs a lean of 1.
    valence: Valence | None = None

    @classmethod
    def reading(cls, bundle_dir: Path, intra_op_threads: int = 0) -> ReactionClassifier:
        """The reaction model at `bundle_dir` (kind "reactions"): its classifier, reading turns with
        its own encoder. Raises BundleError for a bundle of another kind or one without a head."""
        manifest = open_bundle(bundle_dir)
        if manifest.kind != "reactions" or manifest.reactions is None:
            raise BundleError(f"{bundle_dir} is not a reaction model (kind {manifest.kind!r})")
        reader = Encoder(bundle_dir, manifest, intra_op_threads)
        loaded = replace(cls.load(bundle_dir, manifest.reactions, reader), reader=reader)
        return loaded.with_valence(Valence.load(bundle_dir, manifest.valence)) if manifest.valence else loaded

    def with_valence(self, valence: Valence) -> ReactionClassifier:
        """This classifier with its valence axis read from `valence`, in units of its margin
        (`Valence.turn_lean`): a stance and a guard on that axis need a lean of 1."""
        axis = self.valence_axis
        if axis < 0:
            raise ValueError("a valence model for a classifier with no valence axis")
        margin = self.axis_margin.copy() if len(self.axis_margin) else np.full(len(self.axes), self.margin, np.float32)
        margin[axis] = 1.0
        lean = np.where(self.guard_axis == axis, 1.0, self.guard_lean).astype(np.float32)
        return replace(self, valence=valence, axis_margin=margin, guard_lean=lean)

    @property
    def valence_axis(self) -> int:
        """The row of `axes` that is valence; -1 where there is none."""
        return self.axis_names.index("valence") if "valence" in self.axis_names else -1

    def vector(self, turn: str, context_vector: np.ndarray) -> np.ndarray:
        """[D] what the classifier reads for a conversation whose last turn is `turn` and whose
        context vector [D'] the retrieving bundle computed."""
        if self.reader is None:
            return context_vector
        return np.asarray(self.reader.encode([turn], side="context")[0])  # [D]

    @classmethod
    def load(cls, bundle_dir: Path, spec: ReactionSpec, encoder: Encoder | None = None) -> ReactionClassifier:
        """`encoder` (the bundle's own) places stance axes from their anchor lines; a spec whose axes
        are not in REACTIONS_FILE needs it."""
        with np.load(bundle_dir / REACTIONS_FILE) as saved:
            arrays = {name: saved[name].astype(np.float32) for name in saved.files}
        return cls.from_arrays(spec, arrays, encoder)

    @classmethod
    def from_arrays(
        cls, spec: ReactionSpec, arrays: dict[str, np.ndarray], encoder: Encoder | None = None
    ) -> ReactionClassifier:
        """The classifier from REACTIONS_FILE's arrays: weight [C, H|D], bias [C]; with a hidden layer
        hidden_weight [H, D], hidden_bias [H]; with learned axes, axes [A, D] and axis_bias [A]."""
        weight, bias = arrays["weight"], arrays["bias"]
        if weight.shape[0] != len(spec.labels) or bias.shape != (len(spec.labels),):
            raise ValueError(f"{REACTIONS_FILE}: {weight.shape} weights for {len(spec.labels)} labels")
        hidden = arrays.get("hidden_weight")
        if hidden is not None and (hidden.shape[0] != weight.shape[1] or "hidden_bias" not in arrays):
            raise ValueError(f"{REACTIONS_FILE}: a hidden layer {hidden.shape} that does not feed {weight.shape}")
        for language, texts in spec.translations.items():
            if len(texts) != len(spec.labels):
                raise ValueError(f"{len(texts)} {language} reactions for {len(spec.labels)} classes")
        if spec.floors and len(spec.floors) != len(spec.labels):
            raise ValueError(f"{len(spec.floors)} floors for {len(spec.labels)} classes")
        if not -1 <= spec.fallback < len(spec.labels):
            raise ValueError(f"fallback {spec.fallback} names no class of {len(spec.labels)}")
        learned = arrays.get("axes")
        if learned is not None and learned.shape[0] != len(spec.axes):
            raise ValueError(f"{REACTIONS_FILE}: {learned.shape[0]} axes for the spec's {len(spec.axes)}")
        axis_of, pole = stance_of(spec)
        axes = learned if learned is not None else stance_axes(spec, encoder)[0]
        names = list(spec.axes)
        if any(g[:-1] not in names or g[-1] not in "+-" for g in spec.guards):
            raise ValueError(f"guards {sorted(spec.guards)} name a pole of no axis of {names}")
        guards = [(names.index(g[:-1]), 1.0 if g[-1] == "+" else -1.0, lean) for g, lean in spec.guards.items()]
        return cls(
            labels=list(spec.labels),
            weight=weight,
            bias=bias,
            language=spec.language,
            translations=dict(spec.translations),
            axes=axes,
            axis_of=axis_of,
            pole=pole,
            margin=spec.stance_margin,
            hidden_weight=hidden,
            hidden_bias=arrays.get("hidden_bias"),
            axis_bias=arrays.get("axis_bias", np.zeros(len(names), np.float32)),
            axis_margin=np.array([spec.margins.get(n, spec.stance_margin) for n in names], np.float32),
            floors=np.array(spec.floors, np.float32),
            fallback=spec.fallback,
            guard_axis=np.array([g[0] for g in guards], np.int64),
            guard_pole=np.array([g[1] for g in guards], np.float32),
            guard_lean=np.array([g[2] for g in guards], np.float32),
            axis_names=names,
        )

    @property
    def languages(self) -> list[str]:
        return [self.language, *self.translations]

    def labels_in(self, language: str) -> list[str]:
        """[C] the classes' text in `language` (one of `languages`)."""
        return self.labels if language == self.language else self.translations[language]

    def probabilities(self, contexts: np.ndarray) -> np.ndarray:
        """contexts: [N, D] -> [N, C] class probabilities."""
        features = contexts
        if self.hidden_weight is not None and self.hidden_bias is not None:
            features = np.maximum(contexts @ self.hidden_weight.T + self.hidden_bias, 0.0)  # [N, H]
        logits = features @ self.weight.T + self.bias  # [N, C]
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return np.asarray(exp / exp.sum(axis=1, keepdims=True))

    def projected(self, contexts: np.ndarray, valence: np.ndarray | None = None) -> np.ndarray:
        """contexts: [N, D], valence: [N] the valence model's leans (`Valence.turn_lean`, where the
        classifier has one) -> [N, A] each context's place on each axis."""
        bias = self.axis_bias if len(self.axis_bias) else np.zeros(len(self.axes), np.float32)  # [A]
        projected = contexts @ self.axes.T + bias  # [N, A]
        if self.valence is not None:
            if valence is None:
                raise ValueError("this classifier's valence comes from its valence model: pass its lean")
            projected[:, self.valence_axis] = valence
        return np.asarray(projected)

    def raw_leans(self, contexts: np.ndarray, valence: np.ndarray | None = None) -> np.ndarray:
        """contexts: [N, D] -> [N, C] how far each context leans each class's way on its axis
        (meaningless where a class takes no side). valence: as `projected`."""
        return np.asarray(self.projected(contexts, valence)[:, np.maximum(self.axis_of, 0)] * self.pole)

    @property
    def class_margins(self) -> np.ndarray:
        """[C] the lean each class needs: its axis's margin (0 where it takes no side)."""
        margin = self.axis_margin if len(self.axis_margin) else np.full(len(self.axes), self.margin)  # [A]
        return np.where(self.axis_of >= 0, margin[np.maximum(self.axis_of, 0)] if len(margin) else 0.0, 0.0)

    def allowed_all(self, contexts: np.ndarray, valence: np.ndarray | None = None) -> np.ndarray:
        """contexts: [N, D] -> [N, C] whether each class may answer each context: it takes no side,
        or the context leans its way by at least its axis's margin. valence: as `projected`."""
        if not len(self.axes):
            return np.ones((len(contexts), len(self.labels)), dtype=bool)
        projected = self.projected(contexts, valence)  # [N, A]
        leaning = projected[:, np.maximum(self.axis_of, 0)] * self.pole  # [N, C]
        allowed = (self.axis_of < 0) | (leaning >= self.class_margins)  # [N, C]
        if len(self.guard_axis):
            toward = projected[:, self.guard_axis] * self.guard_pole  # [N, G]
            allowed &= guarded(
                toward, self.guard_lean, self.guard_axis, self.guard_pole, self.axis_of, self.pole, self.fallback
            )
        return np.asarray(allowed)

    def allowed(self, context: np.ndarray, valence: float | None = None) -> np.ndarray:
        """context: [D] -> [C], as `allowed_all`."""
        odds = None if valence is None else np.array([valence], np.float32)
        return np.asarray(self.allowed_all(context[None, :], odds)[0])

    def answers(self, contexts: np.ndarray, valence: np.ndarray | None = None) -> np.ndarray:
        """contexts: [N, D] -> [N] the class each is answered with first, as `top` orders them."""
        allowed = self.allowed_all(contexts, valence)
        return first_answers(self.probabilities(contexts), allowed, self.floors, self.fallback)

    def top(self, context: np.ndarray, k: int, valence: float | None = None) -> list[tuple[int, float]]:
        """context: [D] -> up to k (class, probability), best first: the allowed and sure classes by
        probability, then the fallback (when the bundle names one). valence: as `projected`, for one."""
        probs = self.probabilities(context[None, :])[0]  # [C]
        ok = self.allowed(context, valence) & (probs >= self.floors if len(self.floors) else True)  # [C]
        best = [int(c) for c in np.argsort(-probs, kind="stable") if ok[c]]
        if self.fallback >= 0 and self.fallback not in best:
            best.append(self.fallback)
        return [(c, float(probs[c])) for c in best[:k]]


def guarded(
    toward: np.ndarray,
    lean: np.ndarray,
    guard_axis: np.ndarray,
    guard_pole: np.ndarray,
    axis_of: np.ndarray,
    pole: np.ndarray,
    fallback: int,
) -> np.ndarray:
    """toward: [N, G] each context's lean toward each guard's pole; lean, guard_axis, guard_pole: [G];
    axis_of, pole: [C] -> [N, C] False where a guard holds the context and the class neither takes
    that guard's side nor is the fallback."""
    keep = np.ones((len(toward), len(axis_of)), dtype=bool)  # [N, C]
    for g in range(len(lean)):
        sides = (axis_of == guard_axis[g]) & (pole == guard_pole[g])  # [C]
        if fallback >= 0:
            sides[fallback] = True
        keep &= ~(toward[:, g] >= lean[g])[:, None] | sides[None, :]
    return keep


def first_answers(probs: np.ndarray, allowed: np.ndarray, floors: np.ndarray, fallback: int) -> np.ndarray:
    """probs, allowed: [N, C]; floors: [C] or empty -> [N] the likeliest class that is allowed and
    sure (its probability at least its floor), else `fallback` (-1: none)."""
    ok = allowed & (probs >= floors[None, :]) if len(floors) else allowed  # [N, C]
    best = np.argmax(np.where(ok, probs, -1.0), axis=1)  # [N]
    return np.where(ok.any(axis=1), best, fallback)


def stance_of(spec: ReactionSpec) -> tuple[np.ndarray, np.ndarray]:
    """The side each class takes -> (axis_of [C]: its row of the spec's axes, -1 for none; pole [C]: +1, -1, 0)."""
    names = list(spec.axes)
    axis_of = np.full(len(spec.labels), -1, dtype=np.int64)  # [C]
    pole = np.zeros(len(spec.labels), dtype=np.float32)  # [C]
    if spec.stances and len(spec.stances) != len(spec.labels):
        raise ValueError(f"{len(spec.stances)} stances for {len(spec.labels)} reactions")
    for c, stance in enumerate(spec.stances):
        if stance:
            axis, sign = stance[:-1], stance[-1]
            if axis not in spec.axes or sign not in "+-":
                raise ValueError(f"reaction {spec.labels[c]!r}: stance {stance!r} names no axis of {names}")
            axis_of[c], pole[c] = names.index(axis), 1.0 if sign == "+" else -1.0
    return axis_of, pole


def stance_axes(spec: ReactionSpec, encoder: Encoder | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The spec's axes placed by `encoder` from their anchor lines -> (axes [A, D], axis_of [C], pole [C])."""
    axis_of, pole = stance_of(spec)
    if not spec.axes:
        return np.zeros((0, 0), np.float32), axis_of, pole
    if encoder is None:
        raise ValueError("the reaction spec names stance axes: loading it needs the bundle's encoder")
    rows = []
    for axis in spec.axes:
        plus, minus = spec.axes[axis]
        rows.append(encoder.encode(plus, side="context").mean(0) - encoder.encode(minus, side="context").mean(0))
    return np.stack(rows).astype(np.float32), axis_of, pole  # [A, D]
