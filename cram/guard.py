"""A run's guard against its own divergence. SpikeWatch tells a loss spike by the loss's recent history, and the loop
skips that step's update. Saves keeps a series of checkpoints, of sound weights only. BadSteps ends the run after too
many bad steps in a row and names the checkpoint to resume from."""
import math
import os

from .files import all_finite, branch_from, checkpoint_series, save_in_series
from model import diverged

# a spike: over `threshold` spreads and SPIKE_MARGIN above the mean of the last ~SPIKE_WINDOW, once SPIKE_HISTORY are in
SPIKE_WINDOW, SPIKE_HISTORY, SPIKE_MARGIN = 50, 20, 0.1


class SpikeWatch:
    """A run's recent training loss: its running mean over about SPIKE_WINDOW steps and its step-to-step spread (half
    the mean square of successive differences). A checkpoint keeps them (state_dict), so a resume judges as before."""

    def __init__(self, threshold, mean=0.0, var=0.0, count=0, last=0.0):
        self.threshold, self.mean, self.var, self.count, self.last = threshold, mean, var, count, last

    def is_spike(self, loss):
        """Whether `loss` is a spike: `threshold` spreads and SPIKE_MARGIN above the recent mean, once SPIKE_HISTORY
        losses are in (a threshold of 0 turns this off). A finite loss that is not a spike joins the history."""
        rise = loss - self.mean
        spike = bool(self.threshold and self.count >= SPIKE_HISTORY and
                     rise > max(self.threshold * self.var ** 0.5, SPIKE_MARGIN * self.mean))
        if not spike and math.isfinite(loss):
            self.count += 1
            weight = max(1 / self.count, 1 / SPIKE_WINDOW)
            jump = loss - self.last if self.count > 1 else 0.0
            self.mean, self.var, self.last = self.mean + weight * rise, self.var + weight * (jump ** 2 / 2 - self.var), loss
        return spike

    def state_dict(self):
        return dict(mean=self.mean, var=self.var, count=self.count, last=self.last)


class Saves:
    """A run's checkpoints: `path` (ckpt.pt) is the newest sound one, and `keep` - 1 older ones stay beside it as
    ckpt_<step>.pt. Each save is written to a temporary file and renamed into place (files.write_atomically), so a
    crash leaves the old checkpoint or the new one, never half of one. In a resume the checkpoint it started from
    (`source`) counts as the last until the run saves."""

    def __init__(self, path, keep, checkpoint=None, source=None):
        self.path, self.keep = path, keep
        self.last, self.last_path = (checkpoint["step"], source) if checkpoint is not None else (None, None)
        self.branched = checkpoint is not None and os.path.abspath(source) != os.path.abspath(path)

    def branch(self):
        """For a resume from an older checkpoint, once out_dir is claimed: sets aside the checkpoints saved after it
        (files.branch_from) and returns their new names."""
        return branch_from(self.path, self.last) if self.branched else []

    def save_if_sound(self, validation, state, mask_rate, at_end=False):
        """Saves the checkpoint `state` if its weights are sound: finite, with a loss on one batch of validation rows
        (a data.Validation) that has not diverged. Only sound weights are saved, so a run stopped for diverging can
        resume from one. Unsound weights are not saved, which is said; at the end of a run (at_end) that is an error."""
        finite = all_finite(state["model"])
        loss = validation.score(validation.batch, mask_rate)[0] if finite else None  # one batch tells a divergence
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
        """A phrase that says where the last sound checkpoint is and names the one before it, or that none was saved."""
        if self.last is None:
            return "no checkpoint was saved"
        older = [p for step, p in checkpoint_series(os.path.dirname(self.path)) if step < self.last]
        before = f" (the one before it: --resume_from={os.path.basename(older[-1])})" if older else ""
        return f"the last checkpoint is {self.last_path} at step {self.last}{before}"

    def advice(self):
        return f"{self.kept()}: lower --lr and {'resume it' if self.last is not None else 'start again'}"


class BadSteps:
    """A run's count of skipped updates (`skipped`, which the log shows) and its streak of bad steps (`in_a_row`; no
    checkpoint is saved during one). A bad step is one whose loss spiked or diverged (model.diverged)."""

    def __init__(self, limit, saves, vocab_size, threshold):
        self.limit, self.saves, self.vocab_size, self.threshold, self.skipped, self.in_a_row = limit, saves, vocab_size, threshold, 0, 0

    def count(self, step, loss, spike, applied, scaler=None):
        """Counts one step. After `limit` bad steps in a row it ends the run (SystemExit), naming the checkpoint to
        resume from."""
        self.skipped += not applied
        bad = spike or diverged(loss, self.vocab_size, applied, scaler)
        self.in_a_row = self.in_a_row + 1 if bad else 0
        if self.in_a_row < self.limit:
            return
        spike = f", or a spike: {self.threshold:g} spreads and {SPIKE_MARGIN:.0%} above the recent mean" if self.threshold else ""
        raise SystemExit(f"error: {self.in_a_row} steps in a row diverged (a non-finite gradient, a loss above "
                         f"{math.log(self.vocab_size) + 1:.2f}{spike}) up to step {step}; {self.saves.advice()}")
