"""nanoGPT-style configuration: each script keeps its settings as module globals at the top,
and this module overrides them from config files and `--key=value` arguments, in order.

    python train.py config/train_quickstart.py --budget_hours=0.1

A config file is Python that assigns some of the globals. Unknown keys and values of the
wrong type are errors (a typo must never be silently ignored).
"""
import ast
import dataclasses
import inspect
import os
import re

CONFIG_TYPES = (bool, int, float, str, tuple)


def config_keys(namespace):
    """The overridable settings of a script: its public lower-case globals of plain types
    (UPPER_CASE names are constants)."""
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not k.isupper() and type(v) in CONFIG_TYPES}


def _check(key, value, known):
    if key not in known:
        raise SystemExit(f"error: unknown config key '{key}' (known keys: {', '.join(sorted(known))})")
    expected = type(known[key])
    if expected is float and type(value) is int:
        return float(value)
    if type(value) is not expected:
        raise SystemExit(f"error: --{key} expects {expected.__name__}, got {value!r} ({type(value).__name__})")
    return value


def _parse(key, raw, expected):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        if expected is str:
            return raw  # bare words are strings: --dataset=pydocs
        raise SystemExit(f"error: --{key} expects {expected.__name__}, cannot parse {raw!r}")


def read_config_file(path):
    """The settings a config file assigns (names starting with _ and imports left out)."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: config file not found: {path}")
    assigned = {}
    exec(open(path).read(), {}, assigned)
    return {k: v for k, v in assigned.items()
            if not k.startswith("_") and not callable(v) and type(v).__name__ != "module"}


SETTINGS_RULE = "# " + "-" * 77  # the line above and below a script's settings


def dataclass_settings(cls, skip=()):
    """The fields of a settings dataclass (model.ModelConfig) as {name: default}, less `skip`."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.name not in skip} if cls else {}


def help_line(key, default, comment):
    default = default if isinstance(default, str) else repr(default)  # as typed after --key=
    return (f"  --{key}={default}".ljust(36) + f" {comment or ''}").rstrip()


def dataclass_help(cls, skip=()):
    """The fields of a settings dataclass as help lines, with the comments of its source."""
    lines = [f"{cls.__name__} ({inspect.getsourcefile(cls).rsplit(os.sep, 1)[-1]}): the model, settings here too"]
    known = dataclass_settings(cls, skip)
    for line in inspect.getsource(cls).splitlines():
        field = re.match(r"\s+(\w+): \w+ = [^#]*?(?:#\s*(.*))?$", line)
        if field and field.group(1) in known:
            lines.append(help_line(field.group(1), known[field.group(1)], field.group(2)))
        elif line.strip().startswith("#") and len(lines) > 1:  # a comment continued
            lines.append(" " * 37 + line.strip().lstrip("# "))
    return lines


def settings_help(namespace, cls=None, skip=()):
    """The script's docstring, then its settings block: each setting as --key=default with its
    comment, and the block's section comments, as the script's top lists them; then the fields
    of `cls`, a settings dataclass the script also takes."""
    known = config_keys(namespace)
    lines = [(namespace.get("__doc__") or "").strip(), "",
             "settings (config files and --key=value override them, in order):"]
    with open(namespace["__file__"]) as f:
        source = f.read().splitlines()
    rules = [i for i, line in enumerate(source) if line.strip() == SETTINGS_RULE]
    for line in source[rules[0] + 1:rules[1]] if len(rules) >= 2 else []:
        setting = re.match(r"(\w+)\s*=\s*[^#]*?(?:#\s*(.*))?$", line)
        if setting and setting.group(1) in known:
            lines.append(help_line(setting.group(1), known[setting.group(1)], setting.group(2)))
        elif line.startswith("#"):  # a section
            lines.append(line.lstrip("# "))
        elif line.strip().startswith("#"):  # a comment continued
            lines.append(" " * 37 + line.strip().lstrip("# "))
    return "\n".join(lines + (dataclass_help(cls, skip) if cls else []))


def configure(namespace, argv, cls=None, skip=()):
    """Apply config files and --key=value overrides from argv to namespace (a script's globals()).
    Returns every setting as a dict: the script's globals, and the fields of `cls` (a settings
    dataclass such as model.ModelConfig, less `skip`), which are settings too but keep their
    defaults in the dataclass and live only in the dict. --help or -h prints them and exits."""
    fields = dataclass_settings(cls, skip)
    known = {**fields, **config_keys(namespace)}
    if {"--help", "-h"} & set(argv):
        print(settings_help(namespace, cls, skip))
        raise SystemExit(0)
    for arg in argv:
        if arg.startswith("--"):
            key, sep, raw = arg[2:].partition("=")
            if not sep:
                raise SystemExit(f"error: expected --key=value, got '{arg}'")
            expected = type(known[key]) if key in known else str
            known[key] = _check(key, _parse(key, raw, expected), known)
        else:
            for key, value in read_config_file(arg).items():
                known[key] = _check(key, value, known)
    for key in config_keys(namespace):
        namespace[key] = known[key]
    return known
