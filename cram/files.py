"""cram's own files, written so that nothing is lost and read so that damage is one line: atomic writes, locks, disk
checks, meta.json, the tokenizer's format, checkpoints and metrics.jsonl (a reader learning a step skips it)."""
import base64
import codecs
import contextlib
import dataclasses
import errno
import glob
import hashlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch

from configurator import allowed, declarations
from model import OFF, OPTIMIZERS, REPLACED_FIELDS, CrammedBert, ModelConfig, param_groups, saved_model_args

SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")  # after the regular tokens, [MASK] the last id (special_ids)
META_KEYS = ("vocab_size", "n_regular", "special_ids", "seq_len", "dtype", "tokenizer_file", "train_sequences",
             "val_sequences")  # what readers of meta.json rely on
# What a checkpoint may hold besides model, model_args, meta and tokenizer, of these types (type, not isinstance: no bool)
RECORD = dict(optimizer=(dict,), scaler=(dict,), config=(dict,), data_dir=(str,), budget=(dict, type(None)),
              step=(int,), tokens=(int,), elapsed=(float, int), init_val_loss=(float, int, type(None)), final=(bool,),
              spike_watch=(dict,))
# The run's settings a resume reads from its checkpoint's config, recorded by every train.py since the first: a
# checkpoint without one is not resumed, where the command's defaults would run as the run's own. (A newer setting
# that an older run's config lacks takes its default, which is how that run ran.)
RUN_SETTINGS = ("budget_hours", "batch_size", "batch_ramp", "lr", "mask_rate", "seed")
LOCK_FILE = ".lock"
HELD_ERRNOS = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)  # flock's answers for a lock another process holds
HELD = {}  # the folders this process has claimed, and their lock files: held until it ends
# The byte-order marks a text file may start with, and the decoding that reads it and drops the mark
BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def special_ids(n_regular):
    """The special tokens' ids, worked out here alone: after the n_regular BPE tokens, in SPECIAL_TOKENS' order."""
    return {token: n_regular + i for i, token in enumerate(SPECIAL_TOKENS)}


def text_encoding(path, opener=open):
    """The encoding a user's text file (a corpus, a task's file) is read in. Its byte-order mark decides: Notepad's
    UTF-8 mark, or Excel's "Unicode Text", which is UTF-16. A file without one is read as UTF-8. `opener` opens a
    compressed file (gzip.open)."""
    with opener(path, "rb") as f:
        head = f.read(3)
    return next((name for bom, name in BOMS if head.startswith(bom)), "utf-8")


def cannot_write(path, e):
    """The one-line error for a failed write of `path` (an OSError or a library's error); guarded adds what was kept."""
    folder = os.path.dirname(os.path.abspath(path))  # under a MiB left there: full
    full = getattr(e, "errno", None) == errno.ENOSPC or (os.path.isdir(folder) and shutil.disk_usage(folder).free < 2 ** 20)
    reason = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
    error = SystemExit(f"error: cannot write {path}: {reason} ({'the disk is full: free space; ' * full}what was written "
                       f"before is intact)")
    error.kept = True  # process.guarded's mark
    return error


def temporary_path(path):
    """Where `path` is written before its rename into place: this process's own (processes writing one file never meet)."""
    return f"{path}.{os.getpid()}.tmp"


def write_atomically(path, write):
    """write(tmp) writes the file at a temporary path, which replaces `path` once complete and on the disk (fsync before
    the rename, the folder's after): a crash leaves the old file or the new one, never half; a failure is one line."""
    tmp = temporary_path(path)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception as e:  # OSError, or a library's own error for one (torch.save: RuntimeError)
        raise cannot_write(path, e)
    finally:  # a failed or interrupted write leaves no temporary file (a kill may leave one: claim_folder removes it)
        if os.path.exists(tmp):
            os.remove(tmp)
    with contextlib.suppress(OSError):  # the rename itself on the disk (POSIX; elsewhere a folder cannot be opened)
        folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        os.fsync(folder)
        os.close(folder)


