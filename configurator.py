"""nanoGPT-style configuration: a script's settings are module globals at the top, overridden by config files (Python
that assigns some) and `--key=value` arguments, in order: `python train.py config/train_quickstart.py --lr=1e-3`.
Unknown keys and values of the wrong type are errors. A setting's comment may start with the values it allows:

    lr = 1e-3            # > 0: peak learning rate          (also >= x)
    mask_rate = 0.25     # (0, 1): share of tokens to predict  (intervals: [ ] closed, ( ) open, inf)
    optim = "adamw"      # {adamw, muon}: the optimizer         (names; {OPTIMIZERS}: a table's keys)
"""
import ast
import contextlib
import dataclasses
import inspect
import math
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

try:  # every script imports this module before torch, whose import asks for a temporary folder (dill, with datasets)
    tempfile.gettempdir()
except FileNotFoundError:  # none writable: /tmp, /var/tmp, the working folder (a read-only container)
    raise SystemExit("error: no writable temporary folder here (a read-only container?), which torch's import needs: "
                     "mount one (docker run --tmpfs /tmp) or set TMPDIR to a folder on a writable volume")

CONFIG_TYPES = (bool, int, float, str, tuple)
SETTINGS_RULE = "# " + "-" * 77  # the line above and below a script's settings
NUMBER = r"-?(?:inf|\d[\d_]*\.?\d*(?:e-?\d+)?)"
SCRIPT_SETTING = r"(\w+)\s*=\s*[^#]*?(?:#\s*(.*))?$"  # a script's setting line, and a settings dataclass's field
FIELD = r"\s+(\w+): \w+ = [^#]*?(?:#\s*(.*))?$"
ALLOWED = re.compile(rf"(?:(>=?) ?({NUMBER})|([\[(])({NUMBER}), ?({NUMBER})([\])])|\{{([^}}]*)\}})(?::|$)")


def config_keys(namespace):
    """A script's settings: its public lower-case globals of plain types (UPPER_CASE names are constants)."""
    return {k: v for k, v in namespace.items() if not k.startswith("_") and not k.isupper() and type(v) in CONFIG_TYPES}


def shown(value, limit=60):
    """A value as an error line quotes it: as text, cut to `limit` characters with its length said."""
    text = printable(str(value))
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def printable(text):
    """`text` with each character a terminal would not print as itself escaped (a newline as \\n): one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def named(key, given=None):
    """How a line names a setting: --key where it was typed, <file>'s key where a config file set the value in effect
    (`given`: configure's record of where each key was set), the bare key where neither did (a checkpoint's)."""
    where = [*(given or {}).get(key, ())][-1:]
    return f"--{key}" if where == ["--"] else f"{where[0]}'s {key}" if where else key


def _check(key, value, known, name):
    if key not in known:
        raise SystemExit(f"error: unknown config key '{shown(key)}' (known keys: {', '.join(sorted(known))})")
    expected = type(known[key])
    if expected is float and type(value) is int:
        return float(value) if abs(value) < 2 ** 1024 else value  # past float's range: refused with the others below
    if type(value) is not expected:
        raise SystemExit(f"error: {name} expects {expected.__name__}, got {shown(repr(value))} ({type(value).__name__})")
    return value


def _parse(key, raw, expected):
    value = None
    with contextlib.suppress(ValueError, SyntaxError):
        value = ast.literal_eval(raw)
    if expected is str and not isinstance(value, str):
        return raw  # a string setting takes the text as typed: --dataset=pydocs, --full_layers=2,4
    if value is None and raw != "None":
        raise SystemExit(f"error: --{key} expects {expected.__name__}, cannot parse {shown(repr(raw))}")
    return value


def read_config_file(path):
    """The settings a config file assigns (not _names or imports); an error is one line naming the file's line."""
    try:
        source = Path(path).read_text(encoding="utf-8-sig")  # Notepad's UTF-8 mark dropped: no character of Python's
    except PermissionError:  # another user's file, or in a folder of theirs
        raise SystemExit(f"error: permission denied: config file {path}")
    except OSError:  # not there, or a folder
        raise SystemExit(f"error: config file not found: {path}")
    except ValueError as e:  # not UTF-8
        raise SystemExit(f"error: {path}:?: {type(e).__name__}: {e}")
    assigned = {}
    try:
        exec(compile(source, path, "exec"), {}, assigned)
    except SyntaxError as e:
        raise SystemExit(f"error: {path}:{e.lineno}: {e.msg}")
    except Exception as e:
        line = [frame.lineno for frame in traceback.extract_tb(e.__traceback__) if frame.filename == path][-1:]
        raise SystemExit(f"error: {path}:{line[0] if line else '?'}: {type(e).__name__}: {e}")
    return {k: v for k, v in assigned.items() if not k.startswith("_") and not callable(v) and type(v).__name__ != "module"}


