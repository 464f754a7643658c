"""A run's guard against its own divergence: loss spikes judged by its recent history (SpikeWatch); checkpoints of sound
weights only, kept as a series (Saves); the stop after too many bad steps in a row, naming them (BadSteps)."""
import math
import os

from .data import evaluate
from .files import all_finite, branch_from, checkpoint_series, save_in_series
from model import diverged

# a spike: over `threshold` spreads and SPIKE_MARGIN above the mean of the last ~SPIKE_WINDOW, once SPIKE_HISTORY are in
SPIKE_WINDOW, SPIKE_HISTORY, SPIKE_MARGIN = 50, 20, 0.1


class SpikeWatch:
    """judge(loss), Trainer.step's `accept`: True unless the loss (`reduce`d over ranks) spikes (.loss, .spiked); a finite
    one not a spike joins the history: the mean, and the spread (half the mean square of successive differences)."""

    def __init__(self, threshold, reduce=None, mean=0.0, var=0.0, count=0, last=0.0):
        self.threshold, self.reduce = threshold, reduce or (lambda loss: loss)
        self.mean, self.var, self.count, self.last, self.loss, self.spiked = mean, var, count, last, math.nan, False

    def judge(self, loss):
        self.loss = self.reduce(loss).item()
        rise = self.loss - self.mean
        self.spiked = bool(self.threshold and self.count >= SPIKE_HISTORY and
                           rise > max(self.threshold * self.var ** 0.5, SPIKE_MARGIN * self.mean))
        if not self.spiked and math.isfinite(self.loss):
            self.count += 1
            weight = max(1 / self.count, 1 / SPIKE_WINDOW)
            jump = self.loss - self.last if self.count > 1 else 0.0
            self.mean, self.var, self.last = self.mean + weight * rise, self.var + weight * (jump ** 2 / 2 - self.var), self.loss
        return not self.spiked

    def state_dict(self):
        return dict(mean=self.mean, var=self.var, count=self.count, last=self.last)


class Saves:
    """A run's checkpoints: `path` (ckpt.pt) the newest sound one, `keep` - 1 older beside it; a resumed `checkpoint`
    (from `source`) the last until the run saves."""

    def __init__(self, path, keep, checkpoint=None, source=None):
        self.path, self.keep = path, keep
        self.last, self.last_path = (checkpoint["step"], source) if checkpoint is not None else (None, None)
        self.branched = checkpoint is not None and os.path.abspath(source) != os.path.abspath(path)

    def branch(self):
        """Rank 0's, once out_dir is claimed: the names `path` and the later ones got, set aside (files.branch_from)."""
        return branch_from(self.path, self.last) if self.branched else []

    def save_if_sound(self, evaluation, state, mask_rate, at_end=False):
        """`state` saved if its weights are finite and their loss on a validation micro-batch not diverged (a divergence
        stop names one a lower rate recovers from); else said (at_end: an error)."""
        e = evaluation  # train.Evaluation: what evaluating needs
        loss = evaluate(e.model, e.val_tokens, e.meta, e.micro, e.rt, e.micro, mask_rate)[0] if all_finite(state["model"]) else None
        refused = "non-finite weights" if loss is None else \
            f"a diverged validation loss ({loss:.2f})" if diverged(loss, state["meta"]["vocab_size"]) else None
        if not refused:
            save_in_series(self.path, state, self.keep, None if self.branched else self.last)
            self.last, self.last_path, self.branched = state["step"], self.path, False
        elif at_end:
            raise SystemExit(f"error: the weights at step {state['step']} were not saved: {refused}; {self.advice()}")
        else:
            print(f"checkpoint at step {state['step']} not saved: {refused}; {self.kept()}")

    def kept(self):
        """Where the last sound save is, and the one before it by name; or that there is none."""
        if self.last is None:
            return "no checkpoint was saved"
        older = [p for step, p in checkpoint_series(os.path.dirname(self.path)) if step < self.last]
        before = f" (the one before it: --resume_from={os.path.basename(older[-1])})" if older else ""
        return f"the last checkpoint is {self.last_path} at step {self.last}{before}"

    def advice(self):
        return f"{self.kept()}: lower --lr and {'resume it' if self.last is not None else 'start again'}"


class BadSteps:
    """A run's skipped updates (`skipped`, logged) and its streak of steps that diverged or spiked (`in_a_row`: no save
    then); count(step, applied, its SpikeWatch) ends the run at `limit` in a row, naming what to resume (advice)."""

    def __init__(self, limit, saves, vocab_size, threshold):
        self.limit, self.saves, self.vocab_size, self.threshold, self.skipped, self.in_a_row = limit, saves, vocab_size, threshold, 0, 0

    def count(self, step, applied, watch, scaler=None):
        self.skipped += not applied
        bad = watch.spiked or diverged(watch.loss, self.vocab_size, applied, scaler)
        self.in_a_row = self.in_a_row + 1 if bad else 0
        if self.in_a_row < self.limit:
            return
        spike = f", or a spike: {self.threshold:g} spreads and {SPIKE_MARGIN:.0%} above the recent mean" if self.threshold else ""
        raise SystemExit(f"error: {self.in_a_row} steps in a row diverged (a non-finite gradient, a loss above "
                         f"{math.log(self.vocab_size) + 1:.2f}{spike}) up to step {step}; {self.saves.advice()}")