def check_writable(path, setting):
    """A one-line error unless a file can be written at `path`, found before the work by doing, not by permission bits
    (which say yes to root): a file made and removed beside it, and `path`, if there, opened to append."""
    folder = os.path.dirname(os.path.abspath(path))
    for where, kind in ((path, "a folder, not a file"), (folder, "a file, not a folder")):
        if os.path.exists(where) and os.path.isdir(where) == (where == path):
            raise SystemExit(f"error: {setting}: {where} is {kind}")
    try:
        os.makedirs(folder, exist_ok=True)
        probe = temporary_path(path)
        open(probe, "w", encoding="utf-8").close()
        os.remove(probe)
        if os.path.exists(path):
            open(path, "r+b").close()
    except OSError as e:
        raise SystemExit(f"error: cannot write to {setting}={path}: {e.strerror or e}")


def gib(n_bytes):
    """Bytes in GiB for a table, or '-' when there is no figure (a CPU has no device peak)."""
    return f"{n_bytes / 2 ** 30:.1f}" if n_bytes is not None else "-"


def size_text(n_bytes):
    """A size in the unit that fits it: '512 bytes', '1.0 MB', '12.3 GB'."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes:.0f} bytes"


def claim_folder(path, setting="--out_dir", need_bytes=0, files=()):
    """The folder `path` made and locked for this process (flock: released however it ends), or a one-line error: it or
    its `files` cannot be written, it has under need_bytes free, or another process holds it. Once it is locked, a
    killed process's temporary copies of `files` (write_atomically's, left by a SIGKILL during a save) are removed: no
    live process is writing them."""
    for name in (LOCK_FILE, *files):
        check_writable(os.path.join(path, name), setting)
    if os.path.realpath(path) not in HELD and lock_folder(path, setting):  # locked: no other process writes here
        for stale in (p for name in files for p in glob.glob(glob.escape(os.path.join(path, name)) + ".*.tmp")):
            os.remove(stale)
    free = shutil.disk_usage(path).free
    if free < need_bytes:
        raise SystemExit(f"error: {setting}={path} has {size_text(free)} free and this run needs about "
                         f"{size_text(need_bytes)} there: free space or choose another {setting}")


def lock_folder(path, setting):
    """Locks `path` for this process (its pid in the lock file), or a one-line error if another process holds it.
    Returns whether it could lock (a system without flock, Windows, cannot)."""
    lock, locked = open(os.path.join(path, LOCK_FILE), "a+", encoding="utf-8"), True
    try:
        import fcntl
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # no flock (Windows): no lock
        locked = False
    except OSError as e:
        if e.errno not in HELD_ERRNOS:  # ENOSYS (Lustre without -o flock), ENOLCK (NFS without its lock daemon), ...
            raise SystemExit(f"error: {path}'s file system cannot lock a file ({e.strerror or e}), and cram locks a "
                             f"folder so that two processes never write it: choose another {setting} (a local disk)")
        lock.seek(0)
        raise SystemExit(f"error: {path} is in use by another process (pid {lock.read().strip() or '?'}): wait for "
                         f"it to end, or choose another {setting}")
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    HELD[os.path.realpath(path)] = lock
    return locked


def write_json(path, obj):
    write_atomically(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=1), encoding="utf-8"))


def denied(path):
    """The line for another user's path this process may not read, or None (not 'not found' or 'damaged': their data)."""
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").close()
    except PermissionError:
        return f"error: permission denied: {path} (another user's? ask its owner to share it, or use a copy of your own)"
    except OSError:
        return None


def unfound(path, line):
    """What a reader that did not find `path` raises: SystemExit with `line`, or with the denial where that is the truth."""
    return SystemExit(denied(path) or line)


def read_json(path, remedy):
    """A JSON file that cram wrote, or a one-line error naming it damaged, with `remedy`: what to do."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # cut, garbled, not UTF-8, nested past the parser's depth
        raise SystemExit(denied(path) or f"error: {path} is damaged ({type(e).__name__}: {str(e)[:120]}): {remedy}")


def load_json(path):
    """(the JSON at `path`, None), or (None, why it does not parse: cut, garbled, not UTF-8); an unreadable file raises."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8")), None
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError; RecursionError: nested too deep
        return None, f"{type(e).__name__}: {str(e)[:120]}"