def unusable(value, default, comment):
    """Why a value of any setting cannot be used whatever its comment allows, or None: an int beyond 64 bits, a float
    not finite, a NUL (no path holds one), or nothing where the default is something (unless the comment says)."""
    if type(value) is int and not -2 ** 63 <= value < 2 ** 63:
        return "a number past 64 bits"
    if type(value) is float and not math.isfinite(value):
        return "not a finite number"
    if isinstance(value, str) and "\0" in value:
        return "it holds a NUL character"
    empty = isinstance(value, str) and not value.strip() and default.strip() and not re.search(r'empty|""', comment or "")
    return f"empty (the default: {default})" if empty else None


def number(text):
    """A bound as written: an integer exactly (float('18446744073709551615') is 2**64), else a float."""
    return int(text) if re.fullmatch(r"-?\d[\d_]*", text) else float(text)


def allowed(comment, namespace=None):
    """(test, words) for the values a setting's comment starts with (see the module's docstring), or None when it
    declares none. {TABLE} names a dict in `namespace` (a script's globals), and {module.TABLE} a dict of a module there:
    their keys are allowed."""
    m = ALLOWED.match(comment or "")
    if not m:
        return None
    op, bound, left, lo, hi, right, choices = m.groups()
    if choices is not None:
        names = [c.strip() for c in choices.split(",")]
        module, _, table = names[0].partition(".")
        if table.isupper() and module in (namespace or {}):
            names = list(getattr(namespace[module], table))
        elif not table and module.isupper() and module in (namespace or {}):
            names = list(namespace[module])
        return (lambda v: v in names), f"one of {', '.join(names)}"
    if op:
        b = number(bound)
        return (lambda v: v >= b) if op == ">=" else (lambda v: v > b), f"{op} {bound}"
    a, b = number(lo), number(hi)
    return (lambda v: (a <= v if left == "[" else a < v) and (v <= b if right == "]" else v < b)), \
        f"in {left}{lo}, {hi}{right}"


def declared(lines, pattern, known):
    """('setting', key, comment) for each setting of `known` a line declares (`pattern`'s groups: key, comment), and
    ('section', text) and ('more', text) for section comments and continued comments."""
    for line in lines:
        match = re.match(pattern, line)
        if match and match.group(1) in known:
            yield "setting", match.group(1), match.group(2)
        elif line.startswith("#"):
            yield "section", line[2:] if line.startswith("# ") else line[1:]  # "# " off, a table row's indent kept
        elif line.strip().startswith("#"):
            yield "more", line.strip().lstrip("# ")