def unused(head, tail=""):
    """head + tail, else head + 2 + tail, 3, ...: the first name no file has, so that a file kept is never replaced."""
    return next(p for i in ("", *range(2, 10 ** 6)) if not os.path.lexists(p := f"{head}{i}{tail}"))


def set_aside(path, why):
    """A damaged file that a command makes again (cram writes whole files: a disk's fault or a hand's edit did this) kept
    for a look as <path>.damaged (.damaged2, ...: never over another, unused) and said; the caller makes its piece again."""
    os.replace(path, kept := unused(path + ".damaged"))
    print(f"warning: {path} is damaged ({why}): set aside as {os.path.basename(kept)} and made again", flush=True)


def read_jsonl(path):
    """The records of a JSON-lines file. A last line without its newline that does not parse is the
    trace of a process killed mid-write, not damage: it is left out. Any other bad line is an error."""
    lines = Path(path).read_text(encoding="utf-8", errors="replace").split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line) if line.strip() else None
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            if number == len(lines):  # cut short by a kill
                break
            raise SystemExit(f"error: {path}:{number} is not a JSON line: the file is damaged (delete that line)")
        if record is not None:
            if not isinstance(record, dict):
                raise SystemExit(f"error: {path}:{number} is not a JSON record: the file is damaged (delete that line)")
            records.append(record)
    return records


class MetricsLog:
    """A run's lines in metrics.jsonl, and in W&B's run if `wandb` (which train.py has started). A fresh run starts the
    file at its first line, and a resume appends to it (where a step is logged twice, the later line counts). Each
    line names its `run`, the id its checkpoints keep."""

    def __init__(self, path, fresh, wandb=False, run=None):
        self.path, self.fresh, self.wandb, self.started, self.run = path, fresh, wandb, False, run

    def write(self, fields):
        """One line, after dropping one a kill cut short (no newline at the end)."""
        if not self.started:
            self.started = True
            if self.fresh:
                open(self.path, "w", encoding="utf-8").close()
        try:
            with open(self.path, "a+b") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - 65536))
                tail = f.read()
                if tail and not tail.endswith(b"\n"):  # keep up to the last whole line (none: rfind gives -1)
                    f.truncate(size - len(tail) + tail.rfind(b"\n") + 1)
                f.write((json.dumps(dict(fields, run=self.run)) + "\n").encode())
        except OSError as e:
            raise cannot_write(self.path, e)
        if self.wandb:
            import wandb
            wandb.log(fields, step=fields["step"])


def read_metrics(run):
    """The evaluations of one run, in order, one per step (a step logged twice: the later line)."""
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.isfile(path):
        raise unfound(path, f"error: {path} not found: is {run} the out_dir of a train.py run?")
    evals = {record["step"]: record for record in read_jsonl(path) if record.get("kind") == "eval" and
             isinstance(record.get("step"), int)}
    if not evals:
        raise SystemExit(f"error: {path} has no evaluation yet")
    return [evals[step] for step in sorted(evals)]


def meta_problem(meta):
    """What in a meta.json breaks its readers, or None: the keys they rely on, of sane types."""
    if not isinstance(meta, dict):
        return "not a JSON object"
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        return f"no {', '.join(missing)}"
    counts = ("vocab_size", "n_regular", "seq_len", "train_sequences", "val_sequences")
    bad = [k for k in counts if type(meta[k]) is not int or meta[k] < 0]
    if bad:
        return f"{', '.join(bad)} not a count"
    if meta["dtype"] not in ("uint16", "uint32") or meta["vocab_size"] > np.iinfo(meta["dtype"]).max + 1:
        return f"dtype {meta['dtype']!r} cannot hold a vocabulary of {meta['vocab_size']} (uint16 or uint32)"
    if meta["special_ids"] != special_ids(meta["n_regular"]) or meta["vocab_size"] != meta["n_regular"] + len(SPECIAL_TOKENS):
        return f"special_ids {meta['special_ids']} and vocab_size {meta['vocab_size']} do not follow n_regular " \
               f"{meta['n_regular']}"
    if meta["seq_len"] < 2 or not meta["train_sequences"] or not meta["val_sequences"]:
        return "no sequences" if meta["seq_len"] >= 2 else "seq_len below 2"
    return None


def load_meta(data_dir):
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):
        raise unfound(path, f"error: {path} not found: run `python prepare.py` first (or pass --data_dir=)")
    meta = read_json(path, f"delete {data_dir} and run prepare.py again")
    problem = meta_problem(meta)
    if problem:
        raise SystemExit(f"error: {path} is damaged ({problem}): delete {data_dir} and run prepare.py again")
    return meta


def write_ranks(path, ranks):
    """Save BPE ranks (whole or not at all) in tiktoken's text format: base64(token bytes) rank, one per line."""
    text = "".join(f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]))
    write_atomically(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def parse_ranks(text, where="the tokenizer"):
    """BPE ranks from tiktoken's text format, or a one-line error naming `where` they came from."""
    try:
        ranks = {base64.b64decode(tok, validate=True): int(rank)
                 for tok, rank in (line.split() for line in text.splitlines() if line.strip())}
    except (ValueError, TypeError) as e:  # binascii.Error is a ValueError; a line of 1 or 3 fields too
        raise SystemExit(f"error: {where} is damaged (not tiktoken's 'base64 rank' lines: {str(e)[:80]})")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise SystemExit(f"error: {where} is damaged (its ranks are not 0..{len(ranks) - 1}, each once)")
    return ranks


def read_ranks(path):
    return parse_ranks(Path(path).read_text(encoding="utf-8"), path)


def checkpoint_series(folder):
    """The older checkpoints beside a run's ckpt.pt in `folder`, its series (ckpt_<step>.pt): [(step, path)], by step."""
    return sorted((int(m[1]), os.path.join(folder, name)) for name in (os.listdir(folder) if os.path.isdir(folder) else [])
                  if (m := re.fullmatch(r"ckpt_(\d{8,})\.pt", name)))


def save_in_series(path, state, keep, held):
    """`state` saved at `path` (ckpt.pt, the newest); what was there (of step `held`; None: nothing) kept beside it as
    ckpt_<step>.pt (a hard link, or where there are none moved), then the older ones pruned to `keep` - 1."""
    folder = os.path.dirname(path) or "."
    aside = held not in (None, state["step"]) and os.path.join(folder, f"ckpt_{held:08d}.pt")
    def write(tmp):  # the new one whole before the old is set aside: a failed write leaves ckpt.pt as it was
        torch.save(state, tmp)
        if keep > 1 and aside and os.path.isfile(path) and not os.path.exists(aside):
            try:
                os.link(path, aside)
            except OSError:  # no hard links there: moved, the new one renamed in at once
                os.replace(path, aside)
    write_atomically(path, write)
    older = [p for step, p in checkpoint_series(folder) if step < state["step"]]
    for old in older[:max(0, len(older) - (keep - 1))]:
        os.remove(old)


def save_peak_bytes(path, keep, each, resumed_step=None, branched=False):
    """The room saves of `each` bytes need beside `path` (ckpt.pt): max(keep, held) + 1 at once (save_in_series writes
    one before pruning), less `held`, there already: a resume's ckpt.pt and series (a branch's: up to resumed_step)."""
    held = 0 if resumed_step is None else (not branched and os.path.isfile(path)) + sum(
        not branched or step <= resumed_step for step, _ in checkpoint_series(os.path.dirname(path) or "."))
    return (max(keep, held) + 1 - held) * each


def branch_from(path, step):
    """A run resumed from an earlier checkpoint (of step `step`) than its newest (`path`, ckpt.pt): ckpt.pt and the later
    ones of the series renamed abandoned_<name> (abandoned2_, ...: never over another), out of the series, never pruned."""
    folder, names = os.path.dirname(path) or ".", []
    for old in [p for s, p in checkpoint_series(folder) if s > step] + [path] * os.path.isfile(path):
        os.replace(old, kept := unused(os.path.join(folder, "abandoned"), "_" + os.path.basename(old)))
        names.append(os.path.basename(kept))
    return names


def load_checkpoint(path, use="weights"):
    """A checkpoint of train.py's, checked for what its reader uses, or a one-line error on what is missing or damaged:
    `use` 'settings' (config and model_args), 'weights' (finite too: fine-tuning, the export), 'resume' (the optimizer
    state, the run's counters and its settings, RUN_SETTINGS, too; check_resume checks them against the run)."""
    if not os.path.isfile(path):
        first = " (if the run has saved none yet, start it again without --resume=True)" if use == "resume" else ""
        raise unfound(path, f"error: checkpoint not found: {path}{first}")
    try:
        with warnings.catch_warnings():  # torch warns about a pickle protocol before refusing it: the error says it
            warnings.simplefilter("ignore")
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain values: never code
    except Exception as e:
        raise SystemExit(denied(path) or f"error: {path} {refusal(e)}")
    problem = checkpoint_problem(checkpoint, path)
    if problem:
        raise SystemExit(f"error: {path} is not a usable checkpoint written by train.py: {problem}")
    if use != "settings" and not all_finite(checkpoint["model"]):
        raise SystemExit(f"error: {path} holds non-finite weights (a run that diverged?): it cannot be "
                         f"{'resumed' if use == 'resume' else 'fine-tuned or exported'}; use an earlier checkpoint")
    missing = ([k for k in ("optimizer", "step", "tokens", "elapsed", "config") if k not in checkpoint] or [
        f"config['{k}']" for k in RUN_SETTINGS if k not in checkpoint["config"]]) if use == "resume" else []
    if missing:
        raise SystemExit(f"error: {path} has no {', '.join(missing)} (weights shared without the training state?): it "
                         f"cannot be resumed; fine-tune it (finetune_glue.py) or export it (tools/export.py) as it is")
    return checkpoint


def refusal(e):
    """Why torch.load's safe loader (weights_only) refused a file, in a few words."""
    text = str(e)
    culprit = re.search(r"GLOBAL (\S+)", text)
    if culprit:  # a pickle that names a function or class to call
        return (f"was refused: it holds objects other than tensors and plain values ({culprit.group(1)}), and loading "
                f"those could run code; cram loads the checkpoints train.py writes")
    if "Unsupported operand 149" in text:  # FRAME, the opcode of pickle protocols 4 and 5
        return ("was refused by the safe loader: it was pickled with protocol 4 or 5, which that loader does not "
                "read; cram loads the checkpoints train.py writes (torch.save's default protocol 2)")
    unpickler = re.search(r"WeightsUnpickler error: \s*(.+)", text)
    why = unpickler.group(1).strip() if unpickler else (text.splitlines() or [""])[0]
    return f"is not a readable checkpoint ({type(e).__name__}: {why[:160]})"


def checkpoint_problem(checkpoint, path):
    """What in a loaded checkpoint breaks its readers, or None: model_args ModelConfig takes, weights of exactly that
    model, the data's meta, a tokenizer whose tokens and special ids make up the vocabulary."""
    if not isinstance(checkpoint, dict) or not {"model", "model_args", "meta", "tokenizer"} <= checkpoint.keys():
        return "not a dict with model, model_args, meta and tokenizer"
    args, weights = checkpoint["model_args"], checkpoint["model"]
    if not isinstance(args, dict) or not isinstance(weights, dict):
        return "model_args or model is not a dict"
    for key, kinds in RECORD.items():  # the rest is optional (a user's conversion holds only the four), but typed
        if key in checkpoint and type(checkpoint[key]) not in kinds:
            return f"its {key} is {type(checkpoint[key]).__name__}, not {' or '.join(k.__name__ for k in kinds)}"
    watch = checkpoint.get("spike_watch", {})  # train.py's SpikeWatch state, which a resume unpacks
    if set(watch) - {"mean", "var", "count", "last", "masked", "rate"} or not all(type(v) in (float, int) and v >= 0 for v in watch.values()):
        return "its spike_watch is not the mean, var, count, last and masked count of a run's losses (numbers, none negative)"
    problem = model_args_problem(args) or meta_problem(checkpoint["meta"])
    if problem:
        return problem
    args = saved_model_args(args)
    with torch.device("meta"):  # the shapes, without the memory
        model = CrammedBert(**args)
    try:  # torch's strict load names what is missing, unexpected or of another shape (copying into meta is a no-op)
        with warnings.catch_warnings():  # ... which torch warns of, once per weight
            warnings.simplefilter("ignore")
            model.load_state_dict(weights, strict=True)  # not assign=True: that ties the weights to this model
    except (RuntimeError, TypeError) as e:
        why = "; ".join(line.strip() for line in str(e).splitlines()[1:]) or str(e)
        return f"its weights do not fit its model_args ({why[:200]})"
    meta = checkpoint["meta"]
    for key, name in (("vocab_size", "vocabulary"), ("seq_len", "sequence length")):
        if meta[key] != args[key]:
            return f"its meta ({name} {meta[key]}) and model_args ({name} {args[key]}) disagree"
    if not isinstance(checkpoint["tokenizer"], str):
        return "its tokenizer is not text"
    n = len(parse_ranks(checkpoint["tokenizer"], f"{path}'s tokenizer"))
    return (f"its tokenizer has {n} tokens but its model {meta['n_regular']} besides the specials: it mixes two "
            f"vocabularies") if n != meta["n_regular"] else None


def model_args_problem(args):
    """Unknown fields, values of the wrong type or outside a field's declared range, or what ModelConfig refuses; or None."""
    fields = {f.name: f.type for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(k for k in set(args) - fields.keys() - REPLACED_FIELDS.keys() if args[k] not in OFF)
    if unknown:
        return f"unknown model_args field(s) {', '.join(unknown)}, on (a fork's or a newer cram's checkpoint?)"
    for kind, *declared in declarations({}, ModelConfig):
        if kind != "setting" or declared[0] not in args:  # ('section', text), ('more', text): no setting
            continue
        name, comment = declared
        value, rule, expected = args[name], allowed(comment), fields[name]
        if type(value) is not expected and not (expected is float and type(value) is int):
            return f"model_args {name}={value!r} is not {expected.__name__}"
        if rule and not rule[0](value):
            return f"model_args {name}={value!r}: {name} must be {rule[1]}"
    try:
        saved_model_args(args)
    except (TypeError, ValueError) as e:
        return f"model_args: {e}"
    return None


def weights_digest(weights):
    """A checkpoint's identity by content, which results know it by: its weights' names, shapes, dtypes and bytes, hashed."""
    digest = hashlib.blake2b(digest_size=16)
    for name, t in sorted(weights.items()):
        digest.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def all_finite(state_dict):
    """Whether every floating-point tensor of a state dict is finite (no checkpoint holds one that is not)."""
    return all(v.isfinite().all() for v in state_dict.values() if v.is_floating_point())


def check_own_files(out_dir, checkpoint, source):
    """A one-line error unless a run touches only its own files: a fresh one (`checkpoint` None) replaces no checkpoint
    and no metrics.jsonl but a run's (one whose lines name their run); a resume (from `source`) none of another run's
    (by the run id they name) nor, from elsewhere, an older cram's."""
    path, run = os.path.join(out_dir, "ckpt.pt"), (checkpoint or {}).get("run")
    series = [p for _, p in checkpoint_series(out_dir)]
    if checkpoint is None and (os.path.exists(path) or series):  # only a series: its newest, by name
        path, named = (series[-1], f" --resume_from={os.path.basename(series[-1])}") if not os.path.exists(path) else (path, "")
        raise SystemExit(f"error: {path} exists: continue it with --resume=True{named} (a run that has spent its budget "
                         f"also needs a larger one: it says which), or choose another --out_dir")
    logged = logged_runs(os.path.join(out_dir, "metrics.jsonl"))
    if checkpoint is None and None in logged and not any(logged):  # a new run starts the file: only a run's is replaced
        raise SystemExit(f"error: {os.path.join(out_dir, 'metrics.jsonl')} is not a train.py run's log (no line names "
                         f"its run), and a new run writes its own there: move it away, or choose another --out_dir")
    home = os.path.realpath(os.path.dirname(os.path.abspath(source or ""))) == os.path.realpath(out_dir)
    if checkpoint is None or run is None and home:  # an older cram's run in its own folder: known by the folder alone
        return
    owners = []
    for p in [path] * os.path.isfile(path) + series:
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            owners.append((os.path.basename(p), torch.load(p, map_location="cpu", weights_only=True, mmap=True).get("run")))
    owners += [("metrics.jsonl", owner) for owner in logged]
    others = sorted({name for name, owner in owners if owner != run and (owner or not home)})
    if others:
        raise SystemExit(f"error: {out_dir} holds another run's files ({', '.join(others)}), which resuming {source} "
                         f"there would prune, set aside or append to: resume it with a fresh --out_dir"
                         f"{'' if home else f' (or its own, {os.path.dirname(os.path.abspath(source))})'}")


def logged_runs(path):
    """The run each line of a metrics.jsonl names, as MetricsLog wrote it ([]: no file). A whole line that names none is
    None (an older cram's, or a line train.py did not write); the last one cut short by a kill or a full disk is ''."""
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
        return [m[1] if (m := re.search(r'"run": "(\w+)"}\s*$', line)) else None if line.endswith("\n") else "" for line in f]
    return []


def check_resume(path, checkpoint, model_args, tokenizer_text, optim, data_dir, meta):
    """A one-line error unless `checkpoint` (load_checkpoint(path, "resume")'s) continues the same run: the same model,
    tokenizer and optimizer and the same token files (data_difference), in any folder; the dtype may change."""
    same_folder = os.path.realpath(data_dir) == checkpoint.get("data_dir")  # where it trained (its real path)
    saved = saved_model_args(checkpoint["model_args"])
    if saved != model_args:
        changed = [k for k in model_args if saved[k] != model_args[k]]
        raise SystemExit(f"error: the checkpoint's model differs from this config in {', '.join(changed)}")
    own = ("the data it trained on" if same_folder or not os.path.isdir(checkpoint.get("data_dir", "")) else
           f"its own data, --data_dir={checkpoint['data_dir']}")
    if checkpoint["tokenizer"] != tokenizer_text:
        raise SystemExit(f"error: {path} trained with another tokenizer than {data_dir}'s: resume it with {own}")
    trained_with = checkpoint.get("config", {}).get("optim", "adamw")
    if trained_with != optim:
        raise SystemExit(f"error: {path} trained with --optim={trained_with}: resume it with that optimizer (their "
                         f"states do not convert)")
    problem = optimizer_problem(checkpoint, optim)
    if problem:
        raise SystemExit(f"error: {path}'s optimizer state {problem}: it cannot be resumed; fine-tune it "
                         f"(finetune_glue.py) or export it (tools/export.py) as it is")
    changed = data_difference(checkpoint["meta"], meta)
    if changed:  # rows it trained on would be read as unread, or validated on; or rows it never saw counted as read
        raise SystemExit(f"error: {data_dir} is not the data {path} trained on (its token files differ: {changed}; "
                         f"prepared again?): resume it with {own}, or start a new run in another --out_dir")


def data_difference(trained_on, meta):
    """How the token files `meta` describes (data.load_run_data's) differ from those a checkpoint's meta (`trained_on`)
    describes, or '': each split by its digest; a checkpoint without digests (an older cram's) by its sequences' counts."""
    if not isinstance(trained_on.get("digests"), dict):
        return ", ".join(k for k in ("train_sequences", "val_sequences") if trained_on.get(k, meta[k]) != meta[k])
    said = [f"{name} rows: " + (f"{trained_on[k]:,} sequences, now {meta[k]:,}" if trained_on[k] != meta[k] else
                                f"other ones or in another order, {meta[k]:,} as before")
            for split, name, k in (("train", "training", "train_sequences"), ("val", "validation", "val_sequences"))
            if trained_on["digests"].get(split) != meta["digests"][split]]
    only_validation = len(said) == 1 and said[0].startswith("validation")
    return "; ".join(said + ["only validation is new, and its losses would not compare with the run's"] * only_validation)


def optimizer_problem(checkpoint, optim):
    """How a checkpoint's optimizer state fails to fit its model's optimizer (`optim`'s parameter groups, each
    parameter's state tensors as its row in model.OPTIMIZERS `fits` them), or None."""
    saved = checkpoint["optimizer"]
    if not isinstance(saved, dict) or not isinstance(saved.get("param_groups"), list) or \
            not isinstance(saved.get("state"), dict):
        return "is not an optimizer's state dict"
    with torch.device("meta"):
        model = CrammedBert(**saved_model_args(checkpoint["model_args"]))
    groups = [g["params"] for g in param_groups(model, 0.0, optim)]
    counts = [len(g.get("params", ())) if isinstance(g, dict) else -1 for g in saved["param_groups"]]
    if counts != [len(g) for g in groups]:
        return f"has parameter groups of {counts} parameters where the model's optimizer has {[len(g) for g in groups]}"
    params, fits = [p for g in groups for p in g], OPTIMIZERS[optim].fits
    for index, state in saved["state"].items():
        if not (isinstance(index, int) and 0 <= index < len(params) and isinstance(state, dict) and all(
                fits(v, params[index]) for v in state.values() if isinstance(v, torch.Tensor))):
            return f"does not fit the model's parameters (entry {index})"
    return None


class Saves:
    """A run's checkpoints: `path` (ckpt.pt) is the newest one train.py saved (its save_if_sound), and `keep` - 1
    older ones stay beside it as ckpt_<step>.pt. Each save is written to a temporary file and renamed into place
    (write_atomically), so a crash leaves the old checkpoint or the new one, never half of one. In a resume the
    checkpoint it started from (`source`) counts as the last until the run saves. `run` is the run's id, which its
    checkpoints and metrics.jsonl lines carry: a new one for a new run, the checkpoint's for a resume."""

    def __init__(self, path, keep, checkpoint=None, source=None):
        self.path, self.keep, self.run = path, keep, (checkpoint or {}).get("run") or os.urandom(8).hex()
        self.last, self.last_path = (checkpoint["step"], source) if checkpoint is not None else (None, None)
        self.branched = checkpoint is not None and os.path.abspath(source) != os.path.abspath(path)
        self.saved_step = None  # the step of this command's last save

    def branch(self):
        """For a resume from an older checkpoint, once out_dir is claimed: sets aside the checkpoints saved after it
        (branch_from) and returns their new names."""
        return branch_from(self.path, self.last) if self.branched else []

    def room_needed(self, n_params, vocab_size):
        """The bytes on disk the checkpoints kept need at their peak (save_peak_bytes), each about 12 bytes a parameter
        (the weights and AdamW's two moments), the tokenizer and the records, or the resumed one's size if larger."""
        each = max(12 * n_params + 32 * vocab_size + 2 ** 20, os.path.getsize(self.last_path) if self.last_path else 0)
        return save_peak_bytes(self.path, self.keep, each, self.last, self.branched)

    def save(self, state):
        """Writes the checkpoint `state` as ckpt.pt, keeping the last `keep` of the run's checkpoints."""
        save_in_series(self.path, state, self.keep, None if self.branched else self.last)
        self.last, self.last_path, self.branched, self.saved_step = state["step"], self.path, False, state["step"]

    def kept(self):
        """A phrase that says where the last sound checkpoint is and names the one before it, or that none was saved."""
        if self.last is None:
            return "no checkpoint was saved"
        older = [p for step, p in checkpoint_series(os.path.dirname(self.path)) if step < self.last]
        before = f" (the one before it: --resume_from={os.path.basename(older[-1])})" if older else ""
        return f"the last checkpoint is {self.last_path} at step {self.last}{before}"

    def advice(self):
        return f"{self.kept()}: lower --lr and {'resume it' if self.last is not None else 'start again'}"