def dataclass_settings(cls, skip=()):
    """The fields of a settings dataclass (model.ModelConfig) as {name: default}, less `skip`."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.name not in skip} if cls else {}


def declarations(namespace, cls=None, skip=()):
    """Every declaration of the script's settings (between its two SETTINGS_RULE lines), then of cls's fields (`declared`)."""
    source = Path(namespace["__file__"]).read_text(encoding="utf-8").splitlines() if "__file__" in namespace else []
    rules = [i for i, line in enumerate(source) if line.strip() == SETTINGS_RULE]
    yield from declared(source[rules[0] + 1:rules[1]] if len(rules) >= 2 else [], SCRIPT_SETTING, config_keys(namespace))
    if cls:
        yield "section", f"{cls.__name__} ({inspect.getsourcefile(cls).rsplit(os.sep, 1)[-1]}): the model, settings here too"
        yield from (d for d in declared(inspect.getsource(cls).splitlines(), FIELD, dataclass_settings(cls, skip))
                    if d[0] != "section")


def settings_help(namespace, known, cls=None, skip=()):
    """The script's docstring, then its settings as its top lists them (--key=default, comments), then `cls`'s."""
    lines = [(namespace.get("__doc__") or "").strip(), "", "settings (config files and --key=value override them, in order):"]
    for kind, *rest in declarations(namespace, cls, skip):
        if kind == "setting":
            default = known[rest[0]] if isinstance(known[rest[0]], str) else repr(known[rest[0]])  # as typed after --key=
            setting = f"  --{rest[0]}={default}"
            if len(setting) >= 36 and rest[1]:  # a long default: its comment on the next line, not run into it
                lines += [setting, " " * 37 + rest[1]]
            else:
                lines.append((setting.ljust(36) + f" {rest[1] or ''}").rstrip())
        else:
            lines.append(rest[0] if kind == "section" else " " * 37 + rest[0])
    return "\n".join(lines)


class HangupSafeStream:
    """A text stream (stdout, stderr) whose lines are dropped, silently, once its reader is gone: after a hang-up the
    terminal answers EIO, a closed pipe EPIPE; the file descriptor then points at the null device, where what is still
    buffered goes at the exit too. A run saves its work, and a short command ends quietly, whoever reads its lines."""

    def __init__(self, stream):
        self.stream = stream or open(os.devnull, "w", encoding="utf-8")  # none (pythonw has no console): the null device

    def write(self, text):
        return self.unless_gone("write", text) or len(text)

    def flush(self):
        self.unless_gone("flush")

    def unless_gone(self, name, *args):
        try:
            return getattr(self.stream, name)(*args)
        except OSError:  # gone (EIO, EPIPE): the null device from here on, where what is buffered goes too
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(null := os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
                os.close(null)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def hangup_safe(stream):
    """`stream` as a HangupSafeStream, wrapped once (a process may configure more than once: a tool's, a test's)."""
    return stream if isinstance(stream, HangupSafeStream) else HangupSafeStream(stream)


def configure(namespace, argv, cls=None, skip=(), given=None):
    """argv's config files and --key=value overrides applied to namespace (globals()), each checked; returns them and
    `cls`'s fields (less `skip`: only in the dict) as a dict. `given` records where each key was set and to what: key ->
    {its config file, or '--' for the command line: the value it set}, in the order set, the last the value in effect."""
    sys.stdout, sys.stderr = hangup_safe(sys.stdout), hangup_safe(sys.stderr)  # every script starts here
    known, given = {**dataclass_settings(cls, skip), **config_keys(namespace)}, {} if given is None else given
    if {"--help", "-h"} & set(argv):
        print(settings_help(namespace, known, cls, skip))
        raise SystemExit(0)
    for arg in argv:
        key, sep, raw = arg[2:].partition("=")
        if arg.startswith("--") and not sep:
            raise SystemExit(f"error: expected --key=value, got '{shown(arg)}'")
        where = "--" if arg.startswith("--") else arg
        for key, value in ({key: _parse(key, raw, type(known.get(key, "")))} if where == "--" else read_config_file(arg)).items():
            known[key] = _check(key, value, known, named(key, {key: [where]}))
            given.setdefault(key, {}).pop(where, None)  # set again: the last in effect
            given[key][where] = known[key]
    problem = disallowed(namespace, known, cls, skip, given)
    if problem:
        raise SystemExit(f"error: {problem}")
    for key in config_keys(namespace):
        namespace[key] = known[key]
    return known


def disallowed(namespace, values, cls=None, skip=(), given=None):
    """'key=value is not allowed: why' for the first setting in `values` (a configured dict, or the settings a checkpoint
    carries) of another type than its default's, outside the values its comment declares, or unusable; else None. The
    setting is named as the user gave it (`named`: --key, or the config file's key)."""
    defaults = {**dataclass_settings(cls, skip), **config_keys(namespace)}
    for kind, *rest in declarations(namespace, cls, skip):
        if kind != "setting" or rest[0] not in values:
            continue
        (key, comment), value, rule = rest, values[rest[0]], allowed(rest[1], namespace)
        wrong = type(value) is not type(defaults[key]) and not (type(defaults[key]) is float and type(value) is int)
        problem = f"not {type(defaults[key]).__name__}" if wrong else f"{key} must be {rule[1]}" if rule and \
            not rule[0](value) else unusable(value, defaults[key], comment)  # NaN fails any rule
        if problem:
            return f"{named(key, given)}={shown(value)} is not allowed: {problem}"
    return None
